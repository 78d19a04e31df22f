"""RagMagTextEmbedder: embeds a query with a trained rag-mag retriever checkpoint."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from haystack import component, default_from_dict, default_to_dict

from rag_mag.components.checkpoints import LoadedCheckpoint, load_checkpoint
from rag_mag.errors import DataError

logger = logging.getLogger(__name__)


@component
class RagMagTextEmbedder:
    """Computes the query-side embedding of a text under the checkpoint's similarity strategy.

    `embedding` is the *treated* query vector (normalized for cosine/qnorm, divided by the
    calibrated norm scale for dnorm/dot). `meta` says where it came from and what its raw norm was:
    `{"raw_norm", "norm", "checkpoint", "strategy"}`. Connect `meta` to
    `FAISSEmbeddingRetriever.query_meta`: the retriever then checks that the index was built with the
    same checkpoint and reports the query's raw norm with every result.

    ```python
    embedder = RagMagTextEmbedder(model="artifacts/retriever-default")
    embedder.warm_up()
    result = embedder.run("Who wrote Hamlet?")  # {"embedding": [...], "meta": {...}}
    ```
    """

    def __init__(self, model: str) -> None:
        """
        :param model: Path of a rag-mag retriever checkpoint folder (written by `rag-mag train`).
        """
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model must be the path of a retriever checkpoint folder, got {model!r}")
        self.model = model
        self._checkpoint: LoadedCheckpoint | None = None

    def warm_up(self) -> None:
        """Load the checkpoint (once; shared with other embedders of the same folder)."""
        if self._checkpoint is None:
            self._checkpoint = load_checkpoint(self.model)

    @property
    def checkpoint(self) -> LoadedCheckpoint:
        if self._checkpoint is None:
            raise RuntimeError("RagMagTextEmbedder was not warmed up; call warm_up() first")
        return self._checkpoint

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, model=self.model)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagMagTextEmbedder:
        return default_from_dict(cls, data)

    def embed(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Treated query embeddings (n, dim) and raw norms (n,) of many texts at once."""
        self.warm_up()
        encoder = self.checkpoint.encoder
        raw = encoder.encode(texts, side="query", treated=False)  # (n, dim)
        treated = encoder.query_treatment().apply(torch.from_numpy(raw)).numpy()  # (n, dim)
        return treated.astype(np.float32), np.linalg.norm(raw, axis=1)

    @component.output_types(embedding=list[float], meta=dict[str, Any])
    def run(self, text: str) -> dict[str, Any]:
        """
        Embed one query.

        :param text: The query text.
        :returns: `embedding`: the treated query vector; `meta`: its raw and treated norms, checkpoint, strategy.
        """
        if not isinstance(text, str):
            raise TypeError(f"RagMagTextEmbedder expects a string, got {type(text).__name__}; "
                            "to embed Documents use RagMagDocumentEmbedder")
        if not text.strip():
            raise DataError("the query is empty; give a non-empty question")
        treated, raw_norms = self.embed([text])
        meta = {"raw_norm": float(raw_norms[0]), "norm": float(np.linalg.norm(treated[0])),
                "checkpoint": self.checkpoint.fingerprint, "strategy": self.checkpoint.strategy}
        return {"embedding": treated[0].tolist(), "meta": meta}
