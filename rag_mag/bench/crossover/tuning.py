"""The tuning runs' choice: the ``tuned`` fields every later crossover run takes, by validation nDCG@10 only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from rag_mag.bench.crossover.config import RunSpec
from rag_mag.bench.crossover.store import CrossoverStore
from rag_mag.errors import ConfigError


def as_trained(store: CrossoverStore, spec: RunSpec, specs: list[RunSpec]) -> RunSpec | None:
    """The run as it trains now: with its tuned values where the config tunes (tuning runs themselves are
    not tuned); None while a tuning run it depends on is unfinished."""
    if spec.group != "tuning" and store.config.tuned:
        return with_tuned(store, spec, specs)
    return spec


def with_tuned(store: CrossoverStore, spec: RunSpec, specs: list[RunSpec]) -> RunSpec | None:
    """The run with the ``tuned`` fields set from the finished tuning cells (validation only); None while
    a tuning run it depends on is unfinished: its own strategy's, or every one for a strategy that has
    none (it takes the values best on average)."""
    tuning_specs = [s for s in specs if s.group == "tuning"]
    if not tuning_specs:
        raise ConfigError(f"`tuned` names {', '.join(store.config.tuned)}, but the config has no tuning runs; "
                          "add a run with group: tuning and a grid, or remove `tuned`")
    tuning_specs = [s for s in tuning_specs if s.strategy == spec.strategy] or tuning_specs
    wanted = [s.label for s in tuning_specs]
    cells = []
    for tuning in tuning_specs:
        cell = store.cell(tuning.label)
        if cell.get("key") == store.key(tuning, store.train_file(tuning)):  # not one of an earlier recipe
            cells.append(cell)
    if set(wanted) - {c["label"] for c in cells}:
        return None
    return RunSpec(**{**asdict(spec), "tuned": tuned_values(store.config.tuned, spec, cells)})


def tuned_values(names: Sequence[str], spec: RunSpec, cells: Sequence[Mapping]) -> dict[str, Any]:
    """Per field of ``names`` (except those the run overrides itself): the grid value whose tuning run of
    the same strategy reached the best validation nDCG@10 at any checkpoint; for a strategy without tuning
    runs, the value with the best mean over the tuned strategies."""
    tuned = {}
    for name in names:
        if name in spec.overrides:
            continue
        scores: dict[str, dict[Any, float]] = {}
        for cell in cells:
            if name in cell["run"]["overrides"]:
                best = max(point["validation"]["ndcg@10"] for point in cell["curve"])
                scores.setdefault(cell["run"]["strategy"], {})[cell["run"]["overrides"][name]] = best
        if not scores:
            raise ConfigError(f"`tuned` names {name!r}, but no tuning run varies it")
        if spec.strategy in scores:
            tuned[name] = max(scores[spec.strategy], key=scores[spec.strategy].get)
        else:
            values = set.intersection(*(set(v) for v in scores.values()))
            tuned[name] = max(values, key=lambda v: np.mean([scores[s][v] for s in scores]))
    return tuned
