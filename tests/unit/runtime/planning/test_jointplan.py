"""Tests of planning several pipelines together within one cap
(infscaler.runtime.planning.jointplan.plan_together): hand-built candidates whose memory,
pinned threads and goodput are given, so every choice below is computed by hand."""

from __future__ import annotations

import math

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.planning.candidates import Candidate
from infscaler.runtime.planning.jointplan import Member, plan_together, usage
from infscaler.runtime.planning.simulator import EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap


def cand(name: str, inst: int, mem_per: float, goodput: float, ms: float = 50.0, t: int = 1):
    """One model unit of ``ms`` per request at ``t`` threads, ``inst`` instances of
    ``mem_per`` MB each; its predicted goodput ``goodput`` requests/s."""
    unit = UnitProfile(name, {"cpu": EngineProfile("cpu", ms, memory_mb=mem_per, cores=t)})
    return Candidate(
        cuts=((),),
        objectives=(("k1",),),
        threads=(t,),
        units=(unit,),
        config=(UnitConfig({"cpu": inst}),),
        goodput_rps=goodput,
        max_rate_rps=goodput,
        p99_ms=ms,
        attainment=1.0,
        memory_mb=inst * mem_per,
        share=(1.0,),
    )


#: 1000 MB, 4 thread slots, 8 cpu instance slots, busy cores not checked
CAP = ResourceCap(memory_cap_mb=1000.0, memory_used_mb=0.0, max_instances={"cpu": 8}, cores=4)

# a: best 3 x 250 MB (750 MB) at 30/s, next 2 x 250 MB (500 MB) at 20/s
A = (cand("a", 3, 250.0, 30.0), cand("a", 2, 250.0, 20.0))
# b: best 2 x 250 MB (500 MB) at 50/s, next 1 x 250 MB at 6/s
B = (cand("b", 2, 250.0, 50.0), cand("b", 1, 250.0, 6.0))


def test_usage_sums_memory_threads_and_slots():
    u = usage(cand("a", 3, 250.0, 30.0, t=2))
    assert (u.memory_mb, u.threads, dict(u.slots)) == (750.0, 6, {"cpu": 3})
    # 30 requests/s x 50 ms on the cpu: 1.5 cores busy
    assert u.busy_cores == pytest.approx(1.5)


def test_the_higher_priority_keeps_its_best_the_other_takes_its_next():
    # the bests together: 750 + 500 = 1250 MB > 1000 and 5 threads > 4. What fits:
    # a#1 + b#2 (1000 MB, 4 threads, 36/s) and a#2 + b#1 (1000 MB, 4 threads, 70/s),
    # a#2 + b#2 (750 MB, 26/s). a at priority 1: a keeps its 30/s though the total is less
    res = plan_together([Member("a", 1, A), Member("b", 2, B)], CAP)
    a, b = res.choices
    assert (a.rank, b.rank) == (0, 1)
    assert a.candidate is A[0] and b.candidate is B[1]
    assert res.used.memory_mb == 1000.0 and res.used.threads == 4
    assert (res.combinations, res.fitting) == (4, 3)
    # b's why names what its best would have needed beside a's choice
    assert "1250 MB > 1000 MB" in b.why and "5 pinned threads > 4 thread slots" in b.why
    assert "after a, of higher priority" in b.why
    assert "its best alone" in a.why
    # the order of the arguments does not matter, the priority does
    res2 = plan_together([Member("b", 1, B), Member("a", 2, A)], CAP)
    assert [(c.name, c.rank) for c in res2.choices] == [("b", 0), ("a", 1)]


def test_equal_priorities_take_the_better_total_goodput():
    # same level: a#2 + b#1 = 20 + 50 = 70/s beats a#1 + b#2 = 36/s and a#2 + b#2 = 26/s
    res = plan_together([Member("a", 1, A), Member("b", 1, B)], CAP)
    assert [c.rank for c in res.choices] == [1, 0]
    assert sum(c.candidate.goodput_rps for c in res.choices) == 70.0
    assert "70.00/s" in res.explain[0]


def test_within_the_tie_the_higher_priority_gives_way_to_the_total():
    # a's two within 5 % (30 and 29/s): level 1 cannot tell them apart, the total decides
    a = (cand("a", 3, 250.0, 30.0), cand("a", 2, 250.0, 29.0))
    res = plan_together([Member("a", 1, a), Member("b", 2, B)], CAP)
    assert [c.rank for c in res.choices] == [1, 0]  # 29 + 50 > 30 + 6
    # with no tie, a keeps its best
    res = plan_together([Member("a", 1, a), Member("b", 2, B)], CAP, tie=0.0)
    assert [c.rank for c in res.choices] == [0, 1]


def test_both_bests_fitting_are_both_kept():
    big = ResourceCap(memory_cap_mb=2000.0, memory_used_mb=0.0, max_instances={"cpu": 8}, cores=8)
    res = plan_together([Member("a", 1, A), Member("b", 2, B)], big)
    assert [c.rank for c in res.choices] == [0, 0]


def test_memory_in_use_and_engine_slots_count():
    # 300 MB already in use: 700 MB left; a#2 (500) + b#2 (250) = 750 does not fit either
    used = ResourceCap(memory_cap_mb=1000.0, memory_used_mb=300.0, max_instances={"cpu": 8},
                       cores=4)  # fmt: skip
    with pytest.raises(InfScalerError) as e:
        plan_together([Member("a", 1, A), Member("b", 2, B)], used)
    assert "b fit(s) beside the others in no way" in e.value.message
    assert "750 MB > 700 MB" in e.value.message
    # 3 cpu instance slots: only a#2 + b#2 (2 + 1 instances)
    slots = ResourceCap(memory_cap_mb=math.inf, memory_used_mb=0.0, max_instances={"cpu": 3},
                        cores=0)  # fmt: skip
    res = plan_together([Member("a", 1, A), Member("b", 2, B)], slots)
    assert [c.rank for c in res.choices] == [1, 1]
    assert dict(res.used.slots) == {"cpu": 3}


def test_busy_cores_are_checked_against_the_physical_cores():
    # a#1 keeps 30/s x 50 ms = 1.5 cores busy, b#1 50/s x 50 ms = 2.5, a#2 1.0, b#2 0.3;
    # on 2 cores with no other limit: a#1 + b#2 = 1.8 fits, a#2 + b#1 = 3.5 does not
    free = ResourceCap(memory_cap_mb=math.inf, memory_used_mb=0.0, max_instances={})
    res = plan_together([Member("a", 1, A), Member("b", 1, B)], free, cores=2)
    assert [c.rank for c in res.choices] == [0, 1]
    assert res.used.busy_cores == pytest.approx(1.8)


def test_a_pipeline_with_no_usable_candidate_is_named():
    dead = (
        cand("c", 1, 250.0, 0.0),  # answers nothing within the SLO
        Candidate(**{**cand("c", 1, 250.0, 5.0).__dict__, "fits": False}),
    )
    with pytest.raises(InfScalerError) as e:
        plan_together([Member("a", 1, A), Member("c", 2, dead)], CAP)
    assert "pipeline c: no configuration meets its SLO" in e.value.message
    assert e.value.hint and "c" in e.value.hint


def test_no_combination_fits_names_the_pipeline_and_what_it_needs():
    # c's smallest needs 600 MB; a's smallest 500 MB: 1100 > 1000 MB
    c = (cand("c", 2, 300.0, 9.0),)
    with pytest.raises(InfScalerError) as e:
        plan_together([Member("a", 1, A), Member("c", 2, c)], CAP)
    msg = e.value.message
    assert msg.startswith("c fit(s) beside the others in no way")
    assert "c (priority 2) needs at least 600 MB" in msg and "1100 MB > 1000 MB" in msg
    assert "a (priority" not in msg  # a alone fits


def test_bad_sets_are_refused():
    with pytest.raises(InfScalerError, match="no pipelines"):
        plan_together([], CAP)
    with pytest.raises(InfScalerError, match="named twice"):
        plan_together([Member("a", 1, A), Member("a", 2, B)], CAP)


def test_top_k_bounds_the_candidates_tried():
    # only the bests are tried: they do not fit together
    with pytest.raises(InfScalerError, match="in no way"):
        plan_together([Member("a", 1, A), Member("b", 1, B)], CAP, top_k=1)
    assert plan_together([Member("a", 1, A), Member("b", 1, B)], CAP, top_k=2).combinations == 4


def test_to_dict_carries_each_choice():
    d = plan_together([Member("a", 1, A), Member("b", 2, B)], CAP).to_dict()
    assert d["pipelines"]["b"]["rank"] == 1 and d["pipelines"]["a"]["rank"] == 0
    assert d["used"]["memory_mb"] == 1000.0 and d["available"]["threads"] == 4
