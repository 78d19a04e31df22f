"""Copy a rag-mag FAISS index folder into a vector database that ranks by raw inner product (Qdrant).

The embedders already applied each strategy's treatment to the stored vectors, so the database must
score by plain dot product: a cosine collection would normalize the document vectors on upsert and
erase the document norm that dot, qnorm and learnable rank by. ``export_index`` refuses such a store.

```python
store = qdrant_store(path="artifacts/qdrant-default", embedding_dim=384)
export_index("artifacts/index-default", store)
```
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from haystack.document_stores.types import DuplicatePolicy

from rag_mag.components.document_embedder import CHECKPOINT_KEY, STRATEGY_KEY
from rag_mag.components.faiss_document_store import FAISSDocumentStore
from rag_mag.errors import CheckpointError, ConfigError

logger = logging.getLogger(__name__)

DOT_PRODUCT = "dot_product"
# Attributes under which Haystack document stores name their similarity: Qdrant, and the in-memory store.
_SIMILARITY_ATTRIBUTES = ("similarity", "embedding_similarity_function")
INSTALL_HINT = "pip install 'rag-mag[vectordb]' (or: pip install qdrant-haystack)"


def qdrant_store(embedding_dim: int, path: str | None = None, url: str | None = None, index: str = "Document",
                 recreate: bool = False, **kwargs: Any):
    """A ``QdrantDocumentStore`` that scores by dot product: local (``path``, or in memory when both are None)
    or on a Qdrant server (``url``). Nothing is opened until the store is first used."""
    if path and url:
        raise ConfigError("give a Qdrant path (embedded, local folder) or a url (server), not both")
    try:
        from haystack_integrations.document_stores.qdrant import QdrantDocumentStore
    except ImportError:
        raise ConfigError(f"qdrant-haystack is not installed; run {INSTALL_HINT}") from None
    location = None if (path or url) else ":memory:"
    return QdrantDocumentStore(location=location, path=path, url=url, index=index, embedding_dim=embedding_dim,
                               similarity=DOT_PRODUCT, recreate_index=recreate, **kwargs)


def similarity_of(document_store: Any) -> str | None:
    """The similarity a document store was configured with, when it names one."""
    for attribute in _SIMILARITY_ATTRIBUTES:
        value = getattr(document_store, attribute, None)
        if isinstance(value, str):
            return value
    return None


def export_index(index_dir: str | Path, document_store: Any, policy: DuplicatePolicy = DuplicatePolicy.OVERWRITE
                 ) -> int:
    """Write every Document of the FAISS index at ``index_dir``, with its stored vector, to ``document_store``.

    Each Document gets back the checkpoint fingerprint and strategy of the index manifest in its ``meta``
    (``embedding_checkpoint``, ``embedding_strategy``), so that ``ScoreExplainer`` can refuse queries
    embedded with another retriever. Returns the number of Documents written.
    """
    source = FAISSDocumentStore(path=str(index_dir))
    if not source.exists():
        raise CheckpointError(f"no index at {index_dir}; build one with `rag-mag index --out {index_dir}`")
    similarity = similarity_of(document_store)
    if similarity is not None and similarity != DOT_PRODUCT:
        raise ConfigError(f"the target store ranks by {similarity!r}; rag-mag vectors are already treated per "
                          f"strategy and must be ranked by raw inner product: configure it with similarity "
                          f"{DOT_PRODUCT!r} (a cosine store would normalize away the document norms)")
    manifest = source.manifest
    expected_dim = getattr(document_store, "embedding_dim", None)
    if isinstance(expected_dim, int) and manifest["dim"] is not None and expected_dim != manifest["dim"]:
        raise ConfigError(f"the index {index_dir} holds {manifest['dim']}-dimensional vectors, the target store "
                          f"is configured for embedding_dim={expected_dim}")
    provenance = {CHECKPOINT_KEY: manifest.get("checkpoint"), STRATEGY_KEY: manifest.get("strategy")}
    documents = [replace(d, meta={**(d.meta or {}), **provenance}) for d in source.filter_documents()]
    written = document_store.write_documents(documents, policy=policy) if documents else 0
    logger.info("exported %d documents from %s (strategy %s)", len(documents), index_dir, manifest.get("strategy"))
    return written
