"""Structured outputs in the scheduler: grammar compiles off the step loop, one matcher per request, and the
per-step token bitmask that travels to the executors with the SchedulerOutput.

- `submit` starts (or joins) the compile of a request's constraint in the compile pool (worker processes,
  engine/core/compile_pool.py); compiles are keyed by the constraint, so the n children of one API request
  and repeated schemas share one compile (an LRU of key -> job, bounded in count and in bytes). Past
  MAX_PENDING_COMPILES distinct compiles waiting, a new one is refused at once as busy (503 with
  Retry-After at the API) rather than queued without bound.
- `poll` tells the scheduler whether a waiting request's grammar is ready (it then gets its own matcher,
  with the request's EOS ids as the grammar's stop tokens), failed, or past its deadline. The deadline runs
  from submission (time queued behind other compiles counts; see CompilePool.clock), and an overdue compile
  is stopped for real: its worker process is killed.
- `fill` writes the masks of this step's sampling rows into one preallocated [max_num_seqs, W] int32 buffer
  in a single batched call (C++ threads, no GIL) and returns them as `GrammarRows`.
- `accept` advances a matcher by the sampled token (by each accepted token, under speculative decoding).

xgrammar (which imports torch) is imported at the first structured request; the tokenizer is loaded only
in the compile workers, never in the scheduler.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from concurrent.futures import Future

import numpy as np

from engine.config import EngineConfig
from engine.core.compile_pool import WORKER_MODULE, CompilePool, CompileTask
from engine.errors import busy_message
from engine.messages import GrammarRows
from engine.sampling_params import StructuredOutputsParams
from engine.structured_spec import words_per_row

MAX_CACHED_GRAMMARS = 256
MAX_CACHED_BYTES = 256 << 20
MAX_PENDING_COMPILES = 64           # distinct compiles queued or running; more are refused as busy
WORKER_START_LIMIT_S = 120.0        # wall time a compile may wait for a worker that never becomes ready


class CompileJob:
    """One compile, shared by every request with the same constraint."""

    __slots__ = ("task", "error", "size")

    def __init__(self, task: CompileTask | None, error: str | None = None) -> None:
        self.task = task
        self.error = error                  # refused before it was queued (busy), or stopped (overdue)
        self.size = 0                       # bytes of the compiled grammar, once charged to the cache


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
        self.config = config
        self.vocab_size = config.vocab_size
        self.words = words_per_row(config.vocab_size)
        self.max_rows = config.max_num_seqs
        self.timeout_s = config.grammar_compile_timeout_s
        self.max_workers = config.grammar_compile_workers
        self.worker_module = WORKER_MODULE      # tests substitute a worker that can be held
        self._pool: CompilePool | None = None
        self._jobs: OrderedDict[tuple, CompileJob] = OrderedDict()
        self._cached_bytes = 0
        self._batch = None
        self._bitmask: np.ndarray | None = None

    # ------------------------------------------------------------------ compile
    def submit(self, so: StructuredOutputsParams, eos_token_ids: list[int]) -> RequestGrammar:
        """Start or join the compile of `so`; the request waits for it (see poll)."""
        key = so.key
        job = self._jobs.get(key)
        if job is not None:
            self._jobs.move_to_end(key)
            return RequestGrammar(job)
        if self._pool is None:
            self._pool = CompilePool(self.config, eos_token_ids, self.max_workers, self.worker_module)
        if self._pool.pending() >= MAX_PENDING_COMPILES:
            return RequestGrammar(CompileJob(None, busy_message(
                f"structured_outputs: {MAX_PENDING_COMPILES} grammars are already compiling or waiting to; "
                "retry later", math.ceil(self.timeout_s))))
        job = CompileJob(self._pool.submit(so))
        self._jobs[key] = job
        self._evict()
        return RequestGrammar(job)

    def poll(self, grammar: RequestGrammar, eos_token_ids: list[int]) -> str | None:
        """None when the grammar is ready (its matcher made) or still compiling (matcher None); else the
        error that ends the request."""
        job = grammar.job
        if job.error is not None:
            return job.error
        task = job.task
        future: Future = task.future
        if not future.done():
            pool = self._pool
            pool.maintain()
            overdue = (pool.clock() - task.clock_at_submit > self.timeout_s
                       or time.monotonic() - task.submitted > self.timeout_s + WORKER_START_LIMIT_S)
            if not overdue:
                return None
            job.error = (f"structured_outputs: compiling the grammar took longer than {self.timeout_s:g} s "
                         "(--grammar-compile-timeout); simplify the schema or pattern")
            pool.stop(task)           # every request sharing the job reads job.error from now on
            self._forget(job)
            return job.error
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            self._forget(job)
            return str(error) if error is not None else "structured_outputs: the compile was stopped"
        import xgrammar as xgr

        compiled = future.result()
        if not job.size and job in self._jobs.values():
            job.size = compiled.memory_size_bytes
            self._cached_bytes += job.size
            self._evict()
        grammar.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=eos_token_ids or None)
        return None

    def close(self) -> None:
        """Stop the compile workers (the scheduler is leaving)."""
        if self._pool is not None:
            self._pool.close()

    def _forget(self, job: CompileJob) -> None:
        """A failed or overdue compile leaves the cache, so that a repeat of the spec tries again."""
        for key, cached in list(self._jobs.items()):
            if cached is job:
                del self._jobs[key]
                self._cached_bytes -= job.size

    def _evict(self) -> None:
        """Oldest first, past the cache's count or bytes (a pathological grammar compiles to megabytes)."""
        while len(self._jobs) > MAX_CACHED_GRAMMARS or self._cached_bytes > MAX_CACHED_BYTES:
            _, job = self._jobs.popitem(last=False)
            self._cached_bytes -= job.size

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
