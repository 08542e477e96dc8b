"""Synthetic prompts for `ringserve bench serve`: the `random`, `prefix`, `prefix_repetition` and `sentences`
datasets.

A prompt is built from random token ids decoded to text. Decoding then re-encoding random ids rarely gives
the same number of tokens back (byte-level BPE merges and splits across the seams), so the text is
re-tokenized and the token list trimmed or extended until the text really encodes to the asked length,
as vLLM's random dataset does. Lengths count what the server sees: the tokenizer's own special tokens
(a BOS, say) are part of the asked input length.

The `prefix` dataset puts one shared prefix of `prefix_len` tokens in front of every prompt, to exercise
prefix caching. The prefix text is fixed once and only the suffix is adjusted, so every prompt starts
with the very same characters and (redrawing a suffix that would merge across the seam) the very same
prefix_len tokens.

The `prefix_repetition` dataset (vLLM's name) is the scale-out workload: `num_prefixes` different prefixes
of `prefix_len` tokens, each shared by num_requests / num_prefixes prompts with their own random suffix,
in shuffled order. It is what prefix-aware routing across replicas or data-parallel engines is for: a
request hits the cache only on an engine that already ran its prefix.

The `sentences` dataset is for embedding servers: one short sentence per request, deterministic words of the
tokenizer's whole-word vocabulary (about 14 words, as STS-style sentences), the ones `ringserve bench embed`
embeds offline.
The `code` dataset is copy-heavy (speculative decoding's workload, like InstructCoder's code edits): each
prompt asks to repeat, or lightly edit, a stretch of real code read at run time from the Python standard
library's own source files (every machine that runs this has them); `open_prompts` are the opposite, open
questions with nothing to copy.
"""

from __future__ import annotations

import math
import os
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass

import numpy as np

DATASETS = ("random", "prefix", "prefix_repetition", "sentences", "code")
# stdlib modules whose source the code dataset quotes (plain Python, stable across versions)
CODE_MODULES = ("textwrap.py", "json/encoder.py", "shlex.py", "fnmatch.py", "heapq.py", "bisect.py",
                "string.py", "calendar.py", "colorsys.py", "queue.py", "sched.py", "graphlib.py")
CODE_TASKS = (
    "Repeat the following Python code exactly, without any change:",
    "Rewrite the following Python code, renaming the variable `{old}` to `{new}`. Output the whole code:",
    "Add a one-line comment above the first line of the following Python code and output the whole code:",
)
OPEN_TOPICS = ("a lighthouse keeper", "the history of tea", "why the sky is blue", "a city on Mars",
               "how bees talk", "the first winter of a young fox", "a forgotten library", "learning to sail",
               "the life of a river", "a robot that paints", "an old clock", "the night market")
OPEN_TASKS = ("Write a short story about {topic}.", "Explain {topic} to a curious child.",
              "Write a poem about {topic}.", "Describe {topic} in vivid detail.")
MAX_FIT_ROUNDS = 10
WORDS_MEAN, WORDS_SD = 14, 6        # words per sentence


@dataclass(slots=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens as the server counts them (with the tokenizer's special tokens)
    expected_output_len: int  # the request's max_tokens


def length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    """The inclusive [low, high] that vLLM samples a length from: mean * (1 -/+ range_ratio)."""
    return math.floor(mean * (1.0 - range_ratio)), math.ceil(mean * (1.0 + range_ratio))


def sample_requests(
    tokenizer,
    num_requests: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
) -> list[SampleRequest]:
    """`num_requests` prompts of prefix_len + U[input_len range] tokens, each asking for U[output_len range].

    Input lengths are drawn around input_len minus the tokenizer's special tokens (so the server sees
    prefix_len + input_len on average); output lengths are at least 1.
    """
    if num_requests < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_requests}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"random_range_ratio must be in [0, 1), got {range_ratio}")
    if input_len < 0 or output_len < 1 or prefix_len < 0:
        raise ValueError(
            f"need random_input_len >= 0, random_output_len >= 1 and prefix_len >= 0; "
            f"got {input_len}, {output_len} and {prefix_len}"
        )
    num_special = int(tokenizer.num_special_tokens_to_add())
    input_low, input_high = length_range(max(0, input_len - num_special), range_ratio)
    output_low, output_high = length_range(output_len, range_ratio)
    output_low = max(output_low, 1)
    if prefix_len + input_low < 1:
        raise ValueError(
            f"random_input_len {input_len} leaves no prompt tokens (the tokenizer adds {num_special} "
            f"special tokens, range ratio {range_ratio}); ask for more input tokens"
        )

    rng = np.random.default_rng(seed)
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    allowed = np.setdiff1d(np.arange(tokenizer.vocab_size), tokenizer.all_special_ids)

    prefix_text, prefix_ids = "", []
    if prefix_len:
        prefix_text, prefix_ids = fit_prompt(
            tokenizer, "", _random_ids(rng, allowed, prefix_len), prefix_len, rng, allowed
        )

    requests = []
    for n_in, n_out in zip(input_lens.tolist(), output_lens.tolist(), strict=True):
        # a suffix whose first token merges with the prefix's last would share one token less: redraw it
        for _ in range(MAX_FIT_ROUNDS):
            text, ids = fit_prompt(
                tokenizer, prefix_text, _random_ids(rng, allowed, n_in), prefix_len + n_in, rng, allowed
            )
            if ids[:prefix_len] == prefix_ids:
                break
        requests.append(
            SampleRequest(prompt=text, prompt_len=len(ids) + num_special, expected_output_len=n_out)
        )
    return requests


def sample_prefix_repetition(
    tokenizer,
    num_requests: int,
    num_prefixes: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    seed: int = 0,
) -> list[SampleRequest]:
    """num_prefixes groups of num_requests // num_prefixes prompts (prefix_len shared tokens + suffix_len
    own tokens, plus the tokenizer's special tokens), shuffled; each asks for output_len tokens."""
    if num_prefixes < 1 or num_requests < num_prefixes or prefix_len < 1 or suffix_len < 1 or output_len < 1:
        raise ValueError(
            f"prefix_repetition needs num_prefixes >= 1, num_prompts >= num_prefixes and prefix_len, "
            f"input_len (the suffix) and output_len >= 1; got {num_prefixes}, {num_requests}, {prefix_len}, "
            f"{suffix_len} and {output_len}"
        )
    num_special = int(tokenizer.num_special_tokens_to_add())
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(tokenizer.vocab_size), tokenizer.all_special_ids)
    requests = []
    for _ in range(num_prefixes):
        prefix_text, prefix_ids = fit_prompt(
            tokenizer, "", _random_ids(rng, allowed, prefix_len), prefix_len, rng, allowed
        )
        for _ in range(num_requests // num_prefixes):
            for _ in range(MAX_FIT_ROUNDS):
                text, ids = fit_prompt(
                    tokenizer, prefix_text, _random_ids(rng, allowed, suffix_len), prefix_len + suffix_len,
                    rng, allowed,
                )
                if ids[:prefix_len] == prefix_ids:
                    break
            requests.append(
                SampleRequest(prompt=text, prompt_len=len(ids) + num_special, expected_output_len=output_len)
            )
    order = rng.permutation(len(requests))
    return [requests[i] for i in order]


def fit_prompt(
    tokenizer,
    head: str,
    suffix_ids: list[int],
    target_len: int,
    rng: np.random.Generator,
    allowed: np.ndarray,
) -> tuple[str, list[int]]:
    """head + decode(suffix_ids), with the suffix trimmed or extended until the whole text encodes to
    target_len tokens (without special tokens). Returns the text and its token ids, which after
    MAX_FIT_ROUNDS may still miss the target by a token or two on adversarial tokenizers."""
    for _ in range(MAX_FIT_ROUNDS):
        text = head + tokenizer.decode(suffix_ids)
        ids = tokenizer.encode(text, add_special_tokens=False)
        excess = len(ids) - target_len
        if excess == 0:
            break
        if excess > 0:
            suffix_ids = suffix_ids[: max(0, len(suffix_ids) - excess)]
        else:
            suffix_ids = suffix_ids + _random_ids(rng, allowed, -excess)
    return text, ids


def _random_ids(rng: np.random.Generator, allowed: np.ndarray, n: int) -> list[int]:
    return allowed[rng.integers(0, len(allowed), size=n)].tolist()


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


def sample_sentences(tokenizer, num_requests: int, seed: int = 0) -> list[SampleRequest]:
    """One sentence per request (make_sentences), its length as a server counts it (with special tokens)."""
    if num_requests < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_requests}")
    sentences = make_sentences(tokenizer, num_requests, seed)
    lengths = [len(ids) for ids in tokenizer(sentences)["input_ids"]]
    return [SampleRequest(prompt=s, prompt_len=n, expected_output_len=0) for s, n in zip(sentences, lengths)]


def stdlib_code_snippets(num: int, seed: int = 0, lines: int = 30) -> list[str]:
    """`num` stretches of about `lines` lines of the standard library's own Python source, each starting at
    a top-level or method definition, from CODE_MODULES (read now, from this interpreter's stdlib)."""
    root = sysconfig.get_paths()["stdlib"]
    starts: list[tuple[list[str], int]] = []
    for name in CODE_MODULES:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read().splitlines()
        starts += [(text, i) for i, line in enumerate(text) if re.match(r"\s{0,4}def \w+\(", line)]
    if not starts:
        raise ValueError(f"no Python source found under {root} for the code dataset")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(starts), size=num, replace=num > len(starts))
    return [textwrap.dedent("\n".join(starts[i][0][starts[i][1]:starts[i][1] + lines])).rstrip()
            for i in picks.tolist()]


def code_prompts(num: int, seed: int = 0, lines: int = 30) -> list[str]:
    """Instructions to repeat or lightly edit stdlib code (one of CODE_TASKS each), code appended."""
    rng = np.random.default_rng([seed, 2])
    prompts = []
    for snippet in stdlib_code_snippets(num, seed, lines):
        names = sorted(set(re.findall(r"\b([a-z_][a-z0-9_]{2,})\s*=", snippet))) or ["result"]
        old = names[int(rng.integers(len(names)))]
        task = CODE_TASKS[int(rng.integers(len(CODE_TASKS)))].format(old=old, new=old + "_value")
        prompts.append(f"{task}\n\n```python\n{snippet}\n```")
    return prompts


def open_prompts(num: int, seed: int = 0) -> list[str]:
    """Open-ended requests with nothing in them to copy."""
    rng = np.random.default_rng([seed, 3])
    return [OPEN_TASKS[int(rng.integers(len(OPEN_TASKS)))].format(topic=OPEN_TOPICS[int(rng.integers(len(OPEN_TOPICS)))])
            for _ in range(num)]


def sample_code_requests(tokenizer, num_requests: int, output_len: int, seed: int = 0) -> list[SampleRequest]:
    """The `code` dataset for `bench serve`: code_prompts asking for up to output_len tokens each."""
    if num_requests < 1 or output_len < 1:
        raise ValueError(f"the code dataset needs num_prompts >= 1 and output_len >= 1, got {num_requests}, "
                         f"{output_len}")
    return [SampleRequest(prompt=text, prompt_len=len(tokenizer.encode(text)), expected_output_len=output_len)
            for text in code_prompts(num_requests, seed)]
