"""The selector as a pure policy: INFaaS Algorithm 1's branches, the state machine, the
flagged closest variant, bad queries, and the vertical-scaling heuristic (§4.2.2), on
hand-made variant profiles."""

from __future__ import annotations

import math
import time

import pytest

from infscaler.modelless.selector import (
    Catalog,
    Query,
    ScalingConfig,
    SelectionError,
    SelectorConfig,
    VariantLoad,
    VariantProfile,
    VariantState,
    classify,
    select,
    validate_query,
    vertical_scale,
)

ACT, INA, OVL, ITF = (
    VariantState.ACTIVE,
    VariantState.INACTIVE,
    VariantState.OVERLOADED,
    VariantState.INTERFERED,
)


def prof(name: str, latency: float, accuracy: float, **kw) -> VariantProfile:
    kw.setdefault("load_ms", 100.0)
    kw.setdefault("memory_mb", 50.0)
    return VariantProfile(
        name=name,
        task=kw.pop("task", "ocr"),
        model=kw.pop("model", name.split(".")[0]),
        latency_ms=latency,
        accuracy=accuracy,
        **kw,
    )


FAST = prof("tiny.b1", 7, 0.80, load_ms=50)
MID = prof("v5.b1", 30, 0.97, load_ms=200)
SLOW = prof("small.b1", 35, 0.99, load_ms=150)
BIG = prof("huge.b1", 300, 0.995, load_ms=2000)
CAT = Catalog([SLOW, FAST, BIG, MID, prof("emb.b1", 6, 0.9, task="embed")])


def load(state: VariantState, utilisation: float = 0.0, instances: int = 1, rate: float = 0.0):
    return VariantLoad(state, instances if state != INA else 0, 0, rate, utilisation)


# -- Algorithm 1 ---------------------------------------------------------------------------


def test_catalog_indexes_tasks_sorted_by_latency() -> None:
    assert CAT.tasks == ["embed", "ocr"]
    assert [p.name for p in CAT.variants("ocr")] == ["tiny.b1", "v5.b1", "small.b1", "huge.b1"]
    assert CAT.get("v5.b1") is MID and CAT.get("nope") is None


def test_step1_active_variant_meeting_both_least_loaded() -> None:
    loads = {"v5.b1": load(ACT, 0.7), "small.b1": load(ACT, 0.2), "tiny.b1": load(ACT, 0.0)}
    sel = select(Query("ocr", 40, 0.95), CAT, loads)
    assert sel.variant is SLOW and sel.meets_requirements and sel.step == "active"
    assert sel.state is ACT and "least loaded" in sel.reason
    # equal load: the faster one
    loads["small.b1"] = load(ACT, 0.7)
    assert select(Query("ocr", 40, 0.95), CAT, loads).variant is MID


def test_step1_prefers_active_over_a_faster_inactive() -> None:
    sel = select(Query("ocr", 50, 0.9), CAT, {"small.b1": load(ACT)})
    assert sel.variant is SLOW and sel.step == "active"


def test_step2_inactive_with_lowest_load_plus_latency() -> None:
    # MID: 200 + 30 = 230; SLOW: 150 + 35 = 185 -> SLOW
    sel = select(Query("ocr", 40, 0.95), CAT, {})
    assert sel.variant is SLOW and sel.step == "inactive" and sel.meets_requirements
    assert "150 + 35 ms" in sel.reason


def test_tight_latency_picks_fast_low_accuracy_and_high_accuracy_a_slow_one() -> None:
    assert select(Query("ocr", latency_ms=10), CAT).variant is FAST
    assert select(Query("ocr", min_accuracy=0.99), CAT).variant is SLOW
    assert select(Query("ocr", min_accuracy=0.995), CAT).variant is BIG
    assert select(Query("ocr"), CAT).variant is FAST  # no requirement: cheapest to load + run


def test_overloaded_and_interfered_are_skipped() -> None:
    loads = {"tiny.b1": load(OVL, 1.2)}
    sel = select(Query("ocr", 40), CAT, loads)
    assert sel.variant is not FAST and sel.meets_requirements
    assert "tiny.b1 overloaded or interfered" in sel.reason
    loads = {"tiny.b1": load(ITF), "v5.b1": load(ACT)}
    sel = select(Query("ocr", 40), CAT, loads)
    assert sel.variant is MID and sel.step == "active"


def test_only_busy_variants_meet_returns_the_busy_one_flagged() -> None:
    loads = {"tiny.b1": load(OVL, 1.5)}
    sel = select(Query("ocr", 10), CAT, loads)
    assert sel.variant is FAST and not sel.meets_requirements and sel.step == "closest"
    assert sel.state is OVL and "overloaded" in sel.reason


def test_step3_closest_flagged() -> None:
    sel = select(Query("ocr", 5, 0.999), CAT)
    assert not sel.meets_requirements and sel.step == "closest"
    assert "no variant of ocr meets latency <= 5 ms and accuracy >= 0.999" in sel.reason
    # relative shortfall: tiny (0.4 + 0.199) < huge (59 + 0.004) < v5 / small
    assert sel.variant is FAST
    sel = select(Query("ocr", 1000, 0.9999), CAT)
    assert sel.variant is BIG and not sel.meets_requirements
    sel = select(Query("ocr", 1), CAT)
    assert sel.variant is FAST and not sel.meets_requirements


def test_closest_prefers_an_active_variant_on_a_tie() -> None:
    twin = prof("tiny2.b1", 7, 0.80)
    cat = Catalog([FAST, twin])
    sel = select(Query("ocr", 1), cat, {"tiny2.b1": load(ACT)})
    assert sel.variant is twin and sel.state is ACT


# -- bad queries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "status", "text"),
    [
        (Query("nope", 10), 404, "unknown task 'nope' (registered tasks: embed, ocr)"),
        (Query("ocr", -1), 400, "latency_ms must be > 0 ms, got -1"),
        (Query("ocr", 0), 400, "latency_ms must be > 0 ms"),
        (Query("ocr", float("nan")), 400, "latency_ms must be a number"),
        (Query("ocr", "fast"), 400, "latency_ms must be a number, got 'fast'"),  # type: ignore[arg-type]
        (Query("ocr", True), 400, "latency_ms must be a number"),  # type: ignore[arg-type]
        (Query("ocr", 10, 1.5), 400, "min_accuracy must be within [0, 1], got 1.5"),
        (Query("ocr", 10, -0.1), 400, "min_accuracy must be within [0, 1]"),
        (Query(None, 10), 404, "unknown task None"),  # type: ignore[arg-type]
    ],
)
def test_bad_queries_are_clear_errors(query: Query, status: int, text: str) -> None:
    with pytest.raises(SelectionError) as exc:
        select(query, CAT)
    assert exc.value.status == status and text in str(exc.value)


def test_query_values_are_normalised() -> None:
    q = validate_query(Query("ocr", "12.5", "0.9"), ["ocr"])  # type: ignore[arg-type]
    assert q.latency_ms == 12.5 and q.min_accuracy == 0.9
    assert validate_query(Query("ocr", math.inf, 1), ["ocr"]).latency_ms == math.inf
    with pytest.raises(SelectionError, match="registered tasks: none"):
        validate_query(Query("ocr"), [])


def test_a_task_without_variants_is_an_error() -> None:
    cat = Catalog([])
    cat.by_task["empty"] = ()
    with pytest.raises(SelectionError, match="no generated variant"):
        select(Query("empty"), cat)


# -- state machine -------------------------------------------------------------------------


def test_classify_states() -> None:
    p = prof("v.b1", 10, 0.9, throughput_qps=100)
    assert classify(p, ready=0).state is INA
    assert classify(p, ready=1, rate=50, service_ms=9, samples=20).state is ACT
    assert classify(p, ready=1, rate=95).state is OVL  # >= 0.9 x 100 req/s
    assert classify(p, ready=2, rate=95).state is ACT  # two instances: 200 req/s
    assert classify(p, ready=1, pending=5).state is OVL  # > 4 per instance slot
    assert classify(p, ready=1, shedding=True).state is OVL
    assert classify(p, ready=1, service_ms=16, samples=20).state is ITF  # > 1.5 x 10 ms
    assert classify(p, ready=1, service_ms=16, samples=2).state is ACT  # too few samples
    lenient = SelectorConfig(interference_ratio=2.0)
    assert classify(p, ready=1, service_ms=16, samples=20, config=lenient).state is ACT
    ld = classify(p, ready=2, rate=50, pending=3)
    assert ld.instances == 2 and ld.utilisation == pytest.approx(1.5)  # 3 pending / 2 slots


def test_capacity_from_latency_and_batch() -> None:
    assert prof("a", 10, 1).capacity_qps == pytest.approx(100)
    assert prof("b", 40, 1, batch=4).capacity_qps == pytest.approx(100)
    assert prof("c", 40, 1, throughput_qps=150).capacity_qps == 150


def test_load_on_the_active_variant_moves_queries_to_another() -> None:
    p_fast = prof("fast.b1", 7, 0.8, throughput_qps=140)
    p_k2 = prof("fast.b1.k2", 7, 0.8, throughput_qps=170, memory_mb=90, partitions=2)
    cat = Catalog([p_fast, p_k2, MID])
    calm = {"fast.b1": classify(p_fast, ready=1, rate=20)}
    assert select(Query("ocr", 10), cat, calm).variant is p_fast
    busy = {"fast.b1": classify(p_fast, ready=1, rate=135, pending=9)}
    sel = select(Query("ocr", 10), cat, busy)
    assert sel.variant is p_k2 and sel.meets_requirements and sel.step == "inactive"


# -- vertical scaling (INFaaS §4.2.2) ------------------------------------------------------

B1 = prof("m.b1", 10, 0.9, throughput_qps=100, memory_mb=60, load_ms=100)
B4 = prof("m.b4", 30, 0.9, throughput_qps=160, memory_mb=80, load_ms=100, batch=4)
K2 = prof("m.b1.k2", 11, 0.9, throughput_qps=130, memory_mb=110, load_ms=120, partitions=2)
OTHER = prof("n.b1", 12, 0.95, throughput_qps=300, memory_mb=200, load_ms=300)
SMALL = prof("s.b1", 5, 0.85, throughput_qps=250, memory_mb=30, load_ms=50)
VARIANTS = [B1, B4, K2, OTHER, SMALL]


def test_upgrade_when_the_scaler_cannot_replicate() -> None:
    hot = VariantLoad(OVL, 1, 20, 120.0, 1.2)
    # the scaler can still replicate: no vertical action
    assert vertical_scale(B1, hot, VARIANTS, slo_ms=40, can_replicate=True) is None
    act = vertical_scale(B1, hot, VARIANTS, slo_ms=40, can_replicate=False)
    # same model first (B4: 1 instance of 160 req/s, cost 80 x 1.1 < K2's), and the
    # accuracy floor (B1's 0.9) keeps SMALL out
    assert act is not None and act.action == "upgrade" and act.target == "m.b4"
    assert act.instances == 1 and "cannot add another m.b1" in act.reason
    # a tight SLO rules the batch-4 variant out: the plan K=2 is the same model's upgrade
    act = vertical_scale(B1, hot, VARIANTS, slo_ms=11, can_replicate=False)
    assert act is not None and act.target == "m.b1.k2"
    # no variant of the same model fits: another model meeting SLO and accuracy
    act = vertical_scale(B1, hot, [B1, OTHER, SMALL], slo_ms=20, can_replicate=False)
    assert act is not None and act.target == "n.b1"
    # a lower accuracy floor admits the cheap fast one
    act = vertical_scale(
        B1, hot, [B1, OTHER, SMALL], slo_ms=20, min_accuracy=0.8, can_replicate=False
    )
    assert act is not None and act.target == "s.b1"


def test_upgrade_respects_memory_and_headroom() -> None:
    hot = VariantLoad(OVL, 1, 20, 120.0, 1.2)
    # only 10 MB free + B1's 60 MB freed: nothing fits
    assert (
        vertical_scale(B1, hot, VARIANTS, slo_ms=40, can_replicate=False, memory_free_mb=10) is None
    )
    cool = VariantLoad(ACT, 1, 0, 50.0, 0.5)  # headroom 2 >= slack
    assert vertical_scale(B1, cool, VARIANTS, slo_ms=40, can_replicate=False) is None


def test_downgrade_when_a_cheaper_variant_serves_the_load() -> None:
    low = VariantLoad(ACT, 2, 0, 20.0, 0.1)
    # OTHER (2 instances x 200 MB) -> B1 serves 20 req/s at utilisation 0.2, cheaper
    act = vertical_scale(OTHER, low, VARIANTS, slo_ms=40, min_accuracy=0.9, since_change_s=60)
    assert act is not None and act.action == "downgrade" and act.target == "m.b1"
    assert act.instances == 1
    # not before T_v (the hold, at least the load time)
    assert (
        vertical_scale(OTHER, low, VARIANTS, slo_ms=40, min_accuracy=0.9, since_change_s=1) is None
    )
    # no traffic: nothing to size a downgrade on
    idle = VariantLoad(ACT, 2, 0, 0.0, 0.0)
    assert vertical_scale(OTHER, idle, VARIANTS, slo_ms=40, since_change_s=60) is None
    # a variant below the accuracy floor is never a downgrade target
    act = vertical_scale(OTHER, low, [OTHER, SMALL], slo_ms=40, min_accuracy=0.9, since_change_s=60)
    assert act is None
    # the cheapest already: nothing to do
    assert vertical_scale(SMALL, low, VARIANTS, slo_ms=40, since_change_s=60) is None


def test_scaling_config() -> None:
    low = VariantLoad(ACT, 1, 0, 20.0, 0.1)
    cfg = ScalingConfig(hold_s=0.0, downgrade_utilisation=0.05)
    # B1 at 20 req/s would run at 0.2 > 0.05: no downgrade from OTHER
    act = vertical_scale(
        OTHER, low, [OTHER, B1], slo_ms=40, min_accuracy=0.9, since_change_s=1, config=cfg
    )
    assert act is None


def test_decision_time_is_well_under_100_us() -> None:
    profiles = [
        prof(f"m{i}.b{b}", 5 + 3 * i + b, 0.7 + 0.015 * i, batch=b)
        for i in range(10)
        for b in (1, 4)
    ]
    cat = Catalog(profiles)
    loads = {p.name: load(ACT, 0.1 * (i % 5)) for i, p in enumerate(profiles[:6])}
    queries = [Query("ocr", 5 + (i % 40), 0.7 + (i % 30) / 100) for i in range(2000)]
    t0 = time.perf_counter()
    for q in queries:
        select(q, cat, loads)
    per_query_us = (time.perf_counter() - t0) / len(queries) * 1e6
    assert per_query_us < 100, per_query_us
