"""Graph search that keeps magnitude: HNSW over the exact reduction of inner product search to L2 search.

HNSW built directly on inner product loses recall on vectors whose norms vary (the graph's neighbour
choice assumes a metric; inner product is not one). The reduction of Bachrach et al. (2014) turns maximum
inner product search into nearest-neighbour search, where HNSW is at home:

    document d -> [d, sqrt(M^2 - |d|^2)]      query q -> [q, 0]
    |q' - d'|^2 = |q|^2 + M^2 - 2 q.d

with ``M`` the largest document norm, fixed when the index is built. For a given query the L2 distance is
a decreasing function of the inner product, so the L2 ranking is the inner-product ranking, and the score
``q.d = (|q|^2 + M^2 - distance) / 2`` is recovered exactly.

A document added later with ``|d| > M`` cannot be placed on the sphere (the root is undefined). It goes
into the graph with a last coordinate of 0, where its distance understates its inner product, and also into
a small exact *overflow* set that every search scans; results from both are merged by true inner product,
so no such document is ever missed. When the overflow grows past ``OVERFLOW_WARN`` of the index, a
rebuild (which refits M) is advised.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

OVERFLOW_WARN = 0.01  # share of documents above M past which a rebuild is advised
NORM_SLACK = 1e-6  # relative: norms this close to M count as on the sphere (float rounding)


def augment_documents(vectors: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """``[d, sqrt(M^2 - |d|^2)]`` for each row, and the mask of rows above ``M`` (given a last coordinate 0)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    squared = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64)
    gap = max_norm ** 2 - squared
    above = gap < -NORM_SLACK * max_norm ** 2
    extra = np.sqrt(np.clip(gap, 0.0, None)).astype(np.float32)
    return np.hstack([vectors, extra[:, None]]), above


def augment_queries(queries: np.ndarray) -> np.ndarray:
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    return np.hstack([queries, np.zeros((len(queries), 1), np.float32)])


class MipsHnswIndex:
    """An HNSW (L2) index over augmented document vectors that answers inner-product searches.

    It offers the part of the FAISS index interface the store uses: ``add``, ``search`` (inner-product
    scores, best first), ``ntotal``, ``d`` (the original dimension) and ``hnsw`` (for ``efSearch``).
    ``graph`` is the FAISS index that is saved; ``max_norm`` goes into the manifest.
    """

    def __init__(self, graph, max_norm: float) -> None:
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm!r}")
        self.graph = graph
        self.max_norm = float(max_norm)
        self._overflow_rows = np.zeros(0, np.int64)
        self._overflow_vectors = np.zeros((0, graph.d - 1), np.float32)

    @classmethod
    def empty(cls, dim: int, max_norm: float, hnsw_m: int, ef_construction: int) -> MipsHnswIndex:
        """An index for ``dim``-dimensional documents whose largest norm is ``max_norm``; add them next."""
        import faiss

        graph = faiss.IndexHNSWFlat(dim + 1, hnsw_m, faiss.METRIC_L2)
        graph.hnsw.efConstruction = ef_construction
        return cls(graph, max_norm)

    @classmethod
    def build(cls, vectors: np.ndarray, hnsw_m: int, ef_construction: int) -> MipsHnswIndex:
        """A new index whose M is the largest norm of ``vectors`` (which must not be empty)."""
        if not len(vectors):
            raise ValueError("a hnsw_mips index needs at least one vector to fix its maximum norm")
        index = cls.empty(vectors.shape[1], float(np.linalg.norm(vectors, axis=1).max()), hnsw_m, ef_construction)
        index.add(vectors)
        return index

    @classmethod
    def restore(cls, graph, max_norm: float, vectors: np.ndarray) -> MipsHnswIndex:
        """Wrap a saved graph again; ``vectors`` are its documents in row order (to find the overflow rows)."""
        index = cls(graph, max_norm)
        _, above = augment_documents(vectors, index.max_norm)
        index._remember_overflow(np.flatnonzero(above), np.asarray(vectors, np.float32)[above])
        return index

    @property
    def ntotal(self) -> int:
        return self.graph.ntotal

    @property
    def d(self) -> int:
        return self.graph.d - 1

    @property
    def hnsw(self):
        return self.graph.hnsw

    @property
    def overflow(self) -> int:
        """How many documents lie above M (searched exactly beside the graph)."""
        return len(self._overflow_rows)

    def add(self, vectors: np.ndarray) -> None:
        first_row = self.graph.ntotal
        augmented, above = augment_documents(vectors, self.max_norm)
        self.graph.add(augmented)
        if above.any():
            self._remember_overflow(first_row + np.flatnonzero(above), np.asarray(vectors, np.float32)[above])
            if self.overflow > OVERFLOW_WARN * self.ntotal:
                logger.warning("%d of %d documents have a norm above the index's maximum %.4g and are searched "
                               "exactly beside the graph; rebuild the index to refit it", self.overflow,
                               self.ntotal, self.max_norm)

    def _remember_overflow(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        self._overflow_rows = np.concatenate([self._overflow_rows, rows.astype(np.int64)])
        self._overflow_vectors = np.concatenate([self._overflow_vectors, vectors.astype(np.float32)])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Inner-product scores (m, k) and rows (m, k), best first (rows -1 where fewer than k exist)."""
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        distances, rows = self.graph.search(augment_queries(queries), k)
        squared = np.einsum("ij,ij->i", queries, queries)[:, None]
        scores = ((squared + self.max_norm ** 2 - distances) / 2).astype(np.float32)
        scores[rows < 0] = -np.inf
        if self.overflow:
            scores, rows = self._merge_overflow(queries, scores, rows, k)
        return scores, rows

    def _merge_overflow(self, queries: np.ndarray, scores: np.ndarray, rows: np.ndarray,
                        k: int) -> tuple[np.ndarray, np.ndarray]:
        """Replace the graph's scores of overflow rows by exact ones, add the exact overflow hits, keep the top k."""
        exact = queries @ self._overflow_vectors.T  # (m, overflow)
        is_overflow = np.isin(rows, self._overflow_rows)
        scores = np.where(is_overflow, -np.inf, scores)  # understated in the graph: dropped, re-added exactly
        all_scores = np.hstack([scores, exact])
        all_rows = np.hstack([rows, np.broadcast_to(self._overflow_rows, exact.shape)])
        order = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
        top_scores = np.take_along_axis(all_scores, order, axis=1).astype(np.float32)
        top_rows = np.take_along_axis(all_rows, order, axis=1)
        top_rows[~np.isfinite(top_scores)] = -1
        return top_scores, top_rows
