"""The checks of scripts/gpu_check.sh: one backend's checks in one process (Unsloth's import and first compile are
paid once), in order, each writing ``OUT/<backend>-<check>.json`` the moment it ends ("ok" says whether it passed),
so a run stopped by its time limit still leaves every finished check.

    python scripts/gpu_check.py --backend unsloth --out OUT [--checks steps,adapter,...] [--tiny]
    python scripts/gpu_check.py --backend peft-4bit --out OUT --checks steps,adapter [--tiny]

The checks, each against what can break on a GPU (docs/gpu.md):
  steps         one real SEAL step on real BFCL tasks (rollouts, verdicts, labels, weights, GRPO update) with a
                Qwen2.5-1.5B-shaped random policy, advantages forced to +1/-1; the trainer must be Unsloth's on
                the unsloth backend, LoRA fp32, the pad token no stop token
  parity        the LoRA gradients of the backend's loss on two multi-turn rows with environment tokens against a
                plain reference from each row's logits; parity_fp16 the same in float16 (a T4's numerics; GPU only)
  adapter       the step's adapter, saved and loaded by `seal-lite eval`'s loader into a fresh policy, is the one
                trained (on Unsloth the policy already has its own LoRA)
  over_length   an update on rows padded wider than the context (a long prompt beside a long completion): the
                LoRA moves and the loss is finite, no row is cut
  memory        one generate call per chunk of a round at 81,920 and 65,536 padded tokens, rows of mixed lengths,
                on layer-truncated models of the real widths (Qwen2.5-3B and 7B), no LoRA, peak against
                seal_lite/core/memory.py
  fit_t4, fit_24gb, fit_80gb
                a GPU recipe's widest generate call (every row at the context's width, as many as its token
                budget allows) on a full-depth model of its real shape, in a process capped to the recipe's card
                (colab-t4 15 GiB in float16, gpu-24gb 24, paper-qwen2.5-7b 80) less the CUDA context, with room
                taken for the LoRA's gradients and Adam moments: it must not run out of memory
  timing        one sample: 4 rows x 2k-token prompts, 64 new tokens; seconds and ms per decode step
  vllm          rollout.backend vllm against transformers generate: 8 rows sharing a 4k-token prompt (a task's G
                episodes), 128 new tokens each; seconds and tokens/s of both, and the memory vLLM takes (skipped
                where vLLM is not installed; 4-bit in vLLM where the policy is)

Models are random-init of the real shapes with a locally built tokenizer (benchmarks/gpu_memory.py): the GPU machine
reaches no hub. ``--tiny`` runs every check on 2-layer models of small widths, on the CPU where there is no GPU
(memory measured there as the peak resident size: benchmarks/memory_model.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_memory  # noqa: E402  (benchmarks/ is not a package: found through sys.path above)
import memory_model  # noqa: E402

from seal_lite.core import memory  # noqa: E402

TASKS = ["multi_turn_base_0", "multi_turn_base_1"]
# seconds each check may take on a GPU (x10 with --tiny); scripts/gpu_check.sh says which process runs which.
# On a fresh H200 Unsloth's first step compiles for over 100 s and its first float16 model for over 40 s.
LIMITS = {"steps": 150, "parity": 40, "parity_fp16": 60, "adapter": 30, "over_length": 30, "memory": 80, "timing": 20,
          "fit_t4": 120, "fit_24gb": 150, "fit_80gb": 150, "vllm": 90}
# fit checks: recipe, card (GiB), policy.dtype (a T4 computes in float16)
FITS = {"fit_t4": ("colab-t4", 15, "float16"), "fit_24gb": ("gpu-24gb", 24, "auto"),
        "fit_80gb": ("paper-qwen2.5-7b", 80, "auto")}
VLLM_TINY = memory.Shape(2, 128, 256, 2, 1, 64, 8192, True)
TINY_MEMORY = {"tiny-a": memory.Shape(2, 256, 1024, 4, 2, 64, 8192, True),
               "tiny-b": memory.Shape(2, 192, 512, 3, 1, 64, 8192, True)}


def steps_shape(tiny: bool) -> memory.Shape:
    return gpu_memory.TINY if tiny else gpu_memory.SHAPES["1.5b"]


def check_recipe(model_dir: str, backend: str, tiny: bool, **overrides):
    from seal_lite.core.recipe import load_recipe

    return load_recipe(None, {
        "name": "gpu-check", "policy.model": model_dir, "policy.backend": backend, "policy.lora_r": 16,
        "policy.lora_alpha": 32, "policy.gradient_checkpointing": True, "data.task_ids": TASKS,
        "grpo.tasks_per_step": 2, "grpo.steps": 1, "grpo.mini_batches": 2, "rollout.num_generations": 2,
        "rollout.backend": "transformers", "rollout.max_turns": 1, "rollout.max_model_calls": 2,
        "rollout.max_new_tokens": 8 if tiny else 64, "rollout.max_context_tokens": 8192, "diagnoser.mode": "off",
    } | overrides)


class Checks:
    """The checks of one backend, sharing one policy model directory and the trained step."""

    def __init__(self, backend: str, tiny: bool, work: Path):
        self.backend, self.tiny, self.work = backend, tiny, work
        self.trained: dict | None = None  # the step's LoRA weights, for the adapter check

    @functools.cached_property
    def model_dir(self) -> str:  # built by the first check that needs it, so a failure is that check's
        if self.backend == "unsloth":
            import unsloth  # noqa: F401  (first: it patches transformers, peft and trl, which building a model imports)
        return gpu_memory.random_model_dir(steps_shape(self.tiny), str(self.work / "model"))

    def steps(self) -> dict:
        import torch

        from seal_lite.engines.policy import count_linear4bit, load_policy
        from seal_lite.engines.store import Store
        from seal_lite.envs.bfcl import load_tasks
        from seal_lite.step.algorithm import SealStep

        recipe = check_recipe(self.model_dir, self.backend, self.tiny)
        policy = load_policy(self.model_dir, recipe)
        from seal_lite.engines.transformers_generate import TransformersGenerator
        from seal_lite.training.grpo import build_trainer  # after the policy: Unsloth patches trl on import

        tasks = {task.id: task.truncated(1) for task in load_tasks(TASKS)}
        step = SealStep(recipe, Store(self.work / "seal.db"), tasks, None)

        def forced_signal(task_ids):  # a random model fails every task: all advantages would be 0
            batch = step(task_ids)
            signs = [1.0 if index % 2 == 0 else -1.0 for index in range(len(batch.advantages))]
            return dataclasses.replace(batch, advantages=signs)

        trainer = build_trainer(policy, recipe, list(tasks), forced_signal, str(self.work / "trl"))
        trainer.args.save_strategy = "no"
        step.generator = TransformersGenerator(trainer.model, policy.tokenizer, policy.generation_mode)
        before = _trainable_snapshot(trainer.model)
        started = time.time()
        trainer.train()
        after = dict(trainer.model.named_parameters())
        moved = _entries_changed(trainer.model, before)
        trainer.model.save_pretrained(str(self.work / "adapter"))
        self.trained = {name.replace(".default", ""): p.detach().float().cpu()
                        for name, p in trainer.model.named_parameters() if "lora_" in name}
        trainer_classes = [cls.__name__ for cls in type(trainer).__mro__]
        unsloth_trainer = "UnslothGRPOTrainer" in trainer_classes
        return {
            "ok": step.step == 1 and moved > 0 and policy.backend == self.backend
            and unsloth_trainer == (self.backend == "unsloth"),
            "backend": policy.backend, "trainer": trainer_classes[:3], "unsloth_trainer": unsloth_trainer,
            "lora_changed": moved, "trainable_dtypes": sorted({str(after[n].dtype).removeprefix("torch.") for n in before}),
            "linear4bit_layers": count_linear4bit(trainer.model),
            "pad_is_stop": policy.tokenizer.pad_token_id in step.generator.stop_ids,
            "step_s": round(time.time() - started, 1), "peak_gb": _peak_gb(torch),
        }

    def adapter(self) -> dict:
        from seal_lite.runs.evaluate_bfcl import evaluation_engine

        if self.trained is None:
            return {"ok": False, "error": "the steps check did not train an adapter"}
        recipe = check_recipe(self.model_dir, self.backend, self.tiny)
        with evaluation_engine(recipe, self.work / "adapter", self.work / "eval") as generator:
            loaded = {name.replace(".default", ""): p.detach().float().cpu()
                      for name, p in generator.model.named_parameters() if "lora_" in name}
        same = sorted(loaded) == sorted(self.trained) and all(
            (loaded[name] == weight).all() for name, weight in self.trained.items())
        return {"ok": bool(same), "lora_weights": len(loaded), "trained_lora_weights": len(self.trained)}

    def parity(self) -> dict:
        return self._parity("auto")

    def parity_fp16(self) -> dict:
        """The parity check in float16, a T4's numerics (GradScaler included), on whatever GPU this is."""
        import torch

        if not torch.cuda.is_available():
            return {"ok": None, "skipped": "float16 training needs a GPU"}
        return self._parity("float16")

    def _parity(self, dtype: str) -> dict:
        """The LoRA gradients of the backend's own loss on two multi-turn rows (model tokens, a tool result, model
        tokens; one row longer, so the other is padded) against a plain reference: each row's logits alone,
        log-softmax, the loss over its model tokens only (loss_type grpo, on-policy, no KL), autograd. A loss that
        also read the environment's tokens, or read shifted positions, differs by far more than rounding."""
        import os

        import torch
        from transformers import TrainerCallback

        from seal_lite.core.types import RolloutBatch
        from seal_lite.engines.policy import load_policy

        recipe = check_recipe(self.model_dir, self.backend, self.tiny, **{
            "grpo.tasks_per_step": 1, "grpo.mini_batches": 1, "grpo.loss_type": "grpo", "grpo.beta": 0.0,
            "grpo.max_grad_norm": 1e9,  # no clipping: the gradients are compared as computed
            "policy.dtype": dtype})
        policy = load_policy(self.model_dir, recipe)
        generator = torch.Generator().manual_seed(0)
        ids = functools.partial(_token_ids, generator, len(policy.tokenizer))
        size = 1 if self.tiny else 8
        prompt = ids(64 * size)
        masks = [[1] * 8 * size + [0] * 32 * size + [1] * 8 * size,
                 [1] * 8 * size + [0] * 32 * size + [1] * 16 * size]
        batch = RolloutBatch(prompt_ids=[prompt, prompt], completion_ids=[ids(len(m)) for m in masks],
                             env_mask=masks, rewards=[1.0, 0.0], advantages=[1.0, -1.0])
        trainer = _trainer_on(policy, recipe, batch, self.work / f"trl-parity-{dtype}")
        model = trainer.model
        lora = {name: p for name, p in model.named_parameters() if p.requires_grad}
        with torch.no_grad():  # LoRA B is 0 at first, and A would then get no gradient: give both one
            for name, parameter in lora.items():
                if "lora_B" in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)

        model.train()
        model.zero_grad()
        temperature = recipe.rollout.temperature
        os.environ["UNSLOTH_RETURN_LOGITS"] = "1"  # Unsloth's training forward may skip logits otherwise
        try:
            for completion, mask, advantage in zip(batch.completion_ids, masks, batch.advantages, strict=True):
                row = torch.tensor([prompt + completion], device=model.device)
                logits = model(input_ids=row).logits[0, len(prompt) - 1 : -1].float() / temperature
                logp = logits.log_softmax(-1).gather(-1, row[0, len(prompt):, None])[:, 0]
                weights = torch.tensor(mask, device=logp.device, dtype=logp.dtype)
                (-advantage * (logp * weights).sum() / weights.sum() / len(masks)).backward()
        finally:  # the next checks' trainers run as a run's would
            os.environ.pop("UNSLOTH_RETURN_LOGITS")
        reference = {name: p.grad.detach().float().clone() for name, p in lora.items()}
        model.zero_grad()

        captured = {}

        class Capture(TrainerCallback):  # after the micro-batches' gradients add up, before the optimizer steps
            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                captured.update({name: p.grad.detach().float().clone() for name, p in lora.items()})

        trainer.add_callback(Capture())
        trainer.train()
        difference = torch.stack([(captured[n] - reference[n]).pow(2).sum() for n in reference]).sum().sqrt()
        norm = torch.stack([reference[n].pow(2).sum() for n in reference]).sum().sqrt()
        relative = float(difference / norm)
        tolerance = 1e-3 if policy.dtype == torch.float32 else 0.3  # bf16/fp16: as tests/scripted/test_grpo_reference.py
        return {"ok": relative <= tolerance, "dtype": str(policy.dtype).removeprefix("torch."),
                "relative_difference": round(relative, 5), "tolerance": tolerance,
                "reference_norm": float(norm), "model_tokens": sum(map(sum, masks)),
                "environment_tokens": sum(len(m) - sum(m) for m in masks)}

    def over_length(self) -> dict:
        """Rows padded to a long prompt plus a long completion, wider than the context: trained uncut."""
        import torch

        from seal_lite.core.types import RolloutBatch
        from seal_lite.engines.policy import load_policy

        context = 1024 if self.tiny else 8192
        recipe = check_recipe(self.model_dir, self.backend, self.tiny, **{"rollout.max_context_tokens": context,
                                                                           "grpo.tasks_per_step": 1,
                                                                           "grpo.mini_batches": 1})
        policy = load_policy(self.model_dir, recipe)
        long, short = context * 3 // 4, context // 8
        ids = functools.partial(_token_ids, torch.Generator().manual_seed(0), len(policy.tokenizer))
        env_mask = [1] * 8 + [0] * (long - 16) + [1] * 8  # model, tool results, model
        batch = RolloutBatch(prompt_ids=[ids(long), ids(short)], completion_ids=[ids(short), ids(long)],
                             env_mask=[[1] * short, env_mask], rewards=[1.0, 0.0], advantages=[1.0, -1.0])
        trainer = _trainer_on(policy, recipe, batch, self.work / "trl-long")
        before = _trainable_snapshot(trainer.model)
        loss = float(trainer.train().training_loss)
        moved = _entries_changed(trainer.model, before)
        return {"ok": moved > 0 and math.isfinite(loss), "padded_width": long + long,
                "context": context, "max_sequence_width": policy.max_sequence_width, "loss": loss,
                "lora_changed": moved}

    def memory(self) -> dict:
        """One generate call per chunk of a round at a recipe's budget, rows of mixed lengths, against the model."""
        import torch

        from seal_lite.engines.policy import load_policy
        from seal_lite.step.rollout import generation_chunks

        cuda = torch.cuda.is_available()
        engine = "unsloth" if self.backend == "unsloth" else "transformers"  # a bare model: no LoRA added
        cases = ([("tiny-a", 2048, 8192), ("tiny-b", 2048, 8192)] if self.tiny else
                 [("Qwen/Qwen2.5-3B-Instruct", 16384, 81920), ("Qwen/Qwen2.5-7B-Instruct", 16384, 65536)])
        rows = []
        for name, context, budget in cases:
            full = TINY_MEMORY[name] if self.tiny else memory.KNOWN_SHAPES[name]
            shape = dataclasses.replace(full, layers=2 if self.tiny else 4)  # real widths, truncated depth
            model_dir = gpu_memory.random_model_dir(shape, str(self.work / f"memory-{len(rows)}"))
            recipe = check_recipe(model_dir, self.backend, self.tiny, **{
                "rollout.max_context_tokens": context, "rollout.generation_token_budget": budget,
                "rollout.max_new_tokens": 16, "rollout.generation_batch_size": 16,
                # a CPU in fp32: the same kernels on every x86 CPU (bf16 is native on some only)
                "policy.dtype": "auto" if cuda else "float32"})
            policy = load_policy(model_dir, recipe)
            lengths = [context - 16 - step * (context // 10) for step in range(8)]  # mixed: 100% down to 30%
            rows_of = [SimpleNamespace(conversation=SimpleNamespace(ids=range(length))) for length in lengths]
            for chunk in generation_chunks(rows_of, recipe.rollout):
                width = len(chunk[0].conversation.ids)
                modelled = memory.generate_peak(shape, len(chunk), width, 16, policy.dtype.itemsize, engine)
                measured = _generate_peak(policy, len(chunk), width, 16, cuda)
                rows.append({"model": name, "layers": shape.layers, "rows": len(chunk), "width": width,
                             "measured_gb": _gib(measured), "model_gb": _gib(modelled),
                             "model_over_measured": round(modelled / measured, 3) if measured else None})
            del policy
            gpu_memory._empty_caches()
        return {"ok": all(row["model_over_measured"] and 0.8 <= row["model_over_measured"] <= 1.2 for row in rows),
                "engine": engine, "calls": rows}

    def fit_t4(self) -> dict:
        return self._fit(*FITS["fit_t4"])

    def fit_24gb(self) -> dict:
        return self._fit(*FITS["fit_24gb"])

    def fit_80gb(self) -> dict:
        return self._fit(*FITS["fit_80gb"])

    def _fit(self, name: str, card_gb: int, dtype: str) -> dict:
        """The recipe's widest generate call at full depth under its card's memory. --tiny: the plumbing only, a
        2-layer model at a 2,048-token context with the recipe's rows per call, uncapped."""
        import torch

        from seal_lite.core.recipe import load_recipe
        from seal_lite.engines.policy import load_policy
        from seal_lite.step.rollout import generation_chunks

        cuda = torch.cuda.is_available()
        path = ROOT / "recipes" / f"{name}.yaml"
        shipped = load_recipe(path)
        rollout = shipped.rollout
        rows_per_call = rollout.generation_token_budget // rollout.max_context_tokens
        shape = TINY_MEMORY["tiny-a"] if self.tiny else memory.KNOWN_SHAPES[shipped.policy.model]
        model_dir = self._full_model_dir(shape)
        context, new = (2048, 16) if self.tiny else (rollout.max_context_tokens, rollout.max_new_tokens)
        recipe = load_recipe(path, {
            "policy.model": model_dir, "policy.backend": self.backend, "policy.dtype": dtype if cuda else "float32",
            "policy.device": "gpu" if cuda else "auto", "rollout.backend": "transformers", "diagnoser.mode": "off",
            "rollout.max_context_tokens": context, "rollout.max_new_tokens": new,
            "rollout.generation_token_budget": rows_per_call * context})
        cap = card_gb * memory.GIB - memory.CUDA_CONTEXT  # the CUDA context lies outside the allocator's cap
        leftover = 0
        if cuda:  # what earlier checks of this process still hold (Unsloth's keep 2.3 GB) is not the recipe's
            gpu_memory._empty_caches()
            leftover = torch.cuda.memory_allocated()
            gpu_memory.cap_memory((cap + leftover) / memory.GIB)
        engine = "unsloth" if self.backend == "unsloth" else "peft"  # generate through the LoRA, as a run does
        try:
            policy = load_policy(model_dir, recipe)
            if policy.peft_config is not None:  # peft's backends: the trainer adds the LoRA, here before it does
                from peft import get_peft_model

                policy.model = get_peft_model(policy.model, policy.peft_config)
            lora = sum(p.numel() for key, p in policy.model.named_parameters() if "lora_" in key)
            optimizer_state = torch.empty(3 * lora, dtype=torch.float32, device=policy.model.device)  # grads, Adam
            width = context - new  # a row as wide as a prompt may be
            episodes = [SimpleNamespace(conversation=SimpleNamespace(ids=range(width)))] * (rows_per_call + 1)
            rows = len(generation_chunks(episodes, recipe.rollout)[0])
            resident = torch.cuda.memory_allocated() - leftover if cuda else None
            try:
                peak = _generate_peak(policy, rows, width, 16, cuda)  # 16 new tokens: the prefill is the peak
                error = None
            except torch.OutOfMemoryError as out_of_memory:
                peak, error = None, str(out_of_memory)[:300]
            total = torch.cuda.max_memory_allocated() - leftover if cuda else None
            modelled = (memory.resident_bytes(shape, policy.dtype.itemsize, True, recipe.policy.lora_r)
                        + memory.generate_peak(shape, rows, width, 16, policy.dtype.itemsize, engine))
            del policy, optimizer_state
        finally:
            gpu_memory._empty_caches()
            if cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, 0)
        return {"ok": error is None, "recipe": name, "layers": shape.layers, "rows": rows, "width": width,
                "card_gb": card_gb, "cap_gb": _gib(cap) if cuda else None,
                "leftover_gb": _gib(leftover) if cuda else None, "resident_gb": _gib(resident), "call_gb": _gib(peak),
                "peak_gb": _gib(total), "model_gb": _gib(modelled),
                "model_over_measured": round(modelled / total, 3) if total else None, "error": error}

    def _full_model_dir(self, shape: memory.Shape) -> str:
        """One random model directory per shape, shared by the fit checks (a 7B one is 15 GB)."""
        directory = self.work / f"full-{shape.layers}-{shape.hidden}"
        if not directory.exists():
            if self.backend == "unsloth":
                import unsloth  # noqa: F401  (first, as in model_dir)
            gpu_memory.random_model_dir(shape, str(directory))
        return str(directory)

    def timing(self) -> dict:
        import torch

        from seal_lite.engines.policy import load_policy

        policy = load_policy(self.model_dir, check_recipe(self.model_dir, self.backend, self.tiny))
        rows, prompt, new = (2, 256, 32) if self.tiny else (4, 2048, 64)
        ids = torch.randint(10, len(policy.tokenizer) - 10, (rows, prompt), device=policy.model.device)

        def generate_seconds(tokens: int) -> float:
            _sync(torch)
            started = time.time()
            with torch.no_grad(), policy.generation_mode(policy.model):
                policy.model.generate(input_ids=ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                                      pad_token_id=policy.tokenizer.pad_token_id)
            _sync(torch)
            return time.time() - started

        generate_seconds(1)  # warm-up: Unsloth compiles
        # The fastest of three: decode time is a difference of two timings, and one slow run on a busy machine
        # can make it negative.
        seconds = {label: min(generate_seconds(tokens) for _ in range(3)) for label, tokens in
                   (("prefill", 1), ("generate", new))}
        decode_ms = (seconds["generate"] - seconds["prefill"]) / (new - 1) * 1000
        return {"ok": True, "rows": rows, "prompt": prompt, "new_tokens": new, "prefill_s": round(seconds["prefill"], 3),
                "decode_ms_per_step": round(decode_ms, 2),
                "prefill_tokens_per_s": round(rows * prompt / seconds["prefill"])}

    def vllm(self) -> dict:
        import torch

        from seal_lite.engines.vllm_rollouts import VllmGenerator, vllm_missing

        if (missing := vllm_missing()) is not None:
            return {"ok": None, "skipped": missing}
        from seal_lite.engines.policy import load_policy
        from seal_lite.engines.transformers_generate import TransformersGenerator

        cuda = torch.cuda.is_available()
        # vLLM's CPU attention takes head sizes of 32 and up: --tiny has a model of its own
        model_dir = gpu_memory.random_model_dir(VLLM_TINY, str(self.work / "vllm-model")) if self.tiny else self.model_dir
        policy = load_policy(model_dir, check_recipe(model_dir, self.backend, self.tiny))
        rows, prompt, new = (4, 256, 16) if self.tiny else (8, 4096, 128)
        seed = torch.Generator().manual_seed(0)

        def group_batch() -> list[list[int]]:  # a task's G episodes: one prompt, each with its own last 32 tokens
            shared = _token_ids(seed, len(policy.tokenizer), prompt - 32)
            return [shared + _token_ids(seed, len(policy.tokenizer), 32) for _ in range(rows)]

        def timed(generate) -> tuple[float, int]:  # a fresh batch each time: no prompt read by an earlier call
            batch = group_batch()
            _sync(torch)
            started = time.time()
            messages = generate(batch, new, 1.0)
            _sync(torch)
            return time.time() - started, sum(len(ids) for ids in messages)

        generate = TransformersGenerator(policy.model, policy.tokenizer, policy.generation_mode).generate
        timed(generate)  # warm-up (Unsloth compiles)
        generate_s, generate_tokens = timed(generate)
        free = torch.cuda.mem_get_info()[0] if cuda else 0
        engine = VllmGenerator(model_dir, policy.tokenizer, max_model_len=prompt + new + 64, lora_rank=16,
                               dtype=str(policy.dtype).removeprefix("torch."),
                               quantized=cuda, memory_share=0.3)  # both backends here train a 4-bit policy
        taken = free - torch.cuda.mem_get_info()[0] if cuda else None
        timed(engine.generate)  # warm-up
        vllm_s, vllm_tokens = timed(engine.generate)
        cached = engine.cached_tokens / engine.prompt_tokens
        engine.close()
        return {"ok": True, "rows": rows, "prompt": prompt, "new_tokens": new,
                "generate_s": round(generate_s, 3), "generate_tokens_per_s": round(generate_tokens / generate_s, 1),
                "vllm_s": round(vllm_s, 3), "vllm_tokens_per_s": round(vllm_tokens / vllm_s, 1),
                "vllm_over_generate": round(generate_s / vllm_s * vllm_tokens / generate_tokens, 2),
                "vllm_gb": round(taken / memory.GIB, 2) if taken is not None else None,
                "prompt_tokens_cached": round(cached, 3)}


def _token_ids(generator, vocab: int, n: int) -> list[int]:
    """``n`` random ordinary token ids: no special token (pad, stop; the first few ids) inside a row."""
    import torch

    return torch.randint(10, vocab - 10, (n,), generator=generator).tolist()


def _trainer_on(policy, recipe, batch, out_dir: Path):
    """SEAL's trainer whose every step updates on ``batch``, saving nothing."""
    from seal_lite.training.grpo import build_trainer  # after the policy: Unsloth patches trl on import

    trainer = build_trainer(policy, recipe, ["task"], lambda prompts: batch, str(out_dir))
    trainer.args.save_strategy = "no"
    return trainer


def _trainable_snapshot(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _entries_changed(model, before: dict) -> int:
    """How many entries of the trainable weights differ from ``before``."""
    return sum(int((p.detach() != before[name]).sum()) for name, p in model.named_parameters() if name in before)


def _generate_peak(policy, rows: int, width: int, new: int, cuda: bool) -> int:
    """Peak bytes one left-padded generate call adds: CUDA's allocator peak, or on a CPU the peak resident size."""
    import torch

    ids = torch.randint(10, len(policy.tokenizer) - 10, (rows, width), device=policy.model.device)
    mask = torch.ones_like(ids)
    mask[1:, : width // 4] = 0  # left padding: the prefill needs its mask

    def call():
        with torch.no_grad(), policy.generation_mode(policy.model):
            policy.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                  do_sample=True, pad_token_id=policy.tokenizer.pad_token_id)

    if not cuda:
        return memory_model.measured_peak(call)
    gpu_memory._empty_caches()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    return torch.cuda.max_memory_allocated() - before


def _gib(size: int | None) -> float | None:
    return None if size is None else round(size / memory.GIB, 3)


def _peak_gb(torch) -> float | None:
    return round(torch.cuda.max_memory_allocated() / memory.GIB, 2) if torch.cuda.is_available() else None


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class CheckTimeout(Exception):
    pass


def run(backend: str, names: list[str], tiny: bool, out: Path) -> bool:
    """The checks ``names`` of ``backend`` in order; each one's JSON line goes to ``out`` as soon as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    scale = 10 if tiny else 1  # a tiny check on a shared 2-core CPU is slower than the real one on a GPU

    def on_alarm(signum, frame):
        raise CheckTimeout

    signal.signal(signal.SIGALRM, on_alarm)
    passed = True
    with tempfile.TemporaryDirectory() as directory:
        checks = Checks(backend, tiny, Path(directory))
        for name in names:
            limit = LIMITS[name]
            started = time.time()
            signal.alarm(limit * scale)
            try:
                row = getattr(checks, name)()
            except CheckTimeout:
                row = {"ok": False, "error": f"over {limit * scale} s"}
            except Exception as error:  # one JSON line whatever happens: the next check still runs
                row = {"ok": False, "error": f"{type(error).__name__}: {str(error)[:500]}"}
            finally:
                signal.alarm(0)
            row = {"check": f"{backend}-{name}", "tiny": tiny} | row | {"seconds": round(time.time() - started, 1)}
            (out / f"{backend}-{name}.json").write_text(json.dumps(row) + "\n")
            passed = passed and row["ok"] is not False  # None: skipped where it cannot run
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="peft-4bit", choices=["unsloth", "peft-4bit"])
    parser.add_argument("--checks", default=",".join(LIMITS), help=f"comma-separated, in order (default: {','.join(LIMITS)})")
    parser.add_argument("--out", type=Path, required=True, help="folder for one JSON file per check")
    parser.add_argument("--tiny", action="store_true", help="2-layer models of small widths (also on a CPU)")
    args = parser.parse_args()
    memory_model.reexec_with_malloc_settings()  # a CPU's peak resident size follows torch's allocations only so
    sys.exit(0 if run(args.backend, args.checks.split(","), args.tiny, args.out) else 1)


if __name__ == "__main__":
    main()
