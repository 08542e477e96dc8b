"""Forward-pass benchmark of the bare model (no engine, no sampling): one prefill batch, then decode steps.

Prints load time, prefill tokens/s, the median decode step and its tokens/s, and the memory bandwidth a
decode step achieves (weights + KV read per step / step time), i.e. gpt-fast's distance to the limit.

    python -m tools.bench_model ../shared/models/configs/qwen3-tiny --batch 8 --prompt-len 128
"""

from __future__ import annotations

import statistics
import time

import click
import torch

from engine.attention import AttentionMetadata
from engine.config import EngineConfig
from engine.models.loader import load_model


def uniform_batch(batch: int, query_len: int, seq_len: int, block_size: int) -> AttentionMetadata:
    """`batch` requests of seq_len tokens whose last query_len are new; request r owns contiguous blocks."""
    blocks_per_seq = -(-seq_len // block_size)
    tables = 1 + torch.arange(batch * blocks_per_seq).view(batch, blocks_per_seq)
    pos = torch.arange(seq_len - query_len, seq_len)
    slots = tables[:, pos // block_size] * block_size + pos % block_size
    return AttentionMetadata(
        slot_mapping=slots.flatten(),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32) * query_len,
        seq_lens=torch.full((batch,), seq_len, dtype=torch.int32),
        block_tables=tables.int(),
        max_query_len=query_len,
        max_seq_len=seq_len,
        num_actual_tokens=batch * query_len,
    )


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@click.command()
@click.argument("model", type=click.Path(exists=True))
@click.option("--load-format", default="dummy", show_default=True)
@click.option("--dtype", default="auto", show_default=True)
@click.option("--batch", default=8, show_default=True, help="requests per batch")
@click.option("--prompt-len", default=128, show_default=True)
@click.option("--decode-steps", default=32, show_default=True)
@click.option("--block-size", default=16, show_default=True)
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
def main(model, load_format, dtype, batch, prompt_len, decode_steps, block_size, threads) -> None:
    if threads:
        torch.set_num_threads(threads)
    max_len = prompt_len + decode_steps
    config = EngineConfig(model=model, load_format=load_format, dtype=dtype, max_model_len=max_len)
    start = time.perf_counter()
    lm = load_model(config, device="cpu", progress=False)
    load_s = time.perf_counter() - start

    num_blocks = 1 + batch * -(-max_len // block_size)
    kv_caches = [torch.zeros(2, num_blocks, block_size, lm.num_kv_heads, lm.head_dim, dtype=lm.dtype)
                 for _ in range(lm.num_layers)]
    generator = torch.Generator().manual_seed(0)
    last = torch.arange(1, batch + 1) * prompt_len - 1

    def step(query_len: int, seq_len: int) -> None:
        ids = torch.randint(0, config.vocab_size, (batch * query_len,), generator=generator)
        positions = torch.arange(seq_len - query_len, seq_len).repeat(batch)
        metadata = uniform_batch(batch, query_len, seq_len, block_size)
        hidden = lm(ids, positions, kv_caches, metadata)
        rows = last if query_len > 1 else slice(None)
        lm.compute_logits(hidden[rows])

    with torch.inference_mode():
        prefill_s = _timed(lambda: step(prompt_len, prompt_len))
        decode = [_timed(lambda n=n: step(1, prompt_len + n + 1)) for n in range(decode_steps)]

    decode_s = statistics.median(decode)
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    if not lm.args.tie_word_embeddings:        # an untied embedding is only gathered, not read whole
        weight_bytes -= lm.model.embed_tokens.weight.numel() * lm.model.embed_tokens.weight.element_size()
    kv_bytes = 2 * lm.num_layers * batch * (prompt_len + decode_steps // 2) * lm.num_kv_heads * lm.head_dim \
        * kv_caches[0].element_size()
    print(f"model {model} ({config.architecture}, {config.resolved_dtype}, {load_format} weights), "
          f"{torch.get_num_threads()} threads")
    print(f"load                 {load_s:8.2f} s")
    print(f"prefill {batch} x {prompt_len:<5}    {prefill_s * 1e3:8.1f} ms   {batch * prompt_len / prefill_s:10.0f} tok/s")
    print(f"decode step (median) {decode_s * 1e3:8.2f} ms   {batch / decode_s:10.0f} tok/s   "
          f"{(weight_bytes + kv_bytes) / decode_s / 1e9:6.2f} GB/s (weights {weight_bytes / 1e6:.0f} MB "
          f"+ KV {kv_bytes / 1e6:.1f} MB per step)")


if __name__ == "__main__":
    main()
