"""`ringserve chat` at a real terminal (a pty, driven with pexpect) against a stub streaming server: line
editing and history, the commands, Ctrl-C stopping a reply but not the program, text typed during a reply
kept out of it, Ctrl-D quitting."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO
from tests.tools.stub_openai_server import MODEL_NAME, TOKEN_TEXT, StubOpenAIServer

pexpect = pytest.importorskip("pexpect")
LEFT, UP = "\x1b[D", "\x1b[A"


def start_chat(url: str, tmp_path, *args: str, preexec_fn=None):
    env = dict(os.environ, PYTHONPATH=str(REPO), TERM="xterm", XDG_CACHE_HOME=str(tmp_path))
    child = pexpect.spawn(sys.executable, ["-m", "frontend.cli", "chat", "--url", url + "/v1", *args], env=env,
                          encoding="utf-8", timeout=30, dimensions=(40, 200), preexec_fn=preexec_fn)
    child.expect(f"Chatting with {MODEL_NAME}")
    child.expect("> ")
    return child


def users(request) -> list[str]:
    return [m["content"] for m in request.body["messages"] if m["role"] == "user"]


def test_editing_history_and_commands(tmp_path):
    with StubOpenAIServer(ttft_ms=1, itl_ms=1) as stub:
        child = start_chat(stub.url, tmp_path, "--max-tokens", "2")
        child.send(f"helo{LEFT}l\r")                       # the arrow moves the cursor: "hello"
        child.expect(TOKEN_TEXT * 2)
        child.expect("> ")
        assert stub.requests[-1].body["messages"] == [{"role": "user", "content": "hello"}]
        child.send(f"{UP}\r")                              # the last line again, from the history
        child.expect("> ")
        assert users(stub.requests[-1]) == ["hello", "hello"]

        child.sendline("/help")
        child.expect("/system TEXT")
        child.expect("> ")
        child.sendline("/system be brief")
        child.expect(r"\[system message: 'be brief'\]")
        child.sendline("/temp 0.3")
        child.expect(r"\[temperature: 0.3\]")
        child.sendline("/temp 9")
        child.expect("temperature must be a number from 0 to 2")
        child.sendline("/clear")
        child.expect(r"\[conversation cleared\]")
        child.expect("> ")
        child.sendline("again")
        child.expect(TOKEN_TEXT * 2)
        child.expect("> ")
        body = stub.requests[-1].body
        assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "again"}]
        assert body["temperature"] == 0.3

        child.send("half a line")
        # Ctrl-C once the line shows, as a user presses it: one that lands in the instant between the prompt
        # showing and Python's readline waiting for a key is only seen at the next key (a CPython race).
        child.expect("half a line")
        child.sendintr()                                   # Ctrl-C at the prompt: a fresh prompt, no exit
        child.expect("> ")
        assert child.isalive()
        child.sendeof()                                    # Ctrl-D quits
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    assert "again" in (tmp_path / "ringserve" / "chat_history").read_text()   # history kept for next time


def test_ctrl_c_stops_the_reply_and_typing_stays_out_of_it(tmp_path):
    with StubOpenAIServer(ttft_ms=1, itl_ms=20) as stub:
        child = start_chat(stub.url, tmp_path, "--max-tokens", "2000")      # 40 s unless stopped
        child.sendline("tell me everything")
        child.expect(TOKEN_TEXT * 3)
        child.send("zzz")                                  # typed while the reply streams
        child.expect(TOKEN_TEXT * 2)
        child.sendintr()
        child.expect(r"\[stopped\]")
        shown = child.before
        child.expect("> ")
        assert "zzz" not in shown + child.before and child.isalive()
        child.sendline("and then?")
        child.expect(TOKEN_TEXT)
        child.sendintr()
        child.expect(r"\[stopped\]")
        child.expect("> ")
        messages = stub.requests[-1].body["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[2]["content"] == "and then?"       # what was typed during the reply was dropped
        partial = messages[1]["content"]                   # the part of the stopped reply that was shown
        assert partial.startswith(TOKEN_TEXT * 5) and len(partial) < len(TOKEN_TEXT) * 2000
        assert len(stub.requests) == 2
        child.sendline("/exit")
        child.expect(pexpect.EOF)


def test_ctrl_c_works_when_started_with_sigint_ignored(tmp_path):
    """A shell's background job (or a wrapper) starts its children with SIGINT ignored, and Python keeps the
    ignore: CI ran this suite so, and Ctrl-C then did nothing. The chat takes Ctrl-C back at a terminal."""
    import signal

    with StubOpenAIServer(ttft_ms=1, itl_ms=20) as stub:
        child = start_chat(stub.url, tmp_path, "--max-tokens", "2000",
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        child.sendline("go on")
        child.expect(TOKEN_TEXT * 3)
        child.sendintr()
        child.expect(r"\[stopped\]")
        child.expect("> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
