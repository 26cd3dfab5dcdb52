"""Asymmetric auto-scaling end to end: a load step on a pipeline with one slow stage scales
that stage (and only it) out, the end of the step scales it back in (InferLine's
hysteresis), and a device at its memory cap sheds load with a 503 that says why.

Instances are real processes running tests/stagefuncs.py functions (the slow stage
sleeps, so the test measures the control loop, not this host's two cores).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.device import DeviceProfile
from infscaler.runtime.scaling.monitor import Monitor
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import chain_pipeline, wait_for
from tests.load import ClosedLoop

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def step_pipeline(slow_ms: float = 40.0, **autoscale: object) -> dict:
    return {
        **chain_pipeline(slow_ms, max_instances=4),
        "name": "step",
        "slo": "150ms",
        "autoscale": {
            "interval_s": 0.5,
            "window_s": 2.0,
            "cooldown_s": 1.0,
            "hold_s": 2.0,
            "rate_horizon_s": 2.0,
            # the settle window and the sustain, shortened with the other timings: a
            # violation counts 1 s after a change and must last 1 s (3 looks)
            "settle_s": 1.0,
            "sustain_s": 1.0,
            **autoscale,
        },
    }


def _instances(svc: Service, unit: str) -> int:
    st = svc.pipeline_status(svc.deployment("step"))
    return next(len(u["instances"]) for u in st["units"] if u["unit"] == unit)


def _load(
    svc: Service, clients: int, seconds: float, refused: list[str] | None = None
) -> tuple[int, list[str]]:
    """Closed-loop clients; returns (answered, errors). A request the SLO admission
    refuses at arrival (503 with ``retry_after_s``) goes to ``refused`` (when given) and
    is retried after that back-off, as a client honouring Retry-After does."""
    x = np.ones((1, 4), np.float32)

    def send() -> None:
        r = svc.infer("step", {"x": x}, timeout_s=30)
        np.testing.assert_allclose(r.outputs["y"], x * 2)

    def retry(exc: RequestError) -> float | None:
        at_arrival = exc.retry_after_s and "at arrival" in str(exc)
        return exc.retry_after_s if refused is not None and at_arrival else None

    load = ClosedLoop(send, clients, retry=retry, seconds=seconds).run()
    if refused is not None:
        refused.extend(load.refused)
    return load.answered, load.errors


def test_load_step_scales_the_bottleneck_out_then_back_in(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(step_pipeline()))
        assert (_instances(svc, "scale"), _instances(svc, "slow")) == (1, 1)
        # 6 closed-loop clients on a 40 ms stage: about 240 ms with one instance > SLO 150;
        # the front end refuses at arrival what would miss the SLO, the scaler sees it
        refused: list[str] = []
        done, errors = _load(svc, clients=6, seconds=8.0, refused=refused)
        assert errors == [] and done > 0
        assert refused, "6 clients on one 40 ms instance cannot all meet a 150 ms SLO"
        peak = _instances(svc, "slow")
        assert peak >= 2, svc.autoscaler.decisions("step")
        assert _instances(svc, "scale") == 1  # asymmetric: the fast stage is left alone
        outs = [d for d in svc.autoscaler.decisions("step") if d["action"] == "scale_out"]
        assert outs and all(d["unit"] == 1 and d["engine"] == "cpu" for d in outs)
        assert "SLO" in outs[0]["reason"]
        # the step ends: after the hold time, instances come back one at a time
        deadline = time.monotonic() + 30
        while _instances(svc, "slow") > 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _instances(svc, "slow") == 1, svc.autoscaler.decisions("step")
        ins = [d for d in svc.autoscaler.decisions("step") if d["action"] == "scale_in"]
        assert len(ins) >= peak - 1
        # nothing was lost, and the shrunk pipeline still answers
        r = svc.infer("step", {"x": np.full((1, 4), 3, np.float32)})
        np.testing.assert_allclose(r.outputs["y"], np.full((1, 4), 6, np.float32))
        assert svc.manager.audit() == []


def test_the_deploy_counts_as_the_first_change(tmp_path: Path) -> None:
    # the scaler's hold and its windows start at the deploy: a window reaching back
    # before it divided the first seconds' arrivals by the whole window (a rate
    # underestimated up to window / age times, right when the bench measures)
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        dep = svc.deploy(load_pipeline(step_pipeline(hold_s=30.0)))
        wall, mono = time.time(), time.monotonic()
        deadline = mono + 10
        while svc.autoscaler.state("step") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        st = svc.autoscaler.state("step")
        assert st is not None and st.last_change is not None
        deployed_mono = mono - (wall - dep.deployed_at)
        assert abs(st.last_change - deployed_mono) < 0.05
        assert svc.autoscaler.decisions("step") == []


def test_at_the_memory_cap_the_pipeline_sheds_load_with_a_reason(tmp_path: Path) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(step_pipeline(slow_ms=60.0, cooldown_s=0.5)))
        time.sleep(1.5)  # instances report their USS once a second
        used = Monitor(svc).memory_used_mb()
        # a device whose cap leaves no room for one more instance (a forked instance of
        # this function stage is ~13-20 MB PSS since the zygote: any is > 2 MB)
        svc.device = DeviceProfile(
            name="tiny",
            soc="test device",
            memory_mb=int(used) + 4096,
            memory_cap_mb=int(used) + 2,
            accelerators=[{"engine": "cpu", "max_instances": 8}],
        )
        done, errors = _load(svc, clients=8, seconds=6.0)
        assert _instances(svc, "slow") == 1  # never above the cap
        sheds = [d for d in svc.autoscaler.decisions("step") if d["action"] == "shed"]
        assert sheds and sheds[0]["queue_limit"] >= 1, svc.autoscaler.decisions("step")
        assert "cap" in sheds[0]["reason"]
        assert errors, "a bounded queue must have refused some requests"
        # refused by the shed bound, or already at arrival by the SLO admission
        assert all("sheds load" in e or "at arrival" in e for e in errors), errors[:3]
        assert done > 0
        with pytest.raises(RequestError) as exc:
            for _ in range(100):
                svc.submit("step", {"x": np.ones((1, 4), np.float32)})
        assert exc.value.status == 503 and ("limit" in str(exc.value) or "SLO" in str(exc.value))


# -- dynamic batching (MArk §4) ------------------------------------------------------------


def _batch_pipeline(path: Path, policy: str, **extra: object) -> dict:
    return {
        "name": "bx",
        "slo": "500ms",
        **extra,
        "stages": [
            {
                "name": "block",
                "model": str(path),
                "batching": {"max_batch": 4, "max_delay_ms": 40, "policy": policy},
            }
        ],
    }


def test_dynamic_batching_stacks_requests_and_splits_results(tmp_path: Path) -> None:
    import onnxruntime as ort

    from tests.helpers import residual_model, save

    path = save(residual_model(batch="N"), tmp_path / "block.onnx")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    xs = [rng.random((int(rng.integers(1, 3)), 4, 8, 8), dtype=np.float32) for _ in range(16)]
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(_batch_pipeline(path, "fixed")))
        futs = [svc.submit("bx", {"x": x}) for x in xs]
        for x, f in zip(xs, futs, strict=True):
            y = f.result(timeout=30).outputs["y"]
            np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        time.sleep(1.5)  # instances report every second
        (h,) = svc.supervisor.handles()
        assert h.stats["batches"] >= 1 and h.stats["batched"] >= 2, h.stats
        assert h.stats["batch"] == 4
        assert set(h.info["batch_ms"]) == {"1", "2", "4"}  # T_b measured at load


def test_mark_policy_lets_the_autoscaler_pick_the_batch(tmp_path: Path) -> None:
    """The wiring of MArk batching: each instance measures T_b at load, the autoscaler
    picks b from T_b and the measured arrival rate (choose_batch), and the instance runs
    what it was told. (On this tiny model T_b is ~flat, so batching pays only at rates
    a Python client cannot offer: the choice itself is checked in test_batching.py.)"""
    from infscaler.runtime.serving.batching import choose_batch, decide_batching, live_batch_ms
    from tests.helpers import residual_model, save

    path = save(residual_model(batch="N"), tmp_path / "block.onnx")
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        dep = svc.deploy(load_pipeline(_batch_pipeline(path, "mark")))
        (h,) = svc.supervisor.handles()
        profile = {int(b): ms for b, ms in h.info["batch_ms"].items()}
        assert sorted(profile) == [1, 2, 4] and all(ms > 0 for ms in profile.values())
        assert h.stats.get("batch", 1) == 1  # mark starts unbatched
        x = np.ones((1, 4, 8, 8), np.float32)
        for f in [svc.submit("bx", {"x": x}) for _ in range(40)]:
            f.result(timeout=30)
        ran = lambda: svc.supervisor.exec_totals.get(("bx", 0)).executions >= 40  # noqa: E731
        wait_for(ran, 20.0, "the instance's report of 40 runs")
        sent = svc.autoscaler.tune_batches(dep)
        rate = Monitor(svc, 10.0).pipeline(dep).arrival_rate
        assert rate > 0
        # T_b of the sizes run often enough replace those timed at load
        now = {**profile, **live_batch_ms(svc.supervisor.exec_totals.get(("bx", 0)))}
        assert set(now) == {1, 2, 4}
        decided = decide_batching(now, 500.0, max_batch=4)
        expected = choose_batch(now, rate, 500.0, max_batch=4).batch_size if decided.on else 1
        assert svc.autoscaler.batch_decisions[("bx", 0)] == decided
        (unit,) = svc.pipeline_status(dep)["units"]
        assert unit["exec"]["batching"] == decided.reason and "ms per item" in decided.reason
        assert sent.get(h.iid, svc.autoscaler._sent.get((h.iid, h.pid))) == expected
        # a command the instance obeys: batches of 4 once inputs queue up
        assert svc.supervisor.command(h, {"cmd": "batch", "size": 4, "delay_ms": 50})
        time.sleep(0.3)
        import onnxruntime as ort

        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        xs = [x * i for i in range(16)]
        futs = [svc.submit("bx", {"x": xi}) for xi in xs]
        for xi, f in zip(xs, futs, strict=True):
            y = f.result(timeout=30).outputs["y"]
            np.testing.assert_allclose(y, ref.run(None, {"x": xi})[0], rtol=1e-5, atol=1e-6)
        time.sleep(1.5)
        assert h.stats["batch"] == 4 and h.stats["batches"] >= 1, h.stats


def test_without_an_slo_batching_is_decided_by_the_measured_profile(tmp_path: Path) -> None:
    """``policy: mark`` with no SLO: batching on only where the instance's measured T_b
    save per item (decide_batching), the decision recorded with its ms per item."""
    from infscaler.runtime.serving.batching import decide_batching
    from tests.helpers import residual_model, save

    path = save(residual_model(batch="N"), tmp_path / "block.onnx")
    data = _batch_pipeline(path, "mark")
    del data["slo"]
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        dep = svc.deploy(load_pipeline(data))
        (h,) = svc.supervisor.handles()
        profile = {int(b): ms for b, ms in h.info["batch_ms"].items()}
        svc.autoscaler.tune_batches(dep)
        decided = svc.autoscaler.batch_decisions[("bx", 0)]
        assert decided == decide_batching(profile, None, max_batch=4)
        size = decided.batch_size if decided.on else 1
        assert svc.autoscaler._sent[(h.iid, h.pid)] == size
        actions = [d["action"] for d in svc.autoscaler.decisions("bx")]
        assert actions.count("batch_on" if decided.on else "batch_off") == 1
        svc.autoscaler.tune_batches(dep)  # the same decision is not recorded again
        assert len(svc.autoscaler.decisions("bx")) == len(actions)
        # the instance runs what it was told (it reports once it served something)
        svc.submit("bx", {"x": np.ones((1, 4, 8, 8), np.float32)}).result(timeout=30)
        wait_for(lambda: "batch" in h.stats, 10.0, "a stats report")
        assert h.stats["batch"] == size, h.stats


def test_batching_stays_off_away_from_the_bottleneck(tmp_path: Path) -> None:
    """A light batching model stage before a slow stage (30 ms a request): batching there
    would add its wait and no throughput, so it stays off, and the decision says why."""
    from infscaler.runtime.serving.batching import decide_batching
    from tests.helpers import residual_model, save

    path = save(residual_model(batch="N"), tmp_path / "block.onnx")
    data = _batch_pipeline(path, "mark")
    data["stages"].append(
        {
            "name": "slow",
            "function": "stagefuncs:slow",
            "inputs": ["y"],
            "outputs": ["y"],
            "params": {"ms": 30.0},
            "fuse": False,
        }
    )
    data["inputs"] = [{"name": "x", "datatype": "FP32", "shape": [-1, 4, 8, 8]}]
    data["outputs"] = ["y"]
    data["stages"][0].update(inputs={"x": "x"}, outputs={"y": "y"})
    del data["slo"]
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        dep = svc.deploy(load_pipeline(data))
        x = np.ones((1, 4, 8, 8), np.float32)
        for _ in range(10):
            svc.submit("bx", {"x": x}).result(timeout=30)
        svc.autoscaler.tune_batches(dep)
        decided = svc.autoscaler.batch_decisions[("bx", 0)]
        assert not decided.on and decided.batch_size == 1
        (h,) = svc.supervisor.handles(("bx", 0))
        profile = {int(b): ms for b, ms in h.info["batch_ms"].items()}
        if decide_batching(profile, None, max_batch=4).on:  # it would pay on its own
            assert "not the bottleneck" in decided.reason, decided.reason


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cpu cores")
def test_a_unit_s_instances_spread_over_the_cores(tmp_path: Path) -> None:
    # scale (unit 0) and slow (unit 1) start on two different cores; a second instance
    # of scale goes to the core its first one does not use (a cursor alone put it on
    # the same core: slow's instance had started in between), and a scale-in stops the
    # instance sharing a core with its unit's others, not the other
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        dep = svc.deploy(load_pipeline(chain_pipeline(2, max_instances=4)))

        def cores(unit: int) -> list[list[int]]:
            hs = sorted(svc.supervisor.handles(("chain", unit)), key=lambda h: h.started)
            return [list(h.cores) for h in hs if h.state in ("starting", "ready")]

        (first,) = cores(0)
        assert len(first) == 1 and cores(1) != [first]
        svc.scale_out(dep, 0, "cpu")
        a, b = cores(0)
        assert a != b, (a, b)
        svc.scale_out(dep, 0, "cpu")  # a third on 2 cores shares one with a sibling
        assert len(cores(0)) == 3
        assert svc.scale_in(dep, 0, "cpu")
        left = cores(0)
        assert len(left) == 2 and left[0] != left[1], left
        x = np.ones((1, 4), np.float32)
        np.testing.assert_allclose(svc.infer("chain", {"x": x}).outputs["y"], x * 2)
