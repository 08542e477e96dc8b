"""The server through the official openai client, over a FakeEngine (greedy output spells SCRIPT)."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.hostile import wait_for
from tests.frontend.fake_engine import SCRIPT


def test_completion(client, served):
    _, fake = served
    result = client.completions.create(model="tiny", prompt="Hello", max_tokens=12, temperature=0)
    choice = result.choices[0]
    assert choice.text == SCRIPT[:12]
    assert choice.finish_reason == "length"
    assert result.usage.prompt_tokens == 5 and result.usage.completion_tokens == 12
    assert result.usage.total_tokens == 17
    request_id, prompt, params = fake.submitted[-1]
    assert prompt == list(b"Hello") and params.max_tokens == 12 and params.temperature == 0


def test_completion_stream_with_usage(client):
    chunks = list(client.completions.create(model="tiny", prompt="Hi", max_tokens=9, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == SCRIPT[:9]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat(client):
    result = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_completion_tokens=10, temperature=0)
    assert result.choices[0].message.role == "assistant"
    assert result.choices[0].message.content == SCRIPT[:10]
    assert result.object == "chat.completion"
    # the tiny ChatML template: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" is 3 + 5 + 3 + ... tokens
    assert result.usage.prompt_tokens == 3 + len(b"user\nhi") + len(b"\n") + len(b"assistant\n")


def test_chat_stream(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=7, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == SCRIPT[:7]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]


def test_n_choices_are_indexed_and_seeded_apart(client, served):
    _, fake = served
    result = client.completions.create(model="tiny", prompt="x", max_tokens=20, n=3, seed=7, temperature=1)
    assert sorted(c.index for c in result.choices) == [0, 1, 2]
    assert len({c.text for c in result.choices}) == 3
    seeds = sorted(params.seed for _, _, params in fake.submitted[-3:])
    assert seeds == [7, 8, 9]
    assert result.usage.completion_tokens == 60 and result.usage.prompt_tokens == 1


def test_n_streaming_gives_one_finish_per_choice(client):
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=5, n=2, temperature=0, stream=True))
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length")]
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == index)
        assert text == SCRIPT[:5]


def test_seed_reproduces_sampled_output(client):
    def sample(seed):
        return client.completions.create(model="tiny", prompt="x", max_tokens=30, seed=seed,
                                         temperature=1).choices[0].text
    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_stop_string_ends_the_choice_and_aborts_the_engine_request(client, served):
    server, fake = served
    result = client.completions.create(model="tiny", prompt="x", max_tokens=40, temperature=0, stop=["fox"])
    choice = result.choices[0]
    assert choice.text == "The quick brown "
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == "fox"
    # the abort runs on the server's loop and may land just after the response (CI once read it before)
    request_id = server.call(lambda: fake.submitted[-1][0])
    assert wait_for(lambda: request_id in server.call(lambda: list(fake.aborted)))


def test_stop_string_in_a_stream_is_never_sent(client):
    chunks = list(client.completions.create(model="tiny", prompt="x", max_tokens=40, temperature=0,
                                            stop=["brown fox"], stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "The quick "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_include_stop_str_in_output(client):
    result = client.completions.create(model="tiny", prompt="x", max_tokens=40, temperature=0, stop=["quick"],
                                       extra_body={"include_stop_str_in_output": True})
    assert result.choices[0].text == "The quick"


def test_eos_finishes_with_stop_and_is_not_rendered(client, served):
    server, fake = served
    server.call(setattr, fake, "eos_after", 4)
    try:
        result = client.completions.create(model="tiny", prompt="x", max_tokens=30, temperature=0)
        assert result.choices[0].text == SCRIPT[:4] and result.choices[0].finish_reason == "stop"
        assert result.usage.completion_tokens == 5      # the EOS token counts, as in vLLM
        longer = client.completions.create(model="tiny", prompt="x", max_tokens=30, temperature=0,
                                           extra_body={"min_tokens": 8})
        assert longer.choices[0].text == SCRIPT[:8]
        ignored = client.completions.create(model="tiny", prompt="x", max_tokens=12, temperature=0,
                                            extra_body={"ignore_eos": True})
        assert ignored.choices[0].finish_reason == "length"
    finally:
        server.call(setattr, fake, "eos_after", None)


def test_stop_token_ids(client):
    stop_id = ord("k")
    result = client.completions.create(model="tiny", prompt="x", max_tokens=30, temperature=0,
                                       extra_body={"stop_token_ids": [stop_id]})
    assert result.choices[0].text == "The quic"
    assert result.choices[0].finish_reason == "stop" and result.choices[0].model_extra["stop_reason"] == stop_id


def test_completion_logprobs(client):
    result = client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=0, logprobs=2)
    lp = result.choices[0].logprobs
    assert lp.tokens == list(SCRIPT[:4])
    assert lp.token_logprobs == [pytest.approx(-0.1)] * 4
    assert all(len(top) >= 2 and top[tok] == pytest.approx(-0.1) for top, tok in zip(lp.top_logprobs, lp.tokens, strict=True))
    assert lp.text_offset == [0, 1, 2, 3]


def test_chat_logprobs_streamed(client):
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=0, stream=True,
        logprobs=True, top_logprobs=3))
    content = [entry for c in chunks if c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    assert [e.token for e in content] == list(SCRIPT[:3])
    assert all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token for e in content)
    assert all(e.bytes == list(e.token.encode()) for e in content)


def test_echo_with_logprobs(client):
    result = client.completions.create(model="tiny", prompt="ab", max_tokens=3, temperature=0, echo=True,
                                       logprobs=1)
    choice = result.choices[0]
    assert choice.text == "ab" + SCRIPT[:3]
    assert choice.logprobs.tokens == ["a", "b", *SCRIPT[:3]]
    assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
    assert choice.logprobs.text_offset == [0, 1, 2, 3, 4]


def test_echo_stream_sends_the_prompt_first(client):
    chunks = list(client.completions.create(model="tiny", prompt="ab", max_tokens=3, temperature=0, echo=True,
                                            stream=True))
    assert chunks[0].choices[0].text.startswith("ab")
    assert "".join(c.choices[0].text for c in chunks) == "ab" + SCRIPT[:3]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_prefixes_the_final_assistant_message(client, stream):
    """vLLM's chat echo: continuing an assistant message, the reply starts with that message's text; with
    a final user message there is nothing to echo."""
    def reply(messages, **extra):
        response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0,
                                                  stream=stream, extra_body={"echo": True, **extra})
        if not stream:
            return response.choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in response if c.choices)

    partial = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}]
    continued = reply(partial, add_generation_prompt=False, continue_final_message=True)
    assert continued == "Once" + SCRIPT[:4]
    assert reply([{"role": "user", "content": "hi"}]) == SCRIPT[:4]


def test_token_prompts_and_batches(client):
    result = client.completions.create(model="tiny", prompt=[[104, 105], [111, 107, 33]], max_tokens=2, n=2,
                                       temperature=0)
    assert sorted(c.index for c in result.choices) == [0, 1, 2, 3]
    assert result.usage.prompt_tokens == 5 and result.usage.completion_tokens == 8
    echoed = client.completions.create(model="tiny", prompt=[104, 105], max_tokens=1, temperature=0, echo=True)
    assert echoed.choices[0].text == "hi" + SCRIPT[0]


def test_max_tokens_omitted_is_16_and_null_fills_the_context(client, served):
    _, fake = served
    client.completions.create(model="tiny", prompt="x" * 100, temperature=0)
    assert fake.submitted[-1][2].max_tokens == 16               # OpenAI's and vLLM's default
    client.completions.create(model="tiny", prompt="x" * 500, temperature=0)
    assert fake.submitted[-1][2].max_tokens == 512 - 500        # the default, capped by the context
    client.completions.create(model="tiny", prompt="x" * 100, temperature=0, max_tokens=None)
    assert fake.submitted[-1][2].max_tokens == 512 - 100        # explicit null: what the context allows
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=0)
    assert fake.submitted[-1][2].max_tokens == 512 - len(fake.submitted[-1][1])   # chat keeps its default


def test_context_overflow_is_a_bad_request_naming_the_culprit(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x" * 600, max_tokens=1)
    assert info.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x" * 500, max_tokens=13)
    assert info.value.body["param"] == "max_tokens" and "513 tokens" in info.value.body["message"]


def test_prompt_logprobs_extension(client):
    result = client.completions.create(model="tiny", prompt="abc", max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 1})
    prompt_lp = result.choices[0].model_extra["prompt_logprobs"]
    assert prompt_lp[0] is None
    assert prompt_lp[1][str(ord("b"))]["decoded_token"] == "b" and prompt_lp[1][str(ord("b"))]["rank"] == 1
    assert len(prompt_lp) == 3
