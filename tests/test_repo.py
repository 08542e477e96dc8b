"""The repository keeps its promises: CI runs the README's test command, the README shows both commands."""

from __future__ import annotations

from tests.conftest import REPO


def _ci_command() -> str:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    marker = lines.index("# --- the README's test command, verbatim:")
    return lines[marker + 1].strip()


def test_readme_shows_the_ci_test_command():
    command = _ci_command()
    assert command.startswith("pip install torch==2.13.0")
    assert command in (REPO / "README.md").read_text()


def test_readme_shows_the_serve_command():
    readme = (REPO / "README.md").read_text()
    assert "ringserve serve" in readme


def test_readme_puts_the_api_key_in_the_environment_and_says_why():
    """A command line is readable by every local user (ps): the README recommends RINGSERVE_API_KEY first."""
    readme = (REPO / "README.md").read_text()
    assert readme.index("RINGSERVE_API_KEY") < readme.index("--api-key")
    advice = readme[readme.index("RINGSERVE_API_KEY"):readme.index("--api-key") + 200]
    assert "ps" in advice
