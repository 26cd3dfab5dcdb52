"""How much slower a model runs after the host sat idle: in-process against served
(issue 15: why the planner leaves ``EngineProfile.idle`` out by default).

An idle core sleeps and wakes late (cpuidle, the frequency governor; in a VM the
hypervisor deschedules the idle vCPU). onnxruntime's intra-op workers do not spin in the
served session, so a multi-threaded run after an idle gap pays a wake-up per operator.
At tight SLOs on a lightly loaded host that is the P99: ResNet-50 at 1.5 x L0 on the
2-core development VM served a 2-thread session's compute at P50 31 ms and P99 57 ms at
4 requests/s (2026-11-27).

Writes ``results/idle_wake.json`` and ``.png`` (factor against the idle gap: the
in-process curve per thread count, the served one per rate).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/idle_wake.py`".
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scaling_v1 as sc  # noqa: E402
import same_config as sm  # noqa: E402
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

#: Idle-gap bins of the served requests, s (the first is the served base).
BINS_S = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 60.0)


def served_bins(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per :data:`BINS_S` bin of the idle gap before a request's compute: requests,
    median compute ms, and that over the first bin's median (the factor).

    >>> rows = [{"start_s": s, "end_s": s + 0.01, "compute_ms": c}
    ...         for s, c in [(0.0, 10), (0.02, 10), (0.5, 20)]]
    >>> [(b["requests"], b["factor"]) for b in served_bins(rows)]
    [(1, 1.0), (0, None), (0, None), (0, None), (1, 2.0), (0, None)]
    """
    done = sorted((r for r in rows if "start_s" in r), key=lambda r: r["start_s"])
    gaps = np.array([b["start_s"] - a["end_s"] for a, b in zip(done, done[1:], strict=False)])
    comp = np.array([b["compute_ms"] for b in done[1:]])
    out, base = [], None
    for lo, hi in zip(BINS_S, BINS_S[1:], strict=False):
        m = (gaps >= lo) & (gaps < hi)
        med = float(np.median(comp[m])) if m.any() else None
        if base is None:
            base = med
        out.append(
            {
                "gap_s": [lo, hi],
                "requests": int(m.sum()),
                "compute_p50_ms": None if med is None else round(med, 2),
                "compute_p90_ms": round(float(np.percentile(comp[m], 90)), 2) if m.any() else None,
                "factor": None if med is None or not base else round(med / base, 3),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", choices=sorted(sc.MODEL_SETTINGS))
    ap.add_argument("--threads", default="1,2", help="in-process thread counts (default 1,2)")
    ap.add_argument("--gaps", default="0.05,0.1,0.25,0.5", help="in-process idle gaps, s")
    ap.add_argument("--repeats", type=int, default=10, help="in-process runs per gap")
    ap.add_argument("--rates", default="4,10", help="served Poisson rates, requests/s")
    ap.add_argument("--requests", type=int, default=400, help="measured per served rate")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.model in sc.PIPELINE_CASES:
        ap.error("choose a model, not a pipeline case")
    default_cache_dir()
    from infscaler.partitioner import profiler
    from infscaler.service.service import Service

    threads = sorted({int(t) for t in args.threads.split(",")})
    gaps = tuple(float(g) for g in args.gaps.split(","))
    rates = [float(r) for r in args.rates.split(",")]
    env = environment()
    quiet = wait_for_quiet(120.0)
    steal0, fl = cpu_steal_seconds(), ForeignLoad(sc.own_cpu_seconds)
    feeds = sc.model_inputs(args.model)
    from infscaler.base.models import resolve_model

    path = resolve_model(args.model)
    inproc = {}
    for t in threads:
        pts = profiler.measure_idle(path, feeds, threads=t, gaps_s=gaps, repeats=args.repeats)
        inproc[t] = [{"gap_s": g, "factor": round(f, 3)} for g, f in pts]
        print(f"in-process {t} thread(s): " + ", ".join(f"{g:g} s {f:.2f}x" for g, f in pts))
    served = {}
    t_served = max(threads)
    with Service(state_dir=Path("/tmp/isc-idle-wake-state"), pool_mb=256) as svc:
        for rate in rates:
            name = f"idle-{int(rate * 10)}"
            svc.deploy(sm.hand_pipeline(args.model, name, t_served, 1, None))
            time.sleep(2.0)
            rows = sm.window(svc, name, feeds, rate, args.requests, 5.0)
            svc.undeploy(name)
            served[rate] = served_bins(rows)
            print(f"served {t_served} thread(s) at {rate:g}/s:")
            print_table(
                ["idle gap s", "requests", "compute P50 ms", "P90 ms", "factor"],
                [
                    [
                        f"{b['gap_s'][0]:g}-{b['gap_s'][1]:g}",
                        b["requests"],
                        b["compute_p50_ms"],
                        b["compute_p90_ms"],
                        b["factor"],
                    ]  # fmt: skip
                    for b in served[rate]
                ],
            )
    out = args.out or RESULTS_DIR / "idle_wake.json"
    data = {
        "environment": env,
        "host_noise": host_noise(quiet, fl.cores(), steal0),
        "model": args.model,
        "in_process": {str(t): v for t, v in inproc.items()},
        "in_process_repeats": args.repeats,
        "served_threads": t_served,
        "served_requests_per_rate": args.requests,
        "served": {f"{r:g}": v for r, v in served.items()},
        "how": "in-process: profiler.measure_idle (median after sleeping the gap / median "
        "back to back); served: per request the idle gap before its compute (the previous "
        "request's compute end to its compute start, the instance's trace), median compute "
        "per gap bin over the first bin's",
    }
    write_json(out, data)
    plot(data, out.with_suffix(".png"))
    print(f"wrote {out} and .png")
    return 0


def plot(data: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t, pts in data["in_process"].items():
        ax.plot([0, *(p["gap_s"] for p in pts)], [1, *(p["factor"] for p in pts)], "o-",
                label=f"in-process, {t} thread(s)")  # fmt: skip
    for r, bins in data["served"].items():
        xs = [np.mean(b["gap_s"]) if b["gap_s"][1] < 10 else 1.0 for b in bins if b["factor"]]
        ys = [b["factor"] for b in bins if b["factor"]]
        ax.plot(xs, ys, "s--", label=f"served, {data['served_threads']} threads, {r}/s")
    ax.axhline(1.0, color="grey", lw=0.6)
    ax.set_xlabel("idle gap before the run, s (served: bin centre; > 0.8 s at 1.0)")
    ax.set_ylabel("median time / back-to-back median")
    ax.set_title(f"{data['model']}: slowdown after idle, in-process vs served")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
