"""Similarity strategies: which side of the query/document pair is L2-normalized.

Every strategy is a pair of *normalization degrees* ``(g_query, g_document)`` in ``[0, 1]``.
One side ``x`` is turned into ``x / (||x||**g * c**(1 - g))``:

* ``g = 1``: the side is normalized (direction only);
* ``g = 0``: the side keeps its magnitude, divided by a fixed constant ``c`` (its mean norm at
  initialization, see ``norm_scale``) so that the softmax starts at the same temperature as cosine;
* ``learnable``: ``g = sigmoid(g_hat)`` is trained by gradient, per side, starting at 0.5.

The score is then a plain inner product of the two treated vectors, which is why one FAISS
inner-product index serves every strategy. This module is the one place that maps a strategy
name to how each side is treated, at training time and at serving time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from rag_mag.errors import ConfigError

EPS = 1e-12


class Strategy(str, enum.Enum):
    COSINE = "cosine"
    DOT = "dot"
    QNORM = "qnorm"
    DNORM = "dnorm"
    LEARNABLE = "learnable"

    @classmethod
    def parse(cls, name: str | Strategy) -> Strategy:
        if isinstance(name, Strategy):
            return name
        try:
            return cls(str(name).strip().lower())
        except ValueError:
            valid = ", ".join(s.value for s in cls)
            raise ConfigError(f"unknown similarity strategy {name!r}; valid strategies are: {valid}") from None


# (g_query, g_document) of the fixed strategies. learnable starts at (0.5, 0.5).
FIXED_DEGREES: dict[Strategy, tuple[float, float]] = {
    Strategy.COSINE: (1.0, 1.0),
    Strategy.DOT: (0.0, 0.0),
    Strategy.QNORM: (1.0, 0.0),
    Strategy.DNORM: (0.0, 1.0),
}
LEARNABLE_INIT = 0.5


def initial_degrees(strategy: Strategy | str) -> tuple[float, float]:
    """The ``(g_query, g_document)`` a strategy starts training with."""
    strategy = Strategy.parse(strategy)
    if strategy is Strategy.LEARNABLE:
        return (LEARNABLE_INIT, LEARNABLE_INIT)
    return FIXED_DEGREES[strategy]


def treat(embeddings: torch.Tensor, degree: torch.Tensor | float, norm_scale: float = 1.0) -> torch.Tensor:
    """Apply one side's treatment: ``x / (||x||**g * norm_scale**(1 - g))``.

    embeddings: (n, dim) raw pooled vectors; degree: scalar g in [0, 1]; returns (n, dim).
    """
    degree = torch.as_tensor(degree, dtype=embeddings.dtype, device=embeddings.device)
    norms = embeddings.norm(dim=-1, keepdim=True).clamp_min(EPS)  # (n, 1)
    scale = torch.as_tensor(norm_scale, dtype=embeddings.dtype, device=embeddings.device)
    return embeddings / (norms.pow(degree) * scale.pow(1.0 - degree))


def similarity(
    queries: torch.Tensor,
    documents: torch.Tensor,
    query_degree: torch.Tensor | float,
    document_degree: torch.Tensor | float,
    query_norm_scale: float = 1.0,
    document_norm_scale: float = 1.0,
) -> torch.Tensor:
    """Scores of every query against every document: (n_queries, dim) x (n_docs, dim) -> (n_queries, n_docs)."""
    return treat(queries, query_degree, query_norm_scale) @ treat(
        documents, document_degree, document_norm_scale
    ).T


class DegreeParameters(torch.nn.Module):
    """The normalization degrees of one model: fixed buffers, or trainable logits for ``learnable``."""

    def __init__(self, strategy: Strategy | str, query_degree: float | None = None,
                 document_degree: float | None = None) -> None:
        super().__init__()
        self.strategy = Strategy.parse(strategy)
        start_query, start_document = initial_degrees(self.strategy)
        query_degree = start_query if query_degree is None else float(query_degree)
        document_degree = start_document if document_degree is None else float(document_degree)
        if self.strategy is Strategy.LEARNABLE:
            # g = sigmoid(g_hat); clamp so a saved g of exactly 0 or 1 stays finite.
            self.query_logit = torch.nn.Parameter(_logit(query_degree))
            self.document_logit = torch.nn.Parameter(_logit(document_degree))
        else:
            self.register_buffer("query_logit", _logit(query_degree), persistent=False)
            self.register_buffer("document_logit", _logit(document_degree), persistent=False)
            self._fixed = (query_degree, document_degree)

    @property
    def learnable(self) -> bool:
        return self.strategy is Strategy.LEARNABLE

    def degrees(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(g_query, g_document) as tensors (differentiable for ``learnable``)."""
        if self.learnable:
            return torch.sigmoid(self.query_logit), torch.sigmoid(self.document_logit)
        return torch.tensor(self._fixed[0]), torch.tensor(self._fixed[1])

    def as_floats(self) -> tuple[float, float]:
        query_degree, document_degree = self.degrees()
        return float(query_degree.detach()), float(document_degree.detach())


def _logit(probability: float) -> torch.Tensor:
    probability = min(max(probability, 1e-6), 1 - 1e-6)
    return torch.logit(torch.tensor(probability, dtype=torch.float32))


@dataclass(frozen=True)
class SideTreatment:
    """How one side is treated at serving time (read from a checkpoint)."""

    degree: float
    norm_scale: float = 1.0

    @property
    def normalized(self) -> bool:
        return self.degree >= 1.0

    def apply(self, embeddings: torch.Tensor) -> torch.Tensor:
        return treat(embeddings, self.degree, self.norm_scale)
