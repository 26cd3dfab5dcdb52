"""The same scaler on the Jetson profiles, in the simulator (InfScaler §V on Xavier / Orin).

Writes ``results/sim_jetson.json`` and ``results/sim_jetson.png``.

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/sim_jetson.py`".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, default_cache_dir, environment, print_table, write_json  # noqa: E402
from _scaling_v1 import AUTOSCALE, MODEL_SETTINGS, STATE_DIR, model_inputs, pipeline  # noqa: E402

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
    auto = Autoscale(
        slo_ms=slo_ms,
        cap=cap,
        interval_s=a["interval_s"],
        window_s=a["window_s"],
        startup_s=STARTUP_S,
        config=ScalerConfig(
            violation_ratio=a["violation_ratio"],
            cooldown_s=a["cooldown_s"],
            hold_s=a["hold_s"],
            rate_horizon_s=a["rate_horizon_s"],
            scale_in_utilisation=a["scale_in_utilisation"],
            shed=a["shed"],
        ),
    )
    return simulate(
        units,
        None,
        arrivals,
        slo_ms=slo_ms,
        handover_ms=HANDOVER_MS,
        seed=1,
        warmup_s=warmup_s,
        autoscale=auto,
        max_inflight="auto",
    )


def throughput_at_slo(units: list, slo_ms: float, cap: Any, ideal: float, steps: int) -> dict:
    from infscaler.runtime.planning.arrivals import poisson

    lo, hi = 0.0, 1.1 * ideal
    best = None
    for _ in range(steps):
        mid = (lo + hi) / 2
        r = sim(units, poisson(mid, SIM_S, seed=3), slo_ms, cap, warmup_s=SIM_WARMUP_S)
        ok = r.rejected == 0 and r.p99_ms is not None and r.p99_ms <= slo_ms
        if ok:
            lo, best = (
                mid,
                {
                    "rate": round(mid, 3),
                    "p99_ms": round(r.p99_ms, 2),
                    "instances_end": [dict(u.instances) for u in r.units],
                    "memory_mb": round(r.memory_mb, 1),
                },
            )
        else:
            hi = mid
    return {"throughput_at_slo_rps": best["rate"] if best else 0.0, "at_slo": best}


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet50,ppocrv4-det,vgg19")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per unit")
    ap.add_argument("--quick", action="store_true", help="ResNet-50, xavier-agx, 4 steps")
    ap.add_argument("--replot", type=Path)
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return 0
    default_cache_dir()
    models = ["resnet50"] if args.quick else [m for m in args.models.split(",") if m]
    profiles = ["xavier-agx"] if args.quick else [p for p in args.profiles.split(",") if p]
    steps = 4 if args.quick else args.steps
    env = environment()
    t = time.monotonic()
    out = [run(m, profiles, steps, 3 if args.quick else args.repeats) for m in models]
    env["load_average_at_end"] = list(__import__("os").getloadavg())
    data = {
        "environment": env,
        "wall_s": round(time.monotonic() - t, 1),
        "handover_ms": HANDOVER_MS,
        "startup_s": STARTUP_S,
        "autoscale": AUTOSCALE,
        "note": "service times: this host's CPU (x86), 1 thread per instance, measured; "
        "Jetson profiles give cores, slots and memory cap; no GPU / DLA option (none measured)",
        "models": out,
    }
    path = RESULTS_DIR / ("sim_jetson_quick.json" if args.quick else "sim_jetson.json")
    write_json(path, data)
    plot(data, path.with_suffix(".png"))
    print_table(
        ["model", "profile", "cap", "SLO x", "InfScaler/ideal", "repl/ideal", "InfScaler/repl"],
        [
            [
                m["model"],
                p,
                r["cap"],
                r["slo_x"],
                r["infscaler_vs_ideal"],
                r["replication_vs_ideal"],
                r["infscaler_vs_replication"],
            ]
            for m in out
            for p, res in m["profiles"].items()
            for r in res["fig5"]
        ],
    )
    print(f"wrote {path} and .png")
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data["models"]
    cols = [(p, cap) for p in models[0]["profiles"] for cap in ("none", "cap")]
    fig, axes = plt.subplots(
        len(models),
        len(cols) + 1,
        figsize=(3.4 * (len(cols) + 1), 3.0 * len(models)),
        squeeze=False,
    )
    for row, m in enumerate(models):
        for ax, (p, cap) in zip(axes[row], cols, strict=False):
            rows = [r for r in m["profiles"][p]["fig5"] if r["cap"] == cap]
            xs = np.arange(len(rows))
            ax.bar(
                xs - 0.2,
                [r["infscaler_vs_ideal"] for r in rows],
                0.4,
                color="#2a7",
                label="InfScaler",
            )
            ax.bar(
                xs + 0.2,
                [r["replication_vs_ideal"] for r in rows],
                0.4,
                color="#58c",
                label="replication",
            )
            ax.set_xticks(xs, [f"{r['slo_x']:g}x" for r in rows])
            ax.axhline(1.0, color="k", lw=0.7, ls="--")
            ax.set_ylim(0, 1.2)
            ax.set_title(
                f"sim {m['model']} K={m['k']} on {p}, "
                f"{'profile cap' if cap == 'none' else 'cap rule'}",
                fontsize=7.5,
            )
            ax.set_ylabel("throughput at SLO / ideal", fontsize=7)
            ax.legend(fontsize=6)
        ax = axes[row][-1]
        labels, vals = [], []
        for p, res in m["profiles"].items():
            for r in res["table2"]:
                labels.append(f"{p} {r['arrivals']}")
                vals.append(r["mean_ratio"])
        ax.barh(np.arange(len(vals)), vals, color="#2a7")
        ax.axvline(0.75, color="r", ls=":", lw=0.8)
        ax.axvline(1.0, color="k", ls="--", lw=0.7)
        ax.set_yticks(np.arange(len(vals)), labels, fontsize=6)
        ax.set_title(f"sim {m['model']}: memory InfScaler / replication", fontsize=7.5)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
