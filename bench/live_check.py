"""The live check at work: a planned pipeline started with a deliberately wrong
configuration (test hook ``INFSCALER_TEST_START_WITH=worst``) is corrected under steady
Poisson load, and every request is answered.

One fresh ``infscaler serve`` (``harness.Sut``) of the model with only ``slo`` (k x L0)
and ``autoscale``; Poisson arrivals at ``--load`` x ideal replayed through
``infscaler.api.loadgen``; ``status`` polled every 0.25 s (``Sut.watch``) for the
configuration serving and the decisions. Read: when ``live_switch`` was decided and when the runner-up served,
every request's outcome, and goodput / P99 before the switch and from 10 s after the
runner-up serves. More: bench/HISTORY.md, "The live check at work".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import replay_summary  # noqa: E402

NAME = "live"


class NoRun(RuntimeError):
    """The run could not be made on this host (recorded in the result, exit 1)."""


def run(a: Any, res: harness.Result) -> dict[str, Any]:
    """The run (module docstring): the summary; each request is a point."""
    from infscaler.api.loadgen import LoadGenerator
    from infscaler.runtime.planning.autoplan import START_WITH_ENV

    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 10 if a.quick else 30)
    slo_ms, rate = a.slo_x * cal["l0_ms"], a.load * cal["ideal_rps"]
    print(f"{a.model}: L0 {cal['l0_ms']} ms, SLO {slo_ms:.1f} ms, rate {rate:.2f}/s", flush=True)
    pipe = harness.models.auto_pipeline(a.model, NAME, slo_ms)
    pipe = pipe.model_dump(mode="json", exclude_none=True, exclude_unset=True)
    with harness.Sut([pipe], env={START_WITH_ENV: "worst"}) as s:
        res.own_pids[:] = [s.pid]
        s.watch(0.25)
        start = next(p for p in s.status()["pipelines"] if p["name"] == NAME)["live_check"]
        if not start or not start.get("other"):
            raise NoRun(f"no live plan with a runner-up (live_check {start}): see the log")
        wall0 = time.time()
        times = harness.scenarios.poisson_times(rate, a.duration_s, a.seed)
        rows = LoadGenerator(s.sock, NAME, feeds).replay(times)
        time.sleep(1.2)
        decisions, _ = s.since(wall0)
        final = next(p for p in s.status()["pipelines"] if p["name"] == NAME)["live_check"]
    for r in rows:
        res.add(**r)
    switch = next((d["t_s"] for d in decisions if d.get("action") == "live_switch"), None)
    serving = next((round(t - wall0, 2) for t, lc in s.live
                    if (lc.get(NAME) or {}).get("serving") == start["other"]), None)  # fmt: skip
    t_sw = switch if switch is not None else a.duration_s
    after = [r for r in rows if serving is not None and r["t_s"] >= serving + 10.0]
    return {
        "calibration": cal, "slo_ms": round(slo_ms, 2), "rate_rps": round(rate, 3),
        "ready_s": s.ready_s, "started_with": start["serving"], "runner_up": start["other"],
        "switch_decided_s": switch, "runner_up_serving_s": serving, "live_check": final,
        "live_decisions": [d for d in decisions if str(d.get("action")).startswith("live_")],
        "all": replay_summary(rows, slo_ms, a.duration_s),
        "before_switch": replay_summary([r for r in rows if r["t_s"] < t_sw], slo_ms, t_sw),
        "after_runner_up_serves": None if serving is None else
        replay_summary(after, slo_ms, max(a.duration_s - serving - 10.0, 1e-9)),
        "every_request_answered": all(r.get("outcome") in ("ok", "refused") for r in rows),
        "corrected_within_60s": serving is not None and serving <= 60.0,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=120.0)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--load", type=float, default=0.35, help="x ideal")

    def quick(a: Any) -> None:
        a.duration_s = 40.0  # the live check needs its watch window

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("live_check", a)
    try:
        res.summary = run(a, res)
    except NoRun as exc:
        res.summary = {"error": str(exc)}
        harness.cli.finish(res, a, None)
        print(exc)
        return 1
    harness.cli.finish(res, a, plot)
    for k in ("started_with", "runner_up", "switch_decided_s", "runner_up_serving_s",
              "every_request_answered", "all", "before_switch", "after_runner_up_serves"):  # fmt: skip
        print(f"  {k}: {res.summary[k]}")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Each answered request's latency against its send time, the SLO as a line."""
    pts = [{**p, "series": "answered"} for p in data["points"] if p["outcome"] == "ok"]
    s = data["summary"]
    harness.plot(pts, path, x="t_s", y="ms", by="series", hlines={"SLO": s["slo_ms"]},
                 title=f"started {s['started_with']}; switch decided at {s['switch_decided_s']} s",
                 xlabel="send time, s", ylabel="latency, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
