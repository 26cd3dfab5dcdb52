"""Priority levels and queue policies on a running service (Triton's semantics): a
function pipeline whose stage sleeps, one request in its units at a time
(``max_inflight: 1``), so the rest wait in the front end's backlog."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from infscaler.api.server import ServerThread
from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from infscaler.service.status import pipeline_status
from tests.helpers import chain_pipeline, wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = {"x": np.ones(4, np.float32)}


def pipeline(ms: float, **over: Any):
    d = chain_pipeline(ms, x_shape=(-1,))
    d["max_inflight"] = 1
    d.update(over)
    return load_pipeline(d)


@pytest.fixture
def svc(tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as s:
        yield s


def finished_at(futs: list[concurrent.futures.Future]) -> list[float]:
    """When each future completed (monotonic s), in their order."""
    done: dict[int, float] = {}
    for i, f in enumerate(futs):
        f.add_done_callback(lambda _f, i=i: done.__setitem__(i, time.monotonic()))
    concurrent.futures.wait(futs, timeout=60)
    return [done[i] for i in range(len(futs))]


def queued(svc: Service, name: str = "chain") -> dict[int, int]:
    return dict(svc.deployment(name).route.queued)


def test_a_high_priority_request_passes_the_queued_low_ones(svc: Service) -> None:
    svc.deploy(pipeline(120, priority=2))
    svc.infer("chain", X, timeout_s=30)  # warm
    lows = [svc.submit("chain", X, timeout_s=60, priority=5) for _ in range(5)]
    wait_for(lambda: queued(svc) == {5: 4}, 10, "4 low requests queued at level 5")
    # it claims level 1 on a level-2 pipeline: served at level 2, never above its pipeline
    high = svc.submit("chain", X, timeout_s=60, priority=1)
    assert queued(svc) == {5: 4, 2: 1}
    t = finished_at([*lows, high])
    # the first low one was running; the high one starts next, before the 4 queued
    assert t[0] < t[5] < min(t[1:5]), t
    assert all(f.result().outputs["y"][0] == 2.0 for f in [*lows, high])
    assert queued(svc) == {}


def test_max_queue_size_counts_every_level(svc: Service, tmp_path: Path) -> None:
    svc.deploy(pipeline(300, queue_policy={"max_queue_size": 2}))
    first = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: queued(svc) == {}, 10, "the first request to start")
    more = [svc.submit("chain", X, timeout_s=60) for _ in range(2)]
    with pytest.raises(RequestError) as exc:
        svc.submit("chain", X, timeout_s=60)
    assert exc.value.status == 503
    assert "queue full (max_queue_size 2)" in str(exc.value)
    st = pipeline_status(svc, svc.deployment("chain"))
    assert st["priority"] == 1 and st["queue_policy"]["max_queue_size"] == 2
    assert st["queue_policy"]["timeout_action"] == "REJECT"
    assert st["queued_by_level"] == {"1": 2} and st["refusals"] == {"queue_full": 1}
    # another level does not escape the bound: the pipeline's queue is full
    with pytest.raises(RequestError, match="queue full"):
        svc.submit("chain", X, timeout_s=60, priority=2)
    for f in [first, *more]:
        f.result(timeout=30)
    route = svc.deployment("chain").route
    assert route.refusals["queue_full"] == 2
    assert svc.frontend.counters["queue_full"] == 2
    sock = str(tmp_path / "api.sock")
    with ServerThread(svc, sock):
        transport = httpx.HTTPTransport(uds=sock)
        with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
            text = h.get("/metrics").text
    line = 'infscaler_requests_refused_total{model="chain",version="1",reason="queue_full"} 2'
    assert line in text, [x for x in text.splitlines() if "requests_refused" in x]


def test_queue_timeout_reject(svc: Service) -> None:
    svc.deploy(pipeline(400, queue_policy={"default_timeout_ms": 100}))
    first = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: queued(svc) == {}, 10, "the first request to start")
    t0 = time.monotonic()
    late = svc.submit("chain", X, timeout_s=60)
    with pytest.raises(RequestError) as exc:
        late.result(timeout=30)
    waited = time.monotonic() - t0
    assert exc.value.status == 503 and "queue timeout" in str(exc.value)
    assert 0.09 < waited < 0.35, waited  # refused at its queue timeout, not at the end
    first.result(timeout=30)
    assert svc.deployment("chain").route.refusals["queue_timeout"] == 1
    # the request's own timeout parameter is ignored without allow_timeout_override
    second = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: queued(svc) == {}, 10, "the request to start")
    ignored = svc.submit("chain", X, timeout_s=60, queue_timeout_us=10_000_000)
    with pytest.raises(RequestError, match="queue timeout"):
        ignored.result(timeout=30)
    second.result(timeout=30)


def test_queue_timeout_delay_moves_it_behind_its_level(svc: Service) -> None:
    policy = {"default_timeout_ms": 50, "timeout_action": "DELAY", "allow_timeout_override": True}
    svc.deploy(pipeline(300, queue_policy=policy))
    first = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: queued(svc) == {}, 10, "the first request to start")
    delayed = svc.submit("chain", X, timeout_s=60)  # times out in the queue after 50 ms
    wait_for(lambda: svc.frontend.counters["queue_delayed"] == 1, 5, "the DELAY")
    # arrived later, never times out (its own 10 s timeout, allowed by the policy)
    patient = svc.submit("chain", X, timeout_s=60, queue_timeout_us=10_000_000)
    t = finished_at([first, delayed, patient])
    assert t[0] < t[2] < t[1], t
    assert delayed.result().outputs["y"][0] == 2.0  # delayed, not refused


def test_priority_over_http(svc: Service, tmp_path: Path) -> None:
    svc.deploy(pipeline(120, priority=3))
    svc.infer("chain", X, timeout_s=30)
    sock = str(tmp_path / "api.sock")
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1.0] * 4}]}
    with ServerThread(svc, sock):
        transport = httpx.HTTPTransport(uds=sock)
        with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
            for bad, why in ((-1, "priority must be an integer"), ("1", "priority must be")):
                r = h.post("/v2/models/chain/infer", json={**body, "parameters": {"priority": bad}})
                assert r.status_code == 400 and why in r.json()["error"], r.text
            lows = [svc.submit("chain", X, timeout_s=60, priority=4) for _ in range(4)]
            wait_for(lambda: queued(svc) == {4: 3}, 10, "3 low requests queued")
            answered: list[float] = []

            def post() -> None:
                with httpx.Client(transport=transport, base_url="http://x", timeout=30) as c:
                    r = c.post(
                        "/v2/models/chain/infer", json={**body, "parameters": {"priority": 1}}
                    )
                    assert r.status_code == 200, r.text
                    answered.append(time.monotonic())

            th = threading.Thread(target=post)
            th.start()
            t = finished_at(lows)
            th.join(30)
        # at its pipeline's level 3 (it asked for 1), it passed at least two of the three
        # queued at level 4 (one may start before it arrives)
        assert answered and answered[0] < sorted(t[1:])[1], (answered, t)
        assert queued(svc) == {}
