"""Every generating API takes the one path: chat completions, Messages and Responses requests are prepared
by the one chat preparation (ChatPreparation.prepare), and all four APIs (completions too, which has no
messages) run through the one runner (Run.respond, then the engine), streamed and whole; the fake engine
receives exactly the prompt and params that were prepared."""

from __future__ import annotations

import pytest

from frontend.chat.preparation import ChatPreparation
from frontend.runner import Run

MESSAGES = [{"role": "user", "content": "Say hi."}]
REQUESTS = {   # path -> (body, the Wire its runner writes with, prepared by the chat preparation?)
    "/v1/chat/completions": ({"model": "tiny", "messages": MESSAGES, "max_tokens": 4}, "ChatCompletionWire", True),
    "/v1/completions": ({"model": "tiny", "prompt": "Say hi.", "max_tokens": 4}, "CompletionWire", False),
    "/v1/messages": ({"model": "tiny", "messages": MESSAGES, "max_tokens": 4}, "MessagesWire", True),
    "/v1/responses": ({"model": "tiny", "input": "Say hi.", "max_output_tokens": 4}, "ResponsesWire", True),
}


@pytest.fixture
def spied(monkeypatch):
    """Records each call of the chat preparation (its result) and of the runner (its Run, Wire and mode)."""
    prepared, runs = [], []
    prepare, respond = ChatPreparation.prepare, Run.respond

    async def prepare_spy(self, chat, **kwargs):
        result = await prepare(self, chat, **kwargs)
        prepared.append(result)
        return result

    def respond_spy(self, wire, stream):
        runs.append((self, type(wire).__name__, stream))
        return respond(self, wire, stream)

    monkeypatch.setattr(ChatPreparation, "prepare", prepare_spy)
    monkeypatch.setattr(Run, "respond", respond_spy)
    return prepared, runs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", list(REQUESTS))
def test_each_api_goes_through_the_one_preparation_and_the_one_runner(served, http, spied, path, stream):
    _, fake = served
    prepared, runs = spied
    body, wire, chat = REQUESTS[path]
    submitted = len(fake.submitted)
    response = http.post(path, json={**body, "stream": stream})
    assert response.status_code == 200, response.text
    assert len(runs) == 1
    run, wire_name, streamed = runs[0]
    assert (wire_name, streamed) == (wire, stream)
    [(request_id, prompt, params)] = fake.submitted[submitted:]
    assert [c.request_id for c in run.choices] == [request_id]
    assert run.choices[0].num_output_tokens > 0          # the engine's steps came back through the runner
    if chat:
        [one] = prepared                                 # once per request, whatever the API
        assert (prompt, params) == (one.prompt, one.params)
    else:
        assert prepared == []


def test_a_refused_request_is_neither_prepared_nor_run(served, http, spied):
    prepared, runs = spied
    response = http.post("/v1/messages", json={"model": "tiny", "messages": MESSAGES})     # no max_tokens
    assert response.status_code == 400
    assert prepared == [] and runs == []
