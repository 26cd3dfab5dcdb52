"""Priority levels and queue policies of the front end's backlog (pure; no I/O, no locks).

More (details, why it is so, history, figures): docs/serving.md, "`runtime/serving/queues.py`".
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from infscaler.base.levels import MAX_PRIORITY_LEVEL

__all__ = [
    "MAX_PRIORITY_LEVEL",
    "PriorityBacklog",
    "ahead_at",
    "backlog_key",
    "queue_timeout_s",
    "request_level",
]

T = TypeVar("T")


def request_level(requested: int | None, pipeline_level: int) -> int:
    """A request's priority level: ``requested`` (its ``priority`` parameter) when it is
    ``pipeline_level`` (its pipeline's ``priority``) or lower (a larger number), else
    ``pipeline_level``: None or 0 (Triton: 0 means the default level), and a higher
    level than the pipeline's, which is served at the pipeline's (a request claiming
    level 1 on a level-2 pipeline is served at level 2).

    Raises:
        ValueError: ``requested`` negative or above :data:`MAX_PRIORITY_LEVEL` (the
            server answers 400).
    """
    if requested is None or requested == 0:
        return pipeline_level
    if not 1 <= requested <= MAX_PRIORITY_LEVEL:
        raise ValueError(f"priority must be 0 - {MAX_PRIORITY_LEVEL}, got {requested}")
    return max(int(requested), pipeline_level)


def queue_timeout_s(
    default_timeout_ms: float | None,
    allow_override: bool,
    requested_us: int | None,
    request_timeout_s: float | None = None,
) -> float | None:
    """The queue timeout of a request, seconds (None: none).

    ``requested_us``: its ``timeout`` parameter, µs (Triton's; None or 0: not given),
    used only when ``allow_override``, and then at most ``request_timeout_s`` (the
    pipeline's, s; None: not bounded), else ``default_timeout_ms`` (ms; None: none).
    """
    if allow_override and requested_us:
        asked = requested_us / 1e6
        return asked if request_timeout_s is None else min(asked, request_timeout_s)
    return None if default_timeout_ms is None else default_timeout_ms / 1e3


def backlog_key(level: int, delayed: bool, order: int) -> tuple[int, int, int]:
    """The backlog's sort key: the level first (1 before 2), then the requests that
    have not timed out before the ``DELAY``-ed ones, then ``order`` (arrival, or the
    time it was delayed)."""
    return (level, 1 if delayed else 0, order)


def ahead_at(level: int, admitted: int, queued: Mapping[int, int]) -> int:
    """Requests a new request of ``level`` has ahead of it: the ``admitted`` requests of
    its pipeline less those queued at lower levels (``queued``: level -> requests
    queued, not started), which it will pass. Requests already in the pipeline's
    units are never passed (no preemption)."""
    behind = sum(n for lvl, n in queued.items() if lvl > level)
    return max(0, admitted - behind)


class PriorityBacklog(Generic[T]):
    """A queue served in :func:`backlog_key` order (a binary heap; ``push`` / ``pop``
    O(log n)). Items are any objects; their key is given at :meth:`push`."""

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, int, int], int, T]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_order(self) -> int:
        """A new arrival order (increasing)."""
        return next(self._order)

    def push(self, item: T, level: int, delayed: bool = False, order: int | None = None) -> None:
        """Queue ``item`` at ``level``; ``order`` None: it arrives now (behind every
        item of its key pushed before)."""
        order = self.next_order() if order is None else order
        heapq.heappush(self._heap, (backlog_key(level, delayed, order), order, item))

    def pop(self) -> tuple[tuple[int, int, int], T]:
        """The first item and its key. Raises IndexError when empty."""
        key, _, item = heapq.heappop(self._heap)
        return key, item

    def extend(self, entries: Iterable[tuple[tuple[int, int, int], T]]) -> None:
        """Put back items popped with their keys (their place is kept)."""
        for key, item in entries:
            heapq.heappush(self._heap, (key, key[2], item))

    def items(self) -> list[Any]:
        """The items in service order (a copy; O(n log n))."""
        return [item for _, _, item in sorted(self._heap, key=lambda e: e[0])]
