"""Profiling on demand: the engine processes write torch profiler traces, the frontend request events.

POST /start_profile asks the engine (client.call("start_profile", dir=...)) to start its torch profilers
and opens a JSON-lines file of request-level events in the same directory; POST /stop_profile stops both.
Events are written per request (arrival and finish with its phase timestamps), never per token. Times are
time.monotonic(), the clock of every process on the machine; the first line maps it to wall-clock time.
"""

from __future__ import annotations

import os
import time

import orjson


class RequestEventLog:
    """Appends one JSON line per request event while a profile is running."""

    def __init__(self) -> None:
        self._file = None
        self.path: str | None = None

    @property
    def active(self) -> bool:
        return self._file is not None

    def start(self, directory: str) -> str:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"frontend-requests-{os.getpid()}-{time.time_ns()}.jsonl")
        self._file = open(self.path, "wb")
        self.record({"event": "profile_start", "monotonic": time.monotonic(), "wall": time.time()})
        return self.path

    def record(self, event: dict) -> None:
        if self._file is not None:
            self._file.write(orjson.dumps(event) + b"\n")

    def stop(self) -> str | None:
        if self._file is not None:
            self.record({"event": "profile_stop", "monotonic": time.monotonic(), "wall": time.time()})
            self._file.close()
            self._file = None
        return self.path
