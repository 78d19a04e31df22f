"""Statistics of per-question values: bootstrap confidence intervals and a paired significance test.

All functions take one value per question (EM in {0, 1}, F1 or recall in [0, 1], ...) and are
seeded, so a report is reproducible. Resampling is vectorized with numpy, in blocks to bound memory.

* ``bootstrap_ci(values)``: percentile bootstrap CI of the mean (resample questions with replacement).
* ``paired_permutation_test(a, b)``: two-sided sign-flip test of "system A and system B have the same
  mean on these questions". Under that null the sign of each per-question difference ``a_i - b_i`` is
  exchangeable, so the p-value is the share of random sign flips whose mean difference is at least
  as far from 0 as the observed one, with the usual +1 correction: ``p = (1 + hits) / (1 + n)``.
  Identical systems give p = 1.
* ``compare_paired(a, b)``: the means, their difference with a bootstrap CI, and the p-value.
* ``holm_adjust(p_values)``: Holm's step-down adjustment for a family of such tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_PERMUTATIONS = 10000
_BLOCK_ELEMENTS = 4_000_000  # values resampled at once (32 MB of float64)


def _as_values(values: Sequence[float] | np.ndarray, name: str = "values") -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one value per question (1-D), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} holds NaN or infinite values; score every question with a finite number")
    return array


def _blocks(total: int, per_item: int) -> list[int]:
    size = max(1, _BLOCK_ELEMENTS // max(per_item, 1))
    return [min(size, total - start) for start in range(0, total, size)]


def bootstrap_means(values: Sequence[float] | np.ndarray, n_resamples: int = DEFAULT_RESAMPLES,
                    seed: int = 0) -> np.ndarray:
    """Means of ``n_resamples`` bootstrap resamples of ``values`` (shape ``(n_resamples,)``)."""
    array = _as_values(values)
    if len(array) == 0:
        raise ValueError("cannot bootstrap an empty set of values")
    rng = np.random.default_rng(seed)
    means = [array[rng.integers(0, len(array), size=(size, len(array)))].mean(axis=1)
             for size in _blocks(n_resamples, len(array))]
    return np.concatenate(means)


def bootstrap_ci(values: Sequence[float] | np.ndarray, confidence: float = 0.95,
                 n_resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean, in the units of ``values``."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    means = bootstrap_means(values, n_resamples=n_resamples, seed=seed)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> np.ndarray:
    first, second = _as_values(a, "a"), _as_values(b, "b")
    if first.shape != second.shape:
        raise ValueError(f"a paired test needs the same questions on both sides: got {len(first)} and "
                         f"{len(second)} values")
    if len(first) == 0:
        raise ValueError("a paired test needs at least one question")
    return first - second


def paired_permutation_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                            n_permutations: int = DEFAULT_PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided p-value of the sign-flip test on ``a_i - b_i`` (see the module docstring)."""
    differences = _paired(a, b)
    observed = abs(differences.mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for size in _blocks(n_permutations, len(differences)):
        signs = rng.integers(0, 2, size=(size, len(differences)), dtype=np.int8) * 2 - 1
        permuted = np.abs(signs @ differences) / len(differences)
        # A small tolerance so that ties (e.g. all differences zero) count as "at least as extreme".
        hits += int(np.count_nonzero(permuted >= observed - 1e-12))
    return (1 + hits) / (1 + n_permutations)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of p-values from one family of tests, in their input order.

    Use it where one question is asked of several comparisons (does a strategy beat cosine at any of its
    checkpoints?): an adjusted p below alpha keeps the chance of any false "yes" in the family under alpha.
    """
    values = [float(p) for p in p_values]
    if any(not 0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie in [0, 1]: got {values}")
    adjusted = [0.0] * len(values)
    running = 0.0
    for rank, index in enumerate(sorted(range(len(values)), key=values.__getitem__)):
        running = max(running, min(1.0, (len(values) - rank) * values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class PairedComparison:
    """System A against system B on the same questions, in the units of the inputs."""

    n: int
    mean_a: float
    mean_b: float
    delta: float
    delta_ci: tuple[float, float]
    p_value: float

    def to_dict(self, scale: float = 1.0) -> dict:
        """JSON-ready; ``scale=100`` turns [0, 1] values into the report's [0, 100] (p stays as is)."""
        data = asdict(self)
        for key in ("mean_a", "mean_b", "delta"):
            data[key] = data[key] * scale
        data["delta_ci"] = [self.delta_ci[0] * scale, self.delta_ci[1] * scale]
        return data


def compare_paired(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, confidence: float = 0.95,
                   n_resamples: int = DEFAULT_RESAMPLES, n_permutations: int = DEFAULT_PERMUTATIONS,
                   seed: int = 0) -> PairedComparison:
    """Mean difference ``a - b`` with a paired bootstrap CI and the permutation-test p-value."""
    differences = _paired(a, b)
    first, second = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return PairedComparison(
        n=len(differences),
        mean_a=float(first.mean()),
        mean_b=float(second.mean()),
        delta=float(differences.mean()),
        delta_ci=bootstrap_ci(differences, confidence=confidence, n_resamples=n_resamples, seed=seed),
        p_value=paired_permutation_test(a, b, n_permutations=n_permutations, seed=seed),
    )
