"""Structured outputs in the executor: the scheduler's packed token bitmask applied to a step's logits.

The scheduler sends one packed int32 row per grammar-constrained sampling row (bit j of word i allows
token 32*i + j, xgrammar's layout). The mask is applied to the logits before the sampler, so the sampler's
logprobs see it (as vLLM's do): masked tokens get -inf. It runs eagerly after `compute_logits`, outside any
CUDA graph, so graph replay is unaffected.

`GrammarMask.apply` also keeps what the sampler needs for the empty-row rule: when allowed_token_ids,
min_tokens and logit_bias leave a constrained row with no finite logit, that row falls back to the
grammar-masked logits alone (the grammar wins; sampling an all -inf row would draw garbage).
"""

from __future__ import annotations

import numpy as np
import torch


def allowed_from_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [R, vocab_size] from packed int32 [R, W] (little-endian words; numpy's unpackbits is one C pass)."""
    words = np.ascontiguousarray(bitmask.cpu().numpy(), dtype="<i4")
    bits = np.unpackbits(words.view(np.uint8), axis=1, count=vocab_size, bitorder="little")
    return torch.from_numpy(bits.view(bool))


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits[rows[i]] keeps only the tokens bitmask[i] allows; the rest become -inf (in place).

    On CUDA this is xgrammar's kernel. On the CPU: unpack the bits once, then one masked fill per row in
    place (no gather/scatter of the rows). Measured on the 2-core dev box for 64 rows x 151,936: ~65 ms,
    against ~90 ms for xgrammar's CPU kernel and ~250 ms for a byte-table unpack in torch
    (`ringserve bench grammar`)."""
    if logits.device.type == "cuda":
        import xgrammar as xgr

        # xgrammar's kernel reads bitmask[indices[i]] for logits[indices[i]]: a batch-shaped mask, -1 elsewhere
        full = torch.full((logits.shape[0], bitmask.shape[1]), -1, dtype=torch.int32, device=logits.device)
        full[rows] = bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, full, vocab_size=logits.shape[1], indices=rows.tolist())
        return
    forbidden = allowed_from_bitmask(bitmask, logits.shape[1]).logical_not_()
    for i, row in enumerate(rows.tolist()):
        logits[row].masked_fill_(forbidden[i], float("-inf"))


class GrammarMask:
    """One step's grammar rows: applied to the logits, and kept for the sampler's empty-row fallback."""

    __slots__ = ("rows", "saved")

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows                    # int64 positions in the step's logits
        self.saved: torch.Tensor | None = None

    @classmethod
    def apply(cls, logits: torch.Tensor, bitmask: np.ndarray, rows: np.ndarray, *, keep: bool) -> GrammarMask:
        """Mask `logits` in place; keep a copy of the masked rows when a later processor may empty them."""
        mask = cls(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(logits.device))
        apply_bitmask(logits, torch.from_numpy(bitmask), mask.rows)
        if keep:
            mask.saved = logits.index_select(0, mask.rows).float()
        return mask

    def restore_empty_rows(self, logits: torch.Tensor) -> None:
        """After the logit processors: a grammar row with no finite logit left takes the grammar alone."""
        if self.saved is None:
            return
        empty = torch.isneginf(logits.index_select(0, self.rows).amax(-1))
        if bool(empty.any()):
            logits.index_copy_(0, self.rows[empty], self.saved[empty].to(logits.dtype))
