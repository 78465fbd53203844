"""logging.report_to: the recipe field, and a tracker that cannot be used never stopping a run.

W&B is not installed here: "installed but not logged in" uses a stand-in ``wandb`` module with wandb 0.31's
``login(prompt=False)``, which answers False without a key; the real trackers' runs are
tests/scripted/test_tracking_run.py (TensorBoard) and tests/real/test_quiet_run.py (Trackio, a missing tracker)."""

import json
import logging
import sys
import types

import pytest
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.recipe import RecipeError, load_recipe
from seal_lite.engines.store import Store
from seal_lite.engines.tracking import open_tracker
from seal_lite.runs.run_dir import open_run


def test_report_to_defaults_to_none_and_reads_yaml_spellings(tmp_path):
    assert load_recipe(None).logging.report_to == "none"  # local and account-free
    assert load_recipe(None, {"logging.report_to": "TensorBoard"}).logging.report_to == "tensorboard"
    recipe = tmp_path / "r.yaml"
    recipe.write_text("logging:\n  report_to: off\n")  # YAML reads a bare off as false
    assert load_recipe(recipe).logging.report_to == "none"


def test_an_unknown_tracker_names_the_field_the_choices_and_a_fix(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("logging:\n  report_to: mlflow\n")
    result = CliRunner().invoke(main, ["recipe", str(bad)])
    assert result.exit_code == 2
    assert (f"{bad}: logging.report_to = 'mlflow': seal-lite reports to none, trackio, tensorboard, wandb; use one of "
            "them, e.g. logging.report_to: tensorboard") in result.output
    with pytest.raises(RecipeError, match=r"logging.report_to = \['tensorboard', 'wandb'\]: a run reports to one "
                                          "tracker; choose one of none, trackio, tensorboard, wandb"):
        load_recipe(None, {"logging.report_to": ["tensorboard", "wandb"]})
    with pytest.raises(RecipeError, match="logging.reportto: .*remove it or check its spelling"):
        load_recipe(None, {"logging.reportto": "tensorboard"})


def test_a_run_resumes_under_another_tracker_and_from_before_the_field_existed(tmp_path):
    stored = load_recipe(None).model_dump()
    del stored["logging"]  # a run stored before logging.report_to existed
    store = Store(tmp_path / "seal.db")
    store.start_run("quickstart", stored, "qwen2.5-coder-0.5b")
    assert open_run(load_recipe(None, {"logging.report_to": "tensorboard"}), store, tmp_path) is True
    assert "logging" not in json.loads(store.run()["recipe"])


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level(logging.WARNING, logger="seal_lite.tracking")
    return lambda: [record.getMessage() for record in caplog.records if record.name == "seal_lite.tracking"]


def test_a_tracker_that_is_not_installed_is_one_warning_and_the_trainer_reports_nowhere(tmp_path, monkeypatch,
                                                                                       warnings_seen):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with open_tracker("wandb", tmp_path, {}) as tracker:
        tracker.log(1, {"reward/mean": 0.5})
        assert tracker.name == "none" and tracker.trainer_settings()["report_to"] == "none"
    assert warnings_seen() == ["logging.report_to = wandb: wandb is not installed (pip install wandb); this run's "
                               "metrics stay in its store (seal.db) alone"]


class StandInWandb(types.ModuleType):
    """wandb's calls that seal-lite makes, recorded; ``logged_in`` is what ``login(prompt=False)`` answers."""

    def __init__(self, logged_in: bool, fail_log: bool = False):
        super().__init__("wandb")
        self.logged_in, self.fail_log, self.calls = logged_in, fail_log, []

    def login(self, prompt=True):
        self.calls.append(("login", prompt))
        return self.logged_in

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        return self

    def log(self, row):
        self.calls.append(("log", row))
        if self.fail_log:
            raise ConnectionError("network gone")

    def finish(self):
        self.calls.append(("finish",))


def test_wandb_installed_but_not_logged_in_is_one_warning_and_never_a_prompt(tmp_path, monkeypatch, warnings_seen):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    wandb = StandInWandb(logged_in=False)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    with open_tracker("wandb", tmp_path, {}) as tracker:
        assert tracker.trainer_settings()["report_to"] == "none"
    assert wandb.calls == [("login", False)]  # no wandb.init: it would prompt for a key on a terminal
    assert warnings_seen() == ["logging.report_to = wandb: wandb is installed but not logged in: run `wandb login`, "
                               "or set WANDB_MODE=offline to keep its logs on this machine; this run's metrics stay "
                               "in its store (seal.db) alone"]


def test_wandb_starts_the_run_the_trainer_then_uses_and_rows_carry_the_trainer_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no login needed
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    wandb = StandInWandb(logged_in=False)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    with open_tracker("wandb", tmp_path / "my-run", {"seed": 0}) as tracker:
        assert tracker.trainer_settings() == {"report_to": "wandb", "run_name": "my-run", "project": "seal-lite"}
        tracker.log(2, {"reward/mean": 0.5})
    assert wandb.calls == [
        ("init", {"project": "seal-lite", "name": "my-run", "dir": str(tmp_path / "my-run"), "config": {"seed": 0}}),
        ("log", {"reward/mean": 0.5, "train/global_step": 2}), ("finish",)]


def test_a_tracker_that_fails_to_log_is_one_warning_then_the_run_goes_on_without_it(tmp_path, monkeypatch,
                                                                                     warnings_seen):
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb = StandInWandb(logged_in=True, fail_log=True)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    with open_tracker("wandb", tmp_path, {}) as tracker:
        tracker.log(1, {"reward/mean": 0.5})
        tracker.log(2, {"reward/mean": 1.0})  # no longer sent
    assert [call[0] for call in wandb.calls] == ["init", "log", "finish"]
    assert warnings_seen() == ["logging.report_to = wandb: logging step 1 failed (ConnectionError('network gone')); "
                               "the run goes on, its metrics in its store (seal.db) alone"]
