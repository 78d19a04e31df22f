"""Measuring a crossover run as it trains: validation and test nDCG@10 at its checkpoints, its curve and its clock."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.bench.config import fingerprint
from rag_mag.bench.crossover.config import CrossoverConfig, RunSpec
from rag_mag.bench.crossover.held_out import test_ndcg
from rag_mag.bench.datasets import EvalDataset

logger = logging.getLogger(__name__)


class RunClock:
    """A run's seconds over all its processes: it goes on from ``run_dir/seconds``, which ``save`` writes after
    each measurement and when a process ends (a killed run loses the time since its last measurement)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        path = run_dir / "seconds"
        self.start = time.monotonic() - (float(path.read_text()) if path.is_file() else 0.0)

    def seconds(self) -> float:
        return time.monotonic() - self.start

    def save(self) -> None:
        if self.run_dir.is_dir():
            durable.write_text(self.run_dir / "seconds", f"{self.seconds():.1f}")


def curve_points(curve_path: Path) -> dict[int, dict]:
    """A run's measured points by step (none before its first)."""
    points: dict[int, dict] = {}
    if not curve_path.is_file():
        return points
    for line in curve_path.read_text().splitlines():
        try:
            point = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill in the middle of a write
            continue
        points[point["step"]] = point  # a resumed run may have measured a step twice: keep the last
    return points


@dataclass
class CheckpointMeter:
    """The trainer's step hook for one run (``Trainer.on_step``): at each checkpoint step, validation (and,
    for the test groups, test) nDCG@10 appended to ``run_dir/curve.jsonl``."""

    config: CrossoverConfig
    spec: RunSpec
    trainer: Any                  # rag_mag.retriever.training.trainer.Trainer
    run_dir: Path
    tests: list[EvalDataset]
    validation: list
    clock: RunClock
    step0_dir: Path               # test scores of untrained encoders, shared by every run

    @property
    def curve_path(self) -> Path:
        return self.run_dir / "curve.jsonl"

    @property
    def checkpoints(self) -> set[int]:
        return {s for s in self.config.checkpoints if s <= self.spec.steps} | {self.spec.steps}

    def __call__(self, step: int, encoder) -> None:
        """Measure ``step`` if it is a checkpoint, once (a run resumed after a kill may replay a step it had
        measured)."""
        if step not in self.checkpoints or step in curve_points(self.curve_path):
            return
        spec, config = self.spec, self.config
        metrics, per_query = self.trainer.validation_scores(encoder, self.validation)
        point: dict[str, Any] = {"step": step, "validation": metrics, "validation_per_query": per_query, "test": {}}
        tested = spec.group in config.test_groups and \
            (spec.group not in config.test_last_only or step == spec.steps)
        for dataset in self.tests if tested else ():
            point["test"][dataset.name] = self.test_point(step, encoder, dataset)
        point["g"] = list(encoder.degrees.as_floats())
        point["seconds"] = round(self.clock.seconds())
        self.curve_path.parent.mkdir(parents=True, exist_ok=True)
        with self.curve_path.open("a") as handle:
            handle.write(json.dumps(point) + "\n")
        self.clock.save()
        logger.info("%s step %d: val nDCG@10 %.1f, test %s", spec.label, step, point["validation"]["ndcg@10"],
                    " ".join(f"{k}={v['ndcg@10']:.1f}" for k, v in point["test"].items()))

    def test_point(self, step: int, encoder, dataset: EvalDataset) -> dict:
        """Test nDCG@10 of one checkpoint on one dataset.

        Step 0 is the untrained encoder, and a positive scale per side (the norm calibration) changes no
        ranking, so its test scores are the same for every run that starts from the same encoder under the
        same treatment (strategy and degrees): measured once, then read from ``artifacts/crossover/step0/``.
        """
        trainer, cache = self.trainer, None
        if step == 0:
            config = trainer.config
            key = fingerprint(encoder.config.strategy, encoder.degrees.as_floats(), config.base_model,
                              config.pooling, config.query_max_length, config.document_max_length, trainer.bf16,
                              dataset.name, [r.id for r in dataset.records], [p.id for p in dataset.corpus])
            cache = self.step0_dir / f"{key}.json"
            if cache.is_file():
                return json.loads(cache.read_text())
        mean, per_example = test_ndcg(encoder, dataset, trainer.bf16)
        result = {"ndcg@10": mean, "per_example": per_example}
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            durable.write_text(cache, json.dumps(result))
        return result
