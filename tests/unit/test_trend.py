"""The reward trend test (seal_lite/core/trend.py): steps as units, against independent computations."""

import itertools
import math

import pytest

from seal_lite.core.trend import mann_kendall_s, reward_trend


def kendall_exact_p(values: list[float]) -> float:
    """One-sided p of a rise without ties, from the Mahonian numbers (orderings of n items by inversion count):
    S = C(n, 2) - 2 x inversions, so P(S >= s) = P(inversions <= observed)."""
    n = len(values)
    counts = [1]  # orderings of 1 item: one, with 0 inversions
    for size in range(2, n + 1):  # the new largest item lands at one of `size` places, adding 0..size-1 inversions
        counts = [sum(counts[k - added] for added in range(size) if 0 <= k - added < len(counts))
                  for k in range(len(counts) + size - 1)]
    inversions = sum(values[i] > values[j] for i, j in itertools.combinations(range(n), 2))
    return sum(counts[: inversions + 1]) / math.factorial(n)


def test_s_and_tau_match_kendalls_tau_a():
    values = [0.25, 0.5, 0.5, 0.375, 0.75, 1.0]
    pairs = list(itertools.combinations(range(len(values)), 2))
    by_hand = sum((values[j] > values[i]) - (values[j] < values[i]) for i, j in pairs)
    assert mann_kendall_s(values) == by_hand == 10  # 12 rising pairs, 2 falling, 1 tie
    assert reward_trend(values).tau == pytest.approx(by_hand / math.comb(6, 2))


def test_the_exact_p_value_counts_the_orderings_at_least_as_rising():
    assert reward_trend([0.1, 0.2, 0.3, 0.4]).p_rise == pytest.approx(1 / 24)  # only the sorted order
    assert reward_trend([0.4, 0.3, 0.2, 0.1]).p_rise == 1.0  # a fall: every ordering rises at least as much
    assert reward_trend([0.5] * 6).p_rise == 1.0 and reward_trend([0.5] * 6).tau == 0.0
    assert reward_trend([0.2, 0.9, 0.4]) is None  # too few steps
    # without ties, Kendall's exact test
    values = [0.3, 0.1, 0.4, 0.6, 0.5, 0.9, 0.8]
    expected = kendall_exact_p(values)
    assert reward_trend(values).p_rise == pytest.approx(expected)


def test_beyond_eight_steps_the_p_value_is_sampled_and_seeded():
    rising = [0.2, 0.3, 0.25, 0.5, 0.45, 0.6, 0.7, 0.65, 0.9, 0.95]
    trend = reward_trend(rising)
    expected = kendall_exact_p(rising)
    assert trend.p_rise == pytest.approx(expected, abs=0.002) and trend == reward_trend(rising)
    assert "told apart from chance" in trend.describe() and "not" not in trend.describe()
    flat = reward_trend([0.5, 0.25, 0.5, 0.75, 0.25, 0.5, 0.75, 0.5, 0.25, 0.5])
    assert flat.p_rise > 0.05 and "not told apart" in flat.describe()
