"""bench/arbitration.py's SLO capacity search on a hand-made service (no service run, no
host measured): a replay whose requests meet the SLO below a known rate, and the
bisection that must close in on it."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.helpers import bench_module

SLO = 300.0


def test_slo_capacity_closes_in_on_the_rate_where_the_slo_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ab = bench_module("arbitration")
    seen: list[tuple[str, float]] = []

    def replay(sock: str, model: str, feeds: object, times: np.ndarray) -> list[dict]:
        # a service that meets the SLO for every request below 4 requests/s, for none
        # above: the high pipeline's rate is its arrivals over the probe
        rate = times.size / 20.0
        seen.append((model, rate))
        ms = 100.0 if rate < 4.0 else 2 * SLO
        return [{"t_s": float(t), "outcome": "ok", "ms": ms} for t in times]

    monkeypatch.setattr(ab, "replay", replay)
    a = argparse.Namespace(slo_probes=8, probe_s=20.0, low_load=0.4, slo_target=0.95, seed=1)
    feeds = {ab.HIGH: {}, ab.LOW: {}}
    got = ab.slo_capacity("sock", a, feeds, 10.0, SLO, 10.0)
    # bisection on [1, 10]: the answer is the largest rate that met the target, and
    # within the Poisson noise of 20-s probes (about +-0.45 requests/s at 4/s) of 4
    passed = [p["rate_rps"] for p in got["probes"] if p["attainment"] >= 0.95]
    assert got["throughput_rps"] == pytest.approx(max(passed), abs=1e-3)
    assert 3.0 <= got["throughput_rps"] <= 4.6
    assert len(got["probes"]) == 8
    assert all(p["attainment"] in (0.0, 1.0) for p in got["probes"])
    # the low pipeline's constant load ran beside every probe, at 0.4 x C_low
    lows = [r for m, r in seen if m == ab.LOW]
    assert len(lows) == 8 and all(r == pytest.approx(4.4, rel=0.3) for r in lows)


def test_slo_capacity_without_a_passing_probe_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rate met the target: the bisection's floor (never probed) is not reported as
    the capacity."""
    ab = bench_module("arbitration")

    def replay(sock: str, model: str, feeds: object, times: np.ndarray) -> list[dict]:
        return [{"t_s": float(t), "outcome": "ok", "ms": 2 * SLO} for t in times]

    monkeypatch.setattr(ab, "replay", replay)
    a = argparse.Namespace(slo_probes=3, probe_s=20.0, low_load=0.4, slo_target=0.95, seed=1)
    feeds = {ab.HIGH: {}, ab.LOW: {}}
    with pytest.raises(SystemExit, match="no SLO capacity: .* at every probe down to"):
        ab.slo_capacity("sock", a, feeds, 10.0, SLO, 10.0)


def _run(
    att_after: float | None, high_rps: float, low_rps: float, at_step: dict | None = None
) -> dict:
    ab = bench_module("arbitration")
    return {
        "step": {
            "instances_at_step": at_step,
            "outcomes": {
                ab.HIGH: {"attainment_after": att_after, "goodput_rps": high_rps},
                ab.LOW: {"goodput_rps": low_rps},
            },
        }
    }


def test_spread_gives_medians_and_the_range_over_rounds() -> None:
    ab = bench_module("arbitration")
    s = ab.spread(
        [
            _run(0.9, 2.0, 1.0, {ab.HIGH: 1, ab.LOW: 2}),
            _run(0.99, 3.0, 1.0, {ab.HIGH: 1, ab.LOW: 1}),
            _run(None, 1.0, 0.5, {ab.HIGH: 2, ab.LOW: 2}),
        ],
        slots=3,
    )
    assert s["rounds"] == 3
    assert s["cap_bound_rounds"] == 1  # 1 + 2 = 3 slots at the step in round 1 only
    assert s["over_cap_rounds"] == 1  # 2 + 2: the cap did not hold them
    assert s["high_attainment_after"]["median"] == pytest.approx(0.945)  # None left out
    assert (s["high_attainment_after"]["min"], s["high_attainment_after"]["max"]) == (0.9, 0.99)
    assert s["total_goodput_rps"]["values"] == [3.0, 4.0, 1.5]
    assert s["total_goodput_rps"]["median"] == 3.0


def test_versus_says_whether_auto_is_at_least_the_best_static_split() -> None:
    ab = bench_module("arbitration")
    summary = {
        "arbitration": ab.spread([_run(0.96, 3.0, 1.0)] * 3),
        "lend-only": ab.spread([_run(0.9, 3.0, 1.0)] * 3),
        "per-pipeline": ab.spread([_run(0.5, 3.0, 1.5)] * 3),
        "static 2+1": ab.spread([_run(0.96, 2.5, 1.0)] * 3),
    }
    v = ab.versus(summary, "static 2+1")
    assert v["best_static"] == "static 2+1"
    arb = v["arbitration"]
    assert arb["high_attainment_after"]["ratio"] == 1.0
    assert arb["total_goodput_rps"]["ratio"] == round(4.0 / 3.5, 3)
    assert arb["at_least_static"] is True
    assert v["per-pipeline"]["at_least_static"] is False


def test_versus_pairs_the_rounds_for_the_spread_of_the_ratio() -> None:
    """Round r of the auto arm over round r of the best static split: a median ratio of
    1 can hide a round at 0.5."""
    ab = bench_module("arbitration")
    summary = {
        "arbitration": ab.spread([_run(0.5, 1.0, 1.0), _run(1.0, 2.0, 1.0), _run(1.0, 2.0, 1.0)]),
        "lend-only": ab.spread([_run(1.0, 2.0, 1.0)] * 3),
        "per-pipeline": ab.spread([_run(1.0, 2.0, 1.0)] * 3),
        "static 2+1": ab.spread([_run(1.0, 2.0, 1.0)] * 3),
    }
    r = ab.versus(summary, "static 2+1")["arbitration"]
    assert r["high_attainment_after"]["ratio"] == 1.0
    assert r["high_attainment_after"]["rounds"]["min"] == 0.5
    assert r["total_goodput_rps"]["rounds"]["values"] == pytest.approx([2 / 3, 1.0, 1.0])


def test_slot_models_are_stand_in_stages_and_bad_ones_are_refused() -> None:
    """``--high slot:MS``: one function stage holding its instance MS ms (bench/
    slotbound.py), fixed or autoscaled within the slots; anything else after ``slot:``
    is an error that says what to write."""
    ab = bench_module("arbitration")
    sb = bench_module("slotbound")
    assert sb.parse("slot:100") == 100.0 and sb.parse("resnet50") is None
    with pytest.raises(ValueError, match="slot:MS with MS > 0"):
        sb.parse("slot:fast")
    auto = ab.auto_pipeline("slot:80", ab.HIGH, 250.0, 1, 3)
    (stage,) = auto["stages"]
    assert stage["params"] == {"ms": 80.0} and stage["max_instances"] == 2
    assert auto["priority"] == 1 and auto["slo"] == "250.0ms" and auto["autoscale"]
    fixed = ab.static_pipeline("slot:80", ab.LOW, None, 2, 2)
    assert fixed["stages"][0]["instances"] == 2 and "autoscale" not in fixed
    assert "slo" not in fixed


def test_a_model_with_a_hold_stage_is_one_fused_model_unit() -> None:
    """``MODEL+slot:MS``: the real model then a ``hold`` stage of MS ms that fuses into the
    model's unit (so each instance is a model instance, an engine slot, held MS ms per
    request), in the autoscaled and the static configurations; bad tails are refused."""
    from infscaler.base.config import load_pipeline

    ab = bench_module("arbitration")
    sb = bench_module("slotbound")
    assert sb.split("squeezenet+slot:80") == ("squeezenet", 80.0)
    assert sb.split("squeezenet") == ("squeezenet", None)
    for bad in ("squeezenet+fast", "+slot:80", "squeezenet+slot:0"):
        with pytest.raises(ValueError):
            sb.split(bad)
    auto = ab.auto_pipeline("squeezenet+slot:80", ab.HIGH, 250.0, 1, 3)
    fixed = ab.static_pipeline("squeezenet+slot:80", ab.LOW, 500.0, 2, 2)
    for raw, instances in ((auto, 1), (fixed, 2)):
        model, hold = raw["stages"]
        assert model["model"] == "squeezenet" and model["instances"] == instances
        assert hold["params"] == {"ms": 80.0} and hold["inputs"] == list(model["outputs"].values())
        assert raw["outputs"] == ["held"]
        cfg = load_pipeline(raw)
        assert [s.fuses(cfg.fuse is True) for s in cfg.stages] == [True, True]
    assert auto["stages"][0]["max_instances"] == 2 and auto["autoscale"] and auto["priority"] == 1
    assert "autoscale" not in fixed and fixed["priority"] == 2
    # a plain model is left as it was: one stage, no hold
    assert len(ab.static_pipeline("squeezenet", ab.LOW, None, 2, 1)["stages"]) == 1
    cal = sb.held_l0({"l0_ms": 3.0, "runs": 10}, 80.0)
    assert cal["l0_ms"] == 83.0 and cal["hold_ms"] == 80.0 and cal["runs"] == 10
    assert sb.held_l0({"l0_ms": 3.0}, None) == {"l0_ms": 3.0}


def test_round_moves_keeps_what_an_arm_did_without_its_requests() -> None:
    ab = bench_module("arbitration")
    step = {
        "moves": [{"t_s": 14.5, "action": "arbitrate_take"}],
        "decisions": [{"t_s": 7.0, "action": "scale_out"}],
        "instances_at_step": {ab.HIGH: 2, ab.LOW: 1},
        "instances": [
            (1.0, {ab.HIGH: 1, ab.LOW: 1}),
            (2.0, {ab.HIGH: 1, ab.LOW: 1}),
            (8.0, {ab.HIGH: 1, ab.LOW: 2}),
            (15.0, {ab.HIGH: 2, ab.LOW: 1}),
            (16.0, {ab.HIGH: 2, ab.LOW: 1}),
        ],
        "requests": {ab.HIGH: [{"t_s": 0.0}]},
    }
    got = ab.round_moves(step)
    assert "requests" not in got and got["moves"] == step["moves"]
    assert got["decisions"] == step["decisions"]
    assert [t for t, _ in got["instance_changes"]] == [1.0, 8.0, 15.0]


def test_versus_leaves_out_an_auto_arm_not_run() -> None:
    """``--arms arbitration,lend-only,static``: no per-pipeline arm, no entry for it."""
    ab = bench_module("arbitration")
    summary = {
        "arbitration": ab.spread([_run(1.0, 2.0, 1.0)] * 3),
        "lend-only": ab.spread([_run(0.5, 2.0, 1.0)] * 3),
        "static 2+1": ab.spread([_run(1.0, 2.0, 1.0)] * 3),
    }
    v = ab.versus(summary, "static 2+1")
    assert set(v) == {"best_static", "arbitration", "lend-only"}
    assert v["arbitration"]["at_least_static"] and not v["lend-only"]["at_least_static"]


def test_plot_rounds_writes_the_medians_and_spread_png(tmp_path) -> None:
    ab = bench_module("arbitration")
    summary = {
        "arbitration": ab.spread([_run(0.9, 2.0, 1.0), _run(1.0, 2.5, 1.0)]),
        "static 2+1": ab.spread([_run(1.0, 2.0, 1.0), _run(None, 2.0, 1.0)]),
    }
    data = {
        "step_summary": summary,
        "auto_vs_best_static": ab.versus(summary, "static 2+1"),
        "settings": {"high": "a+slot:100", "low": "b+slot:100", "slots": 3, "rounds": 2},
    }
    out = tmp_path / "rounds.png"
    ab.plot_rounds(data, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
