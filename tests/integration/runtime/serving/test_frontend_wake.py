"""The front end's loop sleeps until something lets work go on (a token, a command, a
freed slot, the nearest deadline): requests waiting in its backlog cost no polling."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

X = {"x": np.ones(4, np.float32)}


@pytest.fixture
def svc(tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as s:
        yield s


def test_requests_waiting_for_the_window_do_not_spin_the_loop(svc: Service) -> None:
    d = chain_pipeline(900, x_shape=(-1,))
    d["max_inflight"] = 1
    svc.deploy(load_pipeline(d))
    svc.infer("chain", X, timeout_s=30)  # warm
    fe = svc.frontend
    futs = [svc.submit("chain", X, timeout_s=60) for _ in range(4)]
    wait_for(lambda: fe.stats()["backlog"] == 3, 10, "3 requests waiting for the window")
    turns0 = fe.counters["loop_turns"]
    time.sleep(0.6)  # the first runs for 900 ms; the others wait
    turns = fe.counters["loop_turns"] - turns0
    # polling every 5 ms made 50-120 turns here; each event makes one or two
    assert turns < 12, turns
    assert [f.result(60).outputs["y"][0] for f in futs] == [2.0] * 4


def test_a_queue_timeout_fires_while_the_loop_sleeps(svc: Service) -> None:
    d = chain_pipeline(2500, x_shape=(-1,))
    d["max_inflight"] = 1
    d["queue_policy"] = {"default_timeout_ms": 200, "timeout_action": "REJECT"}
    svc.deploy(load_pipeline(d))
    first = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: svc.frontend.stats()["backlog"] == 0, 10, "the first request to start")
    t0 = time.monotonic()
    waiting = svc.submit("chain", X, timeout_s=60)
    with pytest.raises(RequestError) as exc:
        waiting.result(30)
    assert exc.value.status == 503 and "queue timeout" in str(exc.value)
    # refused at its queue timeout, not when the running request's result came back
    assert time.monotonic() - t0 < 2.0
    assert first.result(60).outputs["y"][0] == 2.0


def test_a_deadline_fires_while_the_loop_sleeps(svc: Service) -> None:
    d = chain_pipeline(2500, x_shape=(-1,))
    d["max_inflight"] = 1
    svc.deploy(load_pipeline(d))
    first = svc.submit("chain", X, timeout_s=60)
    wait_for(lambda: svc.frontend.stats()["backlog"] == 0, 10, "the first request to start")
    t0 = time.monotonic()
    waiting = svc.submit("chain", X, timeout_s=0.3)
    with pytest.raises(RequestError) as exc:
        waiting.result(30)
    assert exc.value.status == 503 and "timed out" in str(exc.value)
    # failed at its deadline, not when the running request's result came back
    assert time.monotonic() - t0 < 2.0
    assert first.result(60).outputs["y"][0] == 2.0


def test_wake_ups_before_the_loop_turns_write_the_pipe_once(svc: Service, monkeypatch) -> None:
    # a wake-up already on its way covers every change made before the loop's next turn
    import os

    import runtime.serving.frontend as frontend

    fe = svc.frontend
    writes: list[int] = []
    real = os.write

    def counting(fd: int, data: bytes) -> int:
        if fd == fe._wake_w:
            writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(frontend.os, "write", counting)
    turns0 = fe.counters["loop_turns"]
    for _ in range(300):
        fe.wake()
    wait_for(lambda: fe.counters["loop_turns"] > turns0, 10, "the loop woke")
    # one write per loop turn at most (the loop may turn a few times meanwhile: the GIL
    # passes to it every few ms on a loaded host); without the flag: 300
    assert 1 <= len(writes) <= fe.counters["loop_turns"] - turns0 + 1 < 100, writes
    fe.wake()  # after the turn began, a wake-up writes again
    assert len(writes) >= 2
