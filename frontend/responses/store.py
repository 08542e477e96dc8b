"""The Responses API's in-memory store: responses kept for GET /v1/responses/{id} and previous_response_id.

Bounded three ways, because `store` defaults to true and every response would otherwise stay forever (as
in vLLM, whose store is never evicted): a count of entries, a total size in bytes, and an age. The oldest
entries go first when a bound is passed; expired ones are dropped whenever the store is touched.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class StoredResponse:
    response: dict              # the response object, as GET returns it
    messages: list[dict]        # the conversation up to and including this response, as chat messages
    size: int                   # bytes it is charged against the store's bound
    expires: float


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int, ttl: float, clock=time.monotonic):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response_id: str, response: dict, messages: list[dict], size: int) -> bool:
        """Keep a response; False when it alone is larger than the whole store may be (it is not kept)."""
        self.delete(response_id)
        if size > self.max_bytes or self.max_entries == 0:
            return False
        self._expire()
        while self._entries and (len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes):
            self._evict_oldest()
        self._entries[response_id] = StoredResponse(response, messages, size, self._clock() + self.ttl)
        self._bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def _expire(self) -> None:
        now = self._clock()
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if oldest.expires > now:       # entries are in insertion order, so in expiry order too
                return
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self._bytes -= entry.size
