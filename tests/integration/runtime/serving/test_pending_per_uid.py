"""The front end's count of requests pending per client uid on a running service: taken at
admission, given back however a request ends (answered, failed in a stage, expired in
the queue, cancelled by its caller, failed at close), never for a refused one; the
operator (uid None) is not counted. The requests are held in a stage until the test
releases them (``stagefuncs.hold``), so no count moves unless the test moves it."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

UID = 65534
GOOD, BAD = np.ones(3, np.float32), -np.ones(3, np.float32)


def _pipeline(release: Path) -> dict:
    """x -> fail_on_negative -> hold (until ``release`` exists) -> y, one request in the
    units at a time (the rest wait in the front end's backlog)."""
    return {
        "name": "chain",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["y"],
        "max_inflight": 1,
        "stages": [
            {
                "name": "check",
                "function": "stagefuncs:fail_on_negative",
                "inputs": ["x"],
                "outputs": ["y"],
            },
            {
                "name": "hold",
                "function": "stagefuncs:hold",
                "inputs": ["y"],
                "outputs": ["y"],
                "params": {"path": str(release), "max_s": 20},
            },
        ],
    }


def test_every_way_a_request_ends_gives_its_uids_count_back(tmp_path: Path) -> None:
    release = tmp_path / "release"
    svc = Service(
        state_dir=tmp_path / "state",
        control_path="userspace",
        pool_mb=32,
        pending_per_uid=6,
        operator_pending=0,
    ).start()
    stuck: list[concurrent.futures.Future] = []
    fe = svc.frontend
    try:
        svc.deploy(load_pipeline(_pipeline(release)))
        sub = lambda x=GOOD, **kw: svc.submit("chain", {"x": x}, **kw)  # noqa: E731
        answered = [sub(uid=UID) for _ in range(4)]
        cancelled, failing = sub(uid=UID), sub(BAD, uid=UID)  # failing: 500 in its stage
        others = [sub(uid=UID + 1), sub()]  # another uid; the operator, not counted
        assert fe.pending_by_uid() == {UID: 6, UID + 1: 1}
        # at its share: refused at arrival, nothing counted for it
        with pytest.raises(RequestError) as exc:
            sub(uid=UID)
        assert exc.value.status == 503 and "--max-pending-per-uid" in str(exc.value)
        assert exc.value.retry_after_s is not None and fe.counters["uid_quota"] == 1
        # a bad priority is refused before admission: nothing counted either
        with pytest.raises(RequestError):
            sub(priority=-1, uid=UID + 2)
        assert cancelled.cancel()
        wait_for(lambda: fe.pending_by_uid()[UID] == 5, 10, "the cancelled one given back")
        expiring = sub(uid=UID, timeout_s=0.05)  # waits in the queue past its deadline
        with pytest.raises(RequestError, match="timed out"):
            expiring.result(timeout=30)
        wait_for(lambda: fe.pending_by_uid()[UID] == 5, 10, "the expired one given back")
        release.touch()
        for f in answered + others:
            assert f.result(timeout=60).outputs["y"][0] == 1.0
        with pytest.raises(RequestError) as exc:
            failing.result(timeout=60)
        assert exc.value.status == 500, exc.value
        wait_for(lambda: fe.pending_by_uid() == {}, 30, "no request pending per uid")
        assert fe.stats()["pending_uids"] == 0 and fe.pending() == 0
        # the requests left when the service closes fail, and give their counts back too
        release.unlink()
        stuck = [sub(uid=UID) for _ in range(4)]
        assert fe.pending_by_uid() == {UID: 4}
    finally:
        svc.close(drain_timeout_s=0.2)
    done, _ = concurrent.futures.wait(stuck, timeout=30)
    assert len(done) == 4 and all(f.exception() is not None for f in done)
    assert fe.pending_by_uid() == {} and fe.stats()["pending_uids"] == 0
