"""The systems of the real-documents benchmark: each indexes a folder of files and ranks its chunks for a question.

* ``RagMagSystem``: rag-mag as a user runs it. The folder goes through ``pipelines/index_files.yaml`` by
  ``index_files`` (the same code as ``rag-mag index FOLDER``), with a retriever checkpoint and any overrides of
  the pipeline's short parameters (``min_words`` for today's chunking against the old one, for example); questions
  are ranked through ``pipelines/retrieve.yaml``.
* ``HaystackStockSystem``: Haystack's own pipeline as its documentation builds it, for comparison: the same
  converters (the router and converters of index_files.yaml, so both read the same text), Haystack's
  ``DocumentCleaner`` and ``DocumentSplitter`` (100 words, 20 overlap), ``SentenceTransformersDocumentEmbedder``
  with the packaged MiniLM (Normalize kept: cosine), an ``InMemoryDocumentStore``, and either
  ``InMemoryEmbeddingRetriever`` (``mode="embedding"``) or ``InMemoryBM25Retriever`` (``mode="bm25"``).

Both give chunks as ``Chunk`` (id, file, pages, words, raw norm where there is one) and rankings as chunk ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_mag.errors import ConfigError

logger = logging.getLogger(__name__)

# overrides of a rag-mag system that set how it ranks (pipelines/retrieve.yaml), not how it indexes
RANK_PARAMETERS = ("hybrid",)


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A rag-mag system's overrides as (how it indexes: index_files.yaml's, how it ranks: ``RANK_PARAMETERS``)."""
    ranking = {key: value for key, value in overrides.items() if key in RANK_PARAMETERS}
    return {key: value for key, value in overrides.items() if key not in ranking}, ranking


STOCK_SPLIT_LENGTH = 100
STOCK_SPLIT_OVERLAP = 20
CONVERTERS = ("router", "text", "markdown", "html", "pdf", "docx", "joiner")


@dataclass(frozen=True)
class Chunk:
    id: str
    file: str
    page: int | None
    page_end: int | None
    words: int
    raw_norm: float | None
    text: str
    copies: tuple[str, ...] = ()  # the other files that hold the same text (cited with it when the retriever merges)


def chunk_of(document) -> Chunk:
    from rag_mag.components.document_embedder import RAW_NORM_KEY

    meta = document.meta or {}
    page = meta.get("page", meta.get("page_number"))  # rag-mag's splitter, or Haystack's
    return Chunk(id=document.id, file=str(meta.get("file")), page=page, page_end=meta.get("page_end", page),
                 words=len((document.content or "").split()), raw_norm=meta.get(RAW_NORM_KEY),
                 text=document.content or "")


def with_copies(chunks: list[Chunk]) -> list[Chunk]:
    """``chunks`` with, on each, the other files that hold the same text (``duplicate_key``)."""
    from dataclasses import replace

    from rag_mag.components.faiss_retriever import duplicate_key

    files: dict[str, set[str]] = {}
    for chunk in chunks:
        files.setdefault(duplicate_key(chunk.text), set()).add(chunk.file)
    return [replace(chunk, copies=tuple(sorted(files[duplicate_key(chunk.text)] - {chunk.file}))) for chunk in chunks]


@dataclass
class RagMagSystem:
    """rag-mag's files pipeline with ``retriever`` and ``overrides`` of index_files.yaml's parameters."""

    name: str
    retriever: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    pipeline: Any = None
    store: Any = None
    index_dir: Path | None = None

    def index(self, folder: Path, out: Path) -> None:
        from rag_mag.components.faiss_document_store import FAISSDocumentStore
        from rag_mag.ingestion.file_indexing import index_files

        indexing, _ = split_overrides(self.overrides)
        summary = index_files([str(folder)], out, self.retriever, overrides=indexing, progress=True)
        if summary.plan.skipped:
            logger.warning("%s: %d files skipped: %s", self.name, len(summary.plan.skipped), summary.plan.skipped[:3])
        self.store = FAISSDocumentStore(path=str(out))
        self.pipeline, self.index_dir = None, out

    def chunks(self) -> list[Chunk]:
        """Every chunk, with the other files that hold its text: the retriever merges such copies into one result
        that cites them all (``FAISSEmbeddingRetriever.merge_duplicates``)."""
        return with_copies([chunk_of(document) for document in self.store.filter_documents()])

    def rank(self, questions: list[str], top_k: int) -> list[list[str]]:
        from rag_mag.serving.pipelines import default_pipeline, load_pipeline, question_inputs

        if self.pipeline is None or self.pipeline.get_component("retriever").top_k < top_k:
            _, ranking = split_overrides(self.overrides)
            self.pipeline = load_pipeline(default_pipeline("retrieve"), {
                "index": str(self.index_dir), "retriever": str(self.retriever), "top_k": top_k, **ranking})
            self.pipeline.warm_up()
        rankings = []
        for question in questions:
            result = self.pipeline.run(question_inputs(self.pipeline, question))
            rankings.append([document.id for document in result["retriever"]["documents"]][:top_k])
        return rankings


@dataclass
class HaystackStockSystem:
    """Haystack's stock pipeline: its splitter, the packaged MiniLM through sentence-transformers, cosine (or BM25)."""

    name: str
    mode: str = "embedding"
    model: str | None = None
    store: Any = None
    _query_embedder: Any = None

    def __post_init__(self) -> None:
        if self.mode not in ("embedding", "bm25"):
            raise ConfigError(f"HaystackStockSystem mode must be 'embedding' or 'bm25', got {self.mode!r}")

    def _converters(self):
        """index_files.yaml's router and converters, built from the YAML itself."""
        from haystack import Pipeline

        from rag_mag.serving.pipelines import build_pipeline, default_pipeline, read_pipeline_dict

        data = read_pipeline_dict(default_pipeline("index_files"))
        components = {name: spec for name, spec in data["components"].items() if name in CONVERTERS}
        connections = [c for c in data["connections"] if c["sender"].split(".")[0] in CONVERTERS
                       and c["receiver"].split(".")[0] in CONVERTERS]
        built: Pipeline = build_pipeline({**data, "components": components, "connections": connections},
                                         source="index_files.yaml converters")
        return built

    def index(self, folder: Path, out: Path) -> None:
        """Convert, split and embed the folder; kept in ``out/store.json`` (Haystack's own format) for as long as
        the folder's files are the same, so another split of the same collection does not embed it again."""
        from haystack.document_stores.in_memory import InMemoryDocumentStore

        from rag_mag import durable
        from rag_mag.ingestion.files import find_files, read_file
        from rag_mag.models import default_retriever_base

        scan = find_files([str(folder)])
        streams = [stream for stream, _ in (read_file(found, 50_000_000) for found in scan.files) if stream]
        self.model = self.model or default_retriever_base()
        digest = hashlib.sha256(json.dumps([self.mode, self.model, STOCK_SPLIT_LENGTH, STOCK_SPLIT_OVERLAP] + sorted(
            (s.meta["file"], s.meta["file_sha256"]) for s in streams)).encode()).hexdigest()
        kept = out / "store.json"
        if kept.is_file() and (out / "digest").is_file() and (out / "digest").read_text() == digest:
            self.store = InMemoryDocumentStore.load_from_disk(str(kept))
            return
        self.store = InMemoryDocumentStore(embedding_similarity_function="cosine")
        self.store.write_documents(self._chunks(streams))
        out.mkdir(parents=True, exist_ok=True)
        staged = out / "store.json.partial"
        self.store.save_to_disk(str(staged))
        os.replace(staged, kept)
        durable.write_text(out / "digest", digest)

    def _chunks(self, streams: list) -> list:
        from haystack.components.preprocessors import DocumentCleaner, DocumentSplitter

        from rag_mag.ingestion.files import pdf_limits

        with pdf_limits():  # as rag-mag's indexing reads them
            converted = self._converters().run({"router": {"sources": streams}})["joiner"]["documents"]
        cleaned = DocumentCleaner().run(converted)["documents"]
        chunks = DocumentSplitter(split_by="word", split_length=STOCK_SPLIT_LENGTH,
                                  split_overlap=STOCK_SPLIT_OVERLAP).run(cleaned)["documents"]
        if self.mode == "embedding":
            from haystack_integrations.components.embedders.sentence_transformers import (
                SentenceTransformersDocumentEmbedder,
            )

            embedder = SentenceTransformersDocumentEmbedder(model=self.model, progress_bar=True, batch_size=64)
            embedder.warm_up()
            chunks = embedder.run(chunks)["documents"]
        return chunks

    def chunks(self) -> list[Chunk]:
        return [chunk_of(document) for document in self.store.filter_documents()]

    def rank(self, questions: list[str], top_k: int) -> list[list[str]]:
        from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever

        if self.mode == "bm25":
            retriever = InMemoryBM25Retriever(self.store, top_k=top_k)
            return [[d.id for d in retriever.run(query=q)["documents"]] for q in questions]
        from haystack_integrations.components.embedders.sentence_transformers import SentenceTransformersTextEmbedder

        if self._query_embedder is None:
            self._query_embedder = SentenceTransformersTextEmbedder(model=self.model, progress_bar=False)
            self._query_embedder.warm_up()
        retriever = InMemoryEmbeddingRetriever(self.store, top_k=top_k)
        return [[d.id for d in retriever.run(query_embedding=self._query_embedder.run(q)["embedding"])["documents"]]
                for q in questions]
