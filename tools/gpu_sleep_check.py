"""Sleep mode on a GPU: what each level frees, how long the wake takes beside a cold start, whether the first
request after a wake is as fast as a steady one (CUDA graphs captured again), and whether greedy output is the
same token for token before and after.

    python -m tools.gpu_sleep_check [MODEL] [--tokenizer DIR] [--load-format dummy] [--out sleep.json]

Default MODEL: dummy-weight Qwen3-8B (../shared/models/configs/qwen3-8b, the qwen3 tokenizer). The figures
answer the GPU target of the several-models work: a 7-8B model wakes from level 1 in <= 2 s, and the first
request after it is within 1.2x the steady first-token time. Prints one JSON object. Without CUDA it says so
and exits 0.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import click

SHARED = Path(os.environ.get("RINGSERVE_SHARED", Path(__file__).resolve().parent.parent.parent / "shared"))
PROMPT = [1000 + i for i in range(128)]


def free_gpu_bytes() -> int:
    import torch

    return torch.cuda.mem_get_info()[0]


def first_token_s(llm, params) -> tuple[float, list[int]]:
    from engine.sampling_params import SamplingParams

    start = time.perf_counter()
    output = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(**params), use_tqdm=False)[0]
    return time.perf_counter() - start, output.outputs[0].token_ids


@click.command()
@click.argument("model", required=False)
@click.option("--tokenizer", default=None)
@click.option("--load-format", default=None, help="Default: dummy for the built-in Qwen3-8B shape, else auto.")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Also write the JSON here.")
def main(model: str | None, tokenizer: str | None, load_format: str | None, out: str | None) -> None:
    import torch

    if not torch.cuda.is_available():
        click.echo(json.dumps({"skipped": "no CUDA GPU"}))
        return
    from engine.llm import LLM

    if model is None:
        model, tokenizer = str(SHARED / "models/configs/qwen3-8b"), str(SHARED / "models/tokenizers/qwen3")
        load_format = load_format or "dummy"
    report: dict = {"model": model}
    started = time.perf_counter()
    with LLM(model, tokenizer=tokenizer, load_format=load_format or "auto", max_model_len=4096) as llm:
        report["cold_start_s"] = round(time.perf_counter() - started, 2)
        one = {"temperature": 0.0, "max_tokens": 1}
        greedy = {"temperature": 0.0, "max_tokens": 32, "ignore_eos": True}
        _, reference = first_token_s(llm, greedy)
        _, again = first_token_s(llm, greedy)           # the same prompt again, its blocks now cached
        report["repeat_same_tokens"] = again == reference
        steady = [first_token_s(llm, one)[0] for _ in range(5)]
        report["steady_first_token_s"] = round(statistics.median(steady), 4)
        for level in (1, 2):
            awake = free_gpu_bytes()
            llm.sleep(level)
            report[f"level{level}_freed_gib"] = round((free_gpu_bytes() - awake) / (1 << 30), 2)
            begin = time.perf_counter()
            llm.wake_up()
            report[f"level{level}_wake_s"] = round(time.perf_counter() - begin, 3)
            ttft, _ = first_token_s(llm, one)
            report[f"level{level}_first_token_after_wake_s"] = round(ttft, 4)
            report[f"level{level}_first_token_ratio"] = round(ttft / report["steady_first_token_s"], 2)
            _, tokens = first_token_s(llm, greedy)
            report[f"level{level}_same_tokens"] = tokens == reference
            report[f"level{level}_first_difference"] = next(
                (i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    report["wake_level1_within_2s"] = report["level1_wake_s"] <= 2.0
    text = json.dumps(report)
    click.echo(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
