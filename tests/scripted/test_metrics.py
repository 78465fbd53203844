"""The metric names are a contract: a step writes exactly the names seal_lite/core/metrics.py documents."""

from seal_lite.core import metrics as m
from seal_lite.core.labels import EXCLUDED_LABELS
from seal_lite.core.recipe import Recipe
from seal_lite.core.types import Explanation, NoProgress, StepReport
from seal_lite.engines.store import Store
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from tests.helpers import HalfRightOnSome

POOL = ["multi_turn_base_0", "multi_turn_base_2", "multi_turn_base_3", "multi_turn_base_5", "multi_turn_base_10"]


class AgreeingDiagnoser:
    """Answers every failed turn with the rule's own label and a hint, as a served diagnoser would."""

    def explain(self, cases):
        answers = [Explanation(key=case.key("scripted"), model="scripted", status="ok", label=case.rule_label,
                               recovery_hint="Call the tool the request names.") for case in cases]
        return answers, StepReport(turns=len(cases), unique=len(cases), asked=len(cases), new=answers)


class Recorder(NoProgress):
    def __init__(self):
        self.metrics: dict[int, dict[str, float]] = {}

    def step_finished(self, step, metrics):
        self.metrics[step] = metrics


def test_a_step_writes_exactly_the_documented_metric_names(tmp_path, smol_tokenizer):
    """Three steps with everything that adds metrics switched on (dynamic sampling, a re-screen before step 3, a
    diagnoser): every name a step emits is a documented step metric, every documented step metric is emitted,
    and the label patterns expand to exactly the labels the step's turns were given."""
    tasks = {task.id: task.truncated(2) for task in load_tasks(POOL)}
    recipe = Recipe().model_copy(deep=True)
    recipe.rollout.num_generations, recipe.rollout.parser = 4, "lenient"
    recipe.grpo.tasks_per_step, recipe.grpo.dynamic_sampling = 2, 2
    recipe.data.screen, recipe.data.rescreen_every = 4, 2
    generator = HalfRightOnSome(smol_tokenizer, list(tasks.values()), ["multi_turn_base_3", "multi_turn_base_5"])
    store, progress = Store(tmp_path / "seal.db"), Recorder()
    step = SealStep(recipe, store, tasks, generator, progress, AgreeingDiagnoser())
    for drawn in (["multi_turn_base_0", "multi_turn_base_3"], ["multi_turn_base_2", "multi_turn_base_10"]) * 2:
        step(drawn)
    emitted = {name for metrics in progress.metrics.values() for name in metrics}

    undocumented = {name for name in emitted if getattr(m.describe(name), "writer", None) != "step"}
    assert undocumented == set()
    documented = [metric for metric in m.METRICS if metric.writer == "step"]
    silent = [metric.name for metric in documented
              if not any(name == metric.name or metric.value_of(name) for name in emitted)]
    assert silent == []
    for number, metrics in progress.metrics.items():
        labels = {turn["label"] for row in store.trajectories() if row["step"] == number
                  for turn in store.turns(row["id"])}
        assert set(m.LABEL_COUNT.values_in(metrics)) == labels
        assert set(m.LABEL_RATE.values_in(metrics)) == labels - EXCLUDED_LABELS
        assert set(m.RHO.values_in(metrics)) == set(m.COUNTED_LABELS)
        assert dict(store.metrics(m.REWARD_MEAN.name))[number] == metrics[m.REWARD_MEAN.name]


def test_patterns_name_and_read_back_their_values():
    assert m.LABEL_RATE.key("pass") == "labels/pass_rate" and m.PHASE_SECONDS.key("verify") == "time/verify_s"
    metrics = {"labels/pass": 3, "labels/pass_rate": 0.5, "labels/state_mismatch_rate": 0.5, "rho/pass": 1.0}
    assert m.LABEL_RATE.values_in(metrics) == {"pass": 0.5, "state_mismatch": 0.5}
    assert m.LABEL_COUNT.values_in(metrics) == {"pass": 3}  # "pass_rate" is no label
    assert m.describe("time/rollout_s") is m.ROLLOUT_SECONDS  # a name before the pattern time/<phase>_s
    assert m.describe("time/verify_s") is m.PHASE_SECONDS and m.describe("time/nap_s") is None
    assert m.describe("grpo/loss") is m.TRL_LOG and m.describe("grpo/weight_min") is m.WEIGHT_MIN
