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
3. offer every one the SAME Poisson arrivals at the winner's predicted max rate, served
   in-process (``Service.submit``, open loop; fixed instances, no auto-scaling), and
   compare the goodput (requests answered within the SLO per second) with the
   simulator's prediction for those arrivals. Error = (predicted - measured) / measured.

Also the bottleneck partition's share of the FLOPs of the winner vs Eq. 1's own plan.
Writes ``results/plan_search.json`` (``_quick`` with --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    print_table,
    wait_for_quiet,
    write_json,
)
from plan_accuracy import _own_cpu_seconds  # noqa: E402


def serve_open_loop(svc, name: str, x: dict, times: np.ndarray) -> dict:
    """Submit at ``times`` (s from start, open loop); per request the latency (ms, None
    for an error), the wall time from the first arrival to the last answer, and P99."""
    lat: list[float | None] = [None] * len(times)
    t0 = time.monotonic()
    futs = []
    for i, t in enumerate(times):
        wait = t0 + float(t) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t_sub = time.monotonic()
        f = svc.submit(name, x, timeout_s=120)

        def done(f, i=i, t_sub=t_sub) -> None:
            with contextlib.suppress(Exception):  # an error stays None: a miss
                f.result()
                lat[i] = (time.monotonic() - t_sub) * 1e3

        f.add_done_callback(done)
        futs.append(f)
    for f in futs:
        with contextlib.suppress(Exception):
            f.result(timeout=300)
    wall = time.monotonic() - t0
    ok = np.asarray([v for v in lat if v is not None])
    return {
        "latencies_ms": lat,
        "wall_s": wall,
        "completed": int(ok.size),
        "p99_ms": round(float(np.percentile(ok, 99)), 2) if ok.size else None,
    }


def goodput(lat_ms: list[float | None], slo_ms: float, duration_s: float) -> float:
    """Requests answered within the SLO per second of offered arrivals."""
    return sum(1 for v in lat_ms if v is not None and v <= slo_ms) / duration_s


def pick(candidates, pred) -> object | None:
    return next((c for c in candidates if pred(c)), None)


def deploy_config(name: str, model: Path, shapes, cand, state: Path, device):
    """A PipelineConfig serving ``cand`` (plan dir with its cuts, threads, instances)."""
    from infscaler.base.config import validate_pipeline
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
    return validate_pipeline({"name": name, "stages": [stage]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="ResNet-50, SLO 3x, 2 configurations, 10 s"
    )
    ap.add_argument("--duration", type=float, default=30.0, help="seconds per trial")
    args = ap.parse_args()
    default_cache_dir()
    from infscaler.base.device import load_profile
    from infscaler.base.models import MODELS, resolve_model
    from infscaler.partitioner.profiler import usable_cores
    from infscaler.runtime.planning.arrivals import poisson
    from infscaler.runtime.planning.planner import ModelStage, cpu_cores, predict, resource_cap
    from infscaler.runtime.planning.stageprofile import measure_model_stage, search_measured
    from infscaler.service.service import Service

    env = environment()
    quiet = wait_for_quiet(60.0 if args.quick else 120.0)
    steal0 = cpu_steal_seconds()
    from _common import ForeignLoad

    foreign = ForeignLoad(_own_cpu_seconds)
    models = ["resnet50"] if args.quick else ["resnet50", "vgg19"]
    factors = [3.0] if args.quick else [1.5, 2.0, 3.0]
    duration = 10.0 if args.quick else args.duration
    profile = load_profile("cpu-host")
    cap = resource_cap(profile)
    cores = cpu_cores(profile) or usable_cores()
    state = Path(tempfile.gettempdir()) / "isc-bench-plan-search"
    state.mkdir(parents=True, exist_ok=True)
    rows, shares = [], []
    for m in models:
        path = resolve_model(m)
        shapes = MODELS[m].shapes
        st: ModelStage = measure_model_stage(
            path, name="m", shapes=shapes, threads=sorted({1, 2, cores})
        )
        l0 = st.whole_ms[1]
        arr = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
        for f in factors:
            slo = f * l0
            out, stages = search_measured([st], [path], slo, cap, shapes=[shapes], cores=cores)
            st = stages[0]
            best = out.best
            if best is None:
                print(f"{m} SLO {f}x: no candidate meets it")
                continue
            eq1 = st.eq1_cuts(3)
            shares.append(
                {"model": m, "slo_factor": f, "winner_cuts": list(best.cuts[0]),
                 "winner_share": round(best.share[0], 4), "eq1_cuts": list(eq1),
                 "eq1_share": round(st.share(eq1), 4)}
            )  # fmt: skip
            tmax = max(st.whole_ms)
            cands = {
                "winner": best,
                "replication": pick(out.candidates, lambda c: not c.cuts[0] and c.threads[0] == 1),
                "one session": pick(
                    out.candidates,
                    lambda c, tmax=tmax: (
                        not c.cuts[0] and c.threads[0] == tmax and c.config[-1].total == 1
                    ),
                ),
                "eq1 K>1": pick(out.candidates, lambda c: c.cuts[0] and "eq1" in c.objectives[0]),
            }
            if args.quick:  # the winner and the best other configuration
                other = next((c for c in out.candidates[1:] if c.fits), None)
                cands = {"winner": best, "runner-up": other}
            seen: set[str] = set()
            rate = best.max_rate_rps or 1.0
            times = poisson(rate, duration, seed=1)
            for label, c in cands.items():
                if c is None or not c.fits or c.label() in seen:
                    continue  # none, or the same configuration as one above
                seen.add(c.label())
                pred = predict(
                    list(c.units), list(c.config), times, slo_ms=slo, handover_ms=0.1, seed=1,
                    cpu_cores=cores,
                )  # fmt: skip
                pred_good = (pred.slo_attainment or 0.0) * times.size / duration
                cfg = deploy_config(
                    f"{m}-{label.replace(' ', '-').replace('>', '')}",
                    path,
                    shapes,
                    c,
                    state,
                    profile,
                )
                with Service(state_dir=state, control_path="auto", pool_mb=256) as svc:
                    svc.deploy(cfg)
                    x = {svc.deployment(cfg.name).pipeline.inputs[0].name: arr}
                    for _ in range(5):
                        svc.infer(cfg.name, x)
                    meas = serve_open_loop(svc, cfg.name, x, times)
                good = goodput(meas["latencies_ms"], slo, duration)
                err = (pred_good - good) / good if good > 0 else None
                row = {
                    "model": m, "slo_factor": f, "slo_ms": round(slo, 2), "config": label,
                    "candidate": c.label(), "offered_rps": round(rate, 3),
                    "predicted_goodput_rps": round(pred_good, 3), "measured_goodput_rps": round(good, 3),
                    "error": None if err is None else round(err, 4),
                    "predicted_p99_ms": pred.p99_ms, "measured_p99_ms": meas["p99_ms"],
                    "search_max_rate_rps": c.max_rate_rps,
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{m} SLO {f}x ({slo:.0f} ms) {label}: {c.label()}: goodput predicted "
                    f"{pred_good:.2f}/s, measured {good:.2f}/s (error {row['error']}); P99 "
                    f"{pred.p99_ms} vs {meas['p99_ms']} ms",
                    flush=True,
                )
    print_table(
        ["model", "SLO", "config", "pred goodput", "meas goodput", "error"],
        [[r["model"], f"{r['slo_factor']}x", r["config"], r["predicted_goodput_rps"],
          r["measured_goodput_rps"], r["error"]] for r in rows],
    )  # fmt: skip
    for s in shares:
        print(
            f"{s['model']} {s['slo_factor']}x: bottleneck share of FLOPs: winner "
            f"{s['winner_share']:.1%} (cuts {s['winner_cuts']}), Eq. 1 {s['eq1_share']:.1%} "
            f"(cuts {s['eq1_cuts']})"
        )
    write_json(
        RESULTS_DIR / f"plan_search{'_quick' if args.quick else ''}.json",
        {"benchmark": "plan_search", "what": __doc__.splitlines()[0], **env, "duration_s": duration,
         "rows": rows, "bottleneck_shares": shares,
         "host_noise": host_noise(quiet, foreign.cores(), steal0)},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
