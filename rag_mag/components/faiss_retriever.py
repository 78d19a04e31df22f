"""FAISSEmbeddingRetriever: maximum inner-product search in a FAISSDocumentStore, with the score explained."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document, component, default_from_dict, default_to_dict

from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.components.score_explainer import explain_score
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)


@component
class FAISSEmbeddingRetriever:
    """Returns the `top_k` Documents with the largest inner product with the (treated) query embedding.

    Both sides were treated by their embedders, so the inner product *is* the strategy's score,
    and it factors as `score = cosine * query_norm * document_norm`. Each returned Document
    carries `score` and, in `meta`, those three parts (`cosine`, `query_norm`, `document_norm`: the
    treated norms) plus the raw pooled norms `query_raw_norm` (when `query_meta` is connected) and
    `document_raw_norm`. The query norm scales every score of a query alike; the document norm is
    what lets magnitude change the ranking.

    Connect `RagMagTextEmbedder.meta` to `query_meta`: the retriever then refuses a query embedded
    with another checkpoint than the one the index was built with.

    With `merge_duplicates` (the default), chunks of files (Documents with a `file` in their meta) of the same
    text (`duplicate_key`: lowercased, punctuation and spacing ignored) are one result: the best-scoring copy,
    whose `meta["also_in"]` lists the other copies' `file`, `page` and `id`, so an answer from it cites every file
    that says it. Real folders repeat whole
    paragraphs: 16% of the chunks of twenty 10-Q filings repeat another filing's (legal text kept quarter after
    quarter), 17% of a documentation set's repeat its own pages (eval/duplicate_chunks.py). Each copy stays in
    the index, owned by its file, so that editing or deleting one file changes only its own chunks.

    With `hybrid` (`auto`: for an index of files; `on`; `off`) and the question's text connected to `query`, the
    ranking fuses the dense hits with BM25 over the same Documents (their title, heading and text,
    `FAISSDocumentStore.keyword_hits`) by reciprocal rank: each of the first `FUSION_CANDIDATES` of both lists (more
    where `top_k` asks for more) scores 1 / (`RRF_K` + rank). A third list ranks the files: BM25 over each file as a
    whole (`FAISSDocumentStore.file_keyword_scores`), where each candidate of a file found scores 1 / (`RRF_K` + its
    file's rank), because what a file is about is often said once in it ("Apple Inc." on a filing's cover) and not
    in each chunk. Fusion only orders: every result keeps the strategy's own `score` (computed for a keyword-only
    hit from its stored vector), so the answer builder's `min_score` and the score's parts mean what they mean
    without it; `meta["fused_score"]`, `meta["keyword_rank"]` and `meta["file_rank"]` (1-based, absent where that
    list did not rank it) say how it ranked. On the real documents' validation split, dense and keyword fusion raised
    the cosine retriever's mean file@5 from 90.4 to 95.7 and the qnorm retriever's from 87.2 to 91.6; the files'
    list took them to 96.0 and 91.9 and raised file@1 on three collections of four (eval/README.md, "Real
    documents"). `auto` leaves a corpus of passages (no `file` in their meta, the Wikipedia benchmark) to dense
    search alone.
    """

    def __init__(self, document_store: FAISSDocumentStore, top_k: int = 10, return_embedding: bool = False,
                 merge_duplicates: bool = True, hybrid: str = "auto") -> None:
        """
        :param document_store: The FAISSDocumentStore to search.
        :param top_k: Number of Documents to return.
        :param return_embedding: Whether returned Documents carry their embedding.
        :param merge_duplicates: Return each text once, citing its other copies in `meta["also_in"]`.
        :param hybrid: `auto` (fuse keyword search where the Documents are chunks of files), `on` or `off`; it
            needs the question's text on the `query` input.
        """
        if not isinstance(document_store, FAISSDocumentStore):
            raise ValueError(f"document_store must be a FAISSDocumentStore, got {type(document_store).__name__}")
        if not isinstance(merge_duplicates, bool):
            raise ValueError(f"merge_duplicates must be true or false, got {merge_duplicates!r}")
        if isinstance(hybrid, bool):  # YAML reads a bare on / off as a boolean
            hybrid = "on" if hybrid else "off"
        if hybrid not in HYBRID_MODES:
            raise ValueError(f"hybrid must be one of {', '.join(HYBRID_MODES)}, got {hybrid!r}")
        _check_top_k(top_k)
        self.document_store = document_store
        self.top_k = top_k
        self.return_embedding = return_embedding
        self.merge_duplicates = merge_duplicates
        self.hybrid = hybrid

    def warm_up(self) -> None:
        """Load the index (once); fails clearly when the configured index folder does not exist."""
        store = self.document_store
        if store.path and not store.exists() and store.count_documents() == 0:
            raise CheckpointError(f"no index at {store.path}; build one with "
                                  f"`rag-mag index --retriever DIR --corpus FILE --out {store.path}`")
        store.count_documents()

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, document_store=self.document_store.to_dict(), top_k=self.top_k,
                               return_embedding=self.return_embedding, merge_duplicates=self.merge_duplicates,
                               hybrid=self.hybrid)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FAISSEmbeddingRetriever:
        init_parameters = dict(data.get("init_parameters") or {})  # the caller's dict stays as it was
        store = init_parameters.get("document_store")
        if isinstance(store, dict):
            expected = f"{FAISSDocumentStore.__module__}.{FAISSDocumentStore.__name__}"
            if store.get("type") != expected:
                raise ValueError(f"FAISSEmbeddingRetriever needs a document_store of type {expected}, "
                                 f"got {store.get('type')!r}")
            init_parameters["document_store"] = FAISSDocumentStore.from_dict(store)
        return default_from_dict(cls, {**data, "init_parameters": init_parameters})

    @component.output_types(documents=list[Document])
    def run(self, query_embedding: list[float], top_k: int | None = None, filters: dict[str, Any] | None = None,
            query_meta: dict[str, Any] | None = None, query: str | None = None) -> dict[str, list[Document]]:
        """
        Retrieve documents.

        :param query_embedding: The treated query embedding (from RagMagTextEmbedder).
        :param top_k: Overrides the constructor's `top_k`.
        :param filters: Haystack filters on the Documents' meta (e.g. `{"field": "meta.file", "operator":
            "in", "value": [...]}`): only matching Documents are ranked, exactly.
        :param query_meta: `RagMagTextEmbedder`'s `meta` (raw norm, checkpoint fingerprint).
        :param query: The question's text, for the keyword half of `hybrid` search (without it: dense only).
        :returns: `documents`: best first, with `score` and the score's parts in `meta`.
        """
        top_k = _check_top_k(self.top_k if top_k is None else top_k)
        self.warm_up()
        self._check_checkpoint(query_meta or {})
        from haystack.errors import FilterError

        try:
            results = self.search_batch(np.asarray([query_embedding], dtype=np.float32), top_k, query_meta, filters,
                                        None if query is None else [query])
        except FilterError as error:
            raise ConfigError(f"bad filters {filters!r}: {error}; see Haystack's metadata filtering, e.g. "
                              '{"field": "meta.file", "operator": "==", "value": "notes.pdf"}') from None
        return {"documents": results[0]}

    def search_batch(self, query_embeddings: np.ndarray, top_k: int | None = None,
                     query_meta: dict[str, Any] | None = None,
                     filters: dict[str, Any] | None = None,
                     texts: list[str] | None = None) -> list[list[Document]]:
        """Retrieve for many queries at once: query_embeddings (m, dim) -> m lists of Documents; ``texts``, the
        queries' text, for the keyword half of ``hybrid`` search."""
        top_k = _check_top_k(self.top_k if top_k is None else top_k)
        queries = np.asarray(query_embeddings, dtype=np.float32)
        if texts is not None and len(texts) != len(queries):
            raise ValueError(f"{len(texts)} query texts for {len(queries)} query embeddings")
        query_norms = np.linalg.norm(queries, axis=1)  # (m,)
        query_raw_norm = (query_meta or {}).get("raw_norm")
        # documents and vectors from the state the ranking used (the demo may reload the index meanwhile)
        fetch = top_k * DUPLICATES_OVERFETCH if self.merge_duplicates else top_k
        hybrid = texts is not None and self.hybrid != "off"
        if hybrid:
            fetch = max(fetch, FUSION_CANDIDATES)  # each list's candidates for the fusion
        hits = self.document_store.hits(queries, fetch, filters)
        if hybrid:
            hits = [self._fused(query, query_hits, text, filters, fetch) if self._fuses(query_hits) else query_hits
                    for query, query_hits, text in zip(queries, hits, texts, strict=True)]
        results = []
        for query_norm, query_hits in zip(query_norms, hits, strict=True):
            if self.merge_duplicates:
                query_hits = merged_duplicates(query_hits)
            results.append([explain_score(document, embedding, score, float(query_norm), query_raw_norm,
                                          keep_embedding=self.return_embedding)
                            for score, document, embedding in query_hits[:top_k]])
        return results

    def _fuses(self, dense_hits: list[tuple[float, Document, Any]]) -> bool:
        """Whether keyword search joins this ranking: `on`, or `auto` over chunks of files."""
        return self.hybrid == "on" or any((document.meta or {}).get("file") for _, document, _ in dense_hits[:1])

    def _fused(self, query: np.ndarray, dense_hits: list[tuple[float, Document, Any]], text: str,
               filters: dict[str, Any] | None, candidates: int) -> list[tuple[float, Document, Any]]:
        """The dense and keyword hits of one query (``candidates`` of each) in reciprocal-rank order, each with its
        dense score."""
        keyword_hits = self.document_store.keyword_hits([text], candidates, filters)[0]
        fused: dict[str, float] = {}
        found: dict[str, tuple[Document, Any]] = {}
        keyword_rank: dict[str, int] = {}
        for hits, ranks in ((dense_hits, None), (keyword_hits, keyword_rank)):
            for rank, (_, document, embedding) in enumerate(hits):
                fused[document.id] = fused.get(document.id, 0.0) + 1.0 / (RRF_K + rank + 1)
                found.setdefault(document.id, (document, embedding))
                if ranks is not None:
                    ranks[document.id] = rank + 1
        order = sorted(fused, key=lambda doc_id: -fused[doc_id])  # stable: dense order among equals
        file_rank = self._file_ranks(text, [found[doc_id][0] for doc_id in order])
        for doc_id, rank in file_rank.items():
            fused[doc_id] += 1.0 / (RRF_K + rank)
        order = sorted(order, key=lambda doc_id: -fused[doc_id])
        results = []
        for doc_id in order:
            document, embedding = found[doc_id]
            meta = {**(document.meta or {}), "fused_score": fused[doc_id]}
            if doc_id in keyword_rank:
                meta["keyword_rank"] = keyword_rank[doc_id]
            if doc_id in file_rank:
                meta["file_rank"] = file_rank[doc_id]
            results.append((float(np.dot(query, embedding)), replace(document, meta=meta), embedding))
        return results

    def _file_ranks(self, text: str, candidates: list[Document]) -> dict[str, int]:
        """The third list of the fusion, files: ``{document id: rank}``, each candidate with the rank (1-based) of
        its file among the candidates' files that BM25 over whole files (``FAISSDocumentStore.file_keyword_scores``)
        finds. Every chunk of a file gets its file's share, so the file a question is about lifts its chunks in
        their own order. (Lifting only each file's best chunk spread the top 5 over more files, but cost the SQLite
        manual's answers 7.9 points and raised hubness on the real documents' validation split.)"""
        scores = self.document_store.file_keyword_scores(text)
        files = [(document.id, (document.meta or {}).get("file")) for document in candidates]
        found = list(dict.fromkeys(file for _, file in files if file in scores))  # candidate order
        rank = {file: number for number, file in enumerate(sorted(found, key=lambda file: -scores[file]), start=1)}
        return {doc_id: rank[file] for doc_id, file in files if file in rank}

    def _check_checkpoint(self, query_meta: dict[str, Any]) -> None:
        indexed = self.document_store.manifest.get("checkpoint")
        queried = query_meta.get("checkpoint")
        if indexed and queried and indexed != queried:
            raise CheckpointError(
                f"the index {self.document_store.path or '(in memory)'} was built with retriever checkpoint "
                f"{indexed} (strategy {self.document_store.manifest.get('strategy')}), but the query was embedded "
                f"with checkpoint {queried} (strategy {query_meta.get('strategy')}); use the same retriever for "
                "both, or re-index the corpus with this one")


HYBRID_MODES = ("auto", "on", "off")
RRF_K = 60  # reciprocal rank fusion's constant (Cormack et al., 2009)
FUSION_CANDIDATES = 50  # hits of each list that fusion reads
DUPLICATES_OVERFETCH = 4  # with merge_duplicates, hits searched per result asked (copies fill the rest)
_NOT_WORD = re.compile(r"\W+")


def duplicate_key(text: str | None) -> str:
    """The form in which two Documents' texts are the same text: lowercased, runs of anything but letters and
    digits one space."""
    return _NOT_WORD.sub(" ", (text or "").lower()).strip()


def merged_duplicates(hits: list[tuple[float, Document, Any]]) -> list[tuple[float, Document, Any]]:
    """``hits`` (best first) with each file chunk's text once: its best copy, its other copies cited in
    ``meta["also_in"]``. Passages of a corpus (no ``file`` in their meta) are never merged: a benchmark judges them
    by id."""
    best: dict[str, int] = {}
    kept: list[tuple[float, Document, Any]] = []
    copies: list[list[dict[str, Any]]] = []
    for score, document, embedding in hits:
        meta = document.meta or {}
        key = duplicate_key(document.content) if meta.get("file") else ""  # a corpus passage is its own
        if key and key in best:
            copies[best[key]].append({"id": document.id, "file": meta.get("file"), "page": meta.get("page")})
            continue
        if key:
            best[key] = len(kept)
        kept.append((score, document, embedding))
        copies.append([])
    return [(score, replace(document, meta={**(document.meta or {}), "also_in": cited}) if cited else document,
             embedding) for (score, document, embedding), cited in zip(kept, copies, strict=True)]


def _check_top_k(top_k: Any) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k
