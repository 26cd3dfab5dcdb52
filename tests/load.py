"""Closed-loop clients for integration tests: threads that send requests back to back.

Imported as ``from tests.load import ClosedLoop``; used by the tests that load a served
pipeline while something changes under it (scaling, a switch, a restart, a flood)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from infscaler.runtime.serving.frontend import RequestError


class ClosedLoop:
    """``clients`` threads, each calling ``send()`` back to back until :meth:`stop`,
    until ``seconds`` have passed or until ``until`` is set, whichever comes first.

    A :class:`RequestError` for which ``retry(exc)`` returns seconds is a refusal: its
    message is kept in :attr:`refused`, the client sleeps that long and sends again.
    Any other exception (a failed check inside ``send`` included) is kept in
    :attr:`errors` (``str`` of a ``RequestError``, ``repr`` of anything else) and the
    client goes on. What ``send`` returns is kept in :attr:`results`.

    Use as a context manager (started on entry; stopped and joined on exit) or call
    :meth:`run` (start, then wait for ``seconds`` / ``until``).

    Raises:
        ValueError: ``clients`` < 1.
    """

    def __init__(
        self,
        send: Callable[[], Any],
        clients: int = 1,
        *,
        retry: Callable[[RequestError], float | None] | None = None,
        seconds: float | None = None,
        until: threading.Event | None = None,
    ) -> None:
        if clients < 1:
            raise ValueError(f"clients must be >= 1, got {clients}")
        self.send, self.retry = send, retry or (lambda exc: None)
        self.results: list[Any] = []
        self.refused: list[str] = []
        self.errors: list[str] = []
        self._end = None if seconds is None else time.monotonic() + seconds
        self._bounded = seconds is not None or until is not None
        self._stop = until or threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    @property
    def answered(self) -> int:
        """Requests answered so far."""
        return len(self.results)

    def _client(self) -> None:
        while not self._stop.is_set() and (self._end is None or time.monotonic() < self._end):
            try:
                self.results.append(self.send())
            except RequestError as exc:
                wait = self.retry(exc)
                if wait is None:
                    self.errors.append(str(exc))
                else:
                    self.refused.append(str(exc))
                    time.sleep(wait)
            except Exception as exc:  # noqa: BLE001 - collected: the tests assert on them
                self.errors.append(repr(exc))

    def start(self) -> ClosedLoop:
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 90.0) -> None:
        """Stop the clients and wait (up to ``timeout`` s each) for their last request."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def run(self) -> ClosedLoop:
        """Start, then wait until the clients end (``seconds`` or ``until``)."""
        if not self._bounded:
            raise ValueError("run() needs seconds or until")
        self.start()
        for t in self._threads:
            t.join()
        return self

    def __enter__(self) -> ClosedLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
