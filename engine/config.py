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

import msgspec

from engine.errors import ConfigError
from engine.models.bundled import SMOLLM2_INSTALL, SMOLLM2_NAME, find_smollm2
from engine.models.gguf_file import is_gguf_path
from engine.models.model_args import SUPPORTED_ARCHITECTURES, ModelArgs
from engine.speculative_config import SpeculativeConfig, parse_speculative_config

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "dummy", "fake")
DEVICES = ("auto", "cpu", "cuda")
DEMO_NAME = "ringserve-demo"
SCHEDULING_POLICIES = ("fcfs", "priority")
DATA_PARALLEL_ROUTINGS = ("prefix", "load", "round_robin")
KV_EVENT_PUBLISHERS = ("null", "zmq")

GiB = 1 << 30
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


class EngineConfig(msgspec.Struct, kw_only=True):
    # --- model
    model: str = ""                          # HF model directory, hub repo id, .gguf file, or a built-in
                                             # name (ringserve-demo, smollm2-135m-instruct); "": the demo
    revision: str | None = None              # hub branch, tag or commit of a repo id
    download_dir: str | None = None          # hub cache directory (default: huggingface_hub's)
    tokenizer: str | None = None             # defaults to the model directory (or the GGUF file)
    skip_tokenizer_init: bool = False        # token ids in and out, no tokenizer (vLLM's option)
    served_model_name: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    load_format: str = "auto"                # auto | safetensors | dummy | fake (zero-cost fake model)
    fake_step_us: int = 0                    # load_format fake: each forward sleeps this long, as a CPU
                                             # waiting for a GPU step would (engine-overhead benchmarks)
    seed: int = 0
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
    kv_cache_memory: int | None = None       # bytes; on the CPU the default is 4 GiB
    num_gpu_blocks_override: int | None = None
    kv_events_config: KVEventsConfig | None = None
    # --- scheduler
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int = 0    # most tokens one request's prefill takes in a step; 0: no cap
    max_logprobs: int = 20
    async_scheduling: bool = False           # schedule step N+1 while step N runs (vLLM's --async-scheduling)
    # --- speculative decoding (engine/speculative_config.py); a dict or JSON text is parsed by finalize()
    speculative_config: SpeculativeConfig | None = None
    # --- structured outputs (engine/core/structured_output.py)
    grammar_compile_timeout_s: float = 10.0  # a compile past this ends its request with an error
    grammar_compile_threads: int = 2         # compile pool of the scheduler process
    # --- processes and rings
    in_process: bool = False                 # scheduler and one executor in the caller (debugging, unit tests)
    ring_bytes: int = DEFAULT_RING_BYTES     # the broadcast ring; the others are sized from it; grows
                                             # by default for contexts beyond about a million tokens
    spin_us: int | None = None               # spin window before sleeping; None: adapt to the device
    startup_timeout_s: float = 600.0
    # --- derived by finalize(); never set by hand
    architecture: str = ""
    resolved_dtype: str = ""
    resolved_device: str = ""
    vocab_size: int = 0
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

    def generation_config(self) -> dict:
        if self.is_gguf:
            return {}
        path = os.path.join(self.model, "generation_config.json")
        if not os.path.isfile(path):
            return {}
        with open(path) as f:
            return json.load(f)

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

        hf = self.hf_config()
        archs = hf.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ConfigError(
                f"unsupported architecture {archs or hf.get('model_type')!r} in {self.model}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        self.architecture = arch
        self.vocab_size = int(hf["vocab_size"])

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

        limit = _model_max_len(hf)
        if self.max_model_len is None:
            self.max_model_len = limit
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
        args = ModelArgs.from_hf_config(hf, arch, self.max_model_len)   # refuses what the decoder can't compute
        backend = self.attention_backend or ("triton" if self.resolved_device == "cuda" else "torch")
        if backend == "triton" and args.head_dim not in TRITON_HEAD_DIMS:
            raise ConfigError(
                f"head_dim {args.head_dim} is not supported by the triton attention backend "
                f"({', '.join(map(str, TRITON_HEAD_DIMS))}); pass attention_backend='torch'"
            )
        self._fit_grammar_masks()

        self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.max_num_batched_tokens is None:
            default = 8192 if self.resolved_device == "cuda" else 2048
            self.max_num_batched_tokens = max(default, self.max_num_seqs)
        _check_positive("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.resolved_device == "cpu" and self.kv_cache_memory is None:
            self.kv_cache_memory = 4 * GiB
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
        _check_positive("grammar_compile_threads", self.grammar_compile_threads)
        needed = 2 * (self.grammar_mask_bytes + 64 * self.max_num_seqs)
        if self.ring_bytes == DEFAULT_RING_BYTES and needed > self.ring_bytes:
            self.ring_bytes = -(-needed // (1 << 20)) << 20
        if self.ring_bytes < needed:
            raise ConfigError(
                f"ring_bytes {self.ring_bytes} is too small for the grammar bitmasks of max_num_seqs "
                f"{self.max_num_seqs} over a {self.vocab_size}-token vocabulary: ring_bytes >= {needed} is needed"
            )

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
            return "float32"     # without kernels/cpu_avx2, fp16 matmuls on the CPU are slow and lossy
        return declared

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
    """Whether kernels/cpu_avx2 (fast 16-bit weights on the CPU, float32 arithmetic) can run here: x86 with
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
