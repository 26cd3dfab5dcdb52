"""The Tuner end to end: a load step from 0.3 to 1.5 times a sleeping stage's capacity is
answered by a ``tuner_scale_out`` before any P99-based scale-out; every request is
answered or refused at arrival by the SLO's admission.
(One instance is planned for the lower of 0.75 of its capacity and the rate where its
approximate P99 reaches the SLO, about 8.5 requests/s under 150 ms; 1.5 x the capacity is
well above both, so the Tuner fires within the short windows.)
Instances are real processes running tests/stagefuncs.py functions (the slow stage
sleeps 40 ms: capacity 25 requests/s with one instance)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.scaling.tuner import planned_envelope
from infscaler.service.service import Service
from tests.integration.runtime.scaling.test_autoscale import step_pipeline

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def _open_loop(svc: Service, rate: float, seconds: float, errors: list[str], done: list[int]):
    x = np.ones((1, 4), np.float32)
    threads = []

    def one() -> None:
        try:
            svc.infer("step", {"x": x}, timeout_s=30)
            done.append(1)
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(str(exc))

    t0 = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        th = threading.Thread(target=one)
        th.start()
        threads.append(th)
    return threads


def test_a_load_step_is_met_by_the_tuner_before_the_p99(tmp_path: Path) -> None:
    cfg = step_pipeline(tuner=True, settle_s=0.5, sustain_s=2.0)
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        svc.deploy(load_pipeline(cfg))
        errors: list[str] = []
        done: list[int] = []
        threads = _open_loop(svc, 7.5, 3.0, errors, done)  # 0.3 x 25
        threads += _open_loop(svc, 37.5, 4.0, errors, done)  # 1.5 x 25
        for th in threads:
            th.join(60)
        decisions = svc.autoscaler.decisions("step")
        # above the capacity until the new instance is ready: the SLO's admission may
        # refuse at arrival (503), nothing else fails, and every request is answered
        assert all("refuses the request at arrival" in e for e in errors), errors[:3]
        assert len(done) + len(errors) == len(threads) and len(done) > len(errors)
        acts = [d["action"] for d in decisions]
        assert "tuner_scale_out" in acts, decisions
        first = acts.index("tuner_scale_out")
        assert "scale_out" not in acts[:first], decisions
        tuned = decisions[first]
        assert tuned["observed"] > tuned["sustainable"]
        assert tuned["window_s"] in (0.25, 0.5, 1.0, 2.0, 5.0)
        # every instance the envelope needs, in one decision: count of them started
        assert 1 <= tuned["count"] <= tuned["needed"] - 1
        # a capacity whose planned envelope covers the triggering window even with the
        # largest burst term (SLO 150 ms, service time >= 0)
        w = tuned["window_s"]
        covered = planned_envelope(tuned["required_rps"] + 1e-3, 150.0, 0.0, (w,))[0]
        assert covered >= tuned["observed"]
