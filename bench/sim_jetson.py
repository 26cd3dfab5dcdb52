"""The same scaler on the Jetson profiles, in the simulator (InfScaler §V on Xavier / Orin).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``sim_jetson.py``.
``--priorities``: CPU by priority on each profile's core count (``runtime/planning/simcores.py``),
modes off / nice / cgroup / cores; writes ``sim_jetson_priorities.json`` / ``.png``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.cli import RESULTS_DIR  # noqa: E402
from harness.models import AUTOSCALE, MODEL_SETTINGS, model_inputs, pipeline  # noqa: E402

STATE_DIR = Path("/tmp/isc-bench-state")
PROFILES = ("xavier-agx", "orin-nano")
HANDOVER_MS = 0.05
STARTUP_S = 2.0
SLOS = (1.5, 2.0, 3.0)
#: a bisection step: long enough for the scaler (cooldown 6 s) to add an instance per
#: core before the measured part
SIM_S, SIM_WARMUP_S = 180.0, 120.0


def unit_profiles(model: str, k: int, feeds: dict, repeats: int) -> dict[str, Any]:
    """Measured unit profiles of the whole model (K=1) and the K-partition plan."""
    from infscaler.runtime.planning.unitprofile import profile_pipeline
    from infscaler.runtime.serving.pipeline import compile_pipeline

    out = {}
    for label, kk in (("whole", 1), ("plan", k)):
        cfg = pipeline(model, f"sim-{label}", kk)
        compiled = compile_pipeline(cfg, state_dir=STATE_DIR)
        prof = profile_pipeline(compiled, feeds, repeats=repeats, warmup=1)
        out[label] = (prof, compiled)
    return out


def with_memory(units: list, uss: list[float] | None) -> tuple[list, str]:
    if not uss or len(uss) != len(units):
        return units, "plan estimate + instance overhead (no USS in results/scaling.json)"
    new = []
    for u, mb in zip(units, uss, strict=True):
        engines = {e: dataclasses.replace(p, memory_mb=float(mb)) for e, p in u.engines.items()}
        new.append(dataclasses.replace(u, engines=engines))
    return new, "USS measured by bench/scaling.py on this host"


def with_max(units: list, n: int) -> list:
    return [dataclasses.replace(u, max_instances=n) for u in units]


def sim(units: list, arrivals: np.ndarray, slo_ms: float, cap: Any, warmup_s: float) -> Any:
    from infscaler.runtime.planning.simulator import Autoscale, simulate
    from infscaler.runtime.scaling.types import ScalerConfig

    a = AUTOSCALE
    fields = {f.name for f in dataclasses.fields(ScalerConfig)}
    scaler = ScalerConfig(**{k: v for k, v in a.items() if k in fields})
    auto = Autoscale(slo_ms=slo_ms, cap=cap, interval_s=a["interval_s"], window_s=a["window_s"],
                     startup_s=STARTUP_S, config=scaler)  # fmt: skip
    return simulate(units, None, arrivals, slo_ms=slo_ms, handover_ms=HANDOVER_MS, seed=1,
                    warmup_s=warmup_s, autoscale=auto, max_inflight="auto")  # fmt: skip


def throughput_at_slo(units: list, slo_ms: float, cap: Any, ideal: float, steps: int) -> dict:
    """The simulated max rate at SLO (``harness.search``, bracket (0, 1.1 x ideal))."""
    from infscaler.runtime.planning.arrivals import poisson

    def measure(rate: float) -> dict[str, Any]:
        r = sim(units, poisson(rate, SIM_S, seed=3), slo_ms, cap, warmup_s=SIM_WARMUP_S)
        return {"passed": r.rejected == 0 and r.p99_ms is not None and r.p99_ms <= slo_ms,
                "p99_ms": None if r.p99_ms is None else round(r.p99_ms, 2),
                "instances_end": [dict(u.instances) for u in r.units],
                "memory_mb": round(r.memory_mb, 1)}  # fmt: skip

    found = harness.search.max_rate_at_slo(measure, 1.1 * ideal, steps)
    at = [p for p in found["points"] if p["passed"] and p["rate_rps"] == found["max_rps"]]
    return {"throughput_at_slo_rps": found["max_rps"], "at_slo": at[0] if at else None}


def run(model: str, profiles: list[str], steps: int, repeats: int) -> dict[str, Any]:
    from memory_trace import arrivals_for

    from infscaler.base.device import load_profile
    from infscaler.runtime.planning.simulator import cap_from_profile

    k = MODEL_SETTINGS[model]["k"]
    feeds = model_inputs(model)
    print(f"== {model}: profiling units (K=1 and K={k})", flush=True)
    profs = unit_profiles(model, k, feeds, repeats)
    whole_p, _ = profs["whole"]
    plan_p, plan_c = profs["plan"]
    measured = {}
    sc = RESULTS_DIR / "scaling.json"
    if sc.exists():
        for m in json.loads(sc.read_text()).get("models", []):
            if m["model"] == model and m.get("k") == k:
                measured = m.get("memory", {})
    # PSS since the zygote (older scaling.json files recorded USS)
    whole_mb = measured.get("whole", {}).get("pss_mb") or measured.get("whole", {}).get("uss_mb")
    plan_mb = measured.get("plan", {}).get("pss_mb") or measured.get("plan", {}).get("uss_mb")
    whole_units, mem_src = with_memory(list(whole_p.units), whole_mb)
    plan_units, _ = with_memory(list(plan_p.units), plan_mb)
    whole_samples = np.array(whole_units[0].engines["cpu"].samples_ms)
    l0 = float(np.median(whole_samples))
    b = int(np.argmax([u.bottleneck or 0.0 for u in plan_c.units]))
    mem_whole = whole_units[0].engines["cpu"].memory_mb
    mem_parts = [u.engines["cpu"].memory_mb for u in plan_units]
    cap_mb = max(mem_whole, sum(mem_parts)) + mem_parts[b] + 32.0
    entry: dict[str, Any] = {
        "model": model,
        "k": k,
        "l0_ms": round(l0, 2),
        "unit_ms": {
            ("whole" if u in whole_units else u.name): {
                "p50": round(float(np.median(u.engines["cpu"].samples_ms)), 2),
                "p99": round(float(np.percentile(u.engines["cpu"].samples_ms, 99)), 2),
                "mean": round(u.engines["cpu"].mean_ms, 2),
                "samples": len(u.engines["cpu"].samples_ms),
            }
            for u in whole_units + plan_units
        },
        "memory_mb": {"whole": mem_whole, "partitions": mem_parts, "source": mem_src},
        "bottleneck_unit": b,
        "cap_rule_mb": round(cap_mb, 1),
        "profile_notes": list(plan_p.notes) + list(whole_p.notes),
        "profiles": {},
    }
    for pname in profiles:
        dev = load_profile(pname)
        base = cap_from_profile(dev)
        cores = base.cores
        ideal = cores * 1000.0 / l0
        pw, pp = with_max(whole_units, cores), with_max(plan_units, cores)
        res: dict[str, Any] = {
            "cores": cores,
            "memory_cap_mb": base.memory_cap_mb,
            "ideal_rps": round(ideal, 3),
            "fig5": [],
            "table2": [],
        }
        for cap_mode in ("none", "cap"):
            cap = base if cap_mode == "none" else dataclasses.replace(base, memory_cap_mb=cap_mb)
            for slo_x in SLOS:
                row = {"cap": cap_mode, "slo_x": slo_x}
                for label, units in (("infscaler", pp), ("replication", pw)):
                    r = throughput_at_slo(units, slo_x * l0, cap, ideal, steps)
                    row[label] = r
                    row[f"{label}_vs_ideal"] = round(r["throughput_at_slo_rps"] / ideal, 3)
                t_r = row["replication"]["throughput_at_slo_rps"]
                row["infscaler_vs_replication"] = (
                    round(row["infscaler"]["throughput_at_slo_rps"] / t_r, 3) if t_r else None
                )
                res["fig5"].append(row)
                print(
                    f"  {pname} [{cap_mode}] SLO {slo_x}x: InfScaler "
                    f"{row['infscaler_vs_ideal']} x ideal, replication {row['replication_vs_ideal']}",
                    flush=True,
                )
        for kind in ("azure", "gamma-cv1", "gamma-cv4"):
            arr, info = arrivals_for(kind, 0.6 * ideal, 150.0, seed=1)
            row = {"arrivals": kind, "rate": round(0.6 * ideal, 3)}
            for label, units in (("infscaler", pp), ("replication", pw)):
                r = sim(units, arr, 2.0 * l0, base, warmup_s=0.0)
                mem = np.array([t["memory_mb"] for t in r.timeline]) if r.timeline else np.zeros(1)
                row[label] = {
                    "memory_mean_mb": round(float(mem.mean()), 1),
                    "memory_peak_mb": round(float(mem.max()), 1),
                    "throughput_rps": round(r.throughput_rps, 3),
                    "p99_ms": round(r.p99_ms, 1) if r.p99_ms is not None else None,
                    "slo_attainment": r.slo_attainment,
                    "rejected": r.rejected,
                }
            row["mean_ratio"] = round(
                row["infscaler"]["memory_mean_mb"] / row["replication"]["memory_mean_mb"], 3
            )
            res["table2"].append(row)
            print(f"  {pname} {kind}: memory ratio {row['mean_ratio']}", flush=True)
        entry["profiles"][pname] = res
    return entry


#: the Jetson profiles whose core counts --priorities runs
PRIO_PROFILES = ("orin-agx", "orin-nx", "orin-nano", "xavier-agx", "xavier-nx")
#: a request's time on a whole core, ms, of every pipeline: the held-out model of the
#: two-pipeline case on this host (its SLO 3 x L0 = 131 ms), CV 0.1
PRIO_L0_MS, PRIO_CV = 43.7, 0.1


def priorities(
    profiles: list[str], duration_s: float, seeds: int, lower_x: list[int]
) -> list[dict[str, Any]]:
    """Points of ``--priorities``: per profile's core count, 2 and 3 pipelines, each lower
    pipeline with ``x`` x cores instances for each ``x`` of ``lower_x``, each mode."""
    from infscaler.base.device import load_profile

    counts = []
    for pname in profiles:
        if pname.isdigit():  # a bare core count (this host's, for the live bench)
            counts.append((f"{pname} cores", int(pname)))
            continue
        acc = [a for a in load_profile(pname).accelerators if a.engine == "cpu" and a.cores]
        counts.append((pname, len(acc[-1].cores)))
    return [pt for pname, cores in counts for x in lower_x for n in (2, 3)
            for pt in _priority_case(pname, cores, n, x, duration_s, seeds)]  # fmt: skip


def _priority_case(
    pname: str, cores: int, n: int, x: int, duration_s: float, seeds: int
) -> list[dict[str, Any]]:
    """One core count, ``n`` pipelines, lower ones of ``x`` x cores instances: each mode."""
    from infscaler.runtime.planning.simcores import MODES, SharedPipeline, simulate_shared

    hi = SharedPipeline("hi", 1, PRIO_L0_MS, 1, rate_rps=0.3e3 / PRIO_L0_MS, cv=PRIO_CV,
                        slo_ms=3 * PRIO_L0_MS)  # fmt: skip
    los = [SharedPipeline(f"lo{k}", k + 2, PRIO_L0_MS, x * cores, cv=PRIO_CV)
           for k in range(n - 1)]  # fmt: skip
    warm = min(10.0, duration_s / 4)

    def runs(mode: str, pipes: list) -> list[dict]:
        return [simulate_shared(pipes, cores, mode, duration_s, warmup_s=warm, seed=s)
                for s in range(1, seeds + 1)]  # fmt: skip

    alone = float(np.median([r["hi"]["attainment"] for r in runs("off", [hi])]))
    points = []
    for mode in MODES:
        rs = runs(mode, [hi, *los])
        att = float(np.median([r["hi"]["attainment"] for r in rs]))
        lower = [sum(r[lo.name]["goodput_rps"] for lo in los) for r in rs]
        kept = [r[los[0].name]["kept_s"] / (duration_s - warm) for r in rs]
        pt = {"profile": pname, "cores": cores, "pipelines": n, "lower_x": x, "mode": mode,
              "hi_alone": round(alone, 4), "hi_flooded": round(att, 4),
              "hi_ratio": round(att / alone, 4) if alone else None,
              "hi_p99_ms": float(np.median([r["hi"]["p99_ms"] for r in rs])),
              "lower_goodput_rps": round(float(np.median(lower)), 2),
              "lower_goodput_cores": round(float(np.median(lower)) * PRIO_L0_MS / 1e3, 3),
              "kept_fraction": round(float(np.median(kept)), 3)}  # fmt: skip
        points.append(pt)
        print(f"  {pname} ({cores} cores) {n} pipelines, lower {x} x cores, {mode}: hi "
              f"{att:.3f} / alone {alone:.3f}, lower {pt['lower_goodput_cores']} cores' worth",
              flush=True)  # fmt: skip
    return points


def priorities_main(a: Any) -> int:
    """``--priorities``: the points, the JSON and the figure, a table."""
    res = harness.cli.start("sim_jetson_priorities", a)
    lower_x = [int(v) for v in a.lower_x.split(",")]
    for pt in priorities(a.profiles.split(","), a.duration_s, a.seeds, lower_x):
        res.add(**pt)
    res.summary = {"l0_ms": PRIO_L0_MS, "cv": PRIO_CV, "hi_rate": "0.3 x one core's ideal",
                   "slo": "3 x L0", "lower": "closed loop, lower_x x cores instances each",
                   "model": "runtime/planning/simcores.py"}  # fmt: skip
    harness.cli.finish(res, a, plot_priorities)
    keys = ("profile", "cores", "pipelines", "lower_x", "mode", "hi_alone", "hi_flooded",
            "hi_ratio", "lower_goodput_cores", "kept_fraction")  # fmt: skip
    harness.print_table(list(keys), [[p[k] for k in keys] for p in res.points])
    return 0


def plot_priorities(data: dict[str, Any], path: Path) -> None:
    """Priority-1 attainment flooded / alone against the core count, per mode, one panel
    per pipeline count and lower instances."""
    pts = [{**p, "case": f"{p['pipelines']} pipelines, lower {p.get('lower_x', 1)} x cores"}
           for p in data["points"]]  # fmt: skip
    harness.plot(pts, path, x="cores", y="hi_ratio", by="mode", panel="case",
                 hlines={"0.95 x alone": 0.95}, xlabel="cpu cores (Jetson profiles)",
                 ylabel="priority-1 attainment flooded / alone")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=SIM_S, quiet_wait_s=0.0)
    ap.add_argument("--priorities", action="store_true", help="CPU by priority (see above)")
    ap.add_argument("--seeds", type=int, default=5, help="--priorities: seeds per point")
    ap.add_argument("--lower-x", default="1,3", help="--priorities: lower instances, x cores")
    ap.add_argument("--models", default="resnet50,ppocrv4-det,vgg19")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per unit")

    def quick(a: Any) -> None:
        a.models, a.profiles, a.steps, a.repeats = "resnet50", "xavier-agx", 4, 3
        a.seeds = 1

    a = harness.cli.parse(ap, argv, quick)
    if a.priorities:
        if a.profiles == ",".join(PROFILES):
            a.profiles = ",".join((*PRIO_PROFILES, "2"))
        return priorities_main(a)
    res = harness.cli.start("sim_jetson", a)
    models = [run(m, a.profiles.split(","), a.steps, a.repeats) for m in a.models.split(",")]
    for m in models:
        for p, r in m["profiles"].items():
            for row in r["fig5"]:
                res.add(model=m["model"], k=m["k"], profile=p, **row)
    res.summary = {"handover_ms": HANDOVER_MS, "startup_s": STARTUP_S, "autoscale": AUTOSCALE,
                   "note": "service times: this host's CPU (x86), 1 thread per instance, "
                   "measured; Jetson profiles give cores, slots and memory cap; no GPU / DLA",
                   "models": models}  # fmt: skip
    harness.cli.finish(res, a, plot)
    rows = [[p["model"], p["profile"], p["cap"], p["slo_x"], p["infscaler_vs_ideal"],
             p["replication_vs_ideal"], p["infscaler_vs_replication"]] for p in res.points]  # fmt: skip
    harness.print_table(
        ["model", "profile", "cap", "SLO x", "InfScaler/ideal", "repl/ideal", "InfScaler/repl"],
        rows,
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Simulated throughput at SLO / ideal against the SLO, InfScaler and replication,
    one panel per model, profile and cap."""
    pts = [{**p, "cell": f"{p['model']} {p['profile']} cap {p['cap']}"} for p in data["points"]]
    harness.plot(pts, path, x="slo_x", y=["infscaler_vs_ideal", "replication_vs_ideal"],
                 panel="cell", hlines={"ideal": 1.0}, xlabel="SLO, x L0",
                 ylabel="throughput at SLO / ideal")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
