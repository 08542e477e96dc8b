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
