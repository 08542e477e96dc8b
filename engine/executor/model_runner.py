"""The model runner: one executor's model, KV cache, persistent batch and sampler.

`execute(scheduler_output)` applies the diff to the persistent batch, builds the flattened inputs, runs
the model (a captured CUDA graph for pure-decode batches when possible, eager otherwise), computes logits
only at the positions that sample, samples, and returns what rank 0 reports to the scheduler. All ranks of
a tensor-parallel group run exactly the same steps on the same inputs, so they sample the same tokens.

A step with draft tokens (speculative decoding) verifies them in the same forward: every drafting request
samples at each of its 1 + d positions, keeps its accepted run (InputBatch.accept) and reports how many
tokens it produced. On a GPU such steps replay the decode CUDA graphs, one decode row per query token
(engine/executor/cuda_graphs.py); on a CPU the fused decode step takes them (engine/models/cpu_decode.py).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch

from engine.attention import AttentionMetadata, get_attention_backend
from engine.config import EngineConfig
from engine.executor.input_batch import InputBatch, StepInputs
from engine.messages import (
    FLOAT,
    HANDLE,
    TOKEN,
    GrammarRows,
    Logprobs,
    ModelRunnerOutput,
    RequestLogprobs,
    SchedulerOutput,
    unpack,
)
from engine.sample.grammar_mask import GrammarMask
from engine.sample.transfer import to_device
from engine.structured_spec import grammar_sample_rows, words_per_row

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, rank: int = 0, tp_size: int = 1) -> None:
        self.config = config
        self.rank = rank
        self.tp_size = tp_size
        self.device = torch.device("cuda", rank) if config.resolved_device == "cuda" else torch.device("cpu")
        self.dtype = DTYPES[config.resolved_dtype]
        self.block_size = config.block_size
        self.batch = InputBatch(config.max_num_seqs, config.max_model_len, config.block_size)
        self.model = None
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.graphs = None
        self._profiler = None
        self.sleep_level = 0                 # 0 awake; 1 KV freed; 2 KV and weights dropped (see sleep())
        self.report_progress = None          # (done, total) of the weights' tensors while they load

    # ------------------------------------------------------------------ startup
    def load(self) -> None:
        from engine.sample.sampler import Sampler
        from engine.sample.sampling_batch import SamplingBatch
        from kernels.cpu import ops as cpu_ops

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = self.config.attention_backend or ("triton" if self.device.type == "cuda" else "torch")
        self.attention_backend = get_attention_backend(backend)
        self._note("loading the weights: %s as %s on %s", self.config.model, self.config.resolved_dtype,
                   self.device)
        self.model = self.load_weights()
        self.sampling = SamplingBatch(self.config.max_num_seqs, self.config.vocab_size, self.device,
                                      self.config.seed)
        # on a CPU, rows without top-k/top-p are drawn by the C kernel where it runs (the same draw)
        on_cpu_kernels = self.device.type == "cpu" and cpu_ops.available()
        self.sampler = Sampler(full_row_draw=cpu_ops.sample_exp_rows if on_cpu_kernels else None)
        self.words_per_row = words_per_row(self.config.vocab_size)

    def load_weights(self):
        """This rank's model with its weights (at startup, and again on waking from a sleep that dropped them)."""
        from engine.models.loader import load_model

        return load_model(self.config, device=self.device, tp_rank=self.rank, tp_size=self.tp_size,
                          attention_backend=self.attention_backend.name, progress=self.rank == 0,
                          report=self.report_progress)

    def weight_bytes(self) -> dict[str, int]:
        """Bytes this rank's weights take, by GGUF block type (weights kept quantized) or dtype."""
        from engine.models.gguf_quantized import weight_bytes_by_type

        return weight_bytes_by_type(self.model)

    @property
    def bytes_per_block(self) -> int:
        m = self.model
        element = torch.empty((), dtype=self.dtype).element_size()
        return m.num_layers * 2 * self.block_size * m.num_kv_heads * m.head_dim * element

    def _note(self, message: str, *args) -> None:
        """A startup note, from rank 0 only (every rank does the same)."""
        if self.rank == 0:
            logger.info(message, *args)

    def available_blocks(self) -> int:
        """How many KV blocks this rank can hold: from --kv-cache-memory (default on the CPU: see
        cpu_memory.default_kv_cache_bytes), or from a profiling forward and --gpu-memory-utilization on
        CUDA. Capped at what max_num_seqs full-length sequences could ever use (plus the null block)."""
        config = self.config
        blocks_per_seq = -(-config.max_model_len // self.block_size)
        needed = blocks_per_seq + 1
        usable = config.max_num_seqs * blocks_per_seq + 1
        if config.num_gpu_blocks_override:
            budget_blocks = config.num_gpu_blocks_override
        elif self.device.type == "cuda":
            self._note("profiling memory: a forward pass of %d tokens", config.max_num_batched_tokens)
            budget_blocks = self._profile_gpu_blocks()
        elif config.kv_cache_memory is not None:
            budget_blocks = config.kv_cache_memory // self.bytes_per_block
        else:
            from engine.executor.cpu_memory import default_kv_cache_bytes

            size, reason = default_kv_cache_bytes(usable * self.bytes_per_block, needed * self.bytes_per_block,
                                                  config.tensor_parallel_size * config.data_parallel_size)
            budget_blocks = size // self.bytes_per_block
            self._note("KV cache: %d tokens (%.2f GiB: %s; --kv-cache-memory sets it)",
                       (min(budget_blocks, usable) - 1) * self.block_size, size / (1 << 30), reason)
        if budget_blocks < needed:
            raise RuntimeError(
                f"the KV cache holds {budget_blocks} blocks of {self.block_size} tokens, but one sequence of "
                f"max_model_len={config.max_model_len} tokens needs {needed - 1} (+1 reserved): give it more "
                f"memory (--kv-cache-memory on the CPU, --gpu-memory-utilization on a GPU; "
                f"{self.bytes_per_block * needed} bytes are needed) or lower --max-model-len"
            )
        return int(min(budget_blocks, usable))

    def _profile_gpu_blocks(self) -> int:
        """Size the cache from what is left of gpu_memory_utilization x total after the weights, the peak
        of a forward at max_num_batched_tokens (logits for at least a prompt-logprobs chunk of rows), the
        sampler's worst case at max_num_seqs rows (its [rows, V] workspaces stay allocated), and an
        estimate of the CUDA-graph pool (review F8)."""
        from engine.sample.logprobs import PROMPT_LOGITS_CHUNK_ROWS

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        tokens = self.config.max_num_batched_tokens
        seqs = min(self.config.max_num_seqs, tokens)
        self._dummy_forward(tokens, seqs, logits_rows=min(tokens, max(seqs, PROMPT_LOGITS_CHUNK_ROWS)))
        self._dummy_sample(self.config.max_num_seqs)
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        non_torch = (total - free) - torch.cuda.memory_reserved(self.device)
        graph_pool = 0 if self.config.enforce_eager else self._graph_pool_estimate()
        budget = total * self.config.gpu_memory_utilization - peak - max(non_torch, 0) - graph_pool
        torch.cuda.empty_cache()
        return max(int(budget // self.bytes_per_block), 0)

    def _graph_pool_estimate(self) -> int:
        """The graphs share one private pool that holds the largest captured size's activations for the
        engine's life, beside the eager activations measured above: measured as one such forward's peak."""
        from engine.executor.cuda_graphs import capture_sizes

        size = capture_sizes(self.config.max_num_seqs)[-1]
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._dummy_forward(size, size, logits_rows=0)
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device) - before

    def _dummy_sample(self, num_rows: int) -> None:
        """The sampler's costliest path on num_rows rows of flat logits (top-p over the whole vocabulary by
        rejection, penalties, 20 logprobs), on a throw-away SamplingBatch so the real one's random stream
        is untouched; the sampler keeps the workspaces it grew."""
        from engine.sample.sampling_batch import SamplingBatch
        from engine.sampling_params import SamplingParams

        vocab = self.config.vocab_size
        batch = SamplingBatch(num_rows, vocab, self.device, 0)
        params = SamplingParams(temperature=1.0, top_p=0.9, logprobs=min(20, vocab), presence_penalty=0.5,
                                repetition_penalty=1.1).resolved()
        for row in range(num_rows):
            batch.add_request(row, params, [0], [1], [])
        with torch.inference_mode():
            self.sampler(torch.zeros(num_rows, vocab, device=self.device), batch.metadata(np.arange(num_rows)))

    def _dummy_forward(self, num_tokens: int, num_seqs: int, logits_rows: int | None = None) -> None:
        """A prefill-shaped forward whose KV writes all go to padding slots (-1), for memory profiling and
        kernel warm-up; then logits for each sequence's last token, or for the first logits_rows tokens."""
        m = self.model
        dummy_cache = [torch.zeros(2, 1, self.block_size, m.num_kv_heads, m.head_dim, dtype=self.dtype,
                                   device=self.device) for _ in range(m.num_layers)]
        per_seq = num_tokens // num_seqs
        lens = torch.full((num_seqs,), per_seq, dtype=torch.int32)
        lens[-1] += num_tokens - per_seq * num_seqs
        qsl = torch.zeros(num_seqs + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(lens, 0)
        metadata = AttentionMetadata(
            slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=self.device),
            query_start_loc=qsl.to(self.device),
            seq_lens=lens.to(self.device),
            block_tables=torch.zeros(num_seqs, -(-int(lens.max()) // self.block_size), dtype=torch.int32,
                                     device=self.device),
            max_query_len=int(lens.max()), max_seq_len=int(lens.max()), num_actual_tokens=num_tokens,
        )
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden = m(ids, ids, dummy_cache, metadata)
            if logits_rows is None:
                m.compute_logits(hidden[qsl[1:].to(self.device) - 1])
            elif logits_rows:
                m.compute_logits(hidden[:logits_rows])

    def initialize_kv_cache(self, num_blocks: int) -> None:
        m = self.model
        shape = (2, num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        if self.device.type == "cpu":
            from engine.executor.cpu_memory import zeroed_on_demand

            self.kv_caches = zeroed_on_demand(m.num_layers, shape, self.dtype)
        else:
            self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                              for _ in range(m.num_layers)]
        self.num_blocks = num_blocks
        if self.device.type == "cuda":
            self._note("warming up: %s", "attention kernels" + ("" if self.config.enforce_eager else
                                                                 ", CUDA graphs"))
        if self.device.type == "cuda" and self.attention_backend.name == "triton":
            from engine.executor.kernel_warmup import warm_up_attention_kernels

            warm_up_attention_kernels(self)
        if self.device.type == "cuda" and not self.config.enforce_eager:
            from engine.executor.cuda_graphs import CudaGraphRunner

            self.graphs = CudaGraphRunner(self)
            self.graphs.capture()

    # ------------------------------------------------------------------ one step
    def execute(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        self.apply_diff(so)
        if so.total_num_scheduled_tokens == 0:
            return None
        inputs = self.batch.prepare(so)
        with torch.inference_mode():
            hidden = self.forward(inputs)
            sampled, lp_tensors, metadata = self.sample(hidden, inputs, so.grammar)
            prompt_logprobs = self.prompt_logprobs(hidden, inputs) if inputs.prompt_logprobs else []
        if inputs.sample_offsets is not None:
            verified = self.batch.accept(inputs, sampled)
            self.sampling.append_runs(inputs.sample_rows[verified.keep], verified.tokens,
                                      verified.offsets[verified.keep])
            logprobs = [] if lp_tensors is None else self._pack_sample_logprobs(lp_tensors, metadata, inputs,
                                                                                verified.keep)
            return ModelRunnerOutput(
                step=so.step, reqs=verified.reqs.astype(HANDLE).tobytes(),
                sampled_token_ids=verified.tokens.astype(TOKEN).tobytes(), logprobs=logprobs,
                prompt_logprobs=prompt_logprobs, num_sampled=verified.counts.astype(TOKEN).tobytes(),
            )
        self.batch.append_sampled(inputs.sample_rows, sampled)
        self.sampling.append_tokens(inputs.sample_rows, sampled)
        return ModelRunnerOutput(
            step=so.step,
            reqs=inputs.sample_reqs.astype(HANDLE).tobytes(),
            sampled_token_ids=sampled.astype(TOKEN).tobytes(),
            logprobs=[] if lp_tensors is None else self._pack_sample_logprobs(lp_tensors, metadata, inputs),
            prompt_logprobs=prompt_logprobs,
        )

    def apply_diff(self, so: SchedulerOutput) -> None:
        batch = self.batch
        for req, num_kept in so.truncated_block_tables:
            batch.truncate_blocks(req, num_kept)
        for req in unpack(so.finished_reqs, HANDLE).tolist():
            row = batch.remove(req)
            if row is not None:
                self.sampling.remove_request(row)
        for new in so.new_reqs:
            row = batch.add(new)
            self.sampling.add_request(
                row, new.params, unpack(new.prompt_token_ids, TOKEN).tolist(),
                unpack(new.output_token_ids, TOKEN).tolist(), new.eos_token_ids,
            )
        for req, blocks in so.new_block_ids:
            batch.append_blocks(req, unpack(blocks, TOKEN))

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        if self.graphs is not None and self.graphs.can_run(inputs):
            return self.graphs.run(inputs)
        metadata, input_ids, positions = self._to_device(inputs)
        return self.model(input_ids, positions, self.kv_caches, metadata)

    def _to_device(self, inputs: StepInputs) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
        device = self.device
        non_blocking = device.type == "cuda"

        def put(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(np.ascontiguousarray(array))
            if non_blocking:
                return tensor.pin_memory().to(device, non_blocking=True)
            return tensor

        metadata = AttentionMetadata(
            slot_mapping=put(inputs.slot_mapping),
            query_start_loc=put(inputs.query_start_loc),
            seq_lens=put(inputs.seq_lens),
            block_tables=put(inputs.block_tables),
            max_query_len=inputs.max_query_len,
            max_seq_len=inputs.max_seq_len,
            num_actual_tokens=inputs.num_tokens,
            prefill=inputs.prefill,
        )
        return metadata, put(inputs.input_ids), put(inputs.positions)

    def sample(self, hidden: torch.Tensor, inputs: StepInputs, grammar_rows: GrammarRows | None = None):
        """(sampled token per sampling row, the logprob tensors or None, the sampling metadata)."""
        if not len(inputs.sample_rows):
            return np.zeros(0, dtype=np.int32), None, None
        index = to_device(inputs.logits_indices, hidden.device)       # no sync behind the replayed graph
        logits = self.model.compute_logits(hidden.index_select(0, index))
        if inputs.sample_offsets is None:
            metadata = self.sampling.metadata(inputs.sample_rows)
        else:
            metadata = self.sampling.metadata(inputs.sample_rows, inputs.sample_offsets, inputs.input_ids,
                                              inputs.logits_indices)
        grammar = None
        if grammar_rows is not None:
            # Outside the CUDA graph (it covers the forward only), before the sampler: logprobs see it.
            logits = logits.float().contiguous()
            bitmask, rows = grammar_sample_rows(grammar_rows, inputs.sample_positions, self.words_per_row)
            grammar = GrammarMask.apply(logits, bitmask, rows, keep=metadata.modifies_logits)
        out = self.sampler(logits, metadata, grammar)
        return out.sampled_token_ids.cpu().numpy().astype(np.int32), out.logprobs, metadata

    def _pack_sample_logprobs(self, tensors, metadata, inputs: StepInputs,
                              keep: np.ndarray | None = None) -> list[RequestLogprobs]:
        """Row j of the tensors belongs to sampled position metadata.logprob_rows[j] and uses its first
        1 + metadata.num_logprobs[j] columns. A request's kept rows (all, without drafts) make one entry."""
        token_ids = tensors.token_ids.cpu().numpy()
        values = tensors.logprobs.cpu().numpy()
        ranks = tensors.ranks.cpu().numpy()
        positions = metadata.logprob_rows
        kept = np.arange(len(positions)) if keep is None else np.flatnonzero(keep[positions])
        result = []
        for run in np.split(kept, np.flatnonzero(np.diff(inputs.sample_reqs[positions[kept]])) + 1):
            if not len(run):
                continue
            columns = int(metadata.num_logprobs[run[0]]) + 1
            result.append(RequestLogprobs(
                req=int(inputs.sample_reqs[positions[run[0]]]),
                logprobs=_logprobs_message(token_ids[run, :columns], values[run, :columns], ranks[run]),
            ))
        return result

    def prompt_logprobs(self, hidden: torch.Tensor, inputs: StepInputs) -> list[RequestLogprobs]:
        from engine.sample.logprobs import prompt_logprobs_from_hidden

        result = []
        for plan in inputs.prompt_logprobs:
            index = to_device(plan.token_indices, hidden.device)
            targets = to_device(plan.target_token_ids, hidden.device)
            tensors = prompt_logprobs_from_hidden(self.model.compute_logits, hidden, index, targets,
                                                  plan.num_logprobs)
            result.append(RequestLogprobs(
                req=plan.req,
                logprobs=_logprobs_message(tensors.token_ids.cpu().numpy(), tensors.logprobs.cpu().numpy(),
                                           tensors.ranks.cpu().numpy()),
                first_position=plan.first_position,
            ))
        return result

    # ------------------------------------------------------------------ sleep mode (vLLM's levels)
    def sleep(self, level: int) -> str:
        """Free the KV cache (level 1) and the weights too (level 2), keeping the process and its rings.

        Level 1 keeps weights that already live in host memory (the CPU); on a GPU they are dropped and
        re-read on wake from the file (the page cache holds it: host memory) or, for dummy weights, made
        again from the seed. The scheduler calls this only with no request in the engine."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        freed = sum(cache.nbytes for cache in self.kv_caches)
        self.kv_caches = []
        self.graphs = None
        drop_weights = level == 2 or self.device.type == "cuda"
        if drop_weights and self.model is not None:
            freed += sum(self.weight_bytes().values())
            self.model = None
        self.sleep_level = max(self.sleep_level, 2 if drop_weights else 1)
        from engine.executor.cpu_memory import release_freed_memory

        release_freed_memory(self.device)
        return f"asleep at level {level}: {freed / (1 << 20):.0f} MiB freed"

    def wake_up(self) -> str:
        """Undo sleep(): weights loaded again if they were dropped, the KV cache allocated again (empty)."""
        if not self.sleep_level:
            return "awake"
        if self.model is None:
            self.model = self.load_weights()
        self.sleep_level = 0
        self.initialize_kv_cache(self.num_blocks)
        return "awake"

    # ------------------------------------------------------------------ profiling
    def start_profile(self, directory: str) -> str:
        if self._profiler is not None:
            return "already profiling"
        os.makedirs(directory, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profile_dir = directory
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=True, with_stack=False)
        self._profiler.__enter__()
        return f"profiling into {directory}"

    def stop_profile(self) -> str:
        if self._profiler is None:
            return "not profiling"
        self._profiler.__exit__(None, None, None)
        path = os.path.join(self._profile_dir, f"trace-rank{self.rank}-pid{os.getpid()}.json")
        self._profiler.export_chrome_trace(path)
        self._profiler = None
        return path


def _logprobs_message(token_ids: np.ndarray, values: np.ndarray, ranks: np.ndarray) -> Logprobs:
    return Logprobs(
        token_ids=np.ascontiguousarray(token_ids, dtype=TOKEN).tobytes(),
        logprobs=np.ascontiguousarray(values, dtype=FLOAT).tobytes(),
        ranks=np.ascontiguousarray(ranks, dtype=TOKEN).tobytes(),
        num_columns=token_ids.shape[1],
    )
