"""The report's one computing stage: result rows into a ``ReportModel`` (``build_model``), which the renderers
then only read. The rows and ``per_example`` have the shape rag_mag/bench/report/write.py describes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rag_mag.bench.report.aggregate import aggregate
from rag_mag.bench.report.compare import against_untrained, compare_to_baseline
from rag_mag.bench.report.findings import of_pipeline, paper_findings, winner
from rag_mag.bench.report.model import Cell, ReportModel, SidePrediction, ordered_systems


def build_model(rows: Sequence[Mapping], *, per_example: Mapping | None = None, norms: Mapping | None = None,
                in_domain: Sequence[str] = (), baseline: str = "cosine", n_resamples: int = 2000,
                n_permutations: int = 10000, seed: int = 0, primary_pipeline: str | None = None) -> ReportModel:
    """Aggregate the rows into cells, compare them, check the paper's findings on the primary pipeline's rows and
    lay out the tables' datasets and systems: everything the report shows, computed once."""
    cells = aggregate(rows, per_example, n_resamples=n_resamples, seed=seed)
    comparisons = compare_to_baseline(cells, per_example, baseline, n_resamples=n_resamples,
                                      n_permutations=n_permutations, seed=seed, primary_pipeline=primary_pipeline)
    plain_cells, plain_comparisons = of_pipeline(cells, comparisons, primary_pipeline)
    findings = paper_findings(plain_cells, plain_comparisons, in_domain=in_domain, baseline=baseline)
    untrained = against_untrained(cells, per_example, n_resamples=n_resamples, n_permutations=n_permutations,
                                  seed=seed, primary_pipeline=primary_pipeline, in_domain=in_domain)
    datasets = list(dict.fromkeys(cell.dataset for cell in cells))
    return ReportModel(
        cells=cells, datasets=datasets, systems=ordered_systems([cell.system for cell in cells]),
        by_key={(cell.dataset, cell.system): cell for cell in cells},
        n_questions={dataset: max(cell.n_questions for cell in cells if cell.dataset == dataset)
                     for dataset in datasets},
        n_ranked={dataset: max(cell.ranked for cell in cells if cell.dataset == dataset) for dataset in datasets},
        comparisons=comparisons, findings=findings, untrained=untrained,
        sides=side_predictions(cells, plain_cells, datasets), norms=dict(norms or {}), in_domain=list(in_domain),
        baseline=baseline, primary_pipeline=primary_pipeline)


def side_predictions(cells: Sequence[Cell], plain_cells: Sequence[Cell], datasets: Sequence[str],
                     ) -> list[SidePrediction]:
    """Per dataset with a side predictor in some cell's diagnostics: what the delta-CV selector and the Fisher
    predictor chose, and which of qnorm and dnorm won among ``plain_cells`` (the primary pipeline's rows, named by
    their system alone: ``of_pipeline``)."""
    plain_by_key = {(cell.dataset, cell.system): cell for cell in plain_cells}
    sides = []
    for dataset in datasets:
        selector = next((c.diagnostics["side_selector"] for c in cells if c.dataset == dataset
                         and isinstance(c.diagnostics.get("side_selector"), Mapping)), None)
        fisher = next((c.diagnostics["fisher_predictor"] for c in cells if c.dataset == dataset
                       and isinstance(c.diagnostics.get("fisher_predictor"), Mapping)), None)
        if selector or fisher:
            sides.append(SidePrediction(dataset=dataset, selector=selector, fisher=fisher,
                                        winner_ndcg=winner(plain_by_key, dataset, "ndcg@10"),
                                        winner_em=winner(plain_by_key, dataset, "em")))
    return sides
