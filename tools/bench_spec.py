"""`ringserve bench spec`: speculative decoding against the same engine without it, side by side.

Engines (one without speculation, one per method) are started once and driven in alternating rounds
through the offline engine client, so every figure is a median over rounds taken under the same load. Each
round brings new prompts (the same for every engine), so that no engine sees a request twice.
Workloads:
  copy   batch 1, the `code` prompts of tools.bench_datasets (repeat or lightly edit stdlib code): decode
         tokens/s (first to last token of each request), and whether greedy outputs equal the baseline's;
  open   batch 1, open questions with nothing to copy, sampled (temperature 1, a seed per request): the same
         figures; a seeded request draws from the same uniform numbers with or without drafts, so the share
         of outputs equal to the baseline's is reported too (exact arithmetic would make it 1; the last-bit
         differences of a verify step's logits move some draws in a flat tail to a neighbouring token);
  cN     N requests in flight (--requests-per-slot x N in all), copy and open prompts alternating: output
         tokens/s.

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
@click.option("--extra-config", default="{}", help="JSON merged into every method's speculative config, "
              "e.g. '{\"min_acceptance_rate\": 0.3}'.")
@click.option("--num-prompts", type=int, default=6, help="Prompts per batch-1 workload.")
@click.option("--output-len", type=int, default=256, help="max_tokens of each request (greedy, EOS stops).")
@click.option("--concurrency", default="8,16", help="Concurrent mixed workloads ('' for none).")
@click.option("--requests-per-slot", type=int, default=2, help="cN sends this many times N requests.")
@click.option("--workloads", default="copy,open", help="Batch-1 workloads ('' for none).")
@click.option("--rounds", type=int, default=3)
@click.option("--seed", type=int, default=0)
@click.option("--cpu-threads", type=int, default=None,
              help="Threads of each engine's executor (default: all cores; 1 keeps a shared machine's load from "
                   "stalling OpenMP barriers, which would flatter the engine that takes fewer steps).")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Write every figure here.")
def cli(model, methods, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, disable_by_batch_size,
        extra_config, num_prompts, output_len, concurrency, requests_per_slot, workloads, rounds, seed, cpu_threads,
        json_out) -> None:
    """Speculative decoding (ngram, suffix) against no speculation on copy-heavy and open prompts."""
    from engine import LLM, SamplingParams

    configs: dict[str, dict | None] = {"none": None}
    for method in filter(None, methods.split(",")):
        spec = {"method": method, "num_speculative_tokens": num_speculative_tokens}
        if method == "ngram":
            spec.update(prompt_lookup_max=prompt_lookup_max, prompt_lookup_min=prompt_lookup_min)
        if disable_by_batch_size is not None:
            spec["disable_by_batch_size"] = disable_by_batch_size or None
        configs[method] = {**spec, **json.loads(extra_config)}
    engines = {name: LLM(model, speculative_config=spec, max_model_len=4096, kv_cache_memory=1 << 30, seed=seed,
                         cpu_threads=cpu_threads)
               for name, spec in configs.items()}
    try:
        tokenizer = engines["none"].get_tokenizer()
        levels = [int(c) for c in concurrency.split(",") if c.strip()]
        greedy = SamplingParams(temperature=0.0, max_tokens=output_len)

        def workload_of(name: str | int, r: int) -> tuple[list[list[int]], list]:
            """Round r's prompts and params (r = -1: the warm-up's): new prompts every round, so that no
            engine meets a request again (suffix decoding's cache of finished outputs would otherwise replay
            the last round's). `name` is a batch-1 workload or a concurrency level."""
            salt = seed + 1000 * (r + 1)
            if name in ("copy", "open"):
                texts = code_prompts(num_prompts, salt) if name == "copy" else open_prompts(num_prompts, salt)
                params = [greedy if name == "copy" else SamplingParams(temperature=1.0, seed=salt + i,
                                                                       max_tokens=output_len)
                          for i in range(num_prompts)]
                return chat_token_ids(tokenizer, texts), params
            n = requests_per_slot * name           # copy (greedy) and open (sampled) prompts alternating
            texts = [p for pair in zip(code_prompts(n, salt + n), open_prompts(n, salt + n)) for p in pair][:n]
            params = [greedy if i % 2 == 0 else SamplingParams(temperature=1.0, seed=salt + i, max_tokens=output_len)
                      for i in range(n)]
            return chat_token_ids(tokenizer, texts), params

        warm_up = workload_of("copy", -1)[0][:2]
        for llm in engines.values():          # warm up: kernels built, caches touched, greedy and sampled
            run_serial(llm, warm_up, [SamplingParams(temperature=0.0, max_tokens=16),
                                      SamplingParams(temperature=1.0, seed=seed, max_tokens=16)])
        names = list(engines)
        results: dict[tuple[str, str], list[Run]] = {}
        acceptance: dict[tuple[str, str], list[int]] = {}     # (workload, method): drafts, tokens, accepted
        def measure(workload: str, name: str, run, *args) -> None:
            before = spec_stats(engines[name])
            results.setdefault((workload, name), []).append(run(engines[name], *args))
            after = spec_stats(engines[name])
            total = acceptance.get((workload, name), [0, 0, 0])
            acceptance[(workload, name)] = [a + y - x for a, x, y in zip(total, before, after)]

        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for workload in filter(None, workloads.split(",")):
                prompts, params = workload_of(workload, r)
                for name in order:
                    measure(workload, name, run_serial, prompts, params)
            for c in levels:
                prompts, params = workload_of(c, r)
                for name in order:
                    measure(f"c{c}", name, run_concurrent, prompts, params, c)
            click.echo(f"round {r + 1}/{rounds} done", err=True)
            if json_out:                      # each round's figures so far, should a later one not finish
                with open(json_out, "w") as f:
                    json.dump(summarize(results, acceptance, names), f, indent=2)
    finally:
        for llm in engines.values():
            llm.shutdown()
    click.echo(format_report(summarize(results, acceptance, names), names))


def summarize(results: dict[tuple[str, str], list[Run]], acceptance: dict[tuple[str, str], list[int]],
              names: list[str]) -> dict:
    report: dict = {"workloads": {}, "acceptance": {}}
    for (workload, name), runs in results.items():
        base = results[(workload, "none")]
        rate = statistics.median(run.rate for run in runs)
        entry = {"tok_per_s": rate, "ratio": rate / statistics.median(run.rate for run in base),
                 "rounds": [run.rate for run in runs]}
        if runs[0].outputs:
            pairs = [(a, b) for run, other in zip(runs, base) for a, b in zip(run.outputs, other.outputs)]
            entry["identical_outputs"] = sum(a == b for a, b in pairs) / len(pairs)
        report["workloads"].setdefault(workload, {})[name] = entry
    for (workload, name), (drafts, draft_tokens, accepted) in acceptance.items():
        if drafts:
            report["acceptance"][f"{workload} {name}"] = {"acceptance_rate": accepted / draft_tokens,
                                                          "acceptance_length": 1 + accepted / drafts,
                                                          "drafts": drafts}
    return report


def format_report(report: dict, names: list[str]) -> str:
    lines = [f"{'workload':<10}" + "".join(f"{name:>26}" for name in names)]
    for workload, by_name in report["workloads"].items():
        cells = []
        for name in names:
            e = by_name[name]
            same = "" if "identical_outputs" not in e or name == "none" else f" {100 * e['identical_outputs']:.0f}%"
            cells.append(f"{e['tok_per_s']:8.1f} tok/s {e['ratio']:5.2f}x{same:>5}")
        lines.append(f"{workload:<10}" + "".join(f"{c:>26}" for c in cells))
    for name, a in report["acceptance"].items():
        lines.append(f"{name}: acceptance rate {100 * a['acceptance_rate']:.1f}%, "
                     f"mean acceptance length {a['acceptance_length']:.2f} over {a['drafts']} verify steps")
    lines.append("(copy/open: batch-1 decode tok/s, medians of the rounds, and the share of outputs equal to the "
                 "baseline's; cN: output tok/s at N in flight)")
    return "\n".join(lines)


if __name__ == "__main__":
    cli()
