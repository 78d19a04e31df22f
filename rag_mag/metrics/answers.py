"""Answer metrics: SQuAD-normalized Exact Match and token F1, the max over gold aliases.

Contract
--------
* ``normalize_answer(text)``: the SQuAD v1.1 normalization (lowercase, drop punctuation, drop the
  articles a/an/the, collapse whitespace) extended to Unicode, see below.
* ``exact_match(prediction, golds)`` and ``f1(prediction, golds)``: one example, a value in
  ``[0, 1]``, the maximum over all gold aliases. ``golds`` must hold at least one alias.
* ``score_answers(predictions, golds_per_question)``: many examples; the aggregates are in
  ``[0, 100]`` (report level), the per-example values stay in ``[0, 1]`` (for bootstrap and tests).

Unicode handling (decided here, applied the same to predictions and golds)
-------------------------------------------------------------------------
1. NFKC normalization first, so compatibility forms compare equal (full-width ``Ｐａｒｉｓ`` and
   ``Paris``, the ligature ``ﬁ`` and ``fi``, a no-break space and a space).
2. ``str.lower()`` (full Unicode lowercase: ``ÉCOLE`` -> ``école``).
3. Every character of a Unicode punctuation category (``P*``: curly quotes, dashes, ``¿``, ...) is
   removed, as are the ASCII symbols SQuAD removes (``string.punctuation``: ``$ + < = > ^ ` | ~``).
   Like SQuAD, removal joins the neighbours: ``well-known`` -> ``wellknown``.
4. Diacritics are kept: ``Röntgen`` and ``Rontgen`` differ, as in SQuAD, because dropping accents
   would also merge distinct names. On pure ASCII text the result equals SQuAD's normalization.

Empty answers: a prediction that normalizes to nothing scores 0 against any gold that does not,
and 1 against a gold that also normalizes to nothing (SQuAD v2's convention for F1, used for EM too).
"""

from __future__ import annotations

import functools
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)


@functools.cache
def _punctuation_table() -> dict[int, None]:
    """``str.translate`` table deleting every P* code point and ASCII punctuation (built once, ~0.1 s)."""
    table: dict[int, None] = {ord(character): None for character in string.punctuation}
    for code_point in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code_point)).startswith("P"):
            table[code_point] = None
    return table


@functools.lru_cache(maxsize=65_536)
def normalize_answer(text: str) -> str:
    """SQuAD normalization with the Unicode rules of the module docstring (memoized: passages recur)."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_punctuation_table())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _check_golds(golds: Sequence[str]) -> None:
    if isinstance(golds, str):
        raise TypeError("golds must be a sequence of answer strings, not one string; wrap it in a list")
    if len(golds) == 0:
        raise ValueError("golds is empty; every question needs at least one gold answer")


def _exact_match_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    common = Counter(prediction_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalized prediction equals any normalized gold alias, else 0.0."""
    _check_golds(golds)
    return max(_exact_match_one(prediction, gold) for gold in golds)


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-level F1 of the normalized bags of words, the max over gold aliases, in [0, 1]."""
    _check_golds(golds)
    return max(_f1_one(prediction, gold) for gold in golds)


@dataclass(frozen=True)
class AnswerScores:
    """Aggregates in [0, 100]; per-example values in [0, 1], in the order of the inputs."""

    em: float
    f1: float
    em_per_example: np.ndarray
    f1_per_example: np.ndarray

    @property
    def n(self) -> int:
        return len(self.em_per_example)


def score_answers(predictions: Sequence[str], golds_per_question: Sequence[Sequence[str]]) -> AnswerScores:
    """EM and F1 of many predictions; ``golds_per_question[i]`` are the aliases of question ``i``."""
    if len(predictions) != len(golds_per_question):
        raise ValueError(f"got {len(predictions)} predictions for {len(golds_per_question)} questions; "
                         "give one prediction per question")
    pairs = list(zip(predictions, golds_per_question, strict=True))
    em_values = np.array([exact_match(prediction, golds) for prediction, golds in pairs], dtype=np.float64)
    f1_values = np.array([f1(prediction, golds) for prediction, golds in pairs], dtype=np.float64)
    em_mean = 100.0 * float(em_values.mean()) if len(em_values) else 0.0
    f1_mean = 100.0 * float(f1_values.mean()) if len(f1_values) else 0.0
    return AnswerScores(em=em_mean, f1=f1_mean, em_per_example=em_values, f1_per_example=f1_values)


def contains_answer(text: str, answers: Sequence[str]) -> bool:
    """True if some alias occurs in ``text`` as a whole run of tokens, both sides SQuAD-normalized.

    This is how the shared data defines ``has_answer``; an alias that normalizes to nothing
    (for example "the") never matches.
    """
    haystack = f" {normalize_answer(text)} "
    for answer in answers:
        needle = normalize_answer(answer)
        if needle and f" {needle} " in haystack:
            return True
    return False


# The reader's one reply for "the passages do not answer this" (it learns it in `rag-mag train-reader` with
# `no_answer_share`). A word that is never an answer span, so that a reply is an abstention or an answer.
NO_ANSWER_REPLY = "unanswerable"


def is_no_answer(answer: str) -> bool:
    """True if a reader's (cleaned) answer is its abstention reply, or empty: nothing to show as an answer."""
    return normalize_answer(answer) in ("", NO_ANSWER_REPLY)


def clean_answer(text: str) -> str:
    """First non-empty line, without a leading "Answer:" and trailing period."""
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            if line.lower().startswith("answer:"):
                line = line[len("answer:"):].strip()
            return line.rstrip(".").strip()
    return ""
