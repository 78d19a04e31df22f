"""RagMagDocumentEmbedder: embeds Documents with a trained rag-mag retriever checkpoint."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from haystack import Document, component, default_from_dict, default_to_dict

from rag_mag.components.checkpoints import LoadedCheckpoint, load_checkpoint
from rag_mag.errors import DataError
from rag_mag.precision import parse_precision, use_bf16

logger = logging.getLogger(__name__)

# Meta keys this embedder writes on every Document (the store and the retriever read them).
RAW_NORM_KEY = "embedding_raw_norm"
CHECKPOINT_KEY = "embedding_checkpoint"
STRATEGY_KEY = "embedding_strategy"
LENGTH_FACTOR_KEY = "embedding_length_factor"
_LENGTH_FITS: dict[str, Any] = {}  # checkpoint fingerprint -> LengthFit, fitted once per process


def document_text(document: Document, title_key: str = "title") -> str:
    """What the encoder reads for a Document: ``title + "\\n" + content`` (as ``rag_mag.data.Passage.content``)."""
    title = (document.meta or {}).get(title_key) or ""
    content = document.content or ""
    return f"{title}\n{content}" if title else content


@component
class RagMagDocumentEmbedder:
    """Computes the document-side embedding of each Document under the checkpoint's similarity strategy.

    The embedding stored on the Document is *treated* (normalized for cosine/dnorm, divided by the
    calibrated norm scale for qnorm/dot, ``x / ||x||**g`` for learnable), so an inner product with a
    treated query embedding is the strategy's score. The raw pooled norm, the checkpoint fingerprint
    and the strategy are recorded in ``meta`` (``embedding_raw_norm``, ``embedding_checkpoint``,
    ``embedding_strategy``); the input Documents are not modified.

    ```python
    embedder = RagMagDocumentEmbedder(model="artifacts/retriever-default")
    embedder.warm_up()
    documents = embedder.run([Document(content="Paris is the capital of France.", meta={"title": "Paris"})])
    ```
    """

    def __init__(self, model: str, batch_size: int = 32, progress_bar: bool = True, title_key: str = "title",
                 precision: str = "auto", length_calibration: bool = False) -> None:
        """
        :param model: Path of a rag-mag retriever checkpoint folder (written by `rag-mag train`).
        :param batch_size: Number of documents encoded at once.
        :param progress_bar: Show a progress bar while embedding.
        :param title_key: Meta key of the title that is prepended to the content.
        :param precision: `auto`, `bf16` or `fp32`. `auto` encodes under bfloat16 autocast only where the
            hardware computes it natively (about 2.8x faster on a CPU with avx512_bf16; embeddings agree with
            fp32 to about 1e-4 in cosine), and in fp32 elsewhere, where emulated bf16 is slower.
        :param length_calibration: Take the part of the document norm that text length alone explains out of
            each vector (rag_mag/retriever/length.py), fitted once per checkpoint on crops of the bundled sample
            passages. Only where the document side keeps its magnitude (qnorm, dot, learnable); the factor is
            recorded in `meta["embedding_length_factor"]`.
        """
        if not isinstance(length_calibration, bool):
            raise ValueError(f"length_calibration must be true or false, got {length_calibration!r}")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"model must be the path of a retriever checkpoint folder, got {model!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.model = model
        self.batch_size = batch_size
        self.progress_bar = progress_bar
        self.title_key = title_key
        self.precision = parse_precision(precision)
        self.length_calibration = length_calibration
        self._checkpoint: LoadedCheckpoint | None = None

    def warm_up(self) -> None:
        """Load the checkpoint (once; shared with other embedders of the same folder)."""
        if self._checkpoint is None:
            self._checkpoint = load_checkpoint(self.model)

    @property
    def checkpoint(self) -> LoadedCheckpoint:
        if self._checkpoint is None:
            raise RuntimeError("RagMagDocumentEmbedder was not warmed up; call warm_up() first")
        return self._checkpoint

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, model=self.model, batch_size=self.batch_size, progress_bar=self.progress_bar,
                               title_key=self.title_key, precision=self.precision,
                               length_calibration=self.length_calibration)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RagMagDocumentEmbedder:
        return default_from_dict(cls, data)

    def length_factors(self, texts: list[str]) -> np.ndarray | None:
        """Each text's length factor, or None where calibration is off or the document side is normalized."""
        if not self.length_calibration or self.checkpoint.encoder.document_treatment().normalized:
            return None
        from rag_mag.retriever.length import length_factors

        return length_factors([len(text.split()) for text in texts], self.length_fit())

    def length_fit(self):
        """The checkpoint's fit of document norm on length, from crops of the bundled sample passages."""
        fingerprint = self.checkpoint.fingerprint
        if fingerprint not in _LENGTH_FITS:
            from rag_mag.data import iter_corpus
            from rag_mag.models import REPO_ROOT
            from rag_mag.retriever.length import fit_length, length_crops

            reference = REPO_ROOT / "data" / "sample" / "corpus.jsonl"
            texts, words = length_crops([passage.text for passage in iter_corpus(reference)])
            encoder = self.checkpoint.encoder
            raw = encoder.encode(texts, side="document", batch_size=64, treated=False,
                                 bf16=use_bf16(self.precision, encoder.device))
            _LENGTH_FITS[fingerprint] = fit = fit_length(np.linalg.norm(raw, axis=1), words)
            logger.info("length calibration of %s: document norm ~ words^%.3f (%d crops of %s)", self.model,
                        fit.slope, fit.samples, reference)
        return _LENGTH_FITS[fingerprint]

    @component.output_types(documents=list[Document])
    def run(self, documents: list[Document]) -> dict[str, list[Document]]:
        """
        Embed documents.

        :param documents: Documents to embed; `meta[title_key]` (if any) is read with the content.
        :returns: `documents`: copies of the input with `embedding` set and the norm and checkpoint in `meta`.
        """
        if not isinstance(documents, list) or not all(isinstance(d, Document) for d in documents):
            raise TypeError("RagMagDocumentEmbedder expects a list of Documents; to embed a string, "
                            "use RagMagTextEmbedder")
        self.warm_up()
        empty = [d.id for d in documents if not (d.content or "").strip()]
        if empty:
            raise DataError(f"{len(empty)} document(s) have no text to embed (first id: {empty[0]!r}); "
                            "remove empty passages from the corpus")
        encoder = self.checkpoint.encoder
        texts = [document_text(d, self.title_key) for d in documents]
        raw = encoder.encode(texts, side="document", batch_size=self.batch_size, treated=False,
                             show_progress=self.progress_bar,
                             bf16=use_bf16(self.precision, encoder.device))  # (n, dim)
        raw_norms = np.linalg.norm(raw, axis=1)
        factors = self.length_factors(texts)  # (n,) or None
        if factors is not None:
            raw = raw * factors[:, None].astype(raw.dtype)
        treated = encoder.document_treatment().apply(torch.from_numpy(raw)).numpy()  # (n, dim)
        embedded = []
        for index, (document, vector, raw_norm) in enumerate(zip(documents, treated, raw_norms, strict=True)):
            meta = {**(document.meta or {}), RAW_NORM_KEY: float(raw_norm),
                    CHECKPOINT_KEY: self.checkpoint.fingerprint, STRATEGY_KEY: self.checkpoint.strategy}
            if factors is not None:
                meta[LENGTH_FACTOR_KEY] = float(factors[index])
            embedded.append(replace(document, embedding=vector.astype(np.float32).tolist(), meta=meta))
        logger.debug("embedded %d documents with %s", len(embedded), self.model)
        return {"documents": embedded}
