"""Core sets by priority live (``INFSCALER_CPU_PRIORITY=cores``): while a priority-1
pipeline misses its SLO, the instances of a priority-2 pipeline run off the core its
instance is pinned to (``os.sched_getaffinity`` of every thread), the move is in the
decisions; once the risk has passed for the hold time they get every core back.

Instances are real processes running tests/stagefuncs.py functions (the stage sleeps,
so the test measures the control loop, not this host's cores); two cores, from a device
profile, whatever the host has.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.device import DeviceProfile
from infscaler.runtime.serving.frontend import RequestError
from infscaler.service.service import Service
from tests.helpers import wait_for
from tests.load import ClosedLoop

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")

AUTO = {"interval_s": 0.5, "window_s": 2.0, "cooldown_s": 0.5, "settle_s": 1.0, "sustain_s": 1.0}


def one_stage(name: str, priority: int, slo: str, instances: int) -> dict:
    """One function stage that sleeps 40 ms per request, ``instances`` of it (fixed)."""
    return {
        "name": name,
        "slo": slo,
        "priority": priority,
        "autoscale": AUTO,
        "inputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["y"],
        "stages": [
            {
                "name": "slow",
                "function": "stagefuncs:slow",
                "inputs": ["y"],
                "outputs": ["y"],
                "params": {"ms": 40.0},
                "instances": instances,
                "max_instances": instances,
            }
        ],
    }


def affinities(svc: Service, name: str) -> dict[int, set[int]]:
    """pid -> the union of every thread's cpu affinity, of ``name``'s ready instances."""
    out = {}
    for h in svc.supervisor.handles():
        if h.key[0] == name and str(h.state.value) == "ready":
            cores: set[int] = set()
            for tid in os.listdir(f"/proc/{h.proc.pid}/task"):
                cores |= os.sched_getaffinity(int(tid))
            out[h.proc.pid] = cores
    return out


def actions(svc: Service, name: str) -> list[str]:
    return [d["action"] for d in svc.autoscaler.decisions(name)]


def test_a_lower_pipeline_leaves_the_cores_of_a_higher_one_at_risk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = sorted(os.sched_getaffinity(0))
    if len(host) < 2:
        pytest.skip("needs two cores")
    monkeypatch.setenv("INFSCALER_CPU_PRIORITY", "cores")
    cores = host[:2]
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=32) as svc:
        svc.device = DeviceProfile(
            name="two-cores",
            soc="test device",
            memory_mb=65536,
            memory_cap_mb=32768,
            accelerators=[{"engine": "cpu", "max_instances": 16, "cores": cores}],
        )
        svc.autoscaler.core_sets.hold_s = 3.0
        svc.deploy(load_pipeline(one_stage("hi", 1, "20ms", 1)))  # 40 ms > its SLO
        svc.deploy(load_pipeline(one_stage("lo", 2, "5s", 3)))
        wait_for(lambda: len(affinities(svc, "lo")) == 3, 60, "lo's 3 instances ready")
        (hi_cores,) = [set(h.cores) for h in svc.supervisor.handles() if h.key[0] == "hi"]
        assert len(hi_cores) == 1, hi_cores  # the first instance placed takes one core
        before = affinities(svc, "lo")
        # once every core holds an instance, lo's next ones float over both
        assert any(c & hi_cores for c in before.values()), (hi_cores, before)
        x = np.ones((1, 4), np.float32)

        def retry(exc: RequestError) -> float | None:  # refused at arrival: its SLO is tight
            return (exc.retry_after_s or 0.05) if exc.status == 503 else None

        send = lambda: svc.infer("hi", {"y": x}, timeout_s=30)  # noqa: E731
        with ClosedLoop(send, 2, retry=retry) as load:
            wait_for(lambda: "core_set" in actions(svc, "lo"), 60, "lo kept off hi's core")
            kept = affinities(svc, "lo")
            assert kept and all(c and not c & hi_cores for c in kept.values()), (hi_cores, kept)
            (entry,) = [d for d in svc.autoscaler.decisions("lo") if d["action"] == "core_set"]
            assert entry["kept_for"] == ["hi"] and "hi: " in entry["reason"], entry
            shown = svc.pipeline_status(svc.deployment("lo"))["decisions"]
            assert any(d["action"] == "core_set" for d in shown), shown
            st = svc.status()["cpu_priority"]
            assert st["mode"] == "cores" and set(st["kept"]["lo"]) == set(cores) - hi_cores
        assert load.errors == [] and load.answered > 0, load.errors[:3]
        # the load stopped: hi's window empties, then the hold passes
        t0 = time.monotonic()
        wait_for(lambda: "core_set_release" in actions(svc, "lo"), 60, "lo got every core back")
        assert time.monotonic() - t0 >= 3.0 - 0.5  # not before the hold
        after = affinities(svc, "lo")
        assert after == before, (before, after)
        assert svc.autoscaler.decisions("lo")[-1]["cores"] == cores
