"""The one-standard-error rule that picks best/ among a run's validated checkpoints."""

import pytest

from rag_mag.retriever.training.selection import paired_standard_error, within_one_standard_error


def test_a_later_best_within_noise_loses_to_the_earlier_checkpoint():
    # step 200 is best by 0.3 on average, but the per-query differences are +-6 (standard error 0.35)
    step_100 = [50.0 + (i % 7) for i in range(300)]
    step_200 = [v + (6.3 if i % 2 else -5.7) for i, v in enumerate(step_100)]
    start = [v - 10.0 for v in step_100]  # the untrained model: clearly worse
    chosen, band = within_one_standard_error({0: start, 100: step_100, 200: step_200})
    assert (chosen, band) == (100, [100, 200])


def test_a_clear_gain_is_taken_and_the_untrained_model_kept_when_nothing_is_clear():
    start = [float(i % 5) for i in range(100)]
    clearly_better = [v + 1.0 for v in start]  # the same +1 on every query: standard error 0
    assert within_one_standard_error({0: start, 50: clearly_better}) == (50, [50])
    noisy = [v + (5.0 if i % 2 else -4.9) for i, v in enumerate(start)]
    assert within_one_standard_error({0: start, 50: noisy})[0] == 0


def test_the_standard_error_is_that_of_the_paired_differences():
    first, second = [1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 2.0, 4.0]  # differences 1, 0, 1, 0
    assert paired_standard_error(first, second) == pytest.approx(0.57735 / 2, rel=1e-4)
    assert paired_standard_error([1.0], [0.0]) == 0.0


def test_checkpoints_scored_on_different_queries_are_refused():
    with pytest.raises(ValueError, match="different numbers of queries"):
        within_one_standard_error({0: [1.0, 2.0], 10: [1.0]})
