"""`ringserve generate`: offline generation through `LLM`, prompts from the arguments or stdin."""

from __future__ import annotations

import json
import sys

import click

from engine.config import ConfigError
from frontend.cli.options import MODEL_HELP, engine_config, engine_options, model_or_default


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("prompts", nargs=-1)
@click.option("--model", default="", help=MODEL_HELP)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, help="Tokens to generate per prompt.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="Sampling temperature (default: the model's generation_config, else 1.0; 0 is greedy).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None)
@click.option("--top-k", type=click.IntRange(min=-1), default=None)
@click.option("--n", type=click.IntRange(1, 128), default=1, help="Completions per prompt.")
@click.option("--sampling-seed", type=int, default=None, help="Seed of each request's sampling.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Generate max_tokens even past EOS.")
@click.option("--chat", is_flag=True, help="Wrap each prompt as a user message in the chat template.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per completion instead of text.")
@engine_options
def generate(prompts, model, max_tokens, temperature, top_p, top_k, n, sampling_seed, stop, ignore_eos, chat,
             as_json, **options) -> None:
    """Generate completions for PROMPTS (or for each line of stdin when none are given)."""
    from engine import LLM, SamplingParams

    if not prompts:
        prompts = tuple(line.rstrip("\n") for line in sys.stdin if line.strip())
    if not prompts:
        raise click.UsageError("no prompts: pass them as arguments or one per line on stdin")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, n=n,
                                seed=sampling_seed, stop=list(stop), ignore_eos=ignore_eos)
        llm = LLM.from_config(engine_config(model_or_default(model), options))
    except (ConfigError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    try:
        if chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
        else:
            outputs = llm.generate(list(prompts), params, use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, output in zip(prompts, outputs):
        for completion in output.outputs:
            if as_json:
                click.echo(json.dumps({"prompt": prompt, "index": completion.index, "text": completion.text,
                                       "token_ids": completion.token_ids,
                                       "finish_reason": completion.finish_reason}))
            else:
                click.echo(f"{prompt}{completion.text}")
