"""The arithmetic of issue 68's mechanism test (scripts/mechanism_test.py) on hand-made gradients: the first-order
reading, Adam's change against torch's own AdamW step, the clip against torch's, the relative gain, the clustered
interval, the sign-flip p, and the choice of the sets. Its model side on a tiny random Llama with a LoRA and real
BFCL tasks: log-probs aligned with generate's, the held-out objectives' gradients against their own change, the
batch gradient against a batched forward, and the three arms' advantages."""

import pytest
import torch

from tests.helpers import load_script

mechanism = load_script("mechanism_test")


def test_the_first_order_reading_is_the_dot_product_over_the_parameters():
    grads = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([[3.0]])}
    change = {"a": torch.tensor([0.5, -1.0]), "b": torch.tensor([[2.0]])}
    assert mechanism.first_order_change(grads, change) == pytest.approx(0.5 - 2.0 + 6.0)


@pytest.mark.parametrize("step", [0, 5])
def test_adams_change_is_torchs_adamw_step_from_the_same_moments(step):
    torch.manual_seed(step)  # float64: the change is read back as a difference of weights
    weight, grad = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    exp_avg, exp_avg_sq = ((torch.randn(3, 4, dtype=torch.float64) * 0.1, torch.rand(3, 4, dtype=torch.float64) * 0.01)
                           if step else (torch.zeros(3, 4, dtype=torch.float64),) * 2)
    parameter = torch.nn.Parameter(weight.clone())
    optimizer = torch.optim.AdamW([parameter], lr=1e-4, weight_decay=0.0)
    optimizer.state[parameter] = {"step": torch.tensor(float(step)), "exp_avg": exp_avg.clone(),
                                  "exp_avg_sq": exp_avg_sq.clone()}
    parameter.grad = grad.clone()
    optimizer.step()
    change = mechanism.adam_change({"w": grad}, {"w": exp_avg}, {"w": exp_avg_sq}, step, lr=1e-4)["w"]
    assert torch.allclose(change, parameter.detach() - weight, atol=1e-12, rtol=1e-7)
    if step == 0:  # the first step is lr times the gradient's sign
        assert torch.allclose(change, -1e-4 * grad.sign(), atol=1e-9)


def test_the_clip_is_torchs():
    grads = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([12.0])}
    clipped = mechanism.clip_to_norm(grads, 1.0)
    parameters = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads.values()]
    for parameter, g in zip(parameters, grads.values()):
        parameter.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    for parameter, g in zip(parameters, clipped.values()):
        assert torch.allclose(parameter.grad, g)
    assert mechanism.clip_to_norm({"a": torch.tensor([0.3])}, 1.0)["a"].item() == pytest.approx(0.3)  # under the norm


def test_the_relative_gain_is_the_mean_difference_over_vanillas_mean():
    assert mechanism.relative_gain([2.0, 4.0], [1.0, 1.0]) == pytest.approx(2.0)
    assert mechanism.relative_gain([1.0, 1.0], [1.0, 1.0]) == 0.0


def test_the_clustered_interval_resamples_states_then_batches():
    same = [[(1.3, 1.0)] * 10 for _ in range(4)]
    assert mechanism.clustered_interval(same, resamples=200) == pytest.approx((0.3, 0.3))
    # two states whose every batch gives R = 1 and R = 2: a resample's R lies between, both ends are reached
    low, high = mechanism.clustered_interval([[(2.0, 1.0)] * 5, [(3.0, 1.0)] * 5], resamples=2000)
    assert (low, high) == pytest.approx((1.0, 2.0))
    # the spread between states widens the interval beyond what the batches' own spread gives
    spread = [[(1.0 + s / 10 + b / 100, 1.0) for b in range(10)] for s in range(4)]
    pooled = [[pair for state in spread for pair in state]]
    clustered, batch_level = mechanism.clustered_interval(spread, 2000), mechanism.clustered_interval(pooled, 2000)
    assert clustered[1] - clustered[0] > batch_level[1] - batch_level[0]


def test_the_mean_interval_brackets_the_mean_and_collapses_on_equal_values():
    assert mechanism.mean_interval([0.25] * 5) == (0.25, 0.25)
    low, high = mechanism.mean_interval([0.0, 1.0] * 20)  # mean 0.5, standard error 0.079
    assert low < 0.5 < high and high - low == pytest.approx(2 * 1.96 * 0.5 / 40 ** 0.5, rel=0.1)


def test_the_sign_flip_p_matches_the_exact_one():
    # ten equal positive differences: only the two all-equal sign vectors are as extreme, exact p = 2 / 2^10
    p = mechanism.sign_flip_p([1.0] * 10, flips=200_000)
    assert p == pytest.approx(2 / 1024, rel=0.15)
    assert mechanism.sign_flip_p([0.0, 0.0, 0.0], flips=1000) == 1.0
    assert mechanism.sign_flip_p([1.0, -1.0, 0.5, -0.5], flips=5000) == pytest.approx(1.0, abs=0.01)


def test_the_sets_keep_in_range_tasks_three_per_pattern_in_the_splits_order():
    order = [f"multi_turn_base_{i}" for i in range(7)] + ["multi_turn_miss_param_1", "multi_turn_miss_param_2"]
    rates = {order[0]: 0.5, order[1]: 1 / 6, order[2]: 5 / 6, order[3]: 0.5, order[4]: 0.5, order[5]: 0.0,
             order[6]: 1.0, order[7]: 0.5}
    truth = {task_id: ["ls()"] for task_id in order[:5]} | {order[5]: ["pwd()"], order[6]: ["pwd()"],
                                                            order[7]: [], order[8]: []}
    assert mechanism.in_range_tasks(rates, truth, order) == order[:3]  # the 4th ls() is over the cap; no decline
    assert mechanism.abstention_turns(truth, order) == order[7:]


# ---- the model side, on a tiny random Llama with a LoRA -------------------------------------------------------------

@pytest.fixture(scope="module")
def lora_model(tiny_model_dir, smol_tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tests.helpers import randomize_lora

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float64),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    randomize_lora(model)  # B = 0 would leave every A's gradient at 0
    model.double().eval()  # peft makes its LoRA in fp32: all fp64 but for the norms' fp32 (below)
    return model, smol_tokenizer


def signatures():
    from seal_lite.core.interface import TrainingInterface

    return TrainingInterface(tool_format="signatures")


def test_completion_log_probs_are_those_generate_samples_from(lora_model):
    model, tokenizer = lora_model
    from seal_lite.envs.bfcl import load_tasks

    prompt = mechanism.opening_ids(tokenizer, load_tasks(["multi_turn_base_0"])[0], signatures())
    out = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    completion = out.sequences[0, len(prompt):].tolist()
    expected = [torch.log_softmax(scores[0].double(), -1)[token] for scores, token in zip(out.scores, completion)]
    with torch.no_grad():
        chosen, first = mechanism.completion_logprobs(model, prompt, completion)
    assert torch.allclose(chosen, torch.stack(expected).to(chosen.dtype), atol=1e-8)
    assert first[completion[0]] == pytest.approx(float(chosen[0]))


def test_the_objectives_gradients_predict_their_change_and_the_strict_answer_parses_back(lora_model):
    from seal_lite.core.calls import parse_calls
    from seal_lite.envs.bfcl import load_tasks

    model, tokenizer = lora_model
    actions, declines = load_tasks(["multi_turn_base_0", "multi_turn_base_3"]), load_tasks(["multi_turn_miss_param_11"])
    assert not declines[0].ground_truth[0] and all(task.ground_truth[0] for task in actions)
    for task in actions:  # what J1 scores is the ground truth as the strict parser reads it
        strict = parse_calls(mechanism.strict_answer(task.ground_truth[0]), "strict")
        assert [call.to_python() for call in strict.calls] == [call.to_python() for text in task.ground_truth[0]
                                                               for call in parse_calls(text).calls]
    values, grads = mechanism.probe_objectives(model, tokenizer, actions, declines, signatures(),
                                               twinned={actions[0].id})
    assert values["J1"] < values["J2"] < 0 and values["J3"] < 0
    alone, alone_grads = mechanism.probe_objectives(model, tokenizer, actions[1:], [], signatures())
    assert values["J1u"] == pytest.approx(alone["J1"])  # J1 over the untwinned turn alone, from the same passes
    assert all(torch.allclose(grads["J1u"][name], alone_grads["J1"][name]) for name in grads["J1u"])
    generator = torch.Generator().manual_seed(2)
    step = {name: torch.randn(p.shape, generator=generator, dtype=p.dtype) * 1e-4
            for name, p in mechanism.trainable(model).items()}
    with torch.no_grad():
        for name, p in mechanism.trainable(model).items():
            p.add_(step[name])
    moved, _ = mechanism.probe_objectives(model, tokenizer, actions, declines, signatures())
    with torch.no_grad():
        for name, p in mechanism.trainable(model).items():
            p.sub_(step[name])
    for name in ("J1", "J2", "J3"):
        predicted = mechanism.first_order_change(grads[name], step)
        assert moved[name] - values[name] == pytest.approx(predicted, rel=0.02), name


def test_the_batch_gradient_is_grpos_on_policy_and_env_tokens_carry_none(lora_model):
    """Against one padded forward of the whole batch: -mean_i A_i mean_t log p over the model's tokens."""
    from seal_lite.core.types import Trajectory

    model, tokenizer = lora_model
    generator = torch.Generator().manual_seed(3)
    trajectories = []
    for length, prompt_length in ((7, 5), (4, 9), (6, 3)):
        ids = torch.randint(0, len(tokenizer), (prompt_length + length,), generator=generator).tolist()
        mask = [1, 1, 0, 0, 1, 1, 1][:length]
        trajectories.append(Trajectory("t", 0, ids[:prompt_length], ids[prompt_length:], mask, [], []))
    advantages = [1.2, -0.7, 0.0]
    grads = mechanism.surrogate_gradient(model, trajectories, advantages)

    width = max(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories)
    ids = torch.full((3, width), tokenizer.pad_token_id)
    attention = torch.zeros(3, width, dtype=torch.long)
    for row, t in enumerate(trajectories):
        sequence = t.prompt_ids + t.completion_ids
        ids[row, :len(sequence)], attention[row, :len(sequence)] = torch.tensor(sequence), 1
    logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.double(), -1)
    terms = []
    for row, (t, advantage) in enumerate(zip(trajectories, advantages)):
        start = len(t.prompt_ids)
        chosen = logprobs[row, start - 1: start - 1 + len(t.completion_ids)].gather(
            1, torch.tensor(t.completion_ids)[:, None])[:, 0]
        mask = torch.tensor(t.env_mask, dtype=chosen.dtype)
        terms.append(-advantage * (chosen * mask).sum() / mask.sum())
    expected = mechanism.gradient_of(torch.stack(terms).mean(), mechanism.trainable(model))
    scale = max(float(g.abs().max()) for g in expected.values())
    for name in expected:  # Llama's RMSNorm computes in fp32 even in an fp64 model: agreement to about 1e-7
        assert torch.allclose(grads[name], expected[name], atol=1e-6 * scale, rtol=1e-5), name
    assert all(not g.any() for g in mechanism.surrogate_gradient(model, trajectories, [0.0] * 3).values())
    # all arms at once: each arm's gradient as if taken alone
    other = [-0.4, 0.0, 0.9]
    both = mechanism.surrogate_gradients(model, trajectories, {"a": advantages, "b": other, "none": [0.0] * 3})
    alone = mechanism.surrogate_gradient(model, trajectories, other)
    for name in expected:
        assert torch.allclose(both["a"][name], grads[name]) and torch.allclose(both["b"][name], alone[name])
        assert not both["none"][name].any()


def test_the_arms_advantages_are_grpos_and_seals_at_the_given_rho():
    from seal_lite.core.advantages import initial_utilities

    groups = [[(1.0, ["pass"]), (0.0, ["empty_turn_model_response"])],
              [(0.0, ["state_mismatch"]), (0.0, ["empty_turn_model_response"])]]
    vanilla = mechanism.arm_advantages(groups, None)
    assert vanilla[0] == pytest.approx(0.7071, abs=1e-3) and vanilla[1] == pytest.approx(-0.7071, abs=1e-3)
    assert vanilla[2:] == [0.0, 0.0]  # equal rewards: no advantage, weighted or not
    seal = mechanism.arm_advantages(groups, initial_utilities(mechanism.FIXED_POINT_RHO))
    assert seal[0] == pytest.approx(vanilla[0]) and seal[1] == pytest.approx(1.93 * vanilla[1]) and seal[2:] == [0, 0]


def test_the_result_is_read_from_the_records_with_its_decision_and_fallback(tmp_path):
    """Hand-made batch records: SEAL's J1 change is 1.5 x vanilla's in every batch, so R = +0.5 exactly, the interval
    collapses onto it and the rule does not stop; the checks disagree in sign, so the fallback reads R on them."""
    import json
    import statistics

    for state in (0, 1):
        for batch in range(3):
            vanilla = 0.01 * (1 + state + batch)
            record = {"state": state, "batch": batch,
                      "delta": {"vanilla": {"J1": vanilla, "J2": 0.0, "J3": 0.0},
                                "seal": {"J1": 1.5 * vanilla, "J2": 0.1, "J3": -0.1},
                                "seal_base": {"J1": 1.2 * vanilla, "J2": 0.0, "J3": 0.0}},
                      "cosine": {"seal": 0.9, "seal_base": 0.5 + 0.1 * state}}
            if state == 1:  # J1u recorded from state 1 on: SEAL's change is vanilla's there; rewards too
                record["rewards"] = [[1.0, 0.0], [batch / 2, 1.0]]
                record["labels"] = [[["pass"], ["state_mismatch"]], [["empty_turn_model_response"], ["pass"]]]
                for arm in ("vanilla", "seal", "seal_base"):
                    record["delta"][arm]["J1u"] = vanilla
            if batch == 0:
                record["check"] = {"vanilla": -vanilla, "seal": -3 * vanilla}  # real changes of the other sign
            (tmp_path / f"batch-state{state}-{batch}.json").write_text(json.dumps(record))
    figures = mechanism.result(tmp_path)
    assert figures["batches"] == 6 and figures["R"] == pytest.approx(0.5)
    assert figures["R_interval"] == pytest.approx((0.5, 0.5)) and figures["stop"] is False
    # every batch's relative effect is 0.5 x its vanilla change over vanilla's mean, 0.01 x (1..4) / 0.025
    assert figures["batch_sd"] == pytest.approx(0.2 * statistics.stdev([1, 2, 3, 2, 3, 4]))
    assert figures["R_by_state"] == pytest.approx({0: 0.5, 1: 0.5})
    assert figures["cosine"] == pytest.approx({"seal": 0.9, "seal_base": 0.55})
    assert figures["R_untwinned"] == {"batches": 3, "R": pytest.approx(0.0)}
    assert figures["vanilla"]["J1"] == pytest.approx(0.025) and figures["R_upper_by_seed"] == pytest.approx([0.5] * 10)
    assert figures["by_state"][1]["vanilla"] == pytest.approx(0.03) and figures["by_state"][1]["extra"] == pytest.approx(0.5)
    assert figures["by_state"][1]["reward"] == pytest.approx((3 * 2 + 0 + 0.5 + 1) / 12)  # 12 verdicts
    assert figures["by_state"][0]["reward"] == 0.0  # no rewards recorded
    assert figures["labels"] == [("pass", 6), ("state_mismatch", 3), ("empty_turn_model_response", 3)]
    assert figures["by_state"][0]["sign_flip_p"] == pytest.approx(2 / 8, abs=0.02)  # 3 positive differences
    # every resample's R is +0.5; a quarter of them draw state 1 twice, leaving state 0 out
    assert figures["R_high_resamples"]["share"] == 1.0
    assert figures["R_high_resamples"]["without_first_state"] == pytest.approx(2500, abs=200)
    assert figures["secondary"]["seal"]["J2"] == pytest.approx(0.1) and figures["secondary"]["seal_base"]["J1"] > 0
    assert figures["check"]["pairs"] == 4 and figures["check"]["signs_agree"] == 0
    assert figures["first_order_reliable"] is False and figures["R_real"] == pytest.approx(2.0)
    assert mechanism.result(tmp_path / "none") == {}


def test_the_summary_gives_no_decision_before_every_batch_is_recorded(tmp_path, capsys):
    import json

    design = mechanism.Design(records=tmp_path, state_steps=(1,), batches=2)
    (tmp_path / "sets.json").write_text(json.dumps({"probe": {"tasks": ["a"], "screened": 3},
                                                    "abstain": {"tasks": []},
                                                    "pool": {"tasks": ["b"], "screened": 3, "twins": []}}))
    deltas = {arm: {"J1": 0.1, "J2": 0.0, "J3": 0.0} for arm in mechanism.ARMS}
    for recorded, (state, batch) in enumerate([(0, 0), (0, 1), (1, 0)], start=1):  # of 2 states x 2 batches
        record = {"state": state, "batch": batch, "delta": deltas}
        (tmp_path / f"batch-state{state}-{batch}.json").write_text(json.dumps(record))
        mechanism.summary(design)
        decision = [line for line in capsys.readouterr().out.splitlines() if line.startswith("decision")]
        assert decision == [f"decision: none yet, {recorded} of the 4 batches are recorded"]
    (tmp_path / "batch-state1-1.json").write_text(json.dumps({"state": 1, "batch": 1, "delta": deltas}))
    mechanism.summary(design)
    assert "decision: stop, the interval lies below +0.15" in capsys.readouterr().out


def test_the_twinned_probes_share_their_ground_truth_with_the_pool_twins_the_sets_recorded():
    import json

    from seal_lite.envs.bfcl import load_tasks

    design = mechanism.Design()
    probes = load_tasks(design.read_set("probe"))
    twinned = mechanism.twinned_probes(probes, load_tasks(design.read_set("pool")))
    twins = json.loads((design.records / "sets.json").read_text())["pool"]["twins"]
    assert 0 < len(twinned) < len(probes)
    assert ({tuple(task.ground_truth[0]) for task in probes if task.id in twinned}
            == {tuple(task.ground_truth[0]) for task in load_tasks(twins)})
