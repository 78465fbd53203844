"""rollout.backend paged (seal_lite/engines/paged_rollouts.py): transformers' continuous batching on the trained
model itself, on a tiny random Llama with SmolLM2's tokenizer, fp32, so both paths must agree to float rounding.

* The generator alone: greedy tokens equal ``generate``'s on rows of different lengths, sampled log-probs are
  torch's log softmax(logits / T), a reseeded call samples alike, the model gets its attention and training mode
  back, and torch's own random state is left as it was.
* Every token is read once per episode: a group's opening once for the whole group, each next message only what
  came after its last complete block.
* Two real SEAL steps through TRL with an update between them: each step samples from the adapter the trainer
  holds at that moment, and no block computed before the update is found after it.
* A 4-bit policy (peft-4bit on the CPU, bitsandbytes' NF4 kernels) plays with its LoRA.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from seal_lite.core.recipe import load_recipe
from seal_lite.engines.paged_rollouts import BLOCK_SIZE, PagedGenerator
from seal_lite.engines.policy import count_linear4bit, load_policy
from seal_lite.engines.rollout_engine import rollout_backend, rollout_engine
from seal_lite.engines.store import Store
from seal_lite.engines.transformers_generate import TransformersGenerator
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.algorithm import SealStep
from seal_lite.training import grpo
from tests.helpers import largest_engine_gap, randomize_lora, torch_logprobs

TASK_ID = "multi_turn_base_0"


@pytest.fixture
def policy(tiny_model_dir):
    """The tiny model with a LoRA whose B is not zero (a trained adapter), in training mode as TRL holds it."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    randomize_lora(model, seed=1)
    return model.train()


def test_the_generator_samples_from_the_models_distribution_and_leaves_the_model_as_it_was(policy, smol_tokenizer):
    prompts = [smol_tokenizer(f"Task {n}: list the files, then sort them. " * (3 + 4 * n))["input_ids"]
               for n in range(3)]
    generator = PagedGenerator(policy, smol_tokenizer, cache_tokens=4096)
    greedy = generator.generate(prompts, max_new_tokens=10, temperature=0.0)
    assert greedy == TransformersGenerator(policy, smol_tokenizer).generate(prompts, 10, 0.0)
    assert policy.training and policy.get_base_model().config._attn_implementation == "sdpa"

    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    sampled = generator.generate(prompts, max_new_tokens=12, temperature=0.8)
    assert torch.equal(torch.rand(1), expected_next)  # the trainer's random state is its own
    policy.eval()
    for prompt, ids, logprobs in zip(prompts, sampled, generator.sampled_logprobs, strict=True):
        assert len(ids) == len(logprobs) >= 1
        torch.testing.assert_close(torch.tensor(logprobs), torch_logprobs(policy, prompt, ids, 0.8),
                                   rtol=0, atol=1e-4)

    generator.reseed(0, 0)
    first = generator.generate(prompts, max_new_tokens=12, temperature=0.8)
    generator.reseed(0, 0)
    assert generator.generate(prompts, max_new_tokens=12, temperature=0.8) == first  # a resumed step samples alike
    generator.reseed(0, 1)
    assert generator.generate(prompts, max_new_tokens=12, temperature=0.8) != first  # the next step does not


def test_rows_that_do_not_fit_the_pool_wait_for_room_and_play_alike(policy, smol_tokenizer):
    """Six rows of 240-420 tokens and 60 new each in a pool of 700 tokens: at most two fit at once, the others wait
    (or are set back and read again) and every row still gets generate's greedy tokens, with a log-prob each."""
    prompts = [smol_tokenizer(f"Task {n}: list the files, then sort them. " * (20 + 3 * n))["input_ids"]
               for n in range(6)]
    generator = PagedGenerator(policy, smol_tokenizer, cache_tokens=700)
    greedy = generator.generate(prompts, max_new_tokens=60, temperature=0.0)
    assert greedy == TransformersGenerator(policy, smol_tokenizer).generate(prompts, 60, 0.0)
    assert [len(logprobs) for logprobs in generator.sampled_logprobs] == [len(ids) for ids in greedy]


def test_a_group_reads_its_opening_once_and_each_message_only_what_came_after_its_blocks(policy, smol_tokenizer):
    opening = smol_tokenizer("You are a file system agent. Tools: ls, cd, sort. " * 16)["input_ids"]
    appended = smol_tokenizer(" The tool says: a.txt b.txt c.txt.")["input_ids"]
    generator = PagedGenerator(policy, smol_tokenizer, cache_tokens=4096)
    reads = []
    embeddings = policy.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda module, args, out: reads.append(args[0].numel()))
    sequences = [list(opening) for _ in range(4)]
    messages = [0] * 4

    def on_message(row, ids, logprobs):
        messages[row] += 1
        sequences[row] += ids
        if messages[row] == 3:
            return None
        sequences[row] += appended
        return sequences[row], 6

    try:
        generator.generate_continuously([list(opening)] * 4, [6] * 4, 1.0, on_message)
    finally:
        hook.remove()
    assert messages == [3] * 4
    # once each: the opening for the group, then every token an episode added (the last one is sampled, not read),
    # and up to a block less one again at each message but the first
    distinct = len(opening) + sum(len(sequence) - len(opening) - 1 for sequence in sequences)
    slack = 4 * BLOCK_SIZE + 4 * 2 * (BLOCK_SIZE - 1)  # the group's last partial block; each follow-up's
    assert distinct <= sum(reads) <= distinct + slack
    # generate in rounds reads each episode's whole context at every message
    rounds = 4 * sum(len(opening) + k * (len(appended) + 6) for k in range(3))
    assert sum(reads) < rounds / 3


def test_two_seal_steps_sample_with_the_lora_the_trainer_holds_and_no_stale_block(tmp_path, tiny_model_dir):
    recipe = load_recipe(None, {
        "interface.tool_format": "signatures", "data.task_ids": [TASK_ID], "grpo.tasks_per_step": 1,
        "grpo.steps": 2, "grpo.beta": 0.5, "grpo.learning_rate": 0.05, "grpo.micro_batch_size": 2,
        "rollout.num_generations": 2, "rollout.max_turns": 2, "rollout.max_calls_per_turn": 1,
        "rollout.max_new_tokens": 16, "rollout.max_context_tokens": 2048, "rollout.temperature": 0.9,
        "policy.dtype": "float32", "policy.lora_r": 8, "policy.lora_alpha": 16, "diagnoser.mode": "off",
        "policy.model": tiny_model_dir,
    })
    assert rollout_backend(recipe) == "paged"  # auto, on a CPU, for a policy that is no GGUF
    task = load_tasks([TASK_ID])[0].truncated(2)
    store = Store(tmp_path / "seal.db")
    policy = load_policy(tiny_model_dir, recipe)
    trainer = grpo.build_trainer(policy, recipe, [task.id], lambda task_ids: step(task_ids), str(tmp_path / "trl"))
    # A random model fails every episode, so the advantages are 0: a non-zero adapter gives the KL term (beta) a
    # gradient, and each step then updates the LoRA.
    randomize_lora(trainer.model, seed=1)
    lora = {name: p for name, p in trainer.model.named_parameters() if "lora_" in name}
    gaps, held, batches = [], [], []
    log_gap = trainer._log_engine_gap
    trainer._log_engine_gap = lambda gap: (gaps.append(gap), log_gap(gap))

    with rollout_engine(recipe, trainer.model, policy.tokenizer, tmp_path) as (generator, sync):
        seal_step = SealStep(recipe, store, {task.id: task}, generator, sync_policy=sync)

        def step(task_ids):
            held.append({name: p.detach().clone() for name, p in lora.items()})
            batches.append(seal_step(task_ids))
            return batches[-1]

        trainer.train()
        assert generator.cached_tokens > 0  # the episodes' second messages found their earlier blocks

    # each step was sampled with the adapter the trainer held, read through no block of the step before: a stale
    # block would show as a gap far above the bound, as step 2's tokens under step 1's adapter do
    assert len(gaps) == len(held) == len(batches) == 2
    for gap in gaps:
        assert gap.numel() > 0 and gap.max().item() < 1e-3
    assert max((held[1][name] - held[0][name]).abs().max().item() for name in lora) > 0.01
    with torch.no_grad():
        for name, parameter in lora.items():
            parameter.copy_(held[0][name])
    trainer.model.eval()
    assert largest_engine_gap(trainer.model, batches[1], 0.9) > 0.05
    rows = store.trajectories(step=2)
    assert len(rows) == 2 and all(row["num_model_calls"] == 2 for row in rows)


def test_a_pool_kept_across_an_update_would_be_caught(policy, smol_tokenizer, monkeypatch):
    """The check above fails for an engine that keeps its blocks: one pool for every call, as a persistent manager
    would, samples the second call through blocks of the adapter before the update."""
    from seal_lite.engines import paged_rollouts

    prompt = smol_tokenizer("List the files in the current directory, then sort them by name. " * 4)["input_ids"]
    kept = {}
    fresh = paged_rollouts._continuous_batching

    def one_pool(model, temperature, stops, cache_tokens, seed):
        if "pool" not in kept:
            kept["context"] = fresh(model, temperature, stops, cache_tokens, seed)  # never left: its pool stays
            kept["pool"] = kept["context"].__enter__()
        return contextlib.nullcontext(kept["pool"])

    generator = PagedGenerator(policy, smol_tokenizer, cache_tokens=4096)
    monkeypatch.setattr(paged_rollouts, "_continuous_batching", one_pool)
    generator.generate([prompt], max_new_tokens=4, temperature=0.8)
    randomize_lora(policy, seed=2)  # the update
    [ids] = generator.generate([prompt], max_new_tokens=4, temperature=0.8)
    policy.get_base_model().set_attn_implementation("sdpa")
    policy.eval()
    gap = (torch_logprobs(policy, prompt, ids, 0.8) - torch.tensor(generator.sampled_logprobs[0])).abs().max()
    assert gap > 0.05
    kept["context"].__exit__(None, None, None)


def test_a_4bit_policy_plays_with_its_lora(tiny_model_dir, smol_tokenizer):
    """policy.backend peft-4bit (bitsandbytes' CPU NF4 kernels), bf16 as the GPU recipes train: the engine runs the
    quantized model's own forward, so its log-probs are the policy's, LoRA included, to bf16 rounding."""
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "policy.backend": "peft-4bit",
                                "policy.dtype": "bfloat16", "policy.lora_r": 8, "policy.lora_alpha": 16})
    policy = load_policy(tiny_model_dir, recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    assert count_linear4bit(model) == 2 * 7
    randomize_lora(model, seed=1)
    prompt = smol_tokenizer("List the files in the current directory, then sort them by name.")["input_ids"]
    generator = PagedGenerator(model, smol_tokenizer, cache_tokens=2048)
    [ids] = generator.generate([prompt], max_new_tokens=8, temperature=1.0)
    model.eval()
    with_lora = torch_logprobs(model, prompt, ids, 1.0)
    with model.disable_adapter():
        without = torch_logprobs(model, prompt, ids, 1.0)
    sampled = torch.tensor(generator.sampled_logprobs[0])
    assert (with_lora - sampled).abs().max() < 0.1 < (without - sampled).abs().max()


# --- what a GPU would do differently: the attention installed libraries pick, the pool's memory, live rows -------

def test_the_engine_plays_paged_sdpa_even_where_flash_attention_is_installed(policy, smol_tokenizer, monkeypatch):
    """Given plain sdpa, transformers swaps in FlashAttention for continuous batching wherever flash-attn (or
    ``kernels``) is installed: on a T4 the first forward fails, on Ampere+ it turns on CUDA graphs and a paged
    decode whose block size must be a multiple of 256. The engine asks for ``paged|sdpa`` itself."""
    from transformers.generation.continuous_batching import continuous_api

    from seal_lite.engines import paged_rollouts

    monkeypatch.setattr(continuous_api, "is_flash_attn_3_available", lambda *args, **kwargs: False)
    monkeypatch.setattr(continuous_api, "is_flash_attn_2_available", lambda *args, **kwargs: True)  # installed
    played_with = []
    fresh = paged_rollouts._continuous_batching

    @contextlib.contextmanager
    def recording(model, *args):
        with fresh(model, *args) as pair:
            played_with.append(model.get_base_model().config._attn_implementation)
            yield pair

    monkeypatch.setattr(paged_rollouts, "_continuous_batching", recording)
    prompt = smol_tokenizer("List the files in the current directory.")["input_ids"]
    PagedGenerator(policy, smol_tokenizer, cache_tokens=2048).generate([prompt], max_new_tokens=3, temperature=1.0)
    assert played_with == ["paged|sdpa"]
    assert policy.get_base_model().config._attn_implementation == "sdpa"  # its own attention back afterwards


def test_release_hands_the_pool_back_once_nothing_holds_it(policy, smol_tokenizer, monkeypatch):
    """The step calls ``release`` once its rollouts are done, before the update: the pool must be unreferenced when
    PyTorch's cache is emptied, or its memory stays cached and the update's budget for kept suffix graphs (and
    anything else that reads the driver's free memory) sees it as taken."""
    import weakref

    from seal_lite.engines import paged_rollouts

    pools, emptied = [], []
    fresh = paged_rollouts._continuous_batching

    @contextlib.contextmanager
    def recording(*args):
        with fresh(*args) as (manager, processor):
            pools.append(weakref.ref(processor.cache.key_cache[0]))
            yield manager, processor

    monkeypatch.setattr(paged_rollouts, "_continuous_batching", recording)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append([pool() is None for pool in pools]))
    generator = PagedGenerator(policy, smol_tokenizer, cache_tokens=2048)
    generator.generate([smol_tokenizer("List the files.")["input_ids"]], max_new_tokens=3, temperature=1.0)
    generator.release()
    assert pools and emptied and emptied[-1] == [True]


def test_no_more_episodes_live_than_the_pool_holds_at_full_length(policy, smol_tokenizer, monkeypatch, tiny_model_dir):
    """colab-t4 asks for 32 live episodes where its pool holds about 11 of 16k tokens: the engine would evict and
    read again what it cannot hold. The engine a recipe gets keeps pool // context episodes live, at most the
    recipe's ``generation_batch_size``, and plays the same messages."""
    recipe = load_recipe(None, {"policy.model": tiny_model_dir, "rollout.backend": "paged",
                                "rollout.max_context_tokens": 1024, "rollout.cache_tokens": 3 * 1024 + 100,
                                "rollout.generation_batch_size": 8})
    with rollout_engine(recipe, policy, smol_tokenizer, None) as (generator, _):
        assert generator.max_live == 3
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    live, most, messages = set(), [0], {}
    prompts = [smol_tokenizer(f"Task {n}: list the files, then sort them. " * 3)["input_ids"] for n in range(6)]
    expected = TransformersGenerator(policy, smol_tokenizer).generate(prompts, 6, 0.0)
    add_request = ContinuousBatchingManager.add_request

    def counting_add_request(manager, ids, request_id, **kwargs):
        live.add(request_id)
        most[0] = max(most[0], len(live))
        return add_request(manager, ids, request_id=request_id, **kwargs)

    def on_message(row, ids, logprobs):
        live.discard(f"{row}-0")
        messages[row] = ids
        return None  # one message an episode

    monkeypatch.setattr(ContinuousBatchingManager, "add_request", counting_add_request)
    generator.generate_continuously(prompts, [6] * 6, 0.0, on_message, max_live=8)
    assert most[0] == 3 and [messages[row] for row in range(6)] == expected
