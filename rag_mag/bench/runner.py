"""``rag-mag bench``: train once per strategy and seed, index, run the YAML pipelines, score, report.

Work is split into cells: a dataset x a row (a retriever through one of the config's pipelines, named
``PIPELINE:SYSTEM``, or a reader baseline) x a seed. Each finished cell is saved as JSON under
``<report>/cells/`` together with the key of everything it depends on (the pipeline files' contents
included); a rerun skips cells whose key still matches, so an interrupted benchmark resumes where it
stopped. A cell whose generations keep failing is reported and skipped; the run goes on. Trained
retrievers are cached under ``artifacts/bench/retrievers/<key>`` (the key hashes the training config
and the data), indexes under ``artifacts/bench/indexes/<key>``, and pipeline results per question in
``<report>/cache/``. Each corpus an unfinished dense cell needs is indexed and ranked before the vLLM
server starts (``rank_first``), so that encoding has both cores to itself.

A dense cell's key names its retriever by content (``checkpoint_digest``), not by path, and
``<report>/retrievers.json`` records each configured retriever's digest and training log. So a report
can be completed across machines: a retriever of ``retrievers:`` that is no longer on this machine still
counts with the cells it scored before (and its recorded training curve), and only a cell it never scored
fails, with a message saying so.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag import durable
from rag_mag.bench.config import (
    BASE_READER_SUFFIX,
    READER_BASELINES,
    BenchConfig,
    PipelineEntry,
    file_digest,
    fingerprint,
    resolve_path,
    system_name,
)
from rag_mag.bench.dataset_specs import parse_dataset_arg
from rag_mag.bench.datasets import EvalDataset, data_root, load_eval_dataset
from rag_mag.bench.generation import CellFailed, resolve_pipeline
from rag_mag.data import read_triples, write_jsonl
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir

logger = logging.getLogger(__name__)
CELL_FORMAT = 4  # bump when a cell's content changes, so that older cells are recomputed


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


class BenchRunner:
    def __init__(self, config: BenchConfig, config_path: str, command: str, only: list[str] | None = None) -> None:
        """``only``: score just these systems (strategies or baselines) and write no report; a configured
        retriever that is not trained yet is then skipped instead of refused."""
        valid = [*config.strategies, *config.baselines]
        unknown = [name for name in only or () if name not in valid]
        if unknown:
            raise ConfigError(f"--only: {', '.join(unknown)} is not a system of this config; its systems are: "
                              + ", ".join(valid))
        self.only = list(only or ())
        self.config = config
        self.config_path = config_path
        self.command = command
        self.out = config.out_dir()
        self.cells_dir = self.out / "cells"
        self.records_path = self.out / "retrievers.json"
        self.root = data_root(config.data_root)
        self.records: dict[str, dict] = {}  # configured retriever path -> digest, strategy, training log
        self.started = time.perf_counter()
        self._reader_checksums: dict[str, str] = {}

    # ------------------------------------------------------------------ preparation
    def load_datasets(self) -> dict[str, EvalDataset]:
        datasets = {}
        for text in self.config.datasets:
            spec = parse_dataset_arg(text)
            datasets[spec.name] = load_eval_dataset(spec, data_root_dir=self.root,
                                                    limit=self.config.questions_for(spec.name))
            logger.info("dataset %s: %d questions, %d passages", spec.name, len(datasets[spec.name]),
                        len(datasets[spec.name].corpus))
        return datasets

    def prepare_training_data(self, datasets: dict[str, EvalDataset]) -> Path:
        """Concatenate the training files (and mined triples), checking none holds an evaluation question."""
        from rag_mag.metrics.answers import normalize_answer

        files = [resolve_path(f, self.root) for f in self.config.train_files()]
        if not files:
            raise ConfigError("the benchmark config has no train.train_data")
        mined = self._mine(datasets) if self.config.mine else None
        parts = files + ([mined] if mined else [])
        key = fingerprint([file_digest(p) for p in parts])
        target = artifacts_dir() / "bench" / "train" / f"train-{key}.jsonl"
        if target.is_file():
            return target
        evaluation = {normalize_answer(r.question) for d in datasets.values() for r in d.records}
        rows, dropped = [], 0
        for path in parts:
            for triple in read_triples(path):
                if normalize_answer(triple.query) in evaluation:
                    dropped += 1
                    continue
                rows.append({"id": triple.id, "query": triple.query, "answers": list(triple.answers),
                             "positives": [vars(p) for p in triple.positives],
                             "hard_negatives": [vars(p) for p in triple.hard_negatives]})
        if dropped:
            logger.warning("dropped %d training queries that are also evaluation questions", dropped)
        write_jsonl(target, rows)
        logger.info("training data: %d triples from %s", len(rows), ", ".join(p.name for p in parts))
        return target

    def _mine(self, datasets: dict[str, EvalDataset]) -> Path:
        from rag_mag.bench.config import MineConfig
        from rag_mag.data import read_corpus, read_pairs
        from rag_mag.retriever.config import make_config
        from rag_mag.retriever.mining import evaluation_keys, mine_triples

        mine = make_config(MineConfig, self.config.mine, source="mine config")
        pairs_path, corpus_path = resolve_path(mine.pairs, self.root), resolve_path(mine.corpus, self.root)
        # Exclude every question of the evaluation files, not only the benchmark's first N.
        full = [load_eval_dataset(parse_dataset_arg(t), data_root_dir=self.root) for t in self.config.datasets]
        key = fingerprint(vars(mine), file_digest(pairs_path), file_digest(corpus_path),
                          sorted(r.id for d in full for r in d.records))
        target = artifacts_dir() / "bench" / "train" / f"mined-{key}.jsonl"
        if not target.is_file():
            ids, questions = evaluation_keys(r for d in full for r in d.records)
            triples, stats = mine_triples(read_pairs(pairs_path), read_corpus(corpus_path), ids, questions,
                                          top_k=mine.top_k, max_positives=mine.max_positives,
                                          hard_negatives=mine.hard_negatives)
            write_jsonl(target, triples)
            logger.info("mined %d triples (%s)", len(triples), {k: v for k, v in vars(stats).items()
                                                                if k != "examples_excluded"})
        return target

    def train_systems(self, train_file: Path) -> list[System]:
        from rag_mag.retriever.encoder import checkpoint_digest
        from rag_mag.retriever.trainer import Trainer

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

    def rows(self, systems: list[System]) -> list[Row]:
        """Every dense system through every scored pipeline; each reader baseline once."""
        entries = self.config.pipeline_entries()
        dense = [Row(system, entry) for entry in entries for system in systems if system.checkpoint is not None]
        readers = [Row(system, None) for system in systems if system.name in READER_BASELINES]
        if self.config.base_reader:
            readers += [Row(system, None, base=True) for system in systems
                        if system.name in self.config.base_reader_rows]
        return dense + readers

    # ------------------------------------------------------------------ the run
    def run(self) -> Path:
        """Score every cell and write the report; return the report's folder. With ``only``, score just
        those systems' cells (to finish a report piece by piece) and write no report."""
        from rag_mag.bench.cells import side_predictors
        from rag_mag.bench.generation import GenerationCache
        from rag_mag.bench.scoring import CellScorer
        from rag_mag.bench.summary import write_outputs
        from rag_mag.serving.llm_server import running_server

        self.started = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        for path in [self.config.retrieval_pipeline, self.config.reader_pipeline] + \
                [entry.path for entry in self.config.pipeline_entries()]:
            resolve_pipeline(path)  # a missing file fails now, not after training
        datasets = self.load_datasets()
        train_file = self.prepare_training_data(datasets)
        self.read_records()
        systems = self.train_systems(train_file) + self.baseline_systems()
        self.systems = systems
        self.write_records()
        rows = self.rows(systems)
        scorer = CellScorer(self.config, None, GenerationCache(self.out / "cache" / "generations.jsonl"))
        work = [(dataset, row) for dataset in datasets.values() for row in rows
                if (row.pipeline is None or row.pipeline.covers(dataset.name)) and scorer.applies(dataset, row)]
        started = time.perf_counter()
        if ranked := self.rank_first(work, scorer):
            logger.info("indexed and ranked %d (retriever, dataset) pairs in %.0f s, before starting vLLM", ranked,
                        time.perf_counter() - started)
        cells, failures = [], []
        for base in (False, True):  # the reader's rows, then (on a server of its own) the base reader's
            phase = [(dataset, row) for dataset, row in work if row.base == base]
            model = self.config.base_reader if base else self.config.reader
            pending = any(self._saved(dataset, row, scorer) is None for dataset, row in phase)
            url = self.config.llm_url if not base else (self.config.base_reader_url or None)
            server = running_server(url, start=self.config.start_llm, model=model, free_port=base) \
                if pending else nullcontext()
            with server as llm_url:  # every cell done earlier: no server needed to write the report
                scorer.llm_url, scorer.llm_model = llm_url, model
                done, failed = self.score_cells(phase, scorer)
            cells += done
            failures += failed
        if not cells:
            raise CellFailed("every benchmark cell failed; see the errors above: " +
                             "; ".join(f"{f['dataset']}/{f['system']}: {f['error']}" for f in failures[:3]))
        if self.only:
            logger.info("scored %d cells of %s (%d failed); run without --only to write the report",
                        len(cells), ", ".join(self.only), len(failures))
            return self.out
        predictors = side_predictors(datasets, train_file, self.config)
        return write_outputs(self, cells, predictors, datasets, failures)

    def rank_first(self, work: list[tuple[EvalDataset, Row]], scorer) -> int:
        """Index and rank each corpus that an unfinished dense cell needs, before the vLLM server starts: encoding
        is most of a retriever's cost, and an idle server would take a third of a core from it. Returns how many
        (retriever, dataset) rankings were made."""
        needed = {(dataset.name, str(row.system.checkpoint)): (dataset, row.system.checkpoint)
                  for dataset, row in work if row.system.checkpoint is not None and not row.system.missing
                  and self._saved(dataset, row, scorer) is None}
        for dataset, checkpoint in needed.values():
            scorer.ranking(dataset, checkpoint)
        return len(needed)

    def score_cells(self, work: list[tuple[EvalDataset, Row]], scorer) -> tuple[list[dict], list[dict]]:
        """Every (dataset, row) cell in turn; one that fails (``CellFailed``) is recorded and the run goes on."""
        cells, failures = [], []
        for number, (dataset, row) in enumerate(work, start=1):
            try:
                cell = self._cell(dataset, row, scorer, number, len(work))
            except CellFailed as error:
                logger.error("[%d/%d] %s / %s failed: %s", number, len(work), dataset.name, row.name, error)
                failures.append({"dataset": dataset.name, "system": row.name, "seed": row.system.seed,
                                 "error": str(error)})
                continue
            if cell is not None:
                cells.append(cell)
        return cells, failures

    def _key(self, dataset: EvalDataset, row: Row, scorer) -> str:
        """Everything a cell depends on: settings, the retriever's content, the questions, the pipeline files."""
        used = [self.config.reader_pipeline] if row.pipeline is None else \
            [row.pipeline.path] + ([self.config.retrieval_pipeline] if row.system.checkpoint is not None else [])
        return fingerprint(CELL_FORMAT, self.config.encode_precision, self.config.retrieval_top_k,
                           self.config.rag_top_k, self.config.max_tokens, row.name, row.system.digest,
                           self.reader_identity(row.base), self.config.answered_by(row.pipeline, row.base),
                           [r.id for r in dataset.records], len(dataset.corpus),
                           [file_digest(resolve_pipeline(path)) for path in used],
                           scorer.primary_pipeline(dataset.name))

    def _saved(self, dataset: EvalDataset, row: Row, scorer) -> dict | None:
        """The cell saved by an earlier run, if its key still matches."""
        path = self.cells_dir / f"{dataset.name}__{row.label}.json"
        if not path.is_file():
            return None
        saved = json.loads(path.read_text())
        return saved if saved.get("key") == self._key(dataset, row, scorer) else None

    def _cell(self, dataset: EvalDataset, row: Row, scorer, number: int, total: int) -> dict | None:
        saved = self._saved(dataset, row, scorer)
        if saved is not None:
            logger.info("[%d/%d] %s / %s: done earlier, reused", number, total, dataset.name, row.name)
            return saved
        if row.system.missing:
            raise CellFailed(f"its retriever {row.system.checkpoint} is not on this machine and never scored this "
                             "cell; train it again here (see the config's comments), or drop it from `retrievers:`")
        logger.info("[%d/%d] %s / %s", number, total, dataset.name, row.name)
        started = time.perf_counter()
        cell = scorer.evaluate(dataset, row)
        if cell is None:
            return None
        cell.update(key=self._key(dataset, row, scorer), dataset=dataset.name, system=row.name, seed=row.system.seed,
                    pipeline=row.pipeline.path if row.pipeline else self.config.reader_pipeline,
                    seconds=round(time.perf_counter() - started, 1))
        write_jsonl_atomic(self.cells_dir / f"{dataset.name}__{row.label}.json", cell)
        return cell

    def reader_identity(self, base: bool = False) -> dict[str, str]:
        """The reader that answers a row: its name and, for a packaged reader, its checksum (a retrained reader
        changes every cell's key)."""
        from rag_mag.serving.llm_readers import reader_checksum

        name = self.config.base_reader if base else self.config.reader
        if name not in self._reader_checksums:  # read once per run: the adapter's sha256 is a file's hash
            self._reader_checksums[name] = reader_checksum(name)
        return {"name": name, "checksum": self._reader_checksums[name]}

    def readers(self) -> list[dict[str, str]]:
        return [self.reader_identity()] + ([self.reader_identity(True)] if self.config.base_reader else [])

    def environment(self) -> dict[str, Any]:
        from rag_mag.bench.report_environment import collect_environment

        return collect_environment(self.command, extra={
            "config_file": self.config_path,
            "pipelines": ", ".join(entry.path for entry in self.config.pipeline_entries()),
            "reader_pipeline": self.config.reader_pipeline, "retrieval_pipeline": self.config.retrieval_pipeline})


def write_jsonl_atomic(path: Path, record: dict) -> None:
    durable.write_text(path, json.dumps(record, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")
