"""The Triton quantized matmul (kernels/triton_quant_matmul.py) on a CUDA GPU at real shapes: correctness
against dequantize-then-matmul, and time against a bf16 matmul of the same shape.

    python -m tools.bench_quant_gpu [--types Q4_K,Q8_0,Q4_0,Q6_K] [--rows 1,16,256,2048] [--json]

Weights are random valid blocks of each type (no download: the speed of a matmul does not depend on the
values), in Llama-3-8B / Qwen2.5-7B layer shapes (N x K: 4096 x 4096, 14336 x 4096, 4096 x 14336;
1024 x 4096 on request). Per case it prints the Triton kernel's median time, torch's bf16 matmul of a dense weight of
the same shape, the ratio, the weight bytes the kernel reads per second, and the largest error against the
reference (the weight dequantized to bf16, the product in fp32) relative to the output's largest value.
Needs CUDA; about a minute on an H100.
"""

from __future__ import annotations

import json
import sys

import click
import torch

SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336)}
DEFAULT_SHAPES = "q/o,gate/up,down"


def _median_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def weights(type_name: str, shape: str):
    """(the GPU form, the dequantized bf16 weight) of random blocks of the type and shape."""
    from kernels.gguf_blocks import TYPE_IDS, QuantizedWeight, random_blocks
    from kernels.triton_quant_matmul import TritonQuantWeight

    n, k = SHAPES[shape]
    device = torch.device("cuda")
    raw = random_blocks(TYPE_IDS[type_name], n, k, seed=n + k)
    gpu = TritonQuantWeight(QuantizedWeight([(TYPE_IDS[type_name], raw)], k), device)
    dense = QuantizedWeight([(TYPE_IDS[type_name], raw.to(device))], k).dequantize().to(torch.bfloat16)
    return gpu, dense


def measure(type_name: str, shape: str, m: int, gpu, dense) -> dict:
    from kernels.triton_quant_matmul import quant_matmul_triton

    n, k = SHAPES[shape]
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    got = quant_matmul_triton(x, gpu).float()
    expected = x.float() @ dense.float().T
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    quant_ms = _median_ms(lambda: quant_matmul_triton(x, gpu))
    bf16_ms = _median_ms(lambda: x @ dense.T)
    return {"type": type_name, "shape": shape, "n": n, "k": k, "m": m, "triton_ms": quant_ms, "bf16_ms": bf16_ms,
            "speedup": bf16_ms / quant_ms, "weight_gb_s": gpu.nbytes / quant_ms / 1e6, "rel_error": error}


@click.command()
@click.option("--types", default="Q4_K,Q8_0,Q4_0,Q6_K", help="GGUF types, comma-separated.")
@click.option("--rows", default="1,16,256,2048", help="Activation rows (decode batch or prefill tokens).")
@click.option("--shapes", default=DEFAULT_SHAPES, help=f"Of {', '.join(SHAPES)}.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per case instead of the table.")
def cli(types: str, rows: str, shapes: str, as_json: bool) -> None:
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to measure")
        return
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", file=sys.stderr)
    if not as_json:
        print(f"{'type':5} {'shape':8} {'M':>5} {'triton ms':>10} {'bf16 ms':>9} {'ratio':>6} {'GB/s':>7} {'rel err':>9}")
    failed = False
    for type_name in types.split(","):
        for shape in shapes.split(","):
            gpu, dense = weights(type_name, shape)
            for m in (int(r) for r in rows.split(",")):
                r = measure(type_name, shape, m, gpu, dense)
                failed |= r["rel_error"] > 2e-2
                if as_json:
                    print(json.dumps(r), flush=True)
                else:
                    print(f"{type_name:5} {shape:8} {m:5d} {r['triton_ms']:10.4f} {r['bf16_ms']:9.4f} "
                          f"{r['speedup']:5.2f}x {r['weight_gb_s']:7.0f} {r['rel_error']:9.2e}", flush=True)
    if failed:
        print("FAILED: a case's error exceeds 2e-2 of its largest output", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
