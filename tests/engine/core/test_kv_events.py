"""KV-cache events: applied in order, they rebuild exactly the engine's cached block set, through prefix
hits, evictions under a tiny KV cache, preemptions and a cache reset; over ZMQ, the live stream and the
replay socket deliver the same batches in vLLM's wire format."""

from __future__ import annotations

import random
import socket
import time

import msgspec
import pytest

from engine.block_hash import external_block_hash
from engine.config import EngineConfig, KVEventsConfig
from engine.core.engine_core import EngineCore
from engine.core.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    offset_endpoint_port,
)
from engine.executor.group import LocalExecutor
from engine.messages import AddRequest, ControlCall, pack
from engine.sampling_params import SamplingParams

BLOCK = 4


def engine_core(events: KVEventsConfig, num_blocks: int = 48, async_scheduling: bool = False) -> EngineCore:
    config = EngineConfig(load_format="fake", in_process=True, block_size=BLOCK, max_num_seqs=6,
                          max_model_len=256, num_gpu_blocks_override=num_blocks, kv_events_config=events,
                          async_scheduling=async_scheduling)
    config.finalize()
    return EngineCore(config, LocalExecutor(config))


def add(core: EngineCore, req: int, tokens: list[int], max_tokens: int) -> None:
    core.handle(AddRequest(req=req, prompt_token_ids=pack(tokens),
                           params=SamplingParams(max_tokens=max_tokens, ignore_eos=True).resolved(),
                           eos_token_ids=[0], arrival_time=time.monotonic()))


def workload(seed: int) -> list[tuple[list[int], int]]:
    """Prompts over a few shared prefixes (hits) with unique tails, more than the cache holds."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 500) for _ in range(rng.randrange(4, 24))] for _ in range(4)]
    return [(rng.choice(prefixes) + [rng.randrange(1, 500) for _ in range(rng.randrange(1, 14))],
             rng.randrange(1, 12)) for _ in range(40)]


class Replica:
    """What a KV-aware router keeps per replica: the set of block hashes it believes are cached."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert len(event.token_ids) == len(event.block_hashes) * event.block_size
                assert event.parent_block_hash is None or event.parent_block_hash in self.blocks
                self.blocks.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= self.blocks
                self.blocks.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.blocks.clear()


def cached_set(core: EngineCore) -> set[int]:
    pool = core.scheduler.kv_cache_manager.block_pool
    return {external_block_hash(h) for h in pool.cached_block_hash_to_block}


class Recorder:
    def __init__(self) -> None:
        self.batches: list[KVEventBatch] = []

    def publish(self, events: list) -> None:
        self.batches.append(KVEventBatch(ts=time.time(), events=events))

    def shutdown(self) -> None:
        pass


def run(core: EngineCore, jobs, check_each_step=None) -> None:
    pending = list(enumerate(jobs, start=1))
    while pending or core.has_work:
        for _ in range(min(3, len(pending))):          # a few arrivals per step, so requests overlap
            req, (tokens, max_tokens) = pending.pop(0)
            add(core, req, tokens, max_tokens)
        core.step()
        if check_each_step is not None:
            check_each_step()


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_events_replay_to_exactly_the_cached_block_set_after_every_step(seed, async_scheduling):
    core = engine_core(KVEventsConfig(enable_kv_cache_events=True, publisher="null"), num_blocks=32,
                       async_scheduling=async_scheduling)
    recorder = core.kv_event_publisher = Recorder()
    replica = Replica()
    seen = 0

    def check() -> None:
        nonlocal seen
        for batch in recorder.batches[seen:]:
            replica.apply(batch)
        seen = len(recorder.batches)
        assert replica.blocks == cached_set(core)

    run(core, workload(seed), check)
    kinds = {type(e) for b in recorder.batches for e in b.events}
    assert {BlockStored, BlockRemoved} <= kinds                 # the tiny cache evicted
    assert core.scheduler.num_preemptions + core.scheduler.kv_cache_manager.prefix_cache_hits > 0
    reply = core.control(ControlCall(call_id=1, method="reset_prefix_cache"))
    assert reply.result == "True"
    check()
    assert replica.blocks == set() and isinstance(recorder.batches[-1].events[-1], AllBlocksCleared)


def test_no_events_are_collected_unless_asked_for():
    core = engine_core(None)
    run(core, workload(3)[:5])
    assert core.scheduler.kv_cache_manager.block_pool.kv_events is None
    assert core.kv_event_publisher is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zmq_stream_and_replay_carry_the_same_batches_in_vllms_format():
    zmq = pytest.importorskip("zmq")
    pub_port, replay_port = free_port(), free_port()
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://127.0.0.1:{pub_port}",
                            replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic="kv")
    core = engine_core(config, num_blocks=32)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{pub_port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    decode = msgspec.msgpack.Decoder(KVEventBatch).decode
    try:
        time.sleep(0.3)                                    # PUB/SUB: let the subscription reach the publisher
        run(core, workload(4))
        expected = cached_set(core)
        live: list[tuple[int, bytes]] = []
        while sub.poll(1000):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv"
            live.append((int.from_bytes(seq, "big"), payload))
        assert [seq for seq, _ in live] == list(range(len(live))) and live
        replica = Replica()
        for _, payload in live:
            replica.apply(decode(payload))
        assert replica.blocks == expected

        # a late joiner asks the replay socket for everything from sequence 0 (DEALER: many replies)
        replay = ctx.socket(zmq.DEALER)
        replay.connect(f"tcp://127.0.0.1:{replay_port}")
        replay.send_multipart((b"", (0).to_bytes(8, "big")))
        replayed = []
        while replay.poll(2000):
            _, seq, payload = replay.recv_multipart()
            if seq == END_SEQ:
                break
            replayed.append((int.from_bytes(seq, "big"), payload))
        replay.close(linger=0)
        assert replayed == live
        # vLLM's encoding: [ts, [[tag, ...fields], ...], dp_rank], hashes as ints
        raw = msgspec.msgpack.decode(live[0][1])
        assert raw[2] == 0 and raw[1][0][0] == "BlockStored" and isinstance(raw[1][0][1][0], int)
    finally:
        core.close()
        sub.close(linger=0)
        ctx.term()


def test_data_parallel_ranks_publish_on_offset_ports_as_vllm_does():
    assert offset_endpoint_port("tcp://127.0.0.1:5557", 0) == "tcp://127.0.0.1:5557"
    assert offset_endpoint_port("tcp://127.0.0.1:5557", 2) == "tcp://127.0.0.1:5559"
    assert offset_endpoint_port("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
