"""The one configuration object that flows from the CLI or `LLM(...)` into every process.

`EngineConfig` is a msgspec Struct so the frontend can hand it to the scheduler and executor processes as
JSON on their command line (no pickle). `EngineConfig.finalize()` resolves the model once, in the caller
(a built-in name, a hub repo id downloaded to a local directory, a model directory, or a GGUF file whose
metadata stands in for config.json), reads its config and writes the derived values back (resolved dtype,
max_model_len, token budget), so that a bad model, a failed download or an unsupported architecture fails
in the caller before any process starts.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Any

import msgspec

from engine.errors import ConfigError
from engine.generation_config import SamplingDefaults, check_mode, sampling_defaults
from engine.models.bundled import (
    MINILM_INSTALL,
    MINILM_NAME,
    SMOLLM2_INSTALL,
    SMOLLM2_NAME,
    find_minilm,
    find_smollm2,
)
from engine.models.encoder_args import ENCODER_ARCHITECTURES, EncoderArgs
from engine.models.gguf_file import is_gguf_path
from engine.models.model_args import SUPPORTED_ARCHITECTURES, ModelArgs
from engine.models.model_zip import is_model_zip, unpack_model_zip
from engine.models.pooler_config import PoolerConfig, read_max_seq_length, resolve_pooler_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy", "fake")
QUANTIZATIONS = ("gguf", "none")
DEVICES = ("auto", "cpu", "cuda")
DEMO_NAME = "ringserve-demo"
SCHEDULING_POLICIES = ("fcfs", "priority")
DATA_PARALLEL_ROUTINGS = ("prefix", "load", "round_robin")
KV_EVENT_PUBLISHERS = ("null", "zmq")
RUNNERS = ("auto", "generate", "pooling")

GiB = 1 << 30
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"     # every process's log lines
DEFAULT_RING_BYTES = 16 << 20
PARAMS_ALLOWANCE = 64 << 10        # bytes kept in the request ring for an AddRequest's params
CPU_SPIN_US = 100                  # spin windows before sleeping (DESIGN §2)
CUDA_SPIN_US = 2000
# head dims the Triton attention kernels take (kernels/triton_attention_tiles.SUPPORTED_HEAD_DIMS; a test
# pins the two equal); config may not import kernels, which would pull triton into the scheduler
TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)


def parse_size(text: str | int) -> int:
    """'32k' -> 32768, '1m' -> 1048576, '4096' -> 4096 (as vLLM's --max-model-len accepts)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", str(text))
    if not match:
        raise ConfigError(f"cannot read {text!r} as a size (examples: 4096, 32k, 1m)")
    number, unit = match.groups()
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[unit.lower()]
    return int(float(number) * scale)


class KVEventsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's --kv-events-config: publish the KV cache's block stored/removed/cleared events over ZMQ.

    Field names and meanings are vLLM's. One difference: ringserve always binds `endpoint` (vLLM binds
    only wildcard, ipc and inproc addresses and connects otherwise), and the default is loopback, not
    all interfaces. With data parallelism, rank r publishes on the endpoint's port + r (as vLLM does).
    """

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"                   # zmq | null
    endpoint: str = "tcp://127.0.0.1:5557"   # ZMQ PUB: (topic, seq, msgpack KVEventBatch) per step
    replay_endpoint: str | None = None       # ZMQ ROUTER: 8-byte start seq in, buffered batches out
    buffer_steps: int = 10_000               # batches kept for replay
    hwm: int = 100_000                       # the PUB socket's high-water mark
    max_queue_size: int = 100_000            # batches waiting for the publisher thread
    topic: str = ""

    @property
    def enabled(self) -> bool:
        return self.enable_kv_cache_events and self.publisher != "null"


SPECULATIVE_METHODS = ("ngram", "suffix")
# measured on the project's 2-core Zen 4 with SmolLM2-135M (docs/performance.md, speculative decoding): past
# this many running requests a verify step costs more than its accepted tokens save
DEFAULT_DISABLE_BY_BATCH_SIZE = 4
# measured alike: a verify row costs about this share of a batch-1 decode step
DEFAULT_MIN_ACCEPTANCE_RATE = 0.2


class SpeculativeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`--speculative-config` / `LLM(speculative_config=...)`: vLLM's JSON for speculative decoding, model-free
    methods only.

        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
        {"method": "suffix", "num_speculative_tokens": 8}

    Keys and defaults follow vLLM where vLLM has the key (prompt lookup defaults to 5..5 when neither bound is
    given; suffix decoding's tree depth 24, 10,000 cached requests, min token probability 0.1;
    `disable_by_batch_size` turns speculation off while more requests run than that). Three differences: suffix
    decoding drafts at most 8 tokens unless num_speculative_tokens says otherwise (vLLM: the tree depth; on a CPU
    every draft is a row through all the weights); its spec factor is 2.0 (vLLM: 1.0), since a verify row costs
    about a fifth of a decode step here, so a draft after a short match (an edit just made) still pays
    (measured on `bench spec`'s copy workload: 1.81x against 1.68x at 1.0, the open one unharmed); and
    disable_by_batch_size defaults to the crossover measured on the CPU rather than to off. Two keys are
    ringserve's: `min_acceptance_rate` and `acceptance_window`, the
    per-request draft length and switch (engine/core/speculator.py). Draft-model methods (eagle, mtp, draft
    models) are refused with a ConfigError that names the key.
    """

    method: str = "ngram"
    num_speculative_tokens: int | None = None     # most draft tokens a request verifies per step
    prompt_lookup_max: int | None = None          # ngram: longest n-gram matched against the history
    prompt_lookup_min: int | None = None          # ngram: shortest n-gram that may propose
    suffix_decoding_max_tree_depth: int = 24      # suffix: longest context + continuation a tree holds
    suffix_decoding_max_cached_requests: int = 10000   # suffix: finished requests' outputs kept (0: none)
    suffix_decoding_max_spec_factor: float = 2.0  # suffix: draft length <= factor x matched length
    suffix_decoding_min_token_prob: float = 0.1   # suffix: stop drafting below this estimated probability
    disable_by_batch_size: int | None = DEFAULT_DISABLE_BY_BATCH_SIZE   # None: never off for the batch
    # per request (engine/core/speculator.py): a draft token is verified only while its estimated chance
    # to be accepted stays at or above this (about what a verify row costs against a decode step on the CPU)
    min_acceptance_rate: float = DEFAULT_MIN_ACCEPTANCE_RATE
    acceptance_window: int = 32                   # checked draft positions the acceptance estimate spans

    def resolved(self) -> SpeculativeConfig:
        """Validated, with the defaults that depend on the method filled in; ConfigError names the key."""
        key = "speculative_config."
        if self.method not in SPECULATIVE_METHODS:
            hint = " (draft-model methods are not supported)" if self.method else ""
            raise ConfigError(f"{key}method must be one of {', '.join(SPECULATIVE_METHODS)}; "
                              f"got {self.method!r}{hint}")
        tokens = self.num_speculative_tokens
        if tokens is None:
            if self.method == "ngram":
                raise ConfigError(f"{key}num_speculative_tokens is required for method 'ngram'")
            tokens = min(self.suffix_decoding_max_tree_depth, 8)
        _check_positive(key + "num_speculative_tokens", tokens)
        if tokens > 32:
            raise ConfigError(f"{key}num_speculative_tokens must be at most 32, got {tokens}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if self.method == "ngram":
            if low is None and high is None:
                low = high = 5
            low = high if low is None else low
            high = low if high is None else high
            _check_positive(key + "prompt_lookup_min", low)
            _check_positive(key + "prompt_lookup_max", high)
            if low > high:
                raise ConfigError(f"{key}prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})")
        elif low is not None or high is not None:
            raise ConfigError(f"{key}prompt_lookup_min/max apply to method 'ngram', not {self.method!r}")
        _check_positive(key + "suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth)
        if self.suffix_decoding_max_cached_requests < 0:
            raise ConfigError(f"{key}suffix_decoding_max_cached_requests must be >= 0, "
                              f"got {self.suffix_decoding_max_cached_requests}")
        if self.suffix_decoding_max_spec_factor <= 0:
            raise ConfigError(f"{key}suffix_decoding_max_spec_factor must be positive, "
                              f"got {self.suffix_decoding_max_spec_factor}")
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise ConfigError(f"{key}suffix_decoding_min_token_prob must be in [0, 1], "
                              f"got {self.suffix_decoding_min_token_prob}")
        if self.disable_by_batch_size is not None:
            _check_positive(key + "disable_by_batch_size", self.disable_by_batch_size)
        if not 0.0 <= self.min_acceptance_rate < 1.0:
            raise ConfigError(f"{key}min_acceptance_rate must be in [0, 1), got {self.min_acceptance_rate}")
        _check_positive(key + "acceptance_window", self.acceptance_window)
        return msgspec.structs.replace(self, num_speculative_tokens=tokens, prompt_lookup_min=low,
                                       prompt_lookup_max=high)


def parse_speculative_config(value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
    """A SpeculativeConfig from vLLM's JSON text, a dict (LLM's keyword) or a struct, resolved; None stays
    None. Unknown keys and wrong types are a ConfigError naming the key."""
    if value is None:
        return None
    try:
        if isinstance(value, str):
            value = msgspec.json.decode(value, type=SpeculativeConfig)
        elif isinstance(value, dict):
            value = msgspec.convert(value, SpeculativeConfig)
        elif not isinstance(value, SpeculativeConfig):
            raise ConfigError(f"speculative_config must be a JSON object, got {type(value).__name__}")
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ConfigError(f"speculative_config: {_key_first(str(e))}") from None
    return value.resolved()


def _key_first(message: str) -> str:
    """msgspec says 'Expected `int`, got `str` - at `$.num_speculative_tokens`': put the key first."""
    text, _, where = message.partition(" - at `$.")
    return f"{where.rstrip('`')}: {text}" if where else message


class EngineConfig(msgspec.Struct, kw_only=True):
    # --- model
    model: str = ""                          # HF model directory (or a .zip of one), hub repo id, .gguf file, or
                                             # a built-in name (ringserve-demo, smollm2-135m-instruct,
                                             # all-minilm-l6-v2); "": the demo
    revision: str | None = None              # hub branch, tag or commit of a repo id
    download_dir: str | None = None          # hub cache directory (default: huggingface_hub's)
    tokenizer: str | None = None             # defaults to the model directory (or the GGUF file)
    skip_tokenizer_init: bool = False        # token ids in and out, no tokenizer (vLLM's option)
    served_model_name: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    load_format: str = "auto"                # auto | safetensors | dummy | fake (zero-cost fake model)
    quantization: str | None = None          # gguf: a GGUF file's quantized tensors stay in their blocks and
                                             # run through quantized kernels; none: dequantized at load;
                                             # None: gguf for a GGUF file that holds quantized tensors
    fake_step_us: int = 0                    # load_format fake: each forward sleeps this long, as a CPU
                                             # waiting for a GPU step would (engine-overhead benchmarks)
    seed: int = 0
    generation_config: str = "auto"          # sampling defaults: auto (the model's), vllm (none), or a folder
    override_generation_config: dict[str, Any] = {}   # fields set on top of those (vLLM's option)
    # --- pooling models (embeddings; engine/models/pooler_config.py)
    runner: str = "auto"                     # auto | generate | pooling (vLLM's --runner); finalize() writes the
                                             # choice back: pooling for encoder models (BERT family), else generate
    pooler_config: PoolerConfig | None = None    # pooling type and normalize; finalize() fills in the model's
    # --- device and parallelism
    device: str = "auto"
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    attention_backend: str | None = None     # torch | triton; default: triton on CUDA, torch on CPU
    cpu_threads: int | None = None           # torch threads per CPU executor; default: cores / ranks
    data_parallel_size: int = 1              # engine cores behind one frontend (each with its own devices)
    data_parallel_rank: int = 0              # which of them this config starts (set by the DP client)
    data_parallel_routing: str = "prefix"    # prefix (cache- and load-aware) | load | round_robin
    # --- KV cache
    block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None       # bytes; default on the CPU: what max_num_seqs x max_model_len
                                             # tokens take, capped by a share of the free memory
    num_gpu_blocks_override: int | None = None
    kv_events_config: KVEventsConfig | None = None
    # --- scheduler
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int = 0    # most tokens one request's prefill takes in a step; 0: no cap
    max_logprobs: int = 20
    async_scheduling: bool = False           # schedule step N+1 while step N runs (vLLM's --async-scheduling)
    # --- speculative decoding (SpeculativeConfig above); a dict or JSON text is parsed by finalize()
    speculative_config: SpeculativeConfig | None = None
    # --- structured outputs (engine/core/structured_output.py)
    grammar_compile_timeout_s: float = 10.0  # a compile past this ends its request with an error
    grammar_compile_workers: int = 2         # compile worker processes of the scheduler (started on demand)
    # --- processes and rings
    in_process: bool = False                 # scheduler and one executor in the caller (debugging, unit tests)
    ring_bytes: int = DEFAULT_RING_BYTES     # the broadcast ring; the others are sized from it; grows
                                             # by default for contexts beyond about a million tokens
    spin_us: int | None = None               # spin window before sleeping; None: adapt to the device
    startup_timeout_s: float = 600.0
    log_level: str = "info"                  # of the engine's processes (their startup notes), as the server's
    # --- derived by finalize(); never set by hand
    architecture: str = ""
    resolved_dtype: str = ""
    resolved_device: str = ""
    vocab_size: int = 0
    sampling_defaults: SamplingDefaults = msgspec.field(default_factory=SamplingDefaults)
    hidden_size: int = 0                     # the length of a pooled vector
    finalized: bool = False

    # ------------------------------------------------------------------ derived values
    @property
    def model_name(self) -> str:
        return self.served_model_name or (self.model or DEMO_NAME)

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.model

    # Ring capacities. A message must fit its ring: the largest are a SchedulerOutput carrying new prompts
    # (broadcast), an AddRequest with a max_model_len prompt (request: 4 B a token), and an EngineOutputs
    # with prompt logprobs (output). About 32 MiB of /dev/shm per engine at the defaults.
    @property
    def request_ring_bytes(self) -> int:
        return self.ring_bytes // 4

    @property
    def output_ring_bytes(self) -> int:
        return self.ring_bytes // 2

    @property
    def result_ring_bytes(self) -> int:
        return self.ring_bytes // 4

    @property
    def spin_window_us(self) -> int:
        """How long executors (and the scheduler waiting on them) spin before sleeping on a semaphore."""
        if self.spin_us is not None:
            return self.spin_us
        return CUDA_SPIN_US if self.resolved_device == "cuda" else CPU_SPIN_US

    @property
    def executor_threads(self) -> int:
        """torch threads of each CPU executor: --cpu-threads, else the cores shared among the ranks."""
        return self.cpu_threads or max(1, (os.cpu_count() or 1) // self.tensor_parallel_size)

    @property
    def is_encoder(self) -> bool:
        """An encoder model (BERT family): bidirectional attention, no KV cache, pooling only."""
        return self.architecture in ENCODER_ARCHITECTURES

    @property
    def is_gguf(self) -> bool:
        return is_gguf_path(self.model)

    def hf_config(self) -> dict:
        """config.json's dict; for a GGUF file, the same keys read from its metadata."""
        if self.is_gguf:
            from engine.models.gguf_config import gguf_hf_config

            if not os.path.isfile(self.model):
                raise ConfigError(f"GGUF file {self.model!r} does not exist")
            return gguf_hf_config(self.model)
        return read_model_config(self.model)

    def model_generation_config(self) -> dict:
        """The model's own generation_config.json ({} for a GGUF file or where there is none)."""
        if self.is_gguf:
            return {}
        path = os.path.join(self.model, "generation_config.json")
        if not os.path.isfile(path):
            return {}
        with open(path) as f:
            return json.load(f)

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes over all tensor-parallel ranks (each holds at least one KV head)."""
        args = ModelArgs.from_hf_config(self.hf_config(), self.architecture, self.max_model_len)
        per_rank_heads = max(1, args.num_kv_heads // self.tensor_parallel_size)
        element = 4 if self.resolved_dtype == "float32" else 2
        return args.num_layers * 2 * per_rank_heads * self.tensor_parallel_size * args.head_dim * element

    def stored_weight_type(self) -> str | None:
        """For a GGUF file, the tensor type most of its weight bytes are stored in (Q4_1, Q8_0, F16, ...)."""
        if not self.is_gguf:
            return None
        from engine.models.gguf_config import main_weight_type

        return main_weight_type(self.model)

    # ------------------------------------------------------------------ validation
    def finalize(self) -> EngineConfig:
        """Validate every option, read config.json, and write the derived values back. Idempotent."""
        if self.finalized:
            return self
        self._resolve_model()
        if self.tokenizer:
            self.tokenizer = os.path.abspath(os.path.expanduser(self.tokenizer))
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        _check_choice("device", self.device, DEVICES)
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.attention_backend is not None:
            _check_choice("attention_backend", self.attention_backend, ("torch", "triton"))
        _check_positive("tensor_parallel_size", self.tensor_parallel_size)
        _check_positive("data_parallel_size", self.data_parallel_size)
        _check_choice("data_parallel_routing", self.data_parallel_routing, DATA_PARALLEL_ROUTINGS)
        if not 0 <= self.data_parallel_rank < self.data_parallel_size:
            raise ConfigError(f"data_parallel_rank {self.data_parallel_rank} is outside "
                              f"data_parallel_size {self.data_parallel_size}")
        if self.kv_events_config is not None:
            _check_choice("kv_events_config.publisher", self.kv_events_config.publisher, KV_EVENT_PUBLISHERS)
            if self.kv_events_config.enabled and importlib.util.find_spec("zmq") is None:
                raise ConfigError("kv_events_config with publisher 'zmq' needs pyzmq: "
                                  "pip install 'ringserve[kv-events]' (or pyzmq)")
        if not isinstance(self.long_prefill_token_threshold, int) or self.long_prefill_token_threshold < 0:
            raise ConfigError("long_prefill_token_threshold must be a non-negative integer (0: no cap), "
                              f"got {self.long_prefill_token_threshold!r}")
        _check_positive("max_num_seqs", self.max_num_seqs)
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise ConfigError(f"block_size must be a power of two from 1 to 128, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.kv_cache_memory is not None:
            _check_positive("kv_cache_memory", self.kv_cache_memory)
        check_mode(self.generation_config)
        if self.generation_config not in ("auto", "vllm"):
            self.generation_config = os.path.abspath(os.path.expanduser(self.generation_config))

        hf = self.hf_config()
        archs = hf.get("architectures") or []
        known = SUPPORTED_ARCHITECTURES + ENCODER_ARCHITECTURES
        arch = next((a for a in archs if a in known), None)
        if arch is None:
            raise ConfigError(
                f"unsupported architecture {archs or hf.get('model_type')!r} in {self.model}; "
                f"supported: {', '.join(known)}"
            )
        self.architecture = arch
        self.vocab_size = int(hf["vocab_size"])
        self.sampling_defaults = sampling_defaults(self.model, self.is_gguf, self.generation_config,
                                                   self.override_generation_config)
        encoder = self._resolve_runner(hf)

        heads = int(hf["num_attention_heads"])
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        tp = self.tensor_parallel_size
        if heads % tp:
            raise ConfigError(f"tensor_parallel_size {tp} does not divide num_attention_heads {heads}")
        if kv_heads % tp and tp % kv_heads:
            raise ConfigError(
                f"tensor_parallel_size {tp} and num_key_value_heads {kv_heads}: one must divide the other"
            )

        self.resolved_device = self._resolve_device()
        if self.resolved_device == "cuda" and tp > cuda_device_count():
            raise ConfigError(
                f"tensor_parallel_size {tp} needs {tp} GPUs (one per rank), but torch sees "
                f"{cuda_device_count()} (check CUDA_VISIBLE_DEVICES)"
            )
        self.resolved_dtype = self._resolve_dtype(hf)
        self.quantization = self._resolve_quantization()

        limit = encoder.max_len if encoder else _model_max_len(hf)
        if self.max_model_len is None:       # an encoder: as long as sentence-transformers truncates to
            self.max_model_len = min(limit, (encoder and read_max_seq_length(self.model)) or limit)
        elif self.max_model_len > limit:
            raise ConfigError(
                f"max_model_len {self.max_model_len} exceeds the model's limit of {limit} tokens "
                f"(max_position_embeddings in {self.model}{'' if self.is_gguf else '/config.json'})"
            )
        _check_positive("max_model_len", self.max_model_len)
        # The request ring must take a max_model_len prompt (4 B a token) plus its sampling params; the
        # scheduler then keeps every broadcast step within its ring (see Scheduler.max_new_request_bytes).
        needed = 4 * (4 * self.max_model_len + PARAMS_ALLOWANCE)
        if self.ring_bytes == DEFAULT_RING_BYTES and needed > self.ring_bytes:     # million-token contexts
            self.ring_bytes = -(-needed // (1 << 20)) << 20
        if self.ring_bytes < needed:
            raise ConfigError(
                f"ring_bytes {self.ring_bytes} is too small for max_model_len {self.max_model_len}: "
                f"a full-length prompt needs ring_bytes >= {needed}"
            )
        args = encoder or ModelArgs.from_hf_config(hf, arch, self.max_model_len)   # refuses what it can't compute
        backend = self.attention_backend or ("triton" if self.resolved_device == "cuda" else "torch")
        if backend == "triton" and importlib.util.find_spec("triton") is None:
            raise ConfigError("the triton attention backend (the default on a GPU) needs triton, which the "
                              "default install leaves out: pip install 'ringserve[gpu]' (or triton)")
        if backend == "triton" and not encoder and args.head_dim not in TRITON_HEAD_DIMS:
            raise ConfigError(
                f"head_dim {args.head_dim} is not supported by the triton attention backend "
                f"({', '.join(map(str, TRITON_HEAD_DIMS))}); pass attention_backend='torch'"
            )
        self._fit_grammar_masks()

        self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.speculative_config is not None and self.runner == "pooling":
            raise ConfigError("speculative_config applies to runner 'generate' only (a pooling model samples "
                              "no tokens)")
        if self.max_num_batched_tokens is None:
            default = 8192 if self.resolved_device == "cuda" else 2048
            self.max_num_batched_tokens = max(default, self.max_num_seqs)
        _check_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.runner == "pooling":
            self._fit_pooling()
        if self.in_process and tp != 1:
            raise ConfigError("in_process mode runs one executor; tensor_parallel_size must be 1")
        if self.in_process and self.data_parallel_size != 1:
            raise ConfigError("in_process mode runs one engine; data_parallel_size must be 1")
        if self.resolved_device == "cuda" and self.data_parallel_size > 1:
            import torch

            if self.data_parallel_size * tp > torch.cuda.device_count():
                raise ConfigError(f"data_parallel_size {self.data_parallel_size} x tensor_parallel_size {tp} "
                                  f"needs {self.data_parallel_size * tp} GPUs; {torch.cuda.device_count()} visible")
        self.finalized = True
        return self

    @property
    def grammar_mask_bytes(self) -> int:
        """The largest per-step grammar bitmask: one packed int32 row per sampling sequence."""
        return self.max_num_seqs * 4 * ((self.vocab_size + 31) // 32)

    def _fit_grammar_masks(self) -> None:
        """A step's new requests take at most half the broadcast ring (Scheduler.max_new_request_bytes);
        the other half carries the columns (64 B a sequence covers them) and the grammar bitmask, so it must
        hold a full-batch mask."""
        if self.grammar_compile_timeout_s <= 0:
            raise ConfigError(f"grammar_compile_timeout_s must be positive, got {self.grammar_compile_timeout_s}")
        _check_positive("grammar_compile_workers", self.grammar_compile_workers)
        needed = 2 * (self.grammar_mask_bytes + 64 * self.max_num_seqs)
        if self.ring_bytes == DEFAULT_RING_BYTES and needed > self.ring_bytes:
            self.ring_bytes = -(-needed // (1 << 20)) << 20
        if self.ring_bytes < needed:
            raise ConfigError(
                f"ring_bytes {self.ring_bytes} is too small for the grammar bitmasks of max_num_seqs "
                f"{self.max_num_seqs} over a {self.vocab_size}-token vocabulary: ring_bytes >= {needed} is needed"
            )

    def _resolve_runner(self, hf: dict) -> EncoderArgs | None:
        """Pick the runner (vLLM's: pooling for an encoder, generate otherwise) and, for pooling, the pooler
        config; returns the encoder's args for an encoder model (read here, so a bad config fails now)."""
        _check_choice("runner", self.runner, RUNNERS)
        encoder = EncoderArgs.from_hf_config(hf, self.architecture) if self.is_encoder else None
        if encoder and self.runner == "generate":
            raise ConfigError(f"{self.architecture} is an encoder model: it computes embeddings (runner 'pooling') "
                              "and cannot generate text (runner 'generate')")
        if self.runner == "auto":
            self.runner = "pooling" if encoder else "generate"
        self.hidden_size = int(hf.get("hidden_size") or 0)
        if self.runner == "pooling":
            self.pooler_config = resolve_pooler_config(None if self.is_gguf else self.model, hf, bool(encoder),
                                                       self.pooler_config)
        elif self.pooler_config is not None:
            raise ConfigError("pooler_config applies to runner 'pooling' only")
        return encoder

    def _fit_pooling(self) -> None:
        """A pooling step returns one float32 vector per request on the result ring: it must hold a full
        batch of them (the ring grows when ring_bytes is the default); an encoder runs a whole prompt in one
        step, so the token budget must take a max_model_len prompt."""
        if self.load_format == "fake":
            raise ConfigError("load_format 'fake' has no pooling model; use dummy weights instead")
        if self.is_encoder and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                              f"max_model_len ({self.max_model_len}): an encoder runs a whole prompt in one step")
        needed = 4 * (self.max_num_seqs * (4 * self.hidden_size + 8) + PARAMS_ALLOWANCE)
        if self.ring_bytes == DEFAULT_RING_BYTES and needed > self.ring_bytes:
            self.ring_bytes = -(-needed // (1 << 20)) << 20
        if self.ring_bytes < needed:
            raise ConfigError(f"ring_bytes {self.ring_bytes} is too small for the pooled vectors of max_num_seqs "
                              f"{self.max_num_seqs} requests of {self.hidden_size} floats: ring_bytes >= {needed} "
                              "is needed")

    def _resolve_model(self) -> None:
        """Turn MODEL into a local directory or GGUF file: built-in names, then local paths, then hub ids."""
        if self.model in ("", DEMO_NAME):
            from engine.models.demo import ensure_demo_model  # stdlib only; builds files on first use

            self.model = ensure_demo_model()
            self.served_model_name = self.served_model_name or DEMO_NAME
            return
        if self.model == SMOLLM2_NAME:
            path = find_smollm2()
            if path is None:
                raise ConfigError(f"{SMOLLM2_NAME} is not installed; install it with: {SMOLLM2_INSTALL}")
            self.model = path
            self.served_model_name = self.served_model_name or SMOLLM2_NAME
            return
        if self.model == MINILM_NAME:
            path = find_minilm()
            if path is None:
                raise ConfigError(f"{MINILM_NAME} is not installed; install it with: {MINILM_INSTALL}")
            self.model = unpack_model_zip(path)
            self.served_model_name = self.served_model_name or MINILM_NAME
            return
        if is_model_zip(os.path.expanduser(self.model)):      # a zipped model directory: unpacked once
            self.served_model_name = self.served_model_name or self.model
            self.model = unpack_model_zip(os.path.expanduser(self.model))
            return
        from engine.models.hub import looks_like_repo_id, resolve_repo

        if looks_like_repo_id(self.model):
            self.served_model_name = self.served_model_name or self.model
            self.model = resolve_repo(self.model, self.revision, self.download_dir)
        self.model = os.path.abspath(os.path.expanduser(self.model))

    def _resolve_device(self) -> str:
        if self.device != "auto":
            if self.device == "cuda" and not cuda_available():
                raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA GPU")
            return self.device
        if self.load_format == "fake":
            return "cpu"
        return "cuda" if cuda_available() else "cpu"

    def _resolve_dtype(self, hf: dict) -> str:
        if self.dtype != "auto":
            return self.dtype
        declared = hf.get("torch_dtype") or hf.get("dtype") or "float32"
        if declared not in ("float32", "bfloat16", "float16"):
            declared = "float32"
        if self.resolved_device == "cpu" and declared == "float16" and not cpu_half_kernels_possible():
            return "float32"     # without kernels/cpu/ops, fp16 matmuls on the CPU are slow and lossy
        return declared

    def _resolve_quantization(self) -> str:
        if self.quantization is not None:
            _check_choice("quantization", self.quantization, QUANTIZATIONS)
        if not self.is_gguf or self.load_format in ("dummy", "fake"):
            if self.quantization == "gguf":
                raise ConfigError("quantization 'gguf' needs a .gguf model file read from disk "
                                  f"({self.model!r} with load_format {self.load_format!r})")
            return "none"
        if self.quantization is not None:
            return self.quantization
        from engine.models.gguf_config import holds_quantized_tensors

        return "gguf" if holds_quantized_tensors(self.model) else "none"

    # ------------------------------------------------------------------ transport
    def to_json(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> EngineConfig:
        return msgspec.json.decode(data, type=cls)


def read_model_config(model: str) -> dict:
    if not model:
        raise ConfigError("no model given")
    if not os.path.isdir(model):
        raise ConfigError(f"model directory {model!r} does not exist")
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"{model!r} has no config.json (is it a Hugging Face model directory?)")
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e}") from None


def _model_max_len(hf: dict) -> int:
    return int(hf.get("max_position_embeddings") or 2048)


def cpu_half_kernels_possible() -> bool:
    """Whether kernels/cpu/ops (fast 16-bit weights on the CPU, float32 arithmetic) can run here: x86 with
    AVX2, FMA and F16C, a C compiler, and not RINGSERVE_CPU_KERNELS=0. The same test as the kernels' own,
    made here without importing torch (the engine root may not import kernels/); should their build still
    fail, a 16-bit model runs on the CPU through the slower torch path, with the same numbers."""
    import shutil

    if os.environ.get("RINGSERVE_CPU_KERNELS", "1") == "0":
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    if not all(flag in flags for flag in ("avx2", "fma", "f16c")):
        return False
    return (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")) is not None


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU: the one question device "auto" asks (torch is imported only here, as
    the scheduler process never loads it; the test suite pins this to False outside its `gpu` tests)."""
    import torch

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """How many CUDA GPUs this process may use (tensor parallelism takes one per rank)."""
    import torch

    return torch.cuda.device_count()


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
