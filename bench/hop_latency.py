"""What one hop costs in the served runtime: the planner's model of a hop (``HANDOVER_MS``).

One request at a time through a model served at K = 1-3 partitions (in-process
``Service``, whose ``infer`` returns each unit's compute start / end), split into
``head`` (the front end to the first compute), ``between`` (one compute's end to the
next one's start, per cut) and ``tail`` (the last compute to the answer), ms. The
between-unit P50 is fitted as a fixed cost plus a cost per MB crossing the cut and set
against the in-process T_p (``profiler.measure_boundary_overhead``). More: bench/HISTORY.md,
"The planner's model, three measured corrections".
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import model_inputs, pipeline  # noqa: E402


def crossing_mb(plan_dir: str | Path) -> list[float]:
    """Crossing MB (1e6 bytes) of each cut of a plan directory, in order (``plan.yaml``)."""
    import yaml

    plan = yaml.safe_load((Path(plan_dir) / "plan.yaml").read_text())
    return [float(c["crossing_bytes"]) / 1e6 for c in plan.get("cuts") or []]


def _pct(x: list[float]) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(x, q)), 3) for q in (50, 90, 99)}


def measure(svc: Any, model: str, k: int, feeds: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """One model at K partitions: per request head / between / tail percentiles, ms, and
    each cut's crossing MB."""
    name = f"hop-{k}"
    dep = svc.deploy(pipeline(model, name, k, threads=1, whole=k == 1))
    try:
        plans = list(dep.pipeline.plans.values())
        mb = crossing_mb(plans[0]) if plans and k > 1 else []
        for _ in range(5):
            svc.infer(name, feeds)
        head, tail, between = [], [], [[] for _ in range(k - 1)]
        for _ in range(n):
            t0 = time.monotonic_ns()
            r = svc.infer(name, feeds)
            t1 = time.monotonic_ns()
            tr = r.trace[np.argsort(r.trace[:, 2])]
            head.append((tr[0, 2] - t0) / 1e6)
            tail.append((t1 - tr[-1, 3]) / 1e6)
            for i, (a, b) in enumerate(zip(tr[:-1], tr[1:], strict=True)):
                between[i].append((b[2] - a[3]) / 1e6)
            time.sleep(0.02)
    finally:
        svc.undeploy(name)
    cuts = [_pct(b) | {"crossing_mb": round(m, 3)} for b, m in zip(between, mb, strict=True)]
    return {"model": model, "k": k, "requests": n, "head_ms": _pct(head),
            "tail_ms": _pct(tail), "between_ms": cuts}  # fmt: skip


def fit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least squares of the between-unit P50 on the crossing MB: ``fixed_ms``, ``per_mb_ms``
    (None with fewer than 2 distinct sizes)."""
    pts = [(b["crossing_mb"], b["p50"]) for r in rows for b in r["between_ms"]]
    if len({round(x, 3) for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts).T
    per_mb, fixed = np.polyfit(x, y, 1)
    return {"fixed_ms": round(float(fixed), 3), "per_mb_ms": round(float(per_mb), 4),
            "points": len(pts)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--models", default="resnet50,ppocrv4-det")
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--requests", type=int, default=100)

    def quick(a: Any) -> None:
        a.models, a.ks, a.requests = "resnet50", "1,2", 20

    a = harness.cli.parse(ap, argv, quick)
    res = harness.cli.start("hop_latency", a)
    from infscaler.partitioner import profiler
    from infscaler.runtime.planning import planner
    from infscaler.service.service import Service

    with Service(state_dir=Path("/tmp/isc-hop-state"), pool_mb=256) as svc:
        for model in a.models.split(","):
            feeds = model_inputs(model)
            for k in map(int, a.ks.split(",")):
                r = res.add(**measure(svc, model, k, feeds, a.requests))
                print(f"{model} K={k}: head {r['head_ms']['p50']} ms, tail {r['tail_ms']['p50']}"
                      f" ms, between {[(b['crossing_mb'], b['p50']) for b in r['between_ms']]}",
                      flush=True)  # fmt: skip
    tp = profiler.measure_boundary_overhead(engine="cpu")
    res.summary = {
        "fit_between_p50": fit(res.points),
        "in_process_tp": {"fixed_ms": round(tp.fixed_ms, 4), "per_mb_ms": round(tp.per_mb_ms, 4)},
        "planner": {"HANDOVER_MS": planner.HANDOVER_MS, "FRONTEND_MS": planner.FRONTEND_MS},
    }
    harness.cli.finish(res, a, plot)
    rows = [[r["model"], r["k"], r["head_ms"]["p50"], r["tail_ms"]["p50"],
             ", ".join(f"{b['p50']} ({b['crossing_mb']})" for b in r["between_ms"]) or "-"]
            for r in res.points]  # fmt: skip
    harness.print_table(["model", "K", "head P50", "tail P50", "between P50 (crossing MB)"], rows)
    print(f"fit: {res.summary['fit_between_p50']}; in-process T_p: {res.summary['in_process_tp']}")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Between-unit P50 and P90 against the crossing MB per model, with the in-process T_p
    (and the fit) evaluated at the same sizes."""
    s, pts = data["summary"], []
    for r in data["points"]:
        for b in r["between_ms"]:
            x = b["crossing_mb"]
            pts.append({"model": r["model"], "crossing_mb": x, "p50": b["p50"], "p90": b["p90"]})
            pts.append({"model": "T_p in-process", "crossing_mb": x,
                        "p50": s["in_process_tp"]["fixed_ms"] + s["in_process_tp"]["per_mb_ms"] * x})  # fmt: skip
            if s["fit_between_p50"]:
                f = s["fit_between_p50"]
                pts.append({"model": "fit", "crossing_mb": x,
                            "p50": f["fixed_ms"] + f["per_mb_ms"] * x})  # fmt: skip
    if pts:
        harness.plot(pts, path, x="crossing_mb", y=["p50", "p90"], by="model",
                     xlabel="crossing tensor, MB", ylabel="compute end -> next start, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
