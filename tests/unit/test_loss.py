"""InfoNCE against a hand-written reference."""

import math

import pytest
import torch

from rag_mag.retriever.loss import InfoNCELoss


def reference_infonce(queries, documents, temperature, masked=()):
    """Plain Python: -log(exp(s_ii / t) / sum_j exp(s_ij / t)), averaged over queries."""
    total = 0.0
    for i, query in enumerate(queries):
        logits = [sum(a * b for a, b in zip(query, document, strict=True)) / temperature
                  for document in documents]
        denominator = sum(math.exp(logit) for j, logit in enumerate(logits) if (i, j) not in masked)
        total += -math.log(math.exp(logits[i]) / denominator)
    return total / len(queries)


QUERIES = [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]]
POSITIVES = [[0.9, 0.1], [0.2, 0.7], [0.5, 0.5]]
NEGATIVES = [[-1.0, 0.2], [0.3, 0.3], [0.0, -1.0]]


def test_in_batch_loss_equals_reference():
    loss = InfoNCELoss(temperature=0.5)(torch.tensor(QUERIES), torch.tensor(POSITIVES))
    assert float(loss["loss"]) == pytest.approx(reference_infonce(QUERIES, POSITIVES, 0.5), rel=1e-5)


def test_hard_negatives_join_the_softmax():
    loss = InfoNCELoss(temperature=0.1)(torch.tensor(QUERIES), torch.tensor(POSITIVES), torch.tensor(NEGATIVES))
    expected = reference_infonce(QUERIES, POSITIVES + NEGATIVES, 0.1)
    assert float(loss["loss"]) == pytest.approx(expected, rel=1e-5)
    assert float(loss["loss"]) > float(InfoNCELoss(0.1)(torch.tensor(QUERIES), torch.tensor(POSITIVES))["loss"])


def test_false_negatives_are_left_out():
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[0, 1] = mask[2, 4] = True
    loss = InfoNCELoss(temperature=0.2)(torch.tensor(QUERIES), torch.tensor(POSITIVES), torch.tensor(NEGATIVES),
                                        false_negatives=mask)
    expected = reference_infonce(QUERIES, POSITIVES + NEGATIVES, 0.2, masked={(0, 1), (2, 4)})
    assert float(loss["loss"]) == pytest.approx(expected, rel=1e-5)


def test_accuracy_counts_queries_whose_positive_scores_highest():
    queries = torch.eye(2)
    documents = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # query 1's positive points the wrong way
    assert float(InfoNCELoss(0.05)(queries, documents)["accuracy"]) == pytest.approx(0.5)


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        InfoNCELoss(0.0)
