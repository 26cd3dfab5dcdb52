"""What the HTTP routes and the gRPC methods share (infscaler.api.common): a refusal
held for its ``hold_s`` before it is answered, any other exception at once."""

from __future__ import annotations

import asyncio
import math
import time

from infscaler.api.common import hold_refusal
from infscaler.runtime.serving.requests import RequestError


def test_hold_refusal_waits_a_refusals_hold_and_nothing_else() -> None:
    def waited(exc: BaseException) -> float:
        t0 = time.monotonic()
        asyncio.run(hold_refusal(exc))
        return time.monotonic() - t0

    assert waited(RequestError("late", hold_s=0.05)) >= 0.05  # a lower bound only
    for exc in (RequestError("now"), ValueError("x"), RequestError("bad", hold_s=math.inf)):
        assert waited(exc) < 5.0  # answered at once (wide: a loaded host)
