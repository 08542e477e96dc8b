"""What update_from_output reports: stop checks, finish reasons, aborts, first scheduling, runner checks."""

from __future__ import annotations

import pytest

from engine.messages import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_STOP,
    HANDLE,
    TOKEN,
    Logprobs,
    ModelRunnerOutput,
    RequestLogprobs,
    pack,
    unpack,
)
from tests.engine.fake_model import (
    EOS,
    add_request,
    finished,
    make_scheduler,
    new_tokens,
    run_engine_loop,
    step,
)


def run_scripted(script: list[int], prompt: int = 3, max_model_len: int = 256, **params):
    """One request whose sampled tokens follow `script`; returns (tokens, finish code, stop reason)."""
    scheduler, runner = make_scheduler(max_model_len=max_model_len, script={0: script})
    add_request(scheduler, 0, prompt, **params)
    result = run_engine_loop(scheduler, runner, max_steps=200)
    return result.tokens[0], result.finish_reasons[0], result.stop_reasons[0]


def test_eos_stops_with_no_stop_reason_and_is_streamed():
    assert run_scripted([5, 6, EOS, 7]) == ([5, 6, EOS], FINISH_STOP, None)


def test_ignore_eos_runs_to_max_tokens():
    expected = ([5, EOS, 6, EOS], FINISH_LENGTH, None)
    assert run_scripted([5, EOS, 6, EOS], max_tokens=4, ignore_eos=True) == expected


def test_stop_token_ids_stop_and_name_the_token():
    assert run_scripted([5, 9, 6], stop_token_ids=[9]) == ([5, 9], FINISH_STOP, 9)
    # ignore_eos does not silence explicit stop tokens
    assert run_scripted([5, 9, 6], stop_token_ids=[9], ignore_eos=True) == ([5, 9], FINISH_STOP, 9)


def test_no_stop_token_counts_before_min_tokens():
    # EOS and stop token 9 come too early to count; the second 9 is the fourth token and stops.
    expected = ([EOS, 9, 5, 9], FINISH_STOP, 9)
    assert run_scripted([EOS, 9, 5, 9, 6], min_tokens=3, stop_token_ids=[9]) == expected
    # The min_tokens-th token itself may stop the request.
    assert run_scripted([EOS, 9, EOS, 5], min_tokens=3) == ([EOS, 9, EOS], FINISH_STOP, None)


def test_max_tokens_ends_with_length():
    tokens, reason, stop = run_scripted([5] * 10, max_tokens=4)
    assert (tokens, reason, stop) == ([5] * 4, FINISH_LENGTH, None)


def test_a_stop_token_on_the_last_allowed_position_reports_stop():
    assert run_scripted([5, 6, EOS], max_tokens=3) == ([5, 6, EOS], FINISH_STOP, None)


def test_max_model_len_ends_with_length():
    tokens, reason, _ = run_scripted([5] * 20, prompt=10, max_model_len=16, max_tokens=None)
    assert (len(tokens), reason) == (6, FINISH_LENGTH)


def test_aborting_a_waiting_request_reports_it_without_running_it():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 4, 3)
    scheduler.abort_requests([4])
    assert scheduler.has_pending_outputs() and not scheduler.has_unfinished_requests()
    so, out = step(scheduler, runner)
    assert so.total_num_scheduled_tokens == 0 and so.new_reqs == []
    assert finished(out) == {4: (FINISH_ABORT, None)}
    assert not scheduler.has_pending_outputs()
    assert finished(step(scheduler, runner)[1]) == {}


def test_aborting_a_running_request_frees_its_blocks_and_tells_the_executors():
    scheduler, runner = make_scheduler(num_blocks=16)
    add_request(scheduler, 1, 9, max_tokens=20)
    add_request(scheduler, 2, 3, max_tokens=20)
    step(scheduler, runner)
    scheduler.abort_requests(pack([1, 99], HANDLE))      # 99 is unknown: ignored
    assert scheduler.num_free_blocks == 14
    so, out = step(scheduler, runner)
    assert unpack(so.finished_reqs, HANDLE).tolist() == [1]
    assert list(new_tokens(out)) == [2]
    assert finished(out) == {1: (FINISH_ABORT, None)}
    scheduler.abort_requests([1])                         # already finished: ignored
    assert not scheduler.has_pending_outputs()


def test_a_request_aborted_while_its_step_runs_streams_nothing_more():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 1, 3)
    add_request(scheduler, 2, 3)
    so = scheduler.schedule()
    ro = runner.execute_model(so)
    logprobs = Logprobs(token_ids=pack([1]), logprobs=pack([0.0], "<f4"), ranks=pack([1]), num_columns=1)
    ro.logprobs = [RequestLogprobs(req=1, logprobs=logprobs), RequestLogprobs(req=2, logprobs=logprobs)]
    scheduler.abort_requests([1])
    out = scheduler.update_from_output(so, ro)
    assert list(new_tokens(out)) == [2]
    assert [lp.req for lp in out.logprobs] == [2]
    assert finished(out) == {1: (FINISH_ABORT, None)}


def test_drops_ride_on_the_next_step_that_reaches_the_executors():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 1, 3, max_tokens=10)
    step(scheduler, runner)
    scheduler.abort_requests([1])
    empty, _ = step(scheduler, runner)                   # nothing to run: the engine loop skips executors
    assert empty.total_num_scheduled_tokens == 0 and empty.finished_reqs == b""
    add_request(scheduler, 2, 3)
    so, _ = step(scheduler, runner)                      # the fake executor insists the drop is known
    assert unpack(so.finished_reqs, HANDLE).tolist() == [1]


def test_first_scheduled_is_reported_once_with_the_cached_token_count():
    scheduler, runner = make_scheduler(num_blocks=7, block_size=4)
    add_request(scheduler, 0, 8, max_tokens=12, ignore_eos=True)
    add_request(scheduler, 1, 8, max_tokens=12, ignore_eos=True)
    reports = []
    while scheduler.has_unfinished_requests():
        _, out = step(scheduler, runner)
        reports += [(req, cached) for req, cached, _ in out.first_scheduled]
        assert all(t <= out.timestamp for _, _, t in out.first_scheduled)
    assert scheduler.num_preemptions >= 1                # request 1 was scheduled again, not reported again
    assert reports == [(0, 0), (1, 0)]


def test_a_runner_that_skips_a_sample_is_an_error_not_a_hang():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 1, 3)
    so = scheduler.schedule()
    silent = ModelRunnerOutput(step=so.step, reqs=b"", sampled_token_ids=b"", logprobs=[], prompt_logprobs=[])
    with pytest.raises(RuntimeError, match="sampled 0 tokens"):
        scheduler.update_from_output(so, silent)


def test_a_runner_output_of_another_step_is_refused():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 1, 3)
    so = scheduler.schedule()
    ro = runner.execute_model(so)
    ro.step += 1
    with pytest.raises(RuntimeError, match="step"):
        scheduler.update_from_output(so, ro)
    with pytest.raises(RuntimeError, match="no runner output"):
        scheduler.update_from_output(so, None)


def test_request_timestamps_are_recorded():
    scheduler, runner = make_scheduler()
    add_request(scheduler, 1, 3, max_tokens=3)
    request = scheduler.requests[1]
    step(scheduler, runner)
    first = request.first_token_ts
    assert request.queued_ts <= request.scheduled_ts <= first
    step(scheduler, runner)
    assert request.first_token_ts == first < request.last_token_ts
    assert unpack(pack(request.output_token_ids), TOKEN).size == 2
