"""InfoNCE over in-batch negatives and optional hard negatives.

The scores come from ``rag_mag.retriever.strategies``: the loss only sees already-treated vectors, so the
strategy is decided in one place and the loss stays the textbook one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class InfoNCELoss(torch.nn.Module):
    """``-log softmax(s(q_i, d_i) / temperature)`` over all documents in the batch.

    Document ``i`` is the positive of query ``i``; every other document in the batch (the other
    queries' positives and all hard negatives) is a negative for it.
    """

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        self.temperature = temperature

    def forward(self, queries: torch.Tensor, positives: torch.Tensor, hard_negatives: torch.Tensor | None = None,
                false_negatives: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        # queries: (batch, dim), positives: (batch, dim), hard_negatives: (batch * n_hard, dim) or None
        # false_negatives: (batch, n_docs) bool, True where a document is another copy of a positive of
        # that query (e.g. two HotpotQA questions sharing a paragraph); those are left out of the softmax.
        documents = positives if hard_negatives is None else torch.cat([positives, hard_negatives])
        scores = queries @ documents.T / self.temperature  # (batch, n_docs), n_docs = batch + batch * n_hard
        if false_negatives is not None:
            scores = scores.masked_fill(false_negatives, float("-inf"))
        labels = torch.arange(queries.shape[0], device=queries.device)  # (batch,)
        loss = F.cross_entropy(scores, labels)
        accuracy = (scores.argmax(dim=1) == labels).float().mean()
        return {"loss": loss, "accuracy": accuracy.detach()}
