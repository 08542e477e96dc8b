"""Top-p over the whole vocabulary with no host sync: the sampler's path for rows on a GPU (review F4).

On the CPU the sampler looks for the nucleus among the 64 most likely tokens and, where it is larger, draws
by rejection with a rising pivot, reading on the host after each round which rows are still undecided.
On a GPU each such read drains the stream. A fixed number of masked rejection rounds would avoid the reads,
but some row can always be left undecided, and the exact fallback it then needs costs as much as deciding
every row exactly in the first place: so the GPU path decides every top-p row with fixed shapes and a fixed
number of kernels, and draws once.

1. Rows whose nucleus lies among the 64 most likely tokens take the CPU path's candidate draw (the same
   token from the same uniform), chosen per row with torch.where.
2. For the others, `nucleus_floor` finds the smallest weight in the nucleus. A token is in the nucleus when
   the tokens strictly heavier than it weigh less than top_p x the row's total (the rejection test of the
   CPU path), so the nucleus is exactly the tokens at or above the floor, and tied tokens go together.
3. One inverse-CDF draw (vocab_ops.sample_rows) from the weights at or above the floor, with the row's
   first uniform. A seeded row's token thus depends on its seed, position and logits alone.

The floor search, exact to the last bit. Each row is cut into segments of up to SEGMENT tokens, sorted (on
CUDA torch.sort handles rows of up to 4096 in one pass in shared memory; a whole-vocabulary sort is a
multi-pass global radix sort, several times the traffic), with float64 prefix sums. The mass at or below
any threshold is then one binary search per segment. Kept weights are 0 or in [1, e^70] (exp_weights), so
the floor is one of the 2^30 float32 bit patterns from 1.0 to the largest finite float; the
search fixes 6 bits of it per round, 63 thresholds at once, in 5 rounds, whatever the distribution.

Cost, estimated (no GPU measured it yet): memory traffic of roughly twice that of computing the weights.
The sort moves ~40 bytes per token (its in-place kernel reads and writes the values and the int64 indices
torch.sort insists on), the float64 prefix sums ~12, the masked copy and its block sums ~14; the rounds
touch only [n, V / SEGMENT, 63]. In launches: a fixed ~110 small ops, ~60 of them the floor. Every row of
the full-vocabulary group pays it, also a row whose nucleus fits the candidates: that is the price of not
asking. About 24 bytes per token are held at the peak, transiently; the executor's memory profile runs
this path (top-p on flat logits), so the KV cache is sized after it.
"""

from __future__ import annotations

import numpy as np
import torch

SEGMENT = 4096
RADIX = 64                           # thresholds tried per round: RADIX - 1
ROUNDS = 5                           # RADIX ** ROUNDS == 2 ** 30 bit patterns
_BELOW_ONE_BITS = int(np.float32(1.0).view(np.int32)) - 1     # every kept weight is above this pattern


def segment_width(vocab: int) -> int:
    return min(SEGMENT, vocab)


def padded_width(vocab: int) -> int:
    """The row width `nucleus_floor` needs: the vocabulary rounded up to whole segments."""
    segment = segment_width(vocab)
    return -(-vocab // segment) * segment


def nucleus_floor(weights: torch.Tensor, segment: int, top_p: torch.Tensor) -> torch.Tensor:
    """The smallest weight of each row's top-p nucleus: float32 [n], without a host sync.

    weights: [n, W] contiguous, W a multiple of `segment`, every entry 0 (dropped) or in [1, max float32];
    top_p: float32 [n] in (0, 1]. With top_p = 1 the floor is the smallest kept weight. The nucleus is
    every token whose weight is >= the floor.
    """
    n = weights.shape[0]
    values = torch.sort(weights.view(n, -1, segment)).values
    num_segments = values.shape[1]
    mass_below = values.new_zeros((n, num_segments, segment + 1), dtype=torch.float64)
    torch.cumsum(values, -1, dtype=torch.float64, out=mass_below[..., 1:])   # [..., c]: the c lightest
    total = mass_below[..., -1].sum(-1)
    # A threshold t lies below the floor while the tokens heavier than t weigh >= top_p x total, i.e. while
    # the tokens at or below t weigh at most `limit`. That is monotone in t, so each round's count of such
    # thresholds is the next digit of the largest one, `below`; the floor is the pattern after it.
    limit = (total - top_p.double() * total).unsqueeze(1)
    below = torch.full((n,), _BELOW_ONE_BITS, dtype=torch.int32, device=weights.device)
    steps = torch.arange(1, RADIX, dtype=torch.int32, device=weights.device)
    for round_ in range(ROUNDS):
        stride = RADIX ** (ROUNDS - 1 - round_)
        thresholds = (below.unsqueeze(1) + steps * stride).view(torch.float32)
        per_segment = thresholds.unsqueeze(1).expand(n, num_segments, RADIX - 1).contiguous()
        counts = torch.searchsorted(values, per_segment, right=True)
        mass = mass_below.gather(2, counts).sum(1)
        below.add_((mass <= limit).sum(1, dtype=torch.int32), alpha=stride)
    return (below + 1).view(torch.float32)
