"""Memory under real and bursty arrivals (InfScaler §V, Table II), measured.

Writes ``results/memory_trace.json`` and ``results/memory_trace.png`` (``_quick`` with
--quick: ResNet-50, 40 s, gamma CV^2 = 4 only).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/memory_trace.py`".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    busy_cpu_seconds,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    print_table,
    write_json,
)
from _scaling_v1 import (  # noqa: E402
    AUTOSCALE,
    MODEL_SETTINGS,
    STATE_DIR,
    InProcess,
    Recorder,
    _own_cpu,
    auto_pipeline,
    calibrate,
    deploy_status,
    instances_of,
    model_inputs,
    own_cpu_seconds,
    pipeline,
)

CONFIGS = ("infscaler", "auto", "replication")

TRACE_START_MIN = 21
TRACE_MINUTES = 10
TIME_COMPRESSION = 4.0
SLO_X = 2.0


def azure_arrivals(rate: float, duration_s: float, seed: int) -> tuple[np.ndarray, dict]:
    """The busiest function's window, compressed and scaled to a mean of ``rate``/s over
    ``duration_s`` (at most TRACE_MINUTES x 60 / TIME_COMPRESSION s)."""
    from infscaler.runtime.planning.arrivals import azure_functions

    minutes = min(TRACE_MINUTES, int(np.ceil(duration_s * TIME_COMPRESSION / 60.0)))
    raw = azure_functions(function="busiest", start_min=TRACE_START_MIN, minutes=minutes, seed=seed)
    span = minutes * 60.0 / TIME_COMPRESSION
    scale = rate * span / raw.size
    a = azure_functions(
        function="busiest", start_min=TRACE_START_MIN, minutes=minutes, scale=scale, seed=seed
    )
    a = a / TIME_COMPRESSION
    per_min = np.bincount((a * TIME_COMPRESSION // 60).astype(int), minlength=minutes)
    info = {
        "function": "busiest",
        "start_min": TRACE_START_MIN,
        "minutes": minutes,
        "time_compression": TIME_COMPRESSION,
        "trace_requests_in_window": int(raw.size),
        "rate_scale_factor": round(scale, 6),
        "replayed_requests": int(a.size),
        "rate_per_trace_minute": [round(n / (60.0 / TIME_COMPRESSION), 3) for n in per_min],
    }
    return a[a < span], info


def arrivals_for(kind: str, rate: float, duration_s: float, seed: int) -> tuple[np.ndarray, dict]:
    from infscaler.runtime.planning.arrivals import cv2_of, gamma

    if kind == "azure":
        a, info = azure_arrivals(rate, duration_s, seed)
    else:
        cv2 = float(kind.split("cv")[1])
        a, info = gamma(rate, cv2, duration_s, seed=seed), {"cv2": cv2}
    info.update(
        requests=int(a.size),
        duration_s=round(float(duration_s if kind != "azure" else a[-1]), 1),
        mean_rate=round(a.size / max(duration_s, 1e-9), 3),
        measured_cv2=round(float(cv2_of(a)), 3) if a.size > 2 else None,
    )
    return a, info


def replay(
    svc: Any, dep: Any, feeds: dict[str, np.ndarray], arrivals: np.ndarray, slo_ms: float
) -> dict[str, Any]:
    """Send ``arrivals`` (s from now) open loop; sample memory every 0.5 s until the last
    request is answered."""
    from infscaler.runtime.scaling.monitor import Monitor

    sender = InProcess(svc, dep.name, feeds)
    rec = Recorder()
    timeline: list[dict[str, Any]] = []
    stop = threading.Event()
    t0 = time.perf_counter()

    def sampler() -> None:
        mon = Monitor(svc)
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a reading during a restart
                timeline.append(
                    {
                        "t": round(time.perf_counter() - t0, 2),
                        "memory_mb": round(mon.memory_used_mb(), 1),
                        "instances": instances_of(svc, dep),
                    }
                )
            stop.wait(0.5)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    busy0, own0 = busy_cpu_seconds(), _own_cpu(svc)
    for rid, a in enumerate(arrivals):
        t = t0 + float(a)
        while True:
            now = time.perf_counter()
            if now >= t:
                break
            time.sleep(min(t - now, 0.05))
        rec.sent_at(rid, t)
        sender.send(rid, rec)
    end_send = time.perf_counter() - t0
    rec.wait_all(120.0)
    wall = time.perf_counter() - t0
    own1 = _own_cpu(svc)
    own = sum(v - own0.get(p, 0.0) for p, v in own1.items())
    other_cores = round(max(0.0, busy_cpu_seconds() - busy0 - own) / wall, 3)
    stop.set()
    th.join()
    with rec.lock:
        done = dict(rec.done)
    n = len(arrivals)
    lat = [d[0] for d in done.values() if d[1]]
    failed = sum(1 for d in done.values() if not d[1])
    mem = np.array([s["memory_mb"] for s in timeline])
    span = float(arrivals[-1] - arrivals[0]) if n > 1 else 1.0
    return {
        "requests": n,
        "completed": len(lat),
        "failed": failed,
        "unanswered": n - len(done),
        "errors": sorted({d[2] for d in done.values() if not d[1]})[:3],
        "throughput_rps": round(len(lat) / span, 3),
        "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat else None,
        "p99_ms": round(float(np.percentile(lat, 99)), 1) if lat else None,
        "slo_attainment": round(sum(1 for x in lat if x <= slo_ms) / n, 4) if n else None,
        "memory_mean_mb": round(float(mem.mean()), 1) if mem.size else None,
        "memory_peak_mb": round(float(mem.max()), 1) if mem.size else None,
        "send_s": round(end_send, 1),
        "other_processes_cores": other_cores,
        "timeline": timeline,
    }


def run_model(
    model: str,
    kinds: list[str],
    duration_s: float,
    load: float,
    control_path: str,
    slo_x: float = SLO_X,
    configs: tuple[str, ...] = CONFIGS,
) -> dict:
    from infscaler.service.service import Service

    st = MODEL_SETTINGS[model]
    k = st["k"]
    feeds = model_inputs(model)
    print(f"== {model}: calibrating", flush=True)
    cal = calibrate(model, feeds, st["n_l0"])
    slo_ms = slo_x * cal["l0_ms"]
    rate = load * cal["ideal_rps"]
    print(
        f"   L0 {cal['l0_ms']} ms, ideal {cal['ideal_rps']}/s, rate {rate:.2f}/s, SLO {slo_ms:.0f} ms"
    )
    runs = []
    # plan once per run with this code (the planner keeps its decision per pipeline)
    shutil.rmtree(STATE_DIR / "plans" / "decisions", ignore_errors=True)
    with Service(state_dir=STATE_DIR, control_path=control_path, pool_mb=256) as svc:
        for kind in kinds:
            arr, info = arrivals_for(kind, rate, duration_s, seed=1)
            for config in configs:
                name = f"mt-{config}-{kind}"
                if config == "auto":
                    cfg = auto_pipeline(model, name, slo_ms)
                else:
                    cfg = pipeline(
                        model,
                        name,
                        k if config == "infscaler" else 1,
                        slo_ms=slo_ms,
                        autoscale=AUTOSCALE,
                        max_instances=len(os.sched_getaffinity(0)),
                        whole=config == "replication",
                    )
                dep = svc.deploy(cfg)
                for _ in range(2):
                    svc.infer(name, feeds)
                time.sleep(1.5)  # instances report USS every second
                print(
                    f"  {config} {kind}: {arr.size} requests over {info['duration_s']} s",
                    flush=True,
                )
                r = replay(svc, dep, feeds, arr, slo_ms)
                r["decisions"] = [
                    {x: d[x] for x in ("time", "action", "unit", "queue_limit", "reason") if x in d}
                    for d in svc.autoscaler.decisions(name)
                ]
                if config == "auto":
                    # what the deploy-time planner chose: units, K per stage, threads
                    r["chosen"] = {
                        "units": [u.name for u in dep.pipeline.units],
                        "plans": {st: str(p) for st, p in dict(dep.pipeline.plans).items()},
                        "status": deploy_status(svc, dep),
                    }
                svc.undeploy(name)
                r.update(
                    config=config,
                    arrivals=kind,
                    arrivals_info=info,
                    k=k if config == "infscaler" else (None if config == "auto" else 1),
                )
                runs.append(r)
                print(
                    f"    tput {r['throughput_rps']}/s, P99 {r['p99_ms']} ms, attain "
                    f"{r['slo_attainment']}, memory mean {r['memory_mean_mb']} / peak "
                    f"{r['memory_peak_mb']} MB, failed {r['failed']}, others {r['other_processes_cores']} cores",
                    flush=True,
                )
    table = []
    for kind in kinds:
        b = next((r for r in runs if r["arrivals"] == kind and r["config"] == "replication"), None)
        row: dict[str, Any] = {"arrivals": kind}
        if b is not None:
            row.update(
                replication_mean_mb=b["memory_mean_mb"],
                replication_peak_mb=b["memory_peak_mb"],
                replication_throughput_rps=b["throughput_rps"],
                replication_slo_attainment=b["slo_attainment"],
            )
        for c in ("infscaler", "auto"):
            a = next((r for r in runs if r["arrivals"] == kind and r["config"] == c), None)
            if a is None:
                continue
            row.update(
                {
                    f"{c}_mean_mb": a["memory_mean_mb"],
                    f"{c}_peak_mb": a["memory_peak_mb"],
                    f"{c}_throughput_rps": a["throughput_rps"],
                    f"{c}_slo_attainment": a["slo_attainment"],
                }
            )
            if b is None:
                continue
            pre = "" if c == "infscaler" else "auto_"
            equal = abs(a["throughput_rps"] - b["throughput_rps"]) <= 0.05 * max(
                b["throughput_rps"], 1e-9
            )
            row.update(
                {
                    f"{pre}mean_ratio": round(a["memory_mean_mb"] / b["memory_mean_mb"], 3),
                    f"{pre}peak_ratio": round(a["memory_peak_mb"] / b["memory_peak_mb"], 3),
                    f"{pre}throughput_equal_within_5pct": bool(equal),
                    f"{pre}target_3_met": bool(a["memory_mean_mb"] <= 0.75 * b["memory_mean_mb"]),
                    # issue 14: <= 1.0x replication's mean memory, same throughput and
                    # SLO attainment (attainment within 1 point)
                    f"{pre}issue14_met": bool(
                        a["memory_mean_mb"] <= b["memory_mean_mb"]
                        and equal
                        and (a["slo_attainment"] or 0) >= (b["slo_attainment"] or 0) - 0.01
                    ),
                }
            )
        table.append(row)
    return {
        "model": model,
        "k": k,
        "calibration": cal,
        "slo_x": slo_x,
        "slo_ms": round(slo_ms, 2),
        "load_vs_ideal": load,
        "mean_rate": round(rate, 3),
        "runs": runs,
        "table": table,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default="vgg19,resnet50")
    ap.add_argument("--arrivals", default="azure,gamma-cv1,gamma-cv4")
    ap.add_argument("--duration-s", type=float, default=150.0)
    ap.add_argument("--load", type=float, default=0.6, help="mean rate / ideal")
    ap.add_argument("--slo", type=float, default=SLO_X, help="SLO as a factor of L0")
    ap.add_argument("--control-path", default="auto")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="of " + ",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replot", type=Path)
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return 0
    default_cache_dir()
    if args.quick:
        models, kinds, duration = ["resnet50"], ["gamma-cv4"], 40.0
    else:
        models = [m for m in args.models.split(",") if m]
        kinds = [k for k in args.arrivals.split(",") if k]
        duration = args.duration_s
    path = args.out or RESULTS_DIR / (
        "memory_trace_quick.json" if args.quick else "memory_trace.json"
    )
    old = json.loads(path.read_text()) if path.exists() and not args.quick and not args.out else {}
    env = environment()
    steal0 = cpu_steal_seconds()
    fl = ForeignLoad(own_cpu_seconds)
    results = [m for m in old.get("models", []) if m["model"] not in models]
    for model in models:
        t = time.monotonic()
        configs = tuple(c for c in args.configs.split(",") if c)
        bad = [c for c in configs if c not in CONFIGS]
        if bad:
            ap.error(f"--configs: unknown {bad}; choose from {','.join(CONFIGS)}")
        e = run_model(model, kinds, duration, args.load, args.control_path, args.slo, configs)
        e["wall_s"] = round(time.monotonic() - t, 1)
        e["load_average_at_end"] = list(os.getloadavg())
        results.append(e)
        data = {
            "environment": {**env, "load_average_at_end": list(os.getloadavg())},
            "host_noise": host_noise(
                {"note": "before the full run the operator waited for a 1-min load < 2.5"},
                fl.cores(),
                steal0,
            ),
            "autoscale": AUTOSCALE,
            "models": results,
        }
        write_json(path, data)
        plot(data, path.with_suffix(".png"))
    print_table(
        [
            "model",
            "arrivals",
            "config",
            "MB",
            "replication MB",
            "ratio",
            "peak ratio",
            "tput",
            "attain",
            "<= 1.0, same tput",
        ],
        [
            [
                m["model"],
                t["arrivals"],
                c,
                t[f"{c}_mean_mb"],
                t.get("replication_mean_mb"),
                t.get(f"{pre}mean_ratio"),
                t.get(f"{pre}peak_ratio"),
                f"{t[f'{c}_throughput_rps']}/{t.get('replication_throughput_rps')}",
                f"{t[f'{c}_slo_attainment']}/{t.get('replication_slo_attainment')}",
                {True: "met", False: "MISSED", None: "-"}[t.get(f"{pre}issue14_met")],
            ]
            for m in data["models"]
            for t in m["table"]
            for c, pre in (("infscaler", ""), ("auto", "auto_"))
            if f"{c}_mean_mb" in t
        ],
    )
    print(f"wrote {path} and .png")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Top row: Table II as bars (mean memory, peak as a marker; P99 and attainment
    printed), one panel per model. Bottom row: memory over time per arrival process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data["models"]
    kinds = sorted(
        {r["arrivals"] for m in models for r in m["runs"]}, key=lambda k: (k != "azure", k)
    )
    ncol = max(len(models), len(kinds))
    fig, axes = plt.subplots(
        1 + len(models), ncol, figsize=(4.8 * ncol, 3.6 * (1 + len(models))), squeeze=False
    )
    colors = {"infscaler": "#2a7", "auto": "#d83", "replication": "#58c"}
    for j, m in enumerate(models):
        ax = axes[0][j]
        ks = [t["arrivals"] for t in m["table"]]
        present = [c for c in CONFIGS if any(r["config"] == c for r in m["runs"])]
        width = 0.8 / max(1, len(present))
        for i, c in enumerate(present):
            xs = np.arange(len(ks)) + (i - (len(present) - 1) / 2) * width
            runs = [
                next(r for r in m["runs"] if r["arrivals"] == k and r["config"] == c) for k in ks
            ]
            ax.bar(
                xs, [r["memory_mean_mb"] for r in runs], width, color=colors[c], label=f"{c} (mean)"
            )
            ax.scatter(
                xs, [r["memory_peak_mb"] for r in runs], color="k", marker="_", s=200, zorder=3
            )
            for x, r in zip(xs, runs, strict=True):
                ax.text(
                    x,
                    r["memory_mean_mb"] * 0.5,
                    f"{r['memory_mean_mb']:.0f}\nP99 {r['p99_ms']:.0f}\n{100 * r['slo_attainment']:.0f}%",
                    ha="center",
                    fontsize=6.5,
                    rotation=90,
                    va="center",
                )
        for x, t in zip(np.arange(len(ks)), m["table"], strict=True):
            ax.text(
                x,
                ax.get_ylim()[1] * 0.97,
                " ".join(
                    f"{lab} x{t[key]:.2f}"
                    for lab, key in (("Eq.1", "mean_ratio"), ("auto", "auto_mean_ratio"))
                    if t.get(key) is not None
                ),
                ha="center",
                va="top",
                fontsize=8,
            )
        ax.set_xticks(np.arange(len(ks)), ks)
        ax.set_ylabel("memory MB (bars mean, - peak)")
        ax.set_title(
            f"{m['model']} K={m['k']}: SLO {m['slo_ms']:.0f} ms ({m.get('slo_x', SLO_X):g}x L0), "
            f"mean {m['mean_rate']:.2f}/s ({m['load_vs_ideal']:.0%} ideal)",
            fontsize=8.5,
        )
        ax.legend(fontsize=7, loc="lower right")
        for jj in range(len(models), ncol):
            axes[0][jj].axis("off")
        for i, k in enumerate(kinds):
            ax = axes[1 + j][i]
            for c in CONFIGS:
                r = next((r for r in m["runs"] if r["arrivals"] == k and r["config"] == c), None)
                if r is None:
                    continue
                tl = r["timeline"]
                ax.plot(
                    [s["t"] for s in tl], [s["memory_mb"] for s in tl], color=colors[c], label=c
                )
            ax.set_title(f"{m['model']}: {k}", fontsize=9)
            ax.set_xlabel("s")
            ax.set_ylabel("memory MB")
            ax.legend(fontsize=7)
        for ii in range(len(kinds), ncol):
            axes[1 + j][ii].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
