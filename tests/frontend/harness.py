"""Test harness: a tiny self-contained model directory, and create_app served by hypercorn in a thread.

The tiny model needs nothing from ../shared: a byte-level tokenizer (one token per byte, so multi-byte
characters span tokens) with ChatML special tokens and a chat template, and a Qwen3 config.json small
enough that EngineConfig.finalize() accepts it without loading any weights.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config as HypercornConfig

from engine.config import EngineConfig
from frontend.app import create_app
from frontend.config import ServerConfig
from frontend.server import hypercorn_config
from tests.frontend.fake_engine import FakeEngine

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_MAX_MODEL_LEN = 512


def _byte_chars() -> list[str]:
    """The byte-level alphabet in byte order (GPT-2's scheme): token id == byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_model(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={ch: b for b, ch in enumerate(_byte_chars())}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|im_end|>")
    files = {
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                                  "pad_token": "<|endoftext|>", "chat_template": CHATML_TEMPLATE,
                                  "clean_up_tokenization_spaces": False},
        "config.json": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 272,
                        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "num_hidden_layers": 1, "max_position_embeddings": TINY_MAX_MODEL_LEN,
                        "eos_token_id": eos, "torch_dtype": "float32"},
        "generation_config.json": {"eos_token_id": eos},
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content))
    return directory


def engine_config(model_dir: Path | str, **overrides) -> EngineConfig:
    return EngineConfig(**{"model": str(model_dir), "device": "cpu", "load_format": "fake", "served_model_name": "tiny",
                           **overrides})


class ServerThread:
    """Serves an ASGI app with hypercorn on a free loopback port, in a thread with its own event loop."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self._config = config
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = hypercorn_config(self._config, sock.detach())
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(config),), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test server did not start")
        with httpx.Client(base_url=self.url, timeout=5) as client:
            client.get("/health")      # returns once hypercorn has run the lifespan and accepts requests
        return self

    async def _main(self, config: HypercornConfig) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await serve(self.app, config, shutdown_trigger=self._stop.wait)

    def call(self, fn, *args):
        """Run fn(*args) on the server's loop (the fake engine's state belongs to it) and return its result."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(5)

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        if self._thread.is_alive():
            raise RuntimeError("the test server did not stop")


def serve_fake(model_dir: Path | str, *, server: ServerConfig | None = None, engine_overrides: dict | None = None,
               **fake_options) -> tuple[ServerThread, FakeEngine]:
    """A FakeEngine over model_dir and a (not yet entered) ServerThread serving create_app over it."""
    fake = FakeEngine(engine_config(model_dir, **(engine_overrides or {})), **fake_options)
    config = server or ServerConfig(log_stats_interval=0, shutdown_timeout=1.0)
    config.engine = fake.config
    return ServerThread(create_app(fake, config), config), fake
