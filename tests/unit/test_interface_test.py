"""The arithmetic of the interface test (scripts/interface_test.py, docs/results/interface-test.md) on hand-made
records: the learning signal of a task's plays, what counts as a failed first message, the 2x2's main effects and
interaction against their definitions, the tasks left out, and a summary that prints no figure before every planned
record exists."""

import json
from types import SimpleNamespace

import pytest

from tests.helpers import load_script

interface_test = load_script("interface_test")


@pytest.mark.parametrize("passes", range(13))
def test_the_learning_signal_is_the_share_of_four_sample_subsets_with_unequal_rewards(passes):
    import itertools

    rewards = [1] * passes + [0] * (12 - passes)
    subsets = list(itertools.combinations(rewards, 4))
    assert len(subsets) == 495
    expected = sum(len(set(subset)) > 1 for subset in subsets) / 495
    assert interface_test.learning_signal(passes, 12) == pytest.approx(expected)


def test_a_first_message_failed_when_any_of_its_calls_did_not_run_cleanly():
    def turn(*steps):
        return SimpleNamespace(outcomes_per_step=[[SimpleNamespace(status=SimpleNamespace(value=s)) for s in step]
                                                  for step in steps])

    assert interface_test.first_message_failed([turn(["ok", "parse_error"], ["ok"])])
    assert interface_test.first_message_failed([turn(["tool_error"])])
    assert not interface_test.first_message_failed([turn(["ok"], ["unknown_tool"])])  # its second failed
    assert not interface_test.first_message_failed([turn()])  # a text answer: no call, no outcome


def arms_of(values: dict[str, list[float]]) -> dict:
    return {arm: {f"t{i}": {"pass_rate": v, "signal": v, "recovery": None if v < 0 else v}
                  for i, v in enumerate(column)} for arm, column in values.items()}


def test_main_effects_and_interaction_follow_their_definitions_over_tasks():
    values = {"plain": [0.1, 0.2, 0.5], "err": [0.3, 0.2, 0.6], "cap": [0.1, 0.4, 0.5], "both": [0.5, 0.4, 0.9]}
    effects = interface_test.main_effects(arms_of(values), "pass_rate")
    rows = list(zip(*(values[a] for a in ("plain", "err", "cap", "both"))))
    err = [(e + b - p - c) / 2 for p, e, c, b in rows]
    cap = [(c + b - p - e) / 2 for p, e, c, b in rows]
    both = [(b - c) - (e - p) for p, e, c, b in rows]
    assert effects["tasks"] == 3
    assert effects["phi_err"]["mean"] == pytest.approx(sum(err) / 3)
    assert effects["phi_cap"]["mean"] == pytest.approx(sum(cap) / 3)
    assert effects["interaction"]["mean"] == pytest.approx(sum(both) / 3)
    low, high = effects["phi_err"]["interval"]
    assert min(err) <= low <= sum(err) / 3 <= high <= max(err)
    left = interface_test.main_effects(arms_of(values), "pass_rate", leave_out=["t2"])
    assert left["tasks"] == 2 and left["phi_err"]["mean"] == pytest.approx(sum(err[:2]) / 2)


def test_a_task_without_a_failed_first_message_in_some_arm_leaves_recovery_alone():
    values = {"plain": [0.5, -1], "err": [0.6, 0.2], "cap": [0.5, 0.1], "both": [0.7, 0.3]}  # -1: no recovery value
    assert interface_test.main_effects(arms_of(values), "recovery")["tasks"] == 1


def test_the_sign_flip_p_is_one_for_no_difference_and_small_for_a_consistent_one():
    assert interface_test.sign_flip_p([0.0] * 10) == 1.0
    assert interface_test.sign_flip_p([0.1] * 12, flips=20_000) < 0.001
    assert interface_test.sign_flip_p([0.1, -0.1] * 6, flips=20_000) == pytest.approx(1.0)


def test_the_summary_prints_no_figure_before_every_planned_record_exists(tmp_path, capsys):
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "pool.txt").write_text("a\nb\n")
    (sets / "probe.txt").write_text("p\n")
    records = tmp_path / "records"
    part_a = records / "part-a"
    part_a.mkdir(parents=True)

    def write(arm: str, tasks: list[str]) -> None:
        plays = [{"sample": i, "reward": float(i % 2), "labels": ["pass" if i % 2 else "response_mismatch"],
                  "causes": [None], "first_failed": i % 3 == 0, "model_calls": 1} for i in range(4)]
        part_a.joinpath(f"{arm}.json").write_text(json.dumps({
            "arm": arm, "tasks": {t: {"plays": plays, "seconds": 8.0} for t in tasks},
            "machine": "2 cores, test", "dtype": "bfloat16"}))

    design = interface_test.Design(records=records, sets=sets, samples=4)
    for arm in interface_test.ARMS:
        write(arm, ["a"])
    interface_test.summary(design)
    partial = capsys.readouterr().out
    assert "in progress" in partial and "phi_err" not in partial
    for arm in interface_test.ARMS:
        write(arm, ["a", "b"])
    interface_test.summary(design)
    done = capsys.readouterr().out
    assert "phi_err: +0.000" in done and "2.00 s a play" in done


@pytest.mark.parametrize("low, high, verdict", [
    (-0.10, 0.12, "within"), (0.02, 0.40, "lower end above 0"), (-0.40, -0.02, "upper end below 0"),
    (-0.30, 0.30, "inconclusive"), (-0.10, 0.145, "indeterminate"), (0.005, 0.30, "indeterminate"),
    (-0.159, 0.10, "indeterminate")])
def test_the_decision_rule_and_its_indeterminate_band(low, high, verdict):
    assert interface_test.decision(low, high).startswith(verdict)


def batch(state: int, plain: float, interface: float) -> dict:
    return {"state": state, "arms": {"plain": {"delta": {"J1": plain}}, "interface": {"delta": {"J1": interface}}}}


def test_t_is_the_mean_of_the_entering_states_relative_gains_and_a_state_without_progress_is_left_out():
    moving = [batch(0, plain, plain * 1.2 + noise) for plain, noise in zip([1.0, 1.1, 0.9, 1.05, 0.95, 1.0],
                                                                             [0.01, -0.02, 0.0, 0.02, -0.01, 0.0])]
    still = [batch(1, plain, plain + 0.5) for plain in (0.2, -0.2, 0.1, -0.1, 0.15, -0.15)]  # no progress
    effect = interface_test.relative_effect({0: moving, 1: still}, "J1", resamples=5_000)
    plain = [b["arms"]["plain"]["delta"]["J1"] for b in moving]
    differences = [b["arms"]["interface"]["delta"]["J1"] - p for b, p in zip(moving, plain)]
    assert effect["per_state"][0]["enters"] and not effect["per_state"][1]["enters"]
    assert effect["T"] == pytest.approx(sum(differences) / sum(plain))
    low, high = effect["interval"]
    assert low < effect["T"] < high and low > 0.1
    assert effect["p"] < 0.05
    assert interface_test.relative_effect({1: still}, "J1", resamples=1_000)["T"] is None
