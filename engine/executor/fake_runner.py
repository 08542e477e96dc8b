"""load_format="fake": an executor with a zero-cost model, for overhead benchmarks and lifecycle tests.

It runs the executor's whole per-step path (the diff, the persistent batch, input preparation) but no
model and no torch: the next token is a fixed function of the last one. So a step's time is what the
engine itself costs.
"""

from __future__ import annotations

import time

import numpy as np

from engine.config import EngineConfig
from engine.executor.input_batch import InputBatch
from engine.messages import HANDLE, TOKEN, ModelRunnerOutput, SchedulerOutput, unpack


class FakeModelRunner:
    def __init__(self, config: EngineConfig, rank: int = 0, tp_size: int = 1) -> None:
        self.config = config
        self.batch = InputBatch(config.max_num_seqs, config.max_model_len, config.block_size)
        self.num_blocks = 0

    def load(self) -> None:
        pass

    def available_blocks(self) -> int:
        blocks_per_seq = -(-self.config.max_model_len // self.config.block_size)
        return self.config.num_gpu_blocks_override or self.config.max_num_seqs * blocks_per_seq + 1

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        batch = self.batch
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
        batch.append_sampled(inputs.sample_rows, sampled)
        return ModelRunnerOutput(
            step=so.step, reqs=inputs.sample_reqs.astype(HANDLE).tobytes(),
            sampled_token_ids=sampled.tobytes(), logprobs=[], prompt_logprobs=[],
        )

    def start_profile(self, directory: str) -> str:
        return "the fake model has nothing to profile"

    def stop_profile(self) -> str:
        return "not profiling"
