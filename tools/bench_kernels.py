"""Time each Triton kernel against its torch reference on a CUDA GPU, with real model shapes.

    python -m tools.bench_kernels [--dtype bfloat16] [--heads 32 --kv-heads 8 --head-dim 128]

Prints, per case, the median time of the Triton kernel and of the reference, and what the Triton kernel
achieves: memory bandwidth for the bandwidth-bound ops (elementwise, KV write, decode attention) and
TFLOP/s for prefill attention, so each figure can be set against the GPU's peak. Needs CUDA.
"""

from __future__ import annotations

import argparse
import sys

import torch

import kernels
from kernels.rotary import rope_cos_sin_cache
from kernels.triton_activation import silu_and_mul_triton
from kernels.triton_decode_attention import paged_decode_attention_triton
from kernels.triton_kv_cache import write_kv_cache_triton
from kernels.triton_paged_attention import paged_attention_triton
from kernels.triton_rms_norm import rms_norm_triton
from kernels.triton_rotary import rotary_embedding_triton


def _median_ms(fn, *args) -> float:
    import triton.testing

    return triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")


def _time_pair(triton_fn, torch_fn, *args) -> tuple[float, float]:
    """Median milliseconds of the Triton kernel and of its reference on the same arguments."""
    return _median_ms(triton_fn, *args), _median_ms(torch_fn, *args)


def _paged_inputs(query_lens, context_lens, heads, kv_heads, head_dim, dtype, block_size=16):
    """Random inputs of a paged batch on the GPU (contents do not matter for timing)."""
    device = "cuda"
    seq_lens = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 1
    tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    order = torch.randperm(num_blocks - 1) + 1
    used = 0
    for r, count in enumerate(blocks):
        tables[r, :count] = order[used:used + count]
        used += count
    starts = torch.tensor([0] + torch.tensor(query_lens).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(sum(query_lens), heads, head_dim, device=device, dtype=dtype)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    return (query, cache[0], cache[1], starts.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
            tables.to(device))


def _row(name: str, triton_ms: float, torch_ms: float, figure: str) -> None:
    print(f"{name:48} {triton_ms * 1e3:10.1f} {torch_ms * 1e3:10.1f} {torch_ms / triton_ms:7.2f}x  {figure}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    size = torch.finfo(dtype).bits // 8
    heads, kv_heads, head_dim = args.heads, args.kv_heads, args.head_dim
    print(f"{torch.cuda.get_device_name()}  {args.dtype}  heads {heads}/{kv_heads}x{head_dim}")
    print(f"{'case':48} {'triton us':>10} {'torch us':>10} {'speedup':>8}  achieved")

    def gbps(num_bytes: float, ms: float) -> str:
        return f"{num_bytes / ms / 1e6:8.0f} GB/s"

    tokens = 4096
    x = torch.randn(tokens, args.hidden, device="cuda", dtype=dtype)
    residual, weight = torch.randn_like(x), torch.randn(args.hidden, device="cuda", dtype=dtype)
    t, ref = _time_pair(rms_norm_triton, kernels.rms_norm_torch, x, weight, 1e-5, residual)
    _row(f"rms_norm+residual {tokens}x{args.hidden}", t, ref, gbps(4 * x.numel() * size, t))

    gate_up = torch.randn(tokens, 2 * args.intermediate, device="cuda", dtype=dtype)
    t, ref = _time_pair(silu_and_mul_triton, kernels.silu_and_mul_torch, gate_up)
    _row(f"silu_and_mul {tokens}x{args.intermediate}", t, ref, gbps(1.5 * gate_up.numel() * size, t))

    table = rope_cos_sin_cache(head_dim, 8192, 500000.0).cuda()
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, device="cuda", dtype=dtype)
    query, key = qkv[:, :heads], qkv[:, heads:heads + kv_heads]
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    t, ref = _time_pair(rotary_embedding_triton, kernels.rotary_embedding_torch, positions, query, key, table)
    _row(f"rotary {tokens} tokens", t, ref, gbps(2 * (heads + kv_heads) * tokens * head_dim * size, t))

    cache = torch.zeros(2, tokens // 16 + 1, 16, kv_heads, head_dim, device="cuda", dtype=dtype)
    value = qkv[:, heads + kv_heads:]
    slots = torch.randperm(tokens, device="cuda")
    t, ref = _time_pair(write_kv_cache_triton, kernels.write_kv_cache_torch, key, value, cache[0], cache[1], slots)
    _row(f"write_kv_cache {tokens} tokens", t, ref, gbps(4 * kv_heads * tokens * head_dim * size, t))

    for batch, context in ((1, 32768), (32, 2048), (128, 1024), (256, 4096)):
        q, k_cache, v_cache, _, seq_lens, tables = _paged_inputs([1] * batch, [context - 1] * batch, heads,
                                                                 kv_heads, head_dim, dtype)
        t, ref = _time_pair(paged_decode_attention_triton, kernels.paged_decode_attention_torch,
                            q, k_cache, v_cache, seq_lens, tables, head_dim ** -0.5)
        _row(f"decode attention {batch} x {context} ctx", t, ref, gbps(2 * batch * context * kv_heads * head_dim * size, t))

    for query_lens, context_lens in (([2048], [0]), ([512] * 4, [4096] * 4), ([1024] + [1] * 64, [0] + [2048] * 64)):
        inputs = _paged_inputs(query_lens, context_lens, heads, kv_heads, head_dim, dtype)
        # causal work: each query token sees its context plus the new tokens up to itself
        pairs = sum(q * c + q * (q + 1) / 2 for q, c in zip(query_lens, context_lens, strict=True))
        t, ref = _time_pair(paged_attention_triton, kernels.paged_attention_torch, *inputs, head_dim ** -0.5)
        label = f"mixed attention q={query_lens[:2]}{'...' if len(query_lens) > 2 else ''} ctx={context_lens[:2]}"
        _row(label, t, ref, f"{4 * pairs * heads * head_dim / t / 1e9:8.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
