"""load_format="fake": an executor with a zero-cost model, for overhead benchmarks and lifecycle tests.

It runs the executor's whole per-step path (the diff, the persistent batch, input preparation) but no
model and no torch: the next token is a fixed function of the last one. So a step's time is what the
engine itself costs.

Grammar rows (structured outputs) are honoured adversarially: the fake's preferred token is usually one
the grammar forbids, and the row then takes the first allowed token after it (cyclically), as a model whose
maximum logit sits on a forbidden token would after masking.
"""

from __future__ import annotations

import time

import numpy as np

from engine.config import EngineConfig
from engine.executor.input_batch import InputBatch
from engine.messages import HANDLE, TOKEN, ModelRunnerOutput, SchedulerOutput, unpack
from engine.structured_spec import grammar_sample_rows, unpack_allowed, words_per_row


class FakeModelRunner:
    def __init__(self, config: EngineConfig, rank: int = 0, tp_size: int = 1) -> None:
        self.config = config
        self.batch = InputBatch(config.max_num_seqs, config.max_model_len, config.block_size)
        self.num_blocks = 0

    def load(self) -> None:
        pass

    def weight_bytes(self) -> dict[str, int]:
        return {}

    def available_blocks(self) -> int:
        blocks_per_seq = -(-self.config.max_model_len // self.config.block_size)
        return self.config.num_gpu_blocks_override or self.config.max_num_seqs * blocks_per_seq + 1

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        batch = self.batch
        for req, num_kept in so.truncated_block_tables:
            batch.truncate_blocks(req, num_kept)
        for req in unpack(so.finished_reqs, HANDLE).tolist():
            batch.remove(req)
        for new in so.new_reqs:
            batch.add(new)
        for req, blocks in so.new_block_ids:
            batch.append_blocks(req, unpack(blocks, TOKEN))
        if so.total_num_scheduled_tokens == 0:
            return None
        inputs = batch.prepare(so)
        if self.config.fake_step_us:
            time.sleep(self.config.fake_step_us / 1e6)
        last = inputs.input_ids[inputs.logits_indices]
        sampled = ((last * 7 + 13) % self.config.vocab_size).astype(np.int32)
        if so.grammar is not None:
            self._apply_grammar(so, inputs.sample_positions, sampled)
        if inputs.sample_offsets is not None:       # drafts: a token per position, the accepted run kept
            verified = batch.accept(inputs, sampled)
            return ModelRunnerOutput(
                step=so.step, reqs=verified.reqs.astype(HANDLE).tobytes(),
                sampled_token_ids=verified.tokens.astype(np.int32).tobytes(), logprobs=[], prompt_logprobs=[],
                num_sampled=verified.counts.astype(np.int32).tobytes(),
            )
        batch.append_sampled(inputs.sample_rows, sampled)
        return ModelRunnerOutput(
            step=so.step, reqs=inputs.sample_reqs.astype(HANDLE).tobytes(),
            sampled_token_ids=sampled.tobytes(), logprobs=[], prompt_logprobs=[],
        )

    def _apply_grammar(self, so: SchedulerOutput, sample_positions: np.ndarray, sampled: np.ndarray) -> None:
        vocab = self.config.vocab_size
        bitmask, index = grammar_sample_rows(so.grammar, sample_positions, words_per_row(vocab))
        allowed = unpack_allowed(bitmask, vocab)
        for mask_row, sample_row in enumerate(index.tolist()):
            ids = np.flatnonzero(allowed[mask_row])
            if len(ids):
                sampled[sample_row] = ids[np.searchsorted(ids, sampled[sample_row]) % len(ids)]

    def sleep(self, level: int) -> str:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        return f"asleep at level {level}: the fake model holds nothing"

    def wake_up(self) -> str:
        return "awake"

    def start_profile(self, directory: str) -> str:
        return "the fake model has nothing to profile"

    def stop_profile(self) -> str:
        return "not profiling"
