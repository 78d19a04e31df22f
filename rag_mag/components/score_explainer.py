"""ScoreExplainer: splits the inner-product score of retrieved Documents into cosine x query norm x document norm.

FAISSEmbeddingRetriever does this itself. A retriever of another engine (a vector database searched by
dot product, e.g. ``QdrantEmbeddingRetriever`` with ``return_embedding: true``) returns only the score
and the stored vector; this component adds the same parts, so answer reports read alike whichever
engine ranked the passages.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from haystack import Document, component, default_from_dict, default_to_dict

from rag_mag.components.document_embedder import CHECKPOINT_KEY, RAW_NORM_KEY, STRATEGY_KEY
from rag_mag.errors import CheckpointError, DataError

_TINY = 1e-12


def explain_score(document: Document, embedding: np.ndarray, score: float, query_norm: float,
                  query_raw_norm: float | None = None, keep_embedding: bool = False) -> Document:
    """A copy of ``document`` with ``score`` and its parts in ``meta``.

    ``meta`` gains ``cosine = score / (query_norm * document_norm)``, ``query_norm`` and ``document_norm``
    (treated norms), ``document_raw_norm`` (moved from ``embedding_raw_norm``) and, when given,
    ``query_raw_norm``. The provenance keys of RagMagDocumentEmbedder are dropped (an index keeps them once).
    """
    document_norm = float(np.linalg.norm(embedding))
    meta = {k: v for k, v in (document.meta or {}).items() if k not in (CHECKPOINT_KEY, STRATEGY_KEY)}
    meta.update(cosine=score / max(query_norm * document_norm, _TINY), query_norm=query_norm,
                document_norm=document_norm, document_raw_norm=meta.pop(RAW_NORM_KEY, None))
    if query_raw_norm is not None:
        meta["query_raw_norm"] = float(query_raw_norm)
    return replace(document, score=score, meta=meta,
                   embedding=np.asarray(embedding, dtype=np.float32).tolist() if keep_embedding else None)


@component
class ScoreExplainer:
    """Adds the parts of each retrieved Document's inner-product score to its ``meta``.

    Place it after a retriever that ranks by raw inner product and returns embeddings; connect the
    retriever's ``documents``, and ``RagMagTextEmbedder``'s ``embedding`` and ``meta``. The order and
    scores are kept. A Document embedded with another checkpoint than the query (its
    ``embedding_checkpoint`` meta) is refused, as FAISSEmbeddingRetriever refuses such an index.

    ```python
    explainer = ScoreExplainer()
    documents = explainer.run(documents=retrieved, query_embedding=embedding, query_meta=meta)["documents"]
    documents[0].meta["cosine"], documents[0].meta["document_norm"]
    ```
    """

    def __init__(self, return_embedding: bool = False) -> None:
        """
        :param return_embedding: Whether the returned Documents keep their embedding.
        """
        if not isinstance(return_embedding, bool):
            raise ValueError(f"return_embedding must be true or false, got {return_embedding!r}")
        self.return_embedding = return_embedding

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, return_embedding=self.return_embedding)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScoreExplainer:
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document], query_embedding: list[float],
            query_meta: dict[str, Any] | None = None) -> dict[str, list[Document]]:
        """
        Explain scores.

        :param documents: Retrieved Documents, each with `score` and `embedding`.
        :param query_embedding: The treated query embedding the documents were retrieved with.
        :param query_meta: `RagMagTextEmbedder`'s `meta` (raw norm, checkpoint fingerprint).
        :returns: `documents`: the same Documents, in the same order, with the score's parts in `meta`.
        """
        query_meta = query_meta or {}
        query_norm = float(np.linalg.norm(np.asarray(query_embedding, dtype=np.float32)))
        explained = []
        for document in documents:
            if document.embedding is None or document.score is None:
                raise DataError(f"retrieved document {document.id!r} has no embedding or no score; set "
                                "return_embedding: true on the retriever before the ScoreExplainer")
            _check_checkpoint(document, query_meta)
            explained.append(explain_score(document, np.asarray(document.embedding, dtype=np.float32),
                                           float(document.score), query_norm, query_meta.get("raw_norm"),
                                           self.return_embedding))
        return {"documents": explained}


def _check_checkpoint(document: Document, query_meta: dict[str, Any]) -> None:
    indexed = (document.meta or {}).get(CHECKPOINT_KEY)
    queried = query_meta.get("checkpoint")
    if indexed and queried and indexed != queried:
        raise CheckpointError(
            f"document {document.id!r} was embedded with retriever checkpoint {indexed} (strategy "
            f"{(document.meta or {}).get(STRATEGY_KEY)}), but the query with checkpoint {queried} (strategy "
            f"{query_meta.get('strategy')}); use the same retriever for both, or re-index the corpus with this one")
