"""The planner's inputs for pipelines with function stages (issue 15), as pure functions
on hand-built stages: function steps fused into a model stage's first / last partition
(runtime.pipeline.fuse_units), the fan-out's items per request, a per-item stage's
arrival rate, the analytic capacity, the factor SLO's 1-thread latency and which
pipelines are left to the planner. Every expected figure is worked out in the comment."""

from __future__ import annotations

import pytest

from infscaler.base.config import load_pipeline
from infscaler.runtime.planning.autoplan import needs_planning, stage_order
from infscaler.runtime.planning.inputs import PlannerInputs, base_latency_ms, whole_pipeline
from infscaler.runtime.planning.planner import ModelStage, search
from infscaler.runtime.planning.resources import arrival_rates, capacity_rps
from infscaler.runtime.planning.simulator import EngineProfile, UnitConfig, UnitProfile
from infscaler.runtime.scaling.types import ResourceCap


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
    whole = whole_pipeline(cfg)
    assert whole.stages[1].partitions is None and whole.stages[1].instances == 1
    # a function stage keeps its fields set: setting `instances` would stop it fusing
    assert "instances" not in whole.stages[0].model_fields_set
    assert whole.stages[0].fuses(True)


def test_pinned_threads_count_model_units_as_the_scaler_does():
    # a 2-thread model unit x 2 instances pins 4 threads; a separately served function
    # unit pins none (Monitor.pinned_threads counts model stages only), so the growth
    # loop and the oversubscription filter read the same 4
    from infscaler.runtime.planning.resources import pinned_threads

    model = UnitProfile("det", {"cpu": EngineProfile("cpu", 10.0, cores=2)})
    fn = UnitProfile("post", {"cpu": EngineProfile("cpu", 1.0)}, kind="function")
    cfg = [UnitConfig({"cpu": 2}), UnitConfig({"cpu": 3})]
    assert pinned_threads([model, fn], cfg) == 4
    assert pinned_threads([model, fan_in()], [UnitConfig({"cpu": 1}), UnitConfig({"cpu": 1})]) == 2


# -- the whole pipeline in one unit (fuse: whole) ------------------------------------------------


def _two_models():
    # det: 2 ms fused before a 10 ms (1 thread) / 6 ms (2 threads) model that fans out
    # 1 or 3 items; rec: 4 / 3 ms per item; a 1 ms fan-in
    det = ModelStage("det", costs=(1,), valid_cuts=(), whole_ms={1: 10.0, 2: 6.0}, pre_ms=2.0,
                     items=(1, 3), weights_bytes=(4e6,), activations_mb=2.0,
                     instance_overhead_mb=45.0)  # fmt: skip
    rec = ModelStage("rec", costs=(1,), valid_cuts=(), whole_ms={1: 4.0, 2: 3.0},
                     weights_bytes=(1e6,), activations_mb=1.0, instance_overhead_mb=45.0)  # fmt: skip
    return det, rec


def test_whole_profiles_sum_the_units_per_request_at_each_measured_thread_count():
    from infscaler.runtime.planning.inputs import whole_profiles

    det, rec = _two_models()
    got = whole_profiles([det, rec, fan_in(1.0)], "prep>det>crops>rec>merge")
    assert sorted(got) == [1, 2]
    one, two = got[1].engines["cpu"], got[2].engines["cpu"]
    # 1 thread: (2 + 10) + n x 4 + 1 for n = 1, 3 items: 17, 25 ms; mean 21 ms = the
    # factor SLO's reference (12 + 2 x 4 + 1)
    assert one.samples_ms == (17.0, 25.0) and one.mean_ms == pytest.approx(21.0)
    assert one.mean_ms == pytest.approx(base_latency_ms([det, rec, fan_in(1.0)]))
    # 2 threads: the measured 6 and 3 ms, not a speed-up made up: (8 + 3 + 1, 8 + 9 + 1)
    assert two.samples_ms == (12.0, 18.0) and two.mean_ms == pytest.approx(15.0)
    assert (one.cores, two.cores) == (1, 2)
    # memory: det 4 + 2, rec 1 + 1 MB (weights + activations), one 45 MB overhead = 53 MB
    # (staged, each its own instance: 51 + 47 = 98 MB)
    assert one.memory_mb == pytest.approx(53.0) and two.memory_mb == pytest.approx(53.0)
    assert got[1].kind == "model" and got[1].served and not got[1].fan_out
    assert got[1].name == "prep>det>crops>rec>merge"
    # a count one model was not measured at is no candidate (rec only at 1 thread)
    rec1 = ModelStage("rec", costs=(1,), valid_cuts=(), whole_ms={1: 4.0})
    assert sorted(whole_profiles([det, rec1, fan_in(1.0)])) == [1]
    # no fan-out: the sum, one value (det 10 + rec 4 at 1 thread; 6 + 3 at 2)
    a = ModelStage("a", costs=(1,), valid_cuts=(), whole_ms={1: 10.0, 2: 6.0}, cv=0.2)
    b = ModelStage("b", costs=(1,), valid_cuts=(), whole_ms={1: 4.0, 2: 3.0}, cv=0.1)
    plain = whole_profiles([a, b])
    assert plain[1].engines["cpu"].mean_ms == pytest.approx(14.0)
    assert plain[2].engines["cpu"].mean_ms == pytest.approx(9.0)
    assert plain[1].engines["cpu"].cv == pytest.approx(0.2)


def test_search_scores_the_whole_unit_and_grows_its_instances():
    from infscaler.runtime.planning.inputs import whole_profiles

    det, rec = _two_models()
    stages = [det, rec, fan_in(1.0)]
    whole = whole_profiles(stages, "w")
    cap = ResourceCap(memory_cap_mb=float("inf"), memory_used_mb=0.0, max_instances={}, cores=2)
    out = search(stages, 400.0, cap, cores=2, frontend_ms=0.0, max_partitions=1, whole=whole)
    rows = [c for c in out.candidates if c.whole]
    assert len(rows) == 2  # t = 1 and t = 2
    t1 = next(c for c in rows if c.threads == (1, 1))
    # at 1 thread on 2 cores it grows to 2 instances (2 pinned threads = the 2 cores):
    # at most 2 x 1000 / 21 = 95.2 requests/s; the SLO of 400 ms leaves most of it
    assert [u.name for u in t1.units] == ["w"] and t1.config[0].total == 2
    assert t1.max_rate_rps is not None and 0.5 * 2000 / 21 < t1.max_rate_rps <= 2000 / 21 + 1e-6
    assert t1.memory_mb == pytest.approx(2 * 53.0)
    assert t1.label() == "whole pipeline in one unit (fuse: whole) t=1 inst=2"
    assert t1.cuts == ((), ()) and t1.objectives == (("whole",), ("whole",))
    assert any(line.startswith("whole pipeline in one unit") for line in out.explain[1:])
    assert out.to_dict()["candidates"][out.candidates.index(t1)]["whole"] is True
    # the staged candidates are still there, and the hand comparisons skip the whole one
    assert any(not c.whole for c in out.candidates)
    assert not any(
        "replication" in line and "whole" in line for line in out.explain if line.startswith("vs ")
    )


def test_a_memory_cap_only_the_whole_unit_fits_makes_it_the_winner():
    from infscaler.runtime.planning.inputs import whole_profiles

    # staged, one instance per unit needs 51 + 47 = 98 MB; the whole unit 53 MB: with a
    # 60 MB cap only the whole unit (one instance) fits
    det, rec = _two_models()
    stages = [det, rec, fan_in(1.0)]
    cap = ResourceCap(memory_cap_mb=60.0, memory_used_mb=0.0, max_instances={}, cores=2)
    out = search(stages, 400.0, cap, cores=2, frontend_ms=0.0, max_partitions=1,
                 whole=whole_profiles(stages))  # fmt: skip
    assert out.best is not None and out.best.whole
    assert out.best.config[0].total == 1 and out.best.memory_mb == pytest.approx(53.0)
    assert all(not c.fits for c in out.candidates if not c.whole)


def test_a_tie_goes_to_fewer_units_before_less_memory():
    from infscaler.runtime.planning.inputs import whole_profiles

    # det 10 ms + rec 4 ms per request, no fan-out, an SLO wide enough for the capacity
    # to decide: staged det + rec (one instance each, 2 units, less memory) and the whole
    # pipeline in one unit (2 x 1 thread, 1 unit, more memory) tie within 5 %
    det = ModelStage("det", costs=(1,), valid_cuts=(), whole_ms={1: 10.0},
                     weights_bytes=(100e6,), instance_overhead_mb=45.0)  # fmt: skip
    rec = ModelStage("rec", costs=(1,), valid_cuts=(), whole_ms={1: 4.0},
                     weights_bytes=(100e6,), instance_overhead_mb=45.0)  # fmt: skip
    stages = [det, rec]
    cap = ResourceCap(memory_cap_mb=float("inf"), memory_used_mb=0.0, max_instances={}, cores=2)
    out = search(stages, 2000.0, cap, cores=2, frontend_ms=0.0, max_partitions=1,
                 whole=whole_profiles(stages), goodput_tie=0.5)  # fmt: skip
    staged = next(c for c in out.candidates if not c.whole and c.threads == (1, 1))
    whole = next(c for c in out.candidates if c.whole and c.threads == (1, 1))
    assert staged.memory_mb < whole.memory_mb
    assert staged.goodput_rps >= 0.5 * whole.goodput_rps  # tied at 50 %
    assert out.best is whole or out.best.label() == whole.label()
    assert "with more units (2 > 1: partitions and stages)" in staged.why


def test_the_planner_s_whole_winner_deploys_as_one_unit():
    from infscaler.runtime.planning.autoplan import whole_config

    cfg = load_pipeline(
        {"name": "p", "slo": "300ms", "autoscale": {},
         "inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}],
         "outputs": ["z"],
         "stages": [
             {"name": "prep", "function": "infscaler.pipelines.dddd:det_preprocess",
              "inputs": ["image"], "outputs": ["x"]},
             {"name": "a", "model": "resnet50", "inputs": {"data": "x"}, "outputs": {"o": "y"}},
             {"name": "b", "model": "resnet50", "inputs": {"data": "y"}, "outputs": {"o": "z"}},
         ]}
    )  # fmt: skip
    assert needs_planning(cfg)
    planned = whole_config(cfg, (1, 2), threads=2, instances=3)
    assert planned.whole and planned.fuse == "whole"
    assert [(s.threads, s.instances) for s in planned.stages[1:]] == [(2, 3), (2, 3)]
    # the function stage as written: nothing of its own scaling set
    assert not {"threads", "instances", "fuse"} & planned.stages[0].model_fields_set
    # a fuse: whole pipeline deploys as written: not planned again
    assert not needs_planning(planned)


def test_cv_by_threads_sets_each_thread_count_s_spread() -> None:
    st = ModelStage(
        "m", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0, 2: 6.0}, cv=0.05,
        cv_by_threads={2: 0.2},
    )  # fmt: skip
    # per thread count its own CV, else the stage's; every partition keeps the spread
    assert [u.engines["cpu"].cv for u in st.units((0,), 2)] == [0.2, 0.2]
    assert st.units((), 1)[0].engines["cpu"].cv == 0.05
    for bad in ({2: -0.1}, {2: float("nan")}):
        with pytest.raises(ValueError, match=r"cv_by_threads\[2\]"):
            ModelStage("m", costs=(1,), valid_cuts=(), whole_ms={1: 1.0}, cv_by_threads=bad)


def test_corun_by_threads_sets_each_unit_s_co_running_slowdown() -> None:
    st = ModelStage(
        "m", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0, 2: 6.0}, corun_by_threads={1: 0.05},
    )  # fmt: skip
    # at 1 thread every partition slows as the whole model did with every core busy; at
    # a count with no measurement (2 threads on 2 cores: no copy beside it) not at all
    assert [u.engines["cpu"].corun for u in st.units((0,), 1)] == [0.05, 0.05]
    assert st.units((), 2)[0].engines["cpu"].corun == 0.0
    with pytest.raises(ValueError, match=r"corun_by_threads\[1\]"):
        ModelStage("m", costs=(1,), valid_cuts=(), whole_ms={1: 1.0}, corun_by_threads={1: -1})


def test_frontend_profile_is_the_front_end_the_search_scores() -> None:
    from infscaler.runtime.planning import planner

    fe = planner.frontend_profile(2.0)
    assert (fe.name, fe.served, fe.kind) == ("frontend", False, "function")
    assert fe.engines["cpu"].mean_ms == 2.0 and fe.engines["cpu"].cores == 1
    # ahead of a 10 ms unit, one request at a time: 2 ms more per request, and the
    # handover per hop on top
    u = UnitProfile("m", {"cpu": EngineProfile("cpu", 10.0, cores=1)}, kind="model")
    times = [i * 1.0 for i in range(20)]  # 1/s: nothing queues
    alone = planner.predict([u], [UnitConfig({"cpu": 1})], times, cpu_cores=2)
    both = planner.predict(
        [fe, u], [UnitConfig({"cpu": 1})] * 2, times, cpu_cores=2, handover_ms=planner.HANDOVER_MS
    )
    assert alone.p50_ms == pytest.approx(10.0)
    assert both.p50_ms == pytest.approx(12.0 + 3 * planner.HANDOVER_MS, abs=0.05)
    with pytest.raises(ValueError):
        planner.frontend_profile(-1.0)


def test_idle_slowdown_reaches_the_units_and_the_whole_pipeline():
    from infscaler.runtime.planning.inputs import whole_profiles

    # a stage's idle points go to each of its units at that thread count (its partitions
    # at the same factor); the whole pipeline's are the stages' factors weighted by their
    # times: at 1 thread (10 x 1.2 + 5 x 1.8) / 15 = 1.4 at 0.1 s, (10 x 1.5 + 5 x 3) /
    # 15 = 2.0 at 0.25 s; a gap only one stage measured is left out
    a = ModelStage(
        "a", costs=(1, 1), valid_cuts=(0,), whole_ms={1: 10.0},
        idle_by_threads={1: ((0.1, 1.2), (0.25, 1.5))},
    )  # fmt: skip
    b = ModelStage(
        "b", costs=(1,), valid_cuts=(), whole_ms={1: 5.0},
        idle_by_threads={1: ((0.05, 1.1), (0.1, 1.8), (0.25, 3.0))},
    )  # fmt: skip
    parts = a.units((0,), 1)
    assert all(u.engines["cpu"].idle == ((0.1, 1.2), (0.25, 1.5)) for u in parts)
    idle = whole_profiles([a, b])[1].engines["cpu"].idle
    assert [g for g, _ in idle] == [0.1, 0.25]
    assert [f for _, f in idle] == pytest.approx([1.4, 2.0])
    # a stage without idle points: the whole pipeline has none
    c = ModelStage("c", costs=(1,), valid_cuts=(), whole_ms={1: 5.0})
    assert whole_profiles([a, c])[1].engines["cpu"].idle == ()
    with pytest.raises(ValueError, match="idle_by_threads"):
        ModelStage("d", costs=(1,), valid_cuts=(), whole_ms={1: 5.0},
                   idle_by_threads={1: ((0.2, 1.5), (0.1, 1.2))})  # fmt: skip
