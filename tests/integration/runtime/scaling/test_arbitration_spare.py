"""The warm spare live (arbitration rule 4): at a full memory cap, a high-priority
pipeline under light load, running only what it needs, gets an instance of an idle
low-priority pipeline with slack through the autoscaler's own loop (the donor's
instance stops first), as a ``spare`` move with no loan, and every request is answered.

Instances are real processes running tests/stagefuncs.py functions (the slow stage
sleeps: the control loop is measured, not this host's cores).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from infscaler.base.config import load_pipeline
from infscaler.service.service import Service
from tests.integration.runtime.scaling.test_arbitration import (
    _instances,
    _load,
    _settled_memory_mb,
    pipeline,
    tight_cap,
)

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def test_an_idle_lower_pipelines_slack_instance_becomes_the_higher_ones_spare(
    tmp_path: Path,
) -> None:
    with Service(state_dir=tmp_path, control_path="userspace", pool_mb=64) as svc:
        # hi's SLO is loose: one client's requests stay calm (no violation, no lend)
        svc.deploy(load_pipeline(pipeline("hi", 1, hold_s=600.0, slo="2s")))
        lo = svc.deploy(load_pipeline(pipeline("lo", 2, hold_s=600.0, slo="2s")))
        unit = next(u.index for u in lo.pipeline.units if u.name == "slow")
        svc.scale_out(lo, unit, "cpu")
        svc.scale_out(lo, unit, "cpu")  # lo: 3 instances of slow, its minimum 1
        time.sleep(2.5)  # ready
        assert (_instances(svc, "hi"), _instances(svc, "lo")) == (1, 3)
        svc.device = tight_cap(svc, _settled_memory_mb(svc))  # refuses hi's next instance
        taken, ended = threading.Event(), threading.Event()

        def watch() -> None:
            while not ended.is_set():
                if any(d["action"] == "arbitrate_take" for d in svc.autoscaler.decisions()):
                    taken.set()
                    time.sleep(2.0)  # its instance serving
                    ended.set()
                time.sleep(0.2)

        watcher = threading.Thread(target=watch)  # ends the load 2 s after the first take
        watcher.start()
        done, errors = _load(svc, "hi", clients=1, seconds=90.0, done_when=ended)
        ended.set()
        watcher.join()
        for _ in range(100):  # a move under way when the load ended completes (<= 30 s)
            decisions = svc.autoscaler.decisions()
            takes = [d for d in decisions if d["action"] == "arbitrate_take"]
            gives = [d for d in decisions if d["action"] == "arbitrate_give"]
            if len(takes) == len(gives) and _instances(svc, "hi") == 1 + len(takes):
                break
            time.sleep(0.3)
        assert takes and gives, decisions
        assert (takes[0]["pipeline"], takes[0]["kind"]) == ("hi", "spare"), takes[0]
        assert gives[0]["pipeline"] == "lo" and gives[0]["time"] <= takes[0]["time"]
        assert "warm spare" in takes[0]["reason"] and "memory" in takes[0]["reason"]
        assert svc.autoscaler.arbitration_state().loans == ()  # a spare is no loan
        # every move was a spare from lo to hi (one above what hi's model needs at its
        # rate, which depends on this host's speed: one move or more), and each moved
        # one instance
        assert all(d["kind"] == "spare" and d["giver"] == "lo" for d in takes + gives)
        assert len(takes) == len(gives)
        assert (_instances(svc, "hi"), _instances(svc, "lo")) == (1 + len(takes), 3 - len(gives))
        assert errors == [] and done > 0, errors[:3]
        assert svc.manager.audit() == []
