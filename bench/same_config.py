"""``auto`` against the hand configuration it chose, at one rate, from the same arrivals
(the runtime is never worse than what a user could configure by hand).

``scaling.py`` compares configurations by bisection, one draw each; when ``auto`` chose
a baseline's shape that compares two draws. Here, at one rate, in one in-process
``Service`` (the per-request trace splits each latency into the sender's lag, the wait,
the compute and the hand-back): ``auto`` (only ``slo`` and ``autoscale``), ``hand``
(the configuration auto chose, no SLO, no autoscaler) and ``hand+slo`` (admission
only), each deployed anew per window, in turns, all meeting the same Poisson arrivals
(one seed). An ideal FIFO replay of the measured compute times gives the P99 no runtime
could beat; ``own_delay`` is the P99 above it. More: bench/HISTORY.md, "same_config.py".
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import MODEL_SETTINGS, PIPELINE_CASES, auto_pipeline, model_inputs  # noqa: E402
from harness.scenarios import p99_with_failures, poisson_times  # noqa: E402

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
    """One window at ``rate`` requests/s through ``svc.submit`` (Poisson, seed 1, the
    first ``warm_s`` s unmeasured): per measured request its scheduled arrival (s),
    latency (ms, None if refused), error, and where answered the lag, wait, compute and
    hand-back (ms), compute start / end (s) and the instances that ran it."""
    times = poisson_times(rate, warm_s + 1.5 * n / rate + 10.0, seed=1)
    done: dict[int, tuple[int, Any, str]] = {}  # id -> (monotonic ns, trace or None, error)
    submit: dict[int, int] = {}
    t0 = time.perf_counter()
    measured = [i for i, t in enumerate(times) if t >= warm_s][:n]
    for i, t in enumerate(times[: measured[-1] + 1]):
        while (left := t0 + t - time.perf_counter()) > 0:
            time.sleep(min(left, 0.05))
        submit[i] = time.monotonic_ns()
        try:
            fut = svc.submit(name, feeds)
        except Exception as exc:  # noqa: BLE001 - a 503 at admission is a failed request
            done[i] = (time.monotonic_ns(), None, str(exc)[:200])
            continue

        def fin(f: Any, i: int = i) -> None:
            exc = f.exception()
            done[i] = (time.monotonic_ns(), None if exc else f.result().trace, str(exc or "")[:200])

        fut.add_done_callback(fin)
    end = time.monotonic() + 60.0
    while len(done) < len(submit) and time.monotonic() < end:
        time.sleep(0.05)
    rows = []
    for i in measured:
        sched_ns = (t0 + times[i]) * 1e9  # perf_counter and monotonic_ns: CLOCK_MONOTONIC
        at_ns, trace, err = done.get(i, (0, None, "unanswered"))
        row: dict[str, Any] = {"arrival_s": float(times[i]),
                               "latency_ms": None if trace is None else (at_ns - sched_ns) / 1e6}  # fmt: skip
        if trace is None:
            row["error"] = err
        else:
            start, stop = int(trace[:, 2].min()), int(trace[:, 3].max())
            row.update(lag_ms=(submit[i] - sched_ns) / 1e6, wait_ms=(start - submit[i]) / 1e6,
                       compute_ms=float((trace[:, 3] - trace[:, 2]).sum()) / 1e6,
                       back_ms=(at_ns - stop) / 1e6, start_s=start / 1e9 - t0,
                       end_s=stop / 1e9 - t0, instances=sorted({int(x) for x in trace[:, 1]}))  # fmt: skip
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
    p99_all = p99_with_failures(lat, refused)

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
    SLO for admission), as a pipeline config."""
    from infscaler.base.config import load_pipeline

    return load_pipeline(harness.models.static_pipeline(model, name, threads, instances, slo_ms))


def config_snapshot(svc: Any, dep: Any, window_s: float) -> list[dict[str, Any]]:
    """The deployment's served units over the last ``window_s`` s (the service's
    monitor): name, engine, threads, live instances, compute P50 (ms)."""
    from infscaler.runtime.scaling.monitor import Monitor

    m = Monitor(svc).pipeline(dep, max(1.0, window_s))
    served = {u.index for u in dep.pipeline.served_units()}
    return [{"unit": u.name, "engine": u.engine, "threads": int(u.threads),
             "instances": sum(um.instances.values()), "service_ms": um.compute_p50_ms}
            for u, um in zip(dep.pipeline.units, m.units, strict=True) if u.index in served]  # fmt: skip


def service_ms(model: str, feeds: dict[str, np.ndarray], threads: int, n: int = 20) -> float:
    """Median in-process latency of one session at ``threads`` threads, ms (the
    profiler's own timing as served: ``profiler.measure_latency``, 2 warm-up runs)."""
    from infscaler.base.models import resolve_model
    from infscaler.partitioner import profiler

    ms, _ = profiler.measure_latency(
        resolve_model(model), feeds, warmup=2, repeats=n, threads=threads
    )
    return float(ms)


def run(a: Any, res: harness.Result) -> None:
    """Calibration, auto's choice, then ``a.repeats`` rounds of the 3 variants."""
    from infscaler.service.service import Service

    feeds = model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, MODEL_SETTINGS[a.model]["n_l0"])
    slo_ms = a.slo_x * cal["l0_ms"]
    wake: dict[str, Any] = {}
    if a.cpu_wake_latency_us is not None:
        from infscaler.cli.service import wake_option

        wake["cpu_wake_latency_us"] = wake_option(a.cpu_wake_latency_us)
    with Service(state_dir=Path("/tmp/isc-same-config-state"), pool_mb=256, **wake) as svc:
        dep = svc.deploy(auto_pipeline(a.model, "auto", slo_ms))
        time.sleep(2.0)
        chosen = config_snapshot(svc, dep, 1.0)
        svc.undeploy("auto")
        if len(chosen) != 1:
            res.summary.update(error=f"auto chose {len(chosen)} units: no whole-model hand twin",
                               auto_config=chosen)  # fmt: skip
            return
        threads, servers = chosen[0]["threads"], chosen[0]["instances"]
        d_ms = service_ms(a.model, feeds, threads)
        rate = a.load * servers * 1000.0 / d_ms
        res.summary.update(calibration=cal, slo_ms=round(slo_ms, 2), auto_config=chosen,
                           service_ms=round(d_ms, 2), rate_rps=round(rate, 3))  # fmt: skip
        print(f"L0 {cal['l0_ms']} ms, SLO {slo_ms:.1f} ms; auto: {servers} x {threads} "
              f"thread(s), D {d_ms:.1f} ms; rate {rate:.2f}/s", flush=True)  # fmt: skip
        for rep in range(a.repeats):
            for v in VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]:
                name = f"{v.replace('+', '-')}-{rep}"
                cfg = (auto_pipeline(a.model, name, slo_ms) if v == "auto" else
                       hand_pipeline(a.model, name, threads, servers,
                                     slo_ms if v == "hand+slo" else None))  # fmt: skip
                d = svc.deploy(cfg)
                rows = window(svc, name, feeds, rate, a.requests, a.warm_s)
                ran = config_snapshot(svc, d, 5.0)
                svc.undeploy(name)
                w = res.add(variant=v, repeat=rep, config=ran, slo_ms=round(slo_ms, 2),
                            **summarise(rows, slo_ms, servers))  # fmt: skip
                print(f"  {rep} {v:9s} P99 of all {w['p99_all_ms']} ms (ideal FIFO "
                      f"{w['ideal_fifo_p99_ms']}), late {w['late']}, refused {w['refused']}",
                      flush=True)  # fmt: skip


def compare(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: P99s, passes, late + refused, own delay, and the median P99 ratio
    to ``hand`` of the same repeat."""
    out = {}
    for v in VARIANTS:
        mine = [w for w in windows if w["variant"] == v]
        ratios = []
        for w in mine:
            h = next(x for x in windows if x["variant"] == "hand" and x["repeat"] == w["repeat"])
            if w["p99_all_ms"] and h["p99_all_ms"]:
                ratios.append(w["p99_all_ms"] / h["p99_all_ms"])
        out[v] = {
            "p99_all_ms": [w["p99_all_ms"] for w in mine],
            "passed": [w["passed"] for w in mine],
            "late_plus_refused": [w["late"] + w["refused"] for w in mine],
            "own_delay_p99_ms": [w["own_delay_p99_ms"] for w in mine],
            "vs_hand_median": round(float(np.median(ratios)), 3) if ratios else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="resnet50", choices=sorted(MODEL_SETTINGS))
    ap.add_argument("--slo-x", type=float, default=2.0, help="SLO = this x L0")
    ap.add_argument("--load", type=float, default=0.35, help="rate / capacity")
    ap.add_argument("--requests", type=int, default=600, help="measured per window")
    ap.add_argument("--warm-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu-wake-latency-us", default=None,
                    help="the service's PM QoS CPU latency setting: µs, auto or none (default: "
                    "the Service's); a fixed one (0: held awake) is the same for every variant")  # fmt: skip

    def quick(a: Any) -> None:
        a.requests, a.warm_s, a.repeats = 30, 2.0, 1

    a = harness.cli.parse(ap, argv, quick)
    if a.model in PIPELINE_CASES:
        ap.error("a pipeline case has no whole-model hand twin here; choose a model")
    res = harness.cli.start(f"same_config_{a.model}_{a.slo_x:g}x", a)
    run(a, res)
    if "error" in res.summary:
        harness.cli.finish(res, a, None)
        print(res.summary["error"])
        return 1
    res.summary["variants"] = compare(res.points)
    harness.cli.finish(res, a, plot)
    harness.print_table(
        ["variant", "P99 of all (ms)", "late + refused", "own delay P99 (ms)", "vs hand"],
        [[v, s["p99_all_ms"], s["late_plus_refused"], s["own_delay_p99_ms"], s["vs_hand_median"]]
         for v, s in res.summary["variants"].items()],
    )  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Per variant: the P99 of every request and the ideal FIFO replay's against the
    repeat, the SLO as a line."""
    harness.plot(data["points"], path, x="repeat", y=["p99_all_ms", "ideal_fifo_p99_ms"],
                 by="variant", hline_key="slo_ms", ylabel="ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
