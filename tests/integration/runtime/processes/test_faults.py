"""Faults a service must survive unattended: restarts that never give up (with backoff),
degraded health and a fast 503 while a unit has no instance, the /dev/shm slabs a killed
run left, and the cpu core cap (pinned threads, never busy cores) at deploy and in the
scaler.

Instances are real processes; their functions come from tests/stagefuncs.py.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.device import DeviceProfile
from infscaler.runtime.processes.supervisor import RestartPolicy
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, wait_served
from tests.helpers import wait_for as _wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

SHM = Path("/dev/shm")
#: poll every 20 ms: the quick-kills test must kill each replacement while it loads
wait_for = functools.partial(_wait_for, interval=0.02)


def slow_handle(svc: Service, ready: bool = False):
    for h in svc.supervisor.handles():
        if h.unit.name == "slow" and (h.state == "ready" or not ready):
            return h
    return None


# -- never give up -----------------------------------------------------------------------------


def test_eight_quick_kills_the_unit_comes_back(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        svc.supervisor.policy = RestartPolicy(max_s=0.8)  # the cap, not the count, bounds it
        svc.deploy(load_pipeline(chain_pipeline()))
        killed: set[int] = set()
        streaks = []
        for _ in range(8):  # each replacement killed as soon as it exists (while loading)
            h = wait_for(
                lambda: next(
                    (
                        h
                        for h in svc.supervisor.handles()
                        if h.unit.name == "slow" and h.pid not in killed
                    ),
                    None,
                ),
                30,
                "a replacement instance",
            )
            killed.add(h.pid)
            os.kill(h.pid, signal.SIGKILL)
            streaks.append(h.streak)
        # the count grew (no healthy run in between), and the 9th instance is left alone
        assert streaks[-1] >= 5, streaks
        # a killed instance can still read "ready" until the supervisor has seen its
        # death: wait for a ready one that was not killed
        back = wait_for(
            lambda: next(
                (
                    h
                    for h in svc.supervisor.handles()
                    if h.unit.name == "slow" and h.state == "ready" and h.pid not in killed
                ),
                None,
            ),
            60,
            "the unit back",
        )
        assert back.pid not in killed and back.restarts == 8
        assert svc.supervisor.restarted >= 8
        # the route learns of the ready replacement just after the handle reads ready
        wait_served(svc, "chain")
        x = np.ones((1, 4), np.float32)
        np.testing.assert_allclose(svc.infer("chain", {"x": x}).outputs["y"], 2 * x)


# -- degraded health + fast 503 --------------------------------------------------------------


def test_a_unit_waiting_for_its_restart_degrades_and_answers_503_fast(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        # a long first delay: the unit stays down for seconds, as in a crash loop
        svc.supervisor.policy = RestartPolicy(initial_s=4.0, max_s=4.0)
        svc.deploy(load_pipeline(chain_pipeline(ms=400)))
        victim = slow_handle(svc, ready=True)
        inside = svc.submit("chain", {"x": np.ones((1, 4), np.float32)})
        time.sleep(0.15)  # the request is in the slow instance now
        os.kill(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        wait_for(lambda: svc.degraded("chain"), 5, "the pipeline degraded")
        # the request that was inside is answered at once, not after the 30 s hold
        with pytest.raises(RequestError) as exc:
            inside.result(timeout=10)
        assert exc.value.status == 503 and "slow" in str(exc.value)
        assert time.monotonic() - t0 < 3.0
        # new requests: a fast 503 naming the unit, with Retry-After
        t1 = time.monotonic()
        with pytest.raises(RequestError) as exc:
            svc.submit("chain", {"x": np.ones((1, 4), np.float32)})
        assert time.monotonic() - t1 < 0.5
        assert exc.value.status == 503 and "unit slow has no live instance" in str(exc.value)
        assert exc.value.retry_after_s is not None and 0 < exc.value.retry_after_s <= 10
        # health: the pipeline is not ready and says why; the service as a whole is
        assert not svc.ready("chain") and svc.ready()
        (why,) = svc.degraded("chain")
        assert "restart 1 in" in why and "exited with status -9" in why
        status = svc.status()
        assert status["health"] == "degraded" and status["ready"] is True
        (pipe,) = status["pipelines"]
        slow = next(u for u in pipe["units"] if u["unit"] == "slow")
        assert [r["state"] for r in slow["restarting"]] == ["restarting"]
        # `infscaler status` shows it
        from infscaler.cli import service as cli_service

        with cli_service.out.capture() as cap:
            cli_service.print_status(status)
        text = cap.get()
        assert "DEGRADED" in text and "restart 1 in" in text and "degraded: unit slow" in text
        assert pipe["degraded"] == [why] or pipe["degraded"][0].startswith("unit slow")
        # it comes back by itself, and serves again
        wait_for(lambda: svc.ready("chain"), 30, "the unit back")
        assert svc.degraded("chain") == [] and svc.status()["health"] == "ok"
        x = np.ones((1, 4), np.float32)
        np.testing.assert_allclose(svc.infer("chain", {"x": x}).outputs["y"], 2 * x)


def test_undeploy_cancels_a_pending_restart(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        svc.supervisor.policy = RestartPolicy(initial_s=1.5, max_s=1.5)
        svc.deploy(load_pipeline(chain_pipeline()))
        os.kill(slow_handle(svc, ready=True).pid, signal.SIGKILL)
        wait_for(lambda: svc.supervisor.pending_restarts(), 5, "a pending restart")
        svc.undeploy("chain")
        time.sleep(2.5)  # past the delay: nothing of the pipeline may start
        assert svc.supervisor.handles() == [] and svc.supervisor.pending_restarts() == []


# -- stale slabs of a killed run -------------------------------------------------------------

_SERVE = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from infscaler.base.config import load_pipeline
    from infscaler.service.service import Service
    svc = Service(state_dir=sys.argv[1], control_path="userspace", pool_mb=64).start()
    svc.deploy(load_pipeline(json.loads(sys.argv[2])))
    for _ in range(5):
        svc.infer("chain", {"x": np.ones((64, 4), np.float32)})
    print(svc.pool.service_id, flush=True)
    time.sleep(600)
    """
)


def _slabs(service_id: str) -> list[str]:
    return sorted(p.name for p in SHM.glob(f"isc-{service_id}-*"))


def test_slabs_of_a_killed_service_are_removed_by_the_next_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(state), json.dumps(chain_pipeline())],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        sid = proc.stdout.readline().strip()
        assert sid, "the service did not start"
        assert _slabs(sid), "the service mapped no slab"
        record = json.loads((state / "pools" / f"{sid}.json").read_text())
        assert record["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait(10)
    assert _slabs(sid), "kill -9 left no slab: nothing to test"
    # objects that are not that run's slabs are never touched
    other = SHM / "isc-notours123-0"
    foreign = SHM / f"unrelated-{os.getpid()}"
    for p in (other, foreign):
        p.write_bytes(b"x")
    try:
        with Service(state_dir=state, control_path="userspace", pool_mb=64) as svc:
            assert _slabs(sid) == []
            assert other.exists() and foreign.exists()
            assert not (state / "pools" / f"{sid}.json").exists()
            assert (state / "pools" / f"{svc.pool.service_id}.json").exists()
            # a live service's record (this one) survives a second start on the dir
            with Service(state_dir=state, control_path="userspace", pool_mb=64) as svc2:
                assert (state / "pools" / f"{svc.pool.service_id}.json").exists()
                assert svc2.pool.service_id != svc.pool.service_id
        assert not (state / "pools" / f"{svc.pool.service_id}.json").exists()  # clean close
    finally:
        for p in (other, foreign):
            p.unlink(missing_ok=True)


def _profile(cores: int, threads_per_core: float = 1.0) -> DeviceProfile:
    return DeviceProfile(
        name="two-core",
        soc="test",
        memory_mb=8192,
        memory_cap_mb=4096,
        accelerators=[
            {
                "engine": "cpu",
                "cores": list(range(cores)),
                "max_instances": 8,
                "threads_per_core": threads_per_core,
            }
        ],
    )


def test_deploy_beyond_the_thread_slots_warns_and_the_scaler_keeps_the_cap(
    tmp_path: Path, residual_path: Path
) -> None:
    """The operator's configuration is deployed even when its pinned threads pass the
    profile's slots (a warning says so); the scaler, which counts pinned threads against
    the slots, then adds no cpu instance (the scaler case: test_scaler_refuses_a_cpu_instance_beyond_the_pinned_thread_slots)."""
    if len(os.sched_getaffinity(0)) < 1:
        pytest.skip("no usable core")
    one = {"name": "m", "stages": [{"name": "part", "model": str(residual_path), "instances": 1}]}
    two = {"name": "n", "stages": [{"name": "part", "model": str(residual_path), "instances": 2}]}
    with Service(
        state_dir=tmp_path, device=_profile(2), control_path="userspace", pool_mb=64
    ) as svc:
        svc.deploy(load_pipeline(one))
        notes: list[str] = []
        svc.deploy(load_pipeline(two), progress=notes.append)  # 1 + 2 pinned > 2 slots
        assert any("1 already pinned by other deployments" in n for n in notes), notes
        assert sorted(d.name for d in svc.deployments()) == ["m", "n"]
        # the monitor hands the scaler pinned threads, and the cap in thread slots
        from infscaler.runtime.scaling.monitor import Monitor

        mon = Monitor(svc)
        snap = mon.snapshot(svc.deployment("m"))
        assert snap.cores_used == 3 and snap.cap.cores == 2  # full: no scale-out on cpu


def test_the_api_says_degraded_and_sends_retry_after(tmp_path: Path) -> None:
    import httpx

    from infscaler.api.server import ServerThread

    sock = tmp_path / "api.sock"
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=64) as svc:
        svc.supervisor.policy = RestartPolicy(initial_s=3.0, max_s=3.0)
        svc.deploy(load_pipeline(chain_pipeline()))
        with ServerThread(svc, sock):
            transport = httpx.HTTPTransport(uds=str(sock))
            with httpx.Client(transport=transport, base_url="http://x", timeout=30) as h:
                os.kill(slow_handle(svc, ready=True).pid, signal.SIGKILL)
                wait_for(lambda: svc.degraded("chain"), 5, "degraded")
                body = {
                    "inputs": [
                        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
                    ]
                }
                r = h.post("/v2/models/chain/infer", json=body)
                assert r.status_code == 503 and "unit slow has no live instance" in r.text
                assert 1 <= int(r.headers["Retry-After"]) <= 10
                r = h.get("/v2/models/chain/ready")
                assert r.status_code == 503 and "unit slow has no live instance" in r.text
                assert h.get("/v2/health/ready").status_code == 200  # the service is
                wait_for(lambda: svc.ready("chain"), 30, "back")
                assert h.get("/v2/models/chain/ready").status_code == 200
                r = h.post("/v2/models/chain/infer", json=body)
                assert r.status_code == 200, r.text
