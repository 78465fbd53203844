"""The CPU rollout engine: llama.cpp playing rollouts from the policy's GGUF plus its current LoRA.

``LlamaCppGenerator`` is the ``Generator`` of seal_lite/step/rollout.py on a CPU. All sequences of a call live in
one llama.cpp context whose KV cache has a stream of its own for each sequence (``kv_unified`` off), so:

* **Every live sequence decodes together**: one ``llama_decode`` per generated token for all rows, and the new
  text of rows (prompts, tool results, user turns) read in the same batches. Each row's attention scans only its
  own stream: in one shared (unified) cache it also scans every other sequence's cells, and 8 rows of 4,000
  distinct tokens each decoded 1.35-1.52x slower there than in streams (docs/rollouts.md).
* **Every prefix is read once.** The cache is a set of entries, each a stream and the tokens it holds. A row starts
  from the entry sharing its longest prefix: it takes that entry over (cut to the common part) when nothing else
  wants it, else gets a copy of it in a free stream (``llama_memory_seq_cp`` copies a whole stream: about 0.05 s
  for 4,000 cells of this model). A row whose prompt shares more with a live row's unread text (a task's G
  samples, tasks with the same tool block) waits until that text is read, then copies it. A trajectory's next
  call reads only what the environment appended since its last one.
* **No row waits for another's message** (``generate_continuously``): when a row's message ends, the driver runs
  its tool calls at once and the text that appends is read in the batches that decode the other rows, so an
  episode's next message starts without waiting for the longest message of a round. With ``max_live``, at most
  that many rows play at once and a waiting row takes the place of one whose episode is over.

llama.cpp splits a batch into one computation per run of consecutive stream ids, so rows take the lowest free
streams and each batch is ordered by stream. The cache holds ``streams`` sequences of ``n_ctx`` cells each,
allocated up front. A finished episode's entry stays only while a waiting row would start from it; a ``generate``
row's stays for the caller's next call until its stream is needed (the least recently used goes first). The driver (seal_lite/step/rollout.py) ends a sequence that
would pass ``n_ctx`` before it gets here.

Sampling is done here (softmax of logits / T, numpy), so the log-probability of every sampled token is known
exactly; ``sampled_logprobs`` holds them for the last ``generate`` call, aligned with its output. Each row draws
from its own generator, seeded by (seed, step, call, row), so a run reproduces whatever order rows start in.
``load_adapter`` puts a LoRA GGUF (seal_lite/engines/gguf_lora.py) on top of the base model and clears the cache.
The diagnoser's chat models, in-process or served, are seal_lite/engines/serving.py.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from seal_lite.core import timing
from seal_lite.engines.serving import BackendError, require_llama_cpp_build, usable_cores

BATCH_TOKENS = 512  # tokens per llama_decode (llama.cpp's n_batch): prefill chunks, or one token per live row
MAX_SEQUENCES = 256  # llama.cpp's own limit on sequence ids in a context (llama_max_parallel_sequences)
SPARE_STREAMS = 2  # streams beyond the live rows: prefixes kept for waiting rows and the next call
STREAM_ROUNDING = 256  # llama.cpp rounds each stream's cells up to a multiple of this


@dataclass(eq=False)
class _Entry:
    """One stream of the cache: the tokens it holds at positions 0..len-1."""

    seq: int
    tokens: list[int]
    last_used: int = 0  # the call that last used it


@dataclass(eq=False)
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
        """What must be in the cache before the row's first sample: all but its last token, which is read with
        the other rows' tokens and gives the logits of the first new token."""
        return self.ids[:-1]


class LlamaCppGenerator:
    """Rollouts with llama.cpp: the ``Generator`` of seal_lite/step/rollout.py, for the CPU.

    ``tokenizer`` is the same model's Hugging Face tokenizer (a GGUF and the model converted from it share the
    vocabulary). ``n_ctx`` is the longest sequence (the recipe's ``rollout.max_context_tokens``), and the size of
    each stream. The cache has ``live`` (the most rows played at once) + 2 streams, or ``cache_tokens`` // n_ctx
    (at least 2) when that is given; its memory is what llama.cpp allocates up front.
    """

    def __init__(self, model_path: str, tokenizer, n_ctx: int = 8192, n_threads: int | None = None, seed: int = 0,
                 lora_path: str | None = None, cache_tokens: int | None = None, live: int = 8):
        self.tokenizer, self.model_path = tokenizer, model_path
        self.n_ctx = -(-n_ctx // STREAM_ROUNDING) * STREAM_ROUNDING
        self.streams = min(max(2, cache_tokens // self.n_ctx) if cache_tokens else live + SPARE_STREAMS,
                           MAX_SEQUENCES)
        self.n_threads = n_threads or usable_cores()
        self.lora_path = lora_path
        self.seed: tuple[int, ...] = (seed,)
        self.calls = 0
        self.model = self.ctx = self.batch = self.adapter = None
        self.entries: list[_Entry] = []
        self.sampled_logprobs: list[list[float]] = []
        self.read_tokens = 0  # tokens decoded into the cache so far (prompts and fed-back samples alike)
        self.copies = 0  # streams copied so far (a prefix handed to a row that could not take it over)
        self.moves = 0  # entries moved to another stream (live rows to the lowest ones)
        self.decodes = self.computations = 0  # llama_decode calls, and the runs of consecutive streams in them
        self.held: set[int] = set()  # entries of rows whose message ended in this generate call (the caller's next)
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
            params.n_ctx, params.n_batch, params.n_ubatch = self.streams * self.n_ctx, BATCH_TOKENS, BATCH_TOKENS
            params.n_seq_max, params.kv_unified = self.streams, False  # a stream of n_ctx cells per sequence
            params.n_threads = params.n_threads_batch = self.n_threads
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            self.ctx = llama_cpp.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise BackendError(f"llama.cpp could not make a context of {self.streams} streams of {self.n_ctx} cells "
                               f"for {self.model_path} (rollout.cache_tokens sets the streams)")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(BATCH_TOKENS, 0, 1)
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.stop_ids.add(llama_cpp.llama_vocab_eos(vocab))
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
        if llama_cpp.llama_set_adapters_lora(self.ctx, adapters, 1 if adapter else 0, scales):
            raise BackendError(f"llama.cpp could not apply the LoRA {self.lora_path}")
        if self.adapter:
            llama_cpp.llama_adapter_lora_free(self.adapter)
        self.adapter = adapter
        llama_cpp.llama_memory_clear(self.memory, True)
        self.entries = []

    def close(self) -> None:
        import llama_cpp

        if self.ctx is not None:
            llama_cpp.llama_batch_free(self.batch)
            llama_cpp.llama_free(self.ctx)
            if self.adapter:
                llama_cpp.llama_adapter_lora_free(self.adapter)
            llama_cpp.llama_model_free(self.model)
        self.model = self.ctx = self.batch = self.adapter = None
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
        the same decode batches as the other rows' next tokens. At most ``max_live`` rows (None: as many as the
        cache has streams) play at once; the next waiting row starts when one's episode is over."""
        self._play(batch, budgets, temperature, on_message, max_live)

    def _play(self, batch: list[list[int]], budgets: list[int], temperature: float, on_message,
              max_live: int | None = None) -> list[_Row]:
        import numpy as np

        if self.ctx is None:
            self._open()
        self.calls, self.held = self.calls + 1, set()
        rows = [_Row(index, ids, budget, np.random.default_rng([*self.seed, self.calls, index]))
                for index, (ids, budget) in enumerate(zip(batch, budgets, strict=True))]
        for row in rows:
            if len(row.ids) + row.budget > self.n_ctx:
                raise BackendError(f"a sequence of {len(row.ids)} tokens and {row.budget} new ones passes the "
                                   f"engine's {self.n_ctx}-token streams (rollout.max_context_tokens)")
        waiting = sorted(rows, key=lambda row: row.target)  # similar rows together: neighbours share prefixes
        self._decode(waiting, temperature, on_message, min(max_live or len(rows), self.streams))
        return rows

    def _source(self, tokens: list[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that prefix's length."""
        best, length = None, 0
        for entry in self.entries:
            common = _prefix_length(entry.tokens, tokens)
            if common > length:
                best, length = entry, common
        return best, length

    def _decode(self, waiting: list[_Row], temperature: float, on_message, most: int) -> None:
        """Play every row: each live row advances by one token per llama_decode, the rows' new text is read in the
        same batches, and waiting rows join while fewer than ``most`` are live. With ``on_message``, a row whose
        message ends is continued in the same loop, until its episode is over."""
        import llama_cpp
        import numpy as np

        live: list[_Row] = []
        changed = True  # a row left, or one read its new text: waiting rows may start
        while live or waiting:
            for row in list(waiting) if changed else ():
                if len(live) < most and self._admit(row, live, waiting):
                    waiting.remove(row)
                    live.append(row)
            if not live:
                raise BackendError(f"no sequence could start in llama.cpp's {self.streams} streams")
            if changed:
                self._compact(live)
            started = time.perf_counter()
            tokens, sampling = self._next_batch(live)
            self._run(tokens)
            changed = len(tokens) > len(sampling)
            ended = []
            for i, row in sampling:
                logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                token, logprob = sample(logits, temperature, row.rng)
                row.new.append(token)
                row.logprobs.append(logprob)
                row.feed = [token]
                if token in self.stop_ids or len(row.new) >= row.budget:
                    ended.append(row)
            # a batch's time is split by its tokens: a row's sample is decode, reading new text is prefill
            seconds, read = time.perf_counter() - started, len(tokens) - len(sampling)
            timing.add("prefill", seconds * read / len(tokens))
            timing.add("decode", seconds * len(sampling) / len(tokens))
            changed = changed or bool(ended)
            for row in ended:
                live.remove(row)
                row.entry.last_used = self.calls
                if on_message is None:  # one message per row: its sequence stays for the caller's next call
                    self.held.add(id(row.entry))
                elif self._continue(row, on_message(row.index, row.new, row.logprobs)):
                    live.append(row)
                elif not self._wanted(row.entry, waiting):
                    self._drop(row.entry)  # its episode is over and no waiting row starts from it

    def _next_batch(self, live: list[_Row]) -> tuple[list[tuple[_Entry, int, bool]], list[tuple[int, _Row]]]:
        """The next llama_decode's tokens: every row's next token, then as much of the rows' new text as the
        batch holds, ordered by stream (llama.cpp computes each run of consecutive streams together); and (batch
        index, row) for each row whose logits it yields."""
        room, chunks = BATCH_TOKENS, []
        for row in sorted(live, key=lambda row: len(row.feed)):  # decoding rows first: no row waits on a long read
            take = row.feed[:room]
            del row.feed[: len(take)]
            room -= len(take)
            if take:
                chunks.append((row, take))
        tokens, sampling = [], []
        for row, take in sorted(chunks, key=lambda chunk: chunk[0].entry.seq):
            tokens += [(row.entry, token, False) for token in take]
            if not row.feed:
                tokens[-1] = (row.entry, take[-1], True)
                sampling.append((len(tokens) - 1, row))
        return tokens, sampling

    def _run(self, tokens: list[tuple[_Entry, int, bool]]) -> None:
        """One llama_decode of (entry, token, wants logits) triples, each token appended to its entry."""
        import llama_cpp

        batch = self.batch
        batch.n_tokens = len(tokens)
        for i, (entry, token, logits) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, len(entry.tokens), 1
            batch.seq_id[i][0], batch.logits[i] = entry.seq, logits
            entry.tokens.append(token)
        if (code := llama_cpp.llama_decode(self.ctx, batch)) != 0:
            raise BackendError(f"llama.cpp could not decode a batch of {len(tokens)} tokens (code {code}) in "
                               f"{self.streams} streams of {self.n_ctx} cells")
        self.read_tokens += len(tokens)
        streams = sorted({entry.seq for entry, _, _ in tokens})
        self.decodes += 1
        self.computations += 1 + sum(b != a + 1 for a, b in zip(streams, streams[1:]))

    def _admit(self, row: _Row, live: list[_Row], waiting: list[_Row]) -> bool:
        """Start a waiting row, if a stream is free for it: from the entry sharing most of it, the rest read in
        the batches that decode the others. It waits while a live row is still reading text it shares (a task's G
        samples, tasks with the same tool block), so that text is read once."""
        source, cached = self._source(row.target)
        if any(len(other.feed) > 1 and _prefix_length(other.ids, row.target) > cached for other in live):
            return False
        busy = {id(other.entry) for other in live}
        others = [other for other in waiting if other is not row]
        if source is not None and id(source) not in busy | self.held and \
                not self._wanted(source, others):
            entry = source  # nothing else wants it: taken over in place
        else:
            entry = self._free_stream(busy | {id(source)}, others)
            if entry is None:
                return False
            if cached:
                import llama_cpp

                llama_cpp.llama_memory_seq_cp(self.memory, source.seq, entry.seq, -1, -1)
                entry.tokens = list(source.tokens)
                source.last_used = self.calls
                self.copies += 1
        self._cut(entry, cached)
        row.entry, row.feed = entry, row.ids[cached:]
        return True

    def _wanted(self, entry: _Entry, waiting: list[_Row]) -> bool:
        """Whether a waiting row starts from more of ``entry`` than of any other entry."""
        others = [other for other in self.entries if other is not entry]
        return any(_prefix_length(entry.tokens, row.target) >
                   max((_prefix_length(other.tokens, row.target) for other in others), default=0) for row in waiting)

    def _free_stream(self, busy: set[int], waiting: list[_Row]) -> _Entry | None:
        """An empty entry on the lowest free stream, making room if needed: of the entries not ``busy``, the least
        recently used goes, those that waiting rows start from or a finished row of this call holds last; None
        when every stream is busy."""
        used = {entry.seq for entry in self.entries}
        free = [seq for seq in range(self.streams) if seq not in used]
        if not free:
            wanted = {id(entry) for entry in self.entries if self._wanted(entry, waiting)}
            idle = [entry for entry in self.entries if id(entry) not in busy]
            if not idle:
                return None
            doomed = min(idle, key=lambda entry: (id(entry) in wanted, id(entry) in self.held, entry.last_used))
            self._drop(doomed)
            free = [doomed.seq]
        entry = _Entry(min(free), [], self.calls)
        self.entries.append(entry)
        return entry

    def _compact(self, live: list[_Row]) -> None:
        """Move the live rows to the lowest streams: llama.cpp computes a batch once per run of consecutive streams,
        and 8 rows in two runs decoded 1.3x slower than in one. An entry in the way moves to a free stream above,
        or goes when there is none. A move copies a stream (llama.cpp does it before its next decode)."""
        low = len(live)
        holder = {entry.seq: entry for entry in self.entries}
        movers = [row for row in live if row.entry.seq >= low]
        gaps = [seq for seq in range(low) if seq not in {row.entry.seq for row in live}]
        for row, gap in zip(movers, gaps, strict=True):
            if (idle := holder.pop(gap, None)) is not None:
                spare = [seq for seq in range(low, self.streams) if seq not in holder]
                if spare:
                    self._move(idle, spare[0])
                    holder[spare[0]] = idle
                else:
                    self._drop(idle)
            holder.pop(row.entry.seq)
            self._move(row.entry, gap)
            holder[gap] = row.entry

    def _move(self, entry: _Entry, seq: int) -> None:
        """Put the entry in stream ``seq`` (empty)."""
        import llama_cpp

        llama_cpp.llama_memory_seq_cp(self.memory, entry.seq, seq, -1, -1)
        llama_cpp.llama_memory_seq_rm(self.memory, entry.seq, -1, -1)
        entry.seq = seq
        self.moves += 1

    def _drop(self, entry: _Entry) -> None:
        """Empty the entry's stream."""
        self._cut(entry, 0)
        self.entries.remove(entry)

    def _cut(self, entry: _Entry, length: int) -> None:
        """Keep the entry's first ``length`` tokens."""
        import llama_cpp

        if length < len(entry.tokens):
            llama_cpp.llama_memory_seq_rm(self.memory, entry.seq, length, -1)
            del entry.tokens[length:]
        entry.last_used = self.calls

    def _continue(self, row: _Row, reply: tuple[list[int], int] | None) -> bool:
        """Set ``row`` up for its episode's next message, if there is one; its stream holds all it has read."""
        if reply is None:
            return False
        ids, budget = reply
        if len(ids) + budget > self.n_ctx:
            raise BackendError(f"a sequence of {len(ids)} tokens and {budget} new ones passes the engine's "
                               f"{self.n_ctx}-token streams (rollout.max_context_tokens)")
        kept = min(_prefix_length(row.entry.tokens, ids), len(ids) - 1)  # the cache holds all but the last sampled
        self._cut(row.entry, kept)
        row.ids, row.budget, row.feed, row.new, row.logprobs = ids, budget, ids[kept:], [], []
        return True


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
    """How many leading tokens ``a`` and ``b`` share (compared in slices: prompts are thousands of tokens)."""
    n, start = min(len(a), len(b)), 0
    while start < n and a[start : start + 256] == b[start : start + 256]:
        start += 256
    while start < n and a[start] == b[start]:
        start += 1
    return min(start, n)
