"""`ringserve chat`: a terminal chat with a running OpenAI-compatible server (streams, keeps the history)."""

from __future__ import annotations

import json

import click
import httpx

COMMANDS_HELP = "Commands: /clear forgets the conversation, /exit (or Ctrl-D) quits."


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--url", default="http://127.0.0.1:8000/v1", help="Base URL of the server's OpenAI API.")
@click.option("--model", default=None, help="Model name (default: the server's first model).")
@click.option("--api-key", envvar="RINGSERVE_API_KEY", default=None, help="API key (env RINGSERVE_API_KEY).")
@click.option("--system", "system_prompt", default=None, help="A system message that opens the conversation.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None, help="Sampling temperature.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Most tokens per reply.")
def chat(url: str, model: str | None, api_key: str | None, system_prompt: str | None,
         temperature: float | None, max_tokens: int | None) -> None:
    """Chat with a model served by `ringserve serve` (or any OpenAI-compatible server)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(10, read=None)) as http:
        try:
            model = model or _first_model(http)
        except httpx.HTTPError as e:
            raise click.ClickException(f"cannot reach the server at {url}: {e}") from None
        click.echo(f"Chatting with {model} at {url}. {COMMANDS_HELP}")
        history = [{"role": "system", "content": system_prompt}] if system_prompt else []
        base = history[:]
        while True:
            try:
                line = input("> ")
            except (EOFError, KeyboardInterrupt):
                click.echo()
                return
            if line.strip() in ("/exit", "/quit"):
                return
            if line.strip() == "/clear":
                history = base[:]
                continue
            if not line.strip():
                continue
            history.append({"role": "user", "content": line})
            body = {"model": model, "messages": history, "stream": True}
            if temperature is not None:
                body["temperature"] = temperature
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            try:
                reply = _stream_reply(http, body)
            except (httpx.HTTPError, click.ClickException) as e:
                history.pop()
                click.echo(f"\n[error: {e}]", err=True)
                continue
            history.append({"role": "assistant", "content": reply})


def _first_model(http: httpx.Client) -> str:
    response = http.get("/models")
    _check(response)
    models = response.json().get("data") or []
    if not models:
        raise click.ClickException("the server lists no models; pass --model")
    return models[0]["id"]


def _stream_reply(http: httpx.Client, body: dict) -> str:
    """Print the reply as it streams; return it whole."""
    parts = []
    with http.stream("POST", "/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            _check(response)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise click.ClickException(event["error"].get("message", "the server reported an error"))
            for choice in event.get("choices", ()):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    parts.append(text)
                    click.echo(text, nl=False)
    click.echo()
    return "".join(parts)


def _check(response: httpx.Response) -> None:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise click.ClickException(f"HTTP {response.status_code}: {message}")
