"""The fleet planner at scale (``infscaler plan --fleet``; runtime/planning/fleet.py): place 10,000
streams on a site of 1,000 Jetsons with the fewest nodes; report the time it takes and the
nodes used against the lower bound.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``fleet.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

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
    nodes = [FleetNode(f"{d}-{i:04d}", d, caps[d]) for d, frac in MIX
             for i in range(int(round(n_nodes * frac)))]  # fmt: skip
    rng = np.random.default_rng(seed)
    rates = np.clip(rng.lognormal(np.log(5.0), 0.8, n_streams), 0.5, 60.0)
    which = rng.integers(0, len(keys), n_streams)
    return nodes, [Stream(f"s{i:05d}", keys[k][0], round(float(r), 3), keys[k][1])
                   for i, (r, k) in enumerate(zip(rates, which, strict=True))]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=0.0)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=10000)
    ap.add_argument("--models", default="resnet50,squeezenet,shufflenet")

    def quick(a) -> None:
        a.models = "squeezenet"

    a = harness.cli.parse(ap, argv, quick)
    os.environ.setdefault("INFSCALER_STATE_DIR", "/tmp/isc-cache/state")
    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.fleet import capacity_curve, place

    res = harness.cli.start("fleet", a)
    models = a.models.split(",")
    units = measure(models)
    keys = [(m, float(max(20.0, round(f * sum(u.fastest().mean_ms for u in units[m] if u.served)))))
            for m in models for f in SLO_FACTORS]  # fmt: skip
    curves, t0 = {}, time.perf_counter()
    for p, slo in keys:
        for d, _ in MIX:
            c = capacity_curve(p, units[p], slo, d, load_profile(d), pool_mb=POOL_MB)
            curves[(p, slo, d)] = c
            print(f"  R*({p}, SLO {slo:g} ms, {d}) = {c.max_rate:.1f}/s ({c.planner_runs} runs)",
                  flush=True)  # fmt: skip
    res.summary.update(mix=dict(MIX), slo_factors=SLO_FACTORS, pool_mb=POOL_MB,
                       curve_seconds=round(time.perf_counter() - t0, 2),
                       planner_runs=sum(c.planner_runs for c in curves.values()),
                       curves=[{"pipeline": c.pipeline, "slo_ms": c.slo_ms, "device": c.device,
                                "max_rate": round(c.max_rate, 3), "planner_runs": c.planner_runs,
                                "reason": c.reason} for c in curves.values()])  # fmt: skip
    for frac in (0.1, 0.2, 0.5, 1.0):
        nodes, streams = site(int(a.nodes * frac), int(a.streams * frac), keys, a.seed)
        r = place(streams, nodes, curves, pool_mb=POOL_MB)
        by_dev: dict[str, int] = {}
        for n in r.nodes:
            by_dev[n.device] = by_dev.get(n.device, 0) + 1
        p = res.add(nodes=len(nodes), streams=len(streams), packing_s=round(r.seconds, 4),
                    requests_per_s=round(sum(s.rate for s in streams), 1),
                    nodes_used=len(r.nodes), lower_bound=r.lower_bound,
                    lower_bound_resource=r.bound_by, unplaced=len(r.unplaced),
                    ratio=round(len(r.nodes) / r.lower_bound, 4) if r.lower_bound else None,
                    nodes_used_by_device=by_dev)  # fmt: skip
        print(f"{p['streams']:6d} streams on {p['nodes']:5d} nodes: {r.seconds:7.3f} s, "
              f"{p['nodes_used']} used, lower bound {r.lower_bound}", flush=True)  # fmt: skip
    harness.cli.finish(res, a, plot)
    return 0


def plot(data: dict, path: Path) -> None:
    """Nodes used and the lower bound, and the packing time (s), against the streams."""
    harness.plot(data["points"], path, x="streams", y=["nodes_used", "lower_bound", "packing_s"],
                 logy=True, xlabel="streams (nodes = streams / 10)", ylabel="nodes; s")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
