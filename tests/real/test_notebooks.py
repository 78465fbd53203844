"""The notebooks cannot silently rot: the teaching notebook is executed end to end on the CPU (real
Qwen2.5-Coder-0.5B on a frontier task, real BFCL, bfcl-eval's checker, a real LoRA update from real rewards) and
its results are checked independently; every command, option and recipe of the Colab/Kaggle notebook is checked
against the CLI."""

import json
import math
import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
import torch
from click.testing import CliRunner

from seal_lite.cli import main
from seal_lite.core.advantages import diagnosis_weight, group_advantages, weighted_advantages
from seal_lite.core.interface import GUIDELINES, capability_guidelines
from seal_lite.core.labels import BASE_UTILITY, CAUSES, SUCCESS_LABELS
from seal_lite.core.recipe import load_recipe
from seal_lite.envs.bfcl import load_tasks, official_verdict
from seal_lite.runs.tasks import read_task_file

ROOT = Path(__file__).parents[2]
NOTEBOOKS = ROOT / "notebooks"

# Run in the notebook's kernel after its last cell: what it computed, as JSON, for the checks below.
PROBE = """
import json, os
print(json.dumps({
    "cwd": os.getcwd(), "task_id": task.id, "steps": [t.steps_per_turn() for t in trajectories], "rewards": rewards,
    "labels": labels, "causes": [d.causes for d in diagnoses], "advantages": advantages, "weights": weights,
    "final": final, "utilities": utilities, "counts": dict(statistics.window_counts),
    "mean_rewards": statistics.window_mean_reward(), "batch_rewards": batch.rewards,
    "batch_advantages": batch.advantages, "model_tokens": [sum(t.env_mask) for t in trajectories],
    "env_tokens": [len(t.env_mask) - sum(t.env_mask) for t in trajectories],
    "loss": result.training_loss, "moved": moved, "norm_before": norm_before,
    "norm_after": lora_norm(trainer.model), "guidelines": list(evolved.guidelines),
    "max_turns": recipe.rollout.max_turns, "groups_played": groups_played,
    "min_count": recipe.interface.guideline_min_count,
    "calls": [t.num_model_calls for t in trajectories],
}))
"""


def kernel_spec(directory: Path) -> str:
    """A Jupyter kernel for this interpreter (the project's venv), importing seal_lite from this checkout."""
    spec = directory / "kernels" / "seal-lite-test"
    spec.mkdir(parents=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "seal-lite (tests)", "language": "python", "env": {"PYTHONPATH": path},
    }))
    return spec.name


def text_of(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []))


def test_the_teaching_notebook_runs_one_real_seal_step_end_to_end(tmp_path, monkeypatch):
    """Every cell runs on the CPU from the repository root; the numbers it shows are what the library and
    bfcl-eval's checker say. Minutes on 2 cores: Qwen2.5-Coder-0.5B rolls out 4 trajectories of a frontier task
    (again while their rewards are all equal) and takes one LoRA update from their real advantages."""
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    notebook = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    client = NotebookClient(notebook, timeout=1800, kernel_name=kernel_spec(tmp_path),
                            resources={"metadata": {"path": str(ROOT)}})
    cells = list(notebook.cells)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)  # raises CellExecutionError, with the traceback, if a cell fails
    seen = json.loads(text_of(notebook.cells[-1]))
    outputs = "\n".join(text_of(cell) for cell in cells if cell.cell_type == "code")
    assert seen["cwd"] == str(ROOT)

    # steps 1-3: a real frontier task, G real trajectories, with model and environment tokens told apart
    assert seen["task_id"] in read_task_file(ROOT / "data" / "frontier" / "qwen2.5-coder-0.5b.txt")
    (task,) = load_tasks([seen["task_id"]])
    task = task.truncated(seen["max_turns"])
    G = len(seen["rewards"])
    assert G == 4 and all(n > 0 for n in seen["model_tokens"])
    # the environment wrote inside a completion (a tool result) exactly when the model called a tool and wrote again
    assert [n > 0 for n in seen["env_tokens"]] == [calls > 1 for calls in seen["calls"]]
    assert re.search(r"prompt tokens: \d+ with this interface, \d+ without Ω .*, \d+ with BFCL's full JSON", outputs)

    # step 4: each reward is 0 or 1 and is bfcl-eval's verdict on the calls the trajectory made
    for steps, reward in zip(seen["steps"], seen["rewards"]):
        assert reward in (0.0, 1.0)
        assert official_verdict(task, steps)["valid"] == (reward == 1.0)

    # step 5: one label per ground-truth turn, from the label table, causes from the paper's list
    for labels, causes, reward in zip(seen["labels"], seen["causes"], seen["rewards"]):
        assert len(labels) == len(causes) == len(task.ground_truth)
        assert set(labels) <= set(BASE_UTILITY) and set(causes) <= set(CAUSES) | {None}
        assert all((cause is None) == (label in SUCCESS_LABELS or label == "spurious_tool_call")
                   for label, cause in zip(labels, causes))
        assert (reward == 1.0) == all(label in SUCCESS_LABELS for label in labels)

    # steps 6-8: the numbers shown are the library's
    assert seen["counts"] == {label: sum(labels.count(label) for labels in seen["labels"])
                              for label in {label for labels in seen["labels"] for label in labels}}
    assert seen["advantages"] == pytest.approx(group_advantages(seen["rewards"]))
    assert seen["weights"] == [diagnosis_weight(labels, seen["utilities"]) for labels in seen["labels"]]
    assert all(0.5 <= w <= 2.0 for w in seen["weights"])
    assert seen["final"] == pytest.approx(weighted_advantages(seen["advantages"], seen["weights"]))

    # step 9: the update trains on the real advantages of a group whose rewards differ (a frontier task, played
    # again while they are equal: 4 groups of 4 all equal: (1/8)^4, 1 in 4,096, at a pass rate of 1/2)
    assert len(set(seen["rewards"])) == 2 and 1 <= seen["groups_played"] <= 4
    assert seen["batch_rewards"] == seen["rewards"] and "trains on them" in outputs
    assert seen["batch_advantages"] == pytest.approx(seen["final"]) and any(seen["batch_advantages"])
    assert seen["moved"] > 0 and seen["norm_after"] != seen["norm_before"]  # the LoRA changed
    assert math.isfinite(seen["loss"])
    assert seen["loss"] == pytest.approx(-sum(seen["batch_advantages"]) / G, abs=1e-4)  # on-policy: ratio 1

    # step 10: the guidelines are phi_cap's rule, at the quickstart's threshold, applied to the statistics shown
    assert seen["min_count"] == load_recipe(ROOT / "recipes" / "quickstart.yaml").interface.guideline_min_count
    assert seen["guidelines"] == list(capability_guidelines(seen["counts"], seen["mean_rewards"],
                                                            min_count=seen["min_count"]))
    assert set(seen["guidelines"]) <= set(GUIDELINES.values())
    assert "The next step's system message adds:" in outputs


@pytest.mark.parametrize("name", ["quickstart.ipynb", "colab_t4.ipynb"])
def test_each_notebook_is_valid_and_its_code_compiles(name):
    """Cheap, for every run of the tests: valid nbformat, and every code cell is Python once IPython has turned
    its ``!shell`` and ``%magic`` lines into calls."""
    from IPython.core.inputtransformer2 import TransformerManager

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            compile(TransformerManager().transform_cell(cell.source), f"{name} cell {index}", "exec")


def test_the_colab_notebook_runs_end_to_end_as_a_rehearsal_without_a_gpu(tmp_path, monkeypatch):
    """Every cell of the T4 notebook but the GPU install runs on this CPU with ``REHEARSE = True``: doctor, the
    rehearsal of colab-t4 (its fp16 with loss scaling, NF4 layers, paged engine on paged|sdpa, shared-prefix update,
    validation, a kill and a resume) passing every check, the evaluation of the rehearsal's run beside its base
    model, and the report shown in the notebook."""
    from nbclient import NotebookClient

    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # its `!seal-lite`
    notebook = nbformat.read(COLAB, as_version=4)
    assert "pip install" in notebook.cells[2].source and "REHEARSE = False" in notebook.cells[2].source
    notebook.cells[2] = nbformat.v4.new_code_cell("REHEARSE = True")  # the GPU install is left out
    run_cell = next(cell for cell in notebook.cells if cell.cell_type == "code" and "seal-lite rehearse" in cell.source)
    run_cell.source = run_cell.source.replace('OUT = "runs/colab-t4"', f'OUT = "{tmp_path}/colab-t4"')
    client = NotebookClient(notebook, timeout=900, kernel_name=kernel_spec(tmp_path),
                            resources={"metadata": {"path": str(ROOT)}})
    with client.setup_kernel():
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)  # raises CellExecutionError, with the traceback, if a cell fails
    outputs = "\n".join(text_of(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "Rehearsal passed" in outputs and "FAIL" not in outputs
    for ran in ("float16", "GradScaler", "NF4", "paged|sdpa", "resumed and finished"):
        assert ran in outputs, ran
    assert re.search(r"mean\s.*n=8.*n=8", outputs)  # eval: 2 tasks x 4 categories, base and trained
    assert (tmp_path / "colab-t4-rehearsal" / "run" / "report" / "report.html").is_file()
    shown = [output for output in notebook.cells[-2].outputs if "text/html" in output.get("data", {})]
    assert shown  # the report, in the notebook


# --- the Colab/Kaggle T4 notebook: cheap checks that its commands, options and recipe exist -----------------

COLAB = NOTEBOOKS / "colab_t4.ipynb"


def colab_commands() -> list[list[str]]:
    """Every ``!seal-lite ...`` line of the notebook as arguments, with {VARIABLE}s from its cells filled in."""
    notebook = nbformat.read(COLAB, as_version=4)
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    variables = {}  # the notebook's top-level assignments, in order, each evaluated with those before it
    for name, expression in re.findall(r"^([A-Z_]+) = (.+?)(?:\s+#.*)?$", source, re.MULTILINE):
        variables[name] = eval(expression, {}, dict(variables))  # expressions of this notebook, never model text
    commands = []
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("!seal-lite "):
            line = re.sub(r"\{(\w+)\}", lambda m: str(variables[m.group(1)]), line)
            commands.append(shlex.split(line[1:])[1:])
    return commands


def test_every_command_option_and_recipe_of_the_colab_notebook_exists():
    commands = colab_commands()
    assert {command[0] for command in commands} >= {"doctor", "run", "report", "eval"}
    for arguments in commands:
        group, names = main, []
        while arguments and arguments[0] in getattr(group, "commands", {}):
            names.append(arguments.pop(0))
            group = group.commands[names[-1]]
        help_result = CliRunner().invoke(main, [*names, "--help"])
        assert help_result.exit_code == 0, help_result.output
        known = {option for parameter in group.params for option in getattr(parameter, "opts", [])}
        used = [argument for argument in arguments if argument.startswith("--")]
        assert set(used) <= known, f"seal-lite {' '.join(names)}: no option {set(used) - known}"
        if names == ["run"]:
            recipe_path, overrides = arguments[0], {}
            for flag, value in zip(arguments, arguments[1:]):
                if flag == "--set":
                    key, _, text = value.partition("=")
                    overrides[key] = json.loads(text) if text[:1].isdigit() else text
            assert (ROOT / recipe_path).is_file()
            recipe = load_recipe(ROOT / recipe_path, overrides)
            assert recipe.name == "colab-t4"


def test_the_colab_notebook_installs_what_its_recipe_needs_and_no_unsloth():
    """The t4 extra it installs holds bitsandbytes (its recipe's 4-bit layers) and not Unsloth's stack, which the
    recipe never imports (minutes of install); bfcl-eval is the version setup.sh installs, without dependencies."""
    source = "\n".join(cell.source for cell in nbformat.read(COLAB, as_version=4).cells if cell.cell_type == "code")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert 'pip install -q -e ".[t4]"' in source and ".[gpu]" not in source
    assert any(pin.startswith("bitsandbytes==") for pin in extras["t4"])
    assert not any(pin.startswith("unsloth") for pin in extras["t4"])
    assert load_recipe(ROOT / "recipes" / "colab-t4.yaml").policy.backend == "peft-4bit"
    (bfcl,) = re.findall(r'"(bfcl-eval==[^"]+)"', (ROOT / "scripts" / "setup.sh").read_text())
    assert f'--no-deps "{bfcl}"' in source


def test_the_colab_notebook_installs_a_torch_the_driver_runs_and_stops_without_a_gpu():
    """torch, and the torchvision Unsloth imports, from PyTorch's CUDA 12.6 index in one command, torch at seal-lite's
    pin (PyPI's builds are CUDA 13: NVIDIA driver 580+), and the install cell refuses to go on when torch sees no GPU:
    run here, on a CPU, its guard must stop."""
    install = nbformat.read(COLAB, as_version=4).cells[2].source
    (torch_pin,) = [line for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
                    if line.startswith("torch")]
    torchvision = {"2.13.0": "0.28.0"}[torch_pin.removeprefix("torch==")]  # the torchvision built with that torch
    assert (f"!pip install -q {torch_pin} torchvision=={torchvision} --index-url https://download.pytorch.org/whl/cu126"
            in install)
    assert install.index("whl/cu126") < install.index('pip install -q -e ".[t4]"')
    guard = install[install.index("import torch"):]
    if torch.cuda.is_available():
        pytest.skip("the guard stops only where torch sees no GPU")
    with pytest.raises(RuntimeError, match="sees no GPU. Colab: Runtime > Change runtime type > T4 GPU"):
        exec(compile(guard, "colab_t4.ipynb cell 2", "exec"), {"REHEARSE": False})  # the notebook's own code
