"""The chat page in a real headless browser (Debian's chromium driven by playwright): it lists the model,
streams a reply into the page (Markdown rendered, the model's HTML escaped), stops a reply with Stop (the
engine request is aborted), keeps the conversation across a reload, asks for the API key when the server has
one, and breaks none of its own Content-Security-Policy. Skipped where playwright or chromium is missing."""

from __future__ import annotations

import shutil

import pytest

from frontend.config import ServerConfig
from tests.frontend.harness import serve_fake

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on this machine (apt-get install chromium)", allow_module_level=True)
expect = sync_api.expect
KEY = "browser-key"
REPLY = "The **quick** brown `fox` <img src=x onerror=alert(1)>\n\n```python\nprint('<b>')\n```\n"


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def served(tiny_model, **server_options):
    config = ServerConfig(log_stats_interval=0, shutdown_timeout=1.0, **server_options)
    server, fake = serve_fake(tiny_model, server=config, script=REPLY, step_delay=0.01)
    fake.eos_after = len(fake.script)                # the scripted reply once, then EOS
    return server, fake


def open_page(browser, url: str):
    page = browser.new_page()
    problems = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(url)
    return page, problems


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.click("#send")


def test_a_message_gets_a_streamed_markdown_reply_that_survives_a_reload(browser, tiny_model):
    server, fake = served(tiny_model)
    with server:
        page, problems = open_page(browser, server.url)
        expect(page.locator("#model")).to_have_value("tiny")
        page.fill("#temperature", "0")
        send(page, "Tell me about foxes")
        reply = page.locator(".message.assistant .content").last
        expect(page.locator("#stop")).to_be_enabled()                      # streaming
        expect(reply).to_contain_text("The")
        page.wait_for_selector("body[data-busy='false']", timeout=10_000)
        assert reply.locator("strong").inner_text() == "quick"
        assert reply.locator("pre code.language-python").inner_text() == "print('<b>')"
        assert "<img src=x onerror=alert(1)>" in reply.inner_text()      # shown as text, never as an element
        assert reply.locator("img").count() == 0
        _, prompt, params = fake.submitted[-1]
        assert params.temperature == 0.0 and "Tell me about foxes" in bytes(t for t in prompt if t < 256).decode()
        page.reload()
        page.wait_for_selector(".message.assistant")
        assert page.locator(".message.user").inner_text().endswith("Tell me about foxes")
        assert page.locator(".message.assistant strong").inner_text() == "quick"
        assert not problems, problems                                      # no CSP violation, no script error
        page.close()


def test_stop_aborts_the_reply(browser, tiny_model):
    server, fake = served(tiny_model)
    fake.step_delay = 0.2
    with server:
        page, problems = open_page(browser, server.url)
        expect(page.locator("#model")).to_have_value("tiny")
        page.fill("#temperature", "0")
        send(page, "A long answer, please")
        expect(page.locator(".message.assistant .content")).to_contain_text("The")
        page.click("#stop")
        page.wait_for_selector("body[data-busy='false']")
        request_id = fake.submitted[-1][0]
        page.wait_for_timeout(300)
        assert request_id in server.call(lambda: list(fake.aborted))
        assert page.locator(".message.assistant").count() == 1             # the partial reply stays
        assert not problems, problems
        page.close()


def test_with_an_api_key_the_page_asks_for_it(browser, tiny_model):
    server, fake = served(tiny_model, api_key=KEY)
    with server:
        page, _ = open_page(browser, server.url)
        page.wait_for_selector("#key-form:not([hidden])")
        page.fill("#api-key", "wrong")
        page.click("#key-entry button")
        page.wait_for_selector("#key-error:not([hidden])")
        page.fill("#api-key", KEY)
        page.click("#key-entry button")
        page.wait_for_selector("#key-form[hidden]", state="attached")
        expect(page.locator("#model")).to_have_value("tiny")
        page.fill("#temperature", "0")
        send(page, "hello")
        expect(page.locator(".message.assistant strong")).to_have_text("quick", timeout=10_000)
        page.close()
