"""A user's tools as an environment (seal_lite/envs/python_tools.py), on small classes and the shipped library.

Tool docs come from type hints and docstrings; a tool class or task list seal-lite cannot use is refused with a
message naming the problem; the verdict and the labels follow BFCL's checker rules on the class's instances; model
text is parsed, never executed; data.environment finds shipped and user environments. The expected states below
come from the Library's rules (seal_lite/envs/library.py): a member with a fine cannot borrow, a book with no copy
on the shelf cannot be lent, paying lowers the fine.
"""

import dataclasses
import json
import sys
from typing import Literal

import pytest

from seal_lite.core.calls import ToolCall
from seal_lite.core.errors import ConfigError
from seal_lite.core.recipe import RecipeError, load_recipe
from seal_lite.core.types import CallStatus
from seal_lite.envs import library
from seal_lite.envs.bfcl import BFCL
from seal_lite.envs.python_tools import ToolEnvironment, ToolEnvironmentError, tool_docs
from seal_lite.envs.registry import EnvironmentNotFound, environment_of, find_environment, replay_calls
from seal_lite.runs import preflight
from seal_lite.step.verifier import diagnose_episode

STATE_MISMATCH = "multi_turn:instance_state_mismatch"
RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"

# A user's environment module: one counter tool, one task (NAME is replaced by a name unique to the test).
ENVIRONMENT_MODULE = '''
from seal_lite.envs.python_tools import ToolEnvironment


class Tally:
    """A counter."""

    def __init__(self, count: int = 0):
        self.count = count

    def add(self, amount: int) -> dict:
        """Add to the count.

        Args:
            amount: How much to add.
        """
        self.count += amount
        return {"count": self.count}


environment = ToolEnvironment("NAME", Tally, [{"id": "tally_0", "turns": ["Add 2."], "calls": [["add(amount=2)"]]}])
not_an_environment = 42
'''


def write_environment(path, name):
    """A user's environment module at ``path`` whose environment is called ``name``."""
    path.write_text(ENVIRONMENT_MODULE.replace("NAME", name))
    return path


def library_task(task_id):
    return find_environment("library").load_tasks([task_id])[0]  # found first, so environment_of knows it


def play(task_id, *turns):
    """Diagnose an episode of a shipped library task in which the model sends, per turn, one message per call
    (a turn given as [] sends nothing)."""
    task = library_task(task_id)
    return diagnose_episode(task, replay_calls(task, [[[call] for call in calls] for calls in turns]))


def missing(*results):
    """The evidence line for expected results (dicts, as the tools return them) that the model's results lack."""
    return f"missing results: {json.dumps([json.dumps(result) for result in results])}"


def library_with(*tasks):
    """A ToolEnvironment of the shipped Library class with these task dicts."""
    return ToolEnvironment("library_under_test", library.Library, list(tasks))


def one_turn_task(call, **fields):
    return {"id": "t0", "turns": ["Lend 'Dune' to M-101."], "calls": [[call]], **fields}


# --- tool docs made from a class ----------------------------------------------------------------------------


class Shop:
    """A shop's basket (the class docstring is no tool's description)."""

    def __init__(self, basket: list | None = None):
        self.basket = basket if basket is not None else []

    def add_item(self, name: str, count: int, price: float, gift: bool, tags: list[str], extra: dict,
                 size: Literal[1, 2], note: str | None = None, rush: bool = False) -> dict:
        """Put an item in the basket,
        wrapped or not.

        Args:
            name: The item's name.
            count: How many.
            price: The price of one.
            gift: Whether to wrap it.
            tags: Labels for the item.
            extra: Anything else.
            size: The box size.
            note: A note for the packer,
                on two lines.
            rush: Whether to ship today.

        Returns:
            The basket.
        """
        self.basket.append(name)
        return {"basket": self.basket}

    def _total(self) -> float:
        return 0.0

    def clear(self) -> dict:
        """Empty the basket."""
        self.basket = []
        return {"basket": []}


def test_tool_docs_list_public_methods_in_definition_order():
    assert [doc["name"] for doc in tool_docs(Shop)] == ["add_item", "clear"]  # _total and __init__ are not tools
    assert [doc["name"] for doc in tool_docs(library.Library)] == [
        "search_catalog", "account", "borrow_book", "return_book", "renew_loan", "reserve_book", "pay_fine"]


def test_tool_docs_state_each_python_type_in_bfcl_form():
    properties = tool_docs(Shop)[0]["parameters"]["properties"]
    types = {name: {key: value for key, value in spec.items() if key != "description"}
             for name, spec in properties.items()}
    assert types == {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "price": {"type": "float"},
        "gift": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "extra": {"type": "dict"},
        "size": {"type": "integer", "enum": [1, 2]},
        "note": {"type": "string", "default": None},  # str | None is a string; its default is written
        "rush": {"type": "boolean", "default": False},
    }


def test_tool_docs_require_exactly_the_parameters_without_default():
    add_item, clear = tool_docs(Shop)
    assert add_item["parameters"]["required"] == ["name", "count", "price", "gift", "tags", "extra", "size"]
    assert clear["parameters"] == {"type": "dict", "properties": {}, "required": []}


def test_tool_docs_describe_with_the_docstring_summary_and_args_lines():
    add_item = tool_docs(Shop)[0]
    assert add_item["description"] == "Put an item in the basket, wrapped or not."  # no Args:, no Returns:
    assert add_item["parameters"]["properties"]["name"]["description"] == "The item's name."
    assert add_item["parameters"]["properties"]["note"]["description"] == "A note for the packer, on two lines."
    assert add_item["parameters"]["properties"]["rush"]["description"] == "Whether to ship today."  # not "The basket."


def test_the_library_renewal_weeks_is_an_enum_with_its_default():
    renew = next(doc for doc in tool_docs(library.Library) if doc["name"] == "renew_loan")
    assert renew["parameters"]["required"] == ["member_id", "title"]
    assert renew["parameters"]["properties"]["weeks"] == {
        "type": "integer", "enum": [1, 2], "description": "How many more weeks: 1 or 2.", "default": 1}
    assert renew["description"] == "Extend a member's loan, unless another member has reserved the book."
    assert library.environment.functions == tool_docs(library.Library)  # what every task shows


# --- refusals: a tool class seal-lite cannot document -------------------------------------------------------


def test_a_method_without_docstring_is_refused():
    class Silent:
        def ping(self, host: str) -> dict:
            return {}

    with pytest.raises(ToolEnvironmentError, match=r"Silent\.ping has no docstring"):
        tool_docs(Silent)


def test_a_parameter_without_type_hint_is_refused():
    class Untyped:
        def ping(self, host) -> dict:
            """Ping a host.

            Args:
                host: Where to.
            """

    with pytest.raises(ToolEnvironmentError, match=r"Untyped\.ping: parameter 'host' has no type hint"):
        tool_docs(Untyped)


def test_a_parameter_missing_from_args_is_refused():
    class Undescribed:
        def ping(self, host: str, count: int) -> dict:
            """Ping a host.

            Args:
                host: Where to.
            """

    with pytest.raises(ToolEnvironmentError, match=r"Undescribed\.ping: parameter 'count' is not described"):
        tool_docs(Undescribed)


def test_a_type_a_tool_doc_cannot_state_is_refused():
    class Tagger:
        def tag(self, labels: set[str]) -> dict:
            """Tag something.

            Args:
                labels: The labels.
            """

    with pytest.raises(ToolEnvironmentError, match=r"Tagger\.tag\(labels\): type set\[str\] is not one"):
        tool_docs(Tagger)


# --- refusals: tasks seal-lite cannot use ---------------------------------------------------------------------


@pytest.mark.parametrize("call, problem", [
    ("borrow_book", r"'borrow_book' is not one call"),  # a name, not a call
    ("Please lend it.", r"is not one call"),
    ("order_book(title='Dune')", r"'order_book' is not a tool of Library"),
    ("borrow_book(member_id='M-101')", r"missing a required argument: 'title'"),
    ("borrow_book(member_id='M-101', title='Dune', copies=2)", r"unexpected keyword argument 'copies'"),
], ids=["bare-name", "prose", "no-such-tool", "missing-argument", "extra-argument"])
def test_an_expected_call_that_is_not_a_call_of_a_tool_is_refused(call, problem):
    with pytest.raises(ToolEnvironmentError, match=problem):
        library_with(one_turn_task(call))


def test_an_expected_call_that_fails_from_the_task_state_is_refused():
    # M-102 owes 2.5 in the default library: borrowing fails, so every label of the task would be gt_error
    with pytest.raises(ToolEnvironmentError, match=r"task 't0': borrow_book\(member_id='M-102', title='Dune'\) "
                                                   r"fails: M-102 owes a fine of 2\.5"):
        library_with(one_turn_task("borrow_book(member_id='M-102', title='Dune')"))
    # the expected calls are played turn by turn: the second borrowing of the only copy fails
    two_turns = {"id": "t1", "turns": ["Lend 'Kindred' to M-101.", "And to M-103."],
                 "calls": [["borrow_book(member_id='M-101', title='Kindred')"],
                           ["borrow_book(member_id='M-103', title='Kindred')"]]}
    with pytest.raises(ToolEnvironmentError, match=r"no copy of 'Kindred' is on the shelf"):
        library_with(two_turns)


def test_a_state_in_which_the_expected_calls_succeed_is_accepted():
    # the same call as above, from a state where M-102 has paid
    members = {"M-102": {"name": "Ben", "fine": 0.0}}
    environment = library_with(one_turn_task("borrow_book(member_id='M-102', title='Dune')", state={"members": members}))
    assert environment.split_ids("train") == ["t0"] and environment.categories == ("base",)


def test_duplicate_task_ids_are_refused():
    task = one_turn_task("borrow_book(member_id='M-101', title='Dune')")
    with pytest.raises(ToolEnvironmentError, match=r"two tasks have the id 't0'"):
        library_with(task, dict(task))


def test_turns_and_calls_of_different_lengths_are_refused():
    task = {"id": "t0", "turns": ["Lend 'Dune' to M-101.", "Thanks."],
            "calls": [["borrow_book(member_id='M-101', title='Dune')"]]}
    with pytest.raises(ToolEnvironmentError, match=r"calls must be a list with one list of call strings per turn \(2\)"):
        library_with(task)


def test_unknown_task_keys_are_refused():
    with pytest.raises(ToolEnvironmentError, match=r"unknown keys \['answer'\]"):
        library_with(one_turn_task("borrow_book(member_id='M-101', title='Dune')", answer="done"))


def test_a_split_other_than_train_or_eval_is_refused():
    with pytest.raises(ToolEnvironmentError, match=r"split 'test': use train or eval"):
        library_with(one_turn_task("borrow_book(member_id='M-101', title='Dune')", split="test"))


def test_a_state_the_constructor_rejects_is_refused():
    with pytest.raises(ToolEnvironmentError, match=r"Library\(\*\*state\) failed: .*'shelves'"):
        library_with(one_turn_task("borrow_book(member_id='M-101', title='Dune')", state={"shelves": {}}))


def test_expected_calls_are_stored_as_the_checker_compares_them():
    # positional arguments get their parameter names: the model's keyword call then gives the same string
    environment = library_with(one_turn_task("borrow_book('M-101', 'Dune')"))
    assert environment.load_tasks(["t0"])[0].ground_truth == [["borrow_book(member_id='M-101', title='Dune')"]]


# --- verdict and labels on the shipped library ----------------------------------------------------------------


def test_the_right_calls_pass_every_turn():
    diagnosis = play("library_3", ["pay_fine(member_id='M-102', amount=2.5)"],
                     ["borrow_book(member_id='M-102', title='Kindred')"])
    assert diagnosis.valid and diagnosis.error_type is None and diagnosis.irrelevance_valid
    assert diagnosis.labels == ["pass", "pass"] and diagnosis.causes == [None, None]


def test_every_shipped_task_passes_with_its_own_calls():
    environment = find_environment("library")
    ids = environment.split_ids("train") + environment.split_ids("eval")
    assert len(ids) == len(library.TASKS) and "library_22" in environment.split_ids("eval")
    for task in environment.load_tasks(ids):
        diagnosis = diagnose_episode(task, replay_calls(task, [[[call] for call in calls] for calls in task.ground_truth]))
        assert diagnosis.valid and set(diagnosis.labels) <= {"pass", "correct_abstention"}, task.id


def test_the_wrong_member_is_a_state_mismatch():
    # Dune lent to M-101 instead of M-103: the loans and the copies differ from the expected state
    diagnosis = play("library_0", ["borrow_book(member_id='M-101', title='Dune')"],
                     ["return_book(member_id='M-103', title='Ulysses')"])
    assert not diagnosis.valid and diagnosis.error_type == STATE_MISMATCH
    assert (diagnosis.labels[0], diagnosis.causes[0]) == ("state_mismatch", "state_mismatch")
    assert diagnosis.turns[0].evidence.differences == ["Library state differs in loans"]


def test_the_wrong_title_is_a_state_mismatch():
    # Beloved lent to M-103 instead of Dune: both books' copies and M-103's loans differ, and the result names
    # another book (with the wrong member above, the result was the same)
    diagnosis = play("library_0", ["borrow_book(member_id='M-103', title='Beloved')"],
                     ["return_book(member_id='M-103', title='Ulysses')"])
    assert diagnosis.error_type == STATE_MISMATCH and diagnosis.labels[0] == "state_mismatch"
    assert diagnosis.turns[0].evidence.differences == ["Library state differs in books, loans",
                                                       missing({"borrowed": "Dune", "weeks": 2})]


def test_borrowing_before_paying_the_fine_is_a_state_mismatch():
    # library_30 turn 0 expects pay_fine then borrow_book; borrowing first fails (M-104 owes 4.0), so after the
    # payment Dune is still on the shelf and not on her loans, although her fine is paid as expected
    diagnosis = play("library_30", ["borrow_book(member_id='M-104', title='Dune')",
                                    "pay_fine(member_id='M-104', amount=4.0)"],
                     ["account(member_id='M-104')"])
    assert not diagnosis.valid and diagnosis.error_type == STATE_MISMATCH
    assert (diagnosis.labels[0], diagnosis.causes[0]) == ("state_mismatch", "state_mismatch")
    assert diagnosis.turns[0].evidence.differences == ["Library state differs in books, loans",
                                                       missing({"borrowed": "Dune", "weeks": 2})]
    outcomes = [outcome.status for outcome in replay_calls(library_task("library_30"), [[
        ["borrow_book(member_id='M-104', title='Dune')"], ["pay_fine(member_id='M-104', amount=4.0)"]]])[0].outcomes]
    assert outcomes == [CallStatus.TOOL_ERROR, CallStatus.OK]


def test_a_call_in_a_turn_to_decline_is_spurious_but_not_part_of_the_verdict():
    # library_2 turn 0 gives neither book nor card: it must be declined. The guessed borrowing fails ('Ulysses' has
    # no copy on the shelf), so the state is untouched and turn 1 done right passes
    diagnosis = play("library_2", ["borrow_book(member_id='M-101', title='Ulysses')"],
                     ["borrow_book(member_id='M-101', title='Beloved')"])
    assert diagnosis.labels == ["spurious_tool_call", "pass"]
    assert diagnosis.valid  # as BFCL's checker: declined turns are not checked...
    assert diagnosis.irrelevance_valid is False  # ...the irrelevance metric counts the call


def test_declining_the_turn_is_a_correct_abstention():
    diagnosis = play("library_2", [], ["borrow_book(member_id='M-101', title='Beloved')"])
    assert diagnosis.labels == ["correct_abstention", "pass"] and diagnosis.causes == [None, None]
    assert diagnosis.valid and diagnosis.irrelevance_valid


def test_a_spurious_call_that_changes_state_fails_the_next_turn():
    # the guessed borrowing of 'Dune' succeeds: turn 0 is still not checked, but turn 1 is compared on the state the
    # model left, which holds an extra loan
    diagnosis = play("library_2", ["borrow_book(member_id='M-101', title='Dune')"],
                     ["borrow_book(member_id='M-101', title='Beloved')"])
    assert diagnosis.labels == ["spurious_tool_call", "state_mismatch"]
    assert not diagnosis.valid and diagnosis.error_type == STATE_MISMATCH and not diagnosis.irrelevance_valid


def test_a_call_to_a_tool_that_does_not_exist_is_an_invalid_call():
    diagnosis = play("library_0", ["order_book(title='Dune')"], ["return_book(member_id='M-103', title='Ulysses')"])
    assert (diagnosis.labels[0], diagnosis.causes[0]) == ("empty_turn_model_response", "invalid_tool_call")
    evidence = diagnosis.turns[0].evidence
    assert (evidence.model_calls, evidence.decoded_calls, evidence.unknown_tools) == (1, 0, 1)
    # BFCL's checker runs a call to a missing function as a failed call: the turn is not empty for the verdict,
    # and since nothing was borrowed the state differs
    assert not diagnosis.valid and diagnosis.error_type == STATE_MISMATCH


def test_saying_nothing_in_a_turn_with_expected_calls_is_an_empty_turn():
    diagnosis = play("library_0", [], ["return_book(member_id='M-103', title='Ulysses')"])
    assert (diagnosis.labels[0], diagnosis.causes[0]) == ("empty_turn_model_response", "missing_tool_call")
    assert diagnosis.error_type == "multi_turn:empty_turn_model_response"


def test_a_read_only_turn_with_the_wrong_query_is_a_response_mismatch():
    # 'Austen Jane' is in no title or author, so the search finds nothing; the state is the same either way
    diagnosis = play("library_1", ["search_catalog(query='Austen Jane')"],
                     ["renew_loan(member_id='M-101', title='Emma', weeks=2)"])
    assert diagnosis.labels == ["response_mismatch", "pass"]
    assert diagnosis.causes[0] == "response_mismatch"
    assert not diagnosis.valid and diagnosis.error_type == RESPONSE_MISMATCH
    assert "Emma" in diagnosis.turns[0].evidence.differences[0]  # the missing result names the book


def test_the_query_is_matched_in_any_case():
    # search_catalog ignores case, so a lower-case query returns the same result and the turn passes
    diagnosis = play("library_1", ["search_catalog(query='jane austen')"],
                     ["renew_loan(member_id='M-101', title='Emma', weeks=2)"])
    assert diagnosis.valid and diagnosis.labels == ["pass", "pass"]


def test_a_call_missing_a_required_argument_is_an_argument_mismatch():
    diagnosis = play("library_0", ["borrow_book(member_id='M-103')"], ["return_book(member_id='M-103', title='Ulysses')"])
    assert (diagnosis.labels[0], diagnosis.causes[0]) == ("state_mismatch", "argument_mismatch")
    assert diagnosis.turns[0].evidence.argument_errors == 1 and diagnosis.error_type == STATE_MISMATCH


def test_a_later_turn_is_judged_on_the_state_earlier_turns_left():
    # library_3: paying 1.0 instead of 2.5 leaves a fine of 1.5, so the right borrowing in turn 1 fails for the
    # model while it succeeds for the expected calls
    diagnosis = play("library_3", ["pay_fine(member_id='M-102', amount=1.0)"],
                     ["borrow_book(member_id='M-102', title='Kindred')"])
    assert diagnosis.labels == ["state_mismatch", "state_mismatch"]
    assert diagnosis.turns[0].evidence.differences == ["Library state differs in members",
                                                       missing({"paid": 2.5, "fine_left": 0.0})]
    assert diagnosis.turns[1].evidence.differences[0] == "Library state differs in books, loans, members"
    assert diagnosis.turns[1].evidence.unrepaired_tool_error  # the borrowing failed and nothing followed
    assert diagnosis.error_type == STATE_MISMATCH


def test_a_repaired_mistake_passes_the_later_turn():
    # paying the rest (1.5) in turn 1 before borrowing brings the state back: turn 1 passes, the verdict still fails
    # on turn 0
    diagnosis = play("library_3", ["pay_fine(member_id='M-102', amount=1.0)"],
                     ["pay_fine(member_id='M-102', amount=1.5)", "borrow_book(member_id='M-102', title='Kindred')"])
    assert diagnosis.labels == ["state_mismatch", "pass"] and not diagnosis.valid


def test_expected_results_are_looked_for_among_all_the_model_results_so_far():
    # as BFCL's checker: the borrowing result of the (spurious) turn 0 counts for turn 1, where borrowing 'Beloved'
    # again fails ("already has") yet leaves the expected state
    diagnosis = play("library_2", ["borrow_book(member_id='M-101', title='Beloved')"],
                     ["borrow_book(member_id='M-101', title='Beloved')"])
    assert diagnosis.labels == ["spurious_tool_call", "pass"]
    assert diagnosis.valid and not diagnosis.irrelevance_valid


class Clock:
    """A clock that counts its readings in a private attribute."""

    def __init__(self, hour: int = 9):
        self.hour = hour
        self._readings = 0

    def now(self) -> dict:
        """Read the clock."""
        self._readings += 1
        return {"hour": self.hour}

    def advance(self, hours: int) -> dict:
        """Move the clock forward.

        Args:
            hours: How many hours.
        """
        self.hour += hours
        return {"hour": self.hour}


def test_private_attributes_are_not_part_of_the_compared_state():
    environment = ToolEnvironment("clock_under_test", Clock, [
        {"id": "c0", "turns": ["What time is it?", "Move it two hours on."], "calls": [["now()"], ["advance(hours=2)"]]}])
    task = environment.load_tasks(["c0"])[0]
    twice = [["now()", "now()"], ["advance(hours=2)"]]  # _readings ends at 2, not 1
    assert environment.verdict(task, [[[call] for call in calls] for calls in twice]) == {"valid": True}
    wrong = [["now()"], ["advance(hours=3)"]]
    assert environment.verdict(task, [[[call] for call in calls] for calls in wrong]) == {
        "valid": False, "error_type": STATE_MISMATCH}


def test_turns_the_episode_never_reached_count_as_empty():
    diagnosis = play("library_3", ["pay_fine(member_id='M-102', amount=2.5)"])
    assert diagnosis.labels == ["pass", "empty_turn_model_response"]
    assert diagnosis.error_type == "multi_turn:empty_turn_model_response"


def test_episodes_share_no_state():
    environment = find_environment("library")
    task = library_task("library_0")
    first, second = environment.episode(task), environment.episode(task)
    assert first.run("borrow_book(member_id='M-103', title='Dune')", 0)[0].status == CallStatus.OK
    assert first.instances["Library"].books["Dune"]["copies"] == 1
    assert second.instances["Library"].books["Dune"]["copies"] == 2
    assert second.run("account(member_id='M-103')", 0)[0].result == (
        '{"name": "Chen", "fine": 0.0, "loans": {"Ulysses": 2}, "reservations": []}')
    assert environment.episode(task).instances["Library"].loans == {"M-101": {"Emma": 1}, "M-103": {"Ulysses": 2}}


def test_an_episode_does_not_change_the_task_state():
    # library_5 starts M-103 with 'Beloved' for 1 week; renewing it in one episode leaves the next at 1 week
    environment = find_environment("library")
    task = library_task("library_5")
    assert environment.episode(task).run("renew_loan(member_id='M-103', title='Beloved', weeks=2)", 1)[0].status == "ok"
    assert task.initial_config["Library"]["loans"] == {"M-103": {"Beloved": 1}}
    assert environment.episode(task).instances["Library"].loans == {"M-103": {"Beloved": 1}}


def test_load_tasks_returns_copies():
    environment = find_environment("library")
    task = environment.load_tasks(["library_5"])[0]
    task.initial_config["Library"]["loans"]["M-103"]["Beloved"] = 99
    task.ground_truth[0].append("account(member_id='M-101')")
    again = environment.load_tasks(["library_5"])[0]
    assert again.initial_config["Library"]["loans"] == {"M-103": {"Beloved": 1}}
    assert again.ground_truth == [["account(member_id='M-103')"],
                                  ["renew_loan(member_id='M-103', title='Beloved', weeks=1)"]]
    with pytest.raises(KeyError, match="library_99"):
        environment.load_tasks(["library_99"])


# --- model text is never executed -----------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "__import__('os').system('touch {marker}')",
    "borrow_book(member_id=open('{marker}', 'w').write('x'), title='Dune')",
    "[borrow_book(member_id='M-101', title=__import__('os').system('touch {marker}'))]",
], ids=["import", "argument-expression", "nested-expression"])
def test_model_text_with_code_is_a_parse_error_and_runs_nothing(text, tmp_path):
    marker = tmp_path / "ran"
    episode = find_environment("library").episode(library_task("library_0"))
    outcomes = episode.run(text.format(marker=marker), 0)
    assert [outcome.status for outcome in outcomes] == [CallStatus.PARSE_ERROR]
    assert not outcomes[0].executed and outcomes[0].checker_call is None
    assert not marker.exists()
    assert episode.instances["Library"].books["Dune"]["copies"] == 2  # no borrowing either


def test_code_in_a_checker_call_runs_nothing(tmp_path):
    # the verdict replays call strings; those are parsed like the model's, never evaluated
    marker = tmp_path / "ran"
    task = library_task("library_0")
    verdict = find_environment("library").verdict(task, [[[f"__import__('os').system('touch {marker}')"]]])
    assert not verdict["valid"] and not marker.exists()


def test_a_private_method_is_not_a_tool():
    episode = find_environment("library").episode(library_task("library_0"))
    assert "_member" not in episode.tool_names and "__init__" not in episode.tool_names
    # the parser refuses a private name before any dispatch...
    (outcome,) = episode.run("_member(member_id='M-101')", 0)
    assert outcome.status == CallStatus.PARSE_ERROR and not outcome.executed
    # ...and dispatch refuses it as an unknown tool even when a call reaches it
    outcome = episode.execute(ToolCall("_member", {"member_id": "M-101"}), set(episode.tool_names) | {"_member"})
    assert outcome.status == CallStatus.UNKNOWN_TOOL and not outcome.exists and "_member" in outcome.result


# --- finding an environment by name ---------------------------------------------------------------------------


def test_the_shipped_environments_are_found_by_name():
    assert find_environment("library") is library.environment
    assert find_environment("bfcl") is BFCL
    assert environment_of(library_task("library_0")) is library.environment


def test_a_user_environment_is_found_by_file_path(tmp_path):
    path = write_environment(tmp_path / "tally_tools.py", "tally_by_path")
    environment = find_environment(f"{path}:environment")
    assert environment.name == "tally_by_path" and environment.split_ids("train") == ["tally_0"]
    assert find_environment(f"{path}:environment") is environment  # found once
    task = environment.load_tasks(["tally_0"])[0]
    assert task.environment == "tally_by_path" and environment_of(task) is environment
    assert diagnose_episode(task, replay_calls(task, [[["add(amount=2)"]]])).valid
    assert diagnose_episode(task, replay_calls(task, [[["add(amount=3)"]]])).labels == ["state_mismatch"]


def test_a_user_environment_is_found_by_module_in_the_current_directory(tmp_path, monkeypatch):
    module = "seal_lite_test_tally_module"
    write_environment(tmp_path / f"{module}.py", "tally_by_module")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # whatever the lookup adds to sys.path goes afterwards
    monkeypatch.delitem(sys.modules, module, raising=False)  # and so does the imported module
    environment = find_environment(f"{module}:environment")
    assert environment.name == "tally_by_module"
    assert environment_of(environment.load_tasks(["tally_0"])[0]) is environment


def test_a_task_of_an_environment_not_found_yet_is_refused():
    task = dataclasses.replace(library_task("library_0"), environment="never_found")
    with pytest.raises(ConfigError, match=r"environment 'never_found', which this process has not loaded"):
        environment_of(task)


def test_an_unknown_bare_name_is_refused():
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment("librery")
    assert "neither a shipped environment (bfcl, library) nor module:attribute" in refused.value.reason


def test_a_missing_module_or_file_is_refused(tmp_path):
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment("seal_lite_no_such_module:environment")
    assert "no module 'seal_lite_no_such_module'" in refused.value.reason
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment(f"{tmp_path / 'absent.py'}:environment")
    assert "no such file" in refused.value.reason


def test_a_missing_attribute_is_refused(tmp_path):
    path = write_environment(tmp_path / "tally_attribute.py", "tally_attribute")
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment(f"{path}:environmnet")
    assert "has no attribute 'environmnet'" in refused.value.reason


def test_an_attribute_that_is_not_an_environment_is_refused(tmp_path):
    path = write_environment(tmp_path / "tally_not_environment.py", "tally_not_environment")
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment(f"{path}:not_an_environment")
    assert "not_an_environment is a int, not an environment" in refused.value.reason


def test_a_module_whose_import_raises_is_refused(tmp_path):
    path = tmp_path / "broken_tools.py"
    path.write_text("raise RuntimeError('the tool database is down')\n")
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment(f"{path}:environment")
    assert "RuntimeError: the tool database is down" in refused.value.reason


def test_a_second_environment_with_a_used_name_is_refused(tmp_path):
    find_environment("library")
    path = write_environment(tmp_path / "impostor.py", "library")
    with pytest.raises(EnvironmentNotFound) as refused:
        find_environment(f"{path}:environment")
    assert "another environment is already called 'library'" in refused.value.reason
    assert environment_of(library_task("library_0")) is library.environment  # the first one stays


# --- the recipe's data.environment ----------------------------------------------------------------------------


def test_another_environment_drops_the_quickstart_task_file():
    assert load_recipe(None, {}).data.task_file is not None  # the quickstart's BFCL frontier
    assert load_recipe(None, {"data.environment": "library"}).data.task_file is None


def test_bfcl_categories_are_checked_only_for_bfcl():
    with pytest.raises(RecipeError, match=r"data\.categories\.1 = 'simple': not a BFCL multi-turn category"):
        load_recipe(None, {"data.categories": ["base", "simple"]})
    recipe = load_recipe(None, {"data.environment": "library", "data.categories": ["base", "simple"]})
    assert recipe.data.categories == ["base", "simple"]


def test_preflight_names_an_environment_that_cannot_be_found():
    recipe = load_recipe(None, {"data.environment": "seal_lite_no_such_module:environment"})
    with pytest.raises(RecipeError, match=r"data\.environment = 'seal_lite_no_such_module:environment': no module"):
        preflight.check(recipe)


def test_preflight_names_categories_the_environment_does_not_have():
    recipe = load_recipe(None, {"data.environment": "library", "data.categories": ["base", "simple"]})
    with pytest.raises(RecipeError, match=r"data\.categories = \['simple'\]: environment 'library' has categories base"):
        preflight.check(recipe)


# --- a file with dataclasses, inherited tools, continuation lines ----------------------------------------------


def test_a_user_file_with_a_dataclass_and_postponed_annotations_is_found_by_path(tmp_path):
    path = tmp_path / "notes_tools.py"
    path.write_text(ENVIRONMENT_MODULE.replace("NAME", "tally_dataclass").replace(
        "from seal_lite", "from __future__ import annotations\n\nfrom dataclasses import dataclass\n\nfrom seal_lite"
    ).replace("class Tally:", "@dataclass\nclass Shelf:\n    title: str\n\n\nclass Tally:"))
    assert find_environment(f"{path}:environment").name == "tally_dataclass"


def test_inherited_public_methods_are_tools():
    class Branch(library.Library):
        def hours(self) -> dict:
            """The branch's opening hours."""
            return {"open": 9}

    assert "borrow_book" in [doc["name"] for doc in tool_docs(Branch)]


def test_an_args_continuation_line_with_a_colon_stays_in_the_description():
    class Calendar:
        def book(self, day: str) -> dict:
            """Book a day.

            Args:
                day: The day to book,
                    Format: YYYY-MM-DD.
            """

    assert tool_docs(Calendar)[0]["parameters"]["properties"]["day"]["description"] == (
        "The day to book, Format: YYYY-MM-DD.")


def test_a_hint_that_names_nothing_is_refused_and_a_default_json_cannot_show_is_left_unstated():
    class Remote:
        def press(self, button: "NoSuchType") -> dict:  # noqa: F821  (the user's typo, refused below)
            """Press a button.

            Args:
                button: Which one.
            """

    with pytest.raises(ToolEnvironmentError, match=r"Remote\.press: its type hints cannot be read"):
        tool_docs(Remote)

    class Lamp:
        def switch(self, on: bool = True, colour: str = "white") -> dict:
            """Switch the lamp.

            Args:
                on: Whether it is on.
                colour: Its colour.
            """

    marker = object()
    Lamp.switch.__defaults__ = (True, marker)  # a default no tool doc can show
    properties = tool_docs(Lamp)[0]["parameters"]["properties"]
    assert properties["on"]["default"] is True and "default" not in properties["colour"]
    json.dumps(tool_docs(Lamp))  # the docs stay JSON, as the policy's prompt needs them
