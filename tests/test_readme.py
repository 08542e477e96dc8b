"""README.md can be copied from: its shell commands split as the shell splits them, their JSON arguments
parse, no placeholder the shell would misread, inline commands fit on one line, the Python blocks compile,
and every `ringserve` command and flag it shows exists. (tests/e2e/test_smollm2.py sends the README's first
request to a real server.)"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from frontend.cli import main
from tests.readme import code_blocks, curl_requests, readme, shell_commands

ROOT = Path(__file__).resolve().parents[1]

COMMAND_START = re.compile(r"(?:curl|ringserve|pip|python -m) ")


def test_shell_commands_split_and_hold_no_placeholders():
    commands = shell_commands(readme())
    assert len(commands) > 20
    for words in commands:
        odd = [w for w in words if re.fullmatch(r"<[^>]*>|\[.*|.*\]", w) and not re.match(r"\.\[\w", w)]
        assert not odd, f"{' '.join(words)}: {odd} would not paste into a shell as meant"


def test_every_curl_sends_valid_json():
    requests = curl_requests(readme())           # raises, naming the text, on JSON that does not parse
    assert all(r.body is not None for r in requests if r.url.endswith("completions"))
    first = requests[0]
    assert first.url.endswith("/v1/chat/completions")
    assert first.body["messages"][0]["content"] == "What is the capital of France?"


def test_a_json_argument_broken_across_lines_is_caught():
    broken = "```bash\ncurl -s x -d '{\"content\": \"What is the capital of\nFrance?\"}'\n```\n"
    with pytest.raises(ValueError, match="not valid"):
        curl_requests(broken)
    assert curl_requests(broken.replace("of\nFrance", "of France"))[0].body == {
        "content": "What is the capital of France?"}


def test_python_blocks_compile():
    blocks = code_blocks(readme(), ("python",))
    assert blocks
    for block in blocks:
        compile(block, "README.md", "exec")


def test_inline_commands_fit_on_one_line():
    prose = re.sub(r"^```.*?^```", "", readme(), flags=re.S | re.M)
    spans = [s for s in re.findall(r"`([^`]+)`", prose) if COMMAND_START.match(s)]
    assert spans
    wrapped = [s for s in spans if "\n" in s]
    assert not wrapped, f"inline commands that a copy would break: {wrapped}"


def _command(words: list[str]) -> click.Command:
    command, context = main, click.Context(main)
    for word in words[1:]:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        command = command.get_command(context, word)
        assert command is not None, f"`{' '.join(words)}`: no such command {word!r}"
    return command


def _flags(command: click.Command) -> set[str]:
    return {flag for param in command.params for flag in (*param.opts, *param.secondary_opts)} | {"--help"}


def test_ringserve_commands_and_flags_exist():
    for words in shell_commands(readme()):
        if words[0] != "ringserve":
            continue
        command = _command(words)
        unknown = [w.split("=")[0] for w in words if w.startswith("-") and w.split("=")[0] not in _flags(command)]
        assert not unknown, f"`{' '.join(words)}`: unknown flags {unknown}"


def _flag_table(text: str, heading: str) -> set[str]:
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    return set(re.findall(r"`(--[a-z-]+|-[a-z]+)`", table))


def test_the_server_flag_tables_name_real_flags():
    """The README's short table and docs/configuration.md's full one name only real flags, and the full one
    names every flag `ringserve serve` has."""
    real = _flags(_command(["ringserve", "serve"]))
    short = _flag_table(readme(), "### Server flags")
    full = _flag_table((ROOT / "docs" / "configuration.md").read_text(), "## Server flags")
    assert {"--generation-config", "--override-generation-config", "--kv-cache-memory", "--model"} <= short
    assert short - real == set() and full - real == set()
    assert real - full - {"--help", "model"} == set(), sorted(real - full)   # model: the positional MODEL
