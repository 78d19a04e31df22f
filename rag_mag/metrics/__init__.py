"""Benchmark metrics: answer EM/F1 (``answers``), retrieval metrics (``retrieval``), and the same
EM/F1 as an ``evaluate`` module loaded from this folder by path (``load_qa_metric``)."""

from __future__ import annotations

from pathlib import Path

from rag_mag.metrics.answers import (
    AnswerScores,
    contains_answer,
    exact_match,
    f1,
    normalize_answer,
    score_answers,
)
from rag_mag.metrics.retrieval import (
    DEFAULT_KS,
    RELEVANCE_MODES,
    Judgement,
    RetrievalScores,
    complete,
    complete_at_k,
    hit_at_k,
    judge_answers,
    judge_supporting,
    mrr_at_k,
    ndcg_at_k,
    recall,
    recall_at_k,
    recall_curve,
    score_retrieval,
    summary_mode,
)

QA_METRIC_PATH = Path(__file__).resolve().parent / "qa_em_f1.py"


def load_qa_metric():
    """The EM/F1 ``evaluate`` metric, loaded from its file (works offline)."""
    try:
        import evaluate
    except ImportError:
        from rag_mag.errors import ConfigError

        raise ConfigError("the `evaluate` package is missing; run `pip install evaluate`") from None
    return evaluate.load(str(QA_METRIC_PATH))


__all__ = [
    "AnswerScores", "DEFAULT_KS", "Judgement", "QA_METRIC_PATH", "RELEVANCE_MODES", "RetrievalScores",
    "complete", "complete_at_k", "contains_answer", "exact_match", "f1", "hit_at_k", "judge_answers",
    "judge_supporting", "load_qa_metric", "mrr_at_k", "ndcg_at_k", "normalize_answer", "recall", "recall_at_k",
    "recall_curve", "score_answers", "score_retrieval", "summary_mode",
]
