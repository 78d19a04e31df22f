"""The benchmark report: result rows into a report model, and its files (results.json, report.md, plots)."""
