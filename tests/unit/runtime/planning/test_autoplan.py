"""The planner's search on a real ONNX model (issue 15), in-process: measuring a model
stage, and the `infscaler plan --explain` CLI. Deploying a pipeline left to the planner
(served and checked) is in tests/integration/runtime/planning/test_autoplan.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infscaler.cli import app
from infscaler.runtime.planning.stageprofile import measure_model_stage
from tests.helpers import save
from tests.integration.runtime.planning.test_autoplan import conv_chain


@pytest.fixture
def chain_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path / "cache"))
    return save(conv_chain(), tmp_path / "chain.onnx")


def test_measured_stage_has_costs_cuts_and_thread_times(chain_path: Path) -> None:
    st = measure_model_stage(chain_path, threads=(1, 2), repeats=3)
    assert len(st.costs) == 5 and st.valid_cuts == (0, 1, 2, 3)
    assert st.costs[0] == st.costs[2] == st.costs[4] > 0  # three equal convolutions
    assert 1 in st.whole_ms and all(v > 0 for v in st.whole_ms.values())
    assert sum(st.weights_bytes) == 3 * 16 * 16 * 9 * 4
    units = st.units((1,), 1)
    assert [u.name for u in units] == ["model/0", "model/1"]
    # the two partitions share the measured whole time (+ T_p on the second)
    total = sum(u.engines["cpu"].mean_ms for u in units)
    assert total == pytest.approx(st.whole_ms[1] + st.tp_ms(1), rel=1e-6)


def test_cli_plan_explain_prints_the_candidates_and_the_winner(chain_path: Path) -> None:
    r = CliRunner().invoke(
        app,
        ["plan", str(chain_path), "--slo", "500ms", "--explain", "--max-partitions", "2",
         "--device", "cpu-host", "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{") :])
    assert d["best"] is not None and d["best"]["max_rate_rps"] > 0
    assert len(d["candidates"]) >= 2
    assert d["candidates"][0]["why"].startswith("WINNER")
    assert all(c["why"] for c in d["candidates"])
    assert {"cuts", "bottleneck_share"} <= set(d["eq1_plan"]["model"])
    bad = CliRunner().invoke(app, ["plan", str(chain_path), "--slo", "1s", "--objective", "x"])
    assert bad.exit_code != 0 and "unknown --objective" in str(bad.exception)


def test_search_measured_replaces_the_estimates_of_the_best_candidates(chain_path: Path) -> None:
    from infscaler.runtime.planning.planner import search
    from infscaler.runtime.planning.stageprofile import measure_units_err, search_measured
    from infscaler.runtime.scaling.types import ResourceCap

    st = measure_model_stage(chain_path, threads=(1,), repeats=3)
    ms, _ = measure_units_err(chain_path, (1,), 1, repeats=3)
    assert len(ms) == 2 and all(v > 0 for v in ms)
    cap = ResourceCap(memory_cap_mb=float("inf"), memory_used_mb=0.0, max_instances={}, cores=2)
    est = search([st], 500.0, cap, cores=2, max_partitions=2)
    out, stages = search_measured(
        [st], [chain_path], 500.0, cap, refine=2, cores=2, max_partitions=2
    )
    # the partitions of the 2 best candidates with K > 1 are measured now, in the stage
    top = [c for c in out.candidates[:2] if c.cuts[0]]
    assert all((c.cuts[0], c.threads[0]) in stages[0].unit_ms for c in top)
    assert {c.cuts for c in out.candidates} == {c.cuts for c in est.candidates}
    assert out.best is not None


def test_measured_stage_records_the_spread_of_its_runs(
    chain_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infscaler.partitioner import profiler
    from infscaler.runtime.planning import stageprofile

    seen: dict[int, int] = {}
    real = profiler.measure_latency_samples

    def spy(*a, **kw):  # the runs each thread count was timed with
        times = real(*a, **kw)
        seen[kw["threads"]] = len(times)
        return times

    monkeypatch.setattr(profiler, "measure_latency_samples", spy)
    st = measure_model_stage(chain_path, threads=(1, 2), repeats=3)
    # a ~ms model: timed on to SPREAD_MAX_RUNS runs within the 2 s budget, and the CV
    # of those runs recorded per thread count
    cores = profiler.usable_cores()
    assert seen == {t: stageprofile.SPREAD_MAX_RUNS for t in (1, 2) if t <= cores}
    assert set(st.cv_by_threads) == set(seen) and all(v >= 0 for v in st.cv_by_threads.values())
    # the units at a thread count draw gamma service times with its CV
    assert st.units((), 1)[0].engines["cpu"].cv == st.cv_by_threads[1]
    # and the co-running slowdown where two copies fit the cores (1 thread on >= 2)
    assert set(st.corun_by_threads) == {t for t in (1, 2) if cores // t >= 2}
    assert all(v >= 0 for v in st.corun_by_threads.values())
    if 1 in st.corun_by_threads:
        assert st.units((), 1)[0].engines["cpu"].corun == st.corun_by_threads[1]


def test_samples_keep_to_their_repeats_budget_and_cap(chain_path: Path) -> None:
    import numpy as np

    from infscaler.partitioner import profiler

    feeds = {"x": np.ones((1, 16, 32, 32), np.float32)}
    few = profiler.measure_latency_samples(chain_path, feeds, warmup=0, repeats=3, threads=1)
    assert len(few) == 3  # no budget: the repeats only
    capped = profiler.measure_latency_samples(
        chain_path, feeds, warmup=0, repeats=3, threads=1, budget_s=60.0, max_repeats=12
    )
    assert len(capped) == 12 and all(t > 0 for t in capped)
    # a budget already spent by the repeats adds none
    spent = profiler.measure_latency_samples(
        chain_path, feeds, warmup=0, repeats=4, threads=1, budget_s=1e-9, max_repeats=12
    )
    assert len(spent) == 4


def test_spread_cv_needs_enough_runs() -> None:
    from infscaler.runtime.planning.stageprofile import SPREAD_MIN_RUNS, spread_cv

    assert spread_cv([10.0] * (SPREAD_MIN_RUNS - 1)) is None
    assert spread_cv([10.0] * SPREAD_MIN_RUNS) == 0.0
    runs = [9.0, 11.0] * (SPREAD_MIN_RUNS // 2)
    # sample standard deviation over the mean: sqrt(n / (n - 1)) x 1 / 10
    n = len(runs)
    assert spread_cv(runs) == pytest.approx((n / (n - 1)) ** 0.5 / 10.0)


def test_idle_slowdown_is_measured_only_when_asked(chain_path: Path) -> None:
    from infscaler.partitioner import profiler
    from infscaler.runtime.planning import stageprofile

    # off by default (stageprofile.IDLE_DEFAULT: the in-process curve overstates the
    # served one); asked for, one point per profiler.IDLE_GAPS_S gap at each count
    assert stageprofile.IDLE_DEFAULT is False
    plain = measure_model_stage(chain_path, threads=(1,), repeats=3)
    assert plain.idle_by_threads == {}
    assert plain.units((), 1)[0].engines["cpu"].idle == ()
    st = measure_model_stage(chain_path, threads=(1,), repeats=3, idle=True)
    assert [g for g, _ in st.idle_by_threads[1]] == list(profiler.IDLE_GAPS_S)
    assert all(f >= 1.0 for _, f in st.idle_by_threads[1])
    assert st.units((), 1)[0].engines["cpu"].idle == st.idle_by_threads[1]


def test_an_edited_function_module_plans_again(
    chain_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept decision's key holds each function stage's module file (path, size,
    mtime): the planner measured that step's cost, so an edit plans again; the module is
    located, not imported; a module outside the allowed ones is not even located."""
    import os
    import sys

    from infscaler.base.config import load_pipeline
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.decisions import decision_path, function_key

    mod = tmp_path / "mods" / "isc_prepost_probe.py"
    mod.parent.mkdir()
    mod.write_text("raise RuntimeError('imported')\ndef pre(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(mod.parent))
    cfg = load_pipeline(
        {
            "name": "p",
            "slo": "200ms",
            "autoscale": {},
            "inputs": [{"name": "raw", "datatype": "FP32", "shape": [1, 16, 8, 8]}],
            "outputs": ["y"],
            "stages": [
                {"name": "pre", "function": "isc_prepost_probe:pre", "inputs": ["raw"],
                 "outputs": ["x"]},
                {"name": "m", "model": str(chain_path), "inputs": {"x": "x"},
                 "outputs": {"y": "y"}},
            ],
        }
    )  # fmt: skip
    dev = load_profile("cpu-host")

    def key(allowed=None) -> Path:
        return decision_path(cfg, dev, tmp_path / "s", None, ("eq1",), None, allowed)

    before = key()
    assert "isc_prepost_probe" not in sys.modules  # located, never run
    assert key() == before  # stable
    mod.write_text(mod.read_text() + "# edited\n")
    st = mod.stat()
    os.utime(mod, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert key() != before
    assert function_key("isc_prepost_probe:pre", ["other"]).endswith("|?")
    assert function_key("no_such_module_here:f", None) == "no_such_module_here:f|?"


def test_a_replan_passes_the_configuration_planned_before(
    chain_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision under another key (here: another rate) for the same pipeline name is
    the search's ``incumbent``: the tie is kept by what was planned before; the first
    plan has none, and decisions of other pipelines are not read."""
    from infscaler.base.config import load_pipeline
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning import autoplan

    seen = []
    real = autoplan.search_measured

    def spy(*args, **kwargs):
        seen.append(kwargs.get("incumbent"))
        return real(*args, **kwargs)

    monkeypatch.setattr(autoplan, "search_measured", spy)
    dev, state = load_profile("cpu-host"), tmp_path / "s"

    def cfg(name: str):
        return load_pipeline(
            {"name": name, "slo": "200ms", "autoscale": {},
             "stages": [{"name": "m", "model": str(chain_path)}]}
        )  # fmt: skip

    _, first = autoplan.plan_pipeline(cfg("p"), device=dev, state_dir=state, objectives=("eq1",))
    autoplan.plan_pipeline(cfg("p-other"), device=dev, state_dir=state, objectives=("eq1",))
    assert seen == [None, None]  # p's decision is not p-other's incumbent
    _, again = autoplan.plan_pipeline(
        cfg("p"), device=dev, state_dir=state, objectives=("eq1",), rate=5.0
    )
    assert seen[2] == first.best.identity()
    mine = [f for f in (state / "plans" / "decisions").iterdir() if len(f.name) == 2 + 16 + 5]
    assert len(mine) == 2  # p-<16 hex>.json, one per key
    for f in mine:
        assert json.loads(f.read_text())["identity"] in (
            first.best.identity(),
            again.best.identity(),
        )


def test_a_model_file_replaced_in_place_gets_its_own_chosen_plan_dir(tmp_path: Path) -> None:
    """The deploy-time plan directory of the chosen cuts is keyed by the model file's
    size too: a new export written under the same name with the same modification time
    (a copy that kept it, a coarse file system clock) is partitioned anew."""
    import os

    from infscaler.runtime.planning.autoplan import chosen_plan_dir

    model = save(conv_chain(channels=16), tmp_path / "m.onnx")
    first = chosen_plan_dir(tmp_path, model, {"x": [1, 16, 32, 32]}, (2,))
    assert first.parent == tmp_path / "plans" and first.name.startswith("auto-m-")
    assert chosen_plan_dir(tmp_path, model, {"x": [1, 16, 32, 32]}, [2]) == first
    assert chosen_plan_dir(tmp_path, model, {"x": [1, 16, 32, 32]}, (3,)) != first
    mtime = model.stat().st_mtime_ns
    save(conv_chain(channels=8), model)
    os.utime(model, ns=(mtime, mtime))
    assert model.stat().st_mtime_ns == mtime
    assert chosen_plan_dir(tmp_path, model, {"x": [1, 16, 32, 32]}, (2,)) != first
