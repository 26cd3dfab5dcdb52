"""Threads per instance at low concurrency, live, driven by one closed-loop client (one
request in flight): a cpu model deployed as 2 single-thread instances is merged by the
autoscaler (:mod:`infscaler.runtime.scaling.threads`) into one instance running 2 intra-op
threads (scale_in, then scale_up make-before-break); the same model partitioned K = 2 at
one single-thread instance per partition has both partitions widened to 2 threads
(scale_up each). Every request is answered correctly throughout, and the move's trial
reaches a verdict. Whether it is kept depends on this host's speedup, so the test asserts
the move and that a verdict came, not which; no timing assertions.

The model is test_scale_threads.py's chain of MatMul + Relu layers.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from infscaler.base.config import load_pipeline
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import wait_for
from tests.integration.runtime.scaling.test_scale_threads import ROWS, WIDTH, matmul_chain


@pytest.mark.parametrize(("partitions", "instances"), [(1, 2), (2, 1)], ids=["k1x2", "k2x1"])
def test_one_client_gets_one_instance_per_unit_with_two_threads(
    tmp_path: Path, partitions: int, instances: int
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to give an instance a second intra-op thread")
    path = matmul_chain(tmp_path / "chain.onnx")
    x = np.random.default_rng(3).standard_normal((ROWS, WIDTH)).astype(np.float32)
    expected = x
    for init in onnx.load(path).graph.initializer:
        expected = np.maximum(expected @ numpy_helper.to_array(init), 0)
    cfg = load_pipeline(
        {
            "name": "mm",
            "slo": "10s",  # never violated: the scaler itself does nothing
            "autoscale": {
                "interval_s": 0.5,
                "window_s": 2.0,
                "cooldown_s": 1.0,
                "hold_s": 600.0,  # no scale-in by the scaler while the test looks
                "rate_horizon_s": 2.0,
                "settle_s": 1.0,
                "sustain_s": 1.0,
            },
            "stages": [
                {
                    "name": "mm",
                    "model": str(path),
                    "partitions": partitions,
                    "threads": 1,
                    "instances": instances,
                }
            ],
        }
    )
    with Service(state_dir=tmp_path / "s", control_path="userspace", pool_mb=64) as svc:
        svc.deploy(cfg)
        assert sorted(h.unit.threads for h in svc.supervisor.handles()) == [1, 1]
        units = {h.key for h in svc.supervisor.handles()}
        assert len(units) == partitions
        answered, errors = [0], []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                try:
                    r = svc.infer("mm", {"x": x}, timeout_s=60)
                    np.testing.assert_allclose(r.outputs["y"], expected, rtol=1e-3, atol=1e-3)
                    answered[0] += 1
                except RequestError as exc:
                    if exc.status == 503 and exc.retry_after_s:
                        time.sleep(min(exc.retry_after_s, 0.5))  # refused at arrival: retried
                        continue
                    errors.append(str(exc))
                except Exception as exc:  # noqa: BLE001 - collected and asserted on
                    errors.append(repr(exc))

        th = threading.Thread(target=client)
        th.start()
        try:

            def merged() -> bool:
                live = [h for h in svc.supervisor.handles() if h.state in ("starting", "ready")]
                return (
                    len(live) == partitions
                    and {h.key for h in live} == units
                    and all(h.unit.threads == 2 and h.state == "ready" for h in live)
                )

            assert wait_for(merged, 120.0, "one instance per unit at 2 threads")
            n0 = answered[0]
            assert wait_for(lambda: answered[0] > n0 + 3, 60.0, "answers after the merge")

            def judged() -> bool:  # kept, or reverted (then split back): either is a verdict
                reasons = [d.get("reason") or "" for d in svc.autoscaler.decisions("mm")]
                return any("threads kept" in r or "threads reverted" in r for r in reasons)

            assert wait_for(judged, 90.0, "the move's trial verdict")
        finally:
            stop.set()
            th.join(90)
        decisions = svc.autoscaler.decisions("mm")
        acts = [(d["action"], d.get("from_threads"), d.get("threads")) for d in decisions]
        if partitions == 1:
            assert acts[:2] == [("scale_in", None, None), ("scale_up", 1, 2)], decisions
        else:
            assert acts[:2] == [("scale_up", 1, 2), ("scale_up", 1, 2)], decisions
            assert {d["unit"] for d in decisions[:2]} == {0, 1}, decisions
        assert "in flight" in decisions[0]["reason"], decisions[0]
        assert errors == [], errors[:3]
        r = svc.infer("mm", {"x": x}, timeout_s=60)
        np.testing.assert_allclose(r.outputs["y"], expected, rtol=1e-3, atol=1e-3)
        assert svc.manager.audit() == []
