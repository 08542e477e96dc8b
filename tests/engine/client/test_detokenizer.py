"""engine/detokenizer.py: incremental text equals the full decode; stop strings across token boundaries."""

from __future__ import annotations

import random

import pytest

from engine.client.detokenizer import Detokenizer, IncrementalDetokenizer, StopStringChecker
from engine.sampling_params import SamplingParams
from tests.conftest import shared_path

MULTILINGUAL = "Hello, 世界! Ça va? 🙂🙃👩‍👩‍👧 καλημέρα — naïve café, 東京タワー 🤖 and \u200b zero-width."


@pytest.fixture(scope="module", params=["qwen3", "llama3"])
def tokenizer(request):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_path("models", "tokenizers", request.param)))


def stream(detok: IncrementalDetokenizer, ids: list[int], step: int = 1) -> str:
    pieces = [detok.push(ids[i:i + step]) for i in range(0, len(ids), step)]
    return "".join(pieces) + detok.flush()


def test_incremental_equals_full_decode_on_random_ids(tokenizer):
    backend = tokenizer.backend_tokenizer
    rng = random.Random(1234)
    vocab = backend.get_vocab_size()
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 48))]
        for skip in (True, False):
            expected = backend.decode(ids, skip_special_tokens=skip)
            assert stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=skip), ids) == expected


def test_multibyte_text_streams_without_replacement_chars(tokenizer):
    ids = tokenizer.backend_tokenizer.encode(MULTILINGUAL, add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([t]) for t in ids]
    assert "".join(pieces) + detok.flush() == MULTILINGUAL
    # Emoji and CJK span several byte-level tokens: partial characters are held back, never sent.
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces


def test_several_tokens_per_step_give_the_same_text(tokenizer):
    ids = tokenizer.backend_tokenizer.encode(MULTILINGUAL, add_special_tokens=False).ids
    assert stream(IncrementalDetokenizer(tokenizer), ids, step=3) == MULTILINGUAL


def test_prompt_context_keeps_the_leading_space(tokenizer):
    prompt = tokenizer.backend_tokenizer.encode("Say hi:", add_special_tokens=False).ids
    output = tokenizer.backend_tokenizer.encode(" hello there", add_special_tokens=False).ids
    assert stream(IncrementalDetokenizer(tokenizer, prompt), output) == " hello there"


def test_skip_special_tokens(tokenizer):
    special = tokenizer.all_special_ids[0]
    text_ids = tokenizer.backend_tokenizer.encode("abc def", add_special_tokens=False).ids
    ids = text_ids[:1] + [special] + text_ids[1:]
    special_text = tokenizer.convert_ids_to_tokens(special)
    assert stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=True), ids) == "abc def"
    shown = stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), ids)
    assert special_text in shown and shown.replace(special_text, "") == "abc def"


def run(detok: Detokenizer, ids: list[int]) -> list[str]:
    out = []
    for i, token in enumerate(ids):
        out.append(detok.update([token], finished=i == len(ids) - 1))
        if detok.finished:
            break
    return out


def test_stop_string_spanning_tokens_is_cut_and_never_sent(tokenizer):
    ids = tokenizer.backend_tokenizer.encode("one two 🙂🙃 three four", add_special_tokens=False).ids
    detok = Detokenizer(tokenizer, SamplingParams(stop=["🙃 thr"]))
    pieces = run(detok, ids)
    assert detok.stop_string == "🙃 thr"
    assert "".join(pieces) == detok.text == "one two 🙂"
    assert not any("🙃" in piece for piece in pieces)


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.backend_tokenizer.encode("alpha beta gamma delta", add_special_tokens=False).ids
    detok = Detokenizer(tokenizer, SamplingParams(stop=["a gam"], include_stop_str_in_output=True))
    assert "".join(run(detok, ids)) == "alpha beta gam"
    assert detok.stop_string == "a gam"


def test_earliest_stop_string_wins(tokenizer):
    ids = tokenizer.backend_tokenizer.encode("x = 1; y = 2; z = 3", add_special_tokens=False).ids
    detok = Detokenizer(tokenizer, SamplingParams(stop=["z =", "; y"]))
    assert "".join(run(detok, ids)) == "x = 1"
    assert detok.stop_string == "; y"


def test_no_stop_match_releases_held_text_at_the_end(tokenizer):
    text = "nothing to see here"
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    detok = Detokenizer(tokenizer, SamplingParams(stop=["absent stop"]))
    pieces = run(detok, ids)
    assert "".join(pieces) == text and detok.stop_string is None
    assert pieces[0] == ""        # held back while it could still begin "absent stop"


def test_min_tokens_defers_stop_strings(tokenizer):
    ids = tokenizer.backend_tokenizer.encode("stop here, stop there", add_special_tokens=False).ids
    n_first = len(tokenizer.backend_tokenizer.encode("stop", add_special_tokens=False).ids)
    detok = Detokenizer(tokenizer, SamplingParams(stop=["stop"], min_tokens=n_first))
    assert "".join(run(detok, ids)) == "stop here, "


def test_a_stop_string_inside_a_run_of_tokens_falls_where_one_token_a_step_puts_it(tokenizer):
    """Speculative decoding hands over several tokens a step: the text, the tokens taken (up to the one that
    completes the stop string) and min_tokens' boundary equal those of one token a step."""
    ids = tokenizer.backend_tokenizer.encode("stop here, and stop there, the end", add_special_tokens=False).ids
    for params in (SamplingParams(stop=["stop t"]), SamplingParams(stop=["stop"], min_tokens=2)):
        one = Detokenizer(tokenizer, params)
        run(one, ids)
        for size in (3, len(ids)):
            many = Detokenizer(tokenizer, params)
            for start in range(0, len(ids), size):
                many.update(ids[start:start + size])
            assert (many.text, many.stop_string, many.num_tokens) == (one.text, one.stop_string, one.num_tokens)
        assert one.stop_string is not None and one.num_tokens < len(ids)


def test_stop_token_is_not_rendered_unless_included(tokenizer):
    ids = tokenizer.backend_tokenizer.encode("end!", add_special_tokens=False).ids
    last = ids[-1]
    detok = Detokenizer(tokenizer, SamplingParams(stop_token_ids=[last]))
    text = "".join(detok.update([t]) for t in ids[:-1]) + detok.update([last], finished=True, stop_terminated=True)
    assert text == tokenizer.backend_tokenizer.decode(ids[:-1])
    detok = Detokenizer(tokenizer, SamplingParams(stop_token_ids=[last], include_stop_str_in_output=True))
    text = "".join(detok.update([t]) for t in ids[:-1]) + detok.update([last], finished=True, stop_terminated=True)
    assert text == "end!"


def feed(checker: StopStringChecker, text: str, sizes) -> tuple[str, str | None]:
    out, matched, i = [], None, 0
    while i < len(text) and matched is None:
        n = next(sizes)
        piece, matched = checker.append(text[i:i + n], final=i + n >= len(text))
        out.append(piece)
        i += n
    return "".join(out), matched


@pytest.mark.parametrize("seed", range(10))
def test_stop_checker_agrees_with_a_plain_search(seed):
    """Fed in random pieces, the checker emits exactly the text before the stop string's first occurrence."""
    rng = random.Random(seed)
    text = "".join(rng.choice("ab c🙂") for _ in range(300))
    stop = "".join(rng.choice("ab c🙂") for _ in range(rng.randint(2, 6)))
    sizes = iter(lambda: rng.randint(1, 5), None)
    out, matched = feed(StopStringChecker([stop]), text, sizes)
    at = text.find(stop)
    assert (out, matched) == ((text[:at], stop) if at != -1 else (text, None))


@pytest.mark.parametrize("seed", range(10))
def test_first_stop_string_to_complete_wins(seed):
    """With several stop strings, the output ends where the first of them is completed (vLLM's rule)."""
    rng = random.Random(seed)
    text = "".join(rng.choice("abc ") for _ in range(200))
    stops = ["".join(rng.choice("abc ") for _ in range(rng.randint(2, 5))) for _ in range(3)]
    ends = [(text.find(s) + len(s), -len(s), s) for s in stops if s in text]
    out, matched = feed(StopStringChecker(stops), text, iter(lambda: 1, None))
    if ends:
        _, _, first = min(ends)
        assert matched == first
        assert out == text[:text.find(first)]
    else:
        assert (out, matched) == (text, None)
