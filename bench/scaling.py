"""Throughput at SLO (InfScaler §V, Fig. 5): the runtime's own choice against whole-model
replication and one session, at P99 <= k x L0 (MLPerf LoadGen's server scenario).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``scaling.py``.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.models import (  # noqa: E402, F401 - pipeline, session: for the tests
    AUTOSCALE,
    MODEL_SETTINGS,
    PIPELINE_CASES,
    auto_pipeline,
    calibrate,
    model_inputs,
    pipeline,
    session,
)
from harness.scenarios import SERVER, p99_with_failures, poisson_times  # noqa: E402

NAME = "m"
CONFIGS = ("auto", "replication", "one-session", "eq1")
BASELINES = ("replication", "one-session")


def config_pipeline(config: str, model: str, slo_ms: float, cores: int) -> dict[str, Any]:
    """The pipeline dict a configuration deploys (see the method).

    Raises:
        ValueError: an unknown configuration.
    """
    if config in ("auto", "eq1"):
        cfg = auto_pipeline(model, NAME, slo_ms)
    elif config == "replication":
        cfg = pipeline(model, NAME, 1, 1, slo_ms, AUTOSCALE, max_instances=cores)
    elif config == "one-session":
        cfg = pipeline(model, NAME, 1, cores, None, None, whole=True)
    else:
        raise ValueError(f"unknown configuration {config!r}: use one of {CONFIGS}")
    # unset fields stay unset: a default written into the YAML would be a choice made for
    # the runtime (auto must leave K, threads and instances to it)
    return cfg.model_dump(mode="json", exclude_none=True, exclude_unset=True)


def measure_cap(model: str, feeds: dict) -> dict[str, Any]:
    """The former script's memory cap (``harness.models.cap_rule``) from the PSS of one
    1-thread instance of the whole model and of each Eq. 1 partition (K from
    ``MODEL_SETTINGS``), each served fresh after 3 requests."""
    out = {}
    for label, k in (("whole", 1), ("plan", MODEL_SETTINGS.get(model, {}).get("k", 2))):
        pipe = pipeline(model, NAME, k, 1, whole=k == 1).model_dump(mode="json", exclude_none=True)
        with harness.Sut([pipe]) as s:
            harness.scenarios.run(s.sock, NAME, feeds, "single_stream", duration_s=1.5)
            time.sleep(2.5)  # instances report their memory every second
            st = s.status()
        us = next(p for p in st["pipelines"] if p["name"] == NAME)["units"]
        us = [u for u in us if u["instances"]]
        out[label] = {"pss_mb": [u["instances"][0]["pss_mb"] for u in us],
                      "bottleneck": [u.get("bottleneck") or 0.0 for u in us],
                      "pool_mb": st["pool"]["mapped_mb"]}  # fmt: skip
    plan = out["plan"]
    b = max(range(len(plan["pss_mb"])), key=lambda i: plan["bottleneck"][i])
    pool = max(out["whole"]["pool_mb"], plan["pool_mb"])
    return harness.models.cap_rule(out["whole"]["pss_mb"][0], plan["pss_mb"], b, pool)


def units(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The served pipeline's units from ``status``, scalar fields only."""
    pipes = [p for p in status.get("pipelines", []) if p.get("name") == NAME]
    return [
        {k: v for k, v in u.items() if isinstance(v, (int, float, str, bool))}
        for p in pipes
        for u in p.get("units", [])
    ]


def cell_summary(rates: dict[str, float], ceiling_rps: float) -> dict[str, Any]:
    """One cell's comparison: ``rates`` (configuration -> max rate at SLO, /s) ->
    ``best_baseline`` (name and rate, None without a baseline), ``auto_vs_best`` and
    ``auto_vs_ceiling`` (None where a divisor is 0 or missing)."""
    base = {c: r for c, r in rates.items() if c in BASELINES}
    best = max(base, key=lambda c: base[c]) if base else None
    best_rps = base[best] if best else None
    auto = rates.get("auto")

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    return {**{f"{c}_rps": r for c, r in rates.items()}, "best_baseline": best,
            "best_baseline_rps": best_rps, "auto_vs_best": ratio(auto, best_rps),
            "ceiling_rps": ceiling_rps, "auto_vs_ceiling": ratio(auto, ceiling_rps)}  # fmt: skip


def run_cell(
    a: Any, res: harness.Result, model: str, feeds: dict, cal: dict, slo_x: float
) -> dict[str, Any]:
    """Every configuration's max rate at SLO = ``slo_x`` x L0 (one bisection each, the
    steps added to ``res``), and the cell's :func:`cell_summary`."""
    import slo_bound

    slo_ms = round(slo_x * cal["l0_ms"], 1)
    rates = {}
    for config in a.configs.split(","):
        pipe = config_pipeline(config, model, slo_ms, cal["cores"])
        args = [*a.sut_args, *(["--objective", "eq1"] if config == "eq1" else [])]

        def step(rate: float, pipe: dict = pipe, config: str = config, args: list = args) -> dict:
            with harness.Sut([pipe], args=args) as s:
                res.own_pids[:] = [s.pid]
                p = harness.scenarios.run(
                    s.sock, NAME, feeds, SERVER, rate, duration_s=a.duration_s,
                    warmup_s=a.warmup_s, bound_ms=slo_ms, seed=a.seed, shared_memory=a.shm,
                )  # fmt: skip
                p["units"] = units(s.status())
            verdict = "pass" if p["passed"] else "fail"
            print(f"  {config} {slo_x}x {rate:.2f}/s: P99 {p['p99_all_ms']} ms -> {verdict}")
            return p

        ideal = cal["ideal_rps"]
        found = harness.search.max_rate_at_slo(step, 1.1 * ideal, a.steps, first_rps=0.55 * ideal)
        rates[config] = found["max_rps"]
        for p in found["points"]:
            res.add(model=model, slo_x=slo_x, slo_ms=slo_ms, config=config, cap_mb=a.cap, **p)
    ceiling = round(slo_bound.mdc_max_rate(cal["cores"], cal["l0_ms"], slo_ms), 3)
    return {"model": model, "slo_x": slo_x, "cap_mb": a.cap, **cell_summary(rates, ceiling)}


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
    """A window's figures (the method): P99 of every request, late, refused, the
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
    finite = p99_all < math.inf
    return {"requests": len(rows), "refused": refused, "late": sum(x > slo_ms for x in lat),
            "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat else None,
            "p99_all_ms": round(p99_all, 2) if finite else None, "passed": bool(p99_all <= slo_ms),
            "ideal_fifo_p99_ms": round(ideal_p99, 2),
            "own_delay_p99_ms": round(p99_all - ideal_p99, 2) if finite else None,
            **{f"{k}_ms_p50_p99": pct(f"{k}_ms") for k in ("lag", "wait", "compute", "back")},
            "errors": sorted({r["error"][:160] for r in rows if "error" in r})[:3]}  # fmt: skip


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


def run_same_config(a: Any, res: harness.Result) -> None:
    """``--same-config``: calibration, auto's choice, then ``a.repeats`` rounds of the 3
    variants (:data:`VARIANTS`) at one rate, in one in-process ``Service``."""
    from infscaler.service.service import Service

    feeds = model_inputs(a.model)
    cal = calibrate(a.model, feeds, MODEL_SETTINGS[a.model]["n_l0"])
    slo_ms = a.slo_x * cal["l0_ms"]
    wake: dict[str, Any] = {}
    if a.cpu_wake_latency_us is not None:
        from infscaler.cli.service import wake_option

        wake["cpu_wake_latency_us"] = wake_option(a.cpu_wake_latency_us)
    with Service(
        state_dir=Path(tempfile.mkdtemp(prefix="isc-same-config-")), pool_mb=256, **wake
    ) as svc:
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
        out[v] = {**{k: [w[k] for w in mine] for k in ("p99_all_ms", "passed", "own_delay_p99_ms")},
                  "late_plus_refused": [w["late"] + w["refused"] for w in mine],
                  "vs_hand_median": round(float(np.median(ratios)), 3) if ratios else None}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=12.0)
    ap.add_argument("--models", default="resnet50", help="comma-separated model aliases")
    ap.add_argument("--slos", default=None, help="SLOs as multiples of L0 (1.5,2,3)")
    ap.add_argument("--configs", default="auto,replication,one-session", help=f"of {CONFIGS}")
    ap.add_argument("--steps", type=int, default=5, help="bisection steps per configuration")
    ap.add_argument("--warmup-s", type=float, default=6.0)
    ap.add_argument("--shm", action="store_true", help="inputs in a shared memory region")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="an `infscaler serve` option for every step (--serve-arg=--cpu-wake-latency-us=0)")  # fmt: skip
    ap.add_argument("--cap-mb", default=None,
                    help="serve under a memory cap: MB, or 'rule' (measured, per model)")  # fmt: skip
    ap.add_argument("--same-config", action="store_true", help="auto vs its hand twin, one rate")
    ap.add_argument("--load", type=float, default=0.35, help="--same-config: rate / capacity")
    ap.add_argument("--requests", type=int, default=600, help="--same-config: per window")
    ap.add_argument("--warm-s", type=float, default=8.0, help="--same-config: unmeasured, s")
    ap.add_argument("--repeats", type=int, default=3, help="--same-config: rounds")
    ap.add_argument("--cpu-wake-latency-us", default=None,
                    help="--same-config: the service's PM QoS CPU latency: µs, auto or none")  # fmt: skip

    def quick(a: Any) -> None:
        a.models, a.steps, a.warmup_s = a.models.split(",")[0], 2, 2.0
        a.slos = a.slos or (None if a.same_config else "3")
        a.requests, a.warm_s, a.repeats = 30, 2.0, 1

    a = harness.cli.parse(ap, argv, quick)
    if a.same_config:
        return main_same_config(ap, a)
    a.slos = a.slos or "1.5,2,3"
    if bad := set(a.configs.split(",")) - set(CONFIGS):
        ap.error(f"--configs: unknown {sorted(bad)}; choose from {','.join(CONFIGS)}")
    if a.cap_mb not in (None, "rule"):
        try:
            float(a.cap_mb)
        except ValueError:
            ap.error(f"--cap-mb: MB or 'rule', got {a.cap_mb!r}")
    res = harness.cli.start("scaling", a)
    for model in a.models.split(","):
        feeds = model_inputs(model)
        cal = calibrate(
            model, feeds, 8 if a.quick else MODEL_SETTINGS.get(model, {}).get("n_l0", 15)
        )
        res.summary.setdefault("calibration", {})[model] = cal
        print(f"== {model}: L0 {cal['l0_ms']} ms, ideal {cal['ideal_rps']}/s", flush=True)
        a.cap, a.sut_args = None, list(a.serve_arg)
        if a.cap_mb is not None:
            cap = measure_cap(model, feeds) if a.cap_mb == "rule" else {"cap_mb": float(a.cap_mb)}
            res.summary.setdefault("caps", {})[model] = cap
            dev = Path(tempfile.mkdtemp(prefix="isc-scaling-")) / "device.yaml"
            a.cap = cap["cap_mb"]
            a.sut_args += ["--device", str(harness.models.capped_device(a.cap, dev))]
            print(f"   memory cap {a.cap} MB: {cap}", flush=True)
        for slo_x in map(float, a.slos.split(",")):
            res.summary.setdefault("cells", []).append(run_cell(a, res, model, feeds, cal, slo_x))
    harness.cli.finish(res, a, plot)
    rows = [[c["model"], c["cap_mb"], c["slo_x"], *(c.get(f"{k}_rps") for k in CONFIGS),
             c["auto_vs_best"], c["ceiling_rps"]] for c in res.summary["cells"]]  # fmt: skip
    harness.print_table(["model", "cap MB", "SLO x", *CONFIGS, "auto/best", "ceiling"], rows)
    return 0


def main_same_config(ap: Any, a: Any) -> int:
    """``--same-config``: at one rate (``--load`` x capacity), ``auto`` against the hand
    configuration it chose, from the same arrivals, in one in-process ``Service`` (the
    per-request trace splits each latency into the sender's lag, the wait, the compute
    and the hand-back): ``auto``, ``hand`` (auto's choice, no SLO, no autoscaler) and
    ``hand+slo`` (admission only), each deployed anew per window, in turns, one Poisson
    seed; the first of ``--models`` and ``--slos`` (default 2). An ideal FIFO replay of
    the measured compute times gives the P99 no runtime could beat; ``own_delay`` is the
    P99 above it. Writes ``same_config_<model>_<k>x``; exit 1 when auto chose no
    whole-model shape. More: bench/HISTORY.md, "same_config.py"."""
    a.model, a.slo_x = a.models.split(",")[0], float((a.slos or "2").split(",")[0])
    if a.model in PIPELINE_CASES or a.model not in MODEL_SETTINGS:
        ap.error("--same-config needs a model of MODEL_SETTINGS (a whole-model hand twin)")
    res = harness.cli.start(f"same_config_{a.model}_{a.slo_x:g}x", a)
    run_same_config(a, res)
    if "error" in res.summary:
        harness.cli.finish(res, a, None)
        print(res.summary["error"])
        return 1
    res.summary["variants"] = compare(res.points)
    harness.cli.finish(res, a, lambda d, p: harness.plot(
        d["points"], p, x="repeat", y=["p99_all_ms", "ideal_fifo_p99_ms"], by="variant",
        hline_key="slo_ms", ylabel="ms"))  # fmt: skip
    harness.print_table(
        ["variant", "P99 of all (ms)", "late + refused", "own delay P99 (ms)", "vs hand"],
        [[v, s["p99_all_ms"], s["late_plus_refused"], s["own_delay_p99_ms"], s["vs_hand_median"]]
         for v, s in res.summary["variants"].items()],
    )  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Each configuration's steps: P99 (failures as late) against the offered rate, one
    panel per model and SLO, the SLO as a line."""
    pts = [{**p, "cell": f"{p['model']} {p['slo_x']}x"} for p in data["points"]]
    harness.plot(pts, path, x="rate_rps", y="p99_all_ms", by="config", panel="cell",
                 hline_key="slo_ms", xlabel="Poisson rate, /s", ylabel="P99, ms")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
