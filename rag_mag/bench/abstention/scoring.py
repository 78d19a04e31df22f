"""The abstention benchmark's figures: per reader, set, system and signal, with bootstrap intervals.

An abstention is the reader's reply ``unanswerable`` (signal ``reader``), or with ``reader+passages`` also an
answer that does not occur in the passages shown. An abstention scores EM and F1 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rag_mag.bench.abstention.sets import Item
from rag_mag.bench.stats import bootstrap_ci, compare_paired
from rag_mag.metrics.answers import contains_answer, exact_match, f1, is_no_answer

SIGNALS = ("reader", "reader+passages")


def abstains(item: Item, reply: dict[str, Any], signal: str) -> bool:
    if not reply["answerable"] or is_no_answer(reply["reply"]):
        return True
    if signal == "reader+passages":
        return not any(contains_answer(f"{title} {text}", [reply["reply"]]) for title, text in item.passages)
    return False


def item_scores(item: Item, reply: dict[str, Any], signal: str) -> tuple[bool, float, float]:
    """(abstained, EM, F1) of one reply; an abstention scores 0."""
    abstained = abstains(item, reply, signal)
    if abstained or not item.answers or not item.short:
        return abstained, 0.0, 0.0
    return abstained, exact_match(reply["reply"], item.answers), f1(reply["reply"], item.answers)


def prf(abstained_answerable: np.ndarray, abstained_unanswerable: np.ndarray) -> tuple[float, float, float]:
    """Abstention precision, recall and F1 (0-1): a question without an answer is a positive."""
    true_positive = float(abstained_unanswerable.sum())
    predicted = true_positive + float(abstained_answerable.sum())
    precision = true_positive / predicted if predicted else 0.0
    recall = true_positive / len(abstained_unanswerable) if len(abstained_unanswerable) else 0.0
    return precision, recall, (2 * precision * recall / (precision + recall) if precision + recall else 0.0)


RESAMPLES = 1000


def _rate(values: list[float]) -> dict[str, Any] | None:
    """Mean (0-100) and its 95% bootstrap interval; None without values."""
    if not values:
        return None
    low, high = bootstrap_ci(values, n_resamples=RESAMPLES)
    return {"value": 100.0 * float(np.mean(values)), "ci": [100.0 * low, 100.0 * high], "n": len(values)}


def _prf_ci(answerable: np.ndarray, unanswerable: np.ndarray) -> dict[str, Any]:
    """Abstention precision, recall and F1 (0-100) with intervals from resampling both kinds of question."""
    point = prf(answerable, unanswerable)
    rng = np.random.default_rng(0)
    draws = np.array([prf(answerable[rng.integers(0, len(answerable), len(answerable))],
                          unanswerable[rng.integers(0, len(unanswerable), len(unanswerable))])
                      for _ in range(RESAMPLES)])
    return {name: {"value": 100.0 * point[k], "ci": [100.0 * float(np.percentile(draws[:, k], 2.5)),
                                                     100.0 * float(np.percentile(draws[:, k], 97.5))]}
            for k, name in enumerate(("precision", "recall", "f1"))}


def score_group(items: list[Item], replies: list[dict[str, Any]], signal: str) -> dict[str, Any]:
    scored = [(item, *item_scores(item, reply, signal)) for item, reply in zip(items, replies, strict=True)]
    answerable = [s for s in scored if s[0].answerable]
    unanswerable = [s for s in scored if not s[0].answerable]
    short = [s for s in answerable if s[0].short and s[0].answers]
    result: dict[str, Any] = {
        "n_answerable": len(answerable), "n_unanswerable": len(unanswerable),
        "em": _rate([s[2] for s in short]), "f1": _rate([s[3] for s in short]),
        "false_abstain": _rate([float(s[1]) for s in answerable]),
        "false_abstain_held": _rate([float(s[1]) for s in answerable if s[0].held]),
        "abstain": _rate([float(s[1]) for s in unanswerable]),
    }
    if answerable and unanswerable:
        result["abstention"] = _prf_ci(np.array([s[1] for s in answerable], dtype=float),
                                       np.array([s[1] for s in unanswerable], dtype=float))
    today = [(s[2], s[0].today) for s in short if s[0].today is not None]
    if today:
        result["em_vs_report"] = compare_paired([a for a, _ in today], [b for _, b in today]).to_dict(scale=100.0)
    return result
