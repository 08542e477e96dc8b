"""Compile, at startup, every attention-kernel variant an eager step can reach (review F6).

Triton compiles one variant per set of constexprs. The profile forward compiles only the mixed kernel's
largest query tile, and CUDA-graph capture only the decode split counts of the captured sizes, so the first
mixed batch of mostly decode tokens (a smaller BLOCK_M) or an eager decode batch (--enforce-eager, or more
sequences than the largest graph) would stall every rank for seconds mid-serving. The variants depend on
shapes alone (kernels/triton_paged_attention.query_tile_rows, triton_decode_attention.default_num_splits),
so one small dummy forward per variant covers them all.
"""

from __future__ import annotations


def warmup_shapes(*, group: int, max_rows: int, num_kv_heads: int, num_sms: int, max_num_seqs: int,
                  max_num_batched_tokens: int) -> list[tuple[int, int]]:
    """(num_tokens, num_seqs) of one dummy forward per reachable variant: a single request of q tokens
    for each mixed-kernel BLOCK_M (a mixed batch's mean query length is at least 2), and a pure-decode
    batch of r requests for each decode NUM_SPLITS."""
    from kernels.triton_decode_attention import default_num_splits
    from kernels.triton_paged_attention import query_tile_rows

    shapes: dict[tuple[str, int], tuple[int, int]] = {}
    for q in range(2, min(2 * max_rows, max_num_batched_tokens) + 1):
        shapes.setdefault(("mixed", query_tile_rows(q, 1, group, max_rows)), (q, 1))
    for r in range(1, min(max_num_seqs, max_num_batched_tokens) + 1):
        shapes.setdefault(("decode", default_num_splits(r, num_kv_heads, num_sms)), (r, r))
    return list(shapes.values())


def warm_up_attention_kernels(runner) -> int:
    """Run runner._dummy_forward once per shape of warmup_shapes (CUDA, triton backend); returns how many."""
    import torch

    from kernels.triton_attention_tiles import tile_config

    config = runner.config
    heads = int(config.hf_config()["num_attention_heads"]) // runner.tp_size
    num_kv_heads = runner.model.num_kv_heads
    shapes = warmup_shapes(
        group=heads // num_kv_heads,
        max_rows=tile_config(runner.dtype, runner.model.head_dim).max_rows,
        num_kv_heads=num_kv_heads,
        num_sms=torch.cuda.get_device_properties(runner.device).multi_processor_count,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    for num_tokens, num_seqs in shapes:
        runner._dummy_forward(num_tokens, num_seqs)
    torch.cuda.synchronize(runner.device)
    return len(shapes)
