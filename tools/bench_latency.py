"""Decode latency: time per output token at a fixed batch size, input and output length.

For each configuration it times the same batch twice through `LLM`: once generating one token (prefill
alone) and once generating --output-len tokens; the difference divided by output_len - 1 is the time of one
decode step. It also reports the memory bandwidth that step achieves for the weights (weight bytes / step
time), which at batch 1 is the physical limit of decoding; on a GPU beside its peak. On CUDA it measures
with CUDA graphs and with --enforce-eager, side by side. With --hf, Hugging Face transformers is timed the
same way on the same weights in the same run (a GGUF file through `from_pretrained(gguf_file=)`), and both
report their load time (engine start, or from_pretrained, until ready to generate).

    ringserve bench latency --model DIR|FILE.gguf|NAME [--batch-size 1] [--input-len 128] [--output-len 128]
                            [--quantization gguf|none]

A GGUF file is measured with its own weights (kept in their quantized blocks unless --quantization none);
other models with random weights of their shapes unless --load-format auto.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import click

from frontend.cli.options import model_argument

# HBM peak bandwidth of the GPUs we expect to be measured on (bytes/s, vendor figures).
PEAK_BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12, "A800": 2.0e12, "L40S": 0.864e12}


def weight_bytes(model: str, dtype: str, quantization: str | None = None) -> int:
    """Bytes of the weights one decode step reads: from config.json, or for a GGUF file kept quantized, its
    matrices' bytes (the LM head's, not the token embedding's, which a step only looks rows up in)."""
    from engine.config import EngineConfig
    from engine.models.gguf_file import read_gguf
    from engine.models.model_args import ModelArgs

    if EngineConfig(model=model, quantization=quantization, device="cpu").finalize().quantization == "gguf":
        tensors = read_gguf(model).tensors
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        return sum(t.nbytes for name, t in tensors.items()
                   if len(t.shape) == 2 and (name.startswith("blk.") or name == head))
    config = EngineConfig(model=model, dtype=dtype, load_format="dummy", device="cpu").finalize()
    a = ModelArgs.from_hf_config(config.hf_config(), config.architecture, config.max_model_len)
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    per_layer = a.hidden_size * (q + 2 * kv) + q * a.hidden_size + 3 * a.hidden_size * a.intermediate_size
    params = a.num_layers * per_layer + a.vocab_size * a.hidden_size       # LM head (the embedding is a lookup)
    element = 4 if config.resolved_dtype == "float32" else 2
    return params * element


def peak_bandwidth() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    return name, next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def random_prompts(model: str, batch: int, input_len: int) -> list[list[int]]:
    from engine.config import EngineConfig

    vocab = EngineConfig(model=model, load_format="dummy", device="cpu").finalize().vocab_size
    rng = random.Random(0)
    return [[rng.randrange(min(vocab, 10_000)) for _ in range(input_len)] for _ in range(batch)]


def measure(model: str, tokenizer: str | None, batch: int, input_len: int, output_len: int, iters: int,
            **engine_args) -> dict:
    from engine import LLM, SamplingParams

    prompts = [{"prompt_token_ids": p} for p in random_prompts(model, batch, input_len)]
    start = time.perf_counter()
    llm = LLM(model, tokenizer=tokenizer, skip_tokenizer_init=tokenizer is None,
              max_model_len=input_len + output_len + 16, enable_prefix_caching=False, **engine_args)
    load = time.perf_counter() - start
    try:
        def run(tokens: int) -> float:
            params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            return time.perf_counter() - start

        run(2)                                                          # warm-up
        prefill = min(run(1) for _ in range(iters))
        full = min(run(output_len) for _ in range(iters))
    finally:
        llm.shutdown()
    step = (full - prefill) / (output_len - 1)
    return {"batch": batch, "input_len": input_len, "output_len": output_len, "load_s": load, "prefill_s": prefill,
            "total_s": full, "decode_step_ms": step * 1e3, "output_tokens_per_s": batch / step}


def load_transformers(model: str, dtype: str, load_format: str):
    """transformers' model on the same weights: a GGUF through gguf_file, a directory's safetensors, or (dummy)
    random weights of the config's shapes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.config import EngineConfig

    config = EngineConfig(model=model, dtype=dtype, load_format=load_format, device="cpu").finalize()
    torch_dtype = getattr(torch, config.resolved_dtype)
    if config.is_gguf:
        directory, name = os.path.split(config.model)
        return AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch_dtype).eval()
    if load_format == "dummy":
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.model), dtype=torch_dtype).eval()
    return AutoModelForCausalLM.from_pretrained(config.model, dtype=torch_dtype).eval()


def measure_transformers(model: str, batch: int, input_len: int, output_len: int, iters: int, dtype: str,
                         load_format: str) -> dict:
    """The same measurement with transformers' generate (greedy, static batch, no EOS), on the CPU."""
    import torch

    start = time.perf_counter()
    hf = load_transformers(model, dtype, load_format)
    load = time.perf_counter() - start
    ids = torch.tensor(random_prompts(model, batch, input_len))

    def run(tokens: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                        do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - start

    run(2)
    prefill = min(run(1) for _ in range(iters))
    full = min(run(output_len) for _ in range(iters))
    step = (full - prefill) / (output_len - 1)
    return {"batch": batch, "input_len": input_len, "output_len": output_len, "load_s": load, "prefill_s": prefill,
            "total_s": full, "decode_step_ms": step * 1e3, "output_tokens_per_s": batch / step}


@click.command("latency")
@model_argument(required=True, help="HF model directory, .gguf file or built-in name.")
@click.option("--tokenizer", default=None, help="default: none needed (token ids in and out)")
@click.option("--load-format", default=None,
              help="auto (the file's weights; the default for a .gguf MODEL) or dummy (random weights of the "
                   "config's shapes; the default otherwise)")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--quantization", type=click.Choice(["gguf", "none"]), default=None,
              help="a GGUF file's quantized weights: gguf keeps them (the default for such a file), none dequantizes")
@click.option("--batch-size", default=1, show_default=True)
@click.option("--input-len", default=128, show_default=True)
@click.option("--output-len", default=128, show_default=True)
@click.option("--iters", default=3, show_default=True, help="repetitions; the best is kept")
@click.option("--hf/--no-hf", default=False, show_default=True,
              help="Also time transformers on the same weights (CPU only).")
@click.option("--cpu-threads", type=int, default=None,
              help="torch threads of each engine on the CPU (default: ringserve's choice, torch's for transformers)")
@click.option("--json", "as_json", is_flag=True)
def cli(model, tokenizer, load_format, dtype, quantization, batch_size, input_len, output_len, iters, hf, cpu_threads,
        as_json):
    """Per-token decode time at a fixed batch, and the weight bandwidth it achieves."""
    from engine.config import EngineConfig

    model = EngineConfig(model=model, load_format="dummy", device="cpu").finalize().model     # names, hub ids
    device, peak = peak_bandwidth()
    modes = [("cuda graphs", False), ("eager", True)] if device != "cpu" else [("ringserve", True)]
    load_format = load_format or ("auto" if model.lower().endswith(".gguf") else "dummy")
    quantization = None if load_format == "dummy" else quantization
    nbytes = weight_bytes(model, dtype, quantization if load_format != "dummy" else "none")
    rows = []
    for name, eager in modes:
        r = measure(model, tokenizer, batch_size, input_len, output_len, iters, load_format=load_format,
                    dtype=dtype, enforce_eager=eager, cpu_threads=cpu_threads, quantization=quantization)
        r["mode"] = name
        r["weight_gb_per_s"] = nbytes / (r["decode_step_ms"] / 1e3) / 1e9
        r["peak_fraction"] = None if peak is None else r["weight_gb_per_s"] * 1e9 / peak
        rows.append(r)
    if hf and device == "cpu":
        if cpu_threads:
            import torch

            torch.set_num_threads(cpu_threads)
        r = measure_transformers(model, batch_size, input_len, output_len, iters, dtype, load_format)
        r["mode"] = "transformers"
        r["weight_gb_per_s"] = nbytes / (r["decode_step_ms"] / 1e3) / 1e9
        r["peak_fraction"] = None
        rows.append(r)
    if as_json:
        click.echo(json.dumps({"model": model, "device": device, "weight_bytes": nbytes, "results": rows}))
        return
    click.echo(f"{model} on {device}: {nbytes / 1e9:.3f} GB of weights read a step ({dtype}, quantization "
               f"{quantization or 'default'}), batch {batch_size}, "
               f"input {input_len}, output {output_len}")
    click.echo(f"{'mode':<13} {'load s':>7} {'decode ms/step':>15} {'tokens/s':>10} {'weights GB/s':>13} "
               f"{'of peak':>8}")
    for r in rows:
        frac = "" if r["peak_fraction"] is None else f"{100 * r['peak_fraction']:.0f}%"
        click.echo(f"{r['mode']:<13} {r['load_s']:>7.1f} {r['decode_step_ms']:>15.2f} "
                   f"{r['output_tokens_per_s']:>10.1f} {r['weight_gb_per_s']:>13.1f} {frac:>8}")


if __name__ == "__main__":
    sys.exit(cli())
