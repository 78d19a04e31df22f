"""Where a crossover study keeps its runs: training files, cell keys, finished cells, run folders and locks."""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rag_mag import durable
from rag_mag.bench.config import fingerprint
from rag_mag.bench.crossover.config import CrossoverConfig, RunSpec
from rag_mag.data import iter_jsonl, write_jsonl
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir
from rag_mag.precision import cpu_kind
from rag_mag.retriever.training.config import TrainConfig

CELL_FORMAT = 1
# Settings that change how fast a run goes on this machine, not what it learns: not part of a cell's key.
MACHINE_SETTINGS = ("threads", "device", "log_every")
# TrainConfig fields each run sets from its spec and files (keyed through them) or that only steer resuming.
RUN_SETTINGS = ("strategy", "seed", "steps", "train_data", "val_data", "val_corpus", "out", "resume",
                "resume_anyway")


# TrainConfig fields added after the study, with the default that trains exactly as before they existed: they enter
# a cell's key only when set otherwise, so that adding one does not make every committed cell stale.
NEUTRAL_DEFAULTS = {"short_negatives": 0}


def recipe_settings(train: dict) -> dict:
    """The training settings a run's cell depends on: TrainConfig's defaults under the config's ``train`` block,
    so that a changed default (``wise_alpha`` became 0.5) makes the cells trained under the old one stale."""
    defaults = {k: v for k, v in asdict(TrainConfig()).items() if k not in RUN_SETTINGS}
    settings = {**defaults, **train}
    return {k: v for k, v in settings.items() if k not in (*MACHINE_SETTINGS, "selection")
            and not (k in NEUTRAL_DEFAULTS and v == NEUTRAL_DEFAULTS[k])}


class CrossoverStore:
    """The finished cells of one config (``<out>/cells/<label>.json``, committed) and the working files of its
    runs (``artifacts/crossover/``: filtered training files, run folders by key, locks; not committed)."""

    def __init__(self, config: CrossoverConfig) -> None:
        self.config = config
        self.cells_dir = config.out_dir() / "cells"
        self.work = artifacts_dir() / "crossover"

    def train_file(self, spec: RunSpec) -> Path:
        """The training triples of a run: a source filter and a seeded fraction of the shared file."""
        source = Path(self.config.train_data)
        if not spec.sources and spec.fraction >= 1:
            return source
        digest = fingerprint(str(source), self.config.ablation_data, spec.sources, spec.fraction, source.stat().st_size)
        target = self.work / "train" / f"{digest}.jsonl"
        if target.is_file():
            return target
        files = [source, Path(self.config.ablation_data)] if spec.sources and self.config.ablation_data else [source]
        rows = [row for path in files for _, row in iter_jsonl(path)]
        if spec.sources:
            rows = [row for row in rows if row.get("source") in spec.sources]
        if spec.fraction < 1:
            order = np.random.default_rng(1234).permutation(len(rows))  # nested: 25% is inside 50%
            rows = [rows[i] for i in sorted(order[: max(1, int(len(rows) * spec.fraction))])]
        if not rows:
            raise ConfigError(f"run {spec.label}: no training triples left (sources {spec.sources})")
        write_jsonl(target, rows)
        return target

    def key(self, spec: RunSpec, train_file: Path) -> str:
        """The fingerprint of everything a run's cell depends on; a cell under another key is stale."""
        config = self.config
        settings = recipe_settings(config.train)
        last_only = ["test_last_only"] if spec.group in config.test_last_only else []  # older keys unchanged
        # a main run publishes best/, which the selection rule chooses (the other groups' keys are unchanged)
        selection = ["selection", config.train.get("selection", TrainConfig.selection)] \
            if spec.group == "main" else []
        return fingerprint(CELL_FORMAT, asdict(spec), settings, config.checkpoints,
                           spec.group in config.test_groups, config.datasets, config.max_questions,
                           train_file.stat().st_size, Path(config.val_data).stat().st_size, *last_only,
                           *selection)

    def run_dir(self, key: str) -> Path:
        return self.work / "runs" / key

    def cell(self, label: str) -> dict:
        """A run's finished cell ({} if there is none)."""
        path = self.cells_dir / f"{label}.json"
        return json.loads(path.read_text().splitlines()[0]) if path.is_file() else {}

    def write_cell(self, label: str, cell: dict) -> None:
        write_jsonl(self.cells_dir / f"{label}.json", [cell])

    def finished(self, spec: RunSpec, key: str) -> bool:
        return self.cell(spec.label).get("key") == key

    @contextlib.contextmanager
    def claim(self, key: str) -> Iterator[bool]:
        """An exclusive lock on one run, so that several workers (``--workers``) never train the same one;
        the operating system releases it when a worker dies."""
        path = self.work / "locks" / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def record_cpu_kind(run_dir: Path) -> list[str]:
    """The kinds of CPU (``precision.cpu_kind``) that trained this run, over all its processes
    (``run_dir/cpu_kinds``): a run resumed on another kind cannot be rebuilt bit for bit."""
    path, here = run_dir / "cpu_kinds", cpu_kind()
    kinds = json.loads(path.read_text()) if path.is_file() else []
    if here not in kinds:
        kinds.append(here)
        run_dir.mkdir(parents=True, exist_ok=True)
        durable.write_text(path, json.dumps(kinds))
    return kinds
