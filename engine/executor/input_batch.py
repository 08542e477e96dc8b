"""The executor's persistent batch: per-request state kept across steps, updated from SchedulerOutput diffs.

Each request the executor knows occupies a row of preallocated numpy arrays (its token ids, its block
table). A step's inputs (input ids, positions, cache slots, query offsets, sequence lengths, block tables,
which rows sample) are gathered from those rows with a handful of vectorised numpy operations, so the
per-step CPU cost grows with the number of scheduled requests, never with their lengths.

Speculative decoding: a request verifying d drafts has them written after its known tokens (they are not
known tokens: num_tokens stays) and samples at each of its 1 + d positions; the step's sampling rows list
it 1 + d times in a row, with `sample_offsets` 0..d. Afterwards append_accepted() keeps what was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.messages import HANDLE, TOKEN, DraftTokens, NewRequestData, SchedulerOutput, unpack
from engine.sample.speculative import accepted_lengths, runs


@dataclass
class PromptLogprobsPlan:
    """Prompt positions of one request whose logits this step yields, and the tokens they predict."""

    req: int
    token_indices: np.ndarray        # indices into the step's flattened tokens
    target_token_ids: np.ndarray     # the prompt tokens those positions predict
    first_position: int              # prompt position of the first target
    num_logprobs: int


@dataclass
class StepInputs:
    input_ids: np.ndarray            # int64 [T]
    positions: np.ndarray            # int64 [T]
    slot_mapping: np.ndarray         # int64 [T]
    query_start_loc: np.ndarray      # int32 [R + 1]
    seq_lens: np.ndarray             # int32 [R]
    rows: np.ndarray                 # int64 [R]: each request's row of the persistent batch
    block_table: np.ndarray          # int32 [max_reqs, max_blocks]: the persistent table itself (not a copy)
    block_size: int
    max_query_len: int
    max_seq_len: int
    logits_indices: np.ndarray       # int64 [S]: the token whose logits each sampling request needs
    sample_rows: np.ndarray          # int64 [S]: rows that sample this step
    sample_reqs: np.ndarray          # int64 [S]: their handles
    prompt_logprobs: list[PromptLogprobsPlan]
    sample_positions: np.ndarray | None = None   # int64 [S]: their positions in SchedulerOutput.reqs
    sample_offsets: np.ndarray | None = None     # int64 [S]: drafts before each row; None: no drafts
    num_sample_rows: np.ndarray | None = None    # int64 [sampling requests]: 1 + drafts; None: all 1
    prefill: bool = False            # some request computes prompt tokens (AttentionMetadata.prefill)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    def token_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(seq_lens, rows) with one entry per query token, so that a step with a few query tokens per
        request (a verify step) runs as a batch of decode rows: token i of a request with q query tokens and
        seq_len cached ones (its own included) sees seq_len - q + i + 1 of them. The keys and values of the
        whole step are written before any row attends, so a draft sees the drafts before it."""
        if self.max_query_len == 1:
            return self.seq_lens, self.rows
        counts = np.diff(self.query_start_loc).astype(np.int64)
        owner, offset = runs(counts)
        return (self.seq_lens[owner] - counts[owner] + offset + 1).astype(np.int32), self.rows[owner]

    @property
    def block_tables(self) -> np.ndarray:
        """int32 [R, ceil(max_seq_len / block_size)]: the step's rows of the table, gathered (a copy) for
        the eager path; the CUDA-graph path gathers rows straight into its pinned staging instead."""
        return self.block_table[self.rows, : -(-self.max_seq_len // self.block_size)]


@dataclass
class Verified:
    """What a step with drafts keeps: per sampling request its handle and how many tokens (accepted drafts
    + 1), the kept tokens in order, and per sampling row whether it was kept and its offset."""

    reqs: np.ndarray                 # int64 [N]
    counts: np.ndarray               # int64 [N]
    tokens: np.ndarray               # [sum(counts)]
    keep: np.ndarray                 # bool [S]
    offsets: np.ndarray              # int64 [S]


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, max_blocks), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.prompt_logprobs: dict[int, int] = {}        # row -> k, while the prompt is being computed
        self.req_to_row: dict[int, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))   # pop() hands out the lowest row

    def __len__(self) -> int:
        return len(self.req_to_row)

    # ------------------------------------------------------------------ diffs
    def add(self, new: NewRequestData) -> int:
        if new.req in self.req_to_row:
            raise RuntimeError(f"request {new.req} added twice to the executor's batch")
        if not self._free_rows:
            raise RuntimeError("the executor's batch is full (more requests than max_num_seqs)")
        row = self._free_rows.pop()
        prompt = unpack(new.prompt_token_ids, TOKEN)
        output = unpack(new.output_token_ids, TOKEN)
        num_prompt, num_total = len(prompt), len(prompt) + len(output)
        self.token_ids[row, :num_prompt] = prompt
        self.token_ids[row, num_prompt:num_total] = output
        self.num_tokens[row] = num_total
        self.num_prompt_tokens[row] = num_prompt
        blocks = unpack(new.block_ids, TOKEN)
        self.block_table[row, : len(blocks)] = blocks
        self.num_blocks[row] = len(blocks)
        if new.params.prompt_logprobs is not None and not len(output):
            self.prompt_logprobs[row] = new.params.prompt_logprobs
        self.req_to_row[new.req] = row
        return row

    def remove(self, req: int) -> int | None:
        row = self.req_to_row.pop(req, None)
        if row is not None:
            self.prompt_logprobs.pop(row, None)
            self._free_rows.append(row)
        return row

    def append_blocks(self, req: int, block_ids: np.ndarray) -> None:
        row = self.req_to_row[req]
        start = self.num_blocks[row]
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def append_sampled(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        positions = self.num_tokens[rows]
        self.token_ids[rows, positions] = token_ids
        self.num_tokens[rows] = positions + 1

    def accept(self, inputs: StepInputs, sampled: np.ndarray) -> Verified:
        """After a step with drafts: keep each sampling request's accepted run of `sampled` (the tokens drawn
        at its 1 + d rows; engine/sample/speculative.py) and append it to its row."""
        num_rows = inputs.num_sample_rows
        # the draft each row is checked against is the next input token (at a run's last row: ignored)
        drafts = inputs.input_ids[np.minimum(inputs.logits_indices + 1, len(inputs.input_ids) - 1)]
        counts = accepted_lengths(sampled, drafts, num_rows)
        owner, offsets = runs(num_rows)
        keep = offsets < counts[owner]
        first = np.cumsum(num_rows) - num_rows
        rows, tokens = inputs.sample_rows[first], sampled[keep]
        kept_owner, step = runs(counts)
        self.token_ids[rows[kept_owner], self.num_tokens[rows][kept_owner] + step] = tokens
        self.num_tokens[rows] += counts
        return Verified(reqs=inputs.sample_reqs[first], counts=counts, tokens=tokens, keep=keep,
                        offsets=offsets)

    def rows_of(self, reqs: np.ndarray) -> np.ndarray:
        lookup = self.req_to_row
        return np.fromiter((lookup[r] for r in reqs.tolist()), dtype=np.int64, count=len(reqs))

    # ------------------------------------------------------------------ one step
    def prepare(self, so: SchedulerOutput) -> StepInputs:
        reqs = unpack(so.reqs, HANDLE)
        rows = self.rows_of(reqs)
        num_scheduled = unpack(so.num_scheduled_tokens, TOKEN).astype(np.int64)
        num_computed = unpack(so.num_computed_tokens, TOKEN).astype(np.int64)
        known = self.num_tokens[rows]
        num_drafts = None
        if so.drafts is not None:
            num_drafts = self._write_drafts(so.drafts, rows)
            known = known + num_drafts
        cu_tokens = np.cumsum(num_scheduled)
        max_query_len = int(num_scheduled.max())
        if max_query_len == 1:        # pure decode: one token per request
            positions = num_computed
            token_rows = rows
        else:
            owner, offsets = runs(num_scheduled)
            positions = num_computed[owner] + offsets
            token_rows = rows[owner]
        seq_lens = num_computed + num_scheduled
        if (seq_lens > known).any():
            bad = int(np.argmax(seq_lens > known))
            raise RuntimeError(
                f"request {int(reqs[bad])} was scheduled up to token {int(seq_lens[bad])} but the "
                f"executor knows only {int(known[bad])} of its tokens (drafts included)"
            )
        bs = self.block_size
        input_ids = self.token_ids[token_rows, positions].astype(np.int64)
        slot_mapping = self.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        max_seq_len = int(seq_lens.max())
        query_start_loc = np.zeros(len(rows) + 1, dtype=np.int32)
        query_start_loc[1:] = cu_tokens
        samples = seq_lens >= known
        prefill = bool((num_computed < self.num_prompt_tokens[rows]).any())
        plans = self._prompt_logprob_plans(reqs, rows, num_computed, num_scheduled, cu_tokens) \
            if self.prompt_logprobs else []
        if num_drafts is not None:
            return self._verify_inputs(StepInputs(
                input_ids=input_ids, positions=positions, slot_mapping=slot_mapping,
                query_start_loc=query_start_loc, seq_lens=seq_lens.astype(np.int32), rows=rows,
                block_table=self.block_table, block_size=bs, max_query_len=max_query_len, max_seq_len=max_seq_len,
                logits_indices=cu_tokens, sample_rows=rows, sample_reqs=reqs, prompt_logprobs=plans,
                prefill=prefill,
            ), samples, num_drafts)
        return StepInputs(
            input_ids=input_ids,
            positions=positions,
            slot_mapping=slot_mapping,
            query_start_loc=query_start_loc,
            seq_lens=seq_lens.astype(np.int32),
            rows=rows,
            block_table=self.block_table,
            block_size=bs,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            logits_indices=cu_tokens[samples] - 1,
            sample_rows=rows[samples],
            sample_reqs=reqs[samples],
            prompt_logprobs=plans,
            sample_positions=np.flatnonzero(samples),
            prefill=prefill,
        )

    def truncate_blocks(self, req: int, num_kept: int) -> None:
        """The scheduler freed the request's blocks past num_kept (they held only rejected drafts)."""
        row = self.req_to_row[req]
        if num_kept > self.num_blocks[row]:
            raise RuntimeError(f"request {req}: cut to {num_kept} blocks, but its table has {self.num_blocks[row]}")
        self.num_blocks[row] = num_kept

    def _write_drafts(self, drafts: DraftTokens, rows: np.ndarray) -> np.ndarray:
        """Put each drafting request's drafts after its known tokens; returns drafts per scheduled request."""
        positions = unpack(drafts.positions, TOKEN).astype(np.int64)
        counts = unpack(drafts.counts, TOKEN).astype(np.int64)
        tokens = unpack(drafts.token_ids, TOKEN)
        num_drafts = np.zeros(len(rows), dtype=np.int64)
        num_drafts[positions] = counts
        owner, step = runs(counts)
        draft_rows = rows[positions[owner]]
        columns = self.num_tokens[draft_rows] + step
        if len(columns) and columns.max() >= self.max_model_len:
            raise RuntimeError("draft tokens reach past max_model_len")
        self.token_ids[draft_rows, columns] = tokens
        return num_drafts

    @staticmethod
    def _verify_inputs(inputs: StepInputs, samples: np.ndarray, num_drafts: np.ndarray) -> StepInputs:
        """The sampling rows of a step with drafts: a request that samples does so at its last 1 + d tokens
        (inputs.logits_indices holds the cumulative token counts, sample_rows/reqs the step's rows/reqs)."""
        cu_tokens = inputs.logits_indices
        spans = np.where(samples, 1 + num_drafts, 0)
        owner, offsets = runs(spans)
        inputs.logits_indices = cu_tokens[owner] - spans[owner] + offsets
        inputs.sample_rows = inputs.sample_rows[owner]
        inputs.sample_reqs = inputs.sample_reqs[owner]
        inputs.sample_positions = owner
        inputs.sample_offsets = offsets
        inputs.num_sample_rows = spans[samples]
        return inputs

    def _prompt_logprob_plans(self, reqs, rows, num_computed, num_scheduled, cu_tokens):
        plans = []
        for i in np.flatnonzero(np.isin(rows, list(self.prompt_logprobs))).tolist():
            row = int(rows[i])
            start = int(num_computed[i])
            end = min(start + int(num_scheduled[i]), int(self.num_prompt_tokens[row]) - 1)
            if end <= start:
                continue
            first_token = int(cu_tokens[i] - num_scheduled[i])
            plans.append(PromptLogprobsPlan(
                req=int(reqs[i]),
                token_indices=np.arange(first_token, first_token + end - start),
                target_token_ids=self.token_ids[row, start + 1 : end + 1].astype(np.int64),
                first_position=start + 1,
                num_logprobs=self.prompt_logprobs[row],
            ))
            if end >= self.num_prompt_tokens[row] - 1:
                del self.prompt_logprobs[row]
        return plans
