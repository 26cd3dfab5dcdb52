"""tests/load.py's closed-loop client: what it counts as an answer, a refusal and an
error, and that it stops when told (threads only, no service)."""

from __future__ import annotations

import itertools
import threading

import pytest

from infscaler.runtime.serving.frontend import RequestError
from tests.load import ClosedLoop


def test_answers_refusals_and_errors_are_kept_apart() -> None:
    calls = itertools.count()
    done = threading.Event()

    def send() -> int:
        n = next(calls)
        if n >= 6:
            done.set()
            return n
        if n % 3 == 0:
            raise RequestError("refused at arrival", 503, retry_after_s=0.001)
        if n % 3 == 1:
            raise RequestError("bad input", 400)
        raise ValueError("wrong answer")

    def retry(exc: RequestError) -> float | None:
        return exc.retry_after_s if exc.status == 503 else None

    load = ClosedLoop(send, 1, retry=retry, until=done).run()
    assert load.refused == ["refused at arrival"] * 2
    assert load.errors == ["bad input", "ValueError('wrong answer')"] * 2
    assert load.results == [6] and load.answered == 1


def test_stop_ends_every_client_and_run_needs_an_end() -> None:
    with ClosedLoop(lambda: None, 3) as load:
        pass
    assert all(not t.is_alive() for t in load._threads)
    with pytest.raises(ValueError, match="seconds or until"):
        ClosedLoop(lambda: None).run()
    with pytest.raises(ValueError, match="clients must be >= 1"):
        ClosedLoop(lambda: None, 0)
