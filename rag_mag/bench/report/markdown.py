"""``report.md``: the report model as markdown, one function per section; it reads the model and computes nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from rag_mag.bench.report.format import (
    LABELS,
    delta_text,
    format_number,
    format_p,
    json_safe,
    markdown_table,
    with_ci,
)
from rag_mag.bench.report.model import ALPHA, COMPARED, UNTRAINED, Cell, ReportModel, finite

RETRIEVAL_COLUMNS = ("recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10", "recall@budget")
ANSWER_METRICS = (("em", "Exact Match"), ("f1", "F1"), ("accuracy", "accuracy (a gold alias occurs in the answer; "
                                                                   "lenient)"))
CAPTIONS = {"em_f1": "EM and F1 per strategy and dataset, 95% CI bars",
            "document_norms": "raw document norms, relevant against irrelevant passages",
            "recall_at_k": "recall@k curves"}


def render_markdown(model: ReportModel, *, title: str, config: Mapping, environment: Mapping, plots: Sequence[Path],
                    notes: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
    """The whole report; ``sections`` (markdown) go in before the plots."""
    lines = _introduction(title, environment, model.baseline, notes, model.primary_pipeline)
    lines += _findings_section(model.findings, model.primary_pipeline)
    lines += _answers_sections(model)
    lines += _retrieval_section(model)
    lines += _baseline_section(model)
    lines += untrained_section(model)
    lines += _seeds_section(model.cells)
    lines += _diagnostics_section(model)
    lines += [section.rstrip() + "\n" for section in sections]
    lines += _plots_section(plots)
    lines += _setup_section(config, environment)
    return "\n".join(lines)


def _introduction(title: str, environment: Mapping, baseline: str, notes: Sequence[str],
                  primary_pipeline: str | None) -> list[str]:
    lines = [f"# rag-mag benchmark report: {title}", ""]
    commit = environment.get("git_commit") or "unknown"
    dirty = " (with uncommitted changes)" if environment.get("git_dirty") else ""
    lines += [f"Generated {environment.get('timestamp', '')} at commit `{commit}`{dirty} by:", "",
              f"    {environment.get('command', '')}", ""]
    lines += ["Metrics are in [0, 100]. Brackets are 95% bootstrap confidence intervals over questions; "
              f"p-values come from a paired sign-flip permutation test against {baseline} on the same questions "
              "(uncorrected for multiple comparisons).", ""]
    if primary_pipeline:
        lines += [f"A row named `PIPELINE:SYSTEM` is that retriever answering through `pipelines/PIPELINE.yaml` (or "
                  f"the user's file of that name), compared against `PIPELINE:{baseline}`. `bm25`, `closed_book` "
                  f"and `oracle` answer through the reader pipeline (the BM25 top-k, no passages, the gold "
                  f"passages, asked only of the questions that have some) and are compared against "
                  f"`{primary_pipeline}:{baseline}` on the questions both answered. The retriever's ranking "
                  f"(recall@k, nDCG@10, MRR@10) and the norm diagnostics are shown once per dataset, on the first "
                  f"listed pipeline's rows; recall@budget judges the passages the reader was given (for a "
                  f"multi-round pipeline, the union of its rounds). `oracle` is the reader's ceiling and "
                  f"`closed_book` its floor. A figure marked (n=N) covers the first N questions only.", ""]
    return lines + [f"- {note}" for note in notes] + ([""] if notes else [])


def _findings_section(findings: Sequence[Mapping], primary_pipeline: str | None) -> list[str]:
    lines = ["## Paper findings: held or not", ""]
    if primary_pipeline:
        lines += [f"Checked on the rows of the `{primary_pipeline}` pipeline (system names below without the "
                  "prefix).", ""]
    lines += markdown_table(["finding", "verdict", "detail"],
                            [[item["finding"], f"**{item['verdict']}**", item["detail"]] for item in findings])
    for item in findings:
        if item["evidence"]:
            lines += [f"*{item['finding']}*: " + "; ".join(item["evidence"]), ""]
    return lines


def _answers_sections(model: ReportModel) -> list[str]:
    """One table per answer metric: systems by datasets."""
    lines = []
    header = ["system"] + [f"{dataset} (n={model.n_questions[dataset]})" for dataset in model.datasets]
    for metric, label in ANSWER_METRICS:
        rows = [[system] + [with_ci(model.cell(dataset, system), metric)
                            + _subset(model.cell(dataset, system), model.n_questions[dataset])
                            for dataset in model.datasets]
                for system in model.systems if any(model.has(dataset, system, [metric]) for dataset in model.datasets)]
        lines += [f"## Answers: {label}", ""] + markdown_table(header, rows)
    return lines


def _retrieval_section(model: ReportModel) -> list[str]:
    """One table per dataset: systems by ranking metrics."""
    lines = ["## Retrieval", ""]
    for dataset in model.datasets:
        modes = {cell.mode for cell in model.cells_of(dataset) if cell.mode}
        mode = f" (recall: {', '.join(sorted(modes))})" if modes else ""
        if model.n_ranked[dataset] != model.n_questions[dataset]:
            mode += (f": ranking metrics on {model.n_ranked[dataset]} questions, recall@budget on the "
                     f"{model.n_questions[dataset]} answered")
        rows = [[system + _subset(model.cell(dataset, system), model.n_ranked[dataset], ranked=True)]
                + [with_ci(model.cell(dataset, system), metric) for metric in RETRIEVAL_COLUMNS]
                for system in model.systems if model.has(dataset, system, RETRIEVAL_COLUMNS)]
        if rows:
            header = ["system", *(LABELS.get(metric, metric) for metric in RETRIEVAL_COLUMNS)]
            lines += [f"### {dataset}{mode}", ""] + markdown_table(header, rows)
    return lines


def _baseline_section(model: ReportModel) -> list[str]:
    """One table per dataset: each system's change against the baseline, per compared metric."""
    baseline, comparisons = model.baseline, model.comparisons
    lines = [f"## Against {baseline}" + (" (of the same pipeline)" if model.primary_pipeline else ""), ""]
    compared_metrics = [metric for metric in COMPARED if any(entry["metric"] == metric for entry in comparisons)]
    for dataset in model.datasets:
        rows = []
        for system in model.systems:
            entries = [model.comparison(dataset, system, metric) for metric in compared_metrics]
            if any(entries):
                rows.append([system] + [delta_text(entry) for entry in entries])
        if rows:
            header = ["system"] + [f"Δ {LABELS.get(metric, metric)}" for metric in compared_metrics]
            lines += [f"### {dataset}", ""] + markdown_table(header, rows)
    if not comparisons:
        lines += [f"No {baseline} rows, so no paired comparisons.", ""]
    return lines


def untrained_section(model: ReportModel) -> list[str]:
    """The section "Against the untrained encoder": the verdicts of ``against_untrained`` (none: no section)."""
    entries = model.untrained
    if not entries:
        return []
    metric = LABELS.get(entries[0]["metric"], entries[0]["metric"])
    lines = [f"## Against the untrained encoder ({UNTRAINED})", "",
             f"Training should improve on the model it starts from. Each trained retriever's {metric} against "
             f"{UNTRAINED} on the same questions: **better** is above it with p < {ALPHA}; **worse** is below it by "
             "more than the half-width of the trained system's own 95% interval; **slightly worse** is below it "
             f"with p < {ALPHA} but by less than that half-width; otherwise **no clear difference**.", ""]
    for verdict in ("better", "worse", "slightly worse"):
        named = [f"{entry['dataset']}/{entry['system']}" for entry in entries if entry["verdict"] == verdict]
        lines.append(f"- {verdict}: {len(named)} of {len(entries)}" + (f" ({', '.join(named)})" if named else ""))
    outside = [entry for entry in entries if "p_holm" in entry]
    if outside:
        named = [f"{entry['dataset']}/{entry['system']}" for entry in outside
                 if entry["delta"] > 0 and entry["p_holm"] < ALPHA]
        sets = ", ".join(dict.fromkeys(entry["dataset"] for entry in outside))
        lines.append(f"- better out of domain ({sets}: sets whose training split feeds no training data) with "
                     f"p < {ALPHA} after Holm's adjustment over all {len(outside)} such pairs: {len(named)}"
                     + (f" ({', '.join(named)})" if named else ""))
    lines.append("")
    by_key = {(entry["dataset"], entry["system"]): entry for entry in entries}
    rows = [[dataset, system, delta_text(entry), format_number(entry["half_width"]),
             format_p(entry["p_holm"]) if "p_holm" in entry else "in domain", entry["verdict"]]
            for dataset in model.datasets for system in model.systems if (entry := by_key.get((dataset, system)))]
    return lines + markdown_table(["dataset", "system", f"Δ {metric} against {UNTRAINED}",
                                   "half-width of its 95% CI", "p, Holm-adjusted out of domain", "verdict"], rows)


def _seeds_section(cells: Sequence[Cell]) -> list[str]:
    """The spread over training seeds of every system with more than one."""
    multi_seed = [cell for cell in cells if len(cell.seeds) > 1]
    lines = ["## Seeds", ""]
    if not multi_seed:
        return lines + ["Every system ran with one training seed: the intervals cover question sampling only, not "
                        "training variance.", ""]
    return lines + markdown_table(
        ["dataset", "system", "seeds", "EM", "F1", "nDCG@10"],
        [[cell.dataset, cell.system, ", ".join(map(str, cell.seeds)),
          *(f"{format_number(cell.means.get(metric))} ± {format_number(cell.seed_sd.get(metric))}"
            for metric in ("em", "f1", "ndcg@10"))]
         for cell in multi_seed])


def _diagnostics_section(model: ReportModel) -> list[str]:
    """The norm diagnostics of every cell that has them, then the side predictors against the observed winners."""
    lines = ["## Diagnostics", "",
             "Cohen's d compares the raw document norms of relevant and irrelevant corpus passages (positive: "
             "relevant passages are longer); CV is the coefficient of variation of the raw norms. The delta-CV "
             "selector keeps the magnitude of the side whose base-model norms vary more; the Fisher predictor "
             "picks the one-sided strategy whose InfoNCE Fisher is better conditioned at the start of training "
             "(rag_mag/retriever/diagnostics.py documents both).", ""]
    diag_rows = [[cell.dataset, cell.system, format_number(finite(cell.diagnostics.get("document_norm_cohens_d")), 2),
                  format_number(finite(cell.diagnostics.get("query_norm_cv")), 3),
                  format_number(finite(cell.diagnostics.get("document_norm_cv")), 3)]
                 for dataset in model.datasets for system in model.systems
                 if (cell := model.cell(dataset, system)) is not None and cell.diagnostics]
    if diag_rows:
        lines += markdown_table(["dataset", "system", "Cohen's d (doc norms, relevant - irrelevant)",
                                 "CV query norms", "CV document norms"], diag_rows)
    predictor_rows = _predictor_rows(model)
    if predictor_rows:
        lines += markdown_table(["dataset", "delta-CV selector", "Fisher predictor", "winner nDCG@10", "winner EM"],
                                predictor_rows)
    return lines


def _predictor_rows(model: ReportModel) -> list[list[str]]:
    """Per dataset: what the delta-CV selector and the Fisher predictor chose, and which of qnorm and dnorm won
    (on the primary pipeline's rows)."""
    return [[side.dataset,
             f"{side.selector['prediction']} (ΔCV {format_number(finite(side.selector.get('delta_cv')), 3)})"
             if side.selector else "–",
             f"{side.fisher['prediction']} ({_kappa(side.fisher, 'qnorm')}; {_kappa(side.fisher, 'dnorm')})"
             if side.fisher else "–",
             side.winner_ndcg or "–", side.winner_em or "–"]
            for side in model.sides]


def _plots_section(plots: Sequence[Path]) -> list[str]:
    lines = ["## Plots", ""]
    for path in plots:
        lines += [f"{CAPTIONS.get(path.stem, path.stem)}:", "", f"![{path.stem}]({path.name})", ""]
    return lines


def _setup_section(config: Mapping, environment: Mapping) -> list[str]:
    """The configuration, the machine, the package versions and the rest of ``environment``."""
    lines = ["## Setup", "", "### Configuration", "", "```json", json.dumps(json_safe(config), indent=2), "```", ""]
    machine = environment.get("machine", {})
    lines += ["### Machine", ""] + [f"- {key}: {value}" for key, value in machine.items()] + [""]
    lines += ["### Packages", ""] + markdown_table(
        ["package", "version"], [[name, version or "not installed"]
                                 for name, version in environment.get("packages", {}).items()])
    extra = {key: value for key, value in environment.items()
             if key not in ("machine", "packages", "command", "git_commit", "git_dirty", "timestamp")}
    return lines + [f"- {key}: {value}" for key, value in extra.items()] + [""]


def _subset(cell: Cell | None, n_dataset: int, ranked: bool = False) -> str:
    """`` (n=N)`` when the cell covers fewer questions than the dataset's column (its answers, or its ranking)."""
    if cell is None:
        return ""
    count = cell.ranked if ranked else cell.n_questions
    return f" (n={count})" if count != n_dataset else ""


def _kappa(fisher: Mapping, strategy: str) -> str:
    spectrum = fisher.get(strategy) or {}
    full, trimmed = finite(spectrum.get("condition_number")), finite(spectrum.get("trimmed_condition_number"))
    text = f"κ {strategy} " + ("n/a" if full is None else f"{full:.3g}")
    return text + (f", trimmed {trimmed:.3g}" if trimmed is not None else "")
