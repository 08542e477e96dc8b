"""The README's picture of the chat page: `ringserve serve` (the bundled SmolLM2 when installed), one question
asked in headless chromium through playwright, the page saved as a PNG.

    python -m tools.web_ui_screenshot [--out docs/web-ui.png] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import shutil
import sys

import click


@click.command("web-ui-screenshot")
@click.option("--out", default="docs/web-ui.png", show_default=True)
@click.option("--chromium", default=lambda: shutil.which("chromium") or "chromium", show_default="on PATH")
@click.option("--question", default="Write a Python function that reverses a string.", show_default=True)
def cli(out: str, chromium: str, question: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.e2e.server import ServerProcess

    with ServerProcess() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 720})
        page.goto(server.url)
        expect(page.locator("#model")).to_have_value(server.model)
        page.fill("#system", "You are a concise assistant.")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "160")
        page.fill("#prompt", question)
        page.click("#send")
        page.wait_for_selector("body[data-busy='false']", timeout=120_000)
        page.screenshot(path=out)
        browser.close()
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(cli())
