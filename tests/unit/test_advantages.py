"""GRPO advantages and SEAL's re-weighting (seal_lite/core/advantages.py): group advantages against a loop
reference, no signal from equal rewards, the diagnosis weight and the closed-loop utility update hand-computed,
and weights that never flip an advantage's sign."""

import math
import random

import pytest

from seal_lite.core.advantages import (
    diagnosis_weight,
    group_advantages,
    initial_utilities,
    label_shares,
    share_with_signal,
    update_utilities,
    weighted_advantages,
)


def test_only_groups_with_unequal_rewards_count_as_a_signal():
    assert share_with_signal([[0.0, 1.0, 1.0, 1.0], [1.0] * 4, [0.0] * 4, [1.0, 0.0]]) == 0.5
    assert all(a == 0 for a in group_advantages([1.0] * 4))  # why an equal group carries none


def test_group_advantages_against_reference():
    rng = random.Random(0)
    for _ in range(50):
        rewards = [float(rng.random() < 0.5) for _ in range(rng.randint(2, 8))]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        assert group_advantages(rewards) == pytest.approx([(r - mean) / (std + 1e-6) for r in rewards])


def test_equal_rewards_give_zero_advantage():
    assert group_advantages([0.0, 0.0, 0.0, 0.0]) == [0.0] * 4
    assert group_advantages([1.0, 1.0]) == [0.0, 0.0]


def test_diagnosis_weight_hand_computed():
    rho = initial_utilities()
    # turns: state_mismatch, response_mismatch, pass, checker_error (excluded) -> shares 1/3 each
    labels = ["state_mismatch", "response_mismatch", "pass", "checker_error"]
    assert label_shares(labels) == pytest.approx({"state_mismatch": 1 / 3, "response_mismatch": 1 / 3, "pass": 1 / 3})
    assert diagnosis_weight(labels, rho) == pytest.approx((1.0 + 0.9 + 1.0) / 3)
    # spurious (2.0) + empty (1.5) -> 1.75; clipping at 2.0 and 0.5
    assert diagnosis_weight(["spurious_tool_call", "empty_turn_model_response"], rho) == pytest.approx(1.75)
    assert diagnosis_weight(["spurious_tool_call"], {**rho, "spurious_tool_call": 3.0}) == 2.0
    assert diagnosis_weight(["instance_mismatch"], {**rho, "instance_mismatch": 0.1}) == 0.5
    assert diagnosis_weight(["gt_error", "checker_error"], rho) == 1.0
    assert diagnosis_weight([], rho) == 1.0


def test_weighted_advantages_never_flip_signs():
    advantages = [1.5, -0.5, 0.0, -1.0]
    weights = [2.0, 0.5, 1.7, 1.2]
    assert weighted_advantages(advantages, weights) == pytest.approx([3.0, -0.25, 0.0, -1.2])
    assert weighted_advantages(advantages, weights, "positive") == pytest.approx([3.0, -0.5, 0.0, -1.0])
    assert weighted_advantages(advantages, weights, "negative") == pytest.approx([1.5, -0.25, 0.0, -1.2])
    with pytest.raises(ValueError):
        weighted_advantages(advantages, weights, "some")


def test_closed_loop_update_hand_computed():
    rho = initial_utilities()
    counts = {"state_mismatch": 32, "pass": 32, "checker_error": 5}
    mean_reward = {"state_mismatch": 0.25, "pass": 0.75}
    updated = update_utilities(rho, counts, mean_reward)
    # N = 64 (checker_error excluded); target = 1.0 * (1 + 0.5 * 0.75 * 1) = 1.375; rho = .75*1 + .25*1.375
    assert updated["state_mismatch"] == pytest.approx(0.75 + 0.25 * 1.375)
    assert updated["pass"] == 1.0
    assert updated["spurious_tool_call"] == pytest.approx(2.0)  # no occurrences: target is the base


def test_closed_loop_keeps_the_recipe_bases():
    """grpo.utilities sets b_z: rho starts there, the target scales it, and with no occurrences rho stays there
    instead of decaying back to §3's table; pass keeps its configured base."""
    bases = initial_utilities({"spurious_tool_call": 1.2, "state_mismatch": 0.8, "pass": 0.9})
    rho = dict(bases)
    for _ in range(20):
        rho = update_utilities(rho, {"state_mismatch": 32, "pass": 32}, {"state_mismatch": 0.25}, bases)
    assert rho["spurious_tool_call"] == pytest.approx(1.2)  # the default table says 2.0
    assert rho["pass"] == 0.9
    assert rho["state_mismatch"] == pytest.approx(0.8 * 1.375, rel=1e-3)  # converges to its own target
    assert rho["empty_turn_model_response"] == pytest.approx(1.5)  # not overridden: the table's base
