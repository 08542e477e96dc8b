"""What `pip install -e .` installs: no triton on a machine that has no use for it (it is ~1 GB), so not
xgrammar either, which requires it (the README installs xgrammar with --no-deps); triton and xgrammar with
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
    assert {"torch", "transformers", "gguf", "apache-tvm-ffi", "pydantic"} <= found[None]
    assert not {"triton", "xgrammar"} & found[None]           # xgrammar requires triton on Linux x86-64
    assert {"triton", "xgrammar"} <= found["gpu"]
    assert found["structured"] == {"xgrammar"}
    assert {"triton", "xgrammar", "pexpect", "pytest"} <= found["test"]


def test_the_readme_installs_xgrammar_without_its_dependencies():
    from engine.structured_spec import XGRAMMAR_INSTALL
    from tests.readme import readme, shell_commands

    first = shell_commands(readme())[:4]
    assert [w[:2] for w in first] == [["pip", "install"]] * 3 + [["ringserve", "serve"]]
    assert first[2][2] == "--no-deps" and "xgrammar==0.2.8" in first[2]
    assert XGRAMMAR_INSTALL.split() == ["pip", "install", "--no-deps", "xgrammar==0.2.8"]


def test_without_xgrammar_a_constraint_is_refused_saying_what_to_install(monkeypatch):
    from engine.sampling_params import StructuredOutputsParams
    from engine.structured_spec import validate

    monkeypatch.setitem(sys.modules, "xgrammar", None)       # as if it were not installed
    with pytest.raises(ValueError, match=r"need xgrammar, which is not installed: pip install --no-deps"):
        validate(StructuredOutputsParams(json_object=True))


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
    assert "transformers" in names and not {"triton", "xgrammar"} & names
