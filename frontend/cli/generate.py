"""`ringserve generate`: offline generation through `LLM`, prompts from the arguments or stdin."""

from __future__ import annotations

import json
import sys

import click

from engine.config import ConfigError
from frontend.cli.options import MODEL_HELP, engine_config, engine_options, model_or_default


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("words", nargs=-1, metavar="MODEL [PROMPT]...")
@click.option("--model", default=None, metavar="MODEL",
              help=f"{MODEL_HELP} With --model, every argument is a prompt.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, help="Tokens to generate per prompt.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="Sampling temperature (default: the engine's sampling defaults, see --generation-config; "
                   "0 is greedy).")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None)
@click.option("--top-k", type=click.IntRange(min=-1), default=None)
@click.option("--n", type=click.IntRange(1, 128), default=1, help="Completions per prompt.")
@click.option("--sampling-seed", type=int, default=None, help="Seed of each request's sampling.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Generate max_tokens even past EOS.")
@click.option("--chat", is_flag=True, help="Wrap each prompt as a user message in the chat template.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per completion instead of text.")
@engine_options
def generate(words, model, max_tokens, temperature, top_p, top_k, n, sampling_seed, stop, ignore_eos, chat,
             as_json, **options) -> None:
    """Generate completions with MODEL for each PROMPT (or each line of stdin when none are given).

    MODEL comes first, as in `ringserve serve MODEL` (or give it as --model, and every argument is a prompt).
    Progress goes to stderr; the completions alone to stdout.
    """
    from engine import LLM, SamplingParams
    from frontend.startup import configure_logging, note

    prompts = words if model is not None else words[1:]
    model = model if model is not None else (words[0] if words else "")
    if not prompts:
        prompts = tuple(line.rstrip("\n") for line in sys.stdin if line.strip())
    if not prompts:
        raise click.UsageError("no prompts: pass them after MODEL or one per line on stdin")
    configure_logging("info")
    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, n=n,
                                seed=sampling_seed, stop=list(stop), ignore_eos=ignore_eos)
        config = engine_config(model_or_default(model), options).finalize()
        note("sampling defaults: %s", config.sampling_defaults.describe())
        llm = LLM.from_config(config)
    except (ConfigError, ValueError) as e:
        hint = " (MODEL comes first: ringserve generate MODEL PROMPT...)" if words and model == words[0] else ""
        raise click.UsageError(f"{e}{hint}") from None
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
