"""bench/harness: the bisection, the server scenario's pass rule, the result schema, the
argparse base, the plot, Poisson send times, replay figures and the memory cap, on
hand-made figures. Nothing here starts a service or times anything."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
from harness import scenarios, search  # noqa: E402


def test_bisection_converges_on_the_largest_passing_rate() -> None:
    seen = []

    def measure(rate: float) -> dict:
        seen.append(rate)
        return {"passed": rate <= 7.3}

    out = search.max_rate_at_slo(measure, 20.0, 8)
    assert len(seen) == 8 and seen[0] == 10.0 and seen[1] == 5.0
    assert out["max_rps"] <= 7.3 < out["bracket"][1]
    assert (
        out["bracket"][1] - out["max_rps"] <= 20.0 / 2**8 + 1e-3
    )  # rates are rounded to 4 decimals
    assert [p["step"] for p in out["points"]] == list(range(1, 9))


def test_bisection_with_no_pass_reads_zero_and_checks_its_arguments() -> None:
    out = search.max_rate_at_slo(lambda r: {"passed": False}, 10.0, 3, first_rps=8.0)
    assert out["max_rps"] == 0.0 and [p["rate_rps"] for p in out["points"]] == [8.0, 4.0, 2.0]
    with pytest.raises(ValueError, match="at least 1 step"):
        search.max_rate_at_slo(lambda r: {"passed": True}, 10.0, 0)
    with pytest.raises(ValueError, match="low_rps < high_rps"):
        search.max_rate_at_slo(lambda r: {"passed": True}, 0.0, 2)
    with pytest.raises(ValueError, match="not inside"):
        search.max_rate_at_slo(lambda r: {"passed": True}, 10.0, 2, first_rps=12.0)
    with pytest.raises(ValueError, match="'passed'"):
        search.max_rate_at_slo(lambda r: {}, 10.0, 2)


def test_p99_counts_failures_as_later_than_any_answer() -> None:
    assert scenarios.p99_with_failures([10.0] * 99, 1) == 10.0
    assert math.isinf(scenarios.p99_with_failures([10.0] * 98, 2))
    assert scenarios.p99_with_failures(list(range(1, 201)), 0) == 198.0
    assert math.isinf(scenarios.p99_with_failures([], 0))
    assert scenarios.passes({"ok": 5, "p99_all_ms": 90.0}, 100.0)
    assert not scenarios.passes({"ok": 5, "p99_all_ms": None}, 100.0)
    assert not scenarios.passes({"ok": 0, "p99_all_ms": 1.0}, 100.0)


def test_scenarios_map_onto_loadgen_modes() -> None:
    assert scenarios.load_spec("single_stream").value == 1
    server = scenarios.load_spec("server", 4.5)
    assert (server.mode, server.value, server.distribution) == ("request_rate", 4.5, "poisson")
    assert scenarios.load_spec("offline", 8).mode == "concurrency"
    with pytest.raises(ValueError, match="positive value"):
        scenarios.load_spec("server", 0)
    with pytest.raises(ValueError, match="unknown scenario"):
        scenarios.load_spec("multistream", 2)


def test_result_schema_round_trips(tmp_path: Path) -> None:
    res = harness.Result("x_quick", {"quick": True}, quiet_before={"quiet": False})
    res.add(rate_rps=2.0, p99_ms=15.5)
    res.summary["best"] = 2.0
    path = res.save(tmp_path)
    data = harness.result.load(path)
    assert data["schema"] == harness.result.SCHEMA and data["points"] == [
        {"rate_rps": 2.0, "p99_ms": 15.5}
    ]
    env = data["environment"]
    assert env["usable_cores"] >= 1 and "numpy" in env["versions"]
    assert env["loaded_host"] is True  # the quiet-before check said not quiet
    bad = tmp_path / "old.json"
    bad.write_text(json.dumps({"environment": {}}))
    with pytest.raises(ValueError, match="not a infscaler-bench/1"):
        harness.result.load(bad)


def test_cli_base_quick_cuts_and_rejects_bad_duration() -> None:
    ap = harness.cli.parser("Title.\n\nMore.", duration_s=30.0)
    ap.add_argument("--steps", type=int, default=5)

    def quick(a):  # noqa: ANN001, ANN202
        a.steps = 2

    a = harness.cli.parse(ap, ["--quick"], quick)
    assert (a.duration_s, a.quiet_wait_s, a.steps) == (4.0, 0.0, 2)
    assert harness.cli.parse(ap, []).duration_s == 30.0
    with pytest.raises(SystemExit):
        harness.cli.parse(ap, ["--duration-s", "0"])


def test_plot_writes_a_png_and_refuses_nothing_to_draw(tmp_path: Path) -> None:
    pts = [{"rate": r, "p99": 10 * r, "config": c, "slo": 50} for r in (1, 2) for c in "ab"]
    out = harness.plot(pts, tmp_path / "p.png", x="rate", y="p99", by="config", hline_key="slo")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="nothing to plot"):
        harness.plot(pts, tmp_path / "q.png", x="rate", y="absent")


def test_sut_needs_a_target() -> None:
    with pytest.raises(ValueError, match="at least one target"):
        harness.Sut([])


def test_replay_records_every_request_in_send_order(tmp_path: Path) -> None:
    """loadgen's replay against a stand-in v2 server on a Unix socket: every scheduled
    request is recorded once, with its outcome and reason code."""
    import asyncio
    import threading

    import numpy as np
    from aiohttp import web

    from infscaler.api.loadgen import LoadGenerator

    sock = str(tmp_path / "s.sock")
    meta = {"name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}
    calls = {"n": 0}

    async def infer(_req: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            return web.json_response({"error": "busy", "code": "queue_full"}, status=503)
        return web.json_response({"model_name": "m", "outputs": []})

    async def metadata(_req: web.Request) -> web.Response:
        return web.json_response(meta)

    app = web.Application()
    app.router.add_get("/v2/models/m", metadata)
    app.router.add_post("/v2/models/m/infer", infer)
    started = threading.Event()
    loop = asyncio.new_event_loop()

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, sock).start()
        started.set()

    t = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()))
    t.daemon = True
    t.start()
    assert started.wait(10)
    try:
        gen = LoadGenerator(sock, "m", {"x": np.zeros(1, np.float32)})
        rows = gen.replay([0.0, 0.01, 0.02, 0.03], timeout_s=10)
    finally:
        loop.call_soon_threadsafe(loop.stop)
    assert [r["t_s"] for r in rows] == [0.0, 0.01, 0.02, 0.03]
    assert sorted(r["outcome"] for r in rows) == ["ok", "ok", "refused", "refused"]
    assert {r["code"] for r in rows if r["outcome"] == "refused"} == {"queue_full"}
    assert all(r["ms"] >= 0 and r["sent_s"] >= 0 for r in rows)


def test_poisson_times_share_one_pattern_across_rates() -> None:
    a = scenarios.poisson_times(2.0, 50.0, seed=3)
    b = scenarios.poisson_times(4.0, 50.0, seed=3)
    assert (a[1:] > a[:-1]).all() and a[-1] < 50.0 and b[-1] < 50.0
    n = min(len(a), len(b)) // 2  # b is a compressed in time: the same gaps / 2
    assert b[:n] == pytest.approx(a[:n] / 2.0)
    assert (scenarios.poisson_times(2.0, 50.0, seed=4)[:5] != a[:5]).any()
    with pytest.raises(ValueError, match="positive"):
        scenarios.poisson_times(0.0, 10.0)


def test_replay_summary_counts_outcomes_and_goodput_within_the_bound() -> None:
    rows = [{"outcome": "ok", "ms": float(ms)} for ms in (10, 20, 30, 200)]
    rows += [{"outcome": "refused", "ms": 1.0}, {"outcome": "error", "ms": 1.0}]
    s = scenarios.replay_summary(rows, 100.0, 2.0)
    assert (s["requests"], s["answered"], s["refused"], s["errors"]) == (6, 4, 1, 1)
    assert s["goodput_rps"] == 1.5  # 3 answers within 100 ms over 2 s
    assert s["p99_all_ms"] is None  # 2 of 6 failed: the P99 reaches them
    assert scenarios.replay_summary([], 100.0, 1.0)["p50_ms"] is None


def test_cap_rule_and_capped_device(tmp_path: Path) -> None:
    from infscaler.base.device import host_profile, load_profile

    r = harness.models.cap_rule(100.0, [40.0, 70.0], 1, 10.0)
    # max(whole 100, parts 40 + 70) + bottleneck 70 + pool 10 + margin
    assert r["cap_mb"] == 110.0 + 70.0 + 10.0 + harness.models.CAP_MARGIN_MB
    assert r["two_replicas_fit"] is True
    cap = min(512, host_profile().memory_mb)
    dev = load_profile(harness.models.capped_device(cap, tmp_path / "d.yaml"))
    assert dev.memory_cap_mb == cap and dev.name == "cpu-host-capped"
    with pytest.raises(ValueError, match="memory cap"):
        harness.models.capped_device(0, tmp_path / "x.yaml")
