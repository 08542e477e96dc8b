"""Every message that crosses a process boundary (DESIGN §2), as msgspec Structs encoded as msgpack.

Channels and what travels on each:
  request ring   frontend  -> scheduler   RequestIn   = AddRequest | AbortRequests | ControlCall
  output ring    scheduler -> frontend    EngineOut   = EngineReady | EngineOutputs | ControlReply | EngineDead
  broadcast ring scheduler -> executors   ExecutorIn  = SchedulerOutput | ExecutorCall
  result rings   executor  -> scheduler   ExecutorOut = ExecutorReady | ModelRunnerOutput | ExecutorReply
                                                        | ExecutorFailed
                 (one ring per rank: every rank reports its handshake and its failure; only rank 0 sends
                 step results and replies)

Requests are named on every channel by an int64 handle that the client assigns (unique per engine
instance); the frontend keeps the map to the user's string ids. Arrays of ids, tokens and counts travel as
raw little-endian bytes (int64 handles, int32 tokens/counts/blocks, float32 logprobs), never as lists of
Python ints, so that encoding a 256-request step costs a few microseconds. Timestamps are
time.monotonic(), which is one clock for all processes of a machine.

SchedulerOutput is a diff (vLLM v1's scheme): a request's prompt, params and blocks travel once, in
`new_reqs`, when it is first scheduled (or scheduled again after preemption, with the tokens it had
produced); afterwards only the blocks it gains and its per-step counts travel. Requests that finish, are
aborted or preempted are named in `finished_reqs`, and the executors drop their state.
"""

from __future__ import annotations

import msgspec

from engine.outputs import FINISH_REASONS  # noqa: F401  (re-exported: the codes index it)
from engine.sampling_params import PoolingParams, SamplingParams
from shm.codec import FLOAT32, INT32, INT64, Codec, pack, unpack  # noqa: F401  (re-exported)

HANDLE = INT64     # request handles
TOKEN = INT32      # token ids, counts, positions, block ids
FLOAT = FLOAT32    # logprobs

# Finish reasons as they travel: uint8 codes, each an index into engine.outputs.FINISH_REASONS.
FINISH_STOP, FINISH_LENGTH, FINISH_ABORT, FINISH_ERROR = 0, 1, 2, 3


class _Msg(msgspec.Struct, array_like=True, omit_defaults=False, tag_field="k"):
    pass


# ----------------------------------------------------------------------------- frontend -> scheduler
class AddRequest(_Msg, tag="add"):
    req: int
    prompt_token_ids: bytes           # int32
    params: SamplingParams            # resolved (see SamplingParams.resolved), n == 1
    eos_token_ids: list[int]          # the model's EOS ids; not checked when params.ignore_eos
    arrival_time: float
    priority: int = 0                 # lower runs first under the priority policy (vLLM's convention)
    cache_salt: str | None = None
    pooling: PoolingParams | None = None   # a pooling request (an embedding): it ends after its prompt with a
                                           # vector, and `params` is a placeholder; only a pooling model takes it


class AbortRequests(_Msg, tag="abort"):
    reqs: bytes                       # int64 handles


class ControlCall(_Msg, tag="call"):
    call_id: int
    method: str                       # start_profile | stop_profile | reset_prefix_cache | sleep | wake_up |
                                      # shutdown
    args: dict[str, str | int | float | bool | None] = {}


RequestIn = AddRequest | AbortRequests | ControlCall


# ----------------------------------------------------------------------------- scheduler -> frontend
class EngineReady(_Msg, tag="ready"):
    num_blocks: int
    block_size: int
    max_model_len: int
    pids: dict[str, int]              # "scheduler", "executor0", ... -> pid
    weight_bytes: dict[str, int] = msgspec.field(default_factory=dict)   # by GGUF type or dtype, all ranks


class EngineLoading(_Msg, tag="loading"):
    """Startup progress, before EngineReady: the executors' weights (done of total checkpoint tensors),
    then the KV cache being sized and allocated (stage "kv_cache")."""
    stage: str                        # weights | kv_cache
    done: int = 0
    total: int = 0


class SchedulerStats(_Msg, tag="stats"):
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0       # fraction of blocks in use, 0..1
    prefix_cache_queries: int = 0     # cumulative tokens looked up
    prefix_cache_hits: int = 0        # cumulative tokens found
    num_preemptions: int = 0          # cumulative
    num_free_blocks: int = 0
    step: int = 0
    # speculative decoding, cumulative (vLLM's spec_decode_* counters): steps that verified drafts, draft
    # tokens verified, draft tokens accepted, and accepted tokens by draft position (index 0: first draft)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []


class Logprobs(_Msg, tag="lp"):
    """Logprobs of one or more positions: row i is [sampled/actual token, top-1 .. top-k]."""
    token_ids: bytes                  # int32 [rows, 1 + k]
    logprobs: bytes                   # float32 [rows, 1 + k]
    ranks: bytes                      # int32 [rows]: rank of the first column's token (1 = most likely)
    num_columns: int                  # 1 + k


class RequestLogprobs(_Msg, tag="rlp"):
    req: int
    logprobs: Logprobs
    first_position: int = 0           # for prompt logprobs: the prompt position of the first row


class EngineOutputs(_Msg, tag="out"):
    """One scheduler step's news for the frontend. A request that produced several tokens in the step
    (speculative decoding) appears once per token in `reqs`, its tokens in order."""
    reqs: bytes                       # int64: requests that produced a token this step
    new_token_ids: bytes              # int32, parallel to reqs
    finished_reqs: bytes              # int64: requests that finished this step (incl. aborted)
    finish_reasons: bytes             # uint8 FINISH_* codes, parallel to finished_reqs
    stop_reasons: list[int | None]    # the stop token id that ended a request, parallel to finished_reqs
    first_scheduled: list[tuple[int, int, float]]   # (req, num_cached_tokens, time) on first schedule
    logprobs: list[RequestLogprobs]
    prompt_logprobs: list[RequestLogprobs]
    timestamp: float
    stats: SchedulerStats
    errors: list[tuple[int, str]] = []   # (req, message) for each FINISH_ERROR in finished_reqs
    pooled_reqs: bytes = b""          # int64: pooling requests that finished this step with a vector
    pooled: bytes = b""               # float32 [len(pooled_reqs), hidden_size], parallel to pooled_reqs


class ControlReply(_Msg, tag="reply"):
    call_id: int
    ok: bool
    result: str = ""


class EngineDead(_Msg, tag="dead"):
    message: str                      # which process died and how, or what failed at startup


EngineOut = EngineReady | EngineLoading | EngineOutputs | ControlReply | EngineDead


# ----------------------------------------------------------------------------- scheduler -> executors
class NewRequestData(_Msg, tag="new"):
    req: int
    prompt_token_ids: bytes           # int32
    output_token_ids: bytes           # int32; non-empty when resumed after preemption
    params: SamplingParams            # resolved
    eos_token_ids: list[int]          # masked while fewer than min_tokens were produced
    block_ids: bytes                  # int32, the whole block table so far
    num_computed_tokens: int          # tokens already in the KV cache (prefix-cache hits)


class GrammarRows(msgspec.Struct, array_like=True):
    """Token masks for the scheduled requests that sample this step under a grammar; every other row
    samples unmasked. Row r of `bitmask` belongs to so.reqs[positions[r]]; bit j of word i allows token
    32*i + j (engine.structured_spec.words_per_row words a row). A request verifying d drafts samples at
    1 + d rows: its position repeats 1 + d times, the masks in the order of its rows."""
    positions: bytes                  # int32 [R], indices into SchedulerOutput.reqs, non-decreasing
    bitmask: bytes                    # int32 little-endian [R, W]


class DraftTokens(msgspec.Struct, array_like=True):
    """Speculative decoding: the draft tokens this step verifies. Request so.reqs[positions[i]] has
    counts[i] drafts, the next counts[i] entries of token_ids; it is scheduled for 1 + counts[i] tokens
    (its last known token, then the drafts) and samples at each of them."""
    positions: bytes                  # int32 [D], indices into SchedulerOutput.reqs, ascending
    counts: bytes                     # int32 [D], each >= 1
    token_ids: bytes                  # int32 [sum(counts)]


class SchedulerOutput(_Msg, tag="step"):
    step: int
    new_reqs: list[NewRequestData]
    reqs: bytes                       # int64: every scheduled request, in the order of the batch
    num_scheduled_tokens: bytes       # int32, parallel to reqs
    num_computed_tokens: bytes        # int32, parallel to reqs: tokens in the KV cache before this step
    new_block_ids: list[tuple[int, bytes]]   # (req, int32 block ids appended to its table)
    finished_reqs: bytes              # int64: drop these (finished, aborted or preempted)
    total_num_scheduled_tokens: int
    grammar: GrammarRows | None = None   # structured outputs: the token masks of this step's rows
    drafts: DraftTokens | None = None    # speculative decoding: the drafts this step verifies
    # (req, blocks kept): block tables cut back after rejected drafts, applied before new_block_ids
    truncated_block_tables: list[tuple[int, int]] = []


class ExecutorCall(_Msg, tag="call"):
    call_id: int
    method: str                       # initialize | start_profile | stop_profile | sleep | wake_up | shutdown
    args: dict[str, str | int | float | bool | None] = {}


ExecutorIn = SchedulerOutput | ExecutorCall


# ----------------------------------------------------------------------------- executor -> scheduler
class ExecutorReady(_Msg, tag="ready"):
    rank: int
    num_blocks: int
    pid: int
    weight_bytes: dict[str, int] = msgspec.field(default_factory=dict)   # this rank's, by type (the startup line)


class ExecutorLoading(_Msg, tag="loading"):
    """Rank 0's weight-loading progress during startup (forwarded to the frontend as EngineLoading)."""
    rank: int
    done: int
    total: int


class ModelRunnerOutput(_Msg, tag="result"):
    step: int
    reqs: bytes                       # int64: requests that sampled a token (prefill chunks that end
                                      # before the prompt's end sample nothing)
    sampled_token_ids: bytes          # int32, parallel to reqs (or to num_sampled's counts, flattened; empty
                                      # for a pooling model)
    logprobs: list[RequestLogprobs]
    prompt_logprobs: list[RequestLogprobs]
    # speculative decoding: int32 per req, how many tokens it produced (accepted drafts + 1); empty: one each
    num_sampled: bytes = b""
    pooled: bytes = b""               # a pooling model: float32 [len(reqs), hidden_size], one vector per
                                      # request that reached the end of its prompt


class ExecutorReply(_Msg, tag="reply"):
    call_id: int
    ok: bool
    result: str = ""


class ExecutorFailed(_Msg, tag="failed"):
    rank: int
    message: str                      # the original error text (last lines of the traceback)


ExecutorOut = ExecutorReady | ExecutorLoading | ModelRunnerOutput | ExecutorReply | ExecutorFailed
