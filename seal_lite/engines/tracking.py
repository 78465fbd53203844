"""The tracker adapter: a run's per-step metrics also sent to Trackio, TensorBoard or Weights & Biases, beside the
run's store, which stays the record. This is the only module that imports them, each only when a recipe names it.

``open_tracker`` starts the tracker of ``logging.report_to`` for the run and yields a ``Tracker``: ``log(step,
metrics)`` sends one SEAL step's metrics, ``trainer_settings()`` is what TRL's trainer gets so that it reports its
own figures (``train/loss``, ``train/kl``, ...) to the same place, and the tracker closes when the block ends.
A tracker that is not installed, not logged in, or fails to start or to log never stops a run: one warning (logger
``seal_lite.tracking``), then the store alone, and the trainer reports nowhere.

The axis is the trainer's global step (optimizer steps): a SEAL step's metrics are logged where the trainer logs
that step, N x ``grpo.mini_batches`` x ``grpo.num_iterations`` (N itself in the shipped CPU recipes).

How each tracker meets transformers' callback for it (transformers 5.17, ``integrations/integration_utils.py``):

* tensorboard: both write event files into RUN/tensorboard, one TensorBoard run. The callback takes its directory
  from TENSORBOARD_LOGGING_DIR (it has no other setting), which is set while the tracker is open. A resumed run
  writes a purge mark, so TensorBoard hides what the interrupted step had logged.
* wandb: seal-lite starts the run, after checking the login without a prompt (a prompt would stop a run that
  nobody watches); the callback then uses that run, as it starts one only when ``wandb.run`` is None.
* trackio: the callback starts the run when training starts (it always calls ``trackio.init``, which would end a
  run started before it), under the project and name of ``trainer_settings()``; seal-lite's rows go into it.
  Trackio writes to its own local database (TRACKIO_DIR, default ~/.cache/huggingface/trackio), where
  ``trackio show`` reads.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

PROJECT = "seal-lite"  # Trackio's and W&B's project (WANDB_PROJECT overrides it for W&B)
STEP_KEY = "train/global_step"  # the x-axis transformers' W&B and Trackio callbacks log with each row

log = logging.getLogger("seal_lite.tracking")


class Tracker:
    """No tracker: the store alone. ``name`` is what the trainer reports to; ``where`` says where to look."""

    name = "none"
    where = ""

    def __init__(self, run_name: str = ""):
        self.run_name = run_name

    def trainer_settings(self) -> dict:
        """The TrainingArguments fields that make TRL's trainer report to this tracker, under this run's name."""
        return {"report_to": self.name, "run_name": self.run_name or None, "project": PROJECT}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Send one SEAL step's metrics, at the trainer's global ``step``."""

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    name = "tensorboard"

    def __init__(self, run_name: str, directory: Path, resumed_at: int):
        from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

        super().__init__(run_name)
        self.where = f"TensorBoard (tensorboard --logdir {directory})"
        # the steps after the last committed one are logged again: purge_step hides what the interrupted run logged
        self.writer = SummaryWriter(str(directory), purge_step=resumed_at + 1 if resumed_at else None)
        self.previous_dir = os.environ.get("TENSORBOARD_LOGGING_DIR")
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(directory)  # transformers' TensorBoardCallback writes there too

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        if self.previous_dir is None:
            os.environ.pop("TENSORBOARD_LOGGING_DIR", None)
        else:
            os.environ["TENSORBOARD_LOGGING_DIR"] = self.previous_dir


class Trackio(Tracker):
    name = "trackio"

    def __init__(self, run_name: str):
        import trackio

        super().__init__(run_name)
        self.trackio = trackio
        self.where = f"Trackio (trackio show --project {PROJECT})"

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.trackio.log({**metrics, STEP_KEY: step})  # into the run the trainer's callback started


class Wandb(Tracker):
    name = "wandb"

    def __init__(self, run_name: str, directory: Path, config: dict):
        import wandb

        super().__init__(run_name)
        offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
        if not offline and not wandb.login(prompt=False):  # reads WANDB_API_KEY, the settings files, ~/.netrc
            raise TrackerUnavailable("wandb is installed but not logged in: run `wandb login`, or set "
                                     "WANDB_MODE=offline to keep its logs on this machine")
        project = os.environ.get("WANDB_PROJECT", PROJECT)
        self.run = wandb.init(project=project, name=run_name, dir=str(directory), config=config)
        self.where = f"W&B (project {project}" + (f", offline in {directory / 'wandb'})" if offline else ")")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({**metrics, STEP_KEY: step})

    def close(self) -> None:
        self.run.finish()


class TrackerUnavailable(Exception):
    """The tracker is installed but cannot be used here; the message says why and what to do."""


@contextlib.contextmanager
def open_tracker(report_to: str, run_dir: Path, config: dict, resumed_at: int = 0) -> Iterator[Tracker]:
    """The run's tracker for ``logging.report_to`` while the block runs. ``config``: the recipe, for trackers that
    keep one; ``resumed_at``: the trainer's global step of the checkpoint a resumed run starts from (0: new)."""
    run_dir = Path(run_dir)
    tracker = _start(report_to, run_dir, config, resumed_at)
    guarded = _Guarded(tracker)
    try:
        yield guarded
    finally:
        guarded.close()


def _start(report_to: str, run_dir: Path, config: dict, resumed_at: int) -> Tracker:
    name = run_dir.resolve().name
    try:
        # what the libraries print while they start goes to the run's log, not between the run's own lines
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            tracker = {
                "none": lambda: Tracker(name),
                "tensorboard": lambda: TensorBoard(name, run_dir / "tensorboard", resumed_at),
                "trackio": lambda: Trackio(name),
                "wandb": lambda: Wandb(name, run_dir, config),
            }[report_to]()
    except ImportError:
        _fall_back(report_to, f"{report_to} is not installed (pip install {report_to})")  # each is its pip name
        return Tracker(name)
    except Exception as error:  # a tracker never stops a run: whatever it raised, the store goes on alone
        reason = str(error) if isinstance(error, TrackerUnavailable) else f"it failed to start: {error!r}"
        _fall_back(report_to, reason)
        return Tracker(name)
    if printed.getvalue().strip():
        log.info("%s: %s", report_to, printed.getvalue().strip())
    return tracker


def _fall_back(report_to: str, reason: str) -> None:
    log.warning("logging.report_to = %s: %s; this run's metrics stay in its store (seal.db) alone", report_to, reason)


class _Guarded(Tracker):
    """A tracker whose failure to log or close is one warning, after which the run goes on without it."""

    def __init__(self, tracker: Tracker):
        super().__init__(tracker.run_name)
        self.tracker = tracker
        self.name, self.where = tracker.name, tracker.where

    def trainer_settings(self) -> dict:
        return self.tracker.trainer_settings()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        try:
            self.tracker.log(step, metrics)
        except Exception as error:
            log.warning("logging.report_to = %s: logging step %d failed (%r); the run goes on, its metrics in its "
                        "store (seal.db) alone", self.name, step, error)
            self._stop()

    def close(self) -> None:
        self._stop()

    def _stop(self) -> None:
        tracker, self.tracker = self.tracker, Tracker(self.run_name)
        try:
            tracker.close()
        except Exception as error:
            log.warning("logging.report_to = %s: closing it failed (%r)", self.name, error)
