"""`ringserve bench spec`: speculative decoding against the same engine without it, side by side.

Engines (one without speculation, one per method) are started once and driven in alternating rounds
through the offline engine client, so every figure is a median over rounds taken under the same load.
Workloads:
  copy   batch 1, the `code` prompts of tools.bench_datasets (repeat or lightly edit stdlib code): decode
         tokens/s (first to last token of each request), and whether greedy outputs equal the baseline's;
  open   batch 1, open questions with nothing to copy, sampled (temperature 1, a seed per request: a seeded
         request draws the same tokens with or without drafts, so its outputs are compared too);
  cN     N requests in flight (2N in all), copy and open prompts alternating: output tokens/s.

    ringserve bench spec                                  (SmolLM2, ngram 4/4/2 and suffix, 3 rounds)
    ringserve bench spec --methods ngram --concurrency 8,16 --rounds 5
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field

import click

from tools.bench_datasets import code_prompts, open_prompts


@dataclass
class Run:
    seconds: float = 0.0          # decode time (batch 1) or wall time (concurrency)
    tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def chat_token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    rendered = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                              tokenize=False) for t in texts]
    return [tokenizer.encode(text, add_special_tokens=False) for text in rendered]


def run_serial(llm, prompts: list[list[int]], params: list) -> Run:
    """One request at a time; decode time runs from each request's first token to its last."""
    run = Run()
    for i, prompt in enumerate(prompts):
        llm.engine.add_request(f"s{time.monotonic_ns()}-{i}", prompt, params[i])
        tokens: list[int] = []
        first = last = None
        while True:
            deltas = llm.engine.poll(timeout=1.0)
            for delta in deltas:
                if delta.new_token_ids:
                    first = delta.timestamp if first is None else first
                    last = delta.timestamp
                    tokens.extend(delta.new_token_ids)
            if any(d.finished for d in deltas):
                break
        run.seconds += last - first
        run.tokens += len(tokens) - 1
        run.outputs.append(tokens)
    return run


def run_concurrent(llm, prompts: list[list[int]], params: list, concurrency: int) -> Run:
    """All prompts, `concurrency` in flight at a time; output tokens over wall time."""
    run = Run()
    queue = list(enumerate(prompts))
    in_flight = 0
    start = time.perf_counter()
    tag = time.monotonic_ns()
    while queue or in_flight:
        while queue and in_flight < concurrency:
            i, prompt = queue.pop(0)
            llm.engine.add_request(f"c{tag}-{i}", prompt, params[i])
            in_flight += 1
        for delta in llm.engine.poll(timeout=1.0):
            run.tokens += len(delta.new_token_ids)
            in_flight -= delta.finished
    run.seconds = time.perf_counter() - start
    return run


def spec_stats(llm) -> tuple[int, int, int]:
    s = llm.engine.stats
    return s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--model", default="smollm2-135m-instruct")
@click.option("--methods", default="ngram,suffix", help="Comma-separated speculative methods to compare.")
@click.option("--num-speculative-tokens", type=int, default=4)
@click.option("--prompt-lookup-max", type=int, default=4)
@click.option("--prompt-lookup-min", type=int, default=2)
@click.option("--disable-by-batch-size", type=int, default=None,
              help="Override the method's default (the engine's measured crossover); 0: never off.")
@click.option("--num-prompts", type=int, default=6, help="Prompts per batch-1 workload.")
@click.option("--output-len", type=int, default=256, help="max_tokens of each request (greedy, EOS stops).")
@click.option("--concurrency", default="8,16", help="Concurrent mixed workloads ('' for none).")
@click.option("--workloads", default="copy,open", help="Batch-1 workloads ('' for none).")
@click.option("--rounds", type=int, default=3)
@click.option("--seed", type=int, default=0)
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Write every figure here.")
def cli(model, methods, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, disable_by_batch_size,
        num_prompts, output_len, concurrency, workloads, rounds, seed, json_out) -> None:
    """Speculative decoding (ngram, suffix) against no speculation on copy-heavy and open prompts."""
    from engine import LLM, SamplingParams

    configs: dict[str, dict | None] = {"none": None}
    for method in filter(None, methods.split(",")):
        spec = {"method": method, "num_speculative_tokens": num_speculative_tokens}
        if method == "ngram":
            spec.update(prompt_lookup_max=prompt_lookup_max, prompt_lookup_min=prompt_lookup_min)
        if disable_by_batch_size is not None:
            spec["disable_by_batch_size"] = disable_by_batch_size or None
        configs[method] = spec
    engines = {name: LLM(model, speculative_config=spec, max_model_len=4096, kv_cache_memory=1 << 30, seed=seed)
               for name, spec in configs.items()}
    try:
        tokenizer = engines["none"].get_tokenizer()
        texts = {"copy": code_prompts(num_prompts, seed), "open": open_prompts(num_prompts, seed)}
        prompts = {name: chat_token_ids(tokenizer, t) for name, t in texts.items()}
        levels = [int(c) for c in concurrency.split(",") if c.strip()]
        mixed = {c: [p for pair in zip(code_prompts(c, seed + c), open_prompts(c, seed + c)) for p in pair]
                 for c in levels}      # 2c prompts: copy (greedy) and open (sampled) alternating
        mixed = {c: chat_token_ids(tokenizer, t) for c, t in mixed.items()}
        greedy = SamplingParams(temperature=0.0, max_tokens=output_len)
        params = {"copy": [greedy] * num_prompts,
                  "open": [SamplingParams(temperature=1.0, seed=seed + i, max_tokens=output_len)
                           for i in range(num_prompts)]}
        for c in levels:
            params[c] = [greedy if i % 2 == 0 else params["open"][i % num_prompts] for i in range(2 * c)]
        for llm in engines.values():          # warm up: kernels built, caches touched
            run_serial(llm, prompts["copy"][:1], [SamplingParams(temperature=0.0, max_tokens=16)])
        names = list(engines)
        results: dict[tuple[str, str], list[Run]] = {}
        acceptance: dict[str, list[int]] = {name: [0, 0, 0] for name in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for workload in filter(None, workloads.split(",")):
                for name in order:
                    before = spec_stats(engines[name])
                    results.setdefault((workload, name), []).append(run_serial(engines[name], prompts[workload],
                                                                               params[workload]))
                    after = spec_stats(engines[name])
                    acceptance[name] = [a + y - x for a, x, y in zip(acceptance[name], before, after)]
            for c in levels:
                for name in order:
                    results.setdefault((f"c{c}", name), []).append(run_concurrent(engines[name], mixed[c],
                                                                                  params[c], c))
            click.echo(f"round {r + 1}/{rounds} done", err=True)
    finally:
        for llm in engines.values():
            llm.shutdown()
    report = summarize(results, acceptance, names)
    click.echo(format_report(report, names))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=2)


def summarize(results: dict[tuple[str, str], list[Run]], acceptance: dict[str, list[int]], names: list[str]) -> dict:
    report: dict = {"workloads": {}, "acceptance": {}}
    for (workload, name), runs in results.items():
        base = results[(workload, "none")]
        rate = statistics.median(run.rate for run in runs)
        entry = {"tok_per_s": rate, "ratio": rate / statistics.median(run.rate for run in base),
                 "rounds": [run.rate for run in runs]}
        if runs[0].outputs:
            entry["identical_outputs"] = all(run.outputs == b.outputs for run, b in zip(runs, base))
        report["workloads"].setdefault(workload, {})[name] = entry
    for name, (drafts, draft_tokens, accepted) in acceptance.items():
        if drafts:
            report["acceptance"][name] = {"acceptance_rate": accepted / draft_tokens,
                                          "acceptance_length": 1 + accepted / drafts}
    return report


def format_report(report: dict, names: list[str]) -> str:
    lines = [f"{'workload':<10}" + "".join(f"{name:>26}" for name in names)]
    for workload, by_name in report["workloads"].items():
        cells = []
        for name in names:
            e = by_name[name]
            same = "" if "identical_outputs" not in e or name == "none" else (" =" if e["identical_outputs"] else " !=")
            cells.append(f"{e['tok_per_s']:9.1f} tok/s {e['ratio']:5.2f}x{same:>3}")
        lines.append(f"{workload:<10}" + "".join(f"{c:>26}" for c in cells))
    for name, a in report["acceptance"].items():
        lines.append(f"{name}: acceptance rate {100 * a['acceptance_rate']:.1f}%, "
                     f"mean acceptance length {a['acceptance_length']:.2f} (batch-1 workloads)")
    lines.append("(copy/open: batch-1 decode tok/s; cN: output tok/s at N in flight; '=': greedy outputs equal "
                 "the baseline's in every round)")
    return "\n".join(lines)


if __name__ == "__main__":
    cli()
