"""The crossover study: where (if anywhere) does a one-sided strategy overtake cosine?

One YAML config (``eval/configs/crossover.yaml``) lists training runs: strategies x seeds x lengths,
a data-size axis (a seeded share of the training pairs), and an optional tuning grid. Each run trains
once; at its ``checkpoints`` steps the same run is measured on the fixed validation file (held-out
training queries) and on the test sets (each dataset's questions against its own corpus, nDCG@10).
So every point of a curve comes from a checkpoint of one run, never from a separate shorter run.

Runs are cells: a finished run is saved as ``<out>/cells/<label>.json`` with the key of everything it
depends on, and a run's points are appended to ``curve.jsonl`` as they are measured, so an interrupted
study resumes (the trainer resumes from its ``last/`` checkpoint). ``--time-budget`` stops cleanly
between runs. A finished main run's published checkpoint is not committed (only its cell is): on another
machine ``--rebuild`` trains it again to the selected step and checks it against the cell. The study only
needs torch and transformers at training time (no Haystack, FAISS or vLLM), so it also runs on a GPU
machine (``device: auto``).

This module runs the study (``CrossoverRunner``); its parts live beside it in ``rag_mag/bench/crossover/``: the
config and run labels in ``config``, cells, keys and run folders in ``store``, the test sets in ``held_out``, the
measurement of checkpoints in ``measure``, the tuned values in ``tuning``, the published ``best/`` (link,
off-curve measurement, rebuild) in ``published``, and the report in ``report``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

from rag_mag.bench.crossover.config import CrossoverConfig, RunSpec
from rag_mag.bench.crossover.held_out import load_test_sets
from rag_mag.bench.crossover.measure import CheckpointMeter, RunClock, curve_points
from rag_mag.bench.crossover.published import (
    lacks_best,
    lacks_published_point,
    measure_published,
    publish,
    rebuild_checkpoint,
)
from rag_mag.bench.crossover.store import CrossoverStore, record_cpu_kind
from rag_mag.bench.crossover.tuning import as_trained
from rag_mag.bench.datasets import EvalDataset
from rag_mag.data import iter_jsonl, read_triples
from rag_mag.errors import ConfigError

logger = logging.getLogger("rag_mag.bench.crossover")  # the runner's log lines keep their name


class CrossoverRunner:
    def __init__(self, config: CrossoverConfig, config_path: str) -> None:
        self.config = config
        self.config_path = config_path
        self.store = CrossoverStore(config)

    def run(self, time_budget_s: float = 0.0, poll_s: float = 30.0, only: list[str] | None = None,
            rebuild: bool = False, rebuild_tolerance: float = 0.5) -> dict:
        """Train every unfinished run (resuming where a run was interrupted); return ``collect()``.

        ``only``: train just the runs with these labels (e.g. ``main_dot_s0_400``), in the config's order.

        ``rebuild``: a finished main run whose ``best/`` this machine lacks (a fresh clone holds the cells,
        not the checkpoints) is trained again up to the step its cell selected, and published only if its
        validation nDCG@10 there is within ``rebuild_tolerance`` points of the cell's (see
        ``published.rebuild_checkpoint``).

        Several processes may run the same config at once (``rag-mag crossover --workers N``): each claims a
        run with a lock before training it, and runs that wait for the tuning runs or for another worker are
        retried every ``poll_s`` seconds.
        """
        started = time.monotonic()
        tests = load_test_sets(self.config)
        validation = read_triples(self.config.val_data)[:300]
        store = self.store
        store.cells_dir.mkdir(parents=True, exist_ok=True)
        specs = self.config.run_specs()
        chosen = _only(specs, only)
        while True:
            waiting, trained = 0, False
            for spec in chosen:
                spec = as_trained(store, spec, specs)
                if spec is None:  # its tuning runs are not finished yet
                    waiting += 1
                    continue
                train_file = store.train_file(spec)
                key = store.key(spec, train_file)
                run_dir = store.run_dir(key)
                if store.finished(spec, key) and not (rebuild and lacks_best(spec, run_dir)) \
                        and not lacks_published_point(store, spec, run_dir):
                    publish(store, spec, run_dir)
                    continue
                if time_budget_s and time.monotonic() - started > time_budget_s:
                    logger.warning("time budget spent; run the same command again to continue")
                    return self.collect()
                with store.claim(key) as claimed:
                    if not claimed:  # another worker trains it
                        waiting += 1
                        continue
                    trained |= self._complete(spec, key, train_file, run_dir, tests, validation,
                                              rebuild, rebuild_tolerance)
            if not waiting:
                return self.collect()
            if not trained:
                logger.info("waiting for %d runs (held by other workers, or waiting for the tuning runs)", waiting)
                time.sleep(poll_s)

    def _complete(self, spec: RunSpec, key: str, train_file: Path, run_dir: Path, tests: list[EvalDataset],
                  validation: list, rebuild: bool, rebuild_tolerance: float) -> bool:
        """Under the run's lock: train it, rebuild its best/ or measure its published step, as it needs;
        whether anything was done."""
        done = False
        if not self.store.finished(spec, key):
            self._train_run(spec, key, train_file, run_dir, tests, validation)
            done = True
        elif rebuild and lacks_best(spec, run_dir):
            rebuild_checkpoint(self.store, spec, key, train_file, run_dir, validation, rebuild_tolerance)
            done = True
        if lacks_published_point(self.store, spec, run_dir):
            measure_published(self.store, spec, run_dir, tests, validation)
            done = True
        return done

    def _train_run(self, spec: RunSpec, key: str, train_file: Path, run_dir: Path, tests: list[EvalDataset],
                   validation: list) -> None:
        """Train one run, measuring its checkpoints as it goes, then write its cell and publish its best/."""
        from rag_mag.retriever.training.trainer import Trainer

        trainer = Trainer(self.config.train_config(spec, train_file, run_dir))
        # the run's clock goes on from where its earlier processes stopped (or were last measured, after a kill)
        clock = RunClock(run_dir)
        meter = CheckpointMeter(self.config, spec, trainer, run_dir, tests, validation, clock,
                                self.store.work / "step0")
        trainer.on_step = meter
        kinds = record_cpu_kind(run_dir)
        try:
            result = trainer.train()
        finally:
            clock.save()
        points = curve_points(meter.curve_path)
        log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
        losses = [r for r in log if "loss" in r]
        cell = {"key": key, "run": asdict(spec), "label": spec.label, "curve": [points[s] for s in sorted(points)],
                "final_loss": losses[-1]["loss"] if losses else None,
                "final_norms": {k: losses[-1][k] for k in ("query_norm_mean", "query_norm_cv",
                                                             "document_norm_mean", "document_norm_cv")}
                if losses else {},
                "train_size": sum(1 for _ in iter_jsonl(train_file)),
                "seconds": round(clock.seconds()),
                "device": str(trainer.device), "cpu_kinds": kinds, "bf16": trainer.bf16, "steps_done": result.step,
                "selection": trainer.config.selection, "selected_step": result.best_metrics.get("step")}
        self.store.write_cell(spec.label, cell)
        publish(self.store, spec, run_dir)

    def collect(self) -> dict:
        """The finished cells of this config's runs, each only if its key matches what the run would be now
        (cells of runs no longer in the config, or trained on other data or settings, are left out: after
        the recipe changes, an old cell is never reported, nor does it tune a new run).

        Without the training data (a fresh clone) keys cannot be checked; the cells are reported as they
        are, with a warning."""
        specs = self.config.run_specs()
        checkable = all(Path(path).is_file() for path in (self.config.train_data, self.config.val_data))
        if not checkable:
            logger.warning("cannot check the finished cells against the training data (%s or %s is missing): "
                           "reporting them as they are", self.config.train_data, self.config.val_data)
        cells, stale = [], []
        for spec in sorted(specs, key=lambda spec: spec.label):
            cell = self.store.cell(spec.label)
            if not cell:
                continue
            if checkable and cell.get("key") != self._current_key(spec, specs):
                stale.append(spec.label)
            else:
                cells.append(cell)
        if stale:
            logger.warning("%d finished cells were trained on other data or settings and are left out (they "
                           "train again): %s", len(stale), ", ".join(stale))
        done = {cell["label"] for cell in cells}
        return {"config": asdict(self.config), "cells": cells, "planned": len(specs),
                "pending": [spec.label for spec in specs if spec.label not in done]}

    def _current_key(self, spec: RunSpec, specs: list[RunSpec]) -> str | None:
        """The key ``spec`` would train under now; None while its tuning runs are unfinished."""
        trained = as_trained(self.store, spec, specs)
        return None if trained is None else self.store.key(trained, self.store.train_file(trained))


def _only(specs: list[RunSpec], only: list[str] | None) -> list[RunSpec]:
    """The runs named by ``--only`` (all without it), in the config's order; an unknown label is refused."""
    if not only:
        return specs
    labels = [spec.label for spec in specs]
    unknown = [label for label in only if label not in labels]
    if unknown:
        raise ConfigError(f"--only: no run labelled {', '.join(unknown)} in this config; its runs are: "
                          + ", ".join(labels))
    return [spec for spec in specs if spec.label in only]
