"""Overload at a multiple of capacity, the load generator on the same cores: does
admission keep the SLO it admits to, and does it keep the goodput?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``overload_slo.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import OFFLINE, SERVER  # noqa: E402

CONFIGS = ("replicas", "one-session", "auto")
NAME = "m"


def config_pipeline(model: str, config: str, slo_ms: float, cores: int) -> dict[str, Any]:
    """The served configuration (the method) with the SLO."""
    if config == "auto":
        import scaling

        cfg = scaling.auto_pipeline(model, NAME, slo_ms)
        raw = cfg.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        return {**raw, "autoscale": {}}  # the scaler's own defaults, as a user writes it
    threads, inst = (1, cores) if config == "replicas" else (cores, 1)
    return harness.models.static_pipeline(model, NAME, threads, inst, slo_ms)


def checks(point: dict[str, Any], slo_ms: float, sustained: float, a: Any) -> dict[str, bool]:
    """The overload checks of one point (the method)."""
    p99 = point["p99_ms"]
    return {
        "no_error_but_refusals": not point["errors_by_code"],
        "admitted_p99_within": p99 is not None and p99 <= a.p99_x * slo_ms,
        "goodput_within": sustained > 0 and (point["goodput_rps"] or 0) >= a.goodput_x * sustained,
    }


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=20.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--config", default="replicas", choices=CONFIGS)
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--factors", default="2,5")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--bisect-steps", type=int, default=5)
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--p99-x", type=float, default=1.25)
    ap.add_argument("--goodput-x", type=float, default=0.8)
    a = harness.cli.parse(ap, argv, lambda a: setattr(a, "bisect_steps", 3))
    name = "overload_slo" + ("" if a.config == "replicas" else f"_{a.config}")
    res = harness.cli.start(name + ("" if a.slo_x == 3.0 else f"_slo{a.slo_x:g}x"), a)
    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 20)
    slo_ms = round(a.slo_x * cal["l0_ms"], 2)
    pipe = config_pipeline(a.model, a.config, slo_ms, cal["cores"])
    res.summary.update(calibration=cal, slo_ms=slo_ms, pipeline=pipe)
    print(f"== {a.model} {a.config}: L0 {cal['l0_ms']} ms, SLO {slo_ms} ms", flush=True)
    with harness.Sut([pipe], args=["--drain-timeout", "5"]) as s:
        res.own_pids[:] = [s.pid]

        def run(scenario: str, value: float, phase: str, **kw: Any) -> dict[str, Any]:
            p = harness.scenarios.run(s.sock, NAME, feeds, scenario, value, bound_ms=slo_ms,
                                      duration_s=a.duration_s, warmup_s=a.warmup_s, seed=a.seed)  # fmt: skip
            return res.add(phase=phase, **kw, **p) if phase != "bisection" else p

        c = run(OFFLINE, a.clients, "capacity")["throughput_rps"]
        print(f"  capacity {c}/s (closed loop, {a.clients} clients)", flush=True)
        found = harness.search.max_rate_at_slo(
            lambda r: run(SERVER, r, "bisection"), 1.1 * c, a.bisect_steps, low_rps=0.2 * c
        )
        for p in found["points"]:
            res.add(phase="bisection", **p)
        passed = [p for p in found["points"] if p["passed"]]
        sustained = max((p["goodput_rps"] or 0.0 for p in passed), default=0.0)
        res.summary.update(
            capacity_rps=c, sustained_rps=found["max_rps"], sustained_goodput_rps=sustained
        )
        print(f"  sustained within the SLO: {found['max_rps']}/s", flush=True)
        for f in (float(x) for x in a.factors.split(",")):
            p = run(SERVER, f * c, "overload", factor=f)
            p["checks"] = checks(p, slo_ms, sustained, a)
            p["passed_all"] = all(p["checks"].values())
            p["admitted_p99_over_slo"] = round(p["p99_ms"] / slo_ms, 3) if p["p99_ms"] else None
            p["goodput_over_sustained"] = (
                round((p["goodput_rps"] or 0) / sustained, 3) if sustained else None
            )
    harness.cli.finish(res, a, plot)
    cols = ["factor", "value", "ok", "failed", "p99_ms", "admitted_p99_over_slo", "goodput_rps",
            "goodput_over_sustained", "passed_all"]  # fmt: skip
    harness.print_table(
        cols, [[p.get(k) for k in cols] for p in res.points if p["phase"] == "overload"]
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Admitted P99 and goodput against the offered rate, bisection and overload points."""
    harness.plot(data["points"], path, x="value", y=["p99_ms", "goodput_rps"], by="phase",
                 hline_key="bound_ms", xlabel="offered, /s (capacity: clients)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
