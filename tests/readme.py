"""README.md as the tests read it: its fenced code blocks, its shell commands (line continuations joined,
split as the shell splits them), and the HTTP requests its curl commands make."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from tests.conftest import REPO

SHELLS = ("bash", "sh", "shell", "console")


def readme() -> str:
    return (REPO / "README.md").read_text()


def code_blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    return [body for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
            if language in languages]


def shell_commands(text: str) -> list[list[str]]:
    """Every command of the README's shell blocks as the shell's words (comments dropped, `\\` lines joined,
    a quoted argument may span lines, `&&` chains split)."""
    commands = []
    for block in code_blocks(text, SHELLS):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            pending += line
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:            # an open quote: the argument goes on on the next line
                pending += "\n"
                continue
            pending = ""
            while "&&" in words:
                at = words.index("&&")
                commands.append(words[:at])
                words = words[at + 1:]
            if words:
                commands.append(words)
        if pending:
            raise ValueError(f"a quote opened in this README shell block is never closed: {pending!r}")
    return commands


@dataclass
class CurlRequest:
    url: str
    headers: dict[str, str]
    body: dict | None          # the parsed -d JSON


def curl_requests(text: str) -> list[CurlRequest]:
    """The requests of the README's curl commands; a -d argument that is not JSON raises ValueError."""
    found = []
    for words in shell_commands(text):
        if words[0] != "curl":
            continue
        url, headers, body = None, {}, None
        arguments = iter(words[1:])
        for word in arguments:
            if word in ("-H", "--header"):
                name, _, value = next(arguments).partition(":")
                headers[name.strip().lower()] = value.strip()
            elif word in ("-d", "--data", "--data-raw", "--json"):
                raw = next(arguments)
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise ValueError(f"curl's JSON is not valid ({e}): {raw}") from None
            elif not word.startswith("-"):
                url = word
        found.append(CurlRequest(url if "://" in url else f"http://{url}", headers, body))
    return found
