"""scripts/seal_vs_vanilla.py's held-out plays on a real model: greedy and seeded samples, scored by bfcl-eval."""

from pathlib import Path

from seal_lite.api import parse_overrides
from seal_lite.core.labels import SUCCESS_LABELS
from seal_lite.core.recipe import load_recipe
from seal_lite.envs.bfcl import load_tasks
from tests.helpers import load_script

ROOT = Path(__file__).parents[2]


def test_held_out_plays_are_scored_turn_by_turn_and_their_samples_reproduce(tmp_path):
    """SmolLM2-135M (the fastest real model) plays one held-out task of the design, two turns: once greedily and
    twice at temperature 1; every play has a verdict and a label per turn (a passed task passed every turn), and
    the samples' streams are seeded, so a second evaluation repeats them."""
    design = load_script("seal_vs_vanilla")
    settings = [*design.arm_settings("vanilla", 0, ["multi_turn_base_19", "multi_turn_base_45"]), "policy.model=smollm2-135m",
                "rollout.max_new_tokens=32"]
    recipe = load_recipe(ROOT / design.RECIPE, parse_overrides(tuple(settings)))
    tasks = [load_tasks(["multi_turn_miss_param_11"])[0].truncated(2)]
    first = design.play_held_out(recipe, None, tmp_path / "one", tasks=tasks, samples=2)
    plays = first["multi_turn_miss_param_11"]
    assert len(plays["samples"]) == 2
    for valid, labels in [plays["greedy"], *plays["samples"]]:
        assert len(labels) == 2 and (not valid or all(label in SUCCESS_LABELS for label in labels))
    assert design.play_held_out(recipe, None, tmp_path / "two", tasks=tasks, samples=2) == first


def test_a_run_trained_on_a_lost_machine_is_trained_again_before_its_held_out_plays(tmp_path):
    """A record with training but no held-out plays resumes to the plays only while the run's store is there."""
    from seal_lite.engines.store import Store

    design = load_script("seal_vs_vanilla")
    run_dir, trained = tmp_path / "vanilla-seed0", {"training": {"steps": []}}
    assert design.needs_training({}, run_dir)
    assert design.needs_training(trained, run_dir)  # no store: the adapter is gone
    run_dir.mkdir()
    store = Store(run_dir / "seal.db")
    store.start_run("vanilla-seed0", {}, "qwen2.5-coder-0.5b")
    assert design.needs_training(trained, run_dir)  # an unfinished store: its run goes on
    store.finish_run("vanilla-seed0", "finished", 1.0)
    assert not design.needs_training(trained, run_dir)
    assert not design.needs_training({**trained, "held_out": {}}, tmp_path / "gone")
