"""Memory under real and bursty arrivals (InfScaler §V, Table II), measured.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``memory_trace.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import AUTOSCALE, MODEL_SETTINGS, auto_pipeline, pipeline  # noqa: E402
from harness.scenarios import replay_summary  # noqa: E402

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
    info = {"function": "busiest", "start_min": TRACE_START_MIN, "minutes": minutes,
            "time_compression": TIME_COMPRESSION, "trace_requests_in_window": int(raw.size),
            "rate_scale_factor": round(scale, 6), "replayed_requests": int(a.size),
            "rate_per_trace_minute": [round(n / (60.0 / TIME_COMPRESSION), 3) for n in per_min]}  # fmt: skip
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


def config_dict(config: str, model: str, name: str, slo_ms: float) -> dict[str, Any]:
    """The pipeline dict of a configuration (the method)."""
    if config == "auto":
        cfg = auto_pipeline(model, name, slo_ms)
    else:
        k = MODEL_SETTINGS[model]["k"] if config == "infscaler" else 1
        cfg = pipeline(model, name, k, slo_ms=slo_ms, autoscale=AUTOSCALE,
                       max_instances=len(os.sched_getaffinity(0)), whole=config == "replication")  # fmt: skip
    return cfg.model_dump(mode="json", exclude_none=True, exclude_unset=True)


def run_one(a: Any, model: str, config: str, arr: np.ndarray, slo_ms: float, feeds: dict,
            res: harness.Result) -> dict[str, Any]:  # fmt: skip
    """One configuration on one arrival sequence: the replay's figures and memory."""
    from infscaler.api.loadgen import LoadGenerator

    name = f"mt-{config}"
    pipe = config_dict(config, model, name, slo_ms)
    with harness.Sut([pipe], args=["--control-path", a.control_path]) as s:
        res.own_pids[:] = [s.pid]
        harness.scenarios.run(s.sock, name, feeds, harness.scenarios.SINGLE_STREAM,
                              duration_s=1.0)  # fmt: skip
        time.sleep(1.5)  # instances report their memory every second
        s.watch(0.5)
        wall0 = time.time()
        rows = LoadGenerator(s.sock, name, feeds).replay(arr, timeout_s=120.0)
        decisions, polls = s.since(wall0)
        units = [p.get("units") for p in s.status()["pipelines"] if p.get("name") == name]
    mem = np.array([m for t, m in s.memory if t >= wall0] or [np.nan])
    span = float(arr[-1] - arr[0]) if arr.size > 1 else 1.0
    r = replay_summary(rows, slo_ms, span)
    return {**r, "throughput_rps": round(r["answered"] / span, 3),
            "slo_attainment": round(sum(x["outcome"] == "ok" and x["ms"] <= slo_ms
                                        for x in rows) / max(len(rows), 1), 4),
            "memory_mean_mb": round(float(np.nanmean(mem)), 1),
            "memory_peak_mb": round(float(np.nanmax(mem)), 1),
            "timeline": [(round(t - wall0, 2), m) for t, m in s.memory if t >= wall0],
            "instances": [(t, n.get(name)) for t, n in polls],
            "decisions": [{k: d.get(k) for k in ("t_s", "action", "unit", "reason")}
                          for d in decisions],
            "units_end": units[0] if units else None}  # fmt: skip


def compare(runs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """One arrival process's row: each configuration against replication (mean and peak
    memory ratio, equal throughput within 5 %, issue 14: <= 1.0x replication's mean
    memory at equal throughput and attainment within 1 point; the paper's <= 0.75x)."""
    by = {r["config"]: r for r in runs if r["arrivals"] == kind}
    row: dict[str, Any] = {"arrivals": kind}
    b = by.get("replication")
    for c, r in by.items():
        row[f"{c}_mean_mb"], row[f"{c}_throughput_rps"] = r["memory_mean_mb"], r["throughput_rps"]
        if b is None or c == "replication":
            continue
        base_rps = max(b["throughput_rps"], 1e-9)
        equal = abs(r["throughput_rps"] - b["throughput_rps"]) <= 0.05 * base_rps
        row[f"{c}_mean_ratio"] = round(r["memory_mean_mb"] / b["memory_mean_mb"], 3)
        row[f"{c}_peak_ratio"] = round(r["memory_peak_mb"] / b["memory_peak_mb"], 3)
        row[f"{c}_target_0_75_met"] = bool(r["memory_mean_mb"] <= 0.75 * b["memory_mean_mb"])
        row[f"{c}_issue14_met"] = bool(row[f"{c}_mean_ratio"] <= 1.0 and equal and
                                       r["slo_attainment"] >= b["slo_attainment"] - 0.01)  # fmt: skip
    return row


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=150.0)
    ap.add_argument("--models", default="vgg19,resnet50")
    ap.add_argument("--arrivals", default="azure,gamma-cv1,gamma-cv4")
    ap.add_argument("--load", type=float, default=0.6, help="mean rate / ideal")
    ap.add_argument("--slo", type=float, default=SLO_X, help="SLO as a factor of L0")
    ap.add_argument("--control-path", default="auto")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="of " + ",".join(CONFIGS))

    def quick(a: Any) -> None:
        a.models, a.arrivals, a.configs = "resnet50", "gamma-cv4", "infscaler,replication"
        a.duration_s = 20.0

    a = harness.cli.parse(ap, argv, quick)
    if bad := set(a.configs.split(",")) - set(CONFIGS):
        ap.error(f"--configs: unknown {sorted(bad)}; choose from {','.join(CONFIGS)}")
    res = harness.cli.start("memory_trace", a)
    for model in a.models.split(","):
        feeds = harness.models.model_inputs(model)
        cal = harness.models.calibrate(model, feeds, MODEL_SETTINGS[model]["n_l0"])
        slo_ms, rate = a.slo * cal["l0_ms"], a.load * cal["ideal_rps"]
        print(f"== {model}: L0 {cal['l0_ms']} ms, rate {rate:.2f}/s, SLO {slo_ms:.0f} ms")
        runs = []
        for kind in a.arrivals.split(","):
            arr, info = arrivals_for(kind, rate, a.duration_s, seed=1)
            for config in a.configs.split(","):
                r = run_one(a, model, config, arr, slo_ms, feeds, res)
                runs.append(res.add(model=model, arrivals=kind, config=config, slo_ms=slo_ms,
                                    arrivals_info=info, **r))  # fmt: skip
                print(f"  {config} {kind}: tput {r['throughput_rps']}/s, P99 {r['p99_ms']} ms, "
                      f"memory mean {r['memory_mean_mb']} / peak {r['memory_peak_mb']} MB",
                      flush=True)  # fmt: skip
        res.summary.setdefault("calibration", {})[model] = cal
        res.summary.setdefault("table", []).extend(
            {"model": model, **compare(runs, k)} for k in a.arrivals.split(",")
        )
    res.summary["autoscale"] = AUTOSCALE
    harness.cli.finish(res, a, plot)
    rows = [[t["model"], t["arrivals"], c, t.get(f"{c}_mean_mb"), t.get(f"{c}_mean_ratio"),
             t.get(f"{c}_throughput_rps"), t.get(f"{c}_issue14_met")]
            for t in res.summary["table"] for c in CONFIGS if f"{c}_mean_mb" in t]  # fmt: skip
    harness.print_table(
        ["model", "arrivals", "config", "MB", "/ repl.", "tput", "<= 1.0x, same tput"], rows
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Memory over time per configuration, one panel per model and arrival process."""
    pts = [{"cell": f"{p['model']} {p['arrivals']}", "config": p["config"], "t_s": t, "mb": m}
           for p in data["points"] for t, m in p["timeline"]]  # fmt: skip
    harness.plot(pts, path, x="t_s", y="mb", by="config", panel="cell",
                 xlabel="s since the replay started", ylabel="memory used, MB")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
