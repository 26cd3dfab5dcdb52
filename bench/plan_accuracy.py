"""How well the planner's simulator predicts a served pipeline (issue 5: "its prediction
error against measured runs is reported").

Model: ResNet-50 (the onnx wheel's architecture, seeded random weights), partitioned by
Eq. 1 into K = 2 operator groups at deploy. Each unit is profiled in-process
(:func:`infscaler.runtime.planning.unitprofile.profile_pipeline`: onnxruntime CPU, 1 thread, the
empirical per-call times), then for each configuration (instances per unit) and offered
rate the planner's simulator (:func:`infscaler.runtime.planning.planner.predict`) predicts P50,
P99 and throughput for a Poisson arrival sequence, and the service serves the SAME
arrival times open-loop (one submitter thread sleeping until each arrival; in-process
``Service.submit``, no HTTP) with the same instances. Error = (predicted - measured) /
measured, per metric.

Rates are fractions of the configuration's predicted capacity (1 / the slowest unit's
per-instance time), so each configuration is compared lightly and heavily loaded.

Writes ``results/plan_accuracy.json`` and ``.png`` (``_quick`` with --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    process_cpu_seconds,
    wait_for_quiet,
    write_json,
)


def _own_cpu_seconds() -> float:
    """This process plus its exited children (the service's instances, once stopped)."""
    import os
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return process_cpu_seconds([os.getpid()]) + ru.ru_utime + ru.ru_stime


def serve_open_loop(svc, name: str, x: dict[str, np.ndarray], times: np.ndarray) -> dict:
    """Submit at ``times`` (s from start), return measured latencies and throughput."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    futs = []
    t0 = time.monotonic()

    def done(f, t_sub: float) -> None:
        try:
            f.result()
            with lock:
                lat.append((time.monotonic() - t_sub) * 1e3)
        except Exception as exc:  # noqa: BLE001 - counted
            with lock:
                errors.append(str(exc))

    for t in times:
        wait = t0 + float(t) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t_sub = time.monotonic()
        f = svc.submit(name, x, timeout_s=120)
        f.add_done_callback(lambda f, t_sub=t_sub: done(f, t_sub))
        futs.append(f)
    for f in futs:
        with contextlib.suppress(Exception):  # recorded by the callback
            f.result(timeout=300)
    wall = time.monotonic() - t0
    a = np.asarray(lat)
    return {
        "completed": int(a.size),
        "errors": len(errors),
        "throughput_rps": round(a.size / wall, 3),
        "p50_ms": round(float(np.percentile(a, 50)), 2) if a.size else None,
        "p99_ms": round(float(np.percentile(a, 99)), 2) if a.size else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one configuration, one rate, 15 s")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per trial")
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON")
    args = ap.parse_args()
    suffix = "_quick" if args.quick else ""
    out_json = RESULTS_DIR / f"plan_accuracy{suffix}.json"
    if args.replot:
        plot(out_json)
        return 0
    default_cache_dir()
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import resolve_model
    from infscaler.runtime.planning.arrivals import poisson
    from infscaler.runtime.planning.planner import predict
    from infscaler.runtime.planning.simulator import UnitConfig
    from infscaler.runtime.planning.unitprofile import profile_pipeline
    from infscaler.runtime.serving.pipeline import compile_pipeline
    from infscaler.service.service import Service

    env = environment()
    quiet = wait_for_quiet(120.0)
    steal0 = cpu_steal_seconds()
    foreign = ForeignLoad(_own_cpu_seconds)
    state = Path(tempfile.gettempdir()) / "isc-bench-state"
    model = resolve_model("resnet50")
    cfg = pipeline_for_model(model, name="r50", partitions=2)
    compiled = compile_pipeline(cfg, state_dir=state)
    arr = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    x = {compiled.inputs[0].name: arr}
    prof = profile_pipeline(compiled, x, repeats=20, warmup=3)
    units = list(prof.units)
    per_unit = [u.fastest().mean_ms for u in units]
    configs = [[1, 1], [2, 1] if per_unit[0] >= per_unit[1] else [1, 2]]
    fractions = [0.5, 0.85]
    duration = args.duration
    if args.quick:
        configs, fractions, duration = configs[:1], [0.6], 15.0
    rows = []
    ncores = len(os.sched_getaffinity(0))  # the simulator's contention model shares these
    for inst in configs:
        capacity = min(n * 1000.0 / ms for n, ms in zip(inst, per_unit, strict=True))
        data = cfg.model_dump(exclude_none=True)
        data["stages"][0]["instances"] = inst
        from infscaler.base.config import validate_pipeline

        served = validate_pipeline(data)
        with Service(state_dir=state, control_path="auto", pool_mb=256) as svc:
            svc.deploy(served)
            for _ in range(10):
                svc.infer("r50", x)
            for frac in fractions:
                rate = frac * capacity
                times = poisson(rate, duration, seed=1)
                preds = {
                    label: predict(
                        units,
                        [UnitConfig({"cpu": n}) for n in inst],
                        times,
                        handover_ms=0.1,
                        seed=1,
                        cpu_cores=cores,
                    )
                    for label, cores in (("predicted", None), ("predicted_contention", ncores))
                }
                meas = serve_open_loop(svc, "r50", x, times)
                row = {
                    "instances": inst,
                    "offered_rps": round(rate, 2),
                    "fraction_of_capacity": frac,
                    "measured": meas,
                }
                for label, pred in preds.items():
                    p = {
                        "throughput_rps": round(pred.throughput_rps, 3),
                        "p50_ms": round(pred.p50_ms, 2) if pred.p50_ms is not None else None,
                        "p99_ms": round(pred.p99_ms, 2) if pred.p99_ms is not None else None,
                    }
                    row[label] = p
                    row["error" if label == "predicted" else "error_contention"] = {
                        k: round((p[k] - meas[k]) / meas[k], 4)
                        for k in p
                        if p[k] is not None and meas.get(k)
                    }
                p, err = row["predicted"], row["error"]
                rows.append(row)
                print(
                    f"instances {inst} at {rate:.1f}/s: P99 predicted {p['p99_ms']} ms, "
                    f"measured {meas['p99_ms']} ms (error {err.get('p99_ms')}); throughput "
                    f"{p['throughput_rps']} vs {meas['throughput_rps']}/s; with contention "
                    f"({ncores} cores) P99 {row['predicted_contention']['p99_ms']} ms (error "
                    f"{row['error_contention'].get('p99_ms')})",
                    flush=True,
                )
    result = {
        "benchmark": "plan_accuracy",
        "what": __doc__.splitlines()[0],
        **env,
        "model": "resnet50 (random weights), K=2 at deploy",
        "unit_profile": prof.to_dict(),
        "duration_s": duration,
        "rows": rows,
        "host_noise": host_noise(quiet, foreign.cores(), steal0),
    }
    write_json(out_json, result)
    plot(out_json)
    return 0


def plot(path: Path) -> None:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.loads(path.read_text())
    rows = d["rows"]
    labels = [f"{r['instances']}\n{r['offered_rps']:.0f}/s" for r in rows]
    xs = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "p99_ms", "P99 ms"), (axes[1], "throughput_rps", "req/s")):
        ax.bar(xs - 0.27, [r["predicted"][key] or 0 for r in rows], 0.27, label="simulator")
        if all("predicted_contention" in r for r in rows):
            ax.bar(
                xs,
                [r["predicted_contention"][key] or 0 for r in rows],
                0.27,
                label="simulator, CPU contention",
            )
        ax.bar(xs + 0.27, [r["measured"][key] or 0 for r in rows], 0.27, label="served")
        ax.set_xticks(xs, labels)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("Planner prediction vs served ResNet-50 K=2 (instances per unit, offered rate)")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    sys.exit(main())
