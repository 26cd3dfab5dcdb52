"""The live check at work: a planned pipeline started with a deliberately wrong
configuration is corrected under steady load, and every request is answered.

Writes ``results/live_check.json`` and ``.png`` (``_quick`` with ``--quick``).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/live_check.py`".
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scaling_v1 as sc  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    busy_cpu_seconds,
    default_cache_dir,
    environment,
    wait_for_quiet,
    write_json,
)


def run(model: str, slo_x: float, load: float, duration_s: float) -> dict[str, Any]:
    """One run (see the module docstring); returns the JSON-able result."""
    from infscaler.runtime.planning.autoplan import START_WITH_ENV
    from infscaler.service.service import Service

    feeds = sc.model_inputs(model)
    cal = sc.calibrate(model, feeds, 30)
    slo_ms = slo_x * cal["l0_ms"]
    rate = load * cal["ideal_rps"]
    print(f"{model}: L0 {cal['l0_ms']} ms, ideal {cal['ideal_rps']}/s, SLO {slo_ms:.1f} ms, "
          f"rate {rate:.2f}/s")  # fmt: skip
    state = Path(tempfile.mkdtemp(prefix="isc-live-"))
    os.environ[START_WITH_ENV] = "worst"
    try:
        with Service(state_dir=state, control_path="userspace", pool_mb=256) as svc:
            cfg = sc.auto_pipeline(model, "live", slo_ms)
            said: list[str] = []
            t = time.perf_counter()
            dep = svc.deploy(cfg, progress=said.append)
            deploy_s = time.perf_counter() - t
            if dep.live is None or dep.live.other is None:
                raise SystemExit(f"no live plan with a runner-up: {said[-5:]}")
            start = {"serving": dep.live.serving.label, "other": dep.live.other.label}
            print(f"  started with {start['serving']} (runner-up {start['other']}), "
                  f"deploy {deploy_s:.1f} s")  # fmt: skip
            samples: list[dict[str, Any]] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.25):
                    try:
                        d = svc.deployment("live")
                    except Exception:  # noqa: BLE001 - between two deployments
                        continue
                    samples.append({"t": time.perf_counter(), "serving": d.live.serving.label})

            sampler = threading.Thread(target=sample, daemon=True)
            busy0, own0 = busy_cpu_seconds(), sc.own_cpu_seconds()
            rec: dict[int, tuple[float, str, float | None]] = {}
            lock = threading.Lock()
            sampler.start()
            t0 = time.perf_counter()
            gaps = sc.arrival_gaps(rate, sc.ARRIVAL_SEED)
            t_next, rid, sent = t0, 0, {}
            while t_next - t0 < duration_s:
                now = time.perf_counter()
                if now < t_next:
                    time.sleep(min(t_next - now, 0.05))
                    continue
                sent[rid] = t_next
                try:
                    fut = svc.submit("live", feeds)
                except Exception as exc:  # noqa: BLE001 - refused at arrival
                    status = getattr(exc, "status", None)
                    with lock:
                        rec[rid] = (t_next, "refused" if status == 503 else f"error {exc}", None)
                else:

                    def done(f: Any, rid: int = rid, at: float = t_next) -> None:
                        exc = f.exception()
                        lat = (time.perf_counter() - at) * 1e3
                        with lock:
                            rec[rid] = (at, "ok" if exc is None else f"error {exc}", lat)

                    fut.add_done_callback(done)
                rid += 1
                t_next += next(gaps)
            deadline = time.perf_counter() + 60
            while len(rec) < rid and time.perf_counter() < deadline:
                time.sleep(0.1)
            stop.set()
            sampler.join(5)
            decisions = svc.autoscaler.decisions("live")
            live_state = svc.status()["pipelines"][0]["live_check"]
        # read once the service is closed: its instances' CPU is then ours (reaped)
        wall = time.perf_counter() - t0
        others = max(0.0, busy_cpu_seconds() - busy0 - (sc.own_cpu_seconds() - own0))
        others /= max(wall, 1e-9)
    finally:
        os.environ.pop(START_WITH_ENV, None)
    wall_t0 = time.time() - (time.perf_counter() - t0)
    switch_at = next((d["time"] - wall_t0 for d in decisions if d["action"] == "live_switch"), None)
    serving_at = next((s["t"] - t0 for s in samples if s["serving"] == start["other"]), None)
    rows = [
        {"arrival_s": round(at - t0, 4), "outcome": out, "latency_ms": lat}
        for at, out, lat in (rec[r] for r in sorted(rec))
    ]
    unanswered = rid - len(rec)
    errors = [r for r in rows if r["outcome"].startswith("error")]

    def phase(lo: float, hi: float) -> dict[str, Any]:
        sel = [r for r in rows if lo <= r["arrival_s"] < hi]
        ok = [r["latency_ms"] for r in sel if r["outcome"] == "ok"]
        span = max(hi - lo, 1e-9)
        good = sum(1 for x in ok if x <= slo_ms)
        return {
            "span_s": round(span, 2),
            "requests": len(sel),
            "answered": len(ok),
            "refused": sum(1 for r in sel if r["outcome"] == "refused"),
            "goodput_rps": round(good / span, 3),
            "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok else None,
        }

    before = phase(0.0, switch_at if switch_at is not None else duration_s)
    after = phase(serving_at + 10.0, duration_s) if serving_at is not None else None
    return {
        "model": model,
        "calibration": cal,
        "slo_ms": round(slo_ms, 2),
        "rate_rps": round(rate, 3),
        "duration_s": duration_s,
        "deploy_s": round(deploy_s, 2),
        "started_with": start["serving"],
        "runner_up": start["other"],
        "switch_decided_s": None if switch_at is None else round(switch_at, 2),
        "runner_up_serving_s": None if serving_at is None else round(serving_at, 2),
        "live_check": live_state,
        "live_decisions": [d for d in decisions if str(d["action"]).startswith("live_")],
        "requests": rid,
        "unanswered": unanswered,
        "errors": len(errors),
        "error_examples": [r["outcome"][:200] for r in errors[:5]],
        "every_request_answered": unanswered == 0 and not errors,
        "corrected_within_60s": serving_at is not None and serving_at <= 60.0,
        "before_switch": before,
        "after_runner_up_serves": after,
        "other_processes_cores": round(others, 3),
        "rows": rows,
        "serving_samples": [{"t": round(s["t"] - t0, 2), "serving": s["serving"]} for s in samples],
    }


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    ok = [(r["arrival_s"], r["latency_ms"]) for r in res["rows"] if r["outcome"] == "ok"]
    ref = [r["arrival_s"] for r in res["rows"] if r["outcome"] == "refused"]
    if ok:
        xs, ys = zip(*ok, strict=True)
        ax.scatter(xs, ys, s=4, label="answered (latency)")
    if ref:
        ax.scatter(ref, [0] * len(ref), s=8, marker="x", color="red", label="refused (503)")
    ax.axhline(res["slo_ms"], color="black", lw=1, ls="--", label=f"SLO {res['slo_ms']:.0f} ms")
    if res["switch_decided_s"] is not None:
        ax.axvline(res["switch_decided_s"], color="orange", label="live_switch decided")
    if res["runner_up_serving_s"] is not None:
        ax.axvline(res["runner_up_serving_s"], color="green", label="runner-up serving")
    ax.set_xlabel("time since the load started (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_title(
        f"{res['model']}: started {res['started_with']}\nrunner-up {res['runner_up']}",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--slo-x", type=float, default=3.0)
    ap.add_argument("--load", type=float, default=0.35, help="x ideal (default 0.35)")
    ap.add_argument("--duration-s", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true", help="40 s: proves the script runs")
    args = ap.parse_args(argv)
    default_cache_dir()
    duration = 40.0 if args.quick else args.duration_s
    wait_for_quiet(60.0)
    res = run(args.model, args.slo_x, args.load, duration)
    res["environment"] = environment()
    res["quick"] = bool(args.quick)
    stem = "live_check_quick" if args.quick else "live_check"
    write_json(RESULTS_DIR / f"{stem}.json", res)
    plot(res, RESULTS_DIR / f"{stem}.png")
    summary = {k: v for k, v in res.items() if k not in ("rows", "serving_samples", "environment")}
    for k in ("switch_decided_s", "runner_up_serving_s", "every_request_answered",
              "corrected_within_60s", "requests", "unanswered", "errors", "before_switch",
              "after_runner_up_serves", "other_processes_cores"):  # fmt: skip
        print(f"  {k}: {summary[k]}")
    print(f"  live check: {res['live_check']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
