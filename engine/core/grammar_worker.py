"""A grammar compile worker process (`python -m engine.core.grammar_worker JSON`), and its wire protocol.

The scheduler compiles structured-output grammars in a few of these processes (engine/core/compile_pool.py)
rather than in threads of its own, because an xgrammar compile cannot be interrupted: a pathological
grammar past its deadline is stopped by killing its worker, which returns every byte the compile held.

The protocol runs over the worker's stdin and stdout: length-framed msgpack (4-byte little-endian length,
then the message), no pickle. The scheduler opens with `Setup`; the worker answers `Ready` with the
vocabulary's `TokenizerInfo` serialized (so that the scheduler can deserialize compiled grammars and start
further workers without loading the tokenizer again) or with the reason it cannot serve. Then each
`Compile` gets one `Compiled` (the grammar as xgrammar's JSON) or `Failed`.

The tokenizer is loaded through the one loader that knows every model kind (engine/client/tokenizer.py:
directories, GGUF files, hub snapshots, the bundled model); xgrammar (which imports torch) and transformers
are imported here only, never by the scheduler at import.
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time
from typing import BinaryIO

import msgspec

from engine.config import EngineConfig
from engine.process import child_args
from engine.sampling_params import StructuredOutputsParams
from engine.structured_spec import backend_message, to_grammar

_LENGTH = struct.Struct("<I")
PARENT_CHECK_S = 1.0


class Setup(msgspec.Struct, tag=True):
    stop_token_ids: list[int]
    tokenizer_info: str | None = None      # TokenizerInfo JSON from an earlier worker; None: load the tokenizer


class Ready(msgspec.Struct, tag=True):
    tokenizer_info: str | None = None      # set when this worker built it from the tokenizer
    error: str | None = None               # the worker cannot compile (it exits after saying so)


class Compile(msgspec.Struct, tag=True):
    spec: StructuredOutputsParams


class Compiled(msgspec.Struct, tag=True):
    grammar: str                           # xgrammar's CompiledGrammar.serialize_json()


class Failed(msgspec.Struct, tag=True):
    message: str


ToWorker = Setup | Compile
FromWorker = Ready | Compiled | Failed


class Channel:
    """Framed msgpack messages over a pair of binary pipes."""

    def __init__(self, reader: BinaryIO, writer: BinaryIO, incoming) -> None:
        self._reader, self._writer = reader, writer
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(incoming)

    def send(self, message) -> None:
        data = self._encoder.encode(message)
        self._writer.write(_LENGTH.pack(len(data)) + data)
        self._writer.flush()

    def receive(self):
        """The next message; EOFError when the other side has gone."""
        head = self._reader.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            raise EOFError("the channel closed")
        (size,) = _LENGTH.unpack(head)
        data = self._reader.read(size)
        if len(data) < size:
            raise EOFError("the channel closed mid-message")
        return self._decoder.decode(data)


def _build_compiler(config: EngineConfig, setup: Setup):
    """(GrammarCompiler, the TokenizerInfo JSON when it was built here)."""
    import xgrammar as xgr

    if setup.tokenizer_info is not None:
        return xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(setup.tokenizer_info),
                                   max_threads=1, cache_enabled=False), None
    if config.skip_tokenizer_init:
        raise ValueError("structured_outputs need the tokenizer, and this engine runs with skip_tokenizer_init")
    from engine.client.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(config)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=config.vocab_size,
                                              stop_token_ids=setup.stop_token_ids or None)
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), info.serialize_json()


def serve(channel: Channel, config: EngineConfig) -> None:
    """Answer the scheduler until it closes the channel."""
    setup = channel.receive()
    try:
        compiler, info = _build_compiler(config, setup)
    except Exception as e:  # noqa: BLE001  the scheduler reports it to every structured request
        channel.send(Ready(error=f"structured outputs are unavailable: {e}"))
        return
    channel.send(Ready(tokenizer_info=info))
    del info
    while True:
        try:
            task = channel.receive()
        except EOFError:
            return
        try:
            reply = Compiled(grammar=compiler.compile_grammar(to_grammar(task.spec)).serialize_json())
        except ValueError as e:
            reply = Failed(message=str(e))
        except Exception as e:  # noqa: BLE001  xgrammar's compile errors are RuntimeErrors with C++ text
            reply = Failed(message=f"structured_outputs: compile failed: {backend_message(e)}")
        channel.send(reply)


def _exit_with_parent(parent_pid: int) -> None:
    """A compile can run for long: leave as soon as the scheduler is gone, whatever the main thread does."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def main() -> int:
    args = child_args()
    threading.Thread(target=_exit_with_parent, args=(args["parent_pid"],), daemon=True).start()
    # The protocol owns the original stdout; anything a library prints goes to stderr instead.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    channel = Channel(sys.stdin.buffer, protocol_out, ToWorker)
    serve(channel, EngineConfig.from_json(args["config"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
