"""How close is the scaler's P99 model to the P99 a served pipeline shows, with the
service time's median alone (M/D/c) and with its measured tail too (M/G/c)?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``p99_model.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import SERVER, SINGLE_STREAM  # noqa: E402

NAME = "m"


def unit_compute(status: dict[str, Any]) -> dict[str, float | None]:
    """The pipeline's (single) unit's compute P50 / P99 (ms) and count from ``status``."""
    (p,) = [p for p in status["pipelines"] if p["name"] == NAME]
    u = p["units"][0]
    return {k: u.get(k) for k in ("compute_p50_ms", "compute_p99_ms", "count")}


def predict(rate: float, c: int, comp: dict, overhead_ms: float) -> dict[str, float | None]:
    """The M/D/c and M/G/c predictions of the client P99 at ``rate``/s, ms."""
    from infscaler.runtime.queueing import p99_response_ms

    p50, p99 = comp["compute_p50_ms"], comp["compute_p99_ms"]
    if not p50:
        return {"md_c_ms": None, "mg_c_ms": None}
    md = p99_response_ms(rate, c, p50) + overhead_ms
    mg = p99_response_ms(rate, c, p50, p99) + overhead_ms
    return {"md_c_ms": round(md, 1), "mg_c_ms": round(mg, 1)}


def _err(model: float | None, measured: float | None) -> float | None:
    if model is None or not measured or not np.isfinite(model):
        return None
    return round((model - measured) / measured, 3)


def run_config(res: harness.Result, a: Any, c: int, feeds: dict, l0_session: float) -> None:
    """One static configuration of ``c`` instances: its points added to ``res``."""
    pipe = harness.models.static_pipeline(a.model, NAME, 1, c)
    with harness.Sut([pipe], args=["--drain-timeout", "5"]) as s:
        res.own_pids[:] = [s.pid]
        run = harness.scenarios.run
        idle = run(s.sock, NAME, feeds, SINGLE_STREAM, duration_s=a.l0_s, warmup_s=1.0)
        l0 = idle["p50_ms"]
        comp0 = unit_compute(s.status())
        overhead = max(0.0, l0 - (comp0["compute_p50_ms"] or l0))
        for i, load in enumerate(a.loads):
            rate = load * c * 1000.0 / l0_session
            p = run(s.sock, NAME, feeds, SERVER, rate, duration_s=a.duration_s,
                    warmup_s=a.warmup_s, seed=a.seed + i)  # fmt: skip
            comp = unit_compute(s.status())
            pred = predict(rate, c, comp, overhead)
            pt = res.add(instances=c, load=load, rate_rps=round(rate, 3), served_l0_ms=l0,
                         overhead_ms=round(overhead, 2), measured_p99_ms=p["p99_ms"], compute=comp,
                         **pred, md_c_err=_err(pred["md_c_ms"], p["p99_ms"]),
                         mg_c_err=_err(pred["mg_c_ms"], p["p99_ms"]), point=p)  # fmt: skip
            print(f"  c={c} load {load} ({rate:.2f}/s): measured P99 {pt['measured_p99_ms']} ms, "
                  f"M/D/c {pt['md_c_ms']} ({pt['md_c_err']}), M/G/c {pt['mg_c_ms']} ({pt['mg_c_err']})")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=45.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="ppocrv4-det")
    ap.add_argument("--loads", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.75])
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--l0-s", type=float, default=6.0, help="single-stream time for the served L0")

    def quick(a: Any) -> None:
        a.loads, a.warmup_s, a.l0_s = [0.3, 0.6], 2.0, 3.0

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("p99_model", a)
    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 10 if a.quick else 20)
    res.summary["calibration"] = cal
    print(f"== {a.model}: L0 (session) {cal['l0_ms']} ms", flush=True)
    for c in (1, 2):
        run_config(res, a, c, feeds, cal["l0_ms"])
    for k in ("md_c_err", "mg_c_err"):
        errs = [p[k] for p in res.points if p[k] is not None]
        res.summary[f"mean_abs_{k}"] = round(float(np.mean(np.abs(errs))), 3) if errs else None
        res.summary[f"optimistic_{k}"] = sum(e < -0.1 for e in errs)
    harness.cli.finish(res, a, plot)
    cols = ["instances", "load", "rate_rps", "measured_p99_ms", "md_c_ms", "md_c_err", "mg_c_ms", "mg_c_err"]  # fmt: skip
    harness.print_table(cols, [[p[k] for k in cols] for p in res.points])
    print(res.summary)
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Measured and predicted P99 against the rate, one panel per instance count."""
    harness.plot(data["points"], path, x="rate_rps", y=["measured_p99_ms", "md_c_ms", "mg_c_ms"],
                 panel="instances", xlabel="Poisson rate, /s", ylabel="P99, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
