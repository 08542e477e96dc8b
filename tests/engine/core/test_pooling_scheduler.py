"""Scheduling pooling requests: whole prompts for encoders, chunked prefill and prefix caching for decoders,
one vector per finished request, and the refusals that keep generation and pooling apart."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.core.pooling_scheduler import EncoderScheduler, PoolingScheduler, make_scheduler
from engine.core.scheduler import Scheduler
from engine.messages import (
    FINISH_ABORT,
    FINISH_STOP,
    FLOAT,
    HANDLE,
    TOKEN,
    AddRequest,
    ModelRunnerOutput,
    SchedulerOutput,
    pack,
    unpack,
)
from engine.sampling_params import PoolingParams, SamplingParams
from tests.engine.pooling_models import tiny_encoder_fixture  # noqa: F401  (pytest fixture)

PLACEHOLDER = SamplingParams(max_tokens=1).resolved()


def pooling_add(req: int, length: int, pooling: PoolingParams | None = PoolingParams(normalize=True)) -> AddRequest:
    return AddRequest(req=req, prompt_token_ids=pack([5 + (req * 7 + i) % 50 for i in range(length)]),
                      params=PLACEHOLDER, eos_token_ids=[], arrival_time=float(req), pooling=pooling)


def fake_vectors(so: SchedulerOutput, prompt_lens: dict[int, int], dim: int) -> ModelRunnerOutput:
    """What a pooling runner returns: a vector (filled with the handle) for each request ending its prompt."""
    reqs = unpack(so.reqs, HANDLE)
    # a request ends its prompt when this step's tokens reach its length
    ends = unpack(so.num_computed_tokens, TOKEN) + unpack(so.num_scheduled_tokens, TOKEN)
    done = np.array([r for r, end in zip(reqs.tolist(), ends.tolist()) if end == prompt_lens[r]], dtype=np.int64)
    vectors = np.repeat(done.astype(np.float32)[:, None], dim, axis=1)
    return ModelRunnerOutput(step=so.step, reqs=done.tobytes(), sampled_token_ids=b"", logprobs=[],
                             prompt_logprobs=[], pooled=vectors.tobytes())


@pytest.fixture
def encoder_config(tiny_encoder) -> EngineConfig:
    return EngineConfig(model=str(tiny_encoder()), max_num_batched_tokens=64, max_num_seqs=3).finalize()


def test_the_runner_picks_the_scheduler(encoder_config):
    assert isinstance(make_scheduler(encoder_config, 2), EncoderScheduler)
    decoder = EngineConfig(runner="pooling").finalize()                  # the demo model, a Qwen3 decoder
    assert type(make_scheduler(decoder, 64)) is PoolingScheduler
    assert type(make_scheduler(EngineConfig().finalize(), 64)) is Scheduler


def test_an_encoder_step_packs_whole_prompts_within_the_budget(encoder_config):
    scheduler = make_scheduler(encoder_config, 2)
    lens = {0: 30, 1: 20, 2: 10, 3: 5, 4: 32}
    for req, n in lens.items():
        scheduler.add_request(pooling_add(req, n))
    first = scheduler.schedule()
    assert unpack(first.reqs, HANDLE).tolist() == [0, 1, 2]                 # max_num_seqs 3
    assert unpack(first.num_scheduled_tokens, TOKEN).tolist() == [30, 20, 10]
    assert [len(unpack(new.prompt_token_ids, TOKEN)) for new in first.new_reqs] == [30, 20, 10]
    assert unpack(first.num_computed_tokens, TOKEN).tolist() == [0, 0, 0] and first.new_block_ids == []
    out = scheduler.update_from_output(first, fake_vectors(first, lens, 64))
    assert unpack(out.finished_reqs, HANDLE).tolist() == [0, 1, 2]
    assert list(out.finish_reasons) == [FINISH_STOP] * 3
    assert unpack(out.pooled_reqs, HANDLE).tolist() == [0, 1, 2]
    np.testing.assert_array_equal(unpack(out.pooled, FLOAT).reshape(3, 64)[:, 0], [0, 1, 2])
    second = scheduler.schedule()                                          # 5 + 32 fits, 64 tokens budget
    assert unpack(second.reqs, HANDLE).tolist() == [3, 4] and second.finished_reqs == b""
    scheduler.update_from_output(second, fake_vectors(second, lens, 64))
    assert not scheduler.has_unfinished_requests() and scheduler.running == []


def test_a_request_aborted_while_its_step_runs_loses_its_vector(encoder_config):
    scheduler = make_scheduler(encoder_config, 2)
    lens = {0: 4, 1: 6}
    for req, n in lens.items():
        scheduler.add_request(pooling_add(req, n))
    so = scheduler.schedule()
    scheduler.abort_requests([0])
    out = scheduler.update_from_output(so, fake_vectors(so, lens, 64))
    assert dict(zip(unpack(out.finished_reqs, HANDLE).tolist(), out.finish_reasons)) == {0: FINISH_ABORT,
                                                                                         1: FINISH_STOP}
    assert unpack(out.pooled_reqs, HANDLE).tolist() == [1]
    np.testing.assert_array_equal(unpack(out.pooled, FLOAT), np.full(64, 1.0, dtype=np.float32))


def test_prompt_bounds_and_request_kinds(encoder_config):
    scheduler = make_scheduler(encoder_config, 2)
    scheduler.add_request(pooling_add(0, 32))                             # max_model_len itself: no output room needed
    with pytest.raises(ValueError, match="33 tokens, more than max_model_len"):
        scheduler.add_request(pooling_add(1, 33))
    with pytest.raises(ValueError, match="asks for generation, but this engine runs a pooling model"):
        scheduler.add_request(pooling_add(2, 4, pooling=None))
    generator = make_scheduler(EngineConfig().finalize(), 64)
    with pytest.raises(ValueError, match="asks for pooling.*generative model"):
        generator.add_request(pooling_add(3, 4))


def test_a_decoder_prompt_is_chunked_and_its_prefix_cached():
    config = EngineConfig(runner="pooling", max_num_batched_tokens=16, max_num_seqs=4, block_size=16).finalize()
    scheduler = make_scheduler(config, 64)
    lens = {0: 40, 1: 40}
    scheduler.add_request(pooling_add(0, 40))
    pooled_at = []
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        out = scheduler.update_from_output(so, fake_vectors(so, lens, config.hidden_size))
        pooled_at.append(unpack(out.pooled_reqs, HANDLE).tolist())
    assert pooled_at == [[], [], [0]]                                     # 16 + 16 + 8 tokens, a vector at the end
    again = pooling_add(1, 40)
    again.prompt_token_ids = pooling_add(0, 40).prompt_token_ids           # the same prompt: its blocks are cached
    scheduler.add_request(again)
    so = scheduler.schedule()
    assert unpack(so.num_computed_tokens, TOKEN).tolist() == [32]          # two full blocks hit; the rest computed
    out = scheduler.update_from_output(so, fake_vectors(so, lens, config.hidden_size))
    assert out.first_scheduled[0][:2] == (1, 32) and unpack(out.pooled_reqs, HANDLE).tolist() == [1]
    assert scheduler.kv_cache_manager.usage == 0.0                        # every block given back
