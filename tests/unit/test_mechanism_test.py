"""The arithmetic of issue 68's mechanism test (scripts/mechanism_test.py) on hand-made gradients: the first-order
reading, Adam's change against torch's own AdamW step, the clip against torch's, the relative gain, the clustered
interval, the sign-flip p, and the choice of the sets."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mechanism_test.py"
spec = importlib.util.spec_from_file_location("mechanism_test", SCRIPT)
mechanism = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mechanism)


def test_the_first_order_reading_is_the_dot_product_over_the_parameters():
    grads = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    change = {"a": torch.tensor([0.5, -1.0]), "b": torch.tensor([[2.0]])}
    assert mechanism.first_order_change(grads, change) == pytest.approx(0.5 - 2.0 + 6.0)


@pytest.mark.parametrize("step", [0, 5])
def test_adams_change_is_torchs_adamw_step_from_the_same_moments(step):
    torch.manual_seed(step)  # float64: the change is read back as a difference of weights
    weight, grad = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    exp_avg, exp_avg_sq = ((torch.randn(3, 4, dtype=torch.float64) * 0.1, torch.rand(3, 4, dtype=torch.float64) * 0.01)
                           if step else (torch.zeros(3, 4, dtype=torch.float64),) * 2)
    parameter = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.AdamW([parameter], lr=1e-4, weight_decay=0.0)
    optimizer.state[parameter] = {"step": torch.tensor(float(step)), "exp_avg": exp_avg.clone(),
                                  "exp_avg_sq": exp_avg_sq.clone()}
    parameter.grad = grad.clone()
    optimizer.step()
    change = mechanism.adam_change({"w": grad}, {"w": exp_avg}, {"w": exp_avg_sq}, step, lr=1e-4)["w"]
    assert torch.allclose(change, parameter.detach() - weight, atol=1e-12, rtol=1e-7)
    if step == 0:  # the first step is lr times the gradient's sign
        assert torch.allclose(change, -1e-4 * grad.sign(), atol=1e-9)


def test_the_clip_is_torchs():
    grads = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([12.0])}
    clipped = mechanism.clip_to_norm(grads, 1.0)
    parameters = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads.values()]
    for parameter, g in zip(parameters, grads.values()):
        parameter.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    for parameter, g in zip(parameters, clipped.values()):
        assert torch.allclose(parameter.grad, g)
    assert mechanism.clip_to_norm({"a": torch.tensor([0.3])}, 1.0)["a"].item() == pytest.approx(0.3)  # under the norm


def test_the_relative_gain_is_the_mean_difference_over_vanillas_mean():
    assert mechanism.relative_gain([2.0, 4.0], [1.0, 1.0]) == pytest.approx(2.0)
    assert mechanism.relative_gain([1.0, 1.0], [1.0, 1.0]) == 0.0


def test_the_clustered_interval_resamples_states_then_batches():
    same = [[(1.3, 1.0)] * 10 for _ in range(4)]
    assert mechanism.clustered_interval(same, resamples=200) == pytest.approx((0.3, 0.3))
    # two states whose every batch gives R = 1 and R = 2: a resample's R lies between, both ends are reached
    low, high = mechanism.clustered_interval([[(2.0, 1.0)] * 5, [(3.0, 1.0)] * 5], resamples=2000)
    assert (low, high) == pytest.approx((1.0, 2.0))
    # the spread between states widens the interval beyond what the batches' own spread gives
    spread = [[(1.0 + s / 10 + b / 100, 1.0) for b in range(10)] for s in range(4)]
    pooled = [[pair for state in spread for pair in state]]
    clustered, batch_level = mechanism.clustered_interval(spread, 2000), mechanism.clustered_interval(pooled, 2000)
    assert clustered[1] - clustered[0] > batch_level[1] - batch_level[0]


def test_the_sign_flip_p_matches_the_exact_one():
    # ten equal positive differences: only the two all-equal sign vectors are as extreme, exact p = 2 / 2^10
    p = mechanism.sign_flip_p([1.0] * 10, flips=200_000)
    assert p == pytest.approx(2 / 1024, rel=0.15)
    assert mechanism.sign_flip_p([0.0, 0.0, 0.0], flips=1000) == 1.0
    assert mechanism.sign_flip_p([1.0, -1.0, 0.5, -0.5], flips=5000) == pytest.approx(1.0, abs=0.01)


def test_the_sets_keep_in_range_tasks_three_per_pattern_in_the_splits_order():
    order = [f"multi_turn_base_{i}" for i in range(7)] + ["multi_turn_miss_param_1", "multi_turn_miss_param_2"]
    rates = {order[0]: 0.5, order[1]: 1 / 6, order[2]: 5 / 6, order[3]: 0.5, order[4]: 0.5, order[5]: 0.0,
             order[6]: 1.0, order[7]: 0.5}
    truth = {task_id: ["ls()"] for task_id in order[:5]} | {order[5]: ["pwd()"], order[6]: ["pwd()"],
                                                            order[7]: [], order[8]: []}
    assert mechanism.in_range_tasks(rates, truth, order) == order[:3]  # the 4th ls() is over the cap; no decline
    assert mechanism.abstention_turns(truth, order) == order[7:]
