"""What a benchmark scores: ``System`` (a retriever or a reader baseline), ``Row`` (a system through a pipeline), and
``SystemCatalog``, which trains, finds or builds a config's systems and keeps ``retrievers.json``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rag_mag import durable
from rag_mag.bench.config import (
    BASE_READER_SUFFIX,
    BenchConfig,
    PipelineEntry,
    file_digest,
    fingerprint,
    resolve_path,
    system_name,
)
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir

logger = logging.getLogger("rag_mag.bench.runner")  # the runner's log lines keep their name


@dataclass(frozen=True)
class System:
    """A retriever (a strategy's trained checkpoint, ``base_cosine``) or a reader baseline (``bm25``,
    ``closed_book``, ``oracle``: no checkpoint)."""

    name: str  # a strategy name, or a baseline name
    seed: int
    checkpoint: Path | None  # dense systems only
    digest: str | None = None  # the checkpoint's content identity (dense systems only)

    @property
    def label(self) -> str:
        return f"{self.name}__s{self.seed}"

    @property
    def missing(self) -> bool:
        """A configured retriever that is not on this machine (only its recorded cells can count)."""
        return self.checkpoint is not None and not self.checkpoint.exists()


@dataclass(frozen=True)
class Row:
    """One (pipeline, system) pair: a row of the report, named ``PIPELINE:SYSTEM`` (plain for reader baselines),
    answered by the config's reader, or by its base reader (``base``: named ``SYSTEM@base``)."""

    system: System
    pipeline: PipelineEntry | None
    base: bool = False

    @property
    def name(self) -> str:
        name = system_name(self.pipeline.name if self.pipeline else None, self.system.name)
        return name + BASE_READER_SUFFIX if self.base else name

    @property
    def label(self) -> str:
        return f"{self.name.replace(':', '__')}__s{self.system.seed}"


class SystemCatalog:
    """A config's systems: its strategies trained once per seed (cached under ``artifacts/bench/retrievers/``) or
    given in ``retrievers:``, and its baselines; and ``records_path`` (``<report>/retrievers.json``), each
    configured retriever's digest, strategy and training log, so that its cells count on a machine without it."""

    def __init__(self, config: BenchConfig, root: Path | None, records_path: Path, only: Sequence[str] = ()) -> None:
        """``only``: just these systems (strategies or baselines); a configured retriever that is not trained yet
        is then skipped instead of refused."""
        self.config = config
        self.root = root
        self.records_path = records_path
        self.only = list(only)
        self.records: dict[str, dict] = {}  # configured retriever path -> digest, strategy, training log

    def train_systems(self, train_file: Path) -> list[System]:
        from rag_mag.retriever.encoder import checkpoint_digest
        from rag_mag.retriever.training.trainer import Trainer

        systems = []
        for strategy in self.config.strategies:
            if self.only and strategy not in self.only:
                continue
            if strategy in self.config.retrievers:
                systems += self.given_systems(strategy)
                continue
            for seed in self.config.seeds_of(strategy):
                base = self.config.train_config(seed, strategy, str(train_file))
                settings = {k: v for k, v in base.to_dict().items() if k not in ("out", "resume", "train_data")}
                folder = artifacts_dir() / "bench" / "retrievers" / \
                    f"{strategy}-s{seed}-{fingerprint(settings, file_digest(train_file))}"
                if not (folder / "done.json").is_file():  # a shared cache: another benchmark may train it too
                    with durable.job_lock(durable.lock_path(folder), f"the benchmark retriever {folder}"):
                        logger.info("training %s (seed %d) into %s", strategy, seed, folder)
                        started = time.perf_counter()
                        config = self.config.train_config(seed, strategy, str(train_file), str(folder))
                        result = Trainer(config).train()
                        durable.write_text(folder / "done.json", json.dumps({
                            "best_validation": result.best_metrics, "steps": result.step,
                            "seconds": round(time.perf_counter() - started, 1)}, indent=2))
                systems.append(System(strategy, seed, folder / "best", checkpoint_digest(folder / "best")))
        return systems

    def given_systems(self, strategy: str) -> list[System]:
        """The config's already trained checkpoints of a strategy (seeds numbered in list order).

        A path that is not on this machine counts only if ``retrievers.json`` recorded it on an earlier run:
        its recorded cells are reused, and any cell it never scored fails with a message."""
        from rag_mag.bench.summary import read_training_log
        from rag_mag.retriever.encoder import CONFIG_NAME, checkpoint_digest, resolve_checkpoint_dir

        systems = []
        for seed, text in enumerate(self.config.retrievers[strategy]):
            path = resolve_path(text, self.root)
            record = self.records.get(text)
            if not path.exists():
                if record is None and self.only:
                    logger.warning("retrievers.%s: %s is not trained yet; skipped (--only)", strategy, text)
                    continue
                if record is None:
                    raise ConfigError(f"retrievers.{strategy}: {path} does not exist, and {self.records_path} has "
                                      "no record of it; train it first (see the config's comments) or fix the path")
                if record["strategy"] != strategy:
                    raise ConfigError(f"retrievers.{strategy}: {text} was recorded as a {record['strategy']} "
                                      f"retriever, not {strategy}")
                logger.warning("retrievers.%s: %s is not on this machine; only the cells it scored before count",
                               strategy, text)
                systems.append(System(strategy, seed, path, record["digest"]))
                continue
            folder = resolve_checkpoint_dir(path)
            try:
                saved = json.loads((folder / CONFIG_NAME).read_text()).get("strategy")
            except (OSError, json.JSONDecodeError):
                raise ConfigError(f"retrievers.{strategy}: {folder} is not a rag-mag checkpoint (no readable "
                                  f"{CONFIG_NAME}); train one with `rag-mag train` or fix the path") from None
            if saved != strategy:
                raise ConfigError(f"retrievers.{strategy}: {folder} holds a {saved} retriever, not {strategy}")
            digest = checkpoint_digest(folder)
            self.records[text] = {"strategy": strategy, "digest": digest,
                                  "train_log": read_training_log(folder.parent / "train_log.jsonl")}
            systems.append(System(strategy, seed, folder, digest))
        return systems

    def write_records(self) -> None:
        if self.records:
            durable.write_text(self.records_path, json.dumps(self.records, indent=1, sort_keys=True))

    def read_records(self) -> None:
        try:
            self.records = json.loads(self.records_path.read_text()) if self.records_path.is_file() else {}
        except json.JSONDecodeError:
            raise ConfigError(f"{self.records_path} is not valid JSON; restore it from git or delete it (its "
                              "retrievers' cells are then scored again)") from None

    def baseline_systems(self) -> list[System]:
        systems = []
        chosen = [name for name in self.config.baselines if not self.only or name in self.only]
        if "base_cosine" in chosen:
            from rag_mag.retriever.encoder import MagnitudeEncoder, checkpoint_digest

            base_model = self.config.train.get("base_model") or None
            folder = artifacts_dir() / "bench" / "retrievers" / f"base-cosine-{fingerprint(base_model)}"
            if not (folder / "rag_mag.json").is_file():
                MagnitudeEncoder.build(base_model, "cosine").save(folder)
            systems.append(System("base_cosine", 0, folder, checkpoint_digest(folder)))
        if "bm25" in chosen:
            systems.append(System("bm25", 0, None))
        for name in ("closed_book", "oracle"):
            if name in chosen:
                systems.append(System(name, 0, None))
        return systems
