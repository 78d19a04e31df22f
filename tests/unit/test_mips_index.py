"""The MIPS-to-L2 reduction behind index_type="hnsw_mips": exact scores, recall where HNSW-IP fails, overflow."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from rag_mag.components.mips_index import MipsHnswIndex, augment_documents, augment_queries


def varied_norms(count: int, dim: int = 16, seed: int = 0) -> np.ndarray:
    """Directions on the sphere with log-normal norms (coefficient of variation about 0.8)."""
    rng = np.random.default_rng(seed)
    directions = rng.normal(size=(count, dim)).astype(np.float32)
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    return directions * rng.lognormal(0.0, 0.7, size=(count, 1)).astype(np.float32)


def exact_top(queries: np.ndarray, documents: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ documents.T), axis=1, kind="stable")[:, :k]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def test_reduction_turns_l2_distance_into_inner_product():
    documents, queries = varied_norms(50), varied_norms(5, seed=1)
    max_norm = float(np.linalg.norm(documents, axis=1).max())
    augmented, above = augment_documents(documents, max_norm)
    assert not above.any()
    np.testing.assert_allclose(np.linalg.norm(augmented, axis=1), max_norm, rtol=1e-5)  # all on one sphere
    distance = ((augment_queries(queries)[:, None, :] - augmented[None]) ** 2).sum(-1)
    inner = queries @ documents.T
    expected = (queries ** 2).sum(1)[:, None] + max_norm ** 2 - 2 * inner
    np.testing.assert_allclose(distance, expected, rtol=1e-4, atol=1e-4)


def test_scores_are_inner_products_and_ranking_is_exact_with_a_wide_search():
    documents, queries = varied_norms(300), varied_norms(20, seed=1)
    index = MipsHnswIndex.build(documents, hnsw_m=16, ef_construction=100)
    index.hnsw.efSearch = 300  # searching the whole graph: the answer must be the exact one
    scores, rows = index.search(queries, 10)
    np.testing.assert_array_equal(rows, exact_top(queries, documents, 10))
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ documents.T, rows, axis=1), atol=1e-4)


def clustered(count: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Directions around 50 shared centres (as text embeddings cluster) with log-normal norms."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(99).normal(size=(50, dim))
    vectors = centres[rng.integers(0, 50, count)] + 0.5 * rng.normal(size=(count, dim))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors * rng.lognormal(0.0, 0.5, size=(count, 1))).astype(np.float32)


def test_recall_rises_with_the_search_breadth_and_reaches_the_exact_top_10():
    documents, queries = clustered(3000), clustered(100, seed=1)
    truth = exact_top(queries, documents, 10)
    index = MipsHnswIndex.build(documents, hnsw_m=32, ef_construction=200)
    found = {}
    for ef_search in (16, 512):
        index.hnsw.efSearch = ef_search
        found[ef_search] = recall(index.search(queries, 10)[1], truth)
    assert found[512] >= 0.95, found
    assert found[16] < found[512], found


def test_documents_above_the_fitted_maximum_are_never_missed():
    documents, queries = varied_norms(400), varied_norms(30, seed=1)
    index = MipsHnswIndex.build(documents, hnsw_m=16, ef_construction=100)
    index.hnsw.efSearch = 64
    giants = varied_norms(3, seed=2)
    giants *= 3 * index.max_norm / np.linalg.norm(giants, axis=1, keepdims=True)  # far above M
    index.add(giants)
    assert index.overflow == 3 and index.ntotal == 403
    everything = np.vstack([documents, giants])
    scores, rows = index.search(queries, 5)
    truth = exact_top(queries, everything, 5)
    for found, wanted in zip(rows, truth, strict=True):
        assert {r for r in wanted if r >= 400} <= set(found)  # every giant that belongs in the top 5 is there
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ everything.T, rows, axis=1), atol=1e-3)
    assert all(len(set(r)) == len(r) for r in rows)  # no row twice
    restored = MipsHnswIndex.restore(index.graph, index.max_norm, everything)
    assert restored.overflow == 3


def test_invalid_inputs():
    with pytest.raises(ValueError, match="at least one vector"):
        MipsHnswIndex.build(np.zeros((0, 4), np.float32), 16, 40)
    with pytest.raises(ValueError, match="max_norm must be positive"):
        MipsHnswIndex(faiss.IndexHNSWFlat(5, 8), 0.0)
