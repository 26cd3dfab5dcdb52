"""The search's candidate sources (runtime/planning/candidates.py): the greedy planner's
configuration of a point is a candidate beside the instances grown by Algorithm 1's rule."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from infscaler.runtime.planning.candidates import is_incumbent
from infscaler.runtime.planning.planner import ModelStage, plan, search
from infscaler.runtime.planning.simulator import EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap

#: 2 cores (2 thread slots), 8 cpu slots and one gpu slot, memory ample
CAP = ResourceCap(
    memory_cap_mb=4000, memory_used_mb=0.0, max_instances={"cpu": 8, "gpu": 1}, cores=2
)


def _pipeline() -> list:
    # a 4 ms model stage, then a unit of 30 ms on cpu or 3 ms on the gpu
    st = ModelStage("m", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 4.0})
    post = UnitProfile(
        "post",
        {
            "cpu": EngineProfile("cpu", 30.0, cores=1, memory_mb=50),
            "gpu": EngineProfile("gpu", 3.0, cores=0, memory_mb=200),
        },
    )
    return [st, post]


def test_the_greedy_source_proposes_the_gpu_and_wins_on_goodput() -> None:
    # at 50/s the cpu needs 1.5 erlangs of ``post`` on 2 cores shared with the model and
    # the front end: grown on cpu it answers ~1/s within 100 ms; the greedy planner puts
    # ``post`` on its fastest engine, the gpu (0.15 erlangs): all 50/s
    out = search(_pipeline(), 100.0, CAP, rate=50.0, max_partitions=1, final_requests=0)
    greedy = [c for c in out.candidates if c.note.startswith("greedy")]
    assert len(greedy) == 1
    assert dict(greedy[0].config[-1].instances) == {"gpu": 1}
    assert out.best is greedy[0]
    grown = [c for c in out.candidates if c is not greedy[0]]
    assert grown and all(c.goodput_rps < 0.5 * out.best.goodput_rps for c in grown)
    assert out.best.goodput_rps > 0.97 * 50.0


def test_no_greedy_candidate_without_a_rate() -> None:
    # the greedy planner meets a P99 at a rate; scored by the max rate there is none
    out = search(_pipeline(), 100.0, CAP, max_partitions=1, final_requests=0)
    assert out.candidates and not any(c.note.startswith("greedy") for c in out.candidates)


def test_the_identity_names_the_engines() -> None:
    # the greedy candidate (post on the gpu) and one grown on cpu with as many instances
    # per unit are two configurations: their identities differ in the engines alone
    out = search(_pipeline(), 100.0, CAP, rate=50.0, max_partitions=1, final_requests=0)
    g = next(c for c in out.candidates if c.note.startswith("greedy"))
    on_cpu = replace(g, config=(*g.config[:-1], UnitConfig({"cpu": 1})))
    assert g.identity()[:4] == on_cpu.identity()[:4]
    assert g.identity()[4][-1] == {"gpu": 1} and on_cpu.identity()[4][-1] == {"cpu": 1}
    assert g.identity() != on_cpu.identity()
    assert g.config_key() != on_cpu.config_key()
    assert is_incumbent(g, json.dumps(g.identity()))
    assert not is_incumbent(on_cpu, json.dumps(g.identity()))
    # a decision kept before the engines were named (four fields) matches on those four
    assert is_incumbent(on_cpu, json.dumps(g.identity()[:4]))


def _fixed() -> list[UnitProfile]:
    # a pipeline of fixed units only: a function step, then ``post`` on cpu or gpu
    pre = UnitProfile("pre", {"cpu": EngineProfile("cpu", 2.0, cores=1)}, kind="function")
    return [pre, _pipeline()[1]]


def test_plan_is_the_search_with_its_greedy_source() -> None:
    # plan() is search() on the units as given with the greedy source alone: the same
    # configuration and figures as the search's greedy candidate on plan's trace
    res = plan(_fixed(), 50.0, 100.0, CAP, duration_s=20.0)
    out = search(
        _fixed(), 100.0, CAP, rate=50.0, frontend_ms=0.0, sources=("greedy",), final_requests=0
    )
    assert res.feasible and out.best is not None
    assert dict(res.config[-1].instances) == {"gpu": 1}
    assert [dict(c.instances) for c in out.best.config] == [dict(c.instances) for c in res.config]
    assert out.best.identity()[4][-1] == {"gpu": 1}
    assert len(out.candidates) == 1 and out.greedy and out.greedy[0].feasible


def test_plan_says_why_when_none_meets_the_slo() -> None:
    res = plan(_fixed(), 50.0, 1.0, CAP, duration_s=10.0)
    assert not res.feasible and "service time alone" in res.reason


def test_a_pipeline_of_fixed_units_is_one_point_grown_and_planned() -> None:
    out = search(_fixed(), 100.0, CAP, rate=50.0, final_requests=0)
    assert {c.note.startswith("greedy") for c in out.candidates} == {True, False}
    assert all(c.cuts == () and c.threads == () for c in out.candidates)
    assert "units as given" in out.candidates[0].label()


def test_unknown_sources_and_stages_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown candidate sources"):
        search(_fixed(), 100.0, CAP, rate=50.0, sources=("magic",))
    with pytest.raises(ValueError, match="unknown candidate sources"):
        search(_fixed(), 100.0, CAP, rate=50.0, sources=())
    with pytest.raises(ValueError, match="no stage"):
        search([], 100.0, CAP, rate=50.0)
    with pytest.raises(ValueError, match="ModelStage or UnitProfile"):
        search(["det"], 100.0, CAP, rate=50.0)
