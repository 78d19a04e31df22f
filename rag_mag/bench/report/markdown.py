"""``report.md``: the report's cells, comparisons and findings as markdown, one function per section."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_mag.bench.report.aggregate import Cell, finite, ordered_systems
from rag_mag.bench.report.compare import ALPHA, COMPARED, UNTRAINED, find_comparison
from rag_mag.bench.report.findings import of_pipeline, winner
from rag_mag.bench.report.format import (
    LABELS,
    delta_text,
    format_number,
    format_p,
    json_safe,
    markdown_table,
    with_ci,
)

RETRIEVAL_COLUMNS = ("recall@1", "recall@5", "recall@20", "ndcg@10", "mrr@10", "recall@budget")
ANSWER_METRICS = (("em", "Exact Match"), ("f1", "F1"), ("accuracy", "accuracy (a gold alias occurs in the answer; "
                                                                   "lenient)"))
CAPTIONS = {"em_f1": "EM and F1 per strategy and dataset, 95% CI bars",
            "document_norms": "raw document norms, relevant against irrelevant passages",
            "recall_at_k": "recall@k curves"}
_EMPTY = Cell("", "", [], 0, {}, {}, {}, {}, None, None)


@dataclass(frozen=True)
class Grid:
    """The report's tables: datasets in order of appearance, systems in report order, and each dataset's
    number of answered and of ranked questions (the largest of its cells)."""

    cells: Sequence[Cell]
    datasets: list[str]
    systems: list[str]
    by_key: dict[tuple[str, str], Cell]
    n_questions: dict[str, int]
    n_ranked: dict[str, int]

    @classmethod
    def of(cls, cells: Sequence[Cell]) -> Grid:
        datasets = list(dict.fromkeys(cell.dataset for cell in cells))
        return cls(cells=cells, datasets=datasets, systems=ordered_systems([cell.system for cell in cells]),
                   by_key={(cell.dataset, cell.system): cell for cell in cells},
                   n_questions={dataset: max(cell.n_questions for cell in cells if cell.dataset == dataset)
                                for dataset in datasets},
                   n_ranked={dataset: max(cell.ranked for cell in cells if cell.dataset == dataset)
                             for dataset in datasets})

    def has(self, dataset: str, system: str, metrics: Sequence[str]) -> bool:
        """Whether the (dataset, system) cell holds any of ``metrics``."""
        return any(metric in self.by_key.get((dataset, system), _EMPTY).means for metric in metrics)


def render_markdown(title: str, cells: Sequence[Cell], comparisons: Sequence[Mapping], findings: Sequence[Mapping],
                    config: Mapping, environment: Mapping, plots: Sequence[Path], baseline: str = "cosine",
                    notes: Sequence[str] = (), sections: Sequence[str] = (),
                    primary_pipeline: str | None = None, untrained: Sequence[Mapping] = ()) -> str:
    """The whole report; ``sections`` (markdown) go in before the plots."""
    grid = Grid.of(cells)
    lines = _introduction(title, environment, baseline, notes, primary_pipeline)
    lines += _findings_section(findings, primary_pipeline)
    lines += _answers_sections(grid)
    lines += _retrieval_section(grid)
    lines += _baseline_section(grid, comparisons, baseline, primary_pipeline)
    lines += untrained_section(untrained, grid.datasets, grid.systems)
    lines += _seeds_section(cells)
    lines += _diagnostics_section(grid, primary_pipeline)
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


def _answers_sections(grid: Grid) -> list[str]:
    """One table per answer metric: systems by datasets."""
    lines = []
    header = ["system"] + [f"{dataset} (n={grid.n_questions[dataset]})" for dataset in grid.datasets]
    for metric, label in ANSWER_METRICS:
        rows = [[system] + [with_ci(grid.by_key.get((dataset, system)), metric)
                            + _subset(grid.by_key.get((dataset, system)), grid.n_questions[dataset])
                            for dataset in grid.datasets]
                for system in grid.systems if any(grid.has(dataset, system, [metric]) for dataset in grid.datasets)]
        lines += [f"## Answers: {label}", ""] + markdown_table(header, rows)
    return lines


def _retrieval_section(grid: Grid) -> list[str]:
    """One table per dataset: systems by ranking metrics."""
    lines = ["## Retrieval", ""]
    for dataset in grid.datasets:
        modes = {cell.mode for cell in grid.cells if cell.dataset == dataset and cell.mode}
        mode = f" (recall: {', '.join(sorted(modes))})" if modes else ""
        if grid.n_ranked[dataset] != grid.n_questions[dataset]:
            mode += (f": ranking metrics on {grid.n_ranked[dataset]} questions, recall@budget on the "
                     f"{grid.n_questions[dataset]} answered")
        rows = [[system + _subset(grid.by_key.get((dataset, system)), grid.n_ranked[dataset], ranked=True)]
                + [with_ci(grid.by_key.get((dataset, system)), metric) for metric in RETRIEVAL_COLUMNS]
                for system in grid.systems if grid.has(dataset, system, RETRIEVAL_COLUMNS)]
        if rows:
            header = ["system", *(LABELS.get(metric, metric) for metric in RETRIEVAL_COLUMNS)]
            lines += [f"### {dataset}{mode}", ""] + markdown_table(header, rows)
    return lines


def _baseline_section(grid: Grid, comparisons: Sequence[Mapping], baseline: str,
                      primary_pipeline: str | None) -> list[str]:
    """One table per dataset: each system's change against ``baseline``, per compared metric."""
    lines = [f"## Against {baseline}" + (" (of the same pipeline)" if primary_pipeline else ""), ""]
    compared_metrics = [metric for metric in COMPARED if any(entry["metric"] == metric for entry in comparisons)]
    for dataset in grid.datasets:
        rows = []
        for system in grid.systems:
            entries = [find_comparison(comparisons, dataset, system, metric) for metric in compared_metrics]
            if any(entries):
                rows.append([system] + [delta_text(entry) for entry in entries])
        if rows:
            header = ["system"] + [f"Δ {LABELS.get(metric, metric)}" for metric in compared_metrics]
            lines += [f"### {dataset}", ""] + markdown_table(header, rows)
    if not comparisons:
        lines += [f"No {baseline} rows, so no paired comparisons.", ""]
    return lines


def untrained_section(entries: Sequence[Mapping], datasets: Sequence[str], systems: Sequence[str]) -> list[str]:
    """The section "Against the untrained encoder": the verdicts of ``against_untrained`` (none: no section)."""
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
            for dataset in datasets for system in systems if (entry := by_key.get((dataset, system)))]
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


def _diagnostics_section(grid: Grid, primary_pipeline: str | None) -> list[str]:
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
                 for dataset in grid.datasets for system in grid.systems
                 if (cell := grid.by_key.get((dataset, system))) is not None and cell.diagnostics]
    if diag_rows:
        lines += markdown_table(["dataset", "system", "Cohen's d (doc norms, relevant - irrelevant)",
                                 "CV query norms", "CV document norms"], diag_rows)
    predictor_rows = _predictor_rows(grid, primary_pipeline)
    if predictor_rows:
        lines += markdown_table(["dataset", "delta-CV selector", "Fisher predictor", "winner nDCG@10", "winner EM"],
                                predictor_rows)
    return lines


def _predictor_rows(grid: Grid, primary_pipeline: str | None) -> list[list[str]]:
    """Per dataset: what the delta-CV selector and the Fisher predictor chose, and which of qnorm and dnorm won
    (on the primary pipeline's rows)."""
    rows = []
    plain_by_key = {(cell.dataset, cell.system): cell for cell in of_pipeline(grid.cells, [], primary_pipeline)[0]}
    for dataset in grid.datasets:
        selector = next((c.diagnostics["side_selector"] for c in grid.cells if c.dataset == dataset
                         and isinstance(c.diagnostics.get("side_selector"), Mapping)), None)
        fisher = next((c.diagnostics["fisher_predictor"] for c in grid.cells if c.dataset == dataset
                       and isinstance(c.diagnostics.get("fisher_predictor"), Mapping)), None)
        if selector or fisher:
            rows.append([
                dataset,
                f"{selector['prediction']} (ΔCV {format_number(finite(selector.get('delta_cv')), 3)})"
                if selector else "–",
                f"{fisher['prediction']} ({_kappa(fisher, 'qnorm')}; {_kappa(fisher, 'dnorm')})" if fisher else "–",
                winner(plain_by_key, dataset, "ndcg@10") or "–", winner(plain_by_key, dataset, "em") or "–"])
    return rows


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
