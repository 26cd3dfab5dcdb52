"""The planner's search (issue 15) predicted vs served: goodput of the winner and of the
hand configurations it competes with, at the same Poisson load.

Per model (ResNet-50; VGG-19 too without --quick) and P99 SLO (a factor of the model's
own 1-thread latency L0, as bench/scaling.py):

1. measure the model stage and run the search with measured partitions
   (:func:`infscaler.runtime.planning.stageprofile.search_measured`; no rate: candidates are
   scored by their max rate whose simulated P99 <= SLO);
2. take the winner, the best replication (K = 1, t = 1), the best one session
   (K = 1, one instance, all cores) and the best Eq. 1 plan with K > 1 (each the
   search's own best instances for it; a configuration listed twice is served once;
   --quick: the winner and the runner-up);
3. offer every one the SAME Poisson arrivals at the winner's predicted max rate, each on
   a fresh ``infscaler serve`` (``harness.Sut``; fixed instances, no autoscaler; open
   loop through ``LoadGenerator.replay``), and compare the goodput (answers within the
   SLO per second) with the simulator's prediction for those arrivals. Error =
   (predicted - measured) / measured.

Also the bottleneck partition's share of the FLOPs of the winner vs Eq. 1's own plan.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=30.0, quiet_wait_s=120.0)
    ap.add_argument("--models", default="resnet50,vgg19")
    ap.add_argument("--slos", default="1.5,2,3", help="SLOs as multiples of L0")

    def quick(a: Any) -> None:
        a.models, a.slos, a.duration_s = "resnet50", "3", 10.0

    args = harness.cli.parse(ap, argv, quick)
    from infscaler.base.device import load_profile
    from infscaler.base.models import MODELS, resolve_model
    from infscaler.partitioner.profiler import usable_cores
    from infscaler.runtime.planning.planner import ModelStage, cpu_cores, resource_cap
    from infscaler.runtime.planning.stageprofile import measure_model_stage

    res = harness.cli.start("plan_search", args)
    profile = load_profile("cpu-host")
    cap = resource_cap(profile)
    cores = cpu_cores(profile) or usable_cores()
    state = Path(tempfile.gettempdir()) / "isc-bench-plan-search"
    state.mkdir(parents=True, exist_ok=True)
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
    harness.cli.finish(res, args, plot if res.points else None)
    harness.print_table(
        ["model", "SLO", "config", "pred goodput", "meas goodput", "error"],
        [[r["model"], f"{r['slo_factor']}x", r["config"], r["predicted_goodput_rps"],
          r["measured_goodput_rps"], r["error"]] for r in res.points],
    )  # fmt: skip
    for s in shares:
        print(f"{s['model']} {s['slo_factor']}x: bottleneck share of FLOPs: winner "
              f"{s['winner_share']:.1%} (cuts {s['winner_cuts']}), Eq. 1 {s['eq1_share']:.1%}")  # fmt: skip
    return 0


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


def plot(data: dict, path: Path) -> None:
    """Predicted and measured goodput per configuration (index), one panel per model and
    SLO."""
    pts = [{**p, "cell": f"{p['model']} {p['slo_factor']}x", "i": i}
           for i, p in enumerate(data["points"])]  # fmt: skip
    harness.plot(pts, path, x="i", y=["predicted_goodput_rps", "measured_goodput_rps"],
                 panel="cell", xlabel="configuration (points[i].config)", ylabel="goodput, /s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
