"""One SEAL run across two processes (gloo on this CPU), as ``accelerate launch`` starts it.

The runs are real ``seal-lite run`` processes (tiny random policy, real BFCL tasks, four tasks, two per step),
launched by accelerate with two processes, next to the same recipe in one process. Sampled generation depends on
the batch it is part of, so the policy is scripted: in every group of an even-numbered task the first half answers
the task's first turn with its ground truth and the rest with nothing; odd tasks always fail, and dynamic sampling
replaces their groups by spare tasks', rolled out on both ranks. Groups then have a learning signal, the update
really runs, and DDP really averages the two processes' gradients. The two-process store must equal the one-process store
(trajectories, rewards, labels, weights, rho, interface versions, loop state), both ranks must end with the same
LoRA weights, a killed rank must stop the run with its committed steps intact, and the same command resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from safetensors.torch import load_file

from seal_lite.core.recipe import load_recipe
from seal_lite.engines import distributed
from tests.helpers import IMPORT_TESTS

# python HARNESS SPEC run ARGS: ``seal-lite run ARGS`` with the scripted policy. SPEC (JSON) may name a rank and a
# step at which that rank SIGKILLs itself in the middle of the step's rollouts, and a file where each process
# notes the diagnosers it constructs. At the end each rank saves its LoRA weights as lora-rank<R>.safetensors.
HARNESS = IMPORT_TESTS + textwrap.dedent("""
    import json, os, signal, sys

    spec = json.loads(sys.argv[1])

    from safetensors.torch import save_file

    from seal_lite.engines import distributed

    from seal_lite.step import algorithm
    from seal_lite.step import diagnoser
    from tests.support.scripted_run import ground_truth_ids, script_generation
    from seal_lite.training import grpo

    rank, playing, trainers = distributed.rank(), {}, []
    call, build_trainer, construct = algorithm.SealStep.__call__, grpo.build_trainer, diagnoser.Diagnoser.__init__

    def scripted(tokenizer, task, index, sampled):
        if spec.get("kill") == [rank, playing["step"]]:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: this rank's groups never reach the others
        if index < 2 and int(task.id.rsplit("_", 1)[1]) % 2 == 0:
            return ground_truth_ids(tokenizer, task)
        return tokenizer("I cannot do that.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def step(self, prompts):
        playing["step"] = self.step + 1
        return call(self, prompts)

    def capture_trainer(*args, **kwargs):
        trainers.append(build_trainer(*args, **kwargs))
        return trainers[-1]

    def noting_diagnoser(self, *args, **kwargs):
        with open(spec["diagnosers"], "a") as notes:
            notes.write(f"rank {rank}\\n")
        construct(self, *args, **kwargs)

    script_generation(scripted, sample=False)  # sampled text depends on its batch: never sampled, so never used
    algorithm.SealStep.__call__, grpo.build_trainer, diagnoser.Diagnoser.__init__ = step, capture_trainer, noting_diagnoser

    from seal_lite.cli import main
    main(sys.argv[2:], prog_name="seal-lite", standalone_mode=False)
    lora = {name: p.detach().contiguous() for name, p in trainers[0].model.named_parameters() if "lora_" in name}
    save_file(lora, os.path.join(spec["out"], f"lora-rank{rank}.safetensors"))
""")

STEPS_SQL = "select step, reward_mean, weight_min, weight_max, interface_version, num_trajectories from steps"
# what SealStep computes and records: compared exactly (time/* and TRL's update figures are not)
STEP_METRICS = ("reward/", "verdict/", "labels/", "rho/", "interface/", "sampling/", "tokens/", "grpo/weight",
                "grpo/advantage_abs_mean", "grpo/groups_with_signal")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("distributed")
    recipe = {
        "name": "two-processes", "seed": 3,
        "policy": {"model": tiny_model_dir, "dtype": "float32"},
        "data": {"task_ids": [f"multi_turn_base_{index}" for index in range(4)]},
        "rollout": {"num_generations": 4, "max_new_tokens": 12, "max_model_calls": 1, "max_turns": 1,
                    "parser": "lenient", "backend": "transformers"},  # the engine the scripted policy is routed through
        "interface": {"tool_format": "signatures"},
        "diagnoser": {"mode": "off"},
        # groups of odd tasks have no signal: dynamic sampling replaces them, rolling out spare tasks on both ranks
        "grpo": {"steps": 2, "tasks_per_step": 2, "learning_rate": 1e-2, "dynamic_sampling": 2},
    }
    (work / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (work / "harness.py").write_text(HARNESS)
    return work


def _seal_lite(work, out, processes: int, *args, kill=None):
    """``seal-lite run recipe.yaml --out OUT ARGS`` in ``processes`` processes, with the scripted policy."""
    spec = json.dumps({"out": str(out), "kill": kill, "diagnosers": str(out) + ".diagnosers"})
    program = [str(work / "harness.py"), spec, "run", str(work / "recipe.yaml"), "--out", str(out), *args]
    command = distributed.launch_command(processes, program) if processes > 1 else [sys.executable, *program]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per process, as torchrun gives each of the two
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200, check=False)  # hang guard


@pytest.fixture(scope="module")
def one_process(setup):
    out = setup / "one-process"
    result = _seal_lite(setup, out, 1)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _rows(db, sql):
    with sqlite3.connect(db) as connection:
        return connection.execute(sql).fetchall()


def _store(out, diagnoser: bool = False) -> dict[str, list]:
    """What the run recorded, without wall-clock columns and the update's own figures (compared separately).
    ``diagnoser``: leave out what only the diagnoser adds (its answers and the keys pointing at them)."""
    db = out / "seal.db"
    turns = "trajectory_id, turn_index, user_text, model_calls, results, gt_calls, label, cause, evidence"
    tables = {
        "steps": _rows(db, f"{STEPS_SQL} order by step"),
        "trajectories": _rows(db, "select * from trajectories order by id"),
        "turns": _rows(db, f"select {turns}{'' if diagnoser else ', diagnosis_key'} from turns order by 1, 2"),
        "interface_versions": _rows(db, "select * from interface_versions order by version"),
        "checkpoints": [(step, path, {k: v for k, v in json.loads(state).items() if k != "diagnoser_hints"})
                        for step, path, state in _rows(db, "select step, path, seal_state from checkpoints")],
        "metrics": [row for row in _rows(db, "select step, name, value from metrics order by step, name")
                    if row[1].startswith(STEP_METRICS)],
        "runs": _rows(db, "select name, recipe, model, status from runs"),
    }
    if not diagnoser:
        tables["diagnoses"] = _rows(db, "select * from diagnoses")
    return tables


def test_two_processes_record_the_one_process_run_and_train_one_lora(setup, one_process):
    two = setup / "two-processes"
    result = _seal_lite(setup, two, 2)
    assert result.returncode == 0, result.stderr[-3000:]

    reference, store = _store(one_process), _store(two)
    assert [row[0] for row in store["steps"]] == [1, 2]
    assert len(store["trajectories"]) == 2 * 2 * 4  # each trajectory once: two steps of two tasks x 4
    assert _rows(two / "seal.db", "select count(distinct reward) from trajectories where advantage != 0") == [(2,)]
    refills = "select max(value) from metrics where name = 'sampling/groups_rolled_out'"
    assert _rows(two / "seal.db", refills)[0][0] > 2  # dynamic sampling rolled out spare tasks (on both ranks)
    for table in reference:
        assert store[table] == reference[table], table
    loss = "select step, loss from steps order by step"
    for (_, mine), (_, theirs) in zip(_rows(two / "seal.db", loss), _rows(one_process / "seal.db", loss)):
        assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-6)  # the same loss, summed in another order

    # DDP kept both ranks' LoRA weights identical, and they trained as one process would (to rounding)
    rank0, rank1 = load_file(two / "lora-rank0.safetensors"), load_file(two / "lora-rank1.safetensors")
    single = load_file(one_process / "lora-rank0.safetensors")
    assert rank0.keys() == rank1.keys() == single.keys()
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0)
    assert any("lora_B" in name and rank0[name].abs().max() > 0 for name in rank0)  # it trained
    assert all(torch.allclose(rank0[name], single[name], atol=1e-4) for name in rank0)
    adapter = load_file(two / "adapter" / "adapter_model.safetensors")  # saved once, by rank 0
    assert sorted(adapter) and all(name.endswith(".weight") for name in adapter)


def test_a_killed_rank_stops_the_run_and_the_same_command_resumes_it(setup, one_process):
    out = setup / "killed"
    # SmolLM2, not the default Qwen: this tests where the diagnoser runs, and the smaller model is cheaper
    diagnoser = ("--set", "diagnoser.mode=in_process", "--set", "diagnoser.model=smollm2-135m",
                 "--set", "diagnoser.max_per_step=1",
                 "--set", "diagnoser.max_tokens=32", "--set", "diagnoser.n_threads=1",
                 "--set", "diagnoser.timeout_s=3600")
    killed = _seal_lite(setup, out, 2, *diagnoser, kill=[1, 2])  # rank 1 dies in step 2's rollouts
    assert killed.returncode != 0
    assert f"exitcode  : {-signal.SIGKILL}" in killed.stderr or "Signal 9" in killed.stderr, killed.stderr[-3000:]
    db = out / "seal.db"
    assert _rows(db, "select step from steps") == [(1,)]  # step 2 never reached the store: rank 0 was waiting
    assert _rows(db, "select step from checkpoints") == [(1,)]
    # rank 0 stopped: it marked the run failed when its collective with the dead peer failed, or the launcher
    # stopped it first (then it is still "running"); either resumes
    assert _rows(db, "select status from runs") in ([("failed",)], [("running",)])

    resumed = _seal_lite(setup, out, 2, *diagnoser)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stdout.lower()
    store, reference = _store(out, diagnoser=True), _store(one_process, diagnoser=True)
    for table in ("steps", "trajectories", "turns", "interface_versions", "checkpoints"):
        assert store[table] == reference[table], table  # nothing lost, nothing twice
    assert _rows(db, "select status from runs") == [("finished",)]
    # one diagnoser per launch, on rank 0, and its answers are in the store
    assert (setup / "killed.diagnosers").read_text() == "rank 0\nrank 0\n"
    assert _rows(db, "select count(*) > 0 from diagnoses") == [(1,)]
    assert _rows(db, "select count(*) > 0 from turns where diagnosis_key is not null") == [(1,)]


def test_processes_must_share_whole_tasks_and_mini_batches():
    base = {"rollout.num_generations": 4, "grpo.tasks_per_step": 2}
    assert load_recipe(None, base).process_problems(1) == []
    assert load_recipe(None, base).process_problems(2) == []
    [problem] = load_recipe(None, base).process_problems(3)
    assert problem.startswith("grpo.tasks_per_step = 2:") and "set it to 3" in problem and "run 2 processes" in problem
    [problem] = load_recipe(None, base | {"grpo.mini_batches": 8}).process_problems(2)
    assert problem.startswith("grpo.mini_batches = 8:")
    [problem] = load_recipe(None, base | {"grpo.micro_batch_size": 4, "grpo.mini_batches": 2}).process_problems(2)
    assert problem.startswith("grpo.micro_batch_size = 4:")
    assert load_recipe(None, base | {"grpo.loss_type": "bnpo"}).process_problems(2)[0].startswith("grpo.loss_type")
    assert load_recipe(None, base | {"policy.backend": "unsloth"}).process_problems(2)[0].startswith("policy.backend")
    assert load_recipe(None, base | {"rollout.backend": "vllm"}).process_problems(2)[0].startswith("rollout.backend")
    # each process's micro-batch with a shared prefix: one group, or the part of one its share of a mini-batch holds
    assert load_recipe(None, base).micro_batch(processes=2) == 4
    assert load_recipe(None, base | {"grpo.mini_batches": 2}).micro_batch(processes=2) == 2
    assert load_recipe(None, base).micro_batch(False, processes=2) == 1  # without: one trajectory


def test_one_process_is_rank_0_of_1_and_shares_are_contiguous(monkeypatch):
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    assert distributed.gather({"a": 1}) == [{"a": 1}] and distributed.broadcast(3) == 3
    assert distributed.on_main(lambda: 5) == 5 and distributed.my_share([1, 2, 3]) == [1, 2, 3]
    shares = []
    for rank in range(3):
        monkeypatch.setenv("WORLD_SIZE", "3")
        monkeypatch.setenv("RANK", str(rank))
        shares.append(distributed.my_share(list(range(7))))
    assert shares == [[0, 1, 2], [3, 4], [5, 6]]


def test_processes_option_calls_accelerate_with_the_other_arguments(monkeypatch, tmp_path):
    from seal_lite.cli import main

    called = []

    def execv(path, argv):
        called.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    with pytest.raises(SystemExit):
        main(["run", "--processes", "2", "--out", str(tmp_path / "run"), "--set", "grpo.steps=1",
              "--set", "data.num_tasks=2", "--set", "grpo.tasks_per_step=2"], prog_name="seal-lite")
    [argv] = called
    launcher = argv.index("accelerate.commands.launch")
    assert argv[launcher + 1 : launcher + 4] == ["--multi_gpu", "--num_processes", "2"]
    assert argv[argv.index("-m", launcher) :] == ["-m", "seal_lite", "run", "--out", str(tmp_path / "run"),
                                                  "--set", "grpo.steps=1", "--set", "data.num_tasks=2",
                                                  "--set", "grpo.tasks_per_step=2"]
    assert not (tmp_path / "run").exists()  # nothing written before the launch


def test_processes_option_refuses_a_step_that_cannot_be_shared(tmp_path):
    from click.testing import CliRunner

    from seal_lite.cli import main

    result = CliRunner().invoke(main, ["run", "--processes", "3", "--out", str(tmp_path / "run"),
                                       "--set", "grpo.tasks_per_step=2", "--set", "data.num_tasks=4"])
    assert result.exit_code == 2
    assert "grpo.tasks_per_step = 2: each of the 3 processes rolls out whole tasks" in result.output


@pytest.mark.parametrize("launcher", ["--processes", "accelerate launch"])
def test_vllm_rollouts_in_several_processes_are_refused_before_anything_is_written(tmp_path, monkeypatch, launcher):
    """Each process's vLLM engine would take the launcher's process group as its own: untested, so refused, whether
    seal-lite is to start the processes or a launcher already has."""
    from click.testing import CliRunner

    from seal_lite.cli import main

    launches = []

    def execv(path, argv):
        launches.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    if launcher == "accelerate launch":  # what the launcher tells rank 0 of 2
        for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
            monkeypatch.setenv(name, value)
    processes = ["--processes", "2"] if launcher == "--processes" else []
    result = CliRunner().invoke(main, ["run", *processes, "--out", str(tmp_path / "run"), "--set",
                                       "rollout.backend=vllm", "--set", "grpo.tasks_per_step=2",
                                       "--set", "data.num_tasks=4"])
    assert result.exit_code == 2, result.output
    assert "rollout.backend = 'vllm': vLLM rollouts are untested in 2 processes" in result.output
    assert launches == [] and not (tmp_path / "run").exists()


def test_shipped_accelerate_configs_load():
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    root = Path(__file__).parents[2] / "recipes" / "accelerate"
    assert load_config_from_file(str(root / "ddp.yaml")).distributed_type == DistributedType.MULTI_GPU
    zero2 = load_config_from_file(str(root / "zero2.yaml"))
    assert zero2.distributed_type == DistributedType.DEEPSPEED
    deepspeed = json.loads((root.parent.parent / zero2.deepspeed_config["deepspeed_config_file"]).read_text())
    assert deepspeed["zero_optimization"]["stage"] == 2 and deepspeed["gradient_accumulation_steps"] == "auto"
