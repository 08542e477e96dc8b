"""CUDA-graph replay of pure-decode steps (DESIGN §5).

At startup the model's forward is captured for pure-decode batches at padded sizes (1, 2, 4, 8, then
steps of 16 up to max_num_seqs), all reading static input buffers and sharing one memory pool. A decode
step whose batch fits is padded up to the next captured size (padding tokens write to slot -1, which the
KV write skips, and attend one position of the null block) and replayed; everything else runs eagerly.
Inputs reach the static buffers through pinned host staging (graph_staging.py) with non-blocking copies, so
a step needs no device synchronisation beyond reading back the sampled tokens.

Speculative decoding's verify steps (a request's last token and its drafts) replay the same graphs: each
query token becomes a decode row with its own sequence length and a copy of its request's block-table row
(StepInputs.token_rows), padded to the size that holds the step's tokens. Every layer writes the step's keys
and values before it attends, so a draft sees the drafts before it. A verify step that also carries a
longer prefill chunk runs eagerly.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.executor.graph_staging import GraphInputStaging
from engine.executor.input_batch import StepInputs

MAX_CAPTURE_SIZE = 512
# the most query tokens per request a verify step replays with (1 + speculative_config's 32 drafts at most)
MAX_VERIFY_QUERY_LEN = 33


def capture_sizes(max_num_seqs: int) -> list[int]:
    limit = min(max_num_seqs, MAX_CAPTURE_SIZE)
    sizes = [s for s in (1, 2, 4, 8) if s <= limit]
    sizes += list(range(16, limit + 1, 16))
    if sizes[-1] != limit:
        sizes.append(limit)
    return sizes


class CudaGraphRunner:
    def __init__(self, runner) -> None:
        self.runner = runner
        config = runner.config
        device = runner.device
        self.sizes = capture_sizes(config.max_num_seqs)
        self.max_size = self.sizes[-1]
        self.max_blocks = -(-config.max_model_len // config.block_size)
        n = self.max_size
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, self.max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.staging = GraphInputStaging(n, self.max_blocks, pin=True, make_event=torch.cuda.Event)
        self._static = {"input_ids": self.input_ids, "positions": self.positions,
                        "slot_mapping": self.slot_mapping, "seq_lens": self.seq_lens,
                        "block_tables": self.block_tables}
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[: size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size],
            max_query_len=1, max_seq_len=self.runner.config.max_model_len, num_actual_tokens=size,
        )

    def capture(self) -> None:
        model, caches = self.runner.model, self.runner.kv_caches
        with torch.inference_mode():
            for size in reversed(self.sizes):          # largest first: later graphs reuse its pool
                metadata = self._metadata(size)
                args = (self.input_ids[:size], self.positions[:size], caches, metadata)
                model(*args)                           # warm-up: triton compilation, allocator
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    output = model(*args)
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[size] = (graph, output)
        torch.cuda.synchronize()

    def can_run(self, inputs: StepInputs) -> bool:
        if inputs.max_query_len > 1 and (inputs.sample_offsets is None
                                         or inputs.max_query_len > MAX_VERIFY_QUERY_LEN):
            return False
        return inputs.num_tokens <= self.max_size

    def run(self, inputs: StepInputs) -> torch.Tensor:
        n = inputs.num_tokens
        size = next(s for s in self.sizes if s >= n)
        self.staging.fill(inputs, size)
        self.staging.copy_to(self._static, size)
        graph, output = self.graphs[size]
        graph.replay()
        return output[:n]

