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

This module runs the benchmark; its parts are beside it: ``systems`` (System, Row, and SystemCatalog: the
trained, configured and baseline systems, and ``retrievers.json``), ``training_file`` (the training data),
``cell_store`` (a cell's key and its file), ``scoring`` and ``cells`` (one cell), ``summary`` and ``report``.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rag_mag import durable
from rag_mag.bench.cell_store import cell_key, cell_path, write_jsonl_atomic
from rag_mag.bench.config import READER_BASELINES, BenchConfig
from rag_mag.bench.dataset_specs import parse_dataset_arg
from rag_mag.bench.datasets import EvalDataset, data_root, load_eval_dataset
from rag_mag.bench.generation import CellFailed, resolve_pipeline
from rag_mag.bench.systems import Row, System, SystemCatalog
from rag_mag.bench.training_file import prepare_training_data
from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)


class BenchRunner:
    def __init__(self, config: BenchConfig, config_path: str, command: str, only: list[str] | None = None,
                 pg_url: str | None = None) -> None:
        """``only``: score just these systems (strategies or baselines) and write no report; a configured
        retriever that is not trained yet is then skipped instead of refused. ``pg_url``: the PostgreSQL of
        pgvector pipelines (default: ``$RAG_MAG_PG_URL``, else the server of ``rag-mag db start``)."""
        valid = [*config.strategies, *config.baselines]
        unknown = [name for name in only or () if name not in valid]
        if unknown:
            raise ConfigError(f"--only: {', '.join(unknown)} is not a system of this config; its systems are: "
                              + ", ".join(valid))
        self.only = list(only or ())
        self.pg_url = pg_url
        self.config = config
        self.config_path = config_path
        self.command = command
        self.out = config.out_dir()
        self.cells_dir = self.out / "cells"
        self.root = data_root(config.data_root)
        self.catalog = SystemCatalog(config, self.root, self.out / "retrievers.json", self.only)
        self.systems: list[System] = []
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
        from rag_mag.serving.llm.server import running_server

        self.started = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        for path in [self.config.retrieval_pipeline, self.config.reader_pipeline] + \
                [entry.path for entry in self.config.pipeline_entries()]:
            resolve_pipeline(path)  # a missing file fails now, not after training
        datasets = self.load_datasets()
        train_file = prepare_training_data(self.config, datasets, self.root)
        self.catalog.read_records()
        systems = self.catalog.train_systems(train_file) + self.catalog.baseline_systems()
        self.systems = systems
        self.catalog.write_records()
        rows = self.rows(systems)
        scorer = CellScorer(self.config, None, GenerationCache(self.out / "cache" / "generations.jsonl"))
        work = [(dataset, row) for dataset in datasets.values() for row in rows
                if (row.pipeline is None or row.pipeline.covers(dataset.name)) and scorer.applies(dataset, row)]
        started = time.perf_counter()
        if ranked := self.rank_first(work, scorer):
            logger.info("indexed and ranked %d (retriever, dataset) pairs in %.0f s, before starting vLLM", ranked,
                        time.perf_counter() - started)
        cells, failures = [], []
        with self.database(work, scorer) as scorer.pg_url:
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

    def database(self, work: list[tuple[EvalDataset, Row]], scorer):
        """The PostgreSQL server's URL while the cells are scored, when an unfinished cell's pipeline reads pgvector
        (started if none runs, and then stopped at the end); else ``None``."""
        from rag_mag.bench.pg_tables import uses_pgvector
        from rag_mag.serving.db import pgvector

        needs = {row.pipeline.path for dataset, row in work if row.pipeline is not None and not row.system.missing
                 and self._saved(dataset, row, scorer) is None}
        if not any(uses_pgvector(resolve_pipeline(path)) for path in needs):
            return nullcontext()
        return pgvector.using_server(self.pg_url)

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
        """Everything a cell depends on (``cell_key``), with the reader that answers the row."""
        return cell_key(self.config, dataset, row, scorer, self.reader_identity(row.base))

    def _saved(self, dataset: EvalDataset, row: Row, scorer) -> dict | None:
        """The cell saved by an earlier run, if its key still matches."""
        path = cell_path(self.cells_dir, dataset, row)
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
        write_jsonl_atomic(cell_path(self.cells_dir, dataset, row), cell)
        durable.fault_point("bench:cell")
        return cell

    def reader_identity(self, base: bool = False) -> dict[str, str]:
        """The reader that answers a row: its name and, for a packaged reader, its checksum (a retrained reader
        changes every cell's key)."""
        from rag_mag.serving.llm.readers import reader_checksum

        name = self.config.base_reader if base else self.config.reader
        if name not in self._reader_checksums:  # read once per run: the adapter's sha256 is a file's hash
            self._reader_checksums[name] = reader_checksum(name)
        return {"name": name, "checksum": self._reader_checksums[name]}

    def readers(self) -> list[dict[str, str]]:
        return [self.reader_identity()] + ([self.reader_identity(True)] if self.config.base_reader else [])

    def environment(self) -> dict[str, Any]:
        from rag_mag.bench.report.environment import collect_environment

        return collect_environment(self.command, extra={
            "config_file": self.config_path,
            "pipelines": ", ".join(entry.path for entry in self.config.pipeline_entries()),
            "reader_pipeline": self.config.reader_pipeline, "retrieval_pipeline": self.config.retrieval_pipeline})

