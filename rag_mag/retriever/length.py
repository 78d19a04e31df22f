"""How a retriever's document norm follows text length, and a correction for it.

Mean pooling averages fewer token vectors in a short text, so the pooled vector cancels less and is longer: with
MiniLM, chunks of 5-15 words have about twice the median norm of an index of real files (eval/README.md, "Real
documents"). Under qnorm and dot a document's norm multiplies every score it gets, so a short chunk ("See also
<url>.") outranks the passage that answers. That is length, not relevance.

``fit_length`` measures the effect for one checkpoint: it crops reference passages to several lengths, so that the
same texts are seen long and short, and fits ``log norm = intercept + slope * log words`` by least squares over
the crops (``slope`` < 0 when short texts are longer vectors). ``length_factors`` gives each document the factor
``(words / reference_words) ** -slope`` that takes the fitted trend out of its raw vector: a text of
``reference_words`` words (the length the retriever was trained on) keeps its vector, a shorter one is scaled down
by exactly what its length alone would add. What stays of the norm is the part the length does not explain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

REFERENCE_WORDS = 100  # the training passages' length (Wikipedia passages of about 100 words)
CROP_WORDS = (4, 8, 16, 32, 64)
REFERENCE_PASSAGES = 200


@dataclass(frozen=True)
class LengthFit:
    """``log norm = intercept + slope * log words`` of one checkpoint's raw document vectors."""

    slope: float
    intercept: float
    samples: int
    reference_words: int = REFERENCE_WORDS

    def to_dict(self) -> dict:
        return {"slope": self.slope, "intercept": self.intercept, "samples": self.samples,
                "reference_words": self.reference_words}


def length_crops(passages: Sequence[str], crops: Sequence[int] = CROP_WORDS,
                 limit: int = REFERENCE_PASSAGES) -> tuple[list[str], list[int]]:
    """Each of the first ``limit`` passages whole and cut to its first ``crops`` words (where it is longer):
    the texts and their word counts."""
    texts, words = [], []
    for passage in passages[:limit]:
        tokens = passage.split()
        for size in [*sorted(c for c in crops if c < len(tokens)), len(tokens)]:
            if size:
                texts.append(" ".join(tokens[:size]))
                words.append(size)
    return texts, words


def fit_length(raw_norms: Sequence[float], words: Sequence[int]) -> LengthFit:
    """Least squares of log norm on log words; at least two distinct lengths are needed."""
    norms, counts = np.asarray(raw_norms, dtype=float), np.asarray(words, dtype=float)
    if len(norms) != len(counts) or len(set(counts.tolist())) < 2 or (norms <= 0).any() or (counts <= 0).any():
        raise ValueError("fit_length needs positive norms and word counts of at least two distinct lengths")
    slope, intercept = np.polyfit(np.log(counts), np.log(norms), 1)
    return LengthFit(slope=float(slope), intercept=float(intercept), samples=len(norms))


def length_factors(words: Sequence[int], fit: LengthFit) -> np.ndarray:
    """The factor of each document's raw vector: ``(words / reference_words) ** -slope`` (shape ``(n,)``)."""
    counts = np.maximum(np.asarray(words, dtype=float), 1.0)
    return (counts / fit.reference_words) ** (-fit.slope)
