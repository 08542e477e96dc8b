"""The actors as processes: concurrency with aborts, faults, startup failures, lifecycle leaks.

Every test runs the real topology: EngineClient -> scheduler process -> executor process(es), joined only
by the shm rings. "Nothing leaks" is checked three ways: no child process of ours survives, no /dev/shm
entry of ours remains, and (for the lifecycle test) the test process's open file descriptors are back to
what they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from engine.client.engine_client import EngineClient
from engine.config import ConfigError, EngineConfig
from engine.outputs import EngineDeadError
from engine.sampling_params import SamplingParams
from tests.conftest import REPO
from tests.e2e.server import shm_segments
from tests.engine.hf_models import tiny_model_fixture  # noqa: F401


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def no_leaks():
    before = shm_segments()
    yield
    assert shm_segments() - before == set(), "our /dev/shm entries leaked"


def test_concurrent_requests_with_random_aborts(tiny_model, no_leaks):
    """Many asyncio tasks, a third of them abandoned mid-stream: the rest complete with exactly the tokens
    an undisturbed run gives, and afterwards no KV block is in use."""
    path = tiny_model("Qwen3ForCausalLM", max_position_embeddings=512)
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(rng.randint(1, 120))] for _ in range(40)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    aborted = set(rng.sample(range(len(prompts)), 13))

    async def run(client: EngineClient, abort: set[int]) -> dict[int, list[int]]:
        async def one(i: int) -> tuple[int, list[int] | None]:
            tokens = []
            async for delta in client.generate(f"req-{i}", prompts[i], params):
                tokens += delta.new_token_ids
                if i in abort and len(tokens) >= 1 + i % 5:
                    return i, None                   # leaving the loop aborts the request
                await asyncio.sleep(0)
            return i, tokens

        results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        return {i: t for i, t in results if t is not None}

    config = EngineConfig(model=str(path), max_model_len=512, max_num_seqs=16)
    with EngineClient(config) as client:
        reference = asyncio.run(run(client, set()))
    with EngineClient(config) as client:
        async def run_and_settle():
            done = await run(client, aborted)
            for _ in range(200):                     # the aborts reach the scheduler within a step
                stats = client.stats
                if stats.num_running == 0 and stats.num_waiting == 0:
                    break
                await asyncio.sleep(0.01)
            return done
        results = asyncio.run(run_and_settle())
        stats = client.stats
        num_blocks = client.num_blocks
    assert set(results) == set(range(len(prompts))) - aborted
    assert all(results[i] == reference[i] for i in results)
    assert all(len(t) == 24 for t in results.values())
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.kv_cache_usage == 0.0
    assert stats.num_free_blocks == num_blocks - 1      # all but the null block


@pytest.mark.parametrize("victim", ["scheduler", "executor0"])
def test_sigkill_mid_generation_fails_requests_fast(victim, no_leaks):
    config = EngineConfig(load_format="fake", max_model_len=2048)
    client = EngineClient(config).start()
    pids = dict(client.pids)
    params = SamplingParams(temperature=0.0, max_tokens=100_000 // 100, ignore_eos=True)

    async def scenario():
        streams = [client.generate(f"r{i}", [1, 2, 3, i], params) for i in range(4)]
        for s in streams:                            # every request is producing tokens
            await s.__anext__()
        os.kill(pids[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        errors = []
        for s in streams:
            with pytest.raises(EngineDeadError) as info:
                async for _ in s:
                    pass
            errors.append(str(info.value))
        return time.monotonic() - killed_at, errors

    try:
        elapsed, errors = asyncio.run(scenario())
        assert elapsed < 2.0
        name = "the scheduler" if victim == "scheduler" else "executor rank 0"
        assert all(name in e and "SIGKILL" in e for e in errors), errors
        assert client.is_dead
        with pytest.raises(EngineDeadError, match="SIGKILL"):        # later calls fail at once
            client.add_request("late", [1, 2], params)
    finally:
        client.shutdown_sync()
    assert wait_gone(pids.values()) == []


def test_startup_failure_missing_model_dir_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match="no-such-model"):
        EngineClient(EngineConfig(model=str(missing))).start()


def test_startup_failure_in_executor_carries_the_original_error(tiny_model, tmp_path, no_leaks):
    """A corrupt weight file fails inside the executor; the caller gets its text within seconds."""
    source = tiny_model("LlamaForCausalLM")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((source / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    start = time.monotonic()
    with pytest.raises(EngineDeadError, match="executor rank 0 failed") as info:
        EngineClient(EngineConfig(model=str(broken))).start()
    assert time.monotonic() - start < 60
    assert "safetensors" in str(info.value).lower() or "header" in str(info.value).lower()


def test_startup_failure_kv_cache_too_small(tiny_model, no_leaks):
    path = tiny_model("Qwen2ForCausalLM")
    with pytest.raises(EngineDeadError, match="kv-cache-memory"):
        EngineClient(EngineConfig(model=str(path), kv_cache_memory=1024)).start()


def test_unsupported_architecture_is_refused_in_the_caller(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
    with pytest.raises(ConfigError, match="supported: LlamaForCausalLM"):
        EngineClient(EngineConfig(model=str(tmp_path))).start()


def test_twenty_start_stop_cycles_leak_nothing(no_leaks):
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    from engine import LLM

    LLM(load_format="fake").shutdown()               # imports and caches settle before counting
    before = fds()
    pids = []
    for i in range(20):
        llm = LLM(load_format="fake")
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=3, ignore_eos=True),
                           use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 3
        pids += list(llm.engine.pids.values())
        if i % 2:
            llm.shutdown()
        else:
            with llm:                                # the context manager path
                pass
    assert wait_gone(pids) == []
    assert fds() == before


def process_states(pids) -> str:
    """What a hung process is doing, for a failure message: its state and signal masks (/proc), and its
    Python stacks where py-spy is installed."""
    import shutil

    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                lines += [f"pid {pid}: " + "; ".join(
                    line.strip() for line in f if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk",
                                                                   "SigIgn", "SigCgt")))]
        except OSError:
            lines.append(f"pid {pid}: gone")
            continue
        if shutil.which("py-spy"):
            lines.append(subprocess.run(["py-spy", "dump", "--pid", str(pid)], capture_output=True,
                                        text=True).stdout)
    return "\n".join(lines)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_owner_stops_every_process(sig, no_leaks):
    # A program started as a background job of a non-interactive shell (`cmd &`, as CI scripts may run the
    # suite) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the owner here
    # takes Python's normal SIGINT handling explicitly, which is what this test is about.
    script = (
        "import json, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from engine import LLM\n"
        "llm = LLM(load_format='fake')\n"
        "print(json.dumps(llm.engine.pids), flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
    try:
        pids = json.loads(proc.stdout.readline())
        proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the owner did not exit within 20 s of {sig.name}:\n"
                        + process_states([proc.pid, *pids.values()]))
    finally:
        proc.kill()
    assert wait_gone(pids.values()) == []


def test_event_loop_closed_while_requests_still_stream(no_leaks, monkeypatch):
    """The asyncio face's loop finishes (asyncio.run returns) with a request still producing tokens: the
    output reader thread must stop quietly, and the engine must still shut down cleanly afterwards."""
    import threading

    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    client = EngineClient(EngineConfig(load_format="fake", max_model_len=2048)).start()
    params = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)

    async def scenario():
        stream = client.generate("left-behind", [1, 2, 3], params)
        await stream.__anext__()

    try:
        asyncio.run(scenario())
        reader = client._reader
        reader.join(timeout=5.0)                     # with or without more outputs, the reader notices
        assert not reader.is_alive()
    finally:
        client.shutdown_sync()
    assert thread_errors == []


def test_many_long_prompts_with_prefix_hits_start_together(no_leaks):
    """Hundreds of long prompts that are mostly prefix-cache hits would all fit one step's token budget;
    through the real processes with a small broadcast ring they all complete (spread over steps)."""
    from engine import LLM

    with LLM(load_format="fake", ring_bytes=1 << 20, max_model_len=2048, block_size=16) as llm:
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        prefix = [1 + i % 200 for i in range(2000)]
        llm.generate([{"prompt_token_ids": prefix}], params, use_tqdm=False)
        prompts = [{"prompt_token_ids": prefix + [i % 250, 1 + i // 250] * 4} for i in range(200)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2] * 200
    assert min(o.num_cached_tokens for o in outputs) >= 1984


def test_rings_too_small_for_max_model_len_are_refused():
    with pytest.raises(ConfigError, match=r"ring_bytes 65536 is too small for max_model_len 2048"):
        EngineConfig(load_format="fake", max_model_len=2048, ring_bytes=64 << 10).finalize()



def test_default_rings_grow_for_million_token_contexts(tiny_model):
    """A model whose context is longer than the default rings take gets larger rings, not an error; rings
    set explicitly too small for max_model_len are refused with the figure they would need."""
    path = tiny_model("LlamaForCausalLM", max_position_embeddings=2_000_000)
    config = EngineConfig(model=str(path))
    config.finalize()
    assert config.max_model_len == 2_000_000 and config.ring_bytes >= 4 * (4 * 2_000_000 + (64 << 10))
    assert config.ring_bytes % (1 << 20) == 0
    with pytest.raises(ConfigError, match=r"ring_bytes 8388608 is too small for max_model_len 2000000"):
        EngineConfig(model=str(path), ring_bytes=8 << 20).finalize()
