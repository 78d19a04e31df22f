"""The strategies against their algebra."""

import pytest
import torch

from rag_mag.errors import ConfigError
from rag_mag.retriever.strategies import DegreeParameters, Strategy, initial_degrees, similarity, treat


@pytest.fixture
def vectors():
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(5, 16, generator=generator) * torch.rand(5, 1, generator=generator) * 4
    documents = torch.randn(40, 16, generator=generator) * (0.2 + torch.rand(40, 1, generator=generator) * 5)
    return queries, documents


def scores(strategy, queries, documents):
    query_degree, document_degree = initial_degrees(strategy)
    return similarity(queries, documents, query_degree, document_degree)


def rankings(score_matrix):
    return score_matrix.argsort(dim=1, descending=True)


def test_fixed_strategies_match_their_formulas(vectors):
    queries, documents = vectors
    unit_q = torch.nn.functional.normalize(queries, dim=-1)
    unit_d = torch.nn.functional.normalize(documents, dim=-1)
    torch.testing.assert_close(scores("cosine", queries, documents), unit_q @ unit_d.T)
    torch.testing.assert_close(scores("dot", queries, documents), queries @ documents.T)
    torch.testing.assert_close(scores("qnorm", queries, documents), unit_q @ documents.T)
    torch.testing.assert_close(scores("dnorm", queries, documents), queries @ unit_d.T)


def test_dnorm_ranks_exactly_like_cosine(vectors):
    queries, documents = vectors
    assert torch.equal(rankings(scores("dnorm", queries, documents)), rankings(scores("cosine", queries, documents)))


def test_qnorm_ranks_exactly_like_dot(vectors):
    queries, documents = vectors
    assert torch.equal(rankings(scores("qnorm", queries, documents)), rankings(scores("dot", queries, documents)))


def test_qnorm_ranking_differs_from_cosine_when_document_norms_vary(vectors):
    # guards the two tests above against a similarity() that ignores its degrees
    queries, documents = vectors
    assert not torch.equal(rankings(scores("qnorm", queries, documents)),
                           rankings(scores("cosine", queries, documents)))


@pytest.mark.parametrize("degrees, strategy", [((1, 1), "cosine"), ((0, 0), "dot"), ((1, 0), "qnorm"),
                                               ((0, 1), "dnorm")])
def test_learnable_at_the_corners_equals_the_fixed_strategies(vectors, degrees, strategy):
    queries, documents = vectors
    learnable = DegreeParameters("learnable", *degrees)
    query_degree, document_degree = learnable.degrees()
    torch.testing.assert_close(similarity(queries, documents, query_degree, document_degree),
                               scores(strategy, queries, documents), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy", [s.value for s in Strategy])
def test_query_magnitude_never_changes_a_querys_ranking(vectors, strategy):
    queries, documents = vectors
    query_degree, document_degree = initial_degrees(strategy)
    base = similarity(queries, documents, query_degree, document_degree, 3.0, 2.0)
    scaled = similarity(queries * 7.5, documents, query_degree, document_degree, 3.0, 2.0)
    assert torch.equal(rankings(base), rankings(scaled))


def test_the_gradient_reaches_both_degrees(vectors):
    queries, documents = vectors
    degrees = DegreeParameters("learnable")
    query_degree, document_degree = degrees.degrees()
    assert (query_degree.item(), document_degree.item()) == pytest.approx((0.5, 0.5))
    loss = torch.nn.functional.cross_entropy(similarity(queries, documents[:5], query_degree, document_degree),
                                             torch.arange(5))
    loss.backward()
    for parameter in (degrees.query_logit, degrees.document_logit):
        assert parameter.grad is not None and parameter.grad.abs() > 0


def test_fixed_strategies_have_no_trainable_degrees():
    assert list(DegreeParameters("qnorm").parameters()) == []
    assert len(list(DegreeParameters("learnable").parameters())) == 2


def test_norm_scale_only_divides_a_raw_side():
    x = torch.tensor([[3.0, 4.0]])
    torch.testing.assert_close(treat(x, 1.0, norm_scale=10.0), torch.tensor([[0.6, 0.8]]))
    torch.testing.assert_close(treat(x, 0.0, norm_scale=10.0), torch.tensor([[0.3, 0.4]]))
    # halfway: x / (||x||**0.5 * c**0.5)
    torch.testing.assert_close(treat(x, 0.5, norm_scale=5.0), x / 5.0)


def test_unknown_strategy_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="cosine, dot, qnorm, dnorm, learnable"):
        Strategy.parse("cosin")
    with pytest.raises(ValueError):  # ConfigError is also a ValueError for library callers
        Strategy.parse("")
    assert Strategy.parse(" QNorm ") is Strategy.QNORM
