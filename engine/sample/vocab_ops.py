"""Row-wise operations over a large vocabulary, done in two levels to spare memory passes.

A step's logits are [S, V] with V ~ 150k: at S = 256 that is 155 MB, and on a CPU every full pass over it
costs milliseconds. The vocabulary is cut into blocks of BLOCK tokens; one cheap vectorised pass gives each
block's maximum (or sum), and the exact answer is then found inside a few gathered blocks:

- argmax: the first maximum lies in the first block whose maximum is the row maximum;
- top-k: the k largest values lie in the k blocks with the largest maxima;
- sampling by inverse CDF: pick the block by the cumulative block sums, then the token inside it,
  with one uniform number per row instead of V random numbers.

Scratch buffers are kept between calls (`Workspace`): a fresh 155 MB allocation costs more in page faults
than the arithmetic done in it.
"""

from __future__ import annotations

import torch

BLOCK = 128


class Workspace:
    """A growable float32 buffer handed out as [rows, cols] views (contents are garbage)."""

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None

    def take(self, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        size = rows * cols
        buffer = self._buffer
        if buffer is None or buffer.numel() < size or buffer.device != device:
            buffer = self._buffer = torch.empty(size, dtype=torch.float32, device=device)
        return buffer[:size].view(rows, cols)


def block_reduce(x: torch.Tensor, op) -> torch.Tensor:
    """op (torch.amax or torch.sum) over each block of BLOCK columns: [n, V] -> [n, ceil(V / BLOCK)]."""
    n, vocab = x.shape
    full, tail = divmod(vocab, BLOCK)
    out = op(x[:, : full * BLOCK].view(n, full, BLOCK), -1)
    if tail:
        out = torch.cat([out, op(x[:, full * BLOCK :], -1, keepdim=True)], dim=1)
    return out


def gather_blocks(x: torch.Tensor, rows: torch.Tensor | None, blocks: torch.Tensor,
                  fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The values and token ids of the given blocks: blocks int64 [n, b] -> two [n, b * BLOCK] tensors.

    rows picks the row of x for each output row (None: row i). Positions past the vocabulary's end (in a
    ragged last block) read as `fill`, with token id V - 1.
    """
    vocab = x.shape[1]
    n, num_blocks = blocks.shape
    token_ids = (blocks.unsqueeze(2) * BLOCK + torch.arange(BLOCK, device=x.device)).view(n, num_blocks * BLOCK)
    beyond = None
    if vocab % BLOCK:
        beyond = token_ids >= vocab
        token_ids.clamp_(max=vocab - 1)
    if rows is None:
        values = x.gather(1, token_ids)
    else:
        values = torch.take(x, token_ids + (rows * vocab).unsqueeze(1))
    if beyond is not None:
        values.masked_fill_(beyond, fill)
    return values, token_ids


def argmax_rows(x: torch.Tensor, block_max: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """torch.argmax(x[rows], -1) (first maximum on ties), from x's block maxima: int64 [n]."""
    bm = block_max if rows is None else block_max[rows]
    values, token_ids = gather_blocks(x, rows, bm.argmax(-1, keepdim=True), float("-inf"))
    return token_ids.gather(1, values.argmax(-1, keepdim=True)).squeeze(1)


def topk_rows(x: torch.Tensor, block_max: torch.Tensor, rows: torch.Tensor | None,
              k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x[rows], k): values sorted descending [n, k] and token ids int64 [n, k]."""
    bm = block_max if rows is None else block_max[rows]
    vocab = x.shape[1]
    if k * BLOCK * 2 > vocab:          # the candidate blocks would hold half the vocabulary: plain topk
        return torch.topk(x if rows is None else x[rows], k, dim=-1)
    _, blocks = torch.topk(bm, k, dim=-1, sorted=False)
    values, token_ids = gather_blocks(x, rows, blocks, float("-inf"))
    top_values, top_cols = torch.topk(values, k, dim=-1)
    return top_values, token_ids.gather(1, top_cols)


def count_greater(x: torch.Tensor, block_max: torch.Tensor, values: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """Per row, how many entries of x [n, V] exceed values [n]: int64 [n].

    Only blocks whose maximum exceeds the value can hold such entries; when every row has few of them (a
    likely token), those blocks are gathered instead of comparing the whole row (scratch: [n, V]).
    """
    num_blocks = block_max.shape[1]
    max_hot = int((block_max > values.unsqueeze(1)).sum(-1).max()) if len(values) else 0
    if max_hot * 8 > num_blocks:
        return torch.gt(x, values.unsqueeze(1), out=scratch).sum(-1).long()
    # The max_hot blocks with the largest maxima hold every hot block of the row; the others add nothing.
    _, blocks = torch.topk(block_max, max_hot, dim=-1, sorted=False)
    candidates, _ = gather_blocks(x, None, blocks, float("-inf"))
    return (candidates > values.unsqueeze(1)).sum(-1)


def sample_rows(weights: torch.Tensor, uniforms: torch.Tensor,
                block_sums: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row with probability proportional to `weights` (>= 0, [n, V]): int64 [n].

    Inverse CDF with one uniform in [0, 1) per row: the block is found on float64 cumulative block sums,
    then the token on a float64 cumulative sum inside that block. Zero-weight tokens are never chosen
    (a row of all zeros returns some token rather than failing).
    """
    bs = block_reduce(weights, torch.sum) if block_sums is None else block_sums
    cum_blocks = bs.double().cumsum(-1)
    target = uniforms * cum_blocks[:, -1]
    block = torch.searchsorted(cum_blocks, target.unsqueeze(1), right=True).squeeze(1)
    # u * total can round up to total itself: step back to the last block that has weight.
    block = torch.minimum(block, _last_positive(bs))
    before = torch.where(block > 0, cum_blocks.gather(1, (block - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    values, token_ids = gather_blocks(weights, None, block.unsqueeze(1), 0.0)
    cum_values = values.double().cumsum(-1)
    col = torch.searchsorted(cum_values, (target - before).unsqueeze(1), right=True).squeeze(1)
    col = torch.minimum(col, _last_positive(values))
    return token_ids.gather(1, col.unsqueeze(1)).squeeze(1)


def sample_candidates(weights: torch.Tensor, nucleus_mass: torch.Tensor | None,
                      uniforms: torch.Tensor) -> torch.Tensor:
    """Sample a column of `weights` [n, C] (>= 0, non-increasing along each row) by inverse CDF: int64 [n].

    With nucleus_mass (float64 [n]) only the top-p prefix takes part: the columns whose exclusive prefix
    sum is below nucleus_mass (so the first column with weight always does).
    """
    cum = weights.double().cumsum(-1)
    kept = weights > 0
    if nucleus_mass is not None:
        kept &= (cum - weights) < nucleus_mass.unsqueeze(1)
    num_kept = kept.sum(-1, keepdim=True)          # the kept columns are a prefix of the row
    last = (num_kept - 1).clamp(min=0)
    target = uniforms.unsqueeze(1) * cum.gather(1, last)
    col = torch.searchsorted(cum, target, right=True)
    return torch.minimum(col, last).squeeze(1)


def logsumexp_rows(x: torch.Tensor, row_max: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x))) per row into the scratch `out` ([n, V], may be x itself): float32 [n].

    exp is 10-40x slower on inputs below about -87 (its result underflows), so the shifted logits are
    clamped there first; exp(-87) ~ 1.6e-38 per token cannot move a float32 sum that is at least 1.
    """
    torch.sub(x, row_max.unsqueeze(1), out=out)
    out.clamp_min_(-87.0).exp_()
    return out.sum(-1).log_() + row_max


def _last_positive(values: torch.Tensor) -> torch.Tensor:
    """Per row, the index of the last entry > 0 (the last index when there is none)."""
    width = values.shape[1]
    return width - 1 - (values > 0).flip(-1).int().argmax(-1)
