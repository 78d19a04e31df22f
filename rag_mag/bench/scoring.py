"""``CellScorer``: computes one benchmark cell (a row on a dataset) by running the YAML pipelines.

A dense row (``rag:qnorm``) needs the strategy's index of the dataset's corpus (built once), the
retrieval pipeline's ranking of the corpus for every question (once per retriever and dataset, shared
by all scored pipelines), and the scored pipeline's answers. The ranking metrics and the norm
diagnostics belong to the retriever, not to the pipeline, so they are reported once per dataset: on
the row of the first listed pipeline that answers that dataset. Reader baselines run the reader
pipeline. See ``rag_mag.bench.cells`` for the scoring functions.

Ranking is cheap and generation is not, so the two cover different questions: the ranking metrics
(and bm25's) every question of the dataset (``max_questions``), the answers and what the reader was
given (EM, F1, recall@budget) the first ``BenchConfig.answered_by(entry)`` of them, the same first
questions for every row, so that paired tests stay paired. A cell records both counts
(``n_questions`` answered, ``n_ranked`` ranked).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rag_mag.bench.cells import (
    BuiltIndex,
    add_budget,
    answer_result,
    answer_scores,
    bm25_rank,
    budget_recall,
    build_index,
    corpus_documents,
    diagnostics,
    gold_documents,
    ranking_result,
    ranking_scores,
)
from rag_mag.bench.config import BenchConfig, PipelineEntry, fingerprint
from rag_mag.bench.datasets import EvalDataset
from rag_mag.bench.generation import (
    BenchPipeline,
    GenerationCache,
    generator_overrides,
    parameter_overrides,
    resolve_pipeline,
)
from rag_mag.bench.pg_tables import ensure_table, serialize_queries, uses_pgvector
from rag_mag.metrics.answers import clean_answer
from rag_mag.models import artifacts_dir
from rag_mag.serving.db.pgvector import table_overrides
from rag_mag.serving.pipelines import read_pipeline_dict

logger = logging.getLogger(__name__)
RETRIEVAL_CONCURRENCY = 4  # the retrieval pipeline is CPU-bound (no server to wait for)
DEFAULT_READER_TOP_K = 3  # passages for the bm25 reader and oracle cap when rag_top_k is null


class CellScorer:
    def __init__(self, config: BenchConfig, llm_url: str | None, cache: GenerationCache,
                 components: dict[str, dict[str, Any]] | None = None) -> None:
        """``llm_url``: the vLLM server's; None until it is up (indexing and ranking need none).
        ``components``: per pipeline file stem, component instances to use instead of the file's (tests)."""
        self.config = config
        self.llm_url = llm_url
        self.llm_model = config.reader  # the model every generator asks for (the base reader's phase: its own)
        self.pg_url: str | None = None  # the PostgreSQL server's, for pgvector pipelines; set while it is up
        self.cache = cache
        self.components = components or {}
        self._indexes: dict[tuple[str, str], BuiltIndex] = {}
        self._rankings: dict[tuple[str, str], list[dict]] = {}
        self._readers: dict[str, BenchPipeline] = {}

    # ------------------------------------------------------------------ shared pieces
    def primary_pipeline(self, dataset: str) -> str | None:
        """The first listed pipeline that answers ``dataset``: its rows carry the retriever's ranking."""
        return next((entry.name for entry in self.config.pipeline_entries() if entry.covers(dataset)), None)

    def _pipeline(self, path: str, values: dict[str, Any], required: tuple[str, ...], concurrency: int,
                  generators: bool = True, extra: dict[str, Any] | None = None) -> BenchPipeline:
        """``values``: by the pipeline's declared short names; ``extra``: ``component.param`` overrides."""
        resolved = resolve_pipeline(path)
        overrides = parameter_overrides(resolved, values, required)
        overrides.update(extra or {})
        if generators:
            if self.llm_url is None:
                raise RuntimeError(f"{path} needs the vLLM server, which is not up yet")
            overrides.update(generator_overrides(resolved, self.llm_url, self.config.llm_timeout,
                                                 self.config.llm_max_retries, model=self.llm_model))
        return BenchPipeline(resolved, overrides, self.cache, concurrency=concurrency,
                             retry_waits=self.config.llm_retry_waits, components=self.components.get(resolved.stem))

    def index(self, dataset: EvalDataset, checkpoint: Path) -> BuiltIndex:
        key = (str(checkpoint), dataset.name)
        if key not in self._indexes:
            folder = artifacts_dir() / "bench" / "indexes" / fingerprint(
                _folder_identity(checkpoint), self.config.encode_precision, _corpus_identity(dataset))
            self._indexes[key] = build_index(dataset, checkpoint, folder, precision=self.config.encode_precision)
        return self._indexes[key]

    def ranking(self, dataset: EvalDataset, checkpoint: Path) -> list[dict]:
        """The retrieval pipeline's top ``retrieval_top_k`` for every question of the dataset."""
        key = (str(checkpoint), dataset.name)
        if key not in self._rankings:
            index = self.index(dataset, checkpoint)
            pipeline = self._pipeline(self.config.retrieval_pipeline,
                                      {"index": str(index.path), "retriever": str(checkpoint),
                                       "top_k": self.config.retrieval_top_k},
                                      ("index", "retriever", "top_k"), RETRIEVAL_CONCURRENCY, generators=False)
            self._rankings[key] = pipeline.run_many([{"question": r.question} for r in dataset.records],
                                                    ranking_result, progress=f"{dataset.name}/rank")
        return self._rankings[key]

    def reader(self) -> BenchPipeline:
        """The reader pipeline, asking the current reader (``llm_model``) at the current server."""
        key = f"{self.llm_model}@{self.llm_url}"
        if key not in self._readers:
            self._readers[key] = self._pipeline(self.config.reader_pipeline, {"max_tokens": self.config.max_tokens},
                                                (), self.config.concurrency)
        return self._readers[key]

    def _answered(self, dataset: EvalDataset, entry: PipelineEntry | None = None,
                  base_reader: bool = False) -> EvalDataset:
        """The questions a row answers: the dataset's first ``answered_by(entry)`` (see the module docstring)."""
        return _first(dataset, self.config.answered_by(entry, base_reader))

    # ------------------------------------------------------------------ cells
    def applies(self, dataset: EvalDataset, row) -> bool:
        """Whether ``row`` has a cell on ``dataset``: every row does but an oracle on a dataset without gold
        passages (known before any server starts, so such a row never starts vLLM)."""
        if row.pipeline is not None or row.system.name != "oracle":
            return True
        if gold_documents(dataset, self.config.rag_top_k or DEFAULT_READER_TOP_K) is None:
            logger.info("%s names no gold passages (no supporting or answer-bearing contexts): no oracle row",
                        dataset.name)
            return False
        return True

    def evaluate(self, dataset: EvalDataset, row) -> dict | None:
        """The cell of ``row`` (a runner ``Row``) on ``dataset``; None when the row does not apply (an oracle
        on a dataset without gold passages)."""
        system = row.system
        if row.pipeline is not None:
            return self._dense(dataset, system.checkpoint, row.pipeline, row.name)
        base = getattr(row, "base", False)
        if system.name == "oracle":
            return self._oracle(dataset, base)
        if system.name == "bm25":
            return self._bm25(dataset, base)
        if system.name == "closed_book":
            view = self._answered(dataset, base_reader=base)
            return self._read(view, [[] for _ in view.records], row.name)
        raise ValueError(f"unknown reader baseline {system.name!r}; valid ones are: bm25, closed_book, oracle")

    def table(self, dataset: EvalDataset, checkpoint: Path) -> str:
        """The PostgreSQL table holding the checkpoint's index of the dataset's corpus (copied once, then reused)."""
        if self.pg_url is None:
            raise RuntimeError("a pgvector pipeline needs the PostgreSQL server, which is not up yet")
        return ensure_table(self.pg_url, dataset.name, self.index(dataset, checkpoint).path)

    def _dense(self, dataset: EvalDataset, checkpoint: Path, entry: PipelineEntry, name: str) -> dict:
        view = self._answered(dataset, entry)
        ranking = self.ranking(dataset, checkpoint)
        values = {"retriever": str(checkpoint), "top_k": self.config.rag_top_k, "max_tokens": self.config.max_tokens}
        if uses_pgvector(resolve_pipeline(entry.path)):  # the index, copied into a table of its own
            extra = table_overrides(read_pipeline_dict(resolve_pipeline(entry.path)), self.table(dataset, checkpoint))
            pipeline = self._pipeline(entry.path, values, ("retriever",), self.config.concurrency, extra=extra)
            serialize_queries(pipeline.pipeline)
        else:
            pipeline = self._pipeline(entry.path, {"index": str(self.index(dataset, checkpoint).path), **values},
                                      ("index", "retriever"), self.config.concurrency)
        results = pipeline.run_many([{"question": r.question} for r in view.records], answer_result,
                                    progress=f"{dataset.name}/{name}")
        cell = self._answers(view, [r["reply"] for r in results])
        given = [[passage_id for passage_id, _ in r["documents"]] for r in results]
        ranked = [r["ids"] for r in ranking]
        if self.primary_pipeline(dataset.name) == entry.name:
            cell.update(ranking_scores(dataset, ranked), n_ranked=len(ranked))
            query_norms = np.array([r["query_raw_norm"] for r in ranking], dtype=float)
            cell.update(diagnostics(dataset, query_norms, self.index(dataset, checkpoint).document_raw_norms))
        add_budget(cell, budget_recall(view, given, ranked[: len(view.records)]))
        cell["rounds"] = float(np.mean([r.get("rounds", 1) for r in results])) if results else 1.0
        cell["top_ids"] = given
        return cell

    def _bm25(self, dataset: EvalDataset, base: bool = False) -> dict:
        ranked = bm25_rank(dataset, self.config.retrieval_top_k)
        top_k = self.config.rag_top_k or DEFAULT_READER_TOP_K
        documents = {d.id: d for d in corpus_documents(dataset)}
        view = self._answered(dataset, base_reader=base)
        given = [[documents[i] for i in ids[:top_k]] for ids in ranked[: len(view.records)]]
        cell = self._read(view, given, "bm25")
        cell.update(ranking_scores(dataset, ranked), n_ranked=len(ranked))
        add_budget(cell, budget_recall(view, [[d.id for d in docs] for docs in given], ranked))
        cell["top_ids"] = [[d.id for d in docs] for docs in given]
        return cell

    def _oracle(self, dataset: EvalDataset, base: bool = False) -> dict | None:
        """The reader given each question's gold passages. Only questions that have some are asked: the first
        ``answered_by`` of them among every loaded question (a question without gold passages would be a
        closed-book question in an oracle's row). The cell names its questions (``question_ids``), which are not
        the dataset's first ones where some lack gold passages; paired tests align on them."""
        gold = gold_documents(dataset, self.config.rag_top_k or DEFAULT_READER_TOP_K)
        if gold is None:
            return None
        limit = self.config.answered_by(None, base)
        first = len(dataset.records) if limit is None else min(limit, len(dataset.records))
        keep = [index for index, docs in enumerate(gold) if docs][:limit]
        view = replace(dataset, records=[dataset.records[index] for index in keep])
        given = [gold[index] for index in keep]
        cell = self._read(view, given, "oracle")
        cell["question_ids"] = [record.id for record in view.records]
        cell["oracle_without_gold"] = sum(1 for docs in gold[:first] if not docs)  # skipped among the first
        cell["budget"] = {"mean": float(np.mean([len(docs) for docs in given])), "max": max(len(d) for d in given)}
        return cell

    def _read(self, dataset: EvalDataset, documents: list[list], label: str) -> dict:
        inputs = [{"question": r.question, "documents": list(docs)} for r, docs in zip(dataset.records, documents,
                                                                                        strict=True)]
        results = self.reader().run_many(inputs, answer_result, progress=f"{dataset.name}/{label}")
        return self._answers(dataset, [r["reply"] for r in results])

    def _answers(self, dataset: EvalDataset, replies: list[str]) -> dict:
        cell: dict = {"n_questions": len(dataset.records)}
        cell.update(answer_scores([clean_answer(reply) for reply in replies], [list(r.answers) for r in
                                                                               dataset.records]))
        return cell


def _first(dataset: EvalDataset, limit: int | None) -> EvalDataset:
    """The dataset's first ``limit`` questions (same corpus); the dataset itself when it has no more."""
    if limit is None or limit >= len(dataset.records):
        return dataset
    return replace(dataset, records=dataset.records[:limit])


def _corpus_identity(dataset: EvalDataset) -> str:
    digest = hashlib.sha256()
    for passage in dataset.corpus:
        digest.update(f"{passage.id}\t{passage.title}\t{passage.text}\n".encode())
    return digest.hexdigest()


def _folder_identity(folder: Path) -> list:
    """A checkpoint folder by its path and its files' sizes and times (a retrained folder gets a new index)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
    return [str(folder.resolve())] + [[str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns]
                                      for p in files]
