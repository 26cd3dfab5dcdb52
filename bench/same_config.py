"""``auto`` against the hand configuration it chose, at one rate, from the same arrivals
(issue 15: the runtime is never worse than what a user could configure by hand).

``scaling.py`` compares configurations by bisection: each configuration's throughput
at SLO is the highest rate whose 300-request window passed, one draw each. When ``auto``
chose the same configuration as a baseline, that comparison is a comparison of two draws
(ResNet-50 at 2 x L0, 2026-11-25: one 2-thread session, 0.58 x itself). This script
answers the question the bisection cannot: at one rate, does the SLO machinery that
``auto`` runs with (admission, the monitor, the autoscaler, the planner's deploy) cost
anything against the same configuration run by hand?

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/same_config.py`".
"""

from __future__ import annotations

import argparse
import math
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
    busy_cpu_seconds,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    print_table,
    wait_for_quiet,
    write_json,
)

VARIANTS = ("auto", "hand", "hand+slo")


def fifo_replay(arrivals_s: np.ndarray, compute_ms: np.ndarray, servers: int) -> np.ndarray:
    """Latency (ms) of each request served first-come first-served by ``servers``
    identical servers: request i starts at max(its arrival, the earliest time a server
    is free) and holds it ``compute_ms[i]``. ``arrivals_s`` sorted ascending, seconds.

    >>> fifo_replay(np.array([0.0, 0.0, 0.0]), np.array([10.0, 10.0, 10.0]), 2).tolist()
    [10.0, 10.0, 20.0]
    """
    free = [0.0] * max(1, servers)
    out = np.empty(len(arrivals_s))
    for i, (a, c) in enumerate(zip(arrivals_s * 1e3, compute_ms, strict=True)):
        k = int(np.argmin(free))
        start = max(a, free[k])
        free[k] = start + c
        out[i] = free[k] - a
    return out


def window(
    svc: Any, name: str, feeds: dict[str, np.ndarray], rate: float, n: int, warm_s: float
) -> list[dict[str, Any]]:
    """One window at ``rate`` requests/s (see the module docstring): per measured request
    its scheduled arrival (s), latency (ms, None if refused), error, and where answered
    the lag, wait, compute and hand-back (ms) and the instances that ran it."""
    rec = sc.Recorder()
    submit: dict[int, int] = {}
    answers: dict[int, tuple[np.ndarray, int]] = {}

    def send(rid: int) -> None:
        submit[rid] = time.monotonic_ns()
        try:
            fut = svc.submit(name, feeds)
        except Exception as exc:  # noqa: BLE001 - a 503 at admission is a failed request
            rec.finish(rid, False, str(exc)[:200])
            return

        def done(f: Any, rid: int = rid) -> None:
            exc = f.exception()
            if exc is None:
                answers[rid] = (f.result().trace, time.monotonic_ns())
            rec.finish(rid, exc is None, "" if exc is None else str(exc)[:200])

        fut.add_done_callback(done)

    gaps = sc.arrival_gaps(rate, sc.ARRIVAL_SEED)
    t0 = time.perf_counter()
    t_next, rid, measured = t0, 0, []
    while len(measured) < n:
        now = time.perf_counter()
        if now < t_next:
            time.sleep(min(t_next - now, 0.05))
            continue
        rec.sent_at(rid, t_next)
        if t_next - t0 >= warm_s:
            measured.append(rid)
        send(rid)
        rid += 1
        t_next += next(gaps)
    rec.wait_all(60.0)
    rows = []
    for r in measured:
        lat, ok, err = rec.done.get(r, (math.inf, False, "unanswered"))
        row: dict[str, Any] = {"arrival_s": rec.sent[r] - t0, "latency_ms": lat if ok else None}
        if not ok:
            row["error"] = err
        if r in answers:
            trace, done_ns = answers[r]
            # perf_counter and monotonic_ns read the same clock (CLOCK_MONOTONIC, Linux)
            sched_ns = rec.sent[r] * 1e9
            start, end = int(trace[:, 2].min()), int(trace[:, 3].max())
            row.update(
                lag_ms=(submit[r] - sched_ns) / 1e6,
                wait_ms=(start - submit[r]) / 1e6,
                compute_ms=float((trace[:, 3] - trace[:, 2]).sum()) / 1e6,
                back_ms=(done_ns - end) / 1e6,
                start_s=start / 1e9 - t0,
                end_s=end / 1e9 - t0,
                instances=sorted({int(i) for i in trace[:, 1]}),
            )
        rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]], slo_ms: float, servers: int) -> dict[str, Any]:
    """A window's figures (module docstring): P99 of every request, late, refused, the
    breakdown's P50 / P99, the ideal FIFO replay's P99 and the runtime's own delay."""
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    refused = len(rows) - len(lat)
    comp = np.array([r.get("compute_ms", np.nan) for r in rows])
    comp = np.where(np.isnan(comp), np.nanmedian(comp), comp)
    ideal = fifo_replay(np.array([r["arrival_s"] for r in rows]), comp, servers)
    p99_all = sc.p99_every(lat, refused)

    def pct(key: str) -> list[float]:
        v = [r[key] for r in rows if key in r]
        return [round(float(np.percentile(v, q)), 2) for q in (50, 99)] if v else []

    ideal_p99 = float(np.percentile(ideal, 99))
    return {
        "requests": len(rows),
        "refused": refused,
        "late": sum(x > slo_ms for x in lat),
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat else None,
        "p99_all_ms": round(p99_all, 2) if p99_all < math.inf else None,
        "passed": bool(p99_all <= slo_ms),
        "ideal_fifo_p99_ms": round(ideal_p99, 2),
        "own_delay_p99_ms": round(p99_all - ideal_p99, 2) if p99_all < math.inf else None,
        "lag_ms_p50_p99": pct("lag_ms"),
        "wait_ms_p50_p99": pct("wait_ms"),
        "compute_ms_p50_p99": pct("compute_ms"),
        "back_ms_p50_p99": pct("back_ms"),
        "errors": sorted({r["error"][:160] for r in rows if "error" in r})[:3],
    }


def hand_pipeline(model: str, name: str, threads: int, instances: int, slo_ms: float | None):
    """The whole model at ``threads`` x ``instances``, no autoscaler (``slo_ms``: the
    SLO for admission)."""
    from infscaler.base.config import load_pipeline

    raw = sc.pipeline(model, name, 1, threads=threads, max_instances=instances, whole=True)
    raw = raw.model_dump(exclude_none=True)
    raw["stages"][0]["instances"] = instances
    if slo_ms is not None:
        raw["slo"] = f"{slo_ms:.1f}ms"
    return load_pipeline(raw)


def service_ms(model: str, feeds: dict[str, np.ndarray], threads: int, n: int = 20) -> float:
    """Median in-process latency of one session at ``threads`` threads, ms (the
    profiler's own timing as served: ``profiler.measure_latency``, 2 warm-up runs)."""
    from infscaler.base.models import resolve_model
    from infscaler.partitioner import profiler

    ms, _ = profiler.measure_latency(
        resolve_model(model), feeds, warmup=2, repeats=n, threads=threads
    )
    return float(ms)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50", choices=sorted(sc.MODEL_SETTINGS))
    ap.add_argument("--slo-x", type=float, default=2.0, help="SLO = this x L0 (default 2)")
    ap.add_argument("--load", type=float, default=0.35, help="rate / capacity (default 0.35)")
    ap.add_argument("--requests", type=int, default=600, help="measured per window")
    ap.add_argument("--warm-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--cpu-wake-latency-us",
        default=None,
        help="the service's PM QoS CPU latency setting (Service(cpu_wake_latency_us)): µs, "
        "auto or none; default: the Service's default. A fixed setting (0: held awake) keeps "
        "the wake policy from holding the CPUs for one variant and not another",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    sc.set_service_wake(args.cpu_wake_latency_us)
    if args.model in sc.PIPELINE_CASES:
        ap.error("a pipeline case has no whole-model hand twin here; choose a model")
    default_cache_dir()
    from infscaler.service.service import Service

    env = environment()
    quiet = wait_for_quiet(120.0)
    steal0, fl = cpu_steal_seconds(), ForeignLoad(sc.own_cpu_seconds)
    feeds = sc.model_inputs(args.model)
    cal = sc.calibrate(args.model, feeds, sc.MODEL_SETTINGS[args.model]["n_l0"])
    slo_ms = args.slo_x * cal["l0_ms"]
    out = args.out or RESULTS_DIR / f"same_config_{args.model}_{args.slo_x:g}x.json"
    state = Path("/tmp/isc-same-config-state")
    windows: list[dict[str, Any]] = []
    wake = sc.service_wake_setting()
    with Service(state_dir=state, pool_mb=256, cpu_wake_latency_us=wake) as svc:
        dep = svc.deploy(sc.auto_pipeline(args.model, "auto", slo_ms))
        time.sleep(2.0)
        chosen = [u for u in sc.config_snapshot(svc, dep, 1.0) if u["served"]]
        svc.undeploy("auto")
        if len(chosen) != 1:
            print(f"auto chose {len(chosen)} units: no whole-model hand twin", flush=True)
            return 2
        threads, servers = chosen[0]["threads"], chosen[0]["instances"]
        d_ms = service_ms(args.model, feeds, threads)
        rate = args.load * servers * 1000.0 / d_ms
        print(
            f"L0 {cal['l0_ms']} ms, SLO {slo_ms:.1f} ms; auto: {servers} x {threads} thread(s), "
            f"D {d_ms:.1f} ms; rate {rate:.2f}/s",
            flush=True,
        )
        for rep in range(args.repeats):
            order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
            for v in order:
                name = f"{v.replace('+', '-')}-{rep}"
                if v == "auto":
                    cfg = sc.auto_pipeline(args.model, name, slo_ms)
                else:
                    cfg = hand_pipeline(
                        args.model, name, threads, servers, slo_ms if v == "hand+slo" else None
                    )
                d = svc.deploy(cfg)
                busy0, t0 = busy_cpu_seconds(), time.monotonic()
                rows = window(svc, name, feeds, rate, args.requests, args.warm_s)
                cores_busy = (busy_cpu_seconds() - busy0) / (time.monotonic() - t0)
                ran = [u for u in sc.config_snapshot(svc, d, 5.0) if u["served"]]
                svc.undeploy(name)
                s = summarise(rows, slo_ms, servers)
                s.update(variant=v, repeat=rep, config=ran, host_cores_busy=round(cores_busy, 3))
                windows.append(s)
                print(
                    f"  {rep} {v:9s} P99 of all {s['p99_all_ms']} ms (ideal FIFO "
                    f"{s['ideal_fifo_p99_ms']}), late {s['late']}, refused {s['refused']}",
                    flush=True,
                )
    summary = {}
    for v in VARIANTS:
        mine = [w for w in windows if w["variant"] == v]
        ratios = []
        for w in mine:
            h = next(x for x in windows if x["variant"] == "hand" and x["repeat"] == w["repeat"])
            if w["p99_all_ms"] and h["p99_all_ms"]:
                ratios.append(w["p99_all_ms"] / h["p99_all_ms"])
        summary[v] = {
            "p99_all_ms": [w["p99_all_ms"] for w in mine],
            "passed": [w["passed"] for w in mine],
            "late_plus_refused": [w["late"] + w["refused"] for w in mine],
            "own_delay_p99_ms": [w["own_delay_p99_ms"] for w in mine],
            "vs_hand_median": round(float(np.median(ratios)), 3) if ratios else None,
        }
    data = {
        "environment": {**env, "load_average_at_end": list(os.getloadavg())},
        "host_noise": host_noise(quiet, fl.cores(), steal0),
        "model": args.model,
        "calibration": cal,
        "slo_x": args.slo_x,
        "slo_ms": round(slo_ms, 2),
        "auto_config": chosen,
        "service_ms": round(d_ms, 2),
        "load": args.load,
        "rate_rps": round(rate, 3),
        "requests_per_window": args.requests,
        "cpu_wake_latency_us": wake,
        "summary": summary,
        "windows": windows,
    }
    write_json(out, data)
    plot(data, out.with_suffix(".png"))
    print_table(
        ["variant", "P99 of all (ms)", "late + refused", "own delay P99 (ms)", "vs hand"],
        [
            [v, s["p99_all_ms"], s["late_plus_refused"], s["own_delay_p99_ms"], s["vs_hand_median"]]
            for v, s in summary.items()
        ],
    )
    print(f"wrote {out} and .png")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Per variant and repeat: the P99 of every request and the ideal FIFO replay's P99,
    with the SLO."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, v in enumerate(VARIANTS):
        ws = [w for w in data["windows"] if w["variant"] == v]
        xs = [i + 0.08 * (w["repeat"] - 1) for w in ws]
        ax.scatter(xs, [w["p99_all_ms"] or np.nan for w in ws], color="C0", label=None)
        ax.scatter(xs, [w["ideal_fifo_p99_ms"] for w in ws], color="C2", marker="x")
        # a P99 that reaches the refused / unanswered requests (more than 1 % of them)
        gone = [x for x, w in zip(xs, ws, strict=True) if w["p99_all_ms"] is None]
        ax.scatter(gone, [1.1 * data["slo_ms"]] * len(gone), color="C3", marker="^")
    ax.scatter([], [], color="C3", marker="^", label="P99 among the refused (> 1 %)")
    ax.axhline(data["slo_ms"], color="red", lw=1, label=f"SLO {data['slo_ms']} ms")
    ax.scatter([], [], color="C0", label="P99 of every request")
    ax.scatter([], [], color="C2", marker="x", label="ideal FIFO replay P99")
    ax.set_xticks(range(len(VARIANTS)), VARIANTS)
    ax.set_ylabel("ms")
    cfg = data["auto_config"][0]
    ax.set_title(
        f"{data['model']}, {cfg['instances']} x {cfg['threads']} thread(s), "
        f"{data['rate_rps']}/s ({data['load']} x capacity), same arrivals",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
