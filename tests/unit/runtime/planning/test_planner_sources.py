"""The search's candidate sources (runtime/planning/candidates.py): the greedy planner's
configuration of a point is a candidate beside the instances grown by Algorithm 1's rule."""

from __future__ import annotations

from infscaler.runtime.planning.planner import ModelStage, search
from infscaler.runtime.planning.simulator import EngineProfile, UnitProfile
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
