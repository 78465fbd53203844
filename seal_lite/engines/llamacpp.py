"""The CPU rollout engine: llama.cpp playing rollouts from the policy's GGUF plus its current LoRA.

``LlamaCppGenerator`` is the ``Generator`` of seal_lite/step/rollout.py on a CPU. All sequences of a call live in
one llama.cpp context with one KV cache shared by all of them (``kv_unified``), which gives two savings:

* **Every prefix is read once.** The cache is a set of entries, each a llama.cpp sequence id and the tokens it
  holds. A call's rows are matched to the entry sharing their longest prefix, and a prefix several rows share
  beyond the cache (a task's prompt for its G trajectories; BFCL's tool block for tasks with the same tool
  classes) is read once into a new entry and forked to them (``llama_memory_seq_cp``: the forked cells are
  shared, not copied). A trajectory's next call only reads what the environment appended since its last one.
* **Every live sequence decodes together**: one ``llama_decode`` per generated token for all rows, and the
  prefill of several rows' new text (tool results, user turns) in shared batches.
* **No row waits for another's message** (``generate_continuously``): when a row's message ends, the driver runs
  its tool calls at once and the text that appends is read in the batches that decode the other rows, so an
  episode's next message starts without waiting for the longest message of a round. With ``max_live``, at most
  that many rows play at once and a waiting row takes the place of one whose episode is over, its prompt read in
  the same batches (an evaluation's tasks never wait for the slowest of a fixed batch).

Attention in a shared cache scans every used cell (skipping other sequences' cells cheaply, but not for free),
so the engine drops a finished row's entry as soon as a call no longer continues it, and keeps only the few most
recent shared prefixes. It reads long new text (a prompt, a long tool result) in a side context that holds
nothing else: the sequence's cached cells are copied there, the text is read beside them alone, and the cells it
made are moved into the shared cache (``llama_state_seq_get_data``/``set_data``), where the sequence goes on.
The cache holds ``cache_tokens`` cells; rows that would not fit together are played in waves. The driver
(seal_lite/step/rollout.py) ends a sequence that alone would pass ``n_ctx`` before it gets here.

Sampling is done here (softmax of logits / T, numpy), so the log-probability of every sampled token is known
exactly; ``sampled_logprobs`` holds them for the last ``generate`` call, aligned with its output. Each row draws
from its own generator, seeded by (seed, step, call, row), so a run reproduces whatever the waves were.
``load_adapter`` puts a LoRA GGUF (seal_lite/engines/gguf_lora.py) on top of the base model and clears the cache.
The diagnoser's chat models, in-process or served, are seal_lite/engines/serving.py.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from seal_lite.core import timing
from seal_lite.engines.serving import BackendError, require_llama_cpp_build, usable_cores

BATCH_TOKENS = 512  # tokens per llama_decode (llama.cpp's n_batch): prefill chunks, or one token per live row
MAX_SEQUENCES = 256  # llama.cpp's own limit on sequence ids in a context (llama_max_parallel_sequences)
KEPT_PREFIXES = 4  # shared prefixes kept after their rows are gone, for the next call (an evaluation's next tasks)
MIN_SHARED = 32  # rows sharing fewer new tokens than this read them each (a shared entry costs a sequence id)
SIDE_READ = 256  # new tokens from which a read goes through the side context (moving 5,000 tokens' cells: 0.06 s)


@dataclass(eq=False)
class _Entry:
    """One llama.cpp sequence of the cache: the tokens it holds at positions 0..len-1."""

    seq: int
    tokens: list[int]
    parent: _Entry | None  # the entry it was forked from (it shares that entry's cells below ``own_from``)
    own_from: int  # cells at positions >= own_from were computed for this entry
    shared: bool  # a prefix read for several rows, not a row's own sequence
    children: int = 0
    last_used: int = 0

    @property
    def own(self) -> int:
        return len(self.tokens) - self.own_from


@dataclass
class _Row:
    index: int
    ids: list[int]
    budget: int  # the most tokens its message may have
    rng: object
    entry: _Entry | None = None
    feed: list[int] = field(default_factory=list)  # tokens still to read; the last one gives the next sample
    new: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @property
    def target(self) -> list[int]:
        """What must be in the cache before the row's first decode: all but its last token, which is decoded
        with the other rows' tokens and gives the logits of the first new token."""
        return self.ids[:-1]


class LlamaCppGenerator:
    """Rollouts with llama.cpp: the ``Generator`` of seal_lite/step/rollout.py, for the CPU.

    ``tokenizer`` is the same model's Hugging Face tokenizer (a GGUF and the model converted from it share the
    vocabulary). ``n_ctx`` is the longest sequence (the recipe's ``rollout.max_context_tokens``); ``cache_tokens``
    the cells of the shared cache (default four such sequences); its memory is what llama.cpp allocates up front.
    """

    def __init__(self, model_path: str, tokenizer, n_ctx: int = 8192, n_threads: int | None = None, seed: int = 0,
                 lora_path: str | None = None, cache_tokens: int | None = None):
        self.tokenizer, self.model_path, self.n_ctx = tokenizer, model_path, n_ctx
        self.cache_tokens = max(cache_tokens or 4 * n_ctx, n_ctx + BATCH_TOKENS)
        self.n_threads = n_threads or usable_cores()
        self.lora_path = lora_path
        self.seed: tuple[int, ...] = (seed,)
        self.calls = 0
        self.model = self.ctx = self.side = self.batch = self.adapter = None
        self.entries: list[_Entry] = []
        self.sampled_logprobs: list[list[float]] = []
        self.read_tokens = 0  # tokens decoded into the cache so far (prompts and fed-back samples alike)
        self.read_aside = 0  # of those, tokens read in the side context
        self.taken: list[_Entry] = []  # entries that a row of the current call continues
        self.contested: set[int] = set()  # entries that several rows of the current call start from
        from seal_lite.engines.transformers_generate import stop_ids

        self.stop_ids = stop_ids(tokenizer)

    # -- the llama.cpp context ------------------------------------------------------------------------------

    def _open(self) -> None:
        require_llama_cpp_build()
        import llama_cpp
        from llama_cpp._logger import set_verbose
        from llama_cpp._utils import suppress_stdout_stderr

        llama_cpp.llama_backend_init()
        set_verbose(False)  # llama.cpp's own log lines (every LoRA swap prints some) stay off the terminal
        with suppress_stdout_stderr(disable=False):
            self.model = llama_cpp.llama_model_load_from_file(self.model_path.encode(),
                                                               llama_cpp.llama_model_default_params())
            if not self.model:
                raise BackendError(f"llama.cpp could not load {self.model_path}")
            params = llama_cpp.llama_context_default_params()
            params.n_ctx, params.n_batch, params.n_ubatch = self.cache_tokens, BATCH_TOKENS, BATCH_TOKENS
            params.n_seq_max, params.kv_unified = MAX_SEQUENCES, True
            params.n_threads = params.n_threads_batch = self.n_threads
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED  # skips other sequences' cells
            self.ctx = llama_cpp.llama_init_from_model(self.model, params)
            params.n_ctx, params.n_seq_max = self.n_ctx + BATCH_TOKENS, 1  # one sequence: the longest row
            self.side = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx or not self.side:
            raise BackendError(f"llama.cpp could not make a context of {self.cache_tokens} cells for "
                               f"{self.model_path} (rollout.cache_tokens sets it)")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.side_memory = llama_cpp.llama_get_memory(self.side)
        self.batch = llama_cpp.llama_batch_init(BATCH_TOKENS, 0, 1)
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.stop_ids.add(llama_cpp.llama_vocab_eos(vocab))
        self.free_seqs = list(range(MAX_SEQUENCES - 1, -1, -1))
        self._apply_adapter()

    def reseed(self, *seed: int) -> None:
        self.seed, self.calls = tuple(seed), 0

    def load_adapter(self, lora_path: str | None) -> None:
        """Use a new LoRA (the policy after an update); the cache, computed with the old weights, is dropped."""
        self.lora_path = lora_path
        if self.ctx is not None:
            self._apply_adapter()

    def _apply_adapter(self) -> None:
        import llama_cpp
        from llama_cpp._utils import suppress_stdout_stderr

        adapter = None
        if self.lora_path:
            with suppress_stdout_stderr(disable=False):  # a warning per tensor on a quantized model, every step
                adapter = llama_cpp.llama_adapter_lora_init(self.model, self.lora_path.encode())
            if not adapter:
                raise BackendError(f"llama.cpp could not load the LoRA {self.lora_path}")
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(adapter) if adapter else None
        scales = (ctypes.c_float * 1)(1.0) if adapter else None
        for ctx in (self.ctx, self.side):
            if llama_cpp.llama_set_adapters_lora(ctx, adapters, 1 if adapter else 0, scales):
                raise BackendError(f"llama.cpp could not apply the LoRA {self.lora_path}")
        if self.adapter:
            llama_cpp.llama_adapter_lora_free(self.adapter)
        self.adapter = adapter
        llama_cpp.llama_memory_clear(self.memory, True)
        self.free_seqs += [entry.seq for entry in self.entries]
        self.entries = []

    def close(self) -> None:
        import llama_cpp

        if self.ctx is not None:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            llama_cpp.llama_free(self.side)
            if self.adapter:
                llama_cpp.llama_adapter_lora_free(self.adapter)
            llama_cpp.llama_model_free(self.model)
        self.model = self.ctx = self.side = self.batch = self.adapter = None
        self.entries = []

    # -- one call ---------------------------------------------------------------------------------------------

    def generate(self, batch: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
        """One message for each row of ``batch``, all rows decoded together."""
        rows = self._play(batch, [max_new_tokens] * len(batch), temperature, on_message=None)
        self.sampled_logprobs = [row.logprobs for row in rows]
        return [row.new for row in rows]

    def generate_continuously(self, batch: list[list[int]], budgets: list[int], temperature: float,
                              on_message: Callable[[int, list[int], list[float]], tuple[list[int], int] | None],
                              max_live: int | None = None) -> None:
        """Each row's messages one after another, without waiting for the other rows' (continuous batching).

        When row ``i``'s message ends (a stop token, or ``budgets[i]`` tokens), ``on_message(i, tokens, logprobs)``
        runs its episode on (tool calls, the next user turn) and returns the row's whole sequence to go on from
        and its next message's budget, or None when the episode is over. What that sequence appends is read in
        the same decode batches as the other rows' next tokens. At most ``max_live`` rows (None: all) play at
        once; the next waiting row starts when one's episode is over. A row whose continuation, or a waiting row
        whose prompt, would not fit the cache beside the live rows stops here; the caller plays its episode on in
        a later call."""
        self._play(batch, budgets, temperature, on_message, max_live)

    def _play(self, batch: list[list[int]], budgets: list[int], temperature: float, on_message,
              max_live: int | None = None) -> list[_Row]:
        import numpy as np

        if self.ctx is None:
            self._open()
        self.calls, self.taken = self.calls + 1, []
        rows = [_Row(index, ids, budget, np.random.default_rng([*self.seed, self.calls, index]))
                for index, (ids, budget) in enumerate(zip(batch, budgets, strict=True))]
        self._forget_finished(rows)
        sources = Counter(id(self._source(row.target)[0]) for row in rows)
        self.contested = {source for source, wanted in sources.items() if wanted > 1}  # never cut in place
        waiting = sorted(rows, key=lambda row: row.target)  # similar rows together: neighbours share prefixes
        most = max_live or len(rows)
        while waiting:
            played = [row for row in rows if row.entry is not None]
            if played:  # the cache cannot hold every row: those played make room (re-read next call)
                done = {id(row.entry) for row in played}
                self._evict(lambda entry, done=done: id(entry) in done)
            wave = self._waves(waiting[:most], max(budgets))[0]
            del waiting[: len(wave)]
            with timing.phase("prefill"):
                self._prefill(wave)
            self._decode(wave, temperature, on_message, waiting, most)
        return rows

    def cached_tokens(self) -> int:
        """Cells of the cache in use (each shared prefix counted once)."""
        return sum(entry.own for entry in self.entries)

    def _forget_finished(self, rows: list[_Row]) -> None:
        """Drop what this call cannot use: row entries no row continues (their episodes ended), and shared
        prefixes beyond the few most recently used. Every used cell costs attention time in every decode."""
        useful = {id(self._source(row.target)[0]) for row in rows}
        shared = sorted((e for e in self.entries if e.shared and id(e) not in useful), key=lambda e: -e.last_used)
        spare = {id(entry) for entry in shared[KEPT_PREFIXES:]}
        self._evict(lambda entry: id(entry) not in useful and (not entry.shared or id(entry) in spare))

    def _evict(self, unwanted) -> None:
        """Remove the unwanted entries that no other entry was forked from, repeatedly (a parent goes once its
        children are gone: its cells below their fork point are theirs too)."""
        import llama_cpp

        while doomed := [e for e in self.entries if e.children == 0 and unwanted(e)]:
            for entry in doomed:
                llama_cpp.llama_memory_seq_rm(self.memory, entry.seq, -1, -1)
                self.free_seqs.append(entry.seq)
                self.entries.remove(entry)
                if entry.parent is not None:
                    entry.parent.children -= 1

    def _source(self, tokens: list[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that prefix's length."""
        best, length = None, 0
        for entry in self.entries:
            common = _prefix_length(entry.tokens, tokens)
            if common > length:
                best, length = entry, common
        return best, length

    def _waves(self, rows: list[_Row], max_new_tokens: int) -> list[list[_Row]]:
        """Rows in groups whose new cells fit the cache together (usually one group), similar rows together."""
        ordered = sorted(rows, key=lambda row: row.target)
        free = self.cache_tokens - self.cached_tokens()
        waves, wave, need, previous = [], [], 0, []
        for row in ordered:
            cached = self._source(row.target)[1]
            cost = len(row.target) - max(cached, _prefix_length(previous, row.target)) + max_new_tokens + 1
            if wave and (need + cost > free or len(wave) + len(self.entries) >= MAX_SEQUENCES // 2):
                waves.append(wave)
                wave, need, free = [], 0, self.cache_tokens - self.cached_tokens()
            wave.append(row)
            need += cost
            previous = row.target
        return waves + [wave]

    def _prefill(self, rows: list[_Row]) -> None:
        """Bring every row's target into the cache, reading each distinct prefix once, and give each row an entry
        of its own. In rounds: neighbours (in sorted order) that share more with each other than with the cache
        get that common part read once into a shared entry, which the next round forks from.

        Neighbours sharing more than the cache have the same cached length (each one's source matches the other
        beyond it), so every round lengthens what some rows have cached, and the rounds end."""
        while True:
            ordered = sorted((row for row in rows if row.entry is None), key=lambda row: row.target)
            placed = [self._source(row.target) for row in ordered]
            jobs, index = [], 0
            while index < len(ordered):
                row, (source, cached) = ordered[index], placed[index]
                end, last = len(row.target), index
                while last + 1 < len(ordered):
                    common = _prefix_length(ordered[last].target, ordered[last + 1].target)
                    if common < cached + MIN_SHARED:
                        break
                    end, last = min(end, common), last + 1
                if last > index:  # several rows: their common part, read once
                    jobs.append((None, ordered[index].target[:end], source, cached))
                elif cached < end:  # one row: the rest of its target, in its own entry
                    jobs.append((row, row.target, source, cached))
                index = last + 1
            if not jobs:
                break
            self._read(jobs)
        for row in rows:
            if row.entry is None:
                row.entry = self._fork(*self._source(row.target), own=True)

    def _read(self, jobs: list[tuple[_Row | None, list[int], _Entry | None, int]]) -> None:
        """For each job (its row, or None for a shared prefix; tokens; source entry; cached length): an entry
        holding ``tokens``, forked from the source's first ``cached`` tokens; the rest is read, all jobs' tokens
        in shared batches."""
        pending = []
        for row, tokens, source, cached in jobs:
            entry = self._fork(source, cached, own=row is not None)
            if row is not None:
                row.entry = entry
            if not self._read_aside(entry, tokens[cached:]):
                pending += [(entry, token, False) for token in tokens[cached:]]
        for start in range(0, len(pending), BATCH_TOKENS):
            self._run(pending[start : start + BATCH_TOKENS])

    def _fork(self, source: _Entry | None, length: int, own: bool) -> _Entry:
        """An entry holding the source's first ``length`` tokens. For a row (``own``) whose source is a row's entry
        that no other row of the call wants and nothing was forked from (a trajectory's next call, or a finished
        episode's cache that a new one starts from), that entry itself, cut to ``length``; else a new sequence
        sharing those cells."""
        import llama_cpp

        if own and source is not None and not source.shared and source.children == 0 and \
                id(source) not in self.contested and all(entry is not source for entry in self.taken):
            llama_cpp.llama_memory_seq_rm(self.memory, source.seq, length, -1)
            del source.tokens[length:]
            source.own_from = min(source.own_from, length)
            self.taken.append(source)
            return source
        if not self.free_seqs:
            raise BackendError(f"llama.cpp's {MAX_SEQUENCES} sequences are all in use")
        entry = _Entry(self.free_seqs.pop(), source.tokens[:length] if length else [], source if length else None,
                       length, shared=not own, last_used=self.calls)
        if length:
            llama_cpp.llama_memory_seq_cp(self.memory, source.seq, entry.seq, 0, length)
            source.children += 1
            source.last_used = self.calls
        self.entries.append(entry)
        if own:
            self.taken.append(entry)
        return entry

    def _run(self, tokens: list[tuple[_Entry, int, bool]], ctx=None) -> None:
        """One llama_decode of (entry, token, wants logits) triples, each token appended to its entry; in the
        shared context, or in ``ctx``."""
        import llama_cpp

        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (entry, token, logits) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, len(entry.tokens), 1
            batch.seq_id[i][0], batch.logits[i] = entry.seq, logits
            entry.tokens.append(token)
        if (code := llama_cpp.llama_decode(ctx or self.ctx, batch)) != 0:
            raise BackendError(f"llama.cpp could not decode a batch of {len(tokens)} tokens (code {code}); "
                               f"{self.cached_tokens()} of {self.cache_tokens} cache cells in use "
                               "(rollout.cache_tokens sets the cache)")
        self.read_tokens += len(tokens)

    def _read_aside(self, entry: _Entry, tokens: list[int]) -> bool:
        """Append ``tokens`` (at least ``SIDE_READ`` of them) to ``entry`` by reading them in the side context: the
        entry's cells are copied there, the tokens read beside them alone, and the cells they made moved into the
        shared cache under the entry's sequence. In the shared cache attention would also scan every other
        sequence's cells: a 5,000-token prompt beside 16,384 of them read 1.4-1.5x slower there (the copies took
        0.06 s). False, with nothing changed, for short text or when the shared cache has no contiguous room."""
        import llama_cpp

        if len(tokens) < SIDE_READ or not self.free_seqs:
            return False
        held = len(entry.tokens)
        if held and not self._move(self.ctx, entry.seq, self.side, 0):
            llama_cpp.llama_memory_clear(self.side_memory, True)
            return False
        aside = _Entry(seq=0, tokens=list(entry.tokens), parent=None, own_from=0, shared=False)
        for start in range(0, len(tokens), BATCH_TOKENS):
            self._run([(aside, token, False) for token in tokens[start : start + BATCH_TOKENS]], self.side)
        llama_cpp.llama_memory_seq_rm(self.side_memory, 0, 0, held)  # only the new cells go back
        spare = self.free_seqs[-1]
        moved = self._move(self.side, 0, self.ctx, spare)
        llama_cpp.llama_memory_clear(self.side_memory, True)
        if not moved:
            self.read_tokens -= len(tokens)  # read again in the shared cache
            return False
        llama_cpp.llama_memory_seq_cp(self.memory, spare, entry.seq, -1, -1)  # the cells become the entry's
        llama_cpp.llama_memory_seq_rm(self.memory, spare, -1, -1)
        entry.tokens += tokens
        self.read_aside += len(tokens)
        return True

    @staticmethod
    def _move(source, source_seq: int, target, target_seq: int) -> bool:
        """Copy one sequence's cells (their positions, keys and values) from one context into another."""
        import llama_cpp

        size = llama_cpp.llama_state_seq_get_size(source, source_seq)
        data = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(source, data, size, source_seq)
        return written > 0 and llama_cpp.llama_state_seq_set_data(target, data, written, target_seq) > 0

    def _decode(self, rows: list[_Row], temperature: float, on_message, waiting: list[_Row], most: int) -> None:
        """Sample every row's message, each live row advancing by one token per llama_decode; with ``on_message``,
        a row whose message ends is continued in the same loop (what its episode appended is read in the batches
        that decode the others), and when one's episode is over, ``waiting`` rows join while fewer than ``most``
        are live."""
        import llama_cpp
        import numpy as np

        for row in rows:
            row.feed = [row.ids[-1]]  # its logits give the first new token
        live = list(rows)
        while live:
            started = time.perf_counter()
            tokens, sampling = self._next_batch(live)
            self._run(tokens)
            ended = []
            for i, row in sampling:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                token, logprob = sample(logits, temperature, row.rng)
                row.new.append(token)
                row.logprobs.append(logprob)
                row.feed = [token]
                if token in self.stop_ids or len(row.new) >= row.budget:
                    ended.append(row)
            timing.add("decode", time.perf_counter() - started)
            for row in ended:
                live.remove(row)
                row.entry.last_used = self.calls
                if on_message is None:  # one message per row: its sequence stays for the caller's next call
                    continue
                if self._continue(row, on_message(row.index, row.new, row.logprobs), live, waiting):
                    live.append(row)
            while waiting and len(live) < most and self._admit(waiting[0], live):
                live.append(waiting.pop(0))

    def _next_batch(self, live: list[_Row]) -> tuple[list[tuple[_Entry, int, bool]], list[tuple[int, _Row]]]:
        """The next llama_decode's tokens: every row's next token, then as much of the rows' fed-back text as the
        batch holds; and (batch index, row) for each row whose logits it yields."""
        tokens, sampling = [], []
        for row in sorted(live, key=lambda row: len(row.feed)):  # decoding rows first: no row waits on a long read
            take = row.feed[: BATCH_TOKENS - len(tokens)]
            del row.feed[: len(take)]
            for token in take:
                tokens.append((row.entry, token, False))
            if take and not row.feed:
                tokens[-1] = (row.entry, take[-1], True)
                sampling.append((len(tokens) - 1, row))
        return tokens, sampling

    def _continue(self, row: _Row, reply: tuple[list[int], int] | None, live: list[_Row], waiting: list[_Row]) -> bool:
        """Set ``row`` up for its episode's next message, if there is one and it fits the cache beside the live
        rows' messages; else retire its sequence when its episode is over."""
        import llama_cpp

        entry = row.entry
        if reply is None:
            self._retire(entry, waiting)
            return False
        ids, budget = reply
        kept = min(_prefix_length(entry.tokens, ids), len(ids) - 1)  # the cache holds all but the last sampled
        if len(ids) - kept + budget > self._room(live):
            return False
        if kept < len(entry.tokens):
            llama_cpp.llama_memory_seq_rm(self.memory, entry.seq, kept, -1)
            del entry.tokens[kept:]
            entry.own_from = min(entry.own_from, kept)
        with timing.phase("prefill"):
            if self._read_aside(entry, ids[kept:-1]):
                kept = len(ids) - 1
        row.ids, row.budget, row.feed, row.new, row.logprobs = ids, budget, ids[kept:], [], []
        return True

    def _admit(self, row: _Row, live: list[_Row]) -> bool:
        """Start a waiting row beside the live ones, if its new cells fit: forked from the entry sharing most of
        it, the rest read in the batches that decode the others. It waits while a live row is still reading text
        it shares (a task's G samples, tasks with the same tool block), so that text is read once."""
        source, cached = self._source(row.target)
        if any(len(other.feed) > 1 and _prefix_length(other.ids, row.target) > cached for other in live):
            return False
        if len(row.ids) - cached + row.budget > self._room(live) or len(self.entries) >= MAX_SEQUENCES // 2:
            return False
        row.entry = self._fork(source, cached, own=True)
        with timing.phase("prefill"):
            if self._read_aside(row.entry, row.target[cached:]):
                cached = len(row.target)
        row.feed = row.ids[cached:]
        return True

    def _room(self, live: list[_Row]) -> int:
        """Cache cells neither in use nor promised to the live rows (what they still read and may generate)."""
        return self.cache_tokens - self.cached_tokens() - sum(r.budget - len(r.new) + len(r.feed) for r in live)

    def _retire(self, entry: _Entry, waiting: list[_Row]) -> None:
        """A finished episode's entry: the cells that rows forked from it or waiting rows share (a task's next
        sample, a task with the same tool block) stay, as a shared prefix; the rest go, and so do the shared
        prefixes no waiting row starts from (every used cell costs attention time in every decode)."""
        import llama_cpp

        keep = max([child.own_from for child in self.entries if child.parent is entry] +
                   [_prefix_length(entry.tokens, row.target) for row in waiting], default=0)
        if entry.children or (keep > entry.own_from and keep >= MIN_SHARED):
            llama_cpp.llama_memory_seq_rm(self.memory, entry.seq, keep, -1)
            del entry.tokens[keep:]
            entry.own_from, entry.shared = min(entry.own_from, keep), True
        wanted = {id(self._source(row.target)[0]) for row in waiting}
        self._evict(lambda candidate: (candidate is entry and not entry.shared)
                    or (candidate.shared and id(candidate) not in wanted))


def sample(logits, temperature: float, rng) -> tuple[int, float]:
    """(token, its log-probability) from softmax(logits / T); temperature 0 is greedy (argmax)."""
    import numpy as np

    scaled = logits / temperature if temperature > 0 else logits
    scaled = scaled - scaled.max()
    cumulative = np.cumsum(np.exp(scaled), dtype=np.float64)
    if temperature > 0:
        token = min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")), len(logits) - 1)
    else:
        token = int(np.argmax(scaled))
    return token, float(scaled[token] - np.log(cumulative[-1]))


def _prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (numpy: prompts are thousands of tokens)."""
    import numpy as np

    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n
