"""Structured outputs in the scheduler: grammar compiles off the step loop, one matcher per request, and the
per-step token bitmask that travels to the executors with the SchedulerOutput.

- `submit` starts (or joins) the compile of a request's constraint on a small thread pool; compiles are
  keyed by the constraint, so the n children of one API request and repeated schemas share one compile
  (an LRU of key -> Future). xgrammar's compile releases the GIL, so the step loop keeps running.
- `poll` tells the scheduler whether a waiting request's grammar is ready (it then gets its own matcher,
  with the request's EOS ids as the grammar's stop tokens), failed, or past its deadline.
- `fill` writes the masks of this step's sampling rows into one preallocated [max_num_seqs, W] int32 buffer
  in a single batched call (C++ threads, no GIL) and returns them as `GrammarRows`.
- `accept` advances a matcher by the sampled token (by each accepted token, under speculative decoding).

xgrammar and the tokenizer are imported and loaded in the compile worker at the first structured request:
the scheduler process stays torch-free until then (xgrammar imports torch).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np

from engine.config import EngineConfig
from engine.messages import GrammarRows
from engine.sampling_params import StructuredOutputsParams
from engine.structured_spec import to_grammar, words_per_row

MAX_CACHED_GRAMMARS = 256


class _CompilePool:
    """A few daemon threads running compiles. Not a ThreadPoolExecutor: its threads are joined at interpreter
    exit, and an xgrammar compile cannot be cancelled, so one pathological grammar would hold up the
    scheduler's exit for as long as it runs."""

    def __init__(self, num_threads: int) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(num_threads):
            threading.Thread(target=self._work, name=f"ringserve-grammar-{i}", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._tasks.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            future, fn, args = self._tasks.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001  handed to the request, never lost
                future.set_exception(e)


class CompileJob:
    """One compile, shared by every request with the same constraint. Its deadline runs from when the
    compile starts, so time spent queued or loading xgrammar and the vocabulary (first request) is free."""

    __slots__ = ("future", "started")

    def __init__(self) -> None:
        self.future: Future | None = None
        self.started: float | None = None


class RequestGrammar:
    """One request's grammar state: the shared compile, then its own matcher."""

    __slots__ = ("job", "matcher")

    def __init__(self, job: CompileJob) -> None:
        self.job = job
        self.matcher = None

    @property
    def terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()


class GrammarManager:
    def __init__(self, config: EngineConfig) -> None:
        self.vocab_size = config.vocab_size
        self.words = words_per_row(config.vocab_size)
        self.max_rows = config.max_num_seqs
        self.timeout_s = config.grammar_compile_timeout_s
        self.tokenizer_path = config.tokenizer_path
        self.has_tokenizer = not config.skip_tokenizer_init
        self._threads = config.grammar_compile_threads
        self._pool: _CompilePool | None = None
        self._jobs: OrderedDict[tuple, CompileJob] = OrderedDict()
        self._compiler = None
        self._compiler_lock = threading.Lock()
        self._stop_token_ids: list[int] = []
        self._batch = None
        self._bitmask: np.ndarray | None = None

    # ------------------------------------------------------------------ compile
    def submit(self, so: StructuredOutputsParams, eos_token_ids: list[int]) -> RequestGrammar:
        """Start or join the compile of `so`; the request waits for it (see poll)."""
        key = so.key
        job = self._jobs.get(key)
        if job is None:
            if self._pool is None:
                self._pool = _CompilePool(self._threads)
                self._stop_token_ids = list(eos_token_ids)
            job = CompileJob()
            job.future = self._pool.submit(self._compile, so, job)
            self._jobs[key] = job
            if len(self._jobs) > MAX_CACHED_GRAMMARS:
                self._jobs.popitem(last=False)
        else:
            self._jobs.move_to_end(key)
        return RequestGrammar(job)

    def poll(self, grammar: RequestGrammar, eos_token_ids: list[int]) -> str | None:
        """None when the grammar is ready (its matcher made) or still compiling (matcher None); else the
        error that ends the request."""
        job = grammar.job
        future = job.future
        if not future.done():
            if job.started is not None and time.monotonic() > job.started + self.timeout_s:
                self._forget(job)
                return (f"structured_outputs: compiling the grammar took longer than {self.timeout_s:g} s "
                        "(--grammar-compile-timeout); simplify the schema or pattern")
            return None
        error = future.exception()
        if error is not None:
            self._forget(job)
            text = str(error)
            return text if isinstance(error, ValueError) else f"structured_outputs: compile failed: {text}"
        import xgrammar as xgr

        grammar.matcher = xgr.GrammarMatcher(future.result(), override_stop_tokens=eos_token_ids or None)
        return None

    def _forget(self, job: CompileJob) -> None:
        """A failed or overdue compile leaves the cache, so that a repeat of the spec tries again."""
        for key, cached in list(self._jobs.items()):
            if cached is job:
                del self._jobs[key]

    def _compile(self, so: StructuredOutputsParams, job: CompileJob):
        compiler = self._get_compiler()
        job.started = time.monotonic()
        return compiler.compile_grammar(to_grammar(so))

    def _get_compiler(self):
        with self._compiler_lock:
            if self._compiler is None:
                if not self.has_tokenizer:
                    raise ValueError("structured_outputs need the tokenizer, and this engine runs with "
                                     "skip_tokenizer_init")
                import xgrammar as xgr
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, use_fast=True,
                                                          local_files_only=True)
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                          stop_token_ids=self._stop_token_ids or None)
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._threads,
                                                     cache_limit_bytes=256 << 20)
            return self._compiler

    # ------------------------------------------------------------------ per step
    def fill(self, positions: list[int], matchers: list, drafts: list[list[int]] | None = None) -> GrammarRows:
        """The masks of `matchers` (this step's sampling rows at `positions` in the batch), batched. A
        request verifying drafts (speculative decoding) gets one mask per draft position: its matcher is
        advanced over the drafts (which it accepts: the scheduler checked them) and rolled back."""
        if self._batch is None:
            import xgrammar as xgr

            self._batch = xgr.BatchGrammarMatcher(max(1, min(4, (os.cpu_count() or 2) // 2)))
            self._bitmask = np.empty((self.max_rows, self.words), dtype=np.int32)
        if not drafts or not any(drafts):
            rows = self._bitmask[: len(matchers)]
            self._batch.batch_fill_next_token_bitmask(matchers, rows)
            return GrammarRows(positions=np.asarray(positions, dtype="<i4").tobytes(), bitmask=rows.tobytes())
        needed = len(matchers) + sum(map(len, drafts))
        if needed > len(self._bitmask):
            self._bitmask = np.empty((needed, self.words), dtype=np.int32)
        row_positions: list[int] = []
        plain, plain_rows = [], []
        for position, matcher, draft in zip(positions, matchers, drafts, strict=True):
            if not draft:
                plain.append(matcher)
                plain_rows.append(len(row_positions))
                row_positions.append(position)
                continue
            for token in (*draft, None):
                matcher.fill_next_token_bitmask(self._bitmask, len(row_positions))
                row_positions.append(position)
                if token is not None:
                    matcher.accept_token(token)
            matcher.rollback(len(draft))
        if plain:
            self._batch.batch_fill_next_token_bitmask(plain, self._bitmask, plain_rows)
        return GrammarRows(positions=np.asarray(row_positions, dtype="<i4").tobytes(),
                           bitmask=self._bitmask[: len(row_positions)].tobytes())

    @staticmethod
    def accept(grammar: RequestGrammar, token_id: int) -> bool:
        """Advance the matcher by a token sampled under its mask; False if the grammar refuses it."""
        return grammar.matcher.accept_token(token_id)
