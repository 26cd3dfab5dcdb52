"""The fleet planner at scale (``infscaler plan --fleet``; runtime/planning/fleet.py): place 10,000
streams on a site of 1,000 Jetsons with the fewest nodes; report the time it takes and the
nodes used against the lower bound.

Pipelines: real bundled models (default ResNet-50, SqueezeNet, ShuffleNet), each served
whole, their unit profiles measured in-process on this host (cpu engine, one intra-op
thread: :func:`infscaler.runtime.planning.unitprofile.profile_pipeline`) and used for every device
type: the Jetsons run them on their CPU slots and cores (no GPU / DLA times exist for them
here, and none are invented). Two SLO classes per model: 3x and 6x its measured mean
service time (at least 20 ms).

Site: ``--nodes`` nodes, 10 % orin-agx, 30 % orin-nx, 40 % orin-nano, 20 % xavier-nx
(the bundled profiles' caps). Streams: ``--streams``, a model and SLO class uniformly at
random, a rate log-normal around 5 requests/s (sigma 0.8, clipped to 0.5..60 /s), seeded.

Measured: the capacity curves (the single-device planner, runs counted), the packing time
at 10 %, 20 %, 50 % and 100 % of the streams (with the nodes scaled alike), the nodes used
and the lower bound (runtime/planning/fleet.py's module docstring says what it bounds).

    .venv/bin/python bench/fleet.py [--quick] [--nodes 1000] [--streams 10000] [--models ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS_DIR, default_cache_dir, environment, now_utc  # noqa: E402

MIX = (("orin-agx", 0.10), ("orin-nx", 0.30), ("orin-nano", 0.40), ("xavier-nx", 0.20))
SLO_FACTORS = (3.0, 6.0)
POOL_MB = 512.0


def measure(models: list[str]) -> dict[str, tuple]:
    from infscaler.base.device import load_profile
    from infscaler.base.models import MODELS
    from infscaler.cli.client import pipeline_from_arg
    from infscaler.runtime.planning.unitprofile import profile_pipeline
    from infscaler.runtime.serving.pipeline import compile_pipeline

    out = {}
    for m in models:
        cfg = pipeline_from_arg(m)
        compiled = compile_pipeline(cfg, device=load_profile("generic-x86"))
        prof = profile_pipeline(compiled, repeats=8)
        out[m] = prof.units
        ms = sum(u.fastest().mean_ms for u in prof.units if u.served)
        print(f"  {m}: {ms:.1f} ms per request on this host ({MODELS[m].shapes})", flush=True)
    return out


def site(n_nodes: int, n_streams: int, keys: list[tuple[str, float]], seed: int):
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.fleet import FleetNode, Stream
    from infscaler.runtime.planning.planner import resource_cap

    caps = {d: resource_cap(load_profile(d)) for d, _ in MIX}
    nodes = []
    for d, frac in MIX:
        for i in range(int(round(n_nodes * frac))):
            nodes.append(FleetNode(f"{d}-{i:04d}", d, caps[d]))
    rng = np.random.default_rng(seed)
    rates = np.clip(rng.lognormal(np.log(5.0), 0.8, n_streams), 0.5, 60.0)
    which = rng.integers(0, len(keys), n_streams)
    streams = [
        Stream(f"s{i:05d}", keys[k][0], round(float(r), 3), keys[k][1])
        for i, (r, k) in enumerate(zip(rates, which, strict=True))
    ]
    return nodes, streams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="SqueezeNet only (8 capacity curves)")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--models", default="resnet50,squeezenet,shufflenet")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.quick:
        args.models = "squeezenet"
    default_cache_dir()
    os.environ.setdefault("INFSCALER_STATE_DIR", "/tmp/isc-cache/state")
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.fleet import capacity_curve, place

    env = environment()
    models = args.models.split(",")
    print(f"measuring {models} in-process", flush=True)
    units = measure(models)
    keys = []
    for m in models:
        ms = sum(u.fastest().mean_ms for u in units[m] if u.served)
        for f in SLO_FACTORS:
            keys.append((m, float(max(20.0, round(f * ms)))))
    curves = {}
    t0 = time.perf_counter()
    runs = 0
    for p, slo in keys:
        for d, _ in MIX:
            c = capacity_curve(p, units[p], slo, d, load_profile(d), pool_mb=POOL_MB)
            curves[(p, slo, d)] = c
            runs += c.planner_runs
            print(
                f"  R*({p}, SLO {slo:g} ms, {d}) = {c.max_rate:.1f}/s "
                f"({c.planner_runs} planner runs)",
                flush=True,
            )
    curve_s = time.perf_counter() - t0
    steps = []
    for frac in (0.1, 0.2, 0.5, 1.0):
        n_nodes, n_streams = int(args.nodes * frac), int(args.streams * frac)
        nodes, streams = site(n_nodes, n_streams, keys, args.seed)
        res = place(streams, nodes, curves, pool_mb=POOL_MB)
        by_dev: dict[str, int] = {}
        for n in res.nodes:
            by_dev[n.device] = by_dev.get(n.device, 0) + 1
        row = {
            "nodes": len(nodes),
            "streams": len(streams),
            "requests_per_s": round(sum(s.rate for s in streams), 1),
            "packing_s": round(res.seconds, 4),
            "nodes_used": len(res.nodes),
            "lower_bound": res.lower_bound,
            "lower_bound_resource": res.bound_by,
            "ratio": round(len(res.nodes) / res.lower_bound, 4) if res.lower_bound else None,
            "unplaced": len(res.unplaced),
            "nodes_used_by_device": by_dev,
        }
        steps.append(row)
        print(
            f"{len(streams):6d} streams on {len(nodes):5d} nodes: {res.seconds:7.3f} s, "
            f"{len(res.nodes)} nodes used, lower bound {res.lower_bound} "
            f"({res.bound_by}), unplaced {len(res.unplaced)}, {by_dev}",
            flush=True,
        )
    out = {
        "what": "fleet placement (runtime/planning/fleet.py) at scale",
        "settings": {
            "nodes": args.nodes,
            "streams": args.streams,
            "models": models,
            "mix": dict(MIX),
            "slo_factors": SLO_FACTORS,
            "pool_mb": POOL_MB,
            "seed": args.seed,
            "unit_profiles": "measured in-process on this host (cpu engine), used for every "
            "device type",
        },
        "environment": env,
        "curves": [
            {
                "pipeline": c.pipeline,
                "slo_ms": c.slo_ms,
                "device": c.device,
                "max_rate": round(c.max_rate, 3),
                "planner_runs": c.planner_runs,
                "reason": c.reason,
            }
            for c in curves.values()
        ],
        "curve_seconds": round(curve_s, 2),
        "planner_runs": runs,
        "steps": steps,
        "load_average_at_end": list(os.getloadavg()),
        "date_utc_end": now_utc(),
    }
    name = "fleet_quick" if args.quick else "fleet"
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(out, indent=2))
    plot(out, RESULTS_DIR / f"{name}.png")
    print(
        f"capacity curves: {len(curves)} pairs, {runs} planner runs, {curve_s:.1f} s; "
        f"wrote {RESULTS_DIR / name}.json / .png"
    )


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = out["steps"]
    x = [r["streams"] for r in s]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(x, [r["packing_s"] for r in s], "o-")
    a.set_xlabel("streams (nodes = streams / 10)")
    a.set_ylabel("packing time, s")
    a.set_title(f"packing time (+ {out['curve_seconds']:.0f} s of capacity curves once)")
    b.plot(x, [r["nodes_used"] for r in s], "o-", label="nodes used")
    b.plot(x, [r["lower_bound"] for r in s], "s--", label="lower bound")
    b.set_xlabel("streams")
    b.set_ylabel("nodes")
    b.set_title("nodes used vs the lower bound")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
