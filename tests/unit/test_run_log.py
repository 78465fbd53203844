"""RUN/run.log: a library's log records, warnings and stderr (progress bars included) go to the file, seal-lite's own
warnings still reach the terminal, and ``verbose`` shows the library's too. A real CLI run: tests/real/test_quiet_run.py."""

import logging
import sys
import warnings

from tqdm import tqdm

from seal_lite.runs.run_log import library_output


def make_noise() -> None:
    """What a run meets: bitsandbytes' logger warning, a library's warnings.warn, progress bars and a print to stderr,
    and a warning of seal-lite's own."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
    warnings.warn("an experimental feature", UserWarning, stacklevel=1)
    for description in ("Converting and de-quantizing GGUF tensors...", "Loading weights"):
        for _ in tqdm(range(3), desc=description, mininterval=0):
            pass
    print("a library's own print", file=sys.stderr)
    logging.getLogger("seal_lite.tracking").warning("logging.report_to = wandb: wandb is not installed")


def test_library_noise_goes_to_the_log_and_the_runs_own_warning_to_the_terminal(tmp_path, capsys):
    before = (sys.stderr, warnings.showwarning, list(logging.getLogger().handlers), logging.getLogger().level)
    with library_output(tmp_path / "run.log"):
        make_noise()
    terminal = capsys.readouterr().err
    assert terminal == "logging.report_to = wandb: wandb is not installed\n"
    log = (tmp_path / "run.log").read_text()
    assert "WARNING bitsandbytes.backends.cpu.ops: Failed to load CPU gemm_4bit_forward" in log
    assert "WARNING py.warnings: " in log and "UserWarning: an experimental feature" in log
    bars = [line for line in log.splitlines() if "GGUF tensors" in line or "Loading weights" in line]
    assert len(bars) == 2 and all("100%" in line and "3/3" in line for line in bars)  # each bar's last state only
    assert "INFO stderr: a library's own print" in log
    assert "WARNING seal_lite.tracking: logging.report_to = wandb" in log
    assert (sys.stderr, warnings.showwarning, logging.getLogger().handlers, logging.getLogger().level) == (
        before[0], before[1], before[2], before[3])


def test_verbose_shows_the_libraries_lines_on_the_terminal_too(tmp_path, capsys):
    with library_output(tmp_path / "run.log", verbose=True):
        make_noise()
    terminal = capsys.readouterr().err
    assert "bitsandbytes.backends.cpu.ops: Failed to load CPU gemm_4bit_forward" in terminal
    assert "py.warnings: " in terminal and "an experimental feature" in terminal
    assert "Loading weights: 100%" in terminal and "a library's own print" in terminal
    assert "logging.report_to = wandb: wandb is not installed" in terminal
    assert "Failed to load CPU gemm_4bit_forward" in (tmp_path / "run.log").read_text()


def test_a_resumed_run_appends_to_its_log(tmp_path, capsys):
    for attempt in ("first", "second"):
        with library_output(tmp_path / "run.log"):
            logging.getLogger("peft").warning("%s attempt", attempt)
    assert [line.split(": ", 1)[1] for line in (tmp_path / "run.log").read_text().splitlines()] == [
        "first attempt", "second attempt"]


def test_a_stream_a_library_kept_reaches_the_terminal_after_the_run(tmp_path, capsys):
    with library_output(tmp_path / "run.log"):
        kept = logging.StreamHandler()  # made during the run (transformers makes its handler at first use)
    kept.stream.write("after the run\n")
    assert capsys.readouterr().err == "after the run\n"
    assert "after the run" not in (tmp_path / "run.log").read_text()
