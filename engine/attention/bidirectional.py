"""Bidirectional (encoder) attention over a packed batch: sequences back to back, no padding, no KV cache.

Every token attends to every token of its own sequence. torch's scaled_dot_product_attention takes
rectangular batches, so the step's sequences are grouped by length class (lengths within a factor of about
1.5): each group is gathered from the packed rows into a [B, L] batch, padded keys masked out, and scattered
back. Grouping bounds the padding that attention computes (a 10-token sentence never pays for a 256-token
one) while keeping the number of kernel calls per layer small; the linear layers never see padding at all.
The grouping is computed once per step (`EncoderMetadata.build`) and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Upper bounds of the length classes (a sequence joins the first class that holds it); beyond the last,
# classes grow by half each.
LENGTH_CLASSES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class AttentionGroup:
    """Sequences of one length class: gathered as a [batch, length] rectangle from the packed rows."""

    batch: int
    length: int
    gather: torch.Tensor            # int64 [batch * length]: packed row of each slot (padding: any row)
    key_mask: torch.Tensor | None   # bool [batch, 1, 1, length]: real keys; None without padding
    slots: torch.Tensor | None      # int64 [n]: the real slots among batch * length; None: all
    rows: torch.Tensor              # int64 [n]: their packed rows


@dataclass
class EncoderMetadata:
    seq_lens: torch.Tensor          # int64 [R]
    num_tokens: int
    groups: list[AttentionGroup]

    @classmethod
    def build(cls, seq_lens: np.ndarray, device: torch.device) -> EncoderMetadata:
        lens = np.asarray(seq_lens, dtype=np.int64)
        starts = np.cumsum(lens) - lens
        classes = np.searchsorted(_class_bounds(int(lens.max())), lens)
        groups = []
        for cls_id in np.unique(classes).tolist():
            members = np.flatnonzero(classes == cls_id)
            group_lens, group_starts = lens[members], starts[members]
            length = int(group_lens.max())
            offsets = np.arange(length)
            real = offsets[None, :] < group_lens[:, None]                          # [B, L]
            gather = np.where(real, group_starts[:, None] + offsets[None, :], group_starts[:, None])
            padded = not real.all()
            slots = np.flatnonzero(real.ravel()) if padded else None
            rows = gather.ravel()[slots] if padded else gather.ravel()
            groups.append(AttentionGroup(
                batch=len(members), length=length,
                gather=torch.from_numpy(gather.ravel()).to(device),
                key_mask=torch.from_numpy(real[:, None, None, :]).to(device) if padded else None,
                slots=torch.from_numpy(slots).to(device) if padded else None,
                rows=torch.from_numpy(rows).to(device),
            ))
        return cls(seq_lens=torch.from_numpy(lens).to(device), num_tokens=int(lens.sum()), groups=groups)


def _class_bounds(longest: int) -> np.ndarray:
    bounds = list(LENGTH_CLASSES)
    while bounds[-1] < longest:
        bounds.append(bounds[-1] * 3 // 2)
    return np.asarray(bounds)


def bidirectional_attention(qkv: torch.Tensor, num_heads: int, head_dim: int, metadata: EncoderMetadata,
                            scale: float) -> torch.Tensor:
    """qkv [T, 3 * num_heads * head_dim] (q, k, v side by side) -> attention output [T, num_heads * head_dim]."""
    width = num_heads * head_dim
    out = None
    for group in metadata.groups:
        # [B * L, 3 * width] -> three [B, H, L, D] views
        packed_order = len(metadata.groups) == 1 and group.slots is None     # equal lengths: no gather
        batch = qkv if packed_order else qkv.index_select(0, group.gather)
        batch = batch.view(group.batch, group.length, 3, num_heads, head_dim)
        q, k, v = (batch.select(2, i).transpose(1, 2) for i in range(3))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=group.key_mask, scale=scale)
        o = o.transpose(1, 2).reshape(group.batch * group.length, width)
        if packed_order:
            return o
        if group.slots is not None:
            o = o.index_select(0, group.slots)
        if out is None:
            out = torch.empty(metadata.num_tokens, width, dtype=o.dtype, device=o.device)
        out.index_copy_(0, group.rows, o)
    return out
