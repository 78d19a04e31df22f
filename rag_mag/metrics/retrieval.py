"""Retrieval metrics as pure functions of one ranked list per question.

A ranked list is first *judged*: each retrieved passage is relevant or not, and the question has a
number of known relevant passages (``Judgement``). Two ways of judging, chosen per question (the
dataset loader uses ``supporting`` wherever a question names gold passages):

* ``supporting`` (the data names gold passages: HotpotQA, MuSiQue, NQ oracle): a passage is relevant
  if its id is one of the question's supporting ids; ``n_relevant`` = number of supporting ids.
* ``answer`` (only answers are known: TriviaQA, NQ test, 2Wiki): a passage is relevant if a gold
  alias occurs in its title or text (``contains_answer`` on ``title + "\n" + text``, a SQuAD-normalized
  token match; this reproduces the ``has_answer`` flags of the shared TriviaQA data exactly);
  ``n_relevant`` = size of the union of the answer-bearing passages known beforehand (the question's
  own answer-bearing contexts) and those found in the ranked list.

Metrics of one question, each in [0, 1] (``score_retrieval`` reports their means in [0, 100]):

* ``recall@k``: supporting mode: the fraction of supporting passages found in the top k (BEIR's
  recall; a 2-hop question with one of its two passages retrieved scores 0.5). Answer mode: 1 if
  any of the top k contains an answer (DPR's top-k accuracy), since the full set of answer-bearing
  passages of an open corpus is unknown.
* ``complete@k``: supporting mode: 1 if *all* supporting passages are in the top k; answer mode: the
  same as recall@k (one answer-bearing passage is all a reader needs).
* ``ndcg@10``: binary gains, DCG = sum rel_i / log2(i + 1) over ranks i = 1..k; the ideal DCG puts
  min(n_relevant, k) relevant passages first.
* ``mrr@10``: 1 / rank of the first relevant passage within the top k, else 0.

A question with no known relevant passage scores 0 on every metric (it stays in the mean, so every
system is averaged over the same questions).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rag_mag.metrics.answers import contains_answer

RELEVANCE_MODES = ("supporting", "answer")
DEFAULT_KS = (1, 5, 20)


@dataclass(frozen=True)
class Judgement:
    """Relevance of each passage of one ranked list, best first, and the number known relevant."""

    relevant: tuple[bool, ...]
    n_relevant: int
    mode: str = "supporting"

    def __post_init__(self) -> None:
        check_mode(self.mode)


def check_mode(mode: str) -> str:
    if mode not in RELEVANCE_MODES:
        raise ValueError(f"unknown relevance mode {mode!r}; valid modes are: {', '.join(RELEVANCE_MODES)}")
    return mode


def judge_supporting(ranked_ids: Sequence[str], supporting_ids: Iterable[str]) -> Judgement:
    """Relevant = one of the supporting ids. A repeated id counts once (its first rank)."""
    gold = set(supporting_ids)
    seen: set[str] = set()
    relevant = []
    for passage_id in ranked_ids:
        relevant.append(passage_id in gold and passage_id not in seen)
        seen.add(passage_id)
    return Judgement(relevant=tuple(relevant), n_relevant=len(gold), mode="supporting")


def judge_answers(ranked_ids: Sequence[str], ranked_texts: Sequence[str], answers: Sequence[str],
                  known_answer_ids: Iterable[str] = ()) -> Judgement:
    """Relevant = a gold alias occurs in the passage (give ``Passage.content``: title and text)."""
    if len(ranked_ids) != len(ranked_texts):
        raise ValueError(f"got {len(ranked_ids)} ids but {len(ranked_texts)} texts; give one text per id")
    relevant = [contains_answer(text, answers) for text in ranked_texts]
    found = {passage_id for passage_id, hit in zip(ranked_ids, relevant, strict=True) if hit}
    return Judgement(relevant=tuple(relevant), n_relevant=len(found | set(known_answer_ids)), mode="answer")


def _top(judgement: Judgement, k: int) -> np.ndarray:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return np.asarray(judgement.relevant[:k], dtype=bool)


def recall_at_k(judgement: Judgement, k: int) -> float:
    """Fraction of the known relevant passages found in the top k (0 when none is known)."""
    if judgement.n_relevant == 0:
        return 0.0
    return min(1.0, float(_top(judgement, k).sum()) / judgement.n_relevant)


def hit_at_k(judgement: Judgement, k: int) -> float:
    """1 if any of the top k is relevant."""
    return float(_top(judgement, k).any())


def complete_at_k(judgement: Judgement, k: int) -> float:
    """1 if every known relevant passage is in the top k (0 when none is known)."""
    if judgement.n_relevant == 0:
        return 0.0
    return float(_top(judgement, k).sum() >= judgement.n_relevant)


def ndcg_at_k(judgement: Judgement, k: int = 10) -> float:
    """Binary-gain nDCG of the top k."""
    if judgement.n_relevant == 0:
        return 0.0
    top = _top(judgement, k)
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = float((top * discounts[: len(top)]).sum())
    ideal = float(discounts[: min(judgement.n_relevant, k)].sum())
    return dcg / ideal


def mrr_at_k(judgement: Judgement, k: int = 10) -> float:
    """Reciprocal rank of the first relevant passage in the top k, else 0."""
    hits = np.flatnonzero(_top(judgement, k))
    return 1.0 / (hits[0] + 1) if len(hits) else 0.0


def recall(judgement: Judgement, k: int) -> float:
    """recall@k as the judgement's mode defines it (fraction of supporting passages, or a hit)."""
    return recall_at_k(judgement, k) if judgement.mode == "supporting" else hit_at_k(judgement, k)


def complete(judgement: Judgement, k: int) -> float:
    """complete@k: all supporting passages found (supporting mode), or a hit (answer mode)."""
    return complete_at_k(judgement, k) if judgement.mode == "supporting" else hit_at_k(judgement, k)


def summary_mode(judgements: Sequence[Judgement]) -> str:
    """"supporting", "answer", or "mixed" when a dataset has both kinds of question."""
    modes = {judgement.mode for judgement in judgements}
    return modes.pop() if len(modes) == 1 else ("mixed" if modes else "supporting")


@dataclass(frozen=True)
class RetrievalScores:
    """``means``: metric -> mean in [0, 100]; ``per_example``: metric -> values in [0, 1]."""

    mode: str
    means: dict[str, float]
    per_example: dict[str, np.ndarray]


def score_retrieval(judgements: Sequence[Judgement], ks: Sequence[int] = DEFAULT_KS, ndcg_k: int = 10,
                    mrr_k: int = 10) -> RetrievalScores:
    """All metrics of the module docstring (keys ``recall@K``, ``complete@K``, ``ndcg@10``, ``mrr@10``)."""
    def column(metric, k):
        return np.array([metric(judgement, k) for judgement in judgements], dtype=np.float64)

    per_example: dict[str, np.ndarray] = {}
    for k in ks:
        per_example[f"recall@{k}"] = column(recall, k)
    for k in ks:
        per_example[f"complete@{k}"] = column(complete, k)
    per_example[f"ndcg@{ndcg_k}"] = column(ndcg_at_k, ndcg_k)
    per_example[f"mrr@{mrr_k}"] = column(mrr_at_k, mrr_k)
    means = {name: 100.0 * float(values.mean()) if len(values) else 0.0 for name, values in per_example.items()}
    return RetrievalScores(mode=summary_mode(judgements), means=means, per_example=per_example)


def recall_curve(judgements: Sequence[Judgement], max_k: int = 20) -> list[float]:
    """Mean recall@k for k = 1..max_k, in [0, 100] (the same recall as ``score_retrieval``)."""
    if not judgements:
        return [0.0] * max_k
    return [100.0 * float(np.mean([recall(j, k) for j in judgements])) for k in range(1, max_k + 1)]
