"""Golden comparisons of the planner's decisions: the chosen configuration (K, cuts,
threads, instances, engines, predicted P99 / goodput / capacity) of each planning entry
(the greedy ``plan``, the configuration ``search``, the joint ``plan_together``, the
fleet's ``capacity_curve``) on fixed inputs (hand unit profiles as the other planner tests
use, the device profiles in profiles/), against planner_golden.json, recorded
from the code before the planners became one. With the greedy planner a candidate source
of the search, no recorded decision changed (its configurations here are ones the search
grew already); where it proposes one the old search lacked, it wins only on a better
simulated goodput (test_planner_sources.py: 50/s on the gpu against ~1/s grown on cpu).

Regenerate (only when a decision is meant to change, and say why in the commit):
``PYTHONPATH=. python tests/unit/runtime/planning/test_planner_golden.py --write``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infscaler.base.device import load_profile
from infscaler.runtime.planning.fleet import capacity_curve
from infscaler.runtime.planning.jointplan import Member, plan_together
from infscaler.runtime.planning.planner import ModelStage, plan, search
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap

FIXTURE = Path(__file__).parent / "planner_golden.json"
DEVICES = ("generic-x86", "orin-nano", "orin-agx", "xavier-nx")


def _unit(name: str, ms: float, mem: float = 100.0, cv: float = 0.5, **kw: Any) -> UnitProfile:
    engines = {"cpu": EngineProfile("cpu", ms, cv=cv, memory_mb=mem, cores=1)}
    engines.update(kw.pop("extra", {}))
    return UnitProfile(name, engines, **kw)


def _chain() -> list[UnitProfile]:
    gpu = {"gpu": EngineProfile("gpu", 8.0, cv=0.2, memory_mb=300, cores=0)}
    return [_unit("pre", 5.0, kind="function"), _unit("det", 40.0, extra=gpu), _unit("post", 5.0)]


def _cap(memory_mb: float = float("inf"), cores: int = 2, slots: int = 16) -> ResourceCap:
    return ResourceCap(
        memory_cap_mb=memory_mb, memory_used_mb=0.0, max_instances={"cpu": slots}, cores=cores
    )


def _stage(name: str = "m", whole: float = 12.0) -> ModelStage:
    return ModelStage(
        name,
        costs=(1, 1, 8, 2),
        valid_cuts=(0, 1, 2),
        whole_ms={1: whole, 2: whole * 0.6},
        weights_bytes=(400e6, 0, 0, 0),
        boundary_fixed_ms=0.5,
        whole_ms_err={1: 0.03, 2: 0.05},
    )


def _r(v: float | None) -> float | None:
    return None if v is None else round(float(v), 6)


def _greedy(res: Any) -> dict[str, Any]:
    cfg = res.config or []
    return {
        "feasible": res.feasible,
        "instances": [dict(c.instances) for c in cfg],
        "batch": [c.batch for c in cfg],
        "p99_ms": _r(res.prediction.p99_ms) if res.prediction else None,
        "throughput_rps": _r(res.prediction.throughput_rps) if res.prediction else None,
        "memory_mb": _r(res.memory_mb),
    }


def _cand(c: Any) -> dict[str, Any] | None:
    if c is None:
        return None
    return {
        "whole": c.whole,
        "K": [len(x) + 1 for x in c.cuts],
        "cuts": [list(x) for x in c.cuts],
        "threads": list(c.threads),
        "instances": [dict(x.instances) for x in c.config],
        "goodput_rps": _r(c.goodput_rps),
        "max_rate_rps": _r(c.max_rate_rps),
        "p99_ms": _r(c.p99_ms),
        "memory_mb": _r(c.memory_mb),
    }


def plan_cases() -> dict[str, Any]:
    """The greedy entry's decisions: the chain on a big cap, small caps, each device."""
    big = ResourceCap(memory_cap_mb=10_000, memory_used_mb=0, max_instances={"cpu": 16}, cores=16)
    tiny = ResourceCap(memory_cap_mb=350, memory_used_mb=0, max_instances={"cpu": 8}, cores=8)
    out = {
        "chain@60/s,200ms,big": plan(_chain(), 60.0, 200.0, big, duration_s=60),
        "chain@20/s,100ms,big": plan(_chain(), 20.0, 100.0, big, duration_s=60),
        "chain@60/s,200ms,tiny": plan(_chain(), 60.0, 200.0, tiny, duration_s=20),
    }
    for d in DEVICES:
        out[f"chain@30/s,200ms,{d}"] = plan(_chain(), 30.0, 200.0, load_profile(d), duration_s=40)
    return {k: _greedy(v) for k, v in out.items()}


def _searches() -> dict[str, Any]:
    fn = UnitProfile("post", {"cpu": EngineProfile("cpu", 0.5, cores=1)}, kind="function")
    out = {
        "weights@150/s,4 cores,600MB": search(
            [_stage()], 100.0, _cap(600, cores=4), rate=150.0, frontend_ms=0.0, max_partitions=2
        ),
        "stage+fn max rate,2 cores": search([_stage(whole=4.0), fn], 50.0, _cap(cores=2)),
        "stage@60/s,4 cores,700MB": search(
            [_stage(whole=8.0)], 60.0, _cap(700, cores=4), rate=60.0
        ),
    }
    for d in DEVICES:
        out[f"stage@40/s,{d}"] = search([_stage()], 100.0, load_profile(d), rate=40.0)
    return out


def search_cases() -> tuple[dict[str, Any], dict[str, Any]]:
    """The search's winners, and the joint plans over its ranked candidates."""
    outs = _searches()
    found = {k: _cand(v.best) for k, v in outs.items()}
    a, b = outs["stage@60/s,4 cores,700MB"], outs["weights@150/s,4 cores,600MB"]
    joint = {}
    for name, cap in {"1000MB,4": _cap(1000, cores=4), "1400MB,8": _cap(1400, cores=8)}.items():
        try:
            jp = plan_together(
                [Member("a", 1, a.candidates, 60.0), Member("b", 2, b.candidates, 150.0)], cap
            )
            joint[name] = [
                {"name": ch.name, "rank": ch.rank, **(_cand(ch.candidate) or {})}
                for ch in jp.choices
            ]
        except Exception as exc:  # the refusal is a decision too
            joint[name] = {"error": type(exc).__name__}
    return found, joint


def fleet_cases() -> dict[str, Any]:
    """The fleet's capacity curves (R* and the ladder) per device."""
    units = [_unit("det", 10.0, cv=0.0, max_instances=2), _unit("post", 2.0, cv=0.3)]
    out = {}
    for d in DEVICES:
        c = capacity_curve("p", units, 100.0, d, load_profile(d), sim_requests=1500)
        out[d] = {
            "max_rate": _r(c.max_rate),
            "rates": [_r(x) for x in c.rates],
            "vectors": [[_r(x) for x in v] for v in c.vectors],
        }
    return out


def decisions() -> dict[str, Any]:
    found, joint = search_cases()
    return {"plan": plan_cases(), "search": found, "joint": joint, "fleet": fleet_cases()}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def _same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9), where
    elif isinstance(want, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_greedy_plan_decisions_unchanged(golden: dict[str, Any]) -> None:
    _same(json.loads(json.dumps(plan_cases())), golden["plan"], "plan")


def test_search_and_joint_decisions_unchanged(golden: dict[str, Any]) -> None:
    found, joint = search_cases()
    _same(json.loads(json.dumps(found)), golden["search"], "search")
    _same(json.loads(json.dumps(joint)), golden["joint"], "joint")


def test_fleet_capacity_curves_unchanged(golden: dict[str, Any]) -> None:
    _same(json.loads(json.dumps(fleet_cases())), golden["fleet"], "fleet")


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURE.write_text(json.dumps(decisions(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
