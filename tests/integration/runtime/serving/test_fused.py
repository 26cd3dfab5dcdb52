"""Fused units (issue 14): function stages next to a model stage run inside that model
unit's instances (:func:`infscaler.runtime.serving.pipeline.fuse_units`).

The fusion rule on small pipelines built here (an onnx.helper model ``y = x @ W + b``
and the function stages of tests/fusefuncs.py), then served: the same outputs as the
unfused pipeline, fan-out / fan-in across fused units, a step's error failing only its
request (400 for StageInputError), per-step statistics, a fused instance killed -9 under
load, the unit profile summing its steps; and the bundled ``ocr`` pipeline's units.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import f32, make_model, save, wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

W = (np.arange(16, dtype=np.float32).reshape(4, 4) / 10.0 - 0.5).astype(np.float32)
B = np.array([0.1, -0.2, 0.3, 0.0], np.float32)


def linear_model(path: Path) -> Path:
    """``out = inp @ W + B``, FP32 [N, 4] -> [N, 4]."""
    nodes = [
        helper.make_node("MatMul", ["inp", "W"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "B"], ["out"], name="add"),
    ]
    m = make_model(nodes, [f32("inp", ["N", 4])], [f32("out", ["N", 4])], {"W": W, "B": B})
    return save(m, path)


def fan_pipeline(model: Path, name: str = "fz", **extra) -> dict:
    """x -> prep -> m1 -> post -> rows (fan-out) -> row_prep -> m2 -> row_post -> gather."""
    return {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["sums", "z", "pid"],
        "stages": [
            {"name": "prep", "function": "fusefuncs:prep", "inputs": ["x"], "outputs": ["inp"]},
            {"name": "m1", "model": str(model), "outputs": {"out": "out"}},
            {
                "name": "post",
                "function": "fusefuncs:post",
                "inputs": ["out"],
                "outputs": ["z", "pid"],
            },
            {
                "name": "rows",
                "function": "fusefuncs:rows",
                "fan_out": True,
                "inputs": ["z"],
                "outputs": ["row"],
            },
            {
                "name": "row_prep",
                "function": "fusefuncs:row_prep",
                "inputs": ["row"],
                "outputs": ["r"],
            },
            {"name": "m2", "model": str(model), "inputs": {"inp": "r"}, "outputs": {"out": "o2"}},
            {
                "name": "row_post",
                "function": "fusefuncs:row_post",
                "inputs": ["o2"],
                "outputs": ["s"],
            },
            {
                "name": "gather",
                "function": "fusefuncs:gather",
                "fan_in": True,
                "inputs": ["s"],
                "outputs": ["sums"],
            },
        ],
        **extra,
    }


def expected(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    z = (x * 2) @ W + B + 1
    sums = ((z * 0.5) @ W + B).sum(axis=1)
    return z.astype(np.float32), sums.astype(np.float32)


def stage(d: dict, name: str) -> dict:
    return next(s for s in d["stages"] if s["name"] == name)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return linear_model(tmp_path / "linear.onnx")


# -- served -----------------------------------------------------------------------------------


@pytest.fixture
def service(tmp_path: Path):
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=64) as svc:
        yield svc


def handles_of(svc: Service, pipeline: str, unit: str) -> list:
    return [h for h in svc.supervisor.handles() if h.key[0] == pipeline and h.unit.name == unit]


def proc_state(pid: int) -> str:
    """The one-letter state of process ``pid`` (``T``: stopped), from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_fused_outputs_equal_the_unfused_pipeline(service: Service, model: Path) -> None:
    service.deploy(load_pipeline(fan_pipeline(model, "fz")))
    service.deploy(load_pipeline(fan_pipeline(model, "apart", fuse=False)))
    mine = [h for h in service.supervisor.handles() if h.key[0] == "fz"]
    apart = [h for h in service.supervisor.handles() if h.key[0] == "apart"]
    assert len(mine) == 2 and len(apart) == 7  # instance processes: 7 -> 2
    rng = np.random.default_rng(1)
    for n in (1, 3, 5):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        got = service.infer("fz", {"x": x}).outputs
        ref = service.infer("apart", {"x": x}).outputs
        z, sums = expected(x)
        for out in (got, ref):
            np.testing.assert_allclose(out["z"], z, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(out["sums"], sums, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got["z"], ref["z"])
        np.testing.assert_array_equal(got["sums"], ref["sums"])
        # post ran in the fused model instance's process; apart, in its own
        (fused,) = handles_of(service, "fz", "prep>m1>post>rows")
        assert int(got["pid"][0]) == fused.pid
        (post,) = handles_of(service, "apart", "post")
        assert int(ref["pid"][0]) == post.pid
    # one trace row per unit: the response's per-unit times name the fused units
    res = service.infer("fz", {"x": np.ones((2, 4), np.float32)})
    ms = res.unit_ms([u.name for u in service.deployment("fz").pipeline.units])
    assert ms["prep>m1>post>rows"] > 0 and ms["row_prep>m2>row_post"] > 0


def test_a_failing_step_fails_only_its_request(service: Service, model: Path) -> None:
    d = fan_pipeline(model)
    stage(d, "row_post")["params"] = {"limit": 50.0}
    service.deploy(load_pipeline(d))
    good = np.full((2, 4), 0.1, np.float32)
    big = np.full((2, 4), 30.0, np.float32)  # a row sum past the limit in row_post
    nan = np.array([[np.nan, 0, 0, 0]], np.float32)
    futs = [
        service.submit("fz", {"x": x})
        for x in (good, np.zeros((0, 4), np.float32), good, nan, big, good)
    ]
    with pytest.raises(RequestError) as empty:
        futs[1].result(timeout=60)
    assert empty.value.status == 400 and "stage prep" in str(empty.value)
    assert "x is empty" in str(empty.value)
    with pytest.raises(RequestError) as bad:
        futs[3].result(timeout=60)
    assert bad.value.status == 500 and "stage prep" in str(bad.value) and "NaN" in str(bad.value)
    with pytest.raises(RequestError) as late:
        futs[4].result(timeout=60)
    assert late.value.status == 500 and "stage row_post" in str(late.value)
    assert "above 50" in str(late.value)
    _z, sums = expected(good)
    for f in (futs[0], futs[2], futs[5]):
        np.testing.assert_allclose(f.result(timeout=60).outputs["sums"], sums, rtol=1e-5)
    # the instances went on
    np.testing.assert_allclose(service.infer("fz", {"x": good}).outputs["sums"], sums, rtol=1e-5)


def test_a_fused_fan_out_with_no_items_answers(service: Service, model: Path) -> None:
    d = fan_pipeline(model)
    stage(d, "rows")["params"] = {"min_sum": 10.0}
    service.deploy(load_pipeline(d))
    for x in (np.zeros((2, 4), np.float32), np.full((3, 4), 3.0, np.float32)):
        z, sums = expected(x)
        keep = z.sum(axis=1) > 10.0
        res = service.infer("fz", {"x": x})
        # z and pid, written by steps of the fan-out unit, reach the response either way
        np.testing.assert_allclose(res.outputs["z"], z, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(res.outputs["sums"], sums[keep], rtol=1e-5, atol=1e-5)
        assert res.outputs["sums"].shape == (int(keep.sum()),)
    assert keep.sum() == 3  # the second input made items; the first made none


def test_per_step_statistics_in_status_and_monitor(service: Service, model: Path) -> None:
    from infscaler.runtime.scaling.monitor import Monitor

    d = fan_pipeline(model)
    stage(d, "post")["params"] = {"ms": 20.0}
    service.deploy(load_pipeline(d))
    # the fork server imported the fused steps' module before forking their instances
    assert "fusefuncs" in service.status()["zygote"]["modules"]
    for n in (1, 2, 3):
        service.infer("fz", {"x": np.ones((n, 4), np.float32)})

    def steps() -> list | None:  # stats reports come every second
        first, per_item, _ = service.status()["pipelines"][0]["units"]
        done = all(s["served"] == 3 for s in first["steps"]) and all(
            s["served"] == 6
            for s in per_item["steps"]  # 1 + 2 + 3 rows
        )
        return first["steps"] if done else None

    got = wait_for(steps, 30, "per-step stats of the fused units")
    assert [s["step"] for s in got] == ["prep", "m1", "post", "rows"]
    assert [s["kind"] for s in got] == ["function", "model", "function", "function"]
    by = {s["step"]: s for s in got}
    assert by["post"]["mean_ms"] >= 20.0 and by["post"]["errors"] == 0
    inst = service.status()["pipelines"][0]["units"][1]["instances"][0]
    assert [s["step"] for s in inst["steps"]] == ["row_prep", "m2", "row_post"]
    assert sum(s["served"] for s in inst["steps"]) == 3 * 6  # 6 items, 3 steps each
    dep = service.deployment("fz")
    m = Monitor(service).pipeline(dep)
    assert m.units[0].step_ms["post"] >= 20.0 and set(m.units[0].step_ms) == set(by)
    # the unit's service time is the sum of its steps: one trace row spans them all
    assert m.units[0].compute_p50_ms is not None and m.units[0].compute_p50_ms >= 20.0
    assert m.units[2].step_ms == {}  # the fan-in, run by the front end
    # `infscaler status` lists the steps under their unit
    from infscaler.cli import out
    from infscaler.cli.client import print_status

    with out.capture() as cap:
        print_status(service.status())
    text = cap.get()
    assert "prep>m1>post>rows" in text and f"post {by['post']['mean_ms']:.1f} ms" in text
    # before the unit has samples the scaler sees the model's plan latency plus its
    # function steps' measured mean (prep, post, rows)
    dep.pipeline.units[0].plan_latency_ms = {"cpu": 1.0}
    idle = dataclasses.replace(m.units[0], compute_p50_ms=None)
    snap = Monitor(service).snapshot(dep, dataclasses.replace(m, units=(idle, *m.units[1:])))
    fn = sum(m.units[0].step_ms[k] for k in ("prep", "post", "rows"))
    (cpu,) = snap.units[0].options
    assert cpu.latency_ms == pytest.approx(1.0 + fn) and cpu.latency_ms > 20.0
    # a monitor that has not measured busy cores yet counts every pinned thread as busy
    # (not "no bound": a deploy's first-second refusals grew instances onto busy cores)
    s0 = Monitor(service).snapshot(dep, m)
    assert s0.cap.physical_cores >= 1 and s0.cores_used >= 1
    assert s0.cores_busy == pytest.approx(min(s0.cores_used, s0.cap.physical_cores))


def test_kill_9_of_a_fused_instance_under_load(service: Service, model: Path) -> None:
    d = fan_pipeline(model)
    stage(d, "m1")["instances"] = 2
    stage(d, "post")["params"] = {"ms": 5.0}  # both instances stay busy: a queue builds
    service.deploy(load_pipeline(d))
    unit = "prep>m1>post>rows"
    victim = handles_of(service, "fz", unit)[0]

    def unacked() -> int:
        """DATA the channel delivered to the victim that it has not acknowledged."""
        inst = service.manager.stats()["channel"]["instances"].get(victim.iid, {})
        return int(inst.get("inflight", 0))

    # Killed with requests in hand whatever the host's load (a kill at a fixed time
    # found the victim between requests on a busy host: nothing to retry). It is
    # stopped mid-load while requests keep coming: stopped, it acknowledges nothing
    # more, so what the channel counts in its hands only grows (ties in the routing
    # alternate, so it gets some); two reads of at least one (the second after the
    # router read whatever it sent before it stopped), then SIGKILL.
    stopped = threading.Event()
    failed: list[BaseException] = []
    seen: list[int] = []
    held_at_kill: list[int] = []  # pool slots the stopped victim held when killed

    def holding() -> bool:
        seen.append(unacked())
        return len(seen) >= 2 and min(seen[-2:]) >= 1

    def kill() -> None:
        try:
            os.kill(victim.pid, signal.SIGSTOP)
            wait_for(lambda: proc_state(victim.pid) == "T", 30, "the victim stopped")
            stopped.set()
            wait_for(holding, 60, "requests in the stopped victim's hands", interval=0.01)
        except BaseException as exc:  # reported by the test thread (assert not failed)
            failed.append(exc)
        finally:
            stopped.set()
            with contextlib.suppress(Exception):  # stopped: what it holds cannot change
                insts = service.manager.stats()["manager"]["instances"]
                held_at_kill.append(int(insts.get(victim.iid, {}).get("slots", 0)))
            os.kill(victim.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill)
    xs = [np.full((2, 4), i / 100, np.float32) for i in range(200)]
    futs = []
    for i, x in enumerate(xs):
        if i == 60:  # a queue has built: stop the victim, then go on submitting
            killer.start()
            assert stopped.wait(60)
        futs.append(service.submit("fz", {"x": x}))
        time.sleep(0.003)
    killer.join()
    assert not failed, failed
    assert seen[-1] >= 1
    ok = 0
    for x, f in zip(xs, futs, strict=True):
        try:
            r = f.result(timeout=120)
        except RequestError as exc:  # allowed: 503 with a reason, never silence
            assert exc.status == 503 and str(exc)
            continue
        np.testing.assert_allclose(r.outputs["sums"], expected(x)[1], rtol=1e-5, atol=1e-5)
        ok += 1
    assert ok >= 190, f"{ok} of 200 answered"

    def back() -> list | None:
        hs = handles_of(service, "fz", unit)
        return hs if len(hs) == 2 and all(h.state == "ready" for h in hs) else None

    hs = wait_for(back, 60, "the fused unit back at 2 instances")
    assert victim.iid not in {h.iid for h in hs} and any(h.restarts == 1 for h in hs)
    assert service.status()["manager"]["deaths"] >= 1
    # tokens reclaimed: nothing held by the dead instance, nothing leaked
    mgr = service.manager.stats()["manager"]
    live = {i for i, v in mgr["instances"].items() if v["state"] == "live"}
    assert all(v["slots"] == 0 for i, v in mgr["instances"].items() if i not in live)
    assert mgr["slots_held"] == 0 and mgr["slots_quarantined"] == 0
    assert service.manager.audit() == []
    # the victim's requests were re-routed to the live instance; the slots it held when
    # killed went back to the pool or on with the retried requests (the dead instance
    # holds none, nothing is held or quarantined: asserted above); how many of each
    # depends on where the stop found it, so no count is asserted for either
    assert mgr["retried"] >= 1 and held_at_kill, (held_at_kill, mgr)
    x = np.ones((3, 4), np.float32)
    np.testing.assert_allclose(
        service.infer("fz", {"x": x}).outputs["sums"], expected(x)[1], rtol=1e-5
    )
