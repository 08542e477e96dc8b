"""Speculative decoding in the scheduler: which requests draft, how many tokens, and what came of it.

Where the proposals are made (DESIGN §5). The token history lives in two places, the scheduler's Request
(a list of ints) and each executor's persistent batch (a numpy row). Proposing here, in the scheduler:
- the scheduler knows a request's draft length when it budgets the step (max_num_batched_tokens) and
  allocates its KV slots, with no extra round trip and no placeholder slots to patch up afterwards;
- the ring traffic is the same either way: the drafts travel to the executors (4 bytes a token, in
  `SchedulerOutput.drafts`) and the accepted tokens come back as sampled tokens do, a few int32 each;
- the CPU budget favours it: the executors' time is the step's critical path and owns both cores through
  OpenMP; with tensor parallelism every rank would repeat the proposer on those same cores, and the
  suffix cache over finished requests would be kept once per rank. Here it runs once, O(1) per request and
  step (the proposers index each token once, lazily: engine/core/proposers.py), a few microseconds;
- structured outputs: the grammar matchers live here, so a draft is cut where the grammar refuses it and
  the mask of every draft position is filled before the step leaves (the matcher advanced over the draft,
  then rolled back), and the accepted tokens advance it afterwards.

When not to speculate:
- for the batch: while more than `disable_by_batch_size` requests run, no request drafts. On a CPU a verify
  step of B requests with k drafts multiplies B(k + 1) rows through every weight; once the batch makes the
  step compute-bound, those rows cost more than the accepted tokens save (measured: docs/performance.md);
- per request: each request keeps an estimate of the chance that a draft token is accepted once the drafts
  before it were (accepted over checked draft positions, decayed over `acceptance_window` positions, from
  an optimistic prior). Draft i yields a token with that chance to the power i, and costs a row of the
  verify step, about `min_acceptance_rate` of a decode step on the CPU (`ringserve bench spec-cost`), so a
  request drafts only the tokens whose chance stays at or above it, none when the estimate itself falls
  below. A request with no draft worth making pauses for a number of its own tokens that doubles each
  time (starting at the window) and then starts afresh from the prior: open-ended text stops paying for
  verification after a few short probes, while a request that later turns to copying (an agent quoting
  its context) gets to try again.
"""

from __future__ import annotations

import math

from engine.config import SpeculativeConfig
from engine.core.proposers import make_proposer
from engine.core.request import Request
from engine.messages import TOKEN, DraftTokens, Logprobs, RequestLogprobs, pack

MAX_PAUSE_TOKENS = 4096
# a new request's acceptance estimate: worth this many checked draft positions at this rate (it fades with
# the request's own), so it drafts in full at once and a few rejections shorten its drafts
PRIOR_POSITIONS = 2.0
PRIOR_RATE = 0.8


class _Acceptance:
    __slots__ = ("checked", "accepted", "paused_until", "pause", "since_pause")

    def __init__(self, pause: int) -> None:
        # draft positions verified (each draft up to the first rejection) and of them accepted, decayed
        self.checked = PRIOR_POSITIONS
        self.accepted = PRIOR_POSITIONS * PRIOR_RATE
        self.paused_until = 0          # the request's token count from which it may draft again
        self.pause = pause
        self.since_pause = 0           # positions checked since it last resumed


class Speculator:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.proposer = make_proposer(config)
        self.num_speculative_tokens = config.num_speculative_tokens
        self.disable_by_batch_size = config.disable_by_batch_size
        self.min_acceptance_rate = config.min_acceptance_rate
        self.window = config.acceptance_window
        self._acceptance: dict[int, _Acceptance] = {}
        # vLLM's spec_decode counters, cumulative
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * config.num_speculative_tokens

    def batch_allows(self, num_running: int) -> bool:
        limit = self.disable_by_batch_size
        return limit is None or num_running <= limit

    def paused(self, request: Request) -> bool:
        """Whether the request's low acceptance keeps it from drafting now."""
        state = self._acceptance.get(request.req)
        return state is not None and len(request.all_token_ids) < state.paused_until

    def propose(self, request: Request, limit: int) -> list[int]:
        """Draft tokens for a request whose every known token but the last is computed: at most `limit`
        (and num_speculative_tokens, and what its acceptance makes worth verifying), none while paused."""
        limit = min(limit, self.num_speculative_tokens)
        if limit <= 0 or self.paused(request):
            return []
        state = self._acceptance.get(request.req)
        if state is None:
            state = self._acceptance[request.req] = _Acceptance(self.window)
        worth = self.draft_length(state)
        if worth == 0:
            self._pause(request, state)
            return []
        drafts = self.proposer.propose(request.req, request.all_token_ids, min(limit, worth))
        grammar = request.grammar
        if drafts and grammar is not None and not grammar.terminated:
            drafts = drafts[:_grammar_prefix(grammar.matcher, drafts)]
        return drafts

    def draft_length(self, state: _Acceptance) -> int:
        """The most drafts whose chance to yield a token, rate ** i, stays >= min_acceptance_rate (at least
        one while the rate itself does; none below)."""
        rate, least = state.accepted / state.checked, self.min_acceptance_rate
        if rate < least:
            return 0
        if rate >= 1.0 or least == 0.0:
            return self.num_speculative_tokens
        return max(1, min(self.num_speculative_tokens, int(math.log(least) / math.log(rate))))

    def _pause(self, request: Request, state: _Acceptance) -> None:
        """No draft is worth it: none for a doubling stretch, then one probe draft (the estimate is set at
        the threshold: accepted, it climbs back; rejected, the next pause comes at once)."""
        state.paused_until = len(request.all_token_ids) + state.pause
        state.pause = min(2 * state.pause, MAX_PAUSE_TOKENS)
        state.checked, state.accepted = PRIOR_POSITIONS, PRIOR_POSITIONS * self.min_acceptance_rate
        state.since_pause = 0

    def record(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """A verified step of the request: num_accepted of its num_drafts drafts were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        for position in range(num_accepted):
            per_pos[position] += 1
        state = self._acceptance[request.req]
        checked = min(num_accepted + 1, num_drafts)      # positions after a rejection were never in question
        keep = max(0.0, 1.0 - checked / self.window)
        state.checked = state.checked * keep + checked
        state.accepted = state.accepted * keep + num_accepted
        state.since_pause += checked
        if state.since_pause >= self.window:            # a window's worth without a pause: pauses short again
            state.pause = self.window

    def finish(self, request: Request) -> None:
        self._acceptance.pop(request.req, None)
        self.proposer.finish(request.req, request.all_token_ids, request.num_prompt_tokens)


def _grammar_prefix(matcher, drafts: list[int]) -> int:
    """How many leading drafts the grammar takes, stopping before a token that would end it (the mask
    after the end cannot be filled; the model may still sample that token itself). The matcher is left
    as it was."""
    taken = 0
    for token in drafts:
        if not matcher.accept_token(token):
            break
        if matcher.is_terminated():
            matcher.rollback(1)
            break
        taken += 1
    if taken:
        matcher.rollback(taken)
    return taken


def draft_tokens(drafted: list[Request], handles: list[int]) -> DraftTokens | None:
    """The step's DraftTokens, from the requests still scheduled with drafts (in batch order)."""
    drafted = [request for request in drafted if request.spec_token_ids]
    if not drafted:
        return None
    position = {handle: i for i, handle in enumerate(handles)}
    return DraftTokens(
        positions=pack([position[request.req] for request in drafted], TOKEN),
        counts=pack([len(request.spec_token_ids) for request in drafted], TOKEN),
        token_ids=pack([token for request in drafted for token in request.spec_token_ids], TOKEN),
    )


def first_rows(entry: RequestLogprobs, rows: int) -> RequestLogprobs:
    """The logprobs of a request's first `rows` tokens (those a stop inside an accepted run left)."""
    lp = entry.logprobs
    if len(lp.ranks) == 4 * rows:
        return entry
    width = 4 * rows * lp.num_columns
    return RequestLogprobs(req=entry.req, logprobs=Logprobs(token_ids=lp.token_ids[:width],
                                                             logprobs=lp.logprobs[:width],
                                                             ranks=lp.ranks[:4 * rows], num_columns=lp.num_columns))
