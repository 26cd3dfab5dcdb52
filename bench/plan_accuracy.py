"""How well the planner's simulator predicts a served pipeline (issue 5: "its prediction
error against measured runs is reported").

Model: ResNet-50 (the onnx wheel's architecture, seeded random weights), partitioned by
Eq. 1 into K = 2 operator groups at deploy. Each unit is profiled in-process
(:func:`infscaler.runtime.planning.unitprofile.profile_pipeline`: onnxruntime CPU, 1 thread, the
empirical per-call times), then for each configuration (instances per unit) and offered
rate the planner's simulator (:func:`infscaler.runtime.planning.planner.predict`) predicts P50,
P99 and throughput for a Poisson arrival sequence (with and without the simulator's CPU
contention model), and a fresh ``infscaler serve`` (``harness.Sut``) with the same
instances is sent the SAME arrival times open loop (``LoadGenerator.replay``, over the
socket: the front end and HTTP are in the measured latency). Error = (predicted -
measured) / measured, per metric. Rates are fractions of the configuration's predicted
capacity (1 / the slowest unit's per-instance time).

``--from-search`` measures instead the planner's search predicted vs served, per model
(``--models``, default ResNet-50, VGG-19) and SLO (``--slos`` x the 1-thread L0): the
model stage measured and searched (``stageprofile.search_measured``, no rate); the
winner, the best replication (K = 1, t = 1), the best one session and the best Eq. 1
plan with K > 1 (``--quick``: the winner and the runner-up) each served on a fresh
``Sut`` with fixed instances, all sent the SAME Poisson arrivals at the winner's
predicted max rate; goodput (answers within the SLO per s) against the simulator's
prediction, and the bottleneck's share of the FLOPs, winner vs Eq. 1. Writes
``plan_accuracy_search[_quick]``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import replay_summary  # noqa: E402


def serve(served: dict, x: dict, times: np.ndarray, res: harness.Result) -> dict[str, Any]:
    """A fresh service of ``served``, warmed, sent ``times``: measured figures."""
    from infscaler.api.loadgen import LoadGenerator

    with harness.Sut([served]) as s:
        res.own_pids[:] = [s.pid]
        harness.scenarios.run(s.sock, "r50", x, harness.scenarios.SINGLE_STREAM, duration_s=2.0)
        rows = LoadGenerator(s.sock, "r50", x).replay(times, timeout_s=120.0)
    span = max(r["sent_s"] for r in rows) + max(r["ms"] for r in rows) / 1e3
    m = replay_summary(rows, 1e12, span)
    return {**m, "throughput_rps": round(m["answered"] / span, 3)}


def pick(candidates, pred) -> object | None:
    return next((c for c in candidates if pred(c)), None)


def deploy_config(name: str, model: Path, shapes, cand, state: Path, device) -> dict:
    """A pipeline dict serving ``cand`` (plan dir with its cuts, threads, instances)."""
    from infscaler.partitioner.api import partition_model

    cuts = cand.cuts[0]
    inst = [c.total for u, c in zip(cand.units, cand.config, strict=True) if u.served]
    stage: dict = {"name": "m", "threads": cand.threads[0]}
    if cuts:
        plan_dir = state / f"{name}-{'-'.join(map(str, cuts))}"
        if not (plan_dir / "plan.yaml").is_file():
            partition_model(
                model, shapes=shapes, cuts=list(cuts), device=device, out_dir=plan_dir, force=True
            )
        stage.update(plan=str(plan_dir), instances=inst)
    else:
        stage.update(model=str(model), instances=inst[0])
        if shapes:
            stage["shapes"] = shapes
    return {"name": name, "stages": [stage]}


def run_cell(args: Any, res: harness.Result, m: str, path: Path, shapes: Any, st: Any,
             slo: float, f: float, arr: np.ndarray, cap: Any, cores: int, state: Path,
             profile: Any) -> None:  # fmt: skip
    """One model and SLO: the search, its candidates served (module docstring)."""
    from infscaler.api.loadgen import LoadGenerator
    from infscaler.runtime.planning.arrivals import poisson
    from infscaler.runtime.planning.planner import predict
    from infscaler.runtime.planning.stageprofile import search_measured

    out, stages = search_measured([st], [path], slo, cap, shapes=[shapes], cores=cores)
    st, best = stages[0], out.best
    if best is None:
        print(f"{m} SLO {f}x: no candidate meets it")
        return
    eq1 = st.eq1_cuts(3)
    res.summary["bottleneck_shares"].append(
        {"model": m, "slo_factor": f, "winner_cuts": list(best.cuts[0]),
         "winner_share": round(best.share[0], 4), "eq1_cuts": list(eq1),
         "eq1_share": round(st.share(eq1), 4)}
    )  # fmt: skip
    tmax = max(st.whole_ms)
    cands = {
        "winner": best,
        "replication": pick(out.candidates, lambda c: not c.cuts[0] and c.threads[0] == 1),
        "one session": pick(out.candidates, lambda c: not c.cuts[0] and c.threads[0] == tmax
                            and c.config[-1].total == 1),
        "eq1 K>1": pick(out.candidates, lambda c: c.cuts[0] and "eq1" in c.objectives[0]),
    }  # fmt: skip
    if args.quick:  # the winner and the best other configuration
        cands = {"winner": best, "runner-up": next((c for c in out.candidates[1:] if c.fits), None)}
    seen: set[str] = set()
    rate = best.max_rate_rps or 1.0
    times = poisson(rate, args.duration_s, seed=1)
    for label, c in cands.items():
        if c is None or not c.fits or c.label() in seen:
            continue  # none, or the same configuration as one above
        seen.add(c.label())
        pred = predict(list(c.units), list(c.config), times, slo_ms=slo, handover_ms=0.1, seed=1,
                       cpu_cores=cores)  # fmt: skip
        pred_good = (pred.slo_attainment or 0.0) * times.size / args.duration_s
        name = f"{m}-{label.replace(' ', '-').replace('>', '')}"
        cfg = deploy_config(name, path, shapes, c, state, profile)
        with harness.Sut([cfg]) as s:
            res.own_pids[:] = [s.pid]
            x = harness.scenarios.model_inputs(s.sock, name)
            x = {k: arr for k in x}
            harness.scenarios.run(s.sock, name, x, harness.scenarios.SINGLE_STREAM, duration_s=2.0)
            rows = LoadGenerator(s.sock, name, x).replay(times, timeout_s=120.0)
        ok = [r["ms"] for r in rows if r["outcome"] == "ok"]
        good = sum(v <= slo for v in ok) / args.duration_s
        err = (pred_good - good) / good if good > 0 else None
        res.add(model=m, slo_factor=f, slo_ms=round(slo, 2), config=label, candidate=c.label(),
                offered_rps=round(rate, 3), predicted_goodput_rps=round(pred_good, 3),
                measured_goodput_rps=round(good, 3), error=None if err is None else round(err, 4),
                predicted_p99_ms=pred.p99_ms, search_max_rate_rps=c.max_rate_rps,
                measured_p99_ms=round(float(np.percentile(ok, 99)), 2) if ok else None)  # fmt: skip
        print(f"{m} SLO {f}x {label}: {c.label()}: goodput predicted {pred_good:.2f}/s, "
              f"measured {good:.2f}/s (error {err})", flush=True)  # fmt: skip


def main_search(args: Any) -> int:
    """``--from-search`` (module docstring): per model and SLO, :func:`run_cell`."""
    from infscaler.base.device import load_profile
    from infscaler.base.models import MODELS, resolve_model
    from infscaler.partitioner.profiler import usable_cores
    from infscaler.runtime.planning.planner import ModelStage, cpu_cores, resource_cap
    from infscaler.runtime.planning.stageprofile import measure_model_stage

    res = harness.cli.start("plan_accuracy_search", args)
    profile = load_profile("cpu-host")
    cap = resource_cap(profile)
    cores = cpu_cores(profile) or usable_cores()
    state = Path(tempfile.mkdtemp(prefix="isc-bench-plan-search-"))
    shares = res.summary.setdefault("bottleneck_shares", [])
    for m in args.models.split(","):
        path = resolve_model(m)
        shapes = MODELS[m].shapes
        st: ModelStage = measure_model_stage(
            path, name="m", shapes=shapes, threads=sorted({1, 2, cores})
        )
        l0 = st.whole_ms[1]
        arr = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        for f in map(float, args.slos.split(",")):
            run_cell(args, res, m, path, shapes, st, f * l0, f, arr, cap, cores, state, profile)
    harness.cli.finish(res, args, plot_search if res.points else None)
    harness.print_table(
        ["model", "SLO", "config", "pred goodput", "meas goodput", "error"],
        [[r["model"], f"{r['slo_factor']}x", r["config"], r["predicted_goodput_rps"],
          r["measured_goodput_rps"], r["error"]] for r in res.points],
    )  # fmt: skip
    for s in shares:
        print(f"{s['model']} {s['slo_factor']}x: bottleneck share of FLOPs: winner "
              f"{s['winner_share']:.1%} (cuts {s['winner_cuts']}), Eq. 1 {s['eq1_share']:.1%}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=30.0, quiet_wait_s=120.0)
    ap.add_argument("--from-search", action="store_true", help="the search's candidates served")
    ap.add_argument("--models", default="resnet50,vgg19", help="--from-search: models")
    ap.add_argument("--slos", default="1.5,2,3", help="--from-search: SLOs as multiples of L0")

    def quick(a: Any) -> None:
        a.duration_s = 10.0 if a.from_search else 15.0
        a.models, a.slos = "resnet50", "3"

    args = harness.cli.parse(ap, argv, quick)
    if args.from_search:
        return main_search(args)
    from infscaler.base.config import pipeline_for_model
    from infscaler.base.models import resolve_model
    from infscaler.runtime.planning.arrivals import poisson
    from infscaler.runtime.planning.planner import predict
    from infscaler.runtime.planning.simulator import UnitConfig
    from infscaler.runtime.planning.unitprofile import profile_pipeline
    from infscaler.runtime.serving.pipeline import compile_pipeline

    res = harness.cli.start("plan_accuracy", args)
    state = Path(tempfile.gettempdir()) / "isc-bench-state"
    cfg = pipeline_for_model(resolve_model("resnet50"), name="r50", partitions=2)
    compiled = compile_pipeline(cfg, state_dir=state)
    arr = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    x = {compiled.inputs[0].name: arr}
    prof = profile_pipeline(compiled, x, repeats=20, warmup=3)
    units = list(prof.units)
    per_unit = [u.fastest().mean_ms for u in units]
    configs = [[1, 1], [2, 1] if per_unit[0] >= per_unit[1] else [1, 2]]
    fractions = [0.5, 0.85]
    if args.quick:
        configs, fractions = configs[:1], [0.6]
    res.summary["unit_profile"] = prof.to_dict()
    ncores = len(os.sched_getaffinity(0))  # the simulator's contention model shares these
    for inst in configs:
        capacity = min(n * 1000.0 / ms for n, ms in zip(inst, per_unit, strict=True))
        served = cfg.model_dump(mode="json", exclude_none=True)
        served["stages"][0]["instances"] = inst
        for frac in fractions:
            rate = frac * capacity
            times = poisson(rate, args.duration_s, seed=1)
            preds = {label: predict(units, [UnitConfig({"cpu": n}) for n in inst], times,
                                    handover_ms=0.1, seed=1, cpu_cores=cores)
                     for label, cores in (("predicted", None), ("predicted_contention", ncores))}  # fmt: skip
            meas = serve(served, x, times, res)
            row = {"instances": inst, "offered_rps": round(rate, 2), "fraction_of_capacity": frac,
                   "measured": meas}  # fmt: skip
            for label, pred in preds.items():
                p = {"throughput_rps": round(pred.throughput_rps, 3),
                     "p50_ms": None if pred.p50_ms is None else round(pred.p50_ms, 2),
                     "p99_ms": None if pred.p99_ms is None else round(pred.p99_ms, 2)}  # fmt: skip
                row[label] = p
                row["error" if label == "predicted" else "error_contention"] = {
                    k: round((p[k] - meas[k]) / meas[k], 4)
                    for k in p
                    if p[k] is not None and meas.get(k)
                }
            res.add(config=str(inst), p99_error=row["error"].get("p99_ms"),
                    p99_error_contention=row["error_contention"].get("p99_ms"),
                    throughput_error=row["error"].get("throughput_rps"), **row)  # fmt: skip
            print(f"instances {inst} at {rate:.1f}/s: P99 predicted {row['predicted']['p99_ms']} "
                  f"ms, measured {meas['p99_ms']} ms (error {row['error'].get('p99_ms')})", flush=True)  # fmt: skip
    harness.cli.finish(res, args, plot)
    return 0


def plot_search(data: dict, path: Path) -> None:
    """Predicted and measured goodput per configuration (index), one panel per model and
    SLO."""
    pts = [{**p, "cell": f"{p['model']} {p['slo_factor']}x", "i": i}
           for i, p in enumerate(data["points"])]  # fmt: skip
    harness.plot(pts, path, x="i", y=["predicted_goodput_rps", "measured_goodput_rps"],
                 panel="cell", xlabel="configuration (points[i].config)", ylabel="goodput, /s")  # fmt: skip


def plot(data: dict, path: Path) -> None:
    """The P99 and throughput errors (predicted - measured) / measured against the offered
    rate, one line per configuration."""
    harness.plot(data["points"], path, x="offered_rps",
                 y=["p99_error", "p99_error_contention", "throughput_error"], by="config",
                 hlines={"exact": 0.0}, xlabel="offered rate, /s",
                 ylabel="(predicted - measured) / measured")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
