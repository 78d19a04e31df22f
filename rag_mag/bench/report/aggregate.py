"""Result rows into report cells: one ``Cell`` per (dataset, system), averaged over seeds, with confidence intervals.

Several seeds of one system are averaged per question before the bootstrap (``seed_averaged``), so a CI
covers question sampling of the seed-averaged system; the spread over seeds is kept as ``seed_sd``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from rag_mag.bench.report.model import Cell, finite
from rag_mag.bench.stats import bootstrap_ci

logger = logging.getLogger("rag_mag.bench.report")  # the report's log lines keep their name


def seed_averaged(per_example: Mapping, dataset: str, system: str, seeds: Sequence[int], metric: str):
    """(ids, per-question values averaged over seeds) or None when some seed lacks the metric."""
    arrays, ids = [], None
    for seed in seeds:
        entry = per_example.get((dataset, system, seed))
        if entry is None or metric not in entry:
            return None
        values = np.asarray(entry[metric], dtype=np.float64)
        entry_ids = list(entry["ids"])[: len(values)] if "ids" in entry else None
        if arrays and (len(values) != len(arrays[0]) or (ids is not None and entry_ids not in (None, ids))):
            raise ValueError(f"per-example {metric} of {dataset}/{system} covers different questions in different "
                             "seeds; score every seed on the same questions")
        arrays.append(values)
        ids = ids if ids is not None else entry_ids
    return ids, np.mean(arrays, axis=0)


def aggregate(rows: Sequence[Mapping], per_example: Mapping | None = None, n_resamples: int = 2000,
              seed: int = 0) -> list[Cell]:
    """Group rows by (dataset, system) and average over seeds (see the module docstring, and
    rag_mag/bench/report/write.py for the shape of rows and ``per_example``)."""
    per_example = per_example or {}
    groups: dict[tuple[str, str], list[Mapping]] = {}
    for row in rows:
        for key in ("dataset", "system"):
            if not isinstance(row.get(key), str):
                raise ValueError(f"every result row needs a string {key!r}; got {row.get(key)!r}")
        groups.setdefault((row["dataset"], row["system"]), []).append(row)
    cells = []
    for (dataset, system), members in groups.items():
        seeds = [int(member.get("seed", 0)) for member in members]
        values: dict[str, list[float]] = {}
        for member in members:
            for block in ("rag", "retrieval"):
                for metric, value in (member.get(block) or {}).items():
                    if finite(value) is not None and not metric.endswith("_ci"):
                        values.setdefault(metric, []).append(float(value))
        means = {metric: float(np.mean(numbers)) for metric, numbers in values.items()}
        seed_sd = {metric: float(np.std(numbers, ddof=1)) for metric, numbers in values.items() if len(numbers) > 1}
        cis: dict[str, tuple[float, float]] = {}
        for metric in means:
            averaged = seed_averaged(per_example, dataset, system, seeds, metric)
            if averaged is not None:
                # The mean and its CI come from the same per-question values, so they always agree.
                example_mean = 100.0 * float(averaged[1].mean())
                if abs(example_mean - means[metric]) > 0.5:
                    logger.warning("%s/%s: %s is %.2f in the rows but %.2f in the per-example values; reporting "
                                   "the per-example figure", dataset, system, metric, means[metric], example_mean)
                means[metric] = example_mean
                low, high = bootstrap_ci(averaged[1], n_resamples=n_resamples, seed=seed)
                cis[metric] = (100.0 * low, 100.0 * high)
            elif len(members) == 1 and metric in ("em", "f1") and members[0].get("rag", {}).get(f"{metric}_ci"):
                low, high = members[0]["rag"][f"{metric}_ci"]
                cis[metric] = (float(low), float(high))
        curves = [member.get("retrieval", {}).get("recall_curve") for member in members]
        curve = list(np.mean(curves, axis=0)) if curves and all(curves) and len({len(c) for c in curves}) == 1 else None
        cells.append(Cell(dataset=dataset, system=system, seeds=sorted(seeds),
                          n_questions=int(members[0].get("n_questions", 0)), means=means, cis=cis, seed_sd=seed_sd,
                          diagnostics=dict(members[0].get("diagnostics") or {}), curve=curve,
                          mode=(members[0].get("retrieval") or {}).get("mode"),
                          n_ranked=members[0].get("n_ranked")))
    return cells
