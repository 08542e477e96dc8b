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
- per request: each request's share of accepted draft tokens is taken over `acceptance_window` drafted
  tokens; below `min_acceptance_rate` it stops drafting for a number of its own tokens that doubles each
  time (starting at the window), so open-ended text stops paying for verification while a request that
  later turns to copying (an agent quoting its context) gets to try again.
"""

from __future__ import annotations

from engine.core.proposers import make_proposer
from engine.core.request import Request
from engine.messages import TOKEN, DraftTokens, Logprobs, RequestLogprobs, pack
from engine.speculative_config import SpeculativeConfig

MAX_PAUSE_TOKENS = 4096


class _Acceptance:
    __slots__ = ("drafted", "accepted", "paused_until", "pause")

    def __init__(self, pause: int) -> None:
        self.drafted = 0
        self.accepted = 0
        self.paused_until = 0          # the request's token count from which it may draft again
        self.pause = pause


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
        (and num_speculative_tokens), none while its acceptance has paused it."""
        limit = min(limit, self.num_speculative_tokens)
        if limit <= 0:
            return []
        if self.paused(request):
            return []
        drafts = self.proposer.propose(request.req, request.all_token_ids, limit)
        grammar = request.grammar
        if drafts and grammar is not None and not grammar.terminated:
            drafts = drafts[:_grammar_prefix(grammar.matcher, drafts)]
        return drafts

    def record(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """A verified step of the request: num_accepted of its num_drafts drafts were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        for position in range(num_accepted):
            per_pos[position] += 1
        state = self._acceptance.get(request.req)
        if state is None:
            state = self._acceptance[request.req] = _Acceptance(self.window)
        state.drafted += num_drafts
        state.accepted += num_accepted
        if state.drafted < self.window:
            return
        if state.accepted < self.min_acceptance_rate * state.drafted:
            state.paused_until = len(request.all_token_ids) + state.pause
            state.pause = min(2 * state.pause, MAX_PAUSE_TOKENS)
        else:
            state.pause = self.window
        state.drafted = state.accepted = 0

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
