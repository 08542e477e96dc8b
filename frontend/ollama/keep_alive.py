"""Ollama's `keep_alive`: how long a model stays loaded after a request (a Go duration such as "5m",
"1h30m", "-1s", or a number of seconds; 0 unloads now, negative keeps it loaded), and the one hook where
the several-models lifecycle acts on it.

`ModelResidency` asks the server's model pool (engine/client/model_pool.py): with --models-dir, a request's
keep_alive sets when its model is unloaded once idle (0: as soon as it is idle; negative: never by
idleness), and /api/ps shows each loaded model's expiry (--idle-unload's, or the last keep_alive's). A
server of one MODEL keeps it loaded for its whole life (it reads keep_alive and unloads nothing), and /api/ps
shows it never expiring, unless --idle-unload is set.
"""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import datetime, timezone

from frontend.errors import invalid

logger = logging.getLogger("ringserve.ollama")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
NEVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)     # how /api/ps shows "stays loaded"


def parse_keep_alive(value: str | float | None) -> float | None:
    """Seconds (math.inf: stay loaded; 0: unload now), or None when unset; 400 naming keep_alive if bad."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        seconds = _duration(value.strip())
    if math.isnan(seconds):
        raise invalid("keep_alive must be a duration or a number of seconds", "keep_alive")
    return math.inf if seconds < 0 else seconds


def _duration(text: str) -> float:
    """A Go duration ("1h30m", "-5m", "300ms"), or a plain number of seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.lstrip("+"))
    seconds, at = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != at:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        at = match.end()
    if not body or at != len(body):
        raise invalid(f"keep_alive {text[:64]!r} is not a duration (such as \"5m\", \"1h30m\", \"-1\") nor a "
                      "number of seconds", "keep_alive")
    return sign * seconds


class ModelResidency:
    """Which served models are loaded and until when: THE hook for keep_alive (see the module's doc)."""

    def __init__(self, engine):
        self.model_name = engine.config.model_name
        self.pool = getattr(engine, "pool", None)        # the ModelPool of a PooledEngine (every server's)

    def names(self) -> list[str]:
        """Every served model's name."""
        return self.pool.names if self.pool is not None else [self.model_name]

    def configs(self) -> list:
        """Every served model's (name, EngineConfig)."""
        return [(m.name, m.config) for m in self.pool.models.values()] if self.pool is not None else []

    def running(self) -> list[str]:
        """The models whose engine is up (asleep ones included: a request wakes them)."""
        return [m.name for m in self.pool.running()] if self.pool is not None else [self.model_name]

    def keep_alive(self, model: str, seconds: float | None) -> bool:
        """A request for `model` asked to keep it loaded `seconds` more (None: the server's default; 0: unload
        it as soon as it is idle). Returns True when that unloads it."""
        if self.pool is None or not self.pool.on_demand:
            if seconds == 0:
                logger.info("keep_alive 0 for %s: this server runs one model and keeps it loaded", model)
            return False
        if seconds is not None:
            self.pool.keep_alive(model, -1.0 if math.isinf(seconds) else seconds)
        return seconds == 0

    def expires_at(self, model: str) -> datetime:
        """When `model` would be unloaded if no request came (NEVER: it stays loaded)."""
        if self.pool is None:
            return NEVER
        expiry = self.pool.expires_at(self.pool.model(model))
        if expiry is None:
            return NEVER
        return datetime.fromtimestamp(time.time() + max(expiry - time.monotonic(), 0.0), timezone.utc)
