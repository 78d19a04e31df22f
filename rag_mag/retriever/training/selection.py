"""Which validated checkpoint of a run becomes ``best/``: the one-standard-error rule.

The validation set is small (300 queries by default), so checkpoints whose validation nDCG@10 differ by
less than the noise of that estimate cannot be told apart. The raw maximum then tends to publish a later,
longer-trained checkpoint whose edge is noise, while each further step moves the encoder away from the
general-purpose geometry it started with, a loss an in-domain validation set cannot see (the crossover
study measured it on MuSiQue; eval/README.md).

The one-standard-error rule (Breiman et al., 1984; Hastie, Tibshirani and Friedman, *The Elements of
Statistical Learning*, section 7.10) takes instead the *earliest* checkpoint whose mean is within one
standard error of the best checkpoint's. The standard error is that of the paired per-query differences
against the best checkpoint, so what the two checkpoints get right in common does not count as noise.
Step 0, the model training started from, is a candidate too: a run whose gain stays within noise
publishes the model it started from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RULES = ("one_se", "max")


def paired_standard_error(first: Sequence[float], second: Sequence[float]) -> float:
    """The standard error of the mean of the per-query differences ``first - second``."""
    differences = np.asarray(first, dtype=float) - np.asarray(second, dtype=float)
    if differences.size < 2:
        return 0.0
    return float(differences.std(ddof=1) / np.sqrt(differences.size))


def within_one_standard_error(scores: Mapping[int, Sequence[float]]) -> tuple[int, list[int]]:
    """``(chosen, band)`` for per-query validation scores by step (every step scored on the same queries).

    ``band``: the steps whose mean is at least the best mean minus the paired standard error of their
    difference from the best step, in step order; ``chosen``: the first of them.
    """
    if not scores:
        raise ValueError("no validated checkpoints to choose from")
    sizes = {len(values) for values in scores.values()}
    if len(sizes) != 1:
        raise ValueError(f"checkpoints were validated on different numbers of queries: {sorted(sizes)}")
    means = {step: float(np.mean(values)) for step, values in scores.items()}
    best = max(sorted(means), key=lambda step: means[step])  # the earliest of equal maxima
    band = [step for step in sorted(scores)
            if means[step] >= means[best] - paired_standard_error(scores[best], scores[step])]
    return band[0], band
