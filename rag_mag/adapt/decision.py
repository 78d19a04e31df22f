"""Whether a trained retriever replaces the base: a pure function of per-question test scores.

The rule, all on the test split's nDCG@10 (one value per question, in [0, 1]):

1. every trained strategy is compared with the untrained base on the same questions (``compare_paired``: the
   mean difference with a paired bootstrap 95% interval, and the two-sided paired permutation p-value);
2. the p-values are Holm-adjusted over the trained strategies (one family: "does any strategy beat the base?"),
   so trying more strategies does not raise the chance of publishing one that only won by noise;
3. the strategy with the highest mean is the candidate, and it is published only if its mean is higher than
   the base's *and* its adjusted p-value is below ``ALPHA``. Requiring the direction and a two-sided p below
   0.05 is a one-sided test at 0.025: stricter, never looser, than a one-sided test at 0.05.

Otherwise the base is kept, with the reason: not better, or better but not significantly. A trained retriever
that is worse than the base on the test split is never published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rag_mag.bench.stats import compare_paired, holm_adjust

ALPHA = 0.05
METRIC = "ndcg@10"


@dataclass(frozen=True)
class Comparison:
    """A trained strategy against the base on the same test questions, nDCG@10 in [0, 100]."""

    strategy: str
    n: int
    mean: float
    base_mean: float
    delta: float
    delta_ci: tuple[float, float]
    p_value: float  # two-sided paired permutation test
    p_holm: float  # Holm-adjusted over the trained strategies

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "n": self.n, "mean": self.mean, "base_mean": self.base_mean,
                "delta": self.delta, "delta_ci": list(self.delta_ci), "p_value": self.p_value,
                "p_holm": self.p_holm}


@dataclass(frozen=True)
class Decision:
    published: str | None  # the strategy to publish, or None: the base is kept
    candidate: str | None  # the trained strategy with the highest mean
    reason: str
    comparisons: dict[str, Comparison]

    def to_dict(self) -> dict:
        return {"published": self.published, "candidate": self.candidate, "base_kept": self.published is None,
                "reason": self.reason, "metric": METRIC, "alpha": ALPHA, "holm_adjusted": True,
                "test": "mean higher than the base's and Holm-adjusted two-sided paired permutation p < alpha",
                "comparisons": {name: c.to_dict() for name, c in self.comparisons.items()}}


def compare_all(base: Sequence[float], trained: Mapping[str, Sequence[float]], seed: int = 0,
                ) -> dict[str, Comparison]:
    """Each trained strategy against the base (values in [0, 1]; the comparisons in [0, 100])."""
    names = list(trained)
    raw = {name: compare_paired(trained[name], base, seed=seed) for name in names}
    adjusted = holm_adjust([raw[name].p_value for name in names]) if names else []
    return {name: Comparison(strategy=name, n=raw[name].n, mean=100.0 * raw[name].mean_a,
                             base_mean=100.0 * raw[name].mean_b, delta=100.0 * raw[name].delta,
                             delta_ci=(100.0 * raw[name].delta_ci[0], 100.0 * raw[name].delta_ci[1]),
                             p_value=raw[name].p_value, p_holm=p_holm)
            for name, p_holm in zip(names, adjusted, strict=True)}


def decide(base: Sequence[float], trained: Mapping[str, Sequence[float]], alpha: float = ALPHA,
           seed: int = 0) -> Decision:
    """The rule of the module docstring. ``base`` and each of ``trained``: per-question nDCG@10 in [0, 1], on
    the same questions in the same order."""
    comparisons = compare_all(base, trained, seed=seed)
    if not comparisons:
        return Decision(None, None, "base kept: no trained strategy to compare", comparisons)
    names = list(comparisons)
    candidate = max(names, key=lambda name: (comparisons[name].mean, -names.index(name)))  # ties: the first
    best = comparisons[candidate]
    figures = (f"test nDCG@10 {best.mean:.1f} against the base's {best.base_mean:.1f}, {best.delta:+.1f} "
               f"(95% CI {best.delta_ci[0]:+.1f} to {best.delta_ci[1]:+.1f}), p {best.p_value:.3g}, "
               f"{best.p_holm:.3g} after Holm's adjustment over {len(names)} strateg"
               f"{'y' if len(names) == 1 else 'ies'}, {best.n} questions")
    if best.delta <= 0:
        reason = f"base kept: not better; the best trained strategy, {candidate}, is not above the base ({figures})"
        return Decision(None, candidate, reason, comparisons)
    if not best.p_holm < alpha:
        reason = (f"base kept: not significant; {candidate} is above the base but not significantly so "
                  f"(needs p < {alpha:g}; {figures})")
        return Decision(None, candidate, reason, comparisons)
    return Decision(candidate, candidate, f"published {candidate}: {figures}", comparisons)
