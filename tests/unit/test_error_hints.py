"""phi_err covers the errors BFCL really raises: every error text of the eight BFCL API classes, read from their
source, and every error that replaying the mutation corpus produces, gets the hint intended for it.

``INTENDED`` is the hand-made table: each error template (``{}`` where the source fills in a value) with the
kind of hint it should get. The extraction test fails when bfcl-eval adds an error the table does not know.
"""

import ast
import importlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

from seal_lite.core.interface import ERROR_HINTS, GENERIC_HINT, recovery_feedback
from seal_lite.envs.bfcl import episode, load_tasks
from seal_lite.envs.tools import ERROR_PREFIX
from tests.support.mutations import corpus

DATA = Path(__file__).parents[2] / "data"
API_CLASSES = ("GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
               "VehicleControlAPI")
HINTS = {kind: hint for kind, _, hint in ERROR_HINTS} | {"generic": GENERIC_HINT}

FILE_SYSTEM = {
    "Current directory is already the root. Cannot go back.": "inspect",
    "Directory '{}' already exists in directory '{}'.": "precondition",
    "File '{}' already exists in directory '{}'.": "precondition",
    "cat: '{}': Invalid character": "one_step",
    "cat: '{}': Is a directory": "inspect",
    "cat: '{}': No such file or directory": "inspect",
    "cd: '{}': No such file or directory": "inspect",
    "cd: ..: No such directory": "inspect",
    "cd: {}: Unsupported path. Only one folder level at a time is supported.": "one_step",
    "cp: cannot copy '{}' to '{}': Not a directory": "inspect",
    "cp: cannot copy '{}' to '{}/{}': File exists": "precondition",
    "cp: cannot copy '{}': No such file or directory": "inspect",
    "cp: cannot copy '{}': Not a file or directory": "inspect",
    "cp: path not allowed in destination. Provide only a file or directory name.": "one_step",
    "diff: {} or {}: No such file or directory": "inspect",
    "echo: cannot write to '{}': Invalid character": "one_step",
    "echo: cannot write to '{}': No such file": "inspect",
    "grep: {}: No such file or directory": "inspect",
    "mkdir: cannot create directory '{}': File exists": "precondition",
    "mkdir: cannot create directory '{}': Invalid character": "one_step",
    "mv: cannot move '{}' to '{}': Not a directory": "inspect",
    "mv: cannot move '{}' to '{}/{}': File exists": "precondition",
    "mv: cannot move '{}': No such file or directory": "inspect",
    "mv: cannot move '{}': Not a file or directory": "inspect",
    "mv: path not allowed in destination. Provide only a file or directory name.": "one_step",
    "rm: cannot remove '{}': No such file or directory": "inspect",
    "rm: cannot remove '{}': Not a file or directory": "inspect",
    "rmdir: cannot remove '{}': Directory not empty": "precondition",
    "rmdir: cannot remove '{}': No such file or directory": "inspect",
    "rmdir: cannot remove '{}': Not a directory": "inspect",
    "sort: {}: No such file or directory": "inspect",
    "tail: {}: No such file or directory": "inspect",
    "touch: cannot touch '{}': File exists": "precondition",
    "touch: cannot touch '{}': Invalid character": "one_step",
    "wc: invalid mode '{}'": "value",
    "wc: {}: No such file or directory": "inspect",
}
MATH = {
    "All elements in the list must be numbers": "types",
    "Both inputs must be numbers": "types",
    "Cannot calculate mean of an empty list": "value",
    "Cannot calculate square root of a negative number": "value",
    "Cannot calculate standard deviation of an empty list": "value",
    "Cannot calculate sum of an empty list": "value",
    "Cannot divide by zero": "value",
    "Cannot find maximum of an empty list": "value",
    "Cannot find minimum of an empty list": "value",
    "Conversion from '{}' to '{}' is not supported": "value",
    "Conversion resulted in a value too large to represent": "value",
    "First input must be a number, second input must be an integer": "types",
    "Input must be a number": "types",
    "Input must be a number or computation resulted in an invalid operation": "types",
    "Value must be a number": "types",
    "Whole value cannot be zero": "value",
}
MESSAGING_AND_POSTING = {
    "No user is currently logged in.": "log_in",
    "Receiver ID '{}' not found.": "inspect",
    "Receiver ID {} not found.": "inspect",
    "User '{}' not found in the workspace.": "inspect",
    "User ID '{}' already exists.": "precondition",
    "User name '{}' already exists.": "precondition",
    "Tweet with ID {} not found.": "inspect",
    **{f"User not authenticated. Please authenticate before {action}.": "log_in"
       for action in ("commenting", "following", "listing following", "posting", "retweeting", "unfollowing")},
}
TICKETS_AND_TRADING = {
    "Invalid fields for update: {}": "value",
    "Invalid priority. Priority must be between 1 and 5.": "value",
    "Ticket with ID {} is already closed.": "precondition",
    "Ticket with ID {} is already resolved.": "precondition",
    "Ticket with ID {} not found.": "inspect",
    "Can't cancel order {}. Order is already completed.": "precondition",
    "Funding amount must be positive.": "value",
    "Insufficient funds for withdrawal.": "precondition",
    "Insufficient funds: required ${} but only ${} available.": "precondition",
    "Invalid stock symbol: {}": "inspect",
    "KeyError during formatting: {}": "generic",
    "Market is closed. Transactions are not allowed.": "precondition",
    "Order with ID {} not found.": "inspect",
    "Order with ID {} not found.Here is the list of orders_id: {}": "inspect",
    "Price and amount must be positive values.": "value",
    "Stock with symbol '{}' not found.": "inspect",
    "Stock {} not found in watchlist.": "inspect",
    "Transaction amount must be positive.": "value",
    **{f"User not authenticated. Please log in to {action}.": "log_in"
       for action in ("create a ticket", "view tickets", "fund the account", "make a transaction",
                      "modify the watchlist", "place an order", "view account information", "view order history",
                      "view transaction history")},
}
TRAVEL_AND_VEHICLE = {
    "Balance is less than budget limit": "precondition",
    "Balance not found": "inspect",
    "Booking not found": "inspect",
    "Card already registered": "precondition",
    "Card not registered": "inspect",
    "Card not registered. Here are a list of card_id's: {}": "inspect",
    "Credit card not registered": "inspect",
    "Exceeded budget limit": "precondition",
    "Insufficient funds": "precondition",
    "Invalid access token": "log_in",
    "Invalid date format. Use YYYY-MM-DD.": "value",
    "Invalid departure airport code: {}": "inspect",
    "Invalid destination airport code: {}": "inspect",
    "Invalid travel class. Must be one of {}": "value",
    "No available route for the given parameters": "value",
    "Invalid travel class. Options are: economy, business, first.": "value",
    "No available exchange rate for the given currencies.": "value",
    "No available route for the given airports.": "value",
    "Token expired": "log_in",
    "Token not initialized": "log_in",
    "404": "generic",
    "All doors must be locked before starting the engine. Here are the unlocked doors: {}": "precondition",
    "Brake pedal needs to be pressed when starting the engine.": "precondition",
    "Cannot fill gas above the tank capacity.": "value",
    "Fan speed must be between 0 and 100.": "value",
    "Fuel amount cannot be negative.": "value",
    "Fuel tank is empty.": "precondition",
    "Fuel tank is empty. Min fuel level is 0 gallons.": "precondition",
    "Invalid headlight mode.": "value",
    "Invalid ignition mode.": "value",
    "Invalid mode": "value",
    "Invalid option": "value",
    "Invalid speed": "value",
    "Must press the brake fully before starting the engine.": "precondition",
    "Pedal position must be between 0 and 1.": "value",
    "Start the engine before activating the cruise control.": "precondition",
    "distance not found in database.": "inspect",
}
INTENDED = FILE_SYSTEM | MATH | MESSAGING_AND_POSTING | TICKETS_AND_TRADING | TRAVEL_AND_VEHICLE
# Texts the source computes from another error, so no literal template stands for them there
DERIVED = {"find: '{}': No such file or directory": "inspect"}  # cd's error with "cd:" replaced by "find:"
# Python's own errors for a call whose arguments do not fit (bfcl-eval reports them the same way)
PYTHON_ERRORS = {
    r"missing \d+ required positional arguments?: '(\w+)'": "missing_argument",
    r"got an unexpected keyword argument '(\w+)'": "unexpected_argument",
    r"not supported between instances|unsupported operand|can only concatenate|not iterable|must be str": "types",
}


def _template(node) -> str | None:
    """An error text as a template: literal parts kept, every computed part as {}; None for a wholly computed one."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return (left or "{}") + (right or "{}") if left or right else None
    return None


def source_errors() -> dict[str, tuple[str, bool]]:
    """Error template -> (API class, raised), from the source of the eight API classes: {"error": ...} results,
    and the messages of exceptions they raise (the executor reports those as "Error during execution: ...")."""
    found = {}
    for class_name in API_CLASSES:
        module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            values, raised = [], isinstance(node, ast.Raise)
            if isinstance(node, ast.Dict):
                values = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "error"]
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                                      and t.slice.value == "error" for t in node.targets):
                values = [node.value]  # status["error"] = "..."
            elif raised and isinstance(node.exc, ast.Call) and node.exc.args:
                values = node.exc.args[:1]
            for value in values:
                template = _template(value)
                if template is not None:
                    found[template] = (class_name, raised)
    return found


SOURCE = source_errors()


def hint_kind(hint: str) -> str:
    matches = [kind for kind, text in HINTS.items() if hint == text or hint.startswith(text.split("{")[0])]
    assert len(matches) == 1, hint
    return matches[0]


def as_result(template: str, raised: bool) -> str:
    text = template.replace("{}", "x")
    return f"{ERROR_PREFIX} {text}" if raised else json.dumps({"error": int(text) if text.isdigit() else text})


def test_the_table_knows_every_error_the_api_classes_return():
    assert set(API_CLASSES) == {class_name for class_name, _ in SOURCE.values()}
    assert sorted(set(SOURCE) - set(INTENDED)) == []  # a new bfcl-eval error: give it its intended kind here
    assert sorted(set(INTENDED) - set(SOURCE)) == []  # and nothing stale
    assert len(SOURCE) >= 120


@pytest.mark.parametrize("template", sorted(INTENDED))
def test_each_error_gets_its_intended_hint(template):
    hint = recovery_feedback("tool_error", as_result(template, SOURCE[template][1]), ["ls"])
    assert hint_kind(hint) == INTENDED[template], hint


def test_replayed_corpus_errors_get_their_intended_hints():
    """Every failing call of the mutation corpus (and of ground truth replayed in the wrong order), run on the
    real environment: its error is one of the table's or Python's own, and gets the intended hint."""
    ids = DATA.joinpath("train_ids.txt").read_text().split() + DATA.joinpath("eval_ids.txt").read_text().split()
    tasks = {task.id: task for task in load_tasks(ids)}
    patterns = [(re.compile(re.escape(t).replace(r"\{\}", ".*?").join(["^", "$"]), re.DOTALL), kind)
                for t, kind in (INTENDED | DERIVED).items()]
    kinds, unknown, wrong = Counter(), [], []
    for mutant in corpus(list(tasks.values())):
        env = episode(tasks[mutant.task_id])
        for turn, calls in enumerate(mutant.turns):
            for outcome in env.run("[" + ", ".join(calls) + "]", turn) if calls else []:
                if outcome.status not in ("tool_error", "argument_error"):
                    continue
                text = outcome.result.removeprefix(f"{ERROR_PREFIX} ")
                if text.startswith("{"):
                    text = str(json.loads(text)["error"])
                kind = next((k for p, k in patterns if p.match(text)), None)
                kind = kind or next((k for p, k in PYTHON_ERRORS.items() if re.search(p, text)), None)
                if kind is None:
                    unknown.append(outcome.result)
                    continue
                kinds[kind] += 1
                if hint_kind(recovery_feedback(outcome.status, outcome.result, ["ls"])) != kind:
                    wrong.append((outcome.result, kind))
    assert unknown == [] and wrong == []
    assert sum(kinds.values()) >= 100 and len(kinds) >= 4, kinds
