"""bench/scaling.py's configurations and per-cell comparison, and bench/slo_bound.py's
ceiling.

Pure functions only: the ceiling against an independent queue simulation, the cell's
ratios on hand-made rates, and what each configuration deploys (``auto`` naming nothing
but ``slo`` and ``autoscale``). Nothing here starts a service or measures a host.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import bench_module


def _p99_one_server(rate_per_ms: float, d_ms: float, n: int, seed: int) -> float:
    """P99 response of an M/D/1 FIFO queue by Lindley's recursion (independent of
    slo_bound's c-server heap simulation), ms."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_ms, n)
    wait = 0.0
    resp = np.empty(n)
    for i, g in enumerate(gaps):
        wait = max(0.0, wait + d_ms - g) if i else 0.0
        resp[i] = wait + d_ms
    return float(np.percentile(resp[n // 10 :], 99))


def test_mdc_ceiling_meets_its_slo_and_not_much_more() -> None:
    sb = bench_module("slo_bound")
    d, slo = 10.0, 30.0
    rate = sb.mdc_max_rate(1, d, slo, n=20_000)
    assert 0 < rate < 1000.0 / d
    # at the ceiling the P99 is at the SLO; 10 % above it, clearly over (other seeds)
    p99 = np.median([_p99_one_server(rate / 1e3, d, 20_000, s) for s in (1, 2, 3)])
    assert p99 == pytest.approx(slo, rel=0.15)
    over = np.median([_p99_one_server(1.1 * rate / 1e3, d, 20_000, s) for s in (1, 2, 3)])
    assert over > p99


def test_mdc_ceiling_scales_and_refuses_bad_input() -> None:
    sb = bench_module("slo_bound")
    assert sb.mdc_max_rate(1, 10.0, 9.0, n=20_000) == 0.0  # SLO below the service time
    one = sb.mdc_max_rate(1, 10.0, 30.0, n=20_000)
    # same SLO factor, twice the service time: half the rate
    assert sb.mdc_max_rate(1, 20.0, 60.0, n=20_000) == pytest.approx(one / 2, rel=1e-6)
    two = sb.mdc_max_rate(2, 10.0, 30.0, n=20_000)
    assert one < two <= 2 * 1000.0 / 10.0
    assert two / 2 > one  # pooling: two servers run each busier at the same P99
    with pytest.raises(ValueError, match="servers >= 1"):
        sb.mdc_max_rate(0, 10.0, 30.0)
    with pytest.raises(ValueError, match="at least one stage"):
        sb.chain_ceiling_rps([], 30.0)


def test_chain_ceiling_is_the_tightest_stage() -> None:
    sb = bench_module("slo_bound")
    out = sb.chain_ceiling_rps([(1, 5.0), (2, 20.0)], 60.0, n=20_000)
    per = out["per_stage"]
    assert [p["budget_ms"] for p in per] == [40.0, 55.0]  # SLO - the other stage's D
    assert out["ceiling_rps"] == min(p["max_rps"] for p in per)
    assert out["bottleneck_stage"] == int(np.argmin([p["max_rps"] for p in per])) == 1
    # service times alone over the SLO: nothing can meet it
    assert sb.chain_ceiling_rps([(1, 40.0), (1, 30.0)], 60.0, n=20_000)["ceiling_rps"] == 0.0


def test_auto_names_nothing_but_slo_and_autoscale() -> None:
    sc = bench_module("scaling")
    cfg = sc.auto_pipeline("resnet50", "a", 120.0)
    (stage,) = cfg.stages
    assert stage.model == "resnet50"
    assert not {"partitions", "threads", "instances", "max_instances", "engine"} & (
        stage.model_fields_set
    )
    assert cfg.slo_ms == pytest.approx(120.0) and cfg.autoscale is not None
    dddd = sc.auto_pipeline("ddddocr", "d", 300.0)
    for st in dddd.stages:
        if st.kind == "model":
            assert st.partitions is None and "instances" not in st.model_fields_set
    fixed = sc.pipeline("resnet50", "e", 2, slo_ms=120.0, autoscale=sc.AUTOSCALE)
    assert fixed.stages[0].partitions == 2


def test_each_configuration_deploys_its_shape() -> None:
    sc = bench_module("scaling")
    rep = sc.config_pipeline("replication", "resnet50", 120.0, 2)
    (st,) = rep["stages"]
    assert st["threads"] == 1 and st["max_instances"] == 2 and "autoscale" in rep
    one = sc.config_pipeline("one-session", "resnet50", 120.0, 2)
    assert one["stages"][0]["threads"] == 2 and "autoscale" not in one and "slo" not in one
    auto = sc.config_pipeline("auto", "resnet50", 120.0, 2)
    assert "threads" not in auto["stages"][0] and auto["name"] == sc.NAME
    with pytest.raises(ValueError, match="unknown configuration"):
        sc.config_pipeline("eq2", "resnet50", 120.0, 2)


def test_cell_summary_ratios_and_missing_divisors() -> None:
    sc = bench_module("scaling")
    cell = sc.cell_summary({"auto": 9.0, "replication": 6.0, "one-session": 7.5}, 12.0)
    assert cell["best_baseline"] == "one-session" and cell["best_baseline_rps"] == 7.5
    assert cell["auto_vs_best"] == 1.2 and cell["auto_vs_ceiling"] == 0.75
    assert cell["auto_rps"] == 9.0 and cell["replication_rps"] == 6.0
    none = sc.cell_summary({"auto": 3.0, "replication": 0.0}, 0.0)
    assert none["auto_vs_best"] is None and none["auto_vs_ceiling"] is None
    alone = sc.cell_summary({"auto": 3.0}, 5.0)
    assert alone["best_baseline"] is None and alone["auto_vs_best"] is None


def test_units_keeps_the_served_pipeline_scalars() -> None:
    sc = bench_module("scaling")
    status = {"pipelines": [
        {"name": sc.NAME, "units": [{"unit": "model", "count": 3, "decisions": [1]}]},
        {"name": "other", "units": [{"unit": "x"}]},
    ]}  # fmt: skip
    assert sc.units(status) == [{"unit": "model", "count": 3}]
