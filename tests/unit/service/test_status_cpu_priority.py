"""``infscaler status``'s CPU priority mode (service.status.cpu_priority) on stand-in
supervisors, and the line ``print_status`` writes for it with each pipeline's level,
nice value and cgroup weight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infscaler.cli.client import print_status, priority_text
from infscaler.service.status import cpu_priority


def _svc(**sup: object) -> SimpleNamespace:
    return SimpleNamespace(supervisor=SimpleNamespace(**sup))


def test_the_mode_follows_the_supervisor() -> None:
    off = _svc(cpu_priority=False, cgroups=None, cgroups_why="INFSCALER_CPU_PRIORITY=off")
    assert cpu_priority(off) == {"mode": "off", "reason": "INFSCALER_CPU_PRIORITY=off"}
    why = "cgroup v2 has no cpu controller (cpu is on cgroup v1)"
    nice = _svc(cpu_priority=True, cgroups=None, cgroups_why=why)
    assert cpu_priority(nice) == {"mode": "nice", "reason": why}
    cg = _svc(cpu_priority=True, cgroups=object(), cgroups_why="")
    assert cpu_priority(cg) == {"mode": "cgroup", "reason": ""}
    assert cpu_priority(SimpleNamespace(supervisor=None))["mode"] == "off"


def test_status_prints_the_mode_and_each_pipelines_share(
    capsys: pytest.CaptureFixture[str],
) -> None:
    st = {
        "control_path": {"kind": "userspace", "policy": "auto", "reason": "x"},
        "pool": {"mapped_mb": 0, "cap_mb": 64, "slots_in_use": 0, "slots_free": 0},
        "cpu_priority": {"mode": "nice", "reason": "not a systemd service"},
        "pipelines": [],
    }
    print_status(st)
    out = capsys.readouterr().out
    assert "CPU by priority: nice (cgroups not used: not a systemd service)" in out


def test_each_pipelines_level_and_share() -> None:
    pipes = [
        {"name": "hi", "priority": 1, "cpu_nice": 0, "cpu_weight": None},
        {"name": "lo", "priority": 2, "cpu_nice": 10, "cpu_weight": 11},
    ]
    assert [priority_text(p) for p in pipes] == [
        "hi priority 1 nice 0",
        "lo priority 2 nice 10 cpu.weight 11",
    ]


def test_mode_cores_shows_the_pipelines_kept_off_cores(
    capsys: pytest.CaptureFixture[str],
) -> None:
    keeper = SimpleNamespace(
        on=True, state=lambda: {"on": True, "hold_s": 10.0, "kept": {"lo": [1]}, "repins": 2}
    )
    svc = _svc(cpu_priority=True, cgroups=None, cgroups_why="INFSCALER_CPU_PRIORITY=cores")
    svc.autoscaler = SimpleNamespace(core_sets=keeper)
    st = cpu_priority(svc)
    assert st["mode"] == "cores" and st["kept"] == {"lo": [1]} and st["repins"] == 2
    svc.autoscaler = SimpleNamespace(core_sets=SimpleNamespace(on=False))
    assert cpu_priority(svc)["mode"] == "nice"
    print_status(
        {
            "control_path": {"kind": "userspace", "policy": "auto", "reason": "x"},
            "pool": {"mapped_mb": 0, "cap_mb": 64, "slots_in_use": 0, "slots_free": 0},
            "cpu_priority": st,
            "pipelines": [],
        }
    )
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "CPU by priority: cores (" in out and "lo kept to cores [1]" in out
