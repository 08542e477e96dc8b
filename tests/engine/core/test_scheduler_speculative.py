"""Speculative decoding in the scheduler, against the fingerprinting fake executor (tests/engine/fake_model.py):
drafts are budgeted and given KV slots, rejected drafts are undone (computed tokens, blocks, executor tables),
stops inside an accepted run drop what follows, and no block leaks through rejections, preemption or aborts."""

from __future__ import annotations

import pytest

from engine.config import parse_speculative_config
from engine.core.request import Request
from engine.core.speculator import Speculator
from engine.messages import TOKEN, unpack
from engine.sampling_params import SamplingParams
from tests.engine.fake_model import (
    EOS,
    add_request,
    check_block_accounting,
    make_scheduler,
    new_token_runs,
    run_engine_loop,
    scheduled,
    step,
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1,
         "disable_by_batch_size": None}


def cycling_prompt(length: int = 12) -> list[int]:
    """Tokens that follow the fake's next_token="last" rule (t -> 7t + 13 mod 64), so drafts match."""
    tokens = [5]
    while len(tokens) < length:
        tokens.append((tokens[-1] * 7 + 13) % 64)
    return tokens


def reference_tokens(prompts: dict[int, list[int]], max_tokens: int, **config) -> dict[int, list[int]]:
    scheduler, runner = make_scheduler(next_token="last", **config)
    for req, prompt in prompts.items():
        add_request(scheduler, req, prompt, max_tokens=max_tokens, ignore_eos=True)
    return run_engine_loop(scheduler, runner).tokens


def test_drafts_are_budgeted_allocated_and_verified():
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM)
    add_request(scheduler, 0, cycling_prompt(20), max_tokens=30, ignore_eos=True)
    step(scheduler, runner)                                   # prefill: no drafts yet
    so, out = step(scheduler, runner)
    drafts = unpack(so.drafts.token_ids, TOKEN).tolist()
    assert len(drafts) == 4 and scheduled(so) == {0: 5}       # the last token + 4 drafts
    assert so.total_num_scheduled_tokens == 5
    request = scheduler.requests[0]
    assert len(request.blocks) * 4 >= request.num_computed_tokens + 1     # slots for every draft
    assert new_token_runs(out) == {0: drafts + [(drafts[-1] * 7 + 13) % 64]}   # all accepted, plus a bonus
    assert request.num_computed_tokens == len(request.all_token_ids) - 1
    assert scheduler.speculator.num_accepted_tokens == 4


def test_outputs_equal_the_run_without_drafts_and_nothing_leaks():
    prompts = {0: cycling_prompt(), 1: [3, 9, 27, 17, 51, 25], 2: cycling_prompt(7)}
    expected = reference_tokens(prompts, max_tokens=40)
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM)
    for req, prompt in prompts.items():
        add_request(scheduler, req, prompt, max_tokens=40, ignore_eos=True)
    result = run_engine_loop(scheduler, runner, on_step=lambda so, out: check_block_accounting(scheduler))
    assert result.tokens == expected
    assert scheduler.speculator.num_drafts > 0
    assert scheduler.num_free_blocks == scheduler.kv_cache_manager.block_pool.num_blocks - 1


def test_rejected_drafts_are_undone_and_their_blocks_freed():
    """The script makes every draft wrong: each step keeps one token, the drafts' blocks go back and the
    executor's table is cut with the next step (the fake checks that its KV always holds the right tokens)."""
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM,
                                       script={0: [63, 62, 61, 60, 59, 58, 57, 56, 55, 54]})
    add_request(scheduler, 0, cycling_prompt(16), max_tokens=10, ignore_eos=True)
    cuts = []
    result = run_engine_loop(scheduler, runner, on_step=lambda so, out: (
        cuts.extend(so.truncated_block_tables), check_block_accounting(scheduler)))
    assert result.tokens[0] == [63, 62, 61, 60, 59, 58, 57, 56, 55, 54]
    assert cuts, "a rejected draft that crossed a block boundary gave its block back"
    assert scheduler.speculator.num_accepted_tokens == 0 < scheduler.speculator.num_draft_tokens


def test_a_stop_token_inside_an_accepted_run_drops_what_follows():
    prompt = cycling_prompt()
    stop = prompt[3]                     # the cycle comes back to it, inside an accepted draft run
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM)
    add_request(scheduler, 0, prompt, max_tokens=50, stop_token_ids=[stop])
    result = run_engine_loop(scheduler, runner)
    reference = reference_tokens({0: prompt}, max_tokens=50)[0]
    assert result.tokens[0] == reference[: reference.index(stop) + 1]
    assert result.stop_reasons[0] == stop
    assert scheduler.num_free_blocks == scheduler.kv_cache_manager.block_pool.num_blocks - 1


def test_drafts_never_pass_max_tokens_or_the_token_budget():
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM, max_num_batched_tokens=8)
    add_request(scheduler, 0, cycling_prompt(8), max_tokens=6, ignore_eos=True)
    for r in (1, 2):
        add_request(scheduler, r, cycling_prompt(8), max_tokens=6, ignore_eos=True)
    result = run_engine_loop(scheduler, runner, on_step=lambda so, out: (
        so.total_num_scheduled_tokens <= 8 or pytest.fail("over the token budget")))
    assert all(len(tokens) == 6 for tokens in result.tokens.values())


def test_preemption_and_aborts_with_drafts_leak_nothing():
    """A pool too small for everyone: requests with drafts get preempted and resumed, or aborted."""
    prompts = {r: cycling_prompt(10 + r) for r in range(5)}
    expected = reference_tokens(prompts, max_tokens=30, num_blocks=24)
    scheduler, runner = make_scheduler(num_blocks=24, next_token="last", speculative_config=NGRAM)
    for req, prompt in prompts.items():
        add_request(scheduler, req, prompt, max_tokens=30, ignore_eos=True)
    result = run_engine_loop(scheduler, runner, on_step=lambda so, out: check_block_accounting(scheduler))
    assert scheduler.num_preemptions > 0 and scheduler.speculator.num_drafts > 0
    assert result.tokens == expected
    assert scheduler.num_free_blocks == 23

    scheduler, runner = make_scheduler(num_blocks=24, next_token="last", speculative_config=NGRAM)
    for req, prompt in prompts.items():
        add_request(scheduler, req, prompt, max_tokens=30, ignore_eos=True)
    run_engine_loop(scheduler, runner, aborts={3: [0, 2], 6: [4]},
                    on_step=lambda so, out: check_block_accounting(scheduler))
    assert not scheduler.requests and scheduler.num_free_blocks == 23


def test_drafts_shorten_as_acceptance_falls_and_stop_for_a_doubling_stretch():
    """min_acceptance_rate 0.2, window 8: a new request drafts in full; rejections shorten its drafts to
    what its estimated acceptance pays for, then pause it; after the pause one probe draft; a probe that
    is accepted brings full drafts back, and a window's worth of drafting makes the next pause short."""
    speculator = Speculator(parse_speculative_config({**NGRAM, "acceptance_window": 8, "min_acceptance_rate": 0.2}))
    tokens = list(range(1, 11)) * 2                             # periodic: prompt lookup always has a draft
    request = Request(0, tokens, SamplingParams(max_tokens=500).resolved(), [EOS], max_model_len=1024)

    def grow(n: int) -> None:
        for _ in range(n):
            request.all_token_ids.append(request.all_token_ids[-10])

    def rejected_until_paused() -> list[int]:
        lengths = []
        while drafts := speculator.propose(request, 4):
            lengths.append(len(drafts))
            speculator.record(request, len(drafts), 0)
            grow(1)
        return lengths

    assert rejected_until_paused() == [4, 2, 1, 1, 1]
    assert speculator.paused(request)
    grow(7)                                                      # the first pause: the window, 8 tokens
    assert speculator.paused(request)
    grow(1)
    assert rejected_until_paused() == [1]                        # a probe, rejected: paused again at once
    grow(15)
    assert speculator.paused(request)                            # the second pause is twice as long
    grow(1)
    assert len(speculator.propose(request, 4)) == 1             # the probe, this time accepted
    speculator.record(request, 1, 1)
    lengths = []
    for _ in range(3):
        lengths.append(len(drafts := speculator.propose(request, 4)))
        speculator.record(request, len(drafts), len(drafts))
        grow(len(drafts) + 1)
    assert lengths == [2, 4, 4] and speculator._acceptance[0].pause == 8
    assert speculator.num_drafts == 10 and speculator.num_accepted_tokens == 11
    assert speculator.accepted_per_pos == [4, 3, 2, 2]


def test_a_batch_past_disable_by_batch_size_drafts_nothing():
    scheduler, runner = make_scheduler(next_token="last", speculative_config={**NGRAM, "disable_by_batch_size": 2})
    for req in range(3):
        add_request(scheduler, req, cycling_prompt(20), max_tokens=12 + 4 * req, ignore_eos=True)
    steps = []
    run_engine_loop(scheduler, runner, on_step=lambda so, out: steps.append((len(scheduled(so)), so.drafts)))
    assert all(drafts is None for n, drafts in steps if n > 2)
    assert any(drafts is not None for n, drafts in steps if n <= 2)      # once one finished


def test_async_scheduling_with_drafts_equals_the_serial_run():
    prompts = {0: cycling_prompt(), 1: [3, 9, 27, 17, 51, 25]}
    expected = reference_tokens(prompts, max_tokens=25)
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM, async_scheduling=True)
    for req, prompt in prompts.items():
        add_request(scheduler, req, prompt, max_tokens=25, ignore_eos=True)
    result = run_engine_loop(scheduler, runner, pipelined=True,
                             on_step=lambda so, out: check_block_accounting(scheduler))
    assert result.tokens == expected
    assert scheduler.speculator.num_drafts > 0


def test_eos_inside_an_accepted_run_respects_min_tokens():
    """The cycle passes EOS (0) as its 6th output token: under min_tokens=8 an accepted run goes through it,
    and the request stops at the next EOS."""
    prompt = cycling_prompt(16)
    reference = reference_tokens({0: prompt}, max_tokens=40)[0]
    assert reference[5] == EOS and reference[21] == EOS
    scheduler, runner = make_scheduler(next_token="last", speculative_config=NGRAM)
    add_request(scheduler, 0, prompt, max_tokens=40, min_tokens=8)
    result = run_engine_loop(scheduler, runner)
    assert result.tokens[0] == reference[:22]
    assert scheduler.speculator.num_accepted_tokens > 0
