"""The CUDA-graph input staging (review F9, F10), on CPU tensors: the block-table rows go from the
persistent table straight into staging rows of full width and reach the static buffer in one contiguous
copy; padding rows are harmless; and a step never rewrites the staging before the previous step's copies
are known complete (the event recorded after them is waited on first)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.executor.graph_staging import GraphInputStaging
from engine.executor.input_batch import StepInputs

MAX_SIZE, MAX_BLOCKS = 8, 6


def _decode_step(rows: list[int], table: np.ndarray, step: int) -> StepInputs:
    n = len(rows)
    return StepInputs(
        input_ids=np.arange(n, dtype=np.int64) + 100 * step, positions=np.arange(n, dtype=np.int64) + 10,
        slot_mapping=np.arange(n, dtype=np.int64) + 1000 * step, query_start_loc=np.arange(n + 1, dtype=np.int32),
        seq_lens=np.full(n, 11 + step, dtype=np.int32), rows=np.array(rows, dtype=np.int64), block_table=table,
        block_size=16, max_query_len=1, max_seq_len=11 + step, logits_indices=np.arange(n),
        sample_rows=np.array(rows, dtype=np.int64), sample_reqs=np.arange(n), prompt_logprobs=[],
    )


def _static() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(MAX_SIZE, dtype=torch.int64), "positions": torch.zeros(MAX_SIZE, dtype=torch.int64),
            "slot_mapping": torch.zeros(MAX_SIZE, dtype=torch.int64), "seq_lens": torch.zeros(MAX_SIZE, dtype=torch.int32),
            "block_tables": torch.full((MAX_SIZE, MAX_BLOCKS), 99, dtype=torch.int32)}


def test_rows_are_gathered_from_the_persistent_table_and_padded():
    table = np.arange(10 * MAX_BLOCKS, dtype=np.int32).reshape(10, MAX_BLOCKS)
    staging = GraphInputStaging(MAX_SIZE, MAX_BLOCKS, pin=False)
    static = _static()
    inputs = _decode_step([7, 2, 5], table, step=1)
    staging.fill(inputs, size=4)
    staging.copy_to(static, size=4)
    assert torch.equal(static["block_tables"][:3], torch.from_numpy(table[[7, 2, 5]]))
    assert static["block_tables"][3, 0] == 0                   # padding row: the null block
    assert torch.equal(static["block_tables"][4:], torch.full((4, MAX_BLOCKS), 99, dtype=torch.int32))  # untouched
    assert static["slot_mapping"][3] == -1 and static["seq_lens"][3] == 1
    assert static["input_ids"][:3].tolist() == [100, 101, 102]
    # the eager path's copy agrees with what the graph path staged, column for column
    width = inputs.block_tables.shape[1]
    assert np.array_equal(inputs.block_tables, static["block_tables"][:3, :width].numpy())
    assert all(t.is_contiguous() for t in staging.host.values())


def test_a_table_of_another_width_is_refused():
    staging = GraphInputStaging(MAX_SIZE, MAX_BLOCKS, pin=False)
    with pytest.raises(ValueError, match="width"):
        staging.fill(_decode_step([0], np.zeros((4, MAX_BLOCKS + 1), dtype=np.int32), step=0), size=1)


def test_staging_is_rewritten_only_after_the_previous_copies_completed():
    log: list[tuple[str, int]] = []
    staging = None

    class Event:
        def record(self):
            log.append(("record", int(staging.host["input_ids"][0])))

        def synchronize(self):
            # the staging must still hold what the copies recorded against were reading
            log.append(("wait", int(staging.host["input_ids"][0])))

    staging = GraphInputStaging(MAX_SIZE, MAX_BLOCKS, pin=False, make_event=Event)
    table = np.zeros((4, MAX_BLOCKS), dtype=np.int32)
    static = _static()
    for step in (1, 2, 3):
        staging.fill(_decode_step([0, 1], table, step), size=2)
        staging.copy_to(static, size=2)
    assert log == [("record", 100), ("wait", 100), ("record", 200), ("wait", 200), ("record", 300)]


def test_a_verify_step_is_staged_as_one_decode_row_per_query_token():
    """Requests at rows 3 (its last token + 2 drafts, 12 tokens cached once written) and 1 (one token, 7):
    each query token gets its request's table row and sees the cache up to itself."""
    table = np.arange(10 * MAX_BLOCKS, dtype=np.int32).reshape(10, MAX_BLOCKS)
    inputs = StepInputs(
        input_ids=np.array([5, 6, 7, 8]), positions=np.array([9, 10, 11, 6]), slot_mapping=np.array([9, 10, 11, 70]),
        query_start_loc=np.array([0, 3, 4], dtype=np.int32), seq_lens=np.array([12, 7], dtype=np.int32),
        rows=np.array([3, 1]), block_table=table, block_size=16, max_query_len=3, max_seq_len=12,
        logits_indices=np.arange(4), sample_rows=np.array([3, 3, 3, 1]), sample_reqs=np.array([0, 0, 0, 1]),
        prompt_logprobs=[], sample_offsets=np.array([0, 1, 2, 0]),
    )
    staging = GraphInputStaging(MAX_SIZE, MAX_BLOCKS, pin=False)
    static = _static()
    staging.fill(inputs, size=8)
    staging.copy_to(static, size=8)
    assert static["seq_lens"][:5].tolist() == [10, 11, 12, 7, 1]        # the fifth: padding
    assert torch.equal(static["block_tables"][:4], torch.from_numpy(table[[3, 3, 3, 1]]))
    assert static["input_ids"][:4].tolist() == [5, 6, 7, 8] and static["slot_mapping"][4] == -1
