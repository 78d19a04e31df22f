"""The benchmark report: ``results.json``, ``report.md`` and PNG plots, from result rows.

Public API::

    files = write_report(out_dir, rows, config=config, per_example=per_example, norms=norms,
                         in_domain=["hotpot_qa"], command=sys.argv)

``rows``: one dict per (dataset, system, seed), the shape of ``results.json``'s ``results``::

    {"dataset": str, "system": str, "seed": int, "n_questions": int,
     "retrieval": {"recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10", ...,
                   "recall_curve": [recall@1, recall@2, ...] (optional), "mode": str (optional)},
     "rag": {"em", "f1", "em_ci": [lo, hi], "f1_ci": [lo, hi]},
     "diagnostics": {"document_norm_cohens_d", "query_norm_cv", "document_norm_cv", ...,
                     "side_selector": SideSelection.to_dict(), "fisher_predictor": FisherPrediction.to_dict()}}

All metrics in [0, 100]; a system without retrieval (closed book) or without generation may leave
that block empty. ``n_ranked`` (optional): the number of questions the ranking metrics cover, where it
differs from ``n_questions`` (the answered ones). ``per_example`` (kept out of results.json):
``{(dataset, system, seed): {"ids": [...], "em": array, "f1": array, "recall@5": array, ...}}`` with
per-question values in [0, 1], each array covering the first len(array) of ``ids``; it drives the
confidence intervals of seed-averaged systems and the paired tests against ``baseline``. ``norms``:
``{(dataset, system): {"relevant": array, "irrelevant": array}}`` raw document norms for the histograms.

Several seeds of one system are averaged per question before the bootstrap, so a CI covers question
sampling of the seed-averaged system; the spread over seeds is shown in its own table. Every file is
written atomically and durably (rag_mag.durable: temporary file, fsync, rename).

The report is made in stages, each a module beside this one in ``rag_mag/bench/report/``: ``build``
computes the report model once (``model.ReportModel``): ``aggregate`` (rows into cells), ``compare`` (paired
tests against the baseline, and ``against_untrained``: did training help each strategy over ``base_cosine``)
and ``findings`` (``paper_findings``: the section "Paper findings: held or not", computed from the numbers);
then the renderers only read it: ``markdown`` (report.md, with ``format``: how figures are written) and
``plots``. This module writes the files, with the machine from ``environment``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.bench.report.build import build_model
from rag_mag.bench.report.environment import collect_environment
from rag_mag.bench.report.format import json_safe
from rag_mag.bench.report.markdown import render_markdown
from rag_mag.bench.report.plots import render_plots

logger = logging.getLogger("rag_mag.bench.report")  # the report's log lines keep their name


@dataclass(frozen=True)
class ReportFiles:
    results_json: Path
    report_md: Path
    plots: tuple[Path, ...]


def write_report(out_dir: str | os.PathLike, rows: Sequence[Mapping], *, config: Mapping | None = None,
                 environment: Mapping | None = None, per_example: Mapping | None = None,
                 norms: Mapping | None = None, in_domain: Sequence[str] = (), baseline: str = "cosine",
                 title: str | None = None, command: Sequence[str] | str | None = None, notes: Sequence[str] = (),
                 sections: Sequence[str] = (), extra: Mapping | None = None,
                 n_resamples: int = 2000, n_permutations: int = 10000, seed: int = 0,
                 primary_pipeline: str | None = None) -> ReportFiles:
    """Write ``results.json``, ``report.md`` and the plots into ``out_dir`` (see the module docstring)."""
    if not rows:
        raise ValueError("no result rows to report; run at least one (dataset, system) cell")
    out = Path(out_dir)
    environment = dict(environment) if environment is not None else collect_environment(command)
    model = build_model(rows, per_example=per_example, norms=norms, in_domain=in_domain, baseline=baseline,
                        n_resamples=n_resamples, n_permutations=n_permutations, seed=seed,
                        primary_pipeline=primary_pipeline)
    plots = render_plots(model, out)
    results = {"config": dict(config or {}), "environment": environment, "results": list(rows),
               "aggregates": [cell.to_dict() for cell in model.cells], "comparisons": model.comparisons,
               "findings": model.findings, "against_untrained": model.untrained, "in_domain": model.in_domain,
               "plots": [plot.name for plot in plots], **dict(extra or {})}
    results_path, report_path = out / "results.json", out / "report.md"
    durable.write_bytes(results_path, json.dumps(json_safe(results), indent=2, allow_nan=False).encode("utf-8"))
    markdown = render_markdown(model, title=title or out.name, config=config or {}, environment=environment,
                               plots=plots, notes=notes, sections=sections)
    durable.write_bytes(report_path, markdown.encode("utf-8"))
    logger.info("report written to %s (%d rows, %d plots)", out, len(rows), len(plots))
    return ReportFiles(results_json=results_path, report_md=report_path, plots=tuple(plots))
