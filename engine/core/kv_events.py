"""KV-cache events for KV-aware routers (`--kv-events-config`), published as vLLM publishes them.

The block pool reports each block that enters the prefix cache (BlockStored, with its tokens and its
parent's hash), each cached block it evicts (BlockRemoved) and a cache reset (AllBlocksCleared); the
scheduler process publishes one KVEventBatch per engine step that had any. A consumer that applies the
events in order holds exactly the set of block hashes the engine's prefix cache holds, which is what
llm-d's precise prefix scorer, vllm-router's kv_aware policy and Dynamo's KV router keep per replica.

Wire format (vLLM's `vllm/distributed/kv_events.py`): msgspec msgpack, structs encoded as arrays with the
class name as the first element of each event; block hashes as 64-bit integers (vLLM's default
external form, `engine.block_hash.external_block_hash`). Transport: a ZMQ PUB socket sending
(topic, 8-byte big-endian sequence number, payload) per batch, and an optional ZMQ ROUTER replay socket: a
client sends an 8-byte start sequence number and gets every buffered (seq, payload) from there, then
(-1, b""). pyzmq is imported only when events are enabled (the optional extra `ringserve[kv-events]`);
sockets live in one publisher thread, so the step loop only enqueues.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from itertools import count

import msgspec

from engine.config import EngineConfig, KVEventsConfig

MEDIUM_GPU = "GPU"         # vLLM's name for the device-resident KV cache (also what it is on the CPU path)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the events; the tag (class name) is each event's first array element."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None       # None for a request's first block
    token_ids: list[int]                # block_size tokens per stored block, in order
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float                           # time.time() of the step
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """vLLM's rule for data parallelism: rank r publishes on port + r (tcp) or name + _dp{r} (ipc/inproc)."""
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"


class ZmqEventPublisher:
    """PUB socket plus optional ROUTER replay buffer, both owned by one daemon thread."""

    SHUTDOWN_TIMEOUT_S = 1.0

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int = 0) -> None:
        try:
            import zmq
        except ImportError:
            raise ImportError("--kv-events-config with publisher 'zmq' needs pyzmq: "
                              "pip install 'ringserve[kv-events]' (or pyzmq)") from None
        self._zmq = zmq
        self.rank = data_parallel_rank
        self.endpoint = offset_endpoint_port(config.endpoint, data_parallel_rank)
        self.replay_endpoint = offset_endpoint_port(config.replay_endpoint, data_parallel_rank)
        self._topic = config.topic.encode()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._seq = count()
        self._encode = msgspec.msgpack.Encoder().encode
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay = None
        try:
            self._pub.bind(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise OSError(f"cannot publish KV events on {self.endpoint}"
                          f"{' / ' + self.replay_endpoint if self.replay_endpoint else ''}: {e}") from None
        self._thread = threading.Thread(target=self._run, name="kv-events-publisher", daemon=True)
        self._thread.start()

    def publish(self, events: list) -> None:
        """Enqueue one step's events (encoded here, in the caller, so the thread only sends)."""
        batch = KVEventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank)
        try:
            self._queue.put_nowait(self._encode(batch))
        except queue.Full:
            print("ringserve: KV events queue full; a batch was dropped (consumers can detect the gap "
                  "by sequence number, but not replay it)", file=sys.stderr)

    def shutdown(self) -> None:
        """Send what is queued (bounded by SHUTDOWN_TIMEOUT_S), then close the sockets."""
        self._queue.put(None)
        self._thread.join(self.SHUTDOWN_TIMEOUT_S)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=0)
        self._ctx.term()

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                payload = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if payload is None:
                return
            seq = next(self._seq)
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return                       # not [identity, empty delimiter, start seq]: ignore it
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


def make_publisher(config: EngineConfig) -> ZmqEventPublisher | None:
    """The publisher the config asks for; None when events are off (or go to the null publisher)."""
    events = config.kv_events_config
    if events is None or not events.enabled:
        return None
    return ZmqEventPublisher(events, config.data_parallel_rank)
