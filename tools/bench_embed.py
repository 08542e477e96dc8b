"""Offline embedding throughput: `LLM.embed` on N sentences, beside sentence-transformers' `encode`.

The sentences are built deterministically from the model tokenizer's whole-word vocabulary (lengths drawn
around 14 words, as in STS-style benchmark sentences), or read from --sentences-file (one per line). With
--sentence-transformers the same sentences go through `SentenceTransformer(model).encode(batch_size=32)` in
this process on the same number of torch threads as ringserve's executor, runs alternating with ringserve's
(the engine sleeps meanwhile), so that both see the same machine load; the figure is sentences/s, the median
over --repeats, and the ratio of the medians. The lowest cosine between the two engines' vectors is printed as a
check that they computed the same thing.

    ringserve bench embed [--model all-minilm-l6-v2] [--num-sentences 1000] [--sentence-transformers]
    python -m tools.bench_embed ...
"""

from __future__ import annotations

import json
import random
import statistics
import time

import click
import numpy as np

WORDS_MEAN, WORDS_SD = 14, 6


def make_sentences(tokenizer, count: int, seed: int = 0) -> list[str]:
    """`count` sentences of random whole words of the tokenizer's vocabulary (3 or more words each)."""
    words = sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2)
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        n = max(3, int(rng.gauss(WORDS_MEAN, WORDS_SD)))
        sentence = " ".join(rng.choice(words) for _ in range(n))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
    return sentences


def time_ringserve(llm, sentences: list[str]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    outputs = llm.embed(sentences, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return len(sentences) / elapsed, np.array([o.outputs.embedding for o in outputs], dtype=np.float32)


def time_sentence_transformers(model, sentences: list[str], batch_size: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    vectors = model.encode(sentences, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    elapsed = time.perf_counter() - start
    return len(sentences) / elapsed, vectors


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    dots = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(dots.min())


@click.command("embed")
@click.option("--model", default="all-minilm-l6-v2", show_default=True,
              help="An embedding model: a directory, a .zip of one, or all-minilm-l6-v2 (its wheel).")
@click.option("--num-sentences", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--sentences-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Sentences to embed, one per line (default: synthetic sentences from the vocabulary).")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="torch threads of ringserve's executor and of sentence-transformers.")
@click.option("--dtype", default="auto", show_default=True, help="ringserve's --dtype.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="ringserve's token budget per step.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--sentence-transformers", "with_st", is_flag=True,
              help="Also run sentence-transformers' encode on the same sentences and threads, alternating.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="sentence-transformers' encode batch size.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def cli(model: str, num_sentences: int, sentences_file: str | None, threads: int, dtype: str,
        max_num_batched_tokens: int | None, repeats: int, with_st: bool, batch_size: int, seed: int,
        as_json: bool) -> None:
    """Offline embed throughput (sentences/s), optionally beside sentence-transformers on the same threads."""
    import torch

    from engine import LLM

    torch.set_num_threads(threads)
    llm = LLM(model, dtype=dtype, cpu_threads=threads, max_num_batched_tokens=max_num_batched_tokens)
    try:
        if sentences_file:
            with open(sentences_file) as f:
                sentences = [line.strip() for line in f if line.strip()][:num_sentences]
        else:
            sentences = make_sentences(llm.get_tokenizer(), num_sentences, seed)
        st = None
        if with_st:
            from sentence_transformers import SentenceTransformer

            st = SentenceTransformer(llm.config.model, device="cpu")
        time_ringserve(llm, sentences[:64])                       # warm-up: first-call costs are not throughput
        if st is not None:
            time_sentence_transformers(st, sentences[:64], batch_size)
        ours, theirs, cosines = [], [], []
        for _ in range(repeats):
            rate, vectors = time_ringserve(llm, sentences)
            ours.append(rate)
            if st is not None:
                rate, reference = time_sentence_transformers(st, sentences, batch_size)
                theirs.append(rate)
                cosines.append(min_cosine(vectors, reference))
        tokens = sum(len(ids) for ids in llm.get_tokenizer()(sentences)["input_ids"])
    finally:
        llm.shutdown()
    result = {"model": llm.config.model_name, "sentences": len(sentences), "tokens": tokens, "threads": threads,
              "dtype": llm.config.resolved_dtype, "ringserve_sentences_per_s": ours,
              "ringserve_median": statistics.median(ours)}
    if theirs:
        result.update({"sentence_transformers_sentences_per_s": theirs,
                       "sentence_transformers_median": statistics.median(theirs),
                       "ratio_of_medians": statistics.median(ours) / statistics.median(theirs),
                       "min_cosine": min(cosines)})
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{result['sentences']} sentences ({tokens} tokens), {threads} threads, {result['dtype']}")
    click.echo(f"ringserve LLM.embed           {result['ringserve_median']:8.1f} sentences/s  "
               f"(runs: {', '.join(f'{r:.1f}' for r in ours)})")
    if theirs:
        click.echo(f"sentence-transformers encode  {result['sentence_transformers_median']:8.1f} sentences/s  "
                   f"(runs: {', '.join(f'{r:.1f}' for r in theirs)}; batch {batch_size})")
        click.echo(f"ratio (medians)               {result['ratio_of_medians']:8.2f}x   "
                   f"lowest cosine between the two: {result['min_cosine']:.6f}")


if __name__ == "__main__":
    cli()
