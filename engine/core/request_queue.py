"""Scheduling policies: the order of the waiting queue and the choice of whom to preempt.

fcfs: waiting requests run in arrival order; a preempted request goes back to the front; the most
recently scheduled running request is preempted first.
priority: lower `priority` values run first, ties by arrival time; the running request with the highest
(priority, arrival time) is preempted first.

Aborted requests are dropped from a queue lazily: `remove` only uncounts them and `peek` skips them, so an
abort costs O(1) instead of a search through the queue.
"""

from __future__ import annotations

import heapq
from collections import deque

from engine.core.request import Request, RequestStatus

_QUEUED = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def priority_key(request: Request) -> tuple[int, float, int]:
    return request.priority, request.arrival_time, request.req


class _LazyRequestQueue:
    """The bookkeeping both queues share; subclasses order the requests."""

    def __init__(self) -> None:
        self._num_live = 0

    def pop(self) -> Request:
        request = self.peek()
        self._pop_head()
        self._num_live -= 1
        return request

    def remove(self, request: Request) -> None:
        """Uncount a request whose status has left WAITING/PREEMPTED; peek() discards it later."""
        self._num_live -= 1

    def __len__(self) -> int:
        return self._num_live


class FCFSRequestQueue(_LazyRequestQueue):
    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)
        self._num_live += 1

    def add_preempted(self, request: Request) -> None:
        self._queue.appendleft(request)
        self._num_live += 1

    def peek(self) -> Request:
        queue = self._queue
        while queue[0].status not in _QUEUED:
            queue.popleft()
        return queue[0]

    def _pop_head(self) -> None:
        self._queue.popleft()


class PriorityRequestQueue(_LazyRequestQueue):
    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[int, float, int, Request]] = []

    def add(self, request: Request) -> None:
        heapq.heappush(self._heap, (*priority_key(request), request))
        self._num_live += 1

    add_preempted = add     # its (priority, arrival) key already places it

    def peek(self) -> Request:
        heap = self._heap
        while heap[0][3].status not in _QUEUED:
            heapq.heappop(heap)
        return heap[0][3]

    def _pop_head(self) -> None:
        heapq.heappop(self._heap)


RequestQueue = FCFSRequestQueue | PriorityRequestQueue


def create_request_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling_policy {policy!r} (choose fcfs or priority)")


def pick_preemption_victim(running: list[Request], policy: str) -> Request:
    """The running request to give up its blocks when another one cannot grow."""
    if policy == "priority":
        return max(running, key=priority_key)
    return running[-1]
