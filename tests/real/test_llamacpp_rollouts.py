"""The llama.cpp rollout engine with SmolLM2's real GGUF: a KV cache with a stream per sequence where each distinct
prefix is read once and copied, every live sequence decoded in one batch, exact sampling log-probs, the LoRA swapped
in place (the cache dropped with it), and rows beyond the cache's streams waiting for one."""

from pathlib import Path

import numpy as np
import pytest
from llama_cpp import Llama

from seal_lite.core.interface import TrainingInterface, evaluation_interface, render_view
from seal_lite.engines.llamacpp import LlamaCppGenerator, _prefix_length
from seal_lite.engines.model_sources import gguf_path
from seal_lite.envs.bfcl import load_tasks
from seal_lite.step.rollout import TokenConversation, opening_messages
from tests.support.rounds import Rounds

SMOL = str(gguf_path("smollm2-135m"))
NEAR_TIE = 0.5  # logits: llama.cpp's sums depend on how tokens were batched; a choice closer than this may flip


@pytest.fixture(scope="module")
def prompt(smol_tokenizer):
    task = load_tasks(["multi_turn_base_1"])[0]
    view = render_view(task.visible_functions(0), TrainingInterface(True, True, (), "signatures"))
    messages = [{"role": "system", "content": view.system_prompt}, {"role": "user", "content": task.user_message(0)}]
    text = smol_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return smol_tokenizer(text, add_special_tokens=False)["input_ids"]


def _openings(tokenizer, task_ids, view="signatures"):
    interface = evaluation_interface(view)
    return [TokenConversation(tokenizer, opening_messages(task, interface)).ids for task in load_tasks(task_ids)]


def _user_turn(tokenizer) -> list[int]:
    """A user turn as SmolLM2's template appends it after a model message."""
    return tokenizer("<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)["input_ids"]


def _distinct(sequences) -> int:
    """Tokens in the prefix tree of ``sequences``: what reading every distinct prefix once costs."""
    ordered = sorted(sequences)
    return sum(len(s) - (_prefix_length(s, ordered[i - 1]) if i else 0) for i, s in enumerate(ordered))


def test_each_distinct_prefix_is_read_once_and_each_trajectory_only_what_is_new(smol_tokenizer):
    # base_1 and base_3 use the same tool classes: under BFCL's view they share the whole tool block
    first, third = _openings(smol_tokenizer, ["multi_turn_base_1", "multi_turn_base_3"], "official")
    assert _prefix_length(first, third) > 0.9 * len(first)
    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=8192, n_threads=2, seed=1)
    try:
        new = generator.generate([first, third, first, third], 12, 1.0)
        # the prompts' prefix tree (last tokens aside, decoded with the first new ones), then each row's feed
        assert generator.read_tokens == _distinct([first[:-1], third[:-1]]) + sum(len(ids) for ids in new)
        assert generator.copies == 3  # base_1's prompt to its second row, the tool block to base_3's, base_3's on
        assert len({tuple(ids) for ids in new}) > 1  # each row samples from its own generator

        generator.read_tokens = 0
        user = _user_turn(smol_tokenizer)
        follow = [ids + out + user for ids, out in zip([first, third, first, third], new)]
        again = generator.generate(list(reversed(follow)), 12, 1.0)  # order shuffled: matched by prefix
        # each continues its own cache, in place: its last sampled token and the user turn, then its new message
        assert generator.read_tokens == len(follow) * len(user) + sum(len(ids) for ids in again)
        assert generator.copies == 3

        generator.read_tokens = 0
        [later] = _openings(smol_tokenizer, ["multi_turn_base_28"], "official")  # a task that ends its episodes
        generator.generate([later], 4, 1.0)
        kept = max(_prefix_length(later, ids) for ids in (first, third))  # the shared tool block stayed cached
        assert generator.read_tokens <= len(later) - kept + 4
        assert generator.copies == 3  # it took a finished trajectory's stream over, cut to the tool block
    finally:
        generator.close()


def _agree_or_near_tie(prompts, first, second) -> int:
    """How many rows two greedy runs decoded alike; where they differ, the first difference must be a near-tie
    (the two choices' logits, under a plain llama.cpp read of the shared context, within NEAR_TIE)."""
    import llama_cpp

    reference = Llama(SMOL, n_ctx=4096, n_threads=2, flash_attn=True, verbose=False)
    try:
        for ids, a, b in zip(prompts, first, second, strict=True):
            if a != b:
                split = _prefix_length(a, b)
                reference.reset()
                reference.eval(ids + a[:split])
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(reference.ctx, -1),
                                               shape=(reference.n_vocab(),))
                assert abs(logits[a[split]] - logits[b[split]]) < NEAR_TIE, (split, a[split], b[split])
    finally:
        reference.close()
    return sum(a == b for a, b in zip(first, second))


def _each_alone(tokenizer, prompts, new_tokens: int, n_ctx: int) -> list[list[int]]:
    """Greedy outputs of each prompt in an engine of its own."""
    outputs = []
    for ids in prompts:
        engine = LlamaCppGenerator(SMOL, tokenizer, n_ctx=n_ctx, n_threads=2)
        try:
            outputs += engine.generate([ids], new_tokens, 0.0)
        finally:
            engine.close()
    return outputs


def test_batched_greedy_decoding_matches_one_sequence_at_a_time(smol_tokenizer):
    """All rows in one decode batch against each row alone in a fresh engine: the same tokens, or a near-tie."""
    prompts = _openings(smol_tokenizer, ["multi_turn_base_1", "multi_turn_base_3", "multi_turn_base_10",
                                         "multi_turn_base_28"])
    batched = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=4096, n_threads=2)
    try:
        together = batched.generate(prompts, 24, 0.0)
    finally:
        batched.close()
    alone = _each_alone(smol_tokenizer, prompts, 24, n_ctx=4096)
    # SmolLM2-135M meets near-ties often: on these prompts one to three of the four rows part at one
    assert _agree_or_near_tie(prompts, alone, together) >= 1


def test_a_cached_sequence_that_two_new_rows_start_from_is_forked_not_cut(smol_tokenizer):
    """A trajectory's cache (task A) is the longest match for two rows of one call: its own continuation and a new
    row of another task (only the common preamble). The row sorted first must not cut the cache the other still
    needs: each row decodes as it does in an engine of its own (or a near-tie)."""
    first, other = _openings(smol_tokenizer, ["multi_turn_base_1", "multi_turn_base_40"])
    engine = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2)
    try:
        [message] = engine.generate([first], 8, 0.0)
        user = _user_turn(smol_tokenizer)
        rows = [other, first + message + user]
        assert sorted(rows)[0] is other and 0 < _prefix_length(first, other) < len(first) // 2
        together = engine.generate(rows, 16, 0.0)
    finally:
        engine.close()
    alone = _each_alone(smol_tokenizer, rows, 16, n_ctx=2048)
    assert _agree_or_near_tie(rows, alone, together) >= 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_llama_cpps_log_softmax_at_the_temperature(smol_tokenizer, prompt, temperature):
    import llama_cpp

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2, seed=3)
    # the same reads in the same batches (llama.cpp's numbers depend on them), then a plain log-softmax
    reference = Llama(SMOL, n_ctx=2048, n_threads=2, flash_attn=True, verbose=False)
    try:
        [ids] = generator.generate([prompt], 16, temperature)
        [logprobs] = generator.sampled_logprobs
        rows = []
        for chunk in [prompt, *([token] for token in ids[:-1])]:
            reference.eval(chunk)
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(reference.ctx, -1),
                                              shape=(reference.n_vocab(),)).copy())
        logits = np.asarray(rows, dtype=np.float64)
        scaled = logits / temperature
        expected = scaled - scaled.max(-1, keepdims=True)
        expected -= np.log(np.exp(expected).sum(-1, keepdims=True))
        assert len(logprobs) == len(ids) > 1
        assert np.allclose(logprobs, expected[np.arange(len(ids)), ids], atol=1e-4)
    finally:
        generator.close()
        reference.close()


def test_load_adapter_changes_the_policy_in_place_and_drops_stale_caches(smol_tokenizer, prompt, tmp_path):
    import torch
    from peft import get_peft_model

    from seal_lite.core.recipe import load_recipe
    from seal_lite.engines.gguf_lora import export_lora_gguf
    from seal_lite.engines.model_sources import resolve_model
    from seal_lite.engines.policy import load_policy

    recipe = load_recipe(None, {"policy.dtype": "float32"})
    policy = load_policy(resolve_model("smollm2-135m"), recipe)
    model = get_peft_model(policy.model, policy.peft_config)
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0, 0.1)
    adapter = export_lora_gguf(model, Path(SMOL), tmp_path / "lora.gguf")

    def first_token_logprobs(generator):
        generator.reseed(0)
        before = generator.read_tokens
        [ids] = generator.generate([prompt], 4, 1.0)
        assert generator.read_tokens - before == len(prompt) - 1 + len(ids)  # the whole prompt, read afresh
        return generator.sampled_logprobs[0]

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=2048, n_threads=2)
    try:
        plain = first_token_logprobs(generator)
        generator.load_adapter(str(adapter))
        assert generator.entries == []  # the cache was computed with the old weights
        tuned = first_token_logprobs(generator)
        generator.load_adapter(None)
        again = first_token_logprobs(generator)
    finally:
        generator.close()
    assert plain != tuned
    assert np.allclose(plain, again, atol=1e-4)


def test_rows_beyond_the_caches_streams_wait_for_one(smol_tokenizer):
    """Seven prompts in an engine of two streams: each row starts when one's message has ended and its stream is
    taken (that sequence is read again if a later call wants it), and decodes as with a stream each."""
    prompts = _openings(smol_tokenizer, [f"multi_turn_base_{n}" for n in (1, 10, 28, 40, 60, 100, 150)])
    roomy = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=1024, n_threads=2)
    tight = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=1024, n_threads=2, cache_tokens=2048)
    try:
        expected = roomy.generate(prompts, 16, 0.0)
        got = tight.generate(prompts, 16, 0.0)
        assert (roomy.streams, tight.streams) == (10, 2) and len(tight.entries) == 2
        assert _agree_or_near_tie(prompts, expected, got) >= len(prompts) // 2
    finally:
        roomy.close()
        tight.close()


def test_every_llama_cpp_reads_prompts_with_the_threads_it_was_given(smol_tokenizer):
    """llama-cpp-python reads prompts with the machine's whole CPU count unless told (2 here): a process pinned to
    fewer cores (taskset, a cgroup, one core per process of a several-process run) would oversubscribe them."""
    import llama_cpp

    from seal_lite.engines.serving import InProcessModel, LocalServer

    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=512, n_threads=1)
    generator.generate([[1, 2, 3]], 1, 0.0)
    assert (llama_cpp.llama_n_threads(generator.ctx), llama_cpp.llama_n_threads_batch(generator.ctx)) == (1, 1)
    generator.close()
    assert InProcessModel(SMOL, n_ctx=512, n_threads=1).llm.context_params.n_threads_batch == 1
    with LocalServer(SMOL, n_ctx=512, n_threads=1) as server:
        argv = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().decode().split("\0")
    assert argv[argv.index("--n_threads_batch") + 1] == "1"


def _continuous_setup():
    from seal_lite.core.recipe import load_recipe

    rollout = load_recipe(None, {"rollout.max_turns": 2, "rollout.max_new_tokens": 48}).rollout
    tasks = [task.truncated(2) for task in load_tasks(["multi_turn_base_1", "multi_turn_miss_param_103"])]
    return rollout, [(task, evaluation_interface("signatures")) for task in tasks]


def _plain_read_gaps(trajectories) -> list[float]:
    """For every generated token, how far its logit is below the best one under a plain llama.cpp read of all
    that precedes it: 0 where it is the argmax."""
    llm = Llama(SMOL, n_ctx=4096, n_threads=2, flash_attn=True, logits_all=True, verbose=False)
    gaps = []
    try:
        for t in trajectories:
            ids = t.prompt_ids + t.completion_ids
            llm.reset()
            llm.eval(ids)
            scores = np.asarray(llm.scores[: len(ids)])
            for position, (token, generated) in enumerate(zip(t.completion_ids, t.env_mask)):
                if generated:
                    row = scores[len(t.prompt_ids) + position - 1]
                    gaps.append(float(row.max() - row[token]))
    finally:
        llm.close()
    return gaps


def test_continuous_play_reads_each_token_once_and_decodes_as_a_plain_read(smol_tokenizer):
    """Episodes played continuously (a row's tool results and next user turn read in the batches that decode the
    other rows): each token of each episode is read once, and every greedy token is the argmax of a plain
    llama.cpp read of what precedes it (or a near-tie): the cache held each row's own conversation."""
    from seal_lite.step.rollout import rollout_groups

    rollout, pairs = _continuous_setup()
    generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2, seed=5)
    try:
        sampled = [t for group in rollout_groups(pairs, 2, generator, rollout) for t in group]
        assert generator.calls == 1 and all(t.num_model_calls >= 2 for t in sampled)  # the whole episodes, one call
        prompts = [t.prompt_ids for t in sampled]
        # each prompt's prefix tree, then the rest once: its last token, and all after it but the last sampled
        assert generator.read_tokens == _distinct([p[:-1] for p in prompts]) + sum(len(t.completion_ids) for t in sampled)
        generator.reseed(5)
        greedy = rollout.model_copy(update={"temperature": 0.0})
        played = [t for group in rollout_groups(pairs, 1, generator, greedy) for t in group]
    finally:
        generator.close()
    gaps = _plain_read_gaps(played)
    assert len(gaps) > 60 and max(gaps) < NEAR_TIE


def test_continuous_play_matches_lockstep_rounds_also_when_rows_wait_for_a_stream(smol_tokenizer):
    """The same greedy episodes as rounds in lockstep (or a near-tie where they part), also when the cache has
    fewer streams than rows: those rows start, in the same call, when an episode is over."""
    from seal_lite.step.rollout import rollout_groups

    rollout, pairs = _continuous_setup()
    greedy = rollout.model_copy(update={"temperature": 0.0})
    played = {}
    for name, streams in (("rounds", None), ("continuous", None), ("tight", 2)):
        generator = LlamaCppGenerator(SMOL, smol_tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2,
                                      cache_tokens=streams and streams * rollout.max_context_tokens)
        try:
            engine = Rounds(generator) if name == "rounds" else generator
            played[name] = [t for group in rollout_groups(pairs, 2, engine, greedy) for t in group]
            played[name + " calls"] = generator.calls
        finally:
            generator.close()
    assert played["continuous calls"] == played["tight calls"] == 1
    for name in ("continuous", "tight"):
        for a, b in zip(played["rounds"], played[name], strict=True):
            if a.completion_ids != b.completion_ids:
                split = _prefix_length(a.completion_ids, b.completion_ids)
                assert b.env_mask[split] == 1  # they part at a model token, never in what the environment wrote
        assert max(_plain_read_gaps(played[name])) < NEAR_TIE


class _Watched(LlamaCppGenerator):
    """The engine, noting the most rows it ever decoded at once, and batches whose rows were not in the lowest
    streams (llama.cpp would compute such a batch once per run of consecutive streams)."""

    most_live = scattered = 0

    def _next_batch(self, live):
        self.most_live = max(self.most_live, len(live))
        self.scattered += sorted(row.entry.seq for row in live) != list(range(len(live)))
        return super()._next_batch(live)


def test_at_most_max_live_episodes_play_and_waiting_ones_take_the_place_of_finished_ones(smol_tokenizer):
    """An evaluation's or a screen's every episode in one call, at most ``generation_batch_size`` at once: a waiting
    episode starts when one ends, forked from the cells it shares with what was read (a sibling sample, a task with
    the same tool classes), so each token is still read once; and each greedy token is a plain read's argmax."""
    from seal_lite.step.rollout import rollout_groups

    rollout, pairs = _continuous_setup()
    more = [(task.truncated(2), pairs[0][1]) for task in load_tasks(["multi_turn_base_3", "multi_turn_base_10"])]
    pairs = pairs + more  # base_1 and base_3 share their tool classes
    capped = rollout.model_copy(update={"temperature": 0.0, "generation_batch_size": 3})
    generator = _Watched(SMOL, smol_tokenizer, n_ctx=rollout.max_context_tokens, n_threads=2)
    finished = []
    try:
        played = rollout_groups(pairs, 2, generator, capped, on_group=lambda group: finished.append(group[0].task_id))
    finally:
        generator.close()
    trajectories = [t for group in played for t in group]
    assert generator.calls == 1 and generator.most_live == 3
    assert generator.moves > 0 and generator.scattered == 0  # rows moved down when one below them finished
    assert generator.computations == generator.decodes
    assert generator.copies > 0  # a waiting episode's prompt began as a copy of what a sibling or neighbour read
    assert all(t.stop_reason is not None for t in trajectories)
    assert sorted(finished) == sorted(task.id for task, _ in pairs)  # each group reported once, when it ended
    prompts = [t.prompt_ids for t in trajectories]
    assert generator.read_tokens == _distinct([p[:-1] for p in prompts]) + sum(len(t.completion_ids) for t in trajectories)
    assert max(_plain_read_gaps(trajectories)) < NEAR_TIE
