"""Logits to tokens, inside the executor.

`sampler.py` applies every SamplingParams knob vectorised over the batch; `sampling_batch.py` keeps the
per-request sampling state in the persistent batch and builds `metadata.py`'s SamplingMetadata each step;
`logprobs.py` computes sampled and prompt logprobs (plus top-k); `vocab_ops.py` holds row-wise operations
over a large vocabulary; `token_occurrences.py` tracks the tokens each penalised request has seen.
"""
