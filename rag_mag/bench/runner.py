"""``rag-mag bench``: train once per strategy and seed, index, retrieve, generate, score, report.

Work is split into cells (dataset x system x seed). Each finished cell is saved as JSON under
``<report>/cells/`` together with the key of everything it depends on; a rerun skips cells whose
key still matches, so an interrupted benchmark resumes where it stopped. Trained retrievers are
cached under ``artifacts/bench/retrievers/<key>`` (the key hashes the training config and the data),
and generations are cached by prompt.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag.bench.config import BenchConfig, file_digest, fingerprint, resolve_path
from rag_mag.data import read_triples, write_jsonl
from rag_mag.datasets import EvalDataset, data_root, load_eval_dataset, parse_dataset_arg
from rag_mag.errors import ConfigError
from rag_mag.models import artifacts_dir

logger = logging.getLogger(__name__)
CELL_FORMAT = 2  # bump when a cell's content changes, so that older cells are recomputed


@dataclass(frozen=True)
class System:
    name: str  # a strategy name, or a baseline name
    seed: int
    checkpoint: Path | None  # dense systems only

    @property
    def label(self) -> str:
        return f"{self.name}__s{self.seed}"


class BenchRunner:
    def __init__(self, config: BenchConfig, config_path: str, command: str) -> None:
        self.config = config
        self.config_path = config_path
        self.command = command
        self.out = config.out_dir()
        self.cells_dir = self.out / "cells"
        self.root = data_root(config.data_root)

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
        from rag_mag.config import make_config
        from rag_mag.data import read_corpus, read_pairs
        from rag_mag.mining import evaluation_keys, mine_triples

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
        from rag_mag.trainer import Trainer

        systems = []
        for strategy in self.config.strategies:
            for seed in self.config.seeds_of(strategy):
                base = self.config.train_config(seed, strategy, str(train_file))
                settings = {k: v for k, v in base.to_dict().items() if k not in ("out", "resume", "train_data")}
                folder = artifacts_dir() / "bench" / "retrievers" / \
                    f"{strategy}-s{seed}-{fingerprint(settings, file_digest(train_file))}"
                if not (folder / "done.json").is_file():
                    logger.info("training %s (seed %d) into %s", strategy, seed, folder)
                    started = time.perf_counter()
                    result = Trainer(self.config.train_config(seed, strategy, str(train_file), str(folder))).train()
                    (folder / "done.json").write_text(json.dumps({
                        "best_validation": result.best_metrics, "steps": result.step,
                        "seconds": round(time.perf_counter() - started, 1)}, indent=2))
                systems.append(System(strategy, seed, folder / "best"))
        return systems

    def baseline_systems(self) -> list[System]:
        systems = []
        if "base_cosine" in self.config.baselines:
            from rag_mag.encoder import MagnitudeEncoder

            base_model = self.config.train.get("base_model") or None
            folder = artifacts_dir() / "bench" / "retrievers" / f"base-cosine-{fingerprint(base_model)}"
            if not (folder / "rag_mag.json").is_file():
                MagnitudeEncoder.build(base_model, "cosine").save(folder)
            systems.append(System("base_cosine", 0, folder))
        if "bm25" in self.config.baselines:
            systems.append(System("bm25", 0, None))
        if "closed_book" in self.config.baselines:
            systems.append(System("closed_book", 0, None))
        return systems

    # ------------------------------------------------------------------ the run
    def run(self) -> Path:
        from rag_mag.bench.cells import evaluate_cell
        from rag_mag.bench.generation import BenchGenerator, GenerationCache
        from rag_mag.bench.llm import llm_server

        self.out.mkdir(parents=True, exist_ok=True)
        datasets = self.load_datasets()
        train_file = self.prepare_training_data(datasets)
        systems = self.train_systems(train_file) + self.baseline_systems()
        self.systems = systems
        cells = []
        with llm_server(self.config) as llm_url:
            generator = BenchGenerator(resolve_path(self.config.pipeline), llm_url,
                                       GenerationCache(self.out / "cache" / "generations.jsonl"),
                                       self.config.max_tokens, self.config.concurrency)
            total = len(datasets) * len(systems)
            for dataset in datasets.values():
                for system in systems:
                    cells.append(self._cell(dataset, system, generator, evaluate_cell, len(cells) + 1, total))
        from rag_mag.bench.cells import side_predictors

        predictors = side_predictors(datasets, train_file, self.config)
        from rag_mag.bench.summary import write_outputs

        return write_outputs(self, cells, predictors, datasets)

    def _cell(self, dataset: EvalDataset, system: System, generator, evaluate_cell, number: int, total: int) -> dict:
        key = fingerprint(CELL_FORMAT, self.config.encode_bf16, self.config.retrieval_top_k, self.config.rag_top_k,
                          self.config.max_tokens,
                          generator.model, str(system.checkpoint), [r.id for r in dataset.records],
                          len(dataset.corpus), file_digest(resolve_path(self.config.pipeline)))
        path = self.cells_dir / f"{dataset.name}__{system.label}.json"
        if path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("key") == key:
                logger.info("[%d/%d] %s / %s: done earlier, reused", number, total, dataset.name, system.label)
                return saved
        logger.info("[%d/%d] %s / %s", number, total, dataset.name, system.label)
        started = time.perf_counter()
        cell = evaluate_cell(dataset, system, generator, self.config)
        cell.update(key=key, dataset=dataset.name, system=system.name, seed=system.seed,
                    seconds=round(time.perf_counter() - started, 1))
        write_jsonl_atomic(path, cell)
        return cell

    def environment(self) -> dict[str, Any]:
        from rag_mag.report import collect_environment

        return collect_environment(self.command, extra={"config_file": self.config_path,
                                                        "pipeline": self.config.pipeline})


def write_jsonl_atomic(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(record, default=_json_default))
    staging.replace(path)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")
