"""The planner's inputs for pipelines with function stages (issue 15), as pure functions
on hand-built stages: function steps fused into a model stage's first / last partition
(runtime.pipeline.fuse_units), the fan-out's items per request, a per-item stage's
arrival rate, the analytic capacity, the factor SLO's 1-thread latency and which
pipelines are left to the planner. Every expected figure is worked out in the comment."""

from __future__ import annotations

import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.autoplan import (
    PlannerInputs,
    _whole,
    base_latency_ms,
    needs_planning,
    stage_order,
)
from infscaler.runtime.planner import (
    ModelStage,
    arrival_rates,
    capacity_rps,
    search,
)
from infscaler.runtime.scaler import ResourceCap
from infscaler.runtime.simulator import EngineProfile, UnitConfig, UnitProfile


def ms_of(units):
    return [u.engines["cpu"].mean_ms for u in units]


def fan_in(ms: float = 1.0) -> UnitProfile:
    return UnitProfile(
        "merge", {"cpu": EngineProfile("cpu", ms)}, kind="function", fan_in=True, served=False
    )


def test_a_pre_step_fused_into_a_model_adds_its_time_to_the_unit():
    # a 5 ms pre-step fused into a 10 ms model: one unit of 15 ms, 1000 / 15 requests/s
    # per instance; 2 instances on 4 cores: 2000 / 15 (the cores allow 4000 / 15)
    st = ModelStage("det", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0}, pre_ms=5.0)
    units = st.units((), 1)
    assert ms_of(units) == [pytest.approx(15.0)]
    assert capacity_rps(units, [UnitConfig({"cpu": 1})], 4) == pytest.approx(1000 / 15)
    assert capacity_rps(units, [UnitConfig({"cpu": 2})], 4) == pytest.approx(2000 / 15)
    # 1 core: the cpu bounds it at 1000 / 15 whatever the instances
    assert capacity_rps(units, [UnitConfig({"cpu": 2})], 1) == pytest.approx(1000 / 15)


def test_pre_and_post_steps_go_to_the_first_and_last_partitions():
    # costs [1, 1] share 10 ms equally; cut after op 0: [5 + 5 pre, 5 + 2 post]
    st = ModelStage(
        "det", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0}, pre_ms=5.0, post_ms=2.0
    )
    assert ms_of(st.units((0,), 1)) == [pytest.approx(10.0), pytest.approx(7.0)]
    # measured partitions replace the estimate; the fused steps are still added
    st2 = ModelStage(
        "det", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0}, pre_ms=5.0, post_ms=2.0,
        unit_ms={((0,), 1): (3.0, 8.0)},
    )  # fmt: skip
    assert ms_of(st2.units((0,), 1)) == [pytest.approx(8.0), pytest.approx(10.0)]
    with pytest.raises(ValueError, match="pre_ms"):
        ModelStage("x", costs=(1,), valid_cuts=(), whole_ms={1: 1.0}, pre_ms=-1.0)


def test_the_fan_out_is_on_the_last_partition_and_per_item_units_get_items_x_the_rate():
    # det fans out 2 or 4 items per request (mean 3); rec runs per item; merge fans in
    det = ModelStage(
        "det", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0}, post_ms=1.0, items=(2, 4)
    )
    rec = ModelStage("rec", costs=(1,), valid_cuts=(), whole_ms={1: 10.0})
    units = [*det.units((0,), 1), *rec.units((), 1), fan_in(1.0)]
    assert [u.fan_out for u in units] == [False, True, False, False]
    assert units[1].items_mean == pytest.approx(3.0)
    # 10 requests/s: det/0 and det/1 see 10, rec 3 x 10 = 30 items/s, the fan-in 10
    assert arrival_rates(units, 10.0) == pytest.approx([10.0, 10.0, 30.0, 10.0])
    # rec (10 ms x 3 items = 30 ms per request, 1 instance) bounds it: 1000 / 30;
    # 3 instances: det/1's 6 ms -> 1000 / 10 = 100 vs rec 3000 / 30 = 100 vs the cpu on
    # 8 cores: 8000 / (5 + 6 + 30 + 1) = 190
    cfg = [UnitConfig({"cpu": 1}) for _ in units]
    assert capacity_rps(units, cfg, 8) == pytest.approx(1000 / 30)
    cfg[2] = UnitConfig({"cpu": 3})
    assert capacity_rps(units, cfg, 8) == pytest.approx(100.0)


def test_the_factor_slo_reference_counts_fused_steps_and_items():
    # a 5 ms step before a 10 ms model; a 4 ms model per item, 3 items; a 1 ms fan-in:
    # 15 + 3 x 4 + 1 = 28 ms
    det = ModelStage("det", costs=(1,), valid_cuts=(), whole_ms={1: 10.0, 2: 6.0}, pre_ms=5.0,
                     items=(3,))  # fmt: skip
    rec = ModelStage("rec", costs=(1,), valid_cuts=(), whole_ms={1: 4.0})
    assert base_latency_ms([det, rec, fan_in(1.0)]) == pytest.approx(28.0)
    # without function stages: the model stages in turn, as before
    assert base_latency_ms([rec, rec]) == pytest.approx(8.0)


def test_stage_order_reads_each_stage_s_units():
    a = ModelStage("a", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 1.0})
    inp = PlannerInputs(
        stages=(a, fan_in(), a),  # (a fan-in between two model stages only to count)
        model_index=(0, 2),
        paths=(),
        shapes=(),
        base_ms=1.0,
    )
    assert stage_order(inp, [(0,), ()]) == [(0, 2), (2, 1), (3, 1)]


def test_search_scores_a_per_item_bottleneck_at_items_x_the_rate():
    # det 5 + 5 ms fans out 3 items; a per-item function unit of 10 ms, held to one
    # instance, then the fan-in: that unit serves 3 x 10 = 30 ms per request, so no
    # configuration passes 1000 / 30 = 33.3 requests/s; with det's 10 ms on 1 thread and
    # 8 cores, det alone would allow 100/s per instance
    det = ModelStage("det", costs=(1,), valid_cuts=(), whole_ms={1: 5.0}, pre_ms=5.0, items=(3,))
    per_item = UnitProfile(
        "rec_fn", {"cpu": EngineProfile("cpu", 10.0)}, kind="function", max_instances=1
    )
    cap = ResourceCap(memory_cap_mb=float("inf"), memory_used_mb=0.0, max_instances={}, cores=8)
    out = search([det, per_item, fan_in(0.5)], 400.0, cap, cores=8, frontend_ms=0.0,
                 max_partitions=1)  # fmt: skip
    assert out.best is not None and out.best.max_rate_rps is not None
    assert 0.5 * 1000 / 30 < out.best.max_rate_rps <= 1000 / 30 + 1e-6
    names = [u.name for u in out.best.units]
    assert names == ["det", "rec_fn", "merge"]
    assert out.best.units[0].fan_out and out.best.units[0].items == (3,)


def _pipe(**over):
    stages = [
        {"name": "prep", "function": "infscaler.pipelines.dddd:det_preprocess",
         "inputs": ["image"], "outputs": ["x"]},
        {"name": "m", "model": "resnet50", "inputs": {"data": "x"}, "outputs": {"out": "y"}},
    ]  # fmt: skip
    for k, v in over.pop("prep", {}).items():
        stages[0][k] = v
    for k, v in over.pop("model", {}).items():
        stages[1][k] = v
    data = {
        "name": "p", "slo": "200ms", "autoscale": {}, "stages": stages,
        "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
        "outputs": ["y"], **over,
    }  # fmt: skip
    return load_pipeline({k: v for k, v in data.items() if v is not None})


def test_needs_planning_with_function_stages():
    assert needs_planning(_pipe())
    # a function stage scaled on its own (the user's choice): deployed as written
    assert not needs_planning(_pipe(prep={"instances": 2}))
    assert not needs_planning(_pipe(prep={"threads": 2}))
    assert not needs_planning(_pipe(prep={"max_instances": 3}))
    # a model stage the user configured; no autoscale; no SLO
    assert not needs_planning(_pipe(model={"partitions": 2}))
    # a bound on the replicas is the user's (the model-less variants set one): as written
    assert not needs_planning(_pipe(model={"max_instances": 1}))
    assert not needs_planning(_pipe(autoscale=None))
    assert not needs_planning(_pipe(slo=None, autoscale=None))
    # no model stage: nothing to search
    only_fn = load_pipeline(
        {"name": "f", "slo": "200ms", "autoscale": {}, "outputs": ["x"],
         "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
         "stages": [{"name": "prep", "function": "infscaler.pipelines.dddd:det_preprocess",
                     "inputs": ["image"], "outputs": ["x"]}]}
    )  # fmt: skip
    assert not needs_planning(only_fn)


def test_the_search_config_drops_model_choices_and_keeps_function_stages_as_written():
    cfg = _pipe(model={"partitions": 2, "instances": [1, 2]})
    whole = _whole(cfg)
    assert whole.stages[1].partitions is None and whole.stages[1].instances == 1
    # a function stage keeps its fields set: setting `instances` would stop it fusing
    assert "instances" not in whole.stages[0].model_fields_set
    assert whole.stages[0].fuses(True)


def test_pinned_threads_count_model_units_as_the_scaler_does():
    # a 2-thread model unit x 2 instances pins 4 threads; a separately served function
    # unit pins none (Monitor.pinned_threads counts model stages only), so the growth
    # loop and the oversubscription filter read the same 4
    from infscaler.runtime.planner import _pinned

    model = UnitProfile("det", {"cpu": EngineProfile("cpu", 10.0, cores=2)})
    fn = UnitProfile("post", {"cpu": EngineProfile("cpu", 1.0)}, kind="function")
    cfg = [UnitConfig({"cpu": 2}), UnitConfig({"cpu": 3})]
    assert _pinned([model, fn], cfg) == 4
    assert _pinned([model, fan_in()], [UnitConfig({"cpu": 1}), UnitConfig({"cpu": 1})]) == 2
