"""Logprobs of chosen tokens plus the top-k, from raw logits (vLLM's default, "raw_logprobs").

Raw means log_softmax of the model's logits before penalties, biases, masks and temperature: what the
model believed, not what the sampler drew from. The tensors have the row layout of engine/protocol.py's
Logprobs, which the model runner packs per request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.sample.vocab_ops import Workspace, block_reduce, count_greater, logsumexp_rows, topk_rows

PROMPT_LOGPROBS_CHUNK_ROWS = 64     # bounds the scratch of prompt logprobs to 64 x V floats
# bounds the prompt logits computed at once (256 x 152k vocab: 156 MB fp32) where a whole 8k-token chunk
# would take 7.5 GB that KV sizing never measured; 256 rows keep the LM-head GEMM efficient
PROMPT_LOGITS_CHUNK_ROWS = 256


@dataclass(slots=True)
class LogprobsTensors:
    """Row i: column 0 is the chosen (sampled or prompt) token, columns 1..k the top-k, most likely first."""

    token_ids: torch.Tensor    # int32 [rows, 1 + k]
    logprobs: torch.Tensor     # float32 [rows, 1 + k]
    ranks: torch.Tensor        # int32 [rows]: rank of the chosen token, 1 = most likely

    @property
    def num_rows(self) -> int:
        return self.token_ids.shape[0]


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int, *,
                     workspace: Workspace | None = None, block_max: torch.Tensor | None = None) -> LogprobsTensors:
    """Logprobs of token_ids (int64 [n]) and the top-k under log_softmax(logits) (float32 [n, V]).

    The rank of a chosen token is 1 + the number of tokens with a strictly higher logit (vLLM counts
    ties against the token; without ties the two agree). block_max (the logits' block maxima) saves a
    pass when the caller has it; workspace provides the [n, V] scratch.
    """
    n, vocab = logits.shape
    if not 0 <= k <= vocab:
        raise ValueError(f"number of logprobs must be in [0, {vocab}], got {k}")
    if token_ids.shape != (n,):
        raise ValueError(f"token_ids must have shape ({n},), got {tuple(token_ids.shape)}")
    logits = logits.float().contiguous()
    token_ids = token_ids.to(device=logits.device, dtype=torch.int64)
    if block_max is None:
        block_max = block_reduce(logits, torch.amax)
    chosen = logits.gather(1, token_ids.unsqueeze(1))
    scratch = (workspace or Workspace()).take(n, vocab, logits.device)

    if k:
        top_values, top_ids = topk_rows(logits, block_max, None, k)
    else:
        top_values, top_ids = chosen[:, :0], token_ids.unsqueeze(1)[:, :0]
    ranks = count_greater(logits, block_max, chosen.squeeze(1), scratch).add_(1).to(torch.int32)
    log_normalizer = logsumexp_rows(logits, block_max.amax(-1), out=scratch).unsqueeze(1)
    return LogprobsTensors(
        token_ids=torch.cat([token_ids.unsqueeze(1), top_ids], dim=1).to(torch.int32),
        logprobs=torch.cat([chosen, top_values], dim=1) - log_normalizer,
        ranks=ranks,
    )


def compute_prompt_logprobs(logits: torch.Tensor, target_token_ids: torch.Tensor, k: int) -> LogprobsTensors:
    """Prompt logprobs: row i of logits predicts target_token_ids[i] (the prompt token after position i).

    For a prompt of P tokens the caller passes the logits of positions 0..P-2 and prompt tokens 1..P-1.
    Rows are processed in chunks so the scratch stays small however long the prompt.
    """
    n = logits.shape[0]
    if target_token_ids.shape != (n,):
        raise ValueError(f"target_token_ids must have shape ({n},), got {tuple(target_token_ids.shape)}")
    workspace = Workspace()
    parts = [
        compute_logprobs(logits[start : start + PROMPT_LOGPROBS_CHUNK_ROWS],
                         target_token_ids[start : start + PROMPT_LOGPROBS_CHUNK_ROWS], k, workspace=workspace)
        for start in range(0, max(n, 1), PROMPT_LOGPROBS_CHUNK_ROWS)   # one empty chunk when n == 0
    ]
    return _concat(parts)


def prompt_logprobs_from_hidden(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    row_index: torch.Tensor,
    target_token_ids: torch.Tensor,
    k: int,
    chunk_rows: int = PROMPT_LOGITS_CHUNK_ROWS,
) -> LogprobsTensors:
    """compute_prompt_logprobs over the logits of hidden[row_index], which are computed (by the LM head,
    compute_logits) chunk_rows at a time: memory stays bounded however long the prompt chunk."""
    n = row_index.shape[0]
    if target_token_ids.shape != (n,):
        raise ValueError(f"target_token_ids must have shape ({n},), got {tuple(target_token_ids.shape)}")
    parts = [
        compute_prompt_logprobs(compute_logits(hidden.index_select(0, row_index[start : start + chunk_rows])),
                                target_token_ids[start : start + chunk_rows], k)
        for start in range(0, max(n, 1), chunk_rows)                 # one empty chunk when n == 0
    ]
    return _concat(parts)


def _concat(parts: list[LogprobsTensors]) -> LogprobsTensors:
    """The rows of several chunks' logprobs, in order, as one LogprobsTensors."""
    if len(parts) == 1:
        return parts[0]
    return LogprobsTensors(
        token_ids=torch.cat([p.token_ids for p in parts]),
        logprobs=torch.cat([p.logprobs for p in parts]),
        ranks=torch.cat([p.ranks for p in parts]),
    )
