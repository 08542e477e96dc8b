"""The real grammar compile worker, except that each compile waits while the file named by
RINGSERVE_TEST_GRAMMAR_GATE exists: tests hold compiles as long as they like, then release them."""

from __future__ import annotations

import os
import sys
import time

from engine.core import grammar_worker

GATE_ENV = "RINGSERVE_TEST_GRAMMAR_GATE"


def _held(to_grammar):
    def wait_then_build(spec):
        gate = os.environ.get(GATE_ENV)
        while gate and os.path.exists(gate):
            time.sleep(0.01)
        return to_grammar(spec)
    return wait_then_build


if __name__ == "__main__":
    grammar_worker.to_grammar = _held(grammar_worker.to_grammar)
    sys.exit(grammar_worker.main())
