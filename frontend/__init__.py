"""The frontend process: the HTTP server and the `ringserve` command line (`cli/`). It holds an engine client
(engine/client, the face `AsyncEngine`) and reaches the engine through it alone.

A request's walk: `app.py` routes it to its API package (`openai/`, `anthropic/`, `responses/`, `ollama/`), whose
handler reads and checks it with the handler base (`serving_engine.py`, tokenizing in `prompts.py`). The
chat APIs translate their request into a chat request and prepare it with the one chat preparation
(`chat/preparation.py`: template, tools, reasoning, grammar). The handler base makes the request's choices
(`choices.py`: one engine request each) and `runner.py` runs them against the engine as typed steps, which
the API's Wire writes as SSE frames or one JSON body (`http_responses.py`). At the root besides: the server
(`server.py`, `startup.py`), `config.py`, `errors.py`, `middleware.py`, `metrics.py`, `openapi.py`; the chat
page's static files in `web/`.
"""

from __future__ import annotations


def version() -> str:
    """ringserve's installed version ('0+unknown' when run from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version("ringserve")
    except PackageNotFoundError:
        return "0+unknown"
