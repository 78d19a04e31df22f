"""The real-documents report: ``report.md`` (a table per collection, then norm by length) and ``results.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.bench.stats import bootstrap_ci, compare_paired

METRICS = ("file@1", "file@5", "page@1", "page@5")
ANSWER_METRICS = ("em", "f1", "accuracy", "fact_recall", "abstain", "false_abstain")


def summarize(cell: dict[str, Any], answers: bool = True) -> dict[str, Any]:
    """Means (0-100) with 95% bootstrap intervals of a cell's per-question values, and its index figures; the
    answers' only with ``answers`` (a config without a reader shows none, even where a cell kept some)."""
    summary: dict[str, Any] = {"n_chunks": cell["n_chunks"], "hubness@5": 100 * cell["hubness@5"],
                               "chunk_hubness@5": cell["chunk_hubness"]["hubness@5"]}
    for metric in METRICS:
        values = cell["per_question"].get(metric) or []
        if values:
            low, high = bootstrap_ci(values)
            summary[metric] = {"mean": 100 * float(np.mean(values)), "ci": [100 * low, 100 * high],
                               "n": len(values)}
    for metric, values in (cell.get("answer_scores") or {}).items() if answers else ():
        if values:
            low, high = bootstrap_ci(values)
            summary[metric] = {"mean": 100 * float(np.mean(values)), "ci": [100 * low, 100 * high],
                               "n": len(values)}
    words = cell["chunk_words"]
    summary["median_words"] = float(np.median(words)) if words else 0.0
    summary["chunks_under_25_words"] = int(sum(1 for count in words if count < 25))
    summary["norm_by_length"] = cell.get("norm_by_length")
    return summary


def _cell_text(summary: dict[str, Any], metric: str) -> str:
    value = summary.get(metric)
    if not value:
        return "-"
    return f"{value['mean']:.1f} [{value['ci'][0]:.1f}, {value['ci'][1]:.1f}]"


def _values(cell: dict[str, Any], metric: str) -> list[float]:
    return cell["per_question"].get(metric) or (cell.get("answer_scores") or {}).get(metric) or []


def _comparisons(cells: dict, collection: str, systems: list[str], answers: bool) -> list[str]:
    """Each system against the first one (the default) on file@5 and answer accuracy (or fact recall), paired
    over the same questions."""
    lines, first = [], cells.get((collection, systems[0]))
    if first is None:
        return lines
    for metric in ("file@5", "accuracy", "fact_recall") if answers else ("file@5",):
        for name in systems[1:]:
            other = cells.get((collection, name))
            mine, theirs = _values(first, metric), _values(other, metric) if other else []
            if not mine or len(mine) != len(theirs):
                continue
            data = compare_paired(mine, theirs).to_dict(scale=100)
            lines.append(f"- {metric}, {systems[0]} minus {name}: {data['delta']:+.1f} "
                         f"[{data['delta_ci'][0]:+.1f}, {data['delta_ci'][1]:+.1f}], p = {data['p_value']:.3f}")
    return lines


def write_report(config, collections: list[str], cells: dict, out: Path) -> None:
    systems = [spec.name for spec in config.systems]
    results: dict[str, Any] = {"name": config.name, "split": config.split, "collections": {}}
    lines = [f"# Real documents: {config.name} ({config.split} split)", "",
             "file@k: an answerable question's file is among the first k chunks; page@k: its page too (PDFs whose "
             "questions name a page). EM, F1 and accuracy (a reference alias occurs in the answer): answerable "
             "questions with a short reference answer; fact recall: the share of a long reference answer's numbers "
             "and names that the answer states; the reader answers from the system's first 3 chunks. Abstains: the "
             "share of unanswerable questions the reader says the documents do not answer; false abstentions: of "
             "answerable ones (an abstention scores 0 above). hubness@5: "
             "the share of questions whose top 5 holds one of the 1% of chunks retrieved most often; with few "
             "questions per file it counts the chunks that questions on one topic share, so the index's own figure "
             "is beside it (\"chunks asked\": 200 sampled chunks ask their first 30 words, as `rag-mag index` "
             "reports it). 95% bootstrap intervals in brackets.", ""]
    for collection in collections:
        results["collections"][collection] = {}
        lines += [f"## {collection}", "", "| system | file@1 | file@5 | page@1 | page@5 | EM | F1 | accuracy | "
                  "fact recall | abstains (no answer) | false abstentions | hubness@5 | hubness@5, chunks asked | "
                  "chunks | median words | chunks < 25 words |", "|" + "---|" * 16]
        answered = bool(config.reader) and (config.answer_collections is None
                                             or collection in config.answer_collections)
        for name in systems:
            cell = cells.get((collection, name))
            if cell is None:
                continue
            summary = summarize(cell, answers=answered)
            results["collections"][collection][name] = summary
            figures = [f"{summary['hubness@5']:.1f}", f"{summary['chunk_hubness@5']:.1f}", str(summary["n_chunks"]),
                       f"{summary['median_words']:.0f}", str(summary["chunks_under_25_words"])]
            lines.append(f"| {name} | " + " | ".join([_cell_text(summary, m) for m in METRICS + ANSWER_METRICS]
                                                    + figures) + " |")
        lines += ["", *_comparisons(cells, collection, systems, answered), ""]
    lines += ["## Document norm by chunk length", "",
              "Median raw document norm of the chunks in each length band, relative to the median of the index, and "
              "Spearman's correlation of norm and length (rag-mag systems; Haystack's stock embedder normalizes).", "",
              "| collection | system | rho | 1-5 | 5-15 | 15-40 | 40-80 | 80+ |", "|---|---|---|---|---|---|---|---|"]
    for collection in results["collections"]:
        for name in systems:
            figures = (results["collections"][collection].get(name) or {}).get("norm_by_length")
            if figures:
                bands = " | ".join("-" if b["relative_norm"] is None else f"{b['relative_norm']:.2f} ({b['chunks']})"
                                   for b in figures["bands"])
                lines.append(f"| {collection} | {name} | {figures['spearman']:+.2f} | {bands} |")
    out.mkdir(parents=True, exist_ok=True)
    durable.write_text(out / "results.json", json.dumps(results, indent=1))
    durable.write_text(out / "report.md", "\n".join(lines) + "\n")
