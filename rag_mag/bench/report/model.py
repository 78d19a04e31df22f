"""The report model: everything the benchmark report shows, computed once from the result rows
(``build.build_model``) and then only read, by the renderers (``markdown``, ``plots``) and by ``write``
(results.json). Also what the report's modules share: ``Cell``, the order systems are listed in, ``finite``,
``find_comparison`` and the settings of the paired tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rag_mag.bench.config import split_system

STRATEGY_ORDER = ("cosine", "dot", "qnorm", "dnorm", "learnable", "base_cosine", "bm25", "closed_book", "oracle")
COMPARED = ("em", "f1", "accuracy", "ndcg@10", "recall@5", "recall@budget")  # metrics tested against the baseline
ALPHA = 0.05
UNTRAINED = "base_cosine"  # the encoder every strategy's training starts from


def system_rank(name: str) -> tuple[int, str, int, str]:
    """Rows of pipelines first (``rag:...``, by pipeline name), then the reader baselines; within each, the
    strategies in the paper's order, then the baselines, then anything else by name."""
    pipeline, system = split_system(name)
    return (0 if pipeline else 1, pipeline or "",
            STRATEGY_ORDER.index(system) if system in STRATEGY_ORDER else len(STRATEGY_ORDER), system)


def ordered_systems(names: Sequence[str]) -> list[str]:
    """The distinct ``names`` in report order (``system_rank``)."""
    return sorted(dict.fromkeys(names), key=system_rank)


def finite(value: Any) -> float | None:
    """``value`` as a float, or None when it is missing, not a number, or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def find_comparison(comparisons: Sequence[Mapping], dataset: str, system: str, metric: str) -> Mapping | None:
    """The comparison of ``system`` on ``dataset`` for ``metric``, or None."""
    for entry in comparisons:
        if (entry["dataset"], entry["system"], entry["metric"]) == (dataset, system, metric):
            return entry
    return None


@dataclass
class Cell:
    """One (dataset, system): metric means over seeds, CIs where known."""

    dataset: str
    system: str
    seeds: list[int]
    n_questions: int
    means: dict[str, float]
    cis: dict[str, tuple[float, float]]
    seed_sd: dict[str, float]
    diagnostics: dict
    curve: list[float] | None
    mode: str | None
    n_ranked: int | None = None  # questions the ranking metrics cover (None: the n_questions answered)

    @property
    def ranked(self) -> int:
        return self.n_ranked or self.n_questions

    def to_dict(self) -> dict:
        return {"dataset": self.dataset, "system": self.system, "seeds": self.seeds, "n_questions": self.n_questions,
                "n_ranked": self.ranked, "means": self.means,
                "ci": {key: list(value) for key, value in self.cis.items()}, "seed_sd": self.seed_sd}


@dataclass(frozen=True)
class SidePrediction:
    """One dataset's side predictors, as its cells' diagnostics hold them (``side_selector``: the delta-CV
    selector, ``fisher_predictor``: the Fisher predictor; None where absent), and which of qnorm and dnorm won by
    nDCG@10 and by EM on the primary pipeline's rows (None without both, or on a tie)."""

    dataset: str
    selector: Mapping | None
    fisher: Mapping | None
    winner_ndcg: str | None
    winner_em: str | None


@dataclass(frozen=True)
class ReportModel:
    """What the report shows. System names carry their pipeline (``rag:qnorm``), except in ``findings`` and
    ``sides``, which judge the primary pipeline's rows by their system alone."""

    cells: list[Cell]                       # one per (dataset, system), in the order of the result rows
    datasets: list[str]                     # in order of appearance
    systems: list[str]                      # in report order (``system_rank``)
    by_key: dict[tuple[str, str], Cell]     # the cells by (dataset, system)
    n_questions: dict[str, int]             # per dataset: the most questions one of its cells answered
    n_ranked: dict[str, int]                # per dataset: the most questions one of its cells ranked
    comparisons: list[dict]                 # each row against the baseline of its pipeline (compare)
    findings: list[dict]                    # PAPER.md's findings with their verdicts (findings)
    untrained: list[dict]                   # each trained retriever against the untrained encoder (compare)
    sides: list[SidePrediction]             # per dataset that has a side predictor
    norms: Mapping                          # raw document norms per (dataset, system), for the histograms
    in_domain: list[str]                    # datasets whose training split feeds the training data
    baseline: str                           # what each row is compared against, in its pipeline
    primary_pipeline: str | None            # whose rows the findings judge (None: every row as it is)

    def cell(self, dataset: str, system: str) -> Cell | None:
        return self.by_key.get((dataset, system))

    def cells_of(self, dataset: str) -> list[Cell]:
        """The dataset's cells, in report order."""
        return [cell for system in self.systems if (cell := self.cell(dataset, system)) is not None]

    def has(self, dataset: str, system: str, metrics: Sequence[str]) -> bool:
        """Whether the (dataset, system) cell holds any of ``metrics``."""
        cell = self.cell(dataset, system)
        return cell is not None and any(metric in cell.means for metric in metrics)

    def comparison(self, dataset: str, system: str, metric: str) -> Mapping | None:
        """The row's comparison against its baseline for ``metric``, or None."""
        return find_comparison(self.comparisons, dataset, system, metric)
