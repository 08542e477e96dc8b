"""`ringserve chat [MODEL]`: a terminal chat with a running OpenAI-compatible server (streams, keeps the history).

At a terminal, the prompt has line editing and history (readline: arrow keys, Ctrl-R; the history is kept
in ~/.cache/ringserve/chat_history). While a reply streams, Ctrl-C stops that reply (the server aborts it;
the part shown stays in the conversation) and the terminal does not echo: what is typed then would land in
the middle of the reply, so it is dropped when the reply ends. At the prompt Ctrl-C clears the line and
Ctrl-D quits. Piped input works too, one message per line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import click
import httpx

from frontend.cli.options import model_argument

HELP = """Commands:
  /help            this list
  /clear           forget the conversation (the system message stays)
  /system TEXT     set the system message; /system shows it, /system - removes it
  /temp T          sample at temperature T (0 is greedy); /temp shows it, /temp - uses the server's default
  /exit            quit (or Ctrl-D)
Keys: arrows and Ctrl-R edit and recall lines; Ctrl-C stops a reply; Ctrl-D quits."""
HISTORY_LINES = 1000


class ChatSession:
    """One conversation: its messages, system message and sampling, and the commands that change them."""

    def __init__(self, http: httpx.Client, model: str, system: str | None, temperature: float | None,
                 max_tokens: int | None) -> None:
        self.http, self.model = http, model
        self.system, self.temperature, self.max_tokens = system, temperature, max_tokens
        self.messages: list[dict] = []

    def command(self, line: str) -> bool:
        """Run a /command; False when it asks to quit."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name in ("/exit", "/quit"):
            return False
        if name == "/help":
            click.echo(HELP)
        elif name == "/clear":
            self.messages = []
            click.echo("[conversation cleared]")
        elif name == "/system":
            if argument:
                self.system = None if argument == "-" else argument
            click.echo(f"[system message: {self.system!r}]" if self.system else "[no system message]")
        elif name == "/temp":
            self._set_temperature(argument)
        else:
            click.echo(f"[unknown command {name}; /help lists them]")
        return True

    def _set_temperature(self, argument: str) -> None:
        if argument == "-":
            self.temperature = None
        elif argument:
            try:
                value = float(argument)
            except ValueError:
                value = -1.0
            if not 0.0 <= value <= 2.0:
                click.echo(f"[temperature must be a number from 0 to 2, not {argument!r}]")
                return
            self.temperature = value
        click.echo("[temperature: the server's default]" if self.temperature is None
                   else f"[temperature: {self.temperature:g}]")

    def ask(self, text: str) -> None:
        """Send one user message and print the reply as it streams (Ctrl-C stops it)."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": system + self.messages, "stream": True}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        parts: list[str] = []
        try:
            with _at_terminal(_quiet_terminal):
                _stream_reply(self.http, body, parts)
        except KeyboardInterrupt:
            click.echo(" [stopped]")
            if not parts:                     # nothing was said: forget the question too
                self.messages.pop()
                return
        except (httpx.HTTPError, click.ClickException) as e:
            self.messages.pop()
            click.echo(f"\n[error: {e}]", err=True)
            return
        self.messages.append({"role": "assistant", "content": "".join(parts)})


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@model_argument(default=None, help="The served model's name (default: the server's first model).")
@click.option("--url", default="http://127.0.0.1:8000/v1", help="Base URL of the server's OpenAI API.")
@click.option("--api-key", envvar="RINGSERVE_API_KEY", default=None, help="API key (env RINGSERVE_API_KEY).")
@click.option("--system", "system_prompt", default=None, help="A system message that opens the conversation.")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None,
              help="Sampling temperature (default: the server's).")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Most tokens per reply.")
def chat(model: str | None, url: str, api_key: str | None, system_prompt: str | None,
         temperature: float | None, max_tokens: int | None) -> None:
    """Chat with a model served by `ringserve serve` (or any OpenAI-compatible server); /help lists commands."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=httpx.Timeout(10, read=None)) as http:
        try:
            model = model or _first_model(http)
        except httpx.HTTPError as e:
            raise click.ClickException(f"cannot reach the server at {url}: {e}") from None
        click.echo(f"Chatting with {model} at {url}. /help lists the commands; Ctrl-C stops a reply, Ctrl-D quits.")
        if sys.stdin.isatty():
            # Ctrl-C is this program's stop key: started from a shell's background job or a wrapper that
            # ignores SIGINT, Python would inherit the ignore and a reply could not be stopped
            signal.signal(signal.SIGINT, signal.default_int_handler)
        session = ChatSession(http, model, system_prompt, temperature, max_tokens)
        with _at_terminal(_line_history):
            while True:
                try:
                    line = input("> ").strip()
                except EOFError:
                    click.echo()
                    return
                except KeyboardInterrupt:         # as in Python's prompt: drop the line, ask again
                    click.echo()
                    continue
                if line.startswith("/"):
                    if not session.command(line):
                        return
                elif line:
                    session.ask(line)


def _at_terminal(manager):
    """`manager()` when the input is a terminal; nothing otherwise (piped input has no line editing and no
    terminal modes)."""
    return manager() if sys.stdin.isatty() else contextlib.nullcontext()


@contextlib.contextmanager
def _line_history():
    """readline's editing and history (imported only at a terminal: it may write escape codes)."""
    import readline

    path = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ringserve",
                        "chat_history")
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(HISTORY_LINES)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            readline.write_history_file(path)


@contextlib.contextmanager
def _quiet_terminal():
    """No echo while a reply streams; what was typed meanwhile is discarded at its end."""
    import termios

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    quiet = termios.tcgetattr(fd)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcflush(fd, termios.TCIFLUSH)
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _first_model(http: httpx.Client) -> str:
    response = http.get("/models")
    _check(response)
    models = response.json().get("data") or []
    if not models:
        raise click.ClickException("the server lists no models; pass MODEL")
    return models[0]["id"]


def _stream_reply(http: httpx.Client, body: dict, parts: list[str]) -> None:
    """Print the reply as it streams, collecting its text into `parts` (complete up to an interruption)."""
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


def _check(response: httpx.Response) -> None:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise click.ClickException(f"HTTP {response.status_code}: {message}")
