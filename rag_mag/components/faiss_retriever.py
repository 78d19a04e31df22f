"""FAISSEmbeddingRetriever: maximum inner-product search in a FAISSDocumentStore, with the score explained."""

from __future__ import annotations

import logging
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
    """

    def __init__(self, document_store: FAISSDocumentStore, top_k: int = 10, return_embedding: bool = False) -> None:
        """
        :param document_store: The FAISSDocumentStore to search.
        :param top_k: Number of Documents to return.
        :param return_embedding: Whether returned Documents carry their embedding.
        """
        if not isinstance(document_store, FAISSDocumentStore):
            raise ValueError(f"document_store must be a FAISSDocumentStore, got {type(document_store).__name__}")
        _check_top_k(top_k)
        self.document_store = document_store
        self.top_k = top_k
        self.return_embedding = return_embedding

    def warm_up(self) -> None:
        """Load the index (once); fails clearly when the configured index folder does not exist."""
        store = self.document_store
        if store.path and not store.exists() and store.count_documents() == 0:
            raise CheckpointError(f"no index at {store.path}; build one with "
                                  f"`rag-mag index --retriever DIR --corpus FILE --out {store.path}`")
        store.count_documents()

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, document_store=self.document_store.to_dict(), top_k=self.top_k,
                               return_embedding=self.return_embedding)

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
            query_meta: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        """
        Retrieve documents.

        :param query_embedding: The treated query embedding (from RagMagTextEmbedder).
        :param top_k: Overrides the constructor's `top_k`.
        :param filters: Haystack filters on the Documents' meta (e.g. `{"field": "meta.file", "operator":
            "in", "value": [...]}`): only matching Documents are ranked, exactly.
        :param query_meta: `RagMagTextEmbedder`'s `meta` (raw norm, checkpoint fingerprint).
        :returns: `documents`: best first, with `score` and the score's parts in `meta`.
        """
        top_k = _check_top_k(self.top_k if top_k is None else top_k)
        self.warm_up()
        self._check_checkpoint(query_meta or {})
        from haystack.errors import FilterError

        try:
            results = self.search_batch(np.asarray([query_embedding], dtype=np.float32), top_k, query_meta, filters)
        except FilterError as error:
            raise ConfigError(f"bad filters {filters!r}: {error}; see Haystack's metadata filtering, e.g. "
                              '{"field": "meta.file", "operator": "==", "value": "notes.pdf"}') from None
        return {"documents": results[0]}

    def search_batch(self, query_embeddings: np.ndarray, top_k: int | None = None,
                     query_meta: dict[str, Any] | None = None,
                     filters: dict[str, Any] | None = None) -> list[list[Document]]:
        """Retrieve for many queries at once: query_embeddings (m, dim) -> m lists of Documents."""
        top_k = _check_top_k(self.top_k if top_k is None else top_k)
        queries = np.asarray(query_embeddings, dtype=np.float32)
        query_norms = np.linalg.norm(queries, axis=1)  # (m,)
        query_raw_norm = (query_meta or {}).get("raw_norm")
        # documents and vectors from the state the ranking used (the demo may reload the index meanwhile)
        return [[explain_score(document, embedding, score, float(query_norm), query_raw_norm,
                               keep_embedding=self.return_embedding) for score, document, embedding in query_hits]
                for query_norm, query_hits in zip(query_norms, self.document_store.hits(queries, top_k, filters),
                                                  strict=True)]

    def _check_checkpoint(self, query_meta: dict[str, Any]) -> None:
        indexed = self.document_store.manifest.get("checkpoint")
        queried = query_meta.get("checkpoint")
        if indexed and queried and indexed != queried:
            raise CheckpointError(
                f"the index {self.document_store.path or '(in memory)'} was built with retriever checkpoint "
                f"{indexed} (strategy {self.document_store.manifest.get('strategy')}), but the query was embedded "
                f"with checkpoint {queried} (strategy {query_meta.get('strategy')}); use the same retriever for "
                "both, or re-index the corpus with this one")


def _check_top_k(top_k: Any) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    return top_k
