"""Milliseconds per sampler call at V = 151,936 (Qwen3's vocabulary), for 1, 16, 64 and 256 rows.

Prints, per configuration and batch size, ringserve's Sampler (as the executor builds it: with the C draw of
rows without top-k/top-p where kernels/cpu/ops runs) beside a plain torch sampler written the way
vLLM v1's CPU path works (full-vocabulary sort for top-k/top-p, softmax and an exponential race for the
draw, [S, V] bin counts for penalties, full log_softmax for logprobs), and the host bookkeeping per step
(SamplingBatch.metadata + append_tokens). Logits are randn * 2 (a flat-ish distribution; real models are
more peaked, which only matters for top-p without top-k). Run: python -m tools.bench_sampler [--threads N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from engine.sample.sampler import Sampler
from engine.sample.sampling_batch import SamplingBatch
from engine.sampling_params import SamplingParams
from kernels.cpu import ops as cpu_ops

VOCAB = 151_936
PROMPT_LEN, OUTPUT_LEN = 512, 128            # history per request, for the penalties

QWEN3 = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
CONFIGS = {
    "greedy": {"temperature": 0.0},
    "temperature only": {"temperature": 0.8},
    "T + top_k=20 + top_p=0.95": QWEN3,
    "  + penalties": {**QWEN3, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5},
    "  + logprobs=5": {**QWEN3, "logprobs": 5},
    "T=0.6 + top_p=0.9 (no top_k)": {"temperature": 0.6, "top_p": 0.9},
}


def naive_sample(logits: torch.Tensor, p: SamplingParams, prompt: torch.Tensor, output: torch.Tensor):
    """One batch of identical params, vLLM-v1-style plain torch (the peer; not used by the engine)."""
    raw_logprobs = torch.log_softmax(logits, -1) if p.logprobs is not None else None
    if p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0:
        rows = logits.shape[0]
        counts = torch.zeros(rows, VOCAB + 1).scatter_add_(1, output, torch.ones_like(output, dtype=torch.float))
        counts = counts[:, :VOCAB]
        prompt_mask = torch.zeros(rows, VOCAB + 1, dtype=torch.bool).scatter_(1, prompt, True)[:, :VOCAB]
        seen = prompt_mask | (counts > 0)
        scale = torch.where(seen, torch.where(logits > 0, 1 / p.repetition_penalty, p.repetition_penalty), 1.0)
        logits = logits * scale - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    if p.temperature == 0.0:
        sampled = logits.argmax(-1)
    else:
        logits = logits / p.temperature
        if p.top_k or p.top_p < 1.0:
            sorted_logits, order = logits.sort(-1)
            if p.top_k:
                sorted_logits.masked_fill_(sorted_logits < sorted_logits[:, -p.top_k:-p.top_k + 1], -float("inf"))
            if p.top_p < 1.0:
                cum = sorted_logits.softmax(-1).cumsum(-1)
                sorted_logits.masked_fill_(cum <= 1 - p.top_p, -float("inf"))
            logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
        probs = logits.softmax(-1)
        sampled = probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)
    if raw_logprobs is not None:
        chosen = raw_logprobs.gather(1, sampled[:, None])
        torch.topk(raw_logprobs, p.logprobs)
        (raw_logprobs >= chosen).sum(-1)
    return sampled


def bench(name: str, fields: dict, rows: int, repeats: int) -> tuple[float, float, float]:
    params = SamplingParams(**fields).resolved()
    generator = np.random.default_rng(0)
    batch = SamplingBatch(rows, VOCAB, torch.device("cpu"), seed=0)
    histories = []
    for row in range(rows):
        prompt = generator.integers(0, VOCAB, PROMPT_LEN)
        output = generator.integers(0, VOCAB, OUTPUT_LEN)
        batch.add_request(row, params, prompt, output, [VOCAB - 1])
        histories.append((prompt, output))
    prompt_t = torch.from_numpy(np.stack([h[0] for h in histories]))
    output_t = torch.from_numpy(np.stack([h[1] for h in histories]))
    source = torch.randn(rows, VOCAB) * 2.0
    logits = torch.empty_like(source)
    sampler = Sampler(full_row_draw=cpu_ops.sample_exp_rows if cpu_ops.available() else None)   # the executor's
    row_ids = np.arange(rows)
    ours, peer, host = [], [], []
    for i in range(repeats + 2):                      # two warm-up rounds
        t0 = time.perf_counter()
        metadata = batch.metadata(row_ids)
        t1 = time.perf_counter()
        logits.copy_(source)
        t2 = time.perf_counter()
        tokens = sampler(logits, metadata).sampled_token_ids
        t3 = time.perf_counter()
        batch.append_tokens(row_ids, tokens.numpy())
        t4 = time.perf_counter()
        logits.copy_(source)
        t5 = time.perf_counter()
        naive_sample(logits, params, prompt_t, output_t)
        t6 = time.perf_counter()
        if i >= 2:
            ours.append(t3 - t2)
            host.append((t1 - t0) + (t4 - t3))
            peer.append(t6 - t5)
    return (statistics.median(ours) * 1e3, statistics.median(peer) * 1e3, statistics.median(host) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"V={VOCAB}, torch threads={torch.get_num_threads()}, cores={os.cpu_count()}, "
          f"load average before={os.getloadavg()[0]:.2f}; median ms per call")
    sizes = (1, 16, 64, 256)
    print(f"{'configuration':32s}" + "".join(f"{f'S={s} ours/peer/host':>26s}" for s in sizes))
    for name, fields in CONFIGS.items():
        cells = []
        for rows in sizes:
            ours, peer, host = bench(name, fields, rows, args.repeats)
            cells.append(f"{ours:8.2f} /{peer:8.2f} /{host:5.2f}")
        print(f"{name:32s}" + "".join(f"{c:>26s}" for c in cells), flush=True)
    print(f"load average after={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
