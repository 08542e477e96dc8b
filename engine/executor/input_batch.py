"""The executor's persistent batch: per-request state kept across steps, updated from SchedulerOutput diffs.

Each request the executor knows occupies a row of preallocated numpy arrays (its token ids, its block
table). A step's inputs (input ids, positions, cache slots, query offsets, sequence lengths, block tables,
which rows sample) are gathered from those rows with a handful of vectorised numpy operations, so the
per-step CPU cost grows with the number of scheduled requests, never with their lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.messages import HANDLE, TOKEN, NewRequestData, SchedulerOutput, unpack


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

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens)

    @property
    def block_tables(self) -> np.ndarray:
        """int32 [R, ceil(max_seq_len / block_size)]: the step's rows of the table, gathered (a copy) for
        the eager path; the CUDA-graph path gathers rows straight into its pinned staging instead."""
        return self.block_table[self.rows, : -(-self.max_seq_len // self.block_size)]


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

    def rows_of(self, reqs: np.ndarray) -> np.ndarray:
        lookup = self.req_to_row
        return np.fromiter((lookup[r] for r in reqs.tolist()), dtype=np.int64, count=len(reqs))

    # ------------------------------------------------------------------ one step
    def prepare(self, so: SchedulerOutput) -> StepInputs:
        reqs = unpack(so.reqs, HANDLE)
        rows = self.rows_of(reqs)
        num_scheduled = unpack(so.num_scheduled_tokens, TOKEN).astype(np.int64)
        num_computed = unpack(so.num_computed_tokens, TOKEN).astype(np.int64)
        cu_tokens = np.cumsum(num_scheduled)
        max_query_len = int(num_scheduled.max())
        if max_query_len == 1:        # pure decode: one token per request
            positions = num_computed
            token_rows = rows
        else:
            total = int(cu_tokens[-1])
            owner = np.repeat(np.arange(len(rows)), num_scheduled)
            offsets = np.arange(total) - np.repeat(cu_tokens - num_scheduled, num_scheduled)
            positions = num_computed[owner] + offsets
            token_rows = rows[owner]
        seq_lens = num_computed + num_scheduled
        if (seq_lens > self.num_tokens[rows]).any():
            bad = int(np.argmax(seq_lens > self.num_tokens[rows]))
            raise RuntimeError(
                f"request {int(reqs[bad])} was scheduled up to token {int(seq_lens[bad])} but the "
                f"executor knows only {int(self.num_tokens[rows[bad]])} of its tokens"
            )
        bs = self.block_size
        input_ids = self.token_ids[token_rows, positions].astype(np.int64)
        slot_mapping = self.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        max_seq_len = int(seq_lens.max())
        query_start_loc = np.zeros(len(rows) + 1, dtype=np.int32)
        query_start_loc[1:] = cu_tokens
        samples = seq_lens >= self.num_tokens[rows]
        plans = self._prompt_logprob_plans(reqs, rows, num_computed, num_scheduled, cu_tokens) \
            if self.prompt_logprobs else []
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
        )

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
