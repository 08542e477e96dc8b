"""`ringserve generate`: offline generation from the command line, on the built-in demo model."""

from __future__ import annotations

import json

from click.testing import CliRunner

from frontend.cli import main


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(main, ["generate", "--model", "ringserve-demo", *args], input=input,
                              catch_exceptions=False)


def test_prompts_from_arguments_as_json():
    """MODEL first, then the prompts (as `ringserve serve MODEL`); stdout holds the completions alone."""
    result = CliRunner().invoke(main, ["generate", "ringserve-demo", "Hello", "abc", "--max-tokens", "5",
                                       "--temperature", "0", "--ignore-eos", "--n", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["prompt"], r["index"]) for r in rows] == [("Hello", 0), ("Hello", 1), ("abc", 0), ("abc", 1)]
    assert all(len(r["token_ids"]) == 5 and r["finish_reason"] == "length" for r in rows)
    assert rows[0]["text"] == rows[1]["text"]           # greedy: both samples agree


def test_prompts_from_stdin_with_the_chat_template():
    result = run("--max-tokens", "3", "--ignore-eos", "--chat", "--json", input="first\n\nsecond\n")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]    # the demo's text may hold newlines
    assert [r["prompt"] for r in rows] == ["first", "second"]
    assert all(len(r["token_ids"]) == 3 for r in rows)


def test_user_mistakes_are_one_line_errors():
    result = CliRunner().invoke(main, ["generate", "x", "--model", "/no/such/dir"])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["generate", "x", "--top-p", "0"])
    assert result.exit_code == 2 and "top-p" in result.output
    result = CliRunner().invoke(main, ["generate", "What is the capital of France?"], input="")
    assert result.exit_code == 2 and "no prompts" in result.output
    result = CliRunner().invoke(main, ["generate", "What is the capital of France?", "and of Italy?"])
    assert result.exit_code == 2 and "MODEL comes first" in result.output
