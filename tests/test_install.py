"""What `pip install -e .` installs: no triton on a machine that has no use for it (it is ~1 GB), triton with
the GPU extra and with the test extra (the suite runs the Triton kernels under the interpreter), pexpect for
the terminal-chat tests. Read from the package metadata that pip itself reads (setuptools builds it from
setup.cfg, offline); the slow test resolves a real install in a fresh venv."""

from __future__ import annotations

import json
import subprocess
import sys
from email.parser import Parser

import pytest

from tests.conftest import REPO

BUILD_METADATA = r"""
import os, sys, tempfile
from setuptools import build_meta
os.chdir(sys.argv[1])
out = tempfile.mkdtemp()
name = build_meta.prepare_metadata_for_build_wheel(out)
sys.stderr.flush()
print(os.path.join(out, name, "METADATA"))
"""


def requirements() -> dict[str | None, set[str]]:
    """Project names required by the default install (key None) and by each extra."""
    result = subprocess.run([sys.executable, "-c", BUILD_METADATA, str(REPO)], capture_output=True, text=True,
                            check=True)
    with open(result.stdout.strip().splitlines()[-1]) as f:
        metadata = Parser().parse(f)
    found: dict[str | None, set[str]] = {}
    for line in metadata.get_all("Requires-Dist"):
        requirement, _, marker = line.partition(";")
        name = requirement.split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip().lower()
        extra = marker.split('extra == "')[1].split('"')[0] if 'extra == "' in marker else None
        found.setdefault(extra, set()).add(name)
    return found


def test_the_default_install_leaves_triton_out_and_the_extras_bring_it():
    found = requirements()
    assert "triton" not in found[None] and {"torch", "transformers", "gguf"} <= found[None]
    assert "triton" in found["gpu"]
    assert {"triton", "pexpect", "pytest"} <= found["test"]


@pytest.mark.slow
def test_a_fresh_venv_resolves_no_triton(tmp_path):
    """pip's own resolution of `pip install -e .` into an empty venv, without installing anything (needs the
    package index that pip is configured with; the CPU build of torch, as the README installs it, first)."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    pip = [str(tmp_path / "venv" / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", "torch==2.13.0"], check=True)
    report = tmp_path / "report.json"
    subprocess.run([*pip, "install", "-q", "--dry-run", "--report", str(report), "-e", str(REPO)], check=True)
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "transformers" in names and "triton" not in names
