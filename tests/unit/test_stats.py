"""Bootstrap confidence intervals and the paired permutation test."""

from __future__ import annotations

import numpy as np
import pytest

from rag_mag.bench.stats import bootstrap_ci, bootstrap_means, compare_paired, holm_adjust, paired_permutation_test


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small = (rng.random(100) < 0.4).astype(float)
    large = (rng.random(10000) < 0.4).astype(float)
    low, high = bootstrap_ci(small, seed=1)
    assert low < small.mean() < high
    large_low, large_high = bootstrap_ci(large, seed=1)
    assert (large_high - large_low) < (high - low) / 5
    # normal approximation of a proportion: half-width about 1.96 * sqrt(p (1 - p) / n)
    assert (large_high - large_low) / 2 == pytest.approx(1.96 * np.sqrt(0.24 / 10000), rel=0.15)


def test_bootstrap_is_seeded_and_constant_values_have_zero_width():
    values = np.linspace(0, 1, 50)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(np.full(30, 0.7)) == pytest.approx((0.7, 0.7))
    assert bootstrap_means(values, n_resamples=123).shape == (123,)


def test_bootstrap_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([0.1, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([0.1, 0.2], confidence=95)


def test_identical_systems_give_p_one():
    values = (np.random.default_rng(2).random(300) < 0.5).astype(float)
    assert paired_permutation_test(values, values) == 1.0
    comparison = compare_paired(values, values)
    assert comparison.delta == 0.0 and comparison.p_value == 1.0 and comparison.delta_ci == (0.0, 0.0)


def test_clearly_different_systems_give_small_p():
    rng = np.random.default_rng(3)
    a = (rng.random(500) < 0.6).astype(float)
    b = (rng.random(500) < 0.3).astype(float)
    comparison = compare_paired(a, b, n_permutations=2000)
    assert comparison.p_value < 0.001
    assert comparison.delta_ci[0] > 0.0
    assert comparison.delta == pytest.approx(a.mean() - b.mean())


def test_noise_only_difference_is_not_significant():
    rng = np.random.default_rng(4)
    base = rng.random(400)
    a = base + rng.normal(0, 0.01, 400)
    b = base + rng.normal(0, 0.01, 400)
    assert paired_permutation_test(a, b, n_permutations=2000) > 0.05


def test_pairing_matters():
    # Per-question differences are all +0.05: highly significant when paired, even though the
    # spread between questions dwarfs it.
    base = np.linspace(0, 1, 200)
    assert paired_permutation_test(base + 0.05, base, n_permutations=1000) < 0.01


def test_paired_test_needs_the_same_questions():
    with pytest.raises(ValueError, match="same questions"):
        compare_paired([1.0, 0.0], [1.0])


def test_to_dict_scales_to_percent():
    comparison = compare_paired([1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], n_permutations=200)
    data = comparison.to_dict(scale=100)
    assert data["delta"] == pytest.approx(50.0)
    assert data["p_value"] == comparison.p_value
    assert len(data["delta_ci"]) == 2


def test_holm_adjust_multiplies_by_rank_and_stays_monotone():
    # sorted 0.01, 0.02, 0.04 -> 3 x 0.01, 2 x 0.02, 1 x 0.04, each at least the one before; input order kept
    assert holm_adjust([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm_adjust([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # monotone: 0.5 may not fall below 2 x 0.4
    assert holm_adjust([0.9, 0.8, 0.7]) == pytest.approx([1.0, 1.0, 1.0])  # capped at 1
    assert holm_adjust([0.03]) == [0.03] and holm_adjust([]) == []
    with pytest.raises(ValueError, match="must lie in"):
        holm_adjust([0.2, 1.5])
