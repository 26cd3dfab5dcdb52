"""The runtime: pipeline config validation, unit layout, and the service (supervisor,
instances, front end) on function-stage pipelines over both control channels.

Instances are real processes; their functions come from tests/stagefuncs.py (this
directory is put on PYTHONPATH for them).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline, pipeline_for_model
from infscaler.base.errors import ConfigError, ServiceError
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import chain_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def fan_pipeline(sum_instances: int = 2) -> dict:
    return {
        "name": "fx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["sums", "y"],
        "stages": [
            {
                "name": "scale",
                "function": "stagefuncs:scale",
                "inputs": ["x"],
                "outputs": ["y"],
                "params": {"factor": 3},
            },
            {
                "name": "split",
                "function": "stagefuncs:split_rows",
                "fan_out": True,
                "inputs": ["y"],
                "outputs": ["row"],
            },
            {
                "name": "sum",
                "function": "stagefuncs:row_sum",
                "inputs": ["row"],
                "outputs": ["s"],
                "instances": sum_instances,
            },
            {
                "name": "gather",
                "function": "stagefuncs:gather_sums",
                "fan_in": True,
                "inputs": ["s"],
                "outputs": ["sums"],
            },
        ],
    }


# -- the service -------------------------------------------------------------------------------


@pytest.fixture
def service(kind: str, tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path=kind, pool_mb=64) as svc:
        yield svc


def test_fan_out_fan_in_pipeline_answers_concurrent_requests(service: Service) -> None:
    dep = service.deploy(load_pipeline(fan_pipeline()))
    assert service.ready("fx")
    # ready only while the route takes requests (the supervisor's callback clears the
    # flag just after a replacement reads ready)
    dep.route.unavailable_reason = "pipeline fx is degraded: unit sum is restarting"
    assert not service.ready("fx") and service.ready()
    dep.route.unavailable_reason = None
    assert service.ready("fx")
    rng = np.random.default_rng(0)
    xs = [rng.random((int(rng.integers(0, 7)), 4), dtype=np.float32) for _ in range(200)]
    futs = [service.submit("fx", {"x": x}) for x in xs]
    for x, f in zip(xs, futs, strict=True):
        r = f.result(timeout=60)
        np.testing.assert_allclose(r.outputs["y"], x * 3, rtol=1e-6)
        np.testing.assert_allclose(r.outputs["sums"], (x * 3).sum(axis=1), rtol=1e-5)
        assert r.items == x.shape[0]
        assert {int(u) for u in r.trace[:, 0]} >= {0, 1, 3}
    st = service.status()
    assert st["pipelines"][0]["requests"]["success"] == 200
    sums = {u["unit"]: u for u in st["pipelines"][0]["units"]}
    assert len(sums["sum"]["instances"]) == 2
    assert sum(i["served"] for i in sums["sum"]["instances"]) >= 0  # reported once per second
    assert service.manager.audit() == []


def test_a_failing_stage_fails_its_request_alone(service: Service) -> None:
    d = chain_pipeline(instances=2)
    d["stages"][1] = {
        "name": "check",
        "function": "stagefuncs:fail_on_negative",
        "inputs": ["y"],
        "outputs": ["y"],
    }
    d["stages"][1]["function"] = "stagefuncs:fail_on_negative"
    # fail_on_negative reads x: give it x by a stage of its own
    d = {
        "name": "chain",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["y"],
        "stages": [
            {
                "name": "check",
                "function": "stagefuncs:fail_on_negative",
                "inputs": ["x"],
                "outputs": ["y"],
            },
        ],
    }
    service.deploy(load_pipeline(d))
    good = service.submit("chain", {"x": np.ones(3, np.float32)})
    bad = service.submit("chain", {"x": -np.ones(3, np.float32)})
    good2 = service.submit("chain", {"x": np.arange(3, dtype=np.float32)})
    with pytest.raises(RequestError) as exc:
        bad.result(timeout=30)
    assert exc.value.status == 500 and "negative input" in str(exc.value)
    assert "stage check" in str(exc.value)
    np.testing.assert_array_equal(good.result(timeout=30).outputs["y"], np.ones(3))
    np.testing.assert_array_equal(good2.result(timeout=30).outputs["y"], np.arange(3))


def test_function_with_wrong_outputs_is_reported(service: Service) -> None:
    d = {
        "name": "w",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["y"],
        "stages": [
            {"name": "w", "function": "stagefuncs:wrong_keys", "inputs": ["x"], "outputs": ["y"]}
        ],
    }
    service.deploy(load_pipeline(d))
    with pytest.raises(RequestError, match=r"returned \['nope'\].*declares outputs \['y'\]"):
        service.infer("w", {"x": np.ones(2, np.float32)})


def test_kill_9_under_load_every_request_answered_instance_restarted(service: Service) -> None:
    service.deploy(load_pipeline(chain_pipeline(instances=2)))
    victim = next(h for h in service.supervisor.handles() if h.unit.name == "slow")

    def kill() -> None:
        time.sleep(0.3)
        os.kill(victim.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    futs = []
    for i in range(300):
        futs.append(service.submit("chain", {"x": np.full(4, i, np.float32)}))
        time.sleep(0.002)
    killer.join()
    ok = 0
    for i, f in enumerate(futs):
        try:
            r = f.result(timeout=60)
        except RequestError as exc:  # allowed: 503 with a reason, never silence
            assert exc.status == 503 and str(exc)
            continue
        np.testing.assert_array_equal(r.outputs["y"], np.full(4, 2 * i))
        ok += 1
    assert ok >= 290
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        slow = [h for h in service.supervisor.handles() if h.unit.name == "slow"]
        if len(slow) == 2 and all(h.state == "ready" for h in slow):
            break
        time.sleep(0.1)
    assert len(slow) == 2 and all(h.state == "ready" for h in slow)
    assert any(h.restarts == 1 for h in slow) and victim.iid not in {h.iid for h in slow}
    assert service.status()["manager"]["deaths"] >= 1
    # no leaked slots: what is still in use is held by live instances (their out-tokens)
    mgr = service.manager.stats()["manager"]
    live = {i for i, v in mgr["instances"].items() if v["state"] == "live"}
    assert all(v["slots"] == 0 for i, v in mgr["instances"].items() if i not in live)
    assert mgr["slots_held"] == 0 and mgr["slots_quarantined"] == 0
    assert service.manager.audit() == []


def test_back_pressure_at_the_pool_cap_then_recovery(kind: str, tmp_path: Path) -> None:
    # 8 MB pool, 256 KB tensors, a slow stage: the front end must wait for slots, not fail
    d = chain_pipeline(instances=2)
    d["inputs"][0]["shape"] = [-1]
    d["stages"][1]["params"] = {"ms": 20}
    d["max_inflight"] = 64  # let the pool cap, not the window, bind
    with Service(state_dir=tmp_path, control_path=kind, pool_mb=8) as svc:
        svc.deploy(load_pipeline(d))
        x = np.ones(64 * 1024, np.float32)
        futs = [svc.submit("chain", {"x": x}) for _ in range(60)]
        for f in futs:
            np.testing.assert_array_equal(f.result(timeout=60).outputs["y"][:4], 2.0)
        st = svc.status()
        assert st["pool"]["mapped_mb"] <= 8.0
        fe = st["frontend"]
        assert fe.get("backpressure", 0) + fe.get("admission_waits", 0) + st["pool"]["busy"] > 0


def test_request_timeout_is_a_503_with_the_reason(service: Service) -> None:
    d = chain_pipeline(instances=2)
    d["stages"][1]["params"] = {"ms": 400}
    d["stages"][1]["instances"] = 1
    service.deploy(load_pipeline(d))
    with pytest.raises(RequestError) as exc:
        service.infer("chain", {"x": np.ones(4, np.float32)}, timeout_s=0.1)
    assert exc.value.status == 503 and "timed out" in str(exc.value)
    # the late result is dropped, the next request works
    r = service.infer("chain", {"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(r.outputs["y"], 2.0)


def test_deploy_errors_leave_nothing_running(service: Service, tmp_path: Path) -> None:
    service.deploy(load_pipeline(chain_pipeline(instances=2)))
    with pytest.raises(ServiceError) as exc:
        service.deploy(load_pipeline(chain_pipeline(instances=2)))
    assert exc.value.status == 409
    before = len(service.supervisor.handles())
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="cannot read model"):
        service.deploy(pipeline_for_model(bad))
    assert len(service.supervisor.handles()) == before
    assert [d.name for d in service.deployments()] == ["chain"]
    with pytest.raises(ServiceError) as exc:
        service.submit("nope", {})
    assert exc.value.status == 404


def test_undeploy_drains_then_stops_instances(service: Service) -> None:
    service.deploy(load_pipeline(chain_pipeline(instances=2)))
    pids = [h.pid for h in service.supervisor.handles()]
    futs = [service.submit("chain", {"x": np.ones(4, np.float32)}) for _ in range(20)]
    service.undeploy("chain")
    assert all(f.result(timeout=1).outputs["y"][0] == 2.0 for f in futs)
    assert service.supervisor.handles() == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(ServiceError):
        service.submit("chain", {"x": np.ones(4, np.float32)})
    # stage ids came back: the pipeline deploys again
    service.deploy(load_pipeline(chain_pipeline(instances=2)))
    assert service.infer("chain", {"x": np.ones(4, np.float32)}).outputs["y"][0] == 2.0


def test_instances_run_without_capabilities(service: Service) -> None:
    d = {
        "name": "caps",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": ["capeff"],
        "stages": [
            {
                "name": "c",
                "function": "stagefuncs:capabilities",
                "inputs": ["x"],
                "outputs": ["y", "capeff"],
            }
        ],
    }
    service.deploy(load_pipeline(d))
    r = service.infer("caps", {"x": np.ones(1, np.float32)})
    assert int(r.outputs["capeff"][0]) == 0


def test_window_bounds_requests_in_the_pipeline(service: Service) -> None:
    d = chain_pipeline(instances=2)
    d["stages"][1]["params"] = {"ms": 20}
    service.deploy(load_pipeline(d))
    route = service.deployment("chain").route
    assert route.max_inflight == 4  # 3 instances + 1
    futs = [service.submit("chain", {"x": np.ones(4, np.float32)}) for _ in range(30)]
    peak = 0
    while not all(f.done() for f in futs):
        with service.frontend._lock:
            inside = sum(
                1 for p in service.frontend._pending.values() if p.phase in ("running", "post")
            )
        peak = max(peak, inside)
        time.sleep(0.002)
    assert all(f.result().outputs["y"][0] == 2.0 for f in futs)
    assert 1 <= peak <= 4
    assert service.frontend.stats()["window_waits"] > 0


def test_an_engine_the_host_lacks_fails_the_deploy_with_its_reason(
    service: Service, residual_path: Path
) -> None:
    from infscaler.engines import engine_availability
    from infscaler.runtime.processes.supervisor import InstanceStartError

    ok, reason = engine_availability()["gpu"]
    if ok:
        pytest.skip("this host has a GPU engine")
    d = {"name": "g", "stages": [{"name": "m", "model": str(residual_path), "engine": "gpu"}]}
    # refused before any instance starts: the device check names the stage and the reason
    with pytest.raises((ConfigError, InstanceStartError)) as exc:
        service.deploy(load_pipeline(d))
    assert "stage m" in str(exc.value) or "unit m" in str(exc.value)
    assert reason.split(";")[0] in str(exc.value)
    assert service.deployments() == [] and service.supervisor.handles() == []


def test_instances_started_from_a_short_lived_thread_outlive_it(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG fires when the *thread* that forked an instance exits: a deploy
    from a request thread (the API's executor, a restart worker) must not kill them."""
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        t = threading.Thread(target=lambda: svc.deploy(load_pipeline(chain_pipeline(instances=2))))
        t.start()
        t.join(60)
        time.sleep(1.0)  # the thread is gone; a SIGKILL would have landed by now
        pids = [h.pid for h in svc.supervisor.handles()]
        assert pids and all(h.state == "ready" for h in svc.supervisor.handles())
        for pid in pids:
            os.kill(pid, 0)  # alive
        x = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(svc.infer("chain", {"x": x}).outputs["y"], x * 2)
        assert svc.supervisor.restarted == 0
