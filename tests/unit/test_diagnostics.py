"""The paper's diagnostics on constructed embeddings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rag_mag.retriever.diagnostics import (
    coefficient_of_variation,
    cohens_d,
    diagnostics_of_norms,
    document_norm_effect,
    embedding_norms,
    fisher_spectrum,
    norm_diagnostics,
    norm_statistics,
    predict_side_by_fisher,
    select_side_by_cv,
)
from rag_mag.retriever.strategies import FIXED_DEGREES, Strategy, treat


def _with_norms(norms, dim=8, seed=0):
    directions = np.random.default_rng(seed).normal(size=(len(norms), dim))
    return directions / np.linalg.norm(directions, axis=1, keepdims=True) * np.asarray(norms)[:, None]


def test_cohens_d_hand_computed():
    # means 3 and 1, both sample variances 1 -> pooled sd 1 -> d = 2
    assert cohens_d([2.0, 3.0, 4.0], [0.0, 1.0, 2.0]) == pytest.approx(2.0)
    assert cohens_d([0.0, 1.0, 2.0], [2.0, 3.0, 4.0]) == pytest.approx(-2.0)
    assert math.isnan(cohens_d([1.0], [1.0, 2.0]))          # too few values
    assert math.isnan(cohens_d([1.0, 1.0], [1.0, 1.0]))     # zero spread


def test_document_norm_effect_sign_follows_relevance():
    relevant = np.array([True] * 20 + [False] * 80)
    norms = np.where(relevant, 3.0, 2.0) + np.random.default_rng(1).normal(0, 0.2, 100)
    documents = _with_norms(norms)
    assert np.allclose(embedding_norms(documents), norms)
    assert document_norm_effect(documents, relevant) > 3.0
    assert document_norm_effect(documents, ~relevant) < -3.0
    with pytest.raises(ValueError, match="one per document"):
        document_norm_effect(documents, relevant[:10])


def test_coefficient_of_variation_is_scale_free():
    values = np.array([1.0, 2.0, 3.0, 4.0])
    assert coefficient_of_variation(values) == pytest.approx(values.std(ddof=1) / values.mean())
    assert coefficient_of_variation(values * 7.5) == pytest.approx(coefficient_of_variation(values))
    assert math.isnan(coefficient_of_variation([5.0]))


def test_norm_statistics():
    stats = norm_statistics(_with_norms([4.0, 5.0, 6.0]), _with_norms([2.0, 2.0, 2.0, 2.0]))
    assert stats.query_norm_mean == pytest.approx(5.0)
    assert stats.query_norm_cv == pytest.approx(0.2)
    assert stats.document_norm_cv == pytest.approx(0.0)
    assert set(stats.to_dict()) == {"query_norm_mean", "query_norm_cv", "document_norm_mean", "document_norm_cv"}


def test_norm_diagnostics_has_the_report_keys():
    documents = _with_norms([3.0, 3.2, 1.0, 1.1, 0.9])
    block = norm_diagnostics(_with_norms([4.0, 5.0, 6.0]), documents, [True, True, False, False, False])
    assert block["document_norm_cohens_d"] > 5
    assert block["query_norm_cv"] == pytest.approx(0.2)
    assert set(block) == {"document_norm_cohens_d", "query_norm_mean", "query_norm_cv", "document_norm_mean",
                          "document_norm_cv"}


def test_diagnostics_of_norms_agrees_with_the_embedding_form():
    """The benchmark passes the norms an index stores; the numbers must be those of the embeddings."""
    queries, documents = _with_norms([4.0, 5.0, 6.0]), _with_norms([3.0, 3.2, 1.0, 1.1, 0.9])
    relevant = [True, True, False, False, False]
    from_norms = diagnostics_of_norms(embedding_norms(queries), embedding_norms(documents), relevant)
    assert from_norms == pytest.approx(norm_diagnostics(queries, documents, relevant))
    with pytest.raises(ValueError, match="one per document"):
        diagnostics_of_norms([1.0, 2.0], [1.0, 2.0, 3.0], [True])


def test_delta_cv_selector_keeps_the_more_varied_side():
    steady = _with_norms(np.full(50, 4.0) + np.random.default_rng(2).normal(0, 0.05, 50))
    varied = _with_norms(np.random.default_rng(3).uniform(1.0, 5.0, 50))
    documents_vary = select_side_by_cv(steady, varied)
    assert documents_vary.delta_cv > 0 and documents_vary.prediction == "qnorm"
    queries_vary = select_side_by_cv(varied, steady)
    assert queries_vary.delta_cv < 0 and queries_vary.prediction == "dnorm"
    assert select_side_by_cv(steady, varied, margin=10.0).prediction == "tie"


def _autograd_gram(queries, documents, strategy, temperature):
    """Reference: per-example gradients of l_i w.r.t. a shared linear head W = I, by autograd."""
    query_degree, document_degree = FIXED_DEGREES[Strategy(strategy)]
    query_scale = float(np.linalg.norm(queries, axis=1).mean())
    document_scale = float(np.linalg.norm(documents, axis=1).mean())
    q, d = torch.tensor(queries), torch.tensor(documents)
    rows = []
    for i in range(len(queries)):
        head = torch.eye(q.shape[1], dtype=torch.float64, requires_grad=True)
        scores = treat(q @ head.T, query_degree, query_scale) @ treat(d @ head.T, document_degree,
                                                                        document_scale).T / temperature
        (gradient,) = torch.autograd.grad(torch.log_softmax(scores, dim=1)[i, i], [head])
        rows.append(gradient.flatten().numpy())
    gradients = np.stack(rows)
    return gradients @ gradients.T / len(queries)


@pytest.mark.parametrize("strategy", ["cosine", "dot", "qnorm", "dnorm"])
def test_fisher_spectrum_matches_autograd(strategy):
    rng = np.random.default_rng(4)
    queries = rng.normal(size=(5, 4)) * rng.uniform(1, 3, size=(5, 1))
    documents = rng.normal(size=(7, 4)) * rng.uniform(1, 3, size=(7, 1))  # 5 positives + 2 negatives
    spectrum = fisher_spectrum(queries, documents, strategy, temperature=0.5)
    reference = np.sort(np.linalg.eigvalsh(_autograd_gram(queries, documents, strategy, 0.5)))[::-1]
    assert np.allclose(spectrum.eigenvalues, reference, rtol=1e-6, atol=1e-12)
    assert spectrum.condition_number == pytest.approx(reference[0] / reference[-1], rel=1e-6)
    assert spectrum.rank == 5
    assert spectrum.trimmed_condition_number == pytest.approx(reference[0] / reference[4], rel=1e-6)  # ceil(4.5)
    assert spectrum.query_condition_number >= 1.0 and spectrum.document_condition_number >= 1.0


def test_fisher_spectrum_rejects_bad_input():
    queries = np.ones((3, 4))
    with pytest.raises(ValueError, match="fixed strategy"):
        fisher_spectrum(queries, queries, "learnable")
    with pytest.raises(ValueError, match="one positive document per query"):
        fisher_spectrum(queries, queries[:2], "qnorm")


def _pairs(seed, n=40, dim=16):
    rng = np.random.default_rng(seed)
    queries = rng.normal(size=(n, dim))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    documents = queries + rng.normal(0, 0.3, size=(n, dim))
    documents /= np.linalg.norm(documents, axis=1, keepdims=True)
    spread = np.exp(rng.normal(0, 1.0, size=(n, 1)))  # log-normal norms, CV about 1.3
    return rng, queries, documents, spread


@pytest.mark.parametrize("seed", [0, 1])
def test_fisher_predictor_normalizes_the_side_with_erratic_norms(seed):
    # Query norms act as per-query temperatures: when they vary wildly and stay raw (dnorm), the
    # per-example gradients span orders of magnitude and the Fisher is ill-conditioned; normalizing
    # the queries (qnorm) removes that. The mirror case holds for documents.
    _, queries, documents, spread = _pairs(seed)
    erratic_queries = predict_side_by_fisher(queries * spread, documents * 2.0, temperature=0.1)
    assert erratic_queries.prediction == "qnorm"
    assert erratic_queries.dnorm.condition_number > 10 * erratic_queries.qnorm.condition_number
    erratic_documents = predict_side_by_fisher(queries * 2.0, documents * spread, temperature=0.1)
    assert erratic_documents.prediction == "dnorm"
    data = erratic_documents.to_dict()
    assert data["prediction"] == "dnorm"
    assert data["qnorm"]["condition_number"] == erratic_documents.qnorm.condition_number
    assert data["dnorm"]["rank"] <= 40


def test_fisher_predictor_subsamples_seeded():
    _, queries, documents, spread = _pairs(2, n=50)
    first = predict_side_by_fisher(queries * spread, documents, max_examples=20, seed=7)
    second = predict_side_by_fisher(queries * spread, documents, max_examples=20, seed=7)
    assert first.qnorm.rank <= 20
    eigenvalues, rank = first.qnorm.eigenvalues, first.qnorm.rank
    tenth_smallest = eigenvalues[math.ceil(0.9 * rank) - 1]
    assert first.qnorm.trimmed_condition_number == pytest.approx(eigenvalues[0] / tenth_smallest)
    assert first.qnorm.trimmed_condition_number <= first.qnorm.condition_number
    assert first.qnorm.condition_number == second.qnorm.condition_number
