"""What one hop costs in the served runtime (issue 15: the planner's model of a hop).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/hop_latency.py`".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scaling_v1 as sc  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    print_table,
    wait_for_quiet,
    write_json,
)


def crossing_mb(plan_dir: str | Path) -> list[float]:
    """Crossing MB (1e6 bytes) of each cut of a plan directory, in order (``plan.yaml``)."""
    import yaml

    plan = yaml.safe_load((Path(plan_dir) / "plan.yaml").read_text())
    return [float(c["crossing_bytes"]) / 1e6 for c in plan.get("cuts") or []]


def measure(svc: Any, model: str, k: int, feeds: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """One model at K partitions (module docstring): per request head / between / tail,
    ms, and the cuts' crossing MB."""
    name = f"hop-{k}"
    dep = svc.deploy(sc.pipeline(model, name, k, threads=1, whole=k == 1))
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

    def pct(x: list[float]) -> dict[str, float]:
        return {f"p{q}": round(float(np.percentile(x, q)), 3) for q in (50, 90, 99)}

    return {
        "model": model,
        "k": k,
        "requests": n,
        "head_ms": pct(head),
        "tail_ms": pct(tail),
        "between_ms": [
            pct(b) | {"crossing_mb": round(m, 3)} for b, m in zip(between, mb, strict=True)
        ],
    }


def fit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least squares of the between-unit P50 on the crossing MB: ``fixed_ms``, ``per_mb_ms``
    (None with fewer than 2 distinct sizes)."""
    pts = [(b["crossing_mb"], b["p50"]) for r in rows for b in r["between_ms"]]
    if len({round(x, 3) for x, _ in pts}) < 2:
        return None
    x, y = np.array(pts).T
    per_mb, fixed = np.polyfit(x, y, 1)
    return {
        "fixed_ms": round(float(fixed), 3),
        "per_mb_ms": round(float(per_mb), 4),
        "points": len(pts),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,ppocrv4-det")
    ap.add_argument("--ks", default="1,2,3")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "hop_latency.json")
    args = ap.parse_args(argv)
    default_cache_dir()
    from infscaler.partitioner import profiler
    from infscaler.runtime.planning import planner
    from infscaler.service.service import Service

    env = environment()
    quiet = wait_for_quiet(120.0)
    steal0, fl = cpu_steal_seconds(), ForeignLoad(sc.own_cpu_seconds)
    rows = []
    with Service(state_dir=Path("/tmp/isc-hop-state"), pool_mb=256) as svc:
        for model in args.models.split(","):
            feeds = sc.model_inputs(model)
            for k in (int(x) for x in args.ks.split(",")):
                r = measure(svc, model, k, feeds, args.requests)
                rows.append(r)
                print(
                    f"{model} K={k}: head {r['head_ms']['p50']} ms, tail {r['tail_ms']['p50']} ms, "
                    f"between {[(b['crossing_mb'], b['p50']) for b in r['between_ms']]}",
                    flush=True,
                )
    tp = profiler.measure_boundary_overhead(engine="cpu")
    data = {
        "environment": {**env, "load_average_at_end": list(os.getloadavg())},
        "host_noise": host_noise(quiet, fl.cores(), steal0),
        "rows": rows,
        "fit_between_p50": fit(rows),
        "in_process_tp": {"fixed_ms": round(tp.fixed_ms, 4), "per_mb_ms": round(tp.per_mb_ms, 4)},
        "planner": {"HANDOVER_MS": planner.HANDOVER_MS, "FRONTEND_MS": planner.FRONTEND_MS},
    }
    write_json(args.out, data)
    plot(data, args.out.with_suffix(".png"))
    print_table(
        ["model", "K", "head P50", "tail P50", "between P50 (crossing MB)"],
        [
            [
                r["model"],
                r["k"],
                r["head_ms"]["p50"],
                r["tail_ms"]["p50"],
                ", ".join(f"{b['p50']} ({b['crossing_mb']})" for b in r["between_ms"]) or "-",
            ]  # fmt: skip
            for r in rows
        ],
    )
    print(f"fit: {data['fit_between_p50']}; in-process T_p: {data['in_process_tp']}")
    print(f"wrote {args.out} and .png")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Between-unit P50 (and P90) against the crossing MB, with the fit and T_p."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, model in enumerate(dict.fromkeys(r["model"] for r in data["rows"])):
        pts = [b for r in data["rows"] if r["model"] == model for b in r["between_ms"]]
        ax.scatter([b["crossing_mb"] for b in pts], [b["p50"] for b in pts], color=f"C{i}",
                   label=f"{model} P50")  # fmt: skip
        ax.scatter([b["crossing_mb"] for b in pts], [b["p90"] for b in pts], color=f"C{i}",
                   marker="x", label=f"{model} P90")  # fmt: skip
    xs = np.linspace(
        0, max([b["crossing_mb"] for r in data["rows"] for b in r["between_ms"]] or [1]), 20
    )
    f, tp = data["fit_between_p50"], data["in_process_tp"]
    if f:
        ax.plot(xs, f["fixed_ms"] + f["per_mb_ms"] * xs, "k-", lw=1, label="fit (served hop)")
    ax.plot(xs, tp["fixed_ms"] + tp["per_mb_ms"] * xs, "k--", lw=1, label="T_p (in-process)")
    ax.set_xlabel("crossing tensor, MB")
    ax.set_ylabel("compute end -> next compute start, ms")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
