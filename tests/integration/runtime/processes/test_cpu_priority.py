"""CPU by priority on a running service: the instances of a lower-priority pipeline run
at a higher nice value on every thread, the highest level deployed at nice 0, and the
values follow the pipelines deployed (Supervisor.set_level, base.levels.cpu_nice)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.levels import NICE_BY_RANK
from infscaler.service.service import Service
from infscaler.service.status import pipeline_status
from tests.helpers import chain_pipeline, wait_for

pytestmark = pytest.mark.usefixtures("stagefuncs_on_path")


def named(name: str, priority: int):
    d = chain_pipeline(1)
    d["name"] = name
    d["priority"] = priority
    return load_pipeline(d)


def thread_nices(svc: Service, pipeline: str) -> set[int]:
    """The nice values of every thread of ``pipeline``'s live instances."""
    out: set[int] = set()
    for h in svc.supervisor.handles():
        if h.key[0] != pipeline:
            continue
        for tid in os.listdir(f"/proc/{h.proc.pid}/task"):
            with open(f"/proc/{h.proc.pid}/task/{tid}/stat") as f:
                out.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return out


def test_a_lower_priority_pipeline_runs_at_a_higher_nice_value(tmp_path: Path) -> None:
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the service's (pytest may run niced)

    def at(rank: int) -> set[int]:
        return {min(19, own + NICE_BY_RANK[rank])}

    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as svc:
        svc.deploy(named("lo", 4))
        assert thread_nices(svc, "lo") == at(0)  # alone, the highest level deployed
        svc.deploy(named("hi", 1))
        assert thread_nices(svc, "hi") == at(0)
        assert thread_nices(svc, "lo") == at(1)
        assert pipeline_status(svc, svc.deployment("lo"))["cpu_nice"] == NICE_BY_RANK[1]
        svc.deploy(named("mid", 2))
        assert thread_nices(svc, "mid") == at(1)
        assert thread_nices(svc, "lo") == at(2)
        # a restarted instance takes its pipeline's value again
        (h,) = [h for h in svc.supervisor.handles() if h.key[0] == "lo"][:1]
        h.proc.kill()
        wait_for(
            lambda: any(
                x.key[0] == "lo" and x.proc.pid != h.proc.pid and x.ready_at
                for x in svc.supervisor.handles()
            ),
            30,
            "the killed instance restarted",
        )
        assert thread_nices(svc, "lo") == at(2)
        svc.undeploy("hi")
        if os.geteuid() == 0:  # lowering a nice value needs the privilege
            assert thread_nices(svc, "mid") == at(0)
            assert thread_nices(svc, "lo") == at(1)
        assert svc.supervisor.nice == {"mid": 0, "lo": NICE_BY_RANK[1]}


def test_cpu_priority_off_leaves_every_instance_at_the_service_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFSCALER_CPU_PRIORITY", "off")
    with Service(state_dir=tmp_path / "state", control_path="userspace", pool_mb=32) as svc:
        svc.deploy(named("hi", 1))
        svc.deploy(named("lo", 3))
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert thread_nices(svc, "lo") == {own} == thread_nices(svc, "hi")
        assert pipeline_status(svc, svc.deployment("lo"))["cpu_nice"] == 0
