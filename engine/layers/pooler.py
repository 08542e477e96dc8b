"""Pooling: one vector per sequence from the hidden states of a packed batch (sequences back to back).

MEAN averages every token of a sequence (sentence-transformers' mean pooling over an unpadded sequence),
CLS takes its first token, LAST its last. The sums run in float32 whatever the model's dtype. Normalization
is not done here: it is per request (PoolingParams.normalize) and applied by the client.
"""

from __future__ import annotations

import torch


def pool(hidden: torch.Tensor, seq_lens: torch.Tensor, pooling_type: str) -> torch.Tensor:
    """hidden [T, H] of sequences of seq_lens (int64 [R], summing to T) -> float32 [R, H]."""
    ends = torch.cumsum(seq_lens, 0)
    if pooling_type == "LAST":
        return hidden.index_select(0, ends - 1).float()
    if pooling_type == "CLS":
        return hidden.index_select(0, ends - seq_lens).float()
    if pooling_type == "MEAN":
        owner = torch.repeat_interleave(torch.arange(len(seq_lens), device=hidden.device), seq_lens)
        sums = torch.zeros(len(seq_lens), hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, owner, hidden.float())
        return sums / seq_lens.unsqueeze(1).to(torch.float32)
    raise ValueError(f"unknown pooling type {pooling_type!r} (MEAN, CLS or LAST)")
