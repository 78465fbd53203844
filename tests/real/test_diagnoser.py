"""The llama.cpp diagnoser with a real pip-shipped GGUF (SmolLM2-135M), in-process and served.

Waits are for events (an answer, a process's exit), never for a fixed time that a busy machine could overrun:
requests get a timeout far beyond any answer's (except in the test of the timeout itself), and the servers'
exits are awaited through their pidfd. HANG_GUARD_S only stops a test that would otherwise hang.
"""

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.recipe import DiagnoserConfig, Recipe
from seal_lite.engines.model_sources import resolve_gguf
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.envs.registry import replay_calls
from seal_lite.step.algorithm import SealStep
from seal_lite.step.diagnoser import Diagnoser, failed_turns
from seal_lite.step.verifier import diagnose_episode
from tests.helpers import ScriptedGenerator, tool_call_text

SMOL = resolve_gguf("smollm2-135m", "model")
HANG_GUARD_S = 1800  # not an expectation: only how long a test waits before it calls a process hung


def failures(task_id="multi_turn_base_0"):
    """Real failed turns: the ground truth of base_0 with a wrong folder name in turn 0 and nothing in turn 3."""
    task = load_tasks([task_id])[0]
    turns = [list(calls) for calls in task.ground_truth]
    turns[0] = ["cd(folder='document')", "mkdir(dir_name='tmp')", "mv(source='final_report.pdf', destination='tmp')"]
    turns[3] = []
    records = replay_calls(task, [[calls] if calls else [] for calls in turns])
    return list(failed_turns(task, records, diagnose_episode(task, records)).values())


def config(**fields):
    """A diagnoser whose requests do not time out on a busy machine (timeout_s is a hang guard here)."""
    return DiagnoserConfig(**{"mode": "in_process", "n_threads": 2, "max_per_step": 8, "timeout_s": HANG_GUARD_S,
                              **fields})


def test_in_process_diagnoses_real_failures_and_caches_them_in_the_store(tmp_path, smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(2)
    recipe = Recipe()
    recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn = 2, 1
    wrong = [tool_call_text(["cd(folder='document')", "mkdir(dir_name='tmp')"]), "I could not find it."]
    store = Store(tmp_path / "seal.db")
    with Diagnoser(config(), SMOL, lookup=store.diagnosis) as diagnoser:
        step = SealStep(recipe, store, {task.id: task}, None, diagnoser=diagnoser)
        step.generator = ScriptedGenerator(smol_tokenizer, [wrong, wrong])
        step([task.id])
        first = dict(store.db.execute("select name, value from metrics where step = 1 and name like 'diagnoser/%'").fetchall())
        # two identical failing episodes: 4 failed turns, 2 distinct failures, each asked once
        assert (first["diagnoser/turns"], first["diagnoser/unique"], first["diagnoser/asked"]) == (4, 2, 2)
        rows = list(store.db["diagnoses"].rows)
        assert len(rows) == 2 and all(row["status"] in ("ok", "invalid") for row in rows)
        assert any(row["status"] == "ok" and row["explanation"] for row in rows)
        linked = {turn["diagnosis_key"] for turn in store.turns("s1-multi_turn_base_0-g0")}
        assert linked == {row["key"] for row in rows}

        shown = CliRunner().invoke(main, ["diagnose", str(tmp_path), "--trajectory", "s1-multi_turn_base_0-g0", "--json"])
        explained = [json.loads(line)["diagnosis"] for line in shown.output.splitlines()]
        assert {row["key"] for row in explained} == linked and all(row["model"] for row in explained)

        step.generator = ScriptedGenerator(smol_tokenizer, [wrong, wrong])
        step([task.id])  # the same failures again: all from the store
        second = dict(store.db.execute("select name, value from metrics where step = 2 and name like 'diagnoser/%'").fetchall())
        assert (second["diagnoser/cached"], second["diagnoser/asked"]) == (2, 0)
    assert store.db["diagnoses"].count == 2


def test_rule_labels_weight_unless_the_recipe_makes_the_model_the_authority(tmp_path, smol_tokenizer):
    task = load_tasks(["multi_turn_base_0"])[0].truncated(1)
    wrong = [tool_call_text(["cd(folder='document')", "mkdir(dir_name='tmp')"])]
    for authority in ("rule", "llm"):
        recipe = Recipe()
        recipe.rollout.num_generations, recipe.rollout.max_calls_per_turn = 2, 1
        recipe.diagnoser.label_authority = authority
        store = Store(tmp_path / f"{authority}.db")
        with Diagnoser(config(), SMOL, lookup=store.diagnosis) as diagnoser:
            step = SealStep(recipe, store, {task.id: task}, ScriptedGenerator(smol_tokenizer, [wrong, wrong]),
                            diagnoser=diagnoser)
            step([task.id])
        (answer,) = list(store.db["diagnoses"].rows)
        counted = {key[len("labels/"):] for key, _ in store.db.execute(
            "select name, value from metrics where name like 'labels/%' and name not like '%_rate'").fetchall()}
        expected = answer["label"] if authority == "llm" and answer["status"] == "ok" else "state_mismatch"
        assert counted == {expected}
        assert [t["label"] for t in store.turns("s1-multi_turn_base_0-g0")] == ["state_mismatch"]  # evidence stays


def test_a_request_past_its_timeout_leaves_the_rule_label():
    turns = failures()
    with Diagnoser(config(timeout_s=0.01), SMOL) as diagnoser:
        answers, report = diagnoser.explain(turns[:1])
    assert answers == [None] and report.failed == 1 and report.new == []


def test_server_mode_answers_and_stops_its_server():
    turns = failures()
    with Diagnoser(config(mode="server"), SMOL) as diagnoser:
        process = diagnoser.server.process
        answers, report = diagnoser.explain(turns[:1])
        assert report.asked == 1 and answers[0] is not None and answers[0].status in ("ok", "invalid")
    assert process.poll() is not None  # stopped, not orphaned


def test_a_dying_server_is_restarted_once_then_the_step_falls_back_to_rules():
    turns = failures()
    assert len(turns) >= 3
    lookups = []

    def crash_on_second_failure(key):  # the cache lookup runs before each new request: crash the server there
        lookups.append(key)
        if len(lookups) in (1, 2):
            diagnoser.server.process.send_signal(signal.SIGKILL)
            diagnoser.server.process.wait()

    with Diagnoser(config(mode="server"), SMOL, lookup=crash_on_second_failure) as diagnoser:
        answers, report = diagnoser.explain(turns[:3])
        # turn 0: the server died, was restarted once, and answered; turn 1: it died again, so this step gives
        # up; turn 2 is not asked. Nothing raised, and the rule labels stand where there is no answer.
        assert answers[0] is not None and answers[1:] == [None, None]
        assert (report.restarts, report.failed, report.skipped) == (1, 2, 1)
        # the next step starts the server again
        answers, report = diagnoser.explain(turns[1:2])
        assert report.restarts == 1 and answers[0] is not None


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_no_orphan_server_after_ctrl_c_or_kill(tmp_path, how):
    # A process started with SIGINT ignored (a non-interactive shell's background job; a test runner's worker)
    # passes SIG_IGN on to its children, and Python then never raises KeyboardInterrupt: the child would sleep
    # out its loop and exit 0. Restore Python's own handler first, so the test holds however its runner started.
    script = textwrap.dedent(f"""
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from seal_lite.step.diagnoser import Diagnoser
        from seal_lite.core.recipe import DiagnoserConfig
        with Diagnoser(DiagnoserConfig(mode="server", n_threads=1), {SMOL!r}) as diagnoser:
            print(diagnoser.server.process.pid, flush=True)
            for _ in range(1200):  # short sleeps: Python acts on a Ctrl-C between them
                time.sleep(0.1)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())  # ready: the server answers
    server = _exit_event(server_pid)
    parent.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
    parent.wait(timeout=HANG_GUARD_S)  # Ctrl-C: the parent stops its server, then exits
    assert parent.returncode != 0  # the signal ended it, not the end of its sleep
    server.wait()  # kill -9: the server got SIGTERM from the kernel when its parent died, and shuts down
    assert not _running(server_pid)


class _exit_event:
    """Waits for a process that is not our child to exit: on its pidfd (Linux 5.3+), else by polling."""

    def __init__(self, pid: int):
        self.pid = pid
        try:
            self.fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.fd = None

    def wait(self) -> None:
        if self.fd is not None:
            select.select([self.fd], [], [], HANG_GUARD_S)
            os.close(self.fd)
            return
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline and _running(self.pid):
            time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False
    except OSError:
        return os.path.exists(f"/proc/{pid}")
