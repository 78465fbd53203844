"""Turns any accepted call passes (seal_lite/step/uninformative.py), on real BFCL tasks and bfcl-eval's checker, with
hand-checked expectations; and the screen that leaves their tasks out."""

from seal_lite.core.types import NoProgress
from seal_lite.envs.bfcl import load_tasks
from seal_lite.runs.tasks import without_uninformative
from seal_lite.step.uninformative import (
    WRONG_TEXT,
    any_call_turns,
    argument_blind_turns,
    passes_with,
    with_wrong_arguments,
    wrong_value,
)


def task(task_id: str):
    return load_tasks([task_id])[0]


def test_adding_a_stock_the_watchlist_already_holds_passes_with_any_call():
    """multi_turn_base_142: ZETA is in the initial watchlist, so the first turn cannot fail with a call."""
    zeta = task("multi_turn_base_142")
    assert zeta.ground_truth[0] == ["add_to_watchlist(stock='ZETA')"]
    for calls in (["add_to_watchlist(stock='ZETA')"], ["add_to_watchlist(stock='Zeta Corp')"], ["get_watchlist()"]):
        assert passes_with(zeta, 0, calls)
    assert not passes_with(zeta, 0, ["get_stock_info(symbol='NVDA')"])  # a call that returns something else fails
    assert any_call_turns(zeta.truncated(1)) == [0] and argument_blind_turns(zeta.truncated(1)) == [0]


def test_a_turn_that_needs_its_call_is_not_flagged():
    first = task("multi_turn_base_0").truncated(1)
    assert passes_with(first, 0, first.ground_truth[0])
    assert any_call_turns(first) == [] and argument_blind_turns(first) == []


def test_a_listing_whose_hidden_flag_changes_nothing_is_argument_blind_but_needs_its_tool():
    """multi_turn_base_43: "list the hidden ones too" in a folder without hidden files: ls(a=False) passes, pwd() not."""
    listing = task("multi_turn_base_43").truncated(1)
    assert listing.ground_truth[0] == ["ls(a=True)"] and with_wrong_arguments(["ls(a=True)"]) == ["ls(a=False)"]
    assert argument_blind_turns(listing) == [0] and any_call_turns(listing) == []


def test_later_turns_are_tested_after_the_ground_truth_of_the_earlier_ones():
    whole = task("multi_turn_base_33")
    flagged = any_call_turns(whole)
    assert flagged and 0 not in flagged  # a later turn, reached through the earlier turns' right calls
    assert any_call_turns(whole.truncated(flagged[0])) == []


def test_wrong_values_keep_their_type_and_differ():
    for value in (True, 3, 2.5, "ZETA", ["a", 1], {"k": "v"}, [], {}, None):
        wrong = wrong_value(value)
        assert wrong != value and (value is None or type(wrong) is type(value))
    assert with_wrong_arguments(["get_watchlist()", "pwd()"]) is None  # nothing to get wrong
    assert with_wrong_arguments(["cd(folder='x')"]) == [f"cd(folder='{WRONG_TEXT}')"]


class Recorder(NoProgress):
    def tasks_excluded(self, task_ids, reason):
        self.excluded = (task_ids, reason)


def test_a_screen_leaves_out_the_tasks_any_call_passes_and_says_so():
    slice_ = {t.id: t.truncated(1) for t in load_tasks(["multi_turn_base_0", "multi_turn_base_142",
                                                         "multi_turn_base_43", "multi_turn_base_103"])}
    progress = Recorder()
    kept = without_uninformative(slice_, progress)
    assert list(kept) == ["multi_turn_base_0", "multi_turn_base_43"]
    assert progress.excluded[0] == ["multi_turn_base_142", "multi_turn_base_103"]
    assert "any accepted call passes" in progress.excluded[1]
