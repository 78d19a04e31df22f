"""Paired tests of the report's rows: each against the baseline of its pipeline (``compare_to_baseline``) and each
trained retriever against the untrained encoder it starts from (``against_untrained``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np

from rag_mag.bench.config import BASELINES, split_system, system_name
from rag_mag.bench.report.aggregate import seed_averaged
from rag_mag.bench.report.model import ALPHA, COMPARED, UNTRAINED, Cell
from rag_mag.bench.stats import compare_paired, holm_adjust

logger = logging.getLogger("rag_mag.bench.report")  # the report's log lines keep their name


def reference_system(system: str, baseline: str = "cosine", primary_pipeline: str | None = None) -> str:
    """What a row is compared against: ``baseline`` in the same pipeline (``rag_multihop:qnorm`` against
    ``rag_multihop:cosine``); a reader baseline (no pipeline) against the primary pipeline's ``baseline``."""
    pipeline, _ = split_system(system)
    return system_name(pipeline or primary_pipeline, baseline)


def compare_to_baseline(cells: Sequence[Cell], per_example: Mapping | None, baseline: str = "cosine",
                        metrics: Sequence[str] = COMPARED, n_resamples: int = 2000, n_permutations: int = 10000,
                        seed: int = 0, primary_pipeline: str | None = None) -> list[dict]:
    """Paired tests of every system against ``baseline`` on the same questions of each dataset (see
    ``reference_system`` for which row that is)."""
    per_example = per_example or {}
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    comparisons = []
    for cell in cells:
        reference_name = reference_system(cell.system, baseline, primary_pipeline)
        reference = by_key.get((cell.dataset, reference_name))
        if cell.system == reference_name or reference is None:
            continue
        for metric in metrics:
            if metric not in cell.means or metric not in reference.means:
                continue
            entry = {"dataset": cell.dataset, "system": cell.system, "baseline": reference_name, "metric": metric,
                     "delta": cell.means[metric] - reference.means[metric], "delta_ci": None, "p_value": None,
                     "n": None}
            ours = seed_averaged(per_example, cell.dataset, cell.system, cell.seeds, metric)
            theirs = seed_averaged(per_example, cell.dataset, reference_name, reference.seeds, metric)
            if ours is not None and theirs is not None:
                first, second = align(ours, theirs, f"{cell.dataset}/{cell.system} vs {reference_name}")
                result = compare_paired(first, second, n_resamples=n_resamples, n_permutations=n_permutations,
                                        seed=seed).to_dict(scale=100.0)
                entry.update(delta=result["delta"], delta_ci=result["delta_ci"], p_value=result["p_value"],
                             n=result["n"])
            comparisons.append(entry)
    return comparisons


def against_untrained(cells: Sequence[Cell], per_example: Mapping | None, metric: str = "ndcg@10",
                      n_resamples: int = 2000, n_permutations: int = 10000, seed: int = 0,
                      primary_pipeline: str | None = None, in_domain: Sequence[str] = ()) -> list[dict]:
    """Does training help? Every trained retriever against the untrained encoder it starts from
    (``base_cosine``), paired on the same questions, with a verdict per (dataset, system):

    - ``better``: above it with p < 0.05;
    - ``worse``: below it by more than the half-width of the trained system's own 95% interval;
    - ``slightly worse``: below it with p < 0.05, but by less than that half-width;
    - ``no clear difference``: none of these.

    Entries on a set outside ``in_domain`` (its training split feeds no training data) also get ``p_holm``: the
    p-value Holm-adjusted over every such (set, system) pair, one family, so that "training helps out of domain"
    is claimed at most 5% of the time by chance however many strategies are tried.
    """
    by_key = {(cell.dataset, cell.system): cell for cell in cells}
    entries = []
    for entry in compare_to_baseline(cells, per_example, UNTRAINED, metrics=(metric,), n_resamples=n_resamples,
                                     n_permutations=n_permutations, seed=seed, primary_pipeline=primary_pipeline):
        if split_system(entry["system"])[1] in BASELINES:
            continue
        low, high = by_key[(entry["dataset"], entry["system"])].cis.get(metric, (math.nan, math.nan))
        half_width = (high - low) / 2
        significant = entry["p_value"] is not None and entry["p_value"] < ALPHA
        verdict = ("better" if significant_gain(entry) else
                   "worse" if math.isfinite(half_width) and entry["delta"] < -half_width else
                   "slightly worse" if significant and entry["delta"] < 0 else "no clear difference")
        entries.append({**entry, "half_width": half_width if math.isfinite(half_width) else None,
                        "verdict": verdict})
    outside = [entry for entry in entries if entry["dataset"] not in set(in_domain) and entry["p_value"] is not None]
    for entry, adjusted in zip(outside, holm_adjust([entry["p_value"] for entry in outside]), strict=True):
        entry["p_holm"], entry["family"] = adjusted, len(outside)
    return entries


def align(ours, theirs, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Two ``seed_averaged`` results on their common questions (by id; without ids they must be the same number)."""
    (our_ids, our_values), (their_ids, their_values) = ours, theirs
    if our_ids is None or their_ids is None:
        if len(our_values) != len(their_values):
            raise ValueError(f"{what}: {len(our_values)} and {len(their_values)} questions and no ids to align them")
        return our_values, their_values
    position = {question_id: index for index, question_id in enumerate(their_ids)}
    common = [index for index, question_id in enumerate(our_ids) if question_id in position]
    if len(common) < len(our_ids) or len(common) < len(their_ids):
        logger.warning("%s: paired on the %d questions both systems answered", what, len(common))
    return our_values[common], their_values[[position[our_ids[index]] for index in common]]


def significant_gain(entry: Mapping | None) -> bool:
    """Whether a comparison shows the system above its reference with p < ``ALPHA``."""
    return bool(entry and entry["delta"] > 0 and entry["p_value"] is not None and entry["p_value"] < ALPHA)
