"""The CPU kernels' C compiles clean with the warnings the build turns on (-Wall -Wextra), as an error here."""

from __future__ import annotations

import os
import subprocess

import pytest

from kernels.cpu import build


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("source", build.SOURCES, ids=os.path.basename)
def test_each_source_compiles_without_warnings(source):
    flags = [f for f in build.COMPILE_FLAGS if f != "-O3"]
    assert {"-Wall", "-Wextra"} <= set(flags)
    result = subprocess.run([build.compiler(), *flags, "-Werror", "-fsyntax-only", source],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_build_names_every_c_file_beside_it():
    here = os.path.dirname(build.SOURCES[0])
    on_disk = {name for name in os.listdir(here) if name.endswith((".c", ".h"))}
    assert on_disk == {os.path.basename(p) for p in (*build.SOURCES, *build.HEADERS)}
