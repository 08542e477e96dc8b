"""Offline throughput: the nano-vllm workload through `LLM`, beside Hugging Face transformers' `generate`.

The workload (nano-vllm's bench.py, scaled by flags): N sequences of random token ids with prompt lengths
uniform in [min_input, max_input] and output lengths uniform in [min_output, max_output], ignore_eos, sampled
at a fixed temperature. Both engines get the same prompts in the same run; the figure is output tokens/s.
Transformers runs the batch statically (one left-padded batch, generating the longest output for all),
which is how it is used offline; only the requested tokens count towards its throughput.

    ringserve bench throughput [--no-hf] [--json]        (registered in frontend/cli.py)
    python -m tools.bench_offline ...
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass

import click

from frontend.cli.options import model_argument

DEFAULT_MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "configs", "qwen3-tiny")
DEFAULT_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models", "tokenizers", "qwen3")


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    temperature: float
    top_k: int = 0               # explicit, so every engine samples the same way (0: off)
    top_p: float = 1.0

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def make_workload(num_seqs: int, input_range: tuple[int, int], output_range: tuple[int, int],
                  vocab_size: int, temperature: float, seed: int, top_k: int = 0, top_p: float = 1.0
                  ) -> Workload:
    rng = random.Random(seed)
    top = min(vocab_size, 10_000)            # nano-vllm draws ids from [0, 10000]
    prompts = [[rng.randint(0, top - 1) for _ in range(rng.randint(*input_range))] for _ in range(num_seqs)]
    output_lens = [rng.randint(*output_range) for _ in range(num_seqs)]
    return Workload(prompts, output_lens, temperature, top_k, top_p)


def run_ringserve(workload: Workload, model: str, tokenizer: str | None, **engine_args) -> dict:
    from engine import LLM, SamplingParams

    llm = LLM(model, tokenizer=tokenizer, **engine_args)
    try:
        params = [SamplingParams(temperature=workload.temperature, top_k=workload.top_k, top_p=workload.top_p,
                                 ignore_eos=True, max_tokens=n) for n in workload.output_lens]
        llm.generate([{"prompt_token_ids": workload.prompts[0][:16]}], SamplingParams(max_tokens=4),
                     use_tqdm=False)                                       # warm-up
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in workload.prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
    finally:
        llm.shutdown()
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"engine": "ringserve", "seconds": elapsed, "output_tokens": generated,
            "output_tokens_per_s": generated / elapsed}


def run_transformers(workload: Workload, model: str, dtype: str, seed: int, load_format: str = "dummy") -> dict:
    """transformers' generate on the same weights: random ones for dummy, else the checkpoint or GGUF file."""
    import torch

    from tools.bench_latency import load_transformers

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = load_transformers(model, dtype, load_format).to(device)
    config = hf.config
    pad = config.pad_token_id if getattr(config, "pad_token_id", None) is not None else 0
    longest = max(len(p) for p in workload.prompts)
    ids = torch.full((len(workload.prompts), longest), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(workload.prompts):                 # left padding
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    max_new = max(workload.output_lens)
    common = dict(do_sample=True, temperature=workload.temperature, top_k=workload.top_k,
                  top_p=workload.top_p, pad_token_id=pad)
    with torch.inference_mode():
        hf.generate(ids[:1, -8:].to(device), attention_mask=mask[:1, -8:].to(device), max_new_tokens=2,
                    min_new_tokens=2, **common)              # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        hf.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new,
                    min_new_tokens=max_new, **common)
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    useful = workload.num_output_tokens
    return {"engine": "transformers", "seconds": elapsed, "output_tokens": useful,
            "output_tokens_per_s": useful / elapsed}


def generation_config_defaults(model: str) -> dict:
    from engine.sampling_params import generation_defaults

    path = os.path.join(model, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return generation_defaults(json.load(f))


def format_table(results: list[dict], workload: Workload, header: str) -> str:
    lines = [header,
             f"workload: {len(workload.prompts)} sequences, {workload.num_prompt_tokens} prompt tokens, "
             f"{workload.num_output_tokens} output tokens, temperature {workload.temperature}, "
             f"top_k {workload.top_k}, top_p {workload.top_p}",
             f"{'engine':<14}{'seconds':>10}{'output tok/s':>15}{'vs ringserve':>15}"]
    base = next((r for r in results if r["engine"] == "ringserve"), results[0])
    for r in results:
        ratio = base["output_tokens_per_s"] / r["output_tokens_per_s"]
        lines.append(f"{r['engine']:<14}{r['seconds']:>10.2f}{r['output_tokens_per_s']:>15.1f}"
                     f"{'' if r is base else f'{ratio:.2f}x slower':>15}")
    return "\n".join(lines)


@click.command("throughput")
@model_argument(default=DEFAULT_MODEL, help=f"HF model directory, .gguf file or built-in name (default: {DEFAULT_MODEL}).")
@click.option("--tokenizer", default=DEFAULT_TOKENIZER, show_default=True)
@click.option("--load-format", default="dummy", show_default=True)
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--num-seqs", default=64, show_default=True)
@click.option("--input-len", nargs=2, type=int, default=(100, 512), show_default=True, help="min max")
@click.option("--output-len", nargs=2, type=int, default=(100, 256), show_default=True, help="min max")
@click.option("--temperature", default=0.6, show_default=True)
@click.option("--max-num-seqs", default=256, show_default=True)
@click.option("--max-num-batched-tokens", type=int, default=None)
@click.option("--max-model-len", type=int, default=1024, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--hf/--no-hf", default=True, show_default=True, help="Also run transformers' generate.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def cli(model, tokenizer, load_format, dtype, num_seqs, input_len, output_len, temperature, max_num_seqs,
        max_num_batched_tokens, max_model_len, seed, hf, as_json):
    """Offline output tokens/s on the nano-vllm workload, ringserve beside transformers."""
    from engine.config import EngineConfig

    resolved = EngineConfig(model=model, load_format="dummy", device="cpu").finalize()   # names, GGUF, hub ids
    model, vocab = resolved.model, resolved.vocab_size
    defaults = generation_config_defaults(model)     # the model's top-k/top-p, passed explicitly
    workload = make_workload(num_seqs, input_len, output_len, vocab, temperature, seed,
                             defaults.get("top_k", 0), defaults.get("top_p", 1.0))
    results = [run_ringserve(workload, model, tokenizer, load_format=load_format, dtype=dtype,
                             max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len, seed=seed)]
    if hf:
        results.append(run_transformers(workload, model, dtype, seed, load_format))
    if as_json:
        click.echo(json.dumps({"model": model, "dtype": dtype, "results": results}))
    else:
        click.echo(format_table(results, workload, f"model {model} ({dtype}, {load_format} weights)"))


if __name__ == "__main__":
    sys.exit(cli())
