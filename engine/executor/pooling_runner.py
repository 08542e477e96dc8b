"""Model runners for pooling models: each returns one float32 vector per request that ends its prompt.

- `PoolingModelRunner`: a decoder with `--runner pooling`. The generation runner's paged path runs as is
  (persistent batch, chunked prefill over the KV cache, prefix-cache hits, CUDA graphs); where it would
  sample, it takes the final hidden state of the prompt's last token instead (vLLM's convert=embed).
- `EncoderModelRunner`: an encoder. Every scheduled request is new and whole (engine/core/pooling_scheduler.py),
  so a step packs the new prompts back to back, runs the encoder with bidirectional attention, and pools
  (MEAN, CLS or LAST, from config.pooler_config); no KV cache, no state kept between steps.

Normalization and `dimensions` are per request and applied by the client (engine/client/pooling.py).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.attention.bidirectional import EncoderMetadata
from engine.executor.model_runner import ModelRunner
from engine.layers.pooler import pool
from engine.messages import HANDLE, TOKEN, ModelRunnerOutput, SchedulerOutput, unpack
from engine.sample.transfer import to_device


class PoolingModelRunner(ModelRunner):
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        self.apply_diff(so)
        if so.total_num_scheduled_tokens == 0:
            return None
        inputs = self.batch.prepare(so)
        with torch.inference_mode():
            hidden = self.forward(inputs)
            index = to_device(inputs.logits_indices, hidden.device)
            vectors = hidden.index_select(0, index).float().cpu().numpy()
        return _output(so.step, inputs.sample_reqs, vectors)


class EncoderModelRunner(ModelRunner):
    def load(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.model = self.load_weights()
        self.pooling_type = self.config.pooler_config.pooling_type

    def load_weights(self):
        from engine.layers.onednn_matmul import pack_float32_matmuls
        from engine.models.loader import load_model

        model = load_model(self.config, device=self.device, tp_rank=self.rank, tp_size=self.tp_size,
                           progress=self.rank == 0, report=self.report_progress)
        if self.device.type == "cpu" and model.activation_dtype == torch.float32 and model.dtype == torch.float32:
            pack_float32_matmuls(model)
        return model

    def available_blocks(self) -> int:
        return 2            # no KV cache; the scheduler's block pool needs its reserved block plus one

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks

    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        if so.total_num_scheduled_tokens == 0:
            return None
        reqs = unpack(so.reqs, HANDLE)
        prompts = {new.req: unpack(new.prompt_token_ids, TOKEN) for new in so.new_reqs}
        ordered = [prompts[req] for req in reqs.tolist()]
        lens = np.fromiter(map(len, ordered), dtype=np.int64, count=len(ordered))
        if not np.array_equal(lens, unpack(so.num_scheduled_tokens, TOKEN)):
            raise RuntimeError(f"step {so.step} schedules parts of prompts; an encoder takes whole prompts only")
        input_ids = np.concatenate(ordered).astype(np.int64)
        positions = np.arange(len(input_ids), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        device = self.device
        metadata = EncoderMetadata.build(lens, device)
        with torch.inference_mode():
            hidden = self.model(torch.from_numpy(input_ids).to(device), torch.from_numpy(positions).to(device),
                                metadata)
            vectors = pool(hidden, metadata.seq_lens, self.pooling_type).cpu().numpy()
        return _output(so.step, reqs, vectors)


def _output(step: int, reqs: np.ndarray, vectors: np.ndarray) -> ModelRunnerOutput:
    return ModelRunnerOutput(step=step, reqs=reqs.astype(HANDLE).tobytes(), sampled_token_ids=b"", logprobs=[],
                             prompt_logprobs=[], pooled=np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
