"""The auto mode against the obvious hand configurations, over repeated deploys.

The runtime's promise: a user who writes only ``slo:`` and ``autoscale: {}`` gets at
least what the best simple hand configuration gives, and gets it at every deploy, not
at a lucky one. ``scaling.py`` compares throughput at SLO by bisection, one deploy per
configuration; this script measures the promise as a user meets it: the same pipeline
deployed several times from a clean state, each deploy planning anew, each served the
same arrivals as the hand configurations, in one run on one host.

Writes ``results/auto_deploys.json`` and ``.png`` (``auto_deploys_quick`` with
``--quick``): per model the ratio per deploy at each load, with the 0.95 line.

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/auto_deploys.py`".
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scaling_v1 as sc  # noqa: E402
import same_config as sw  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    ForeignLoad,
    busy_cpu_seconds,
    cpu_steal_seconds,
    default_cache_dir,
    environment,
    host_noise,
    print_table,
    wait_for_quiet,
    write_json,
)

MODELS_DEFAULT = ("resnet50", "alexnet", "zfnet512", "densenet121", "inception-v2")
QUICK_MODEL = "squeezenet"
LOADS = (0.35, 0.5)
#: auto's goodput / the best baseline's, at least, per deploy and load
RATIO_TARGET = 0.95
#: share of the deploys that must choose the most common configuration (4 of 5)
SAME_CONFIG_TARGET = 0.8
#: where the services' state and the per-deploy cache directories go (removed per model)
WORK_DIR = Path("/tmp/isc-auto-deploys")
BASELINES = ("one-session", "replicas")
#: the autoscale block of every auto deploy: the defaults a user who names none gets
AUTOSCALE: dict[str, Any] = {}


def image_models() -> list[str]:
    """Bundled aliases whose inputs ``scaling.model_inputs`` can build (fixed shapes)."""
    from infscaler.base.models import MODELS

    return sorted(m for m, v in MODELS.items() if not v.shapes)


@contextlib.contextmanager
def fresh_cache(path: Path) -> Iterator[Path]:
    """``INFSCALER_CACHE_DIR`` = ``path`` for the block: an empty ``idle`` folder (no served
    idle slowdown kept from an earlier deploy), every other entry of the shared cache
    linked (models, the partitioner's profiles, which are keyed by model hash)."""
    shared = Path(os.environ["INFSCALER_CACHE_DIR"])
    for sub in ("models", "profiles"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for entry in shared.iterdir():
        if entry.name != "idle":
            (path / entry.name).symlink_to(entry)
    os.environ["INFSCALER_CACHE_DIR"] = str(path)
    try:
        yield path
    finally:
        os.environ["INFSCALER_CACHE_DIR"] = str(shared)


def auto_config(model: str, name: str, slo_ms: float) -> Any:
    """``scaling.auto_pipeline`` with :data:`AUTOSCALE` as its autoscale block."""
    from infscaler.base.config import load_pipeline

    raw = sc.auto_pipeline(model, name, slo_ms).model_dump(exclude_none=True)
    raw["autoscale"] = dict(AUTOSCALE)
    return load_pipeline(raw)


def identity(label: str | None) -> str | None:
    """A planner label without the partition objectives that found its cuts
    (``K=1 cuts=[] [eq1] t=2 inst=1`` -> ``K=1 cuts=[] t=2 inst=1``): two deploys that
    chose the same cuts, threads and instances chose the same configuration.

    >>> identity("K=2 cuts=[120] [eq1/minmax] t=1 inst=1+1")
    'K=2 cuts=[120] t=1 inst=1+1'
    """
    return None if label is None else re.sub(r" \[[^\]]*\]", "", label).strip()


def live_check(svc: Any, name: str) -> dict[str, Any] | None:
    """``status()["pipelines"][...]["live_check"]`` of pipeline ``name``."""
    for p in svc.status()["pipelines"]:
        if p["name"] == name:
            return p.get("live_check")
    return None


def timed_deploy(svc: Any, cfg: Any) -> tuple[Any, dict[str, Any]]:
    """Deploy ``cfg``; returns the deployment and what the deploy reported: ``deploy_s``
    (the wall time of ``svc.deploy``, s), ``plan_s`` (until the instances were started:
    its ``waiting for`` progress line, s), ``progress`` ([s, line] per line), ``label``
    (the planner's choice: its ``chosen`` line, else the live check's ``serving``) and
    ``kept`` (the kept decision was reused)."""
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    dep = svc.deploy(cfg, progress=lambda m: lines.append((time.monotonic() - t0, m)))
    deploy_s = time.monotonic() - t0
    plan_s = next((t for t, m in lines if ": waiting for " in m), deploy_s)
    label = None
    for _, m in lines:
        got = re.match(rf"{re.escape(cfg.name)}: chosen (.*?): goodput ", m)
        if got:
            label = got.group(1)
    lc = live_check(svc, cfg.name)
    if label is None and lc is not None:
        label = lc["serving"]
    return dep, {
        "deploy_s": round(deploy_s, 2),
        "plan_s": round(plan_s, 2),
        "label": label,
        "identity": identity(label),
        "kept": any("decision for it is kept" in m for _, m in lines),
        "progress": [[round(t, 2), m[:300]] for t, m in lines],
    }


def run_window(
    svc: Any,
    name: str,
    feeds: dict[str, np.ndarray],
    rate: float,
    n: int,
    warm_s: float,
    slo_ms: float,
) -> dict[str, Any]:
    """One window (module docstring, step 4) on the deployed pipeline ``name``."""
    wall0, t0 = time.time(), time.monotonic()
    busy0, own0 = busy_cpu_seconds(), sc._own_cpu(svc)
    live0 = live_check(svc, name)
    rows = sw.window(svc, name, feeds, rate, n, warm_s)
    wall = time.monotonic() - t0
    own1 = sc._own_cpu(svc)
    own = sum(v - own0.get(p, 0.0) for p, v in own1.items())
    other = max(0.0, busy_cpu_seconds() - busy0 - own) / wall
    lat = [r["latency_ms"] for r in rows if r["latency_ms"] is not None]
    refused = len(rows) - len(lat)
    arr = [r["arrival_s"] for r in rows]
    window_s = (arr[-1] - arr[0]) * len(arr) / (len(arr) - 1) if len(arr) > 1 else 0.0
    ok = sum(x <= slo_ms for x in lat)
    p99 = sc.p99_every(lat, refused)
    out: dict[str, Any] = {
        "rate_rps": round(rate, 3),
        "requests": len(rows),
        "window_s": round(window_s, 2),
        "goodput_rps": round(ok / window_s, 3) if window_s > 0 else None,
        "in_slo": ok,
        "late": len(lat) - ok,
        "refused": refused,
        "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat else None,
        "p99_all_ms": round(p99, 2) if p99 < math.inf else None,
        "errors": sorted({r["error"][:160] for r in rows if "error" in r})[:3],
        "other_processes_cores": round(other, 3),
    }
    dep = svc.deployment(name)
    with contextlib.suppress(Exception):  # a reading during a switch
        out["config_end"] = [u for u in sc.config_snapshot(svc, dep, window_s) if u["served"]]
    live1 = live_check(svc, name)
    if live1 is not None:
        auto = svc.autoscaler
        mine = [
            {
                "action": d["action"],
                "reason": d.get("reason", "")[:300],
                "t_s": round(d["time"] - wall0, 1),
            }
            for d in (auto.decisions(name) if auto else [])
            if d["action"].startswith("live_") and d["time"] >= wall0
        ]
        out["live"] = {
            "decisions": mine,
            "switched": (live1["switches"] > (live0 or {}).get("switches", 0))
            or any(d["action"] == "live_switch" for d in mine),
            "serving_start": None if live0 is None else live0["serving"],
            "serving_end": live1["serving"],
            "identity_end": identity(live1["serving"]),
            "phase_end": live1["phase"],
            "measured_rps": live1["measured_rps"],
        }
    return out


def windows(
    svc: Any,
    name: str,
    feeds: dict[str, np.ndarray],
    ideal: float,
    st: dict[str, Any],
    slo_ms: float,
) -> dict[str, dict[str, Any]]:
    """Every load's window on the deployed pipeline ``name``, keyed by the load (str)."""
    out = {}
    for load in st["loads"]:
        rate = load * ideal
        n = max(st["min_requests"], math.ceil(rate * st["measure_s"]))
        w = run_window(svc, name, feeds, rate, n, st["warm_s"], slo_ms)
        w["load"] = load
        out[f"{load:g}"] = w
        live = w.get("live")
        print(
            f"    {name:12s} load {load:g}: goodput {w['goodput_rps']}/s of {rate:.2f}/s, "
            f"P99 {w['p99_all_ms']} ms, late {w['late']}, refused {w['refused']}, "
            f"others {w['other_processes_cores']}"
            + (
                f", live switch: {live['switched']}, serving {live['identity_end']}" if live else ""
            ),
            flush=True,
        )
    return out


def run_model(model: str, st: dict[str, Any]) -> dict[str, Any]:
    """Calibration, the baselines, then ``st["deploys"]`` auto deploys (module docstring)."""
    from infscaler.service.service import Service

    wake = sc.service_wake_setting()
    quiet = wait_for_quiet(st["quiet_wait_s"])
    feeds = sc.model_inputs(model)
    cal = sc.calibrate(model, feeds, st["n_l0"])
    cores, ideal = cal["cores"], cal["ideal_rps"]
    slo_ms = st["slo_x"] * cal["l0_ms"]
    print(
        f"== {model}: L0 {cal['l0_ms']} ms, ideal {ideal}/s, SLO {slo_ms:.1f} ms "
        f"(other processes {quiet['other_cores']} cores)",
        flush=True,
    )
    work = WORK_DIR / model
    shutil.rmtree(work, ignore_errors=True)
    baselines: dict[str, Any] = {}
    with Service(state_dir=work / "state-baselines", pool_mb=256, cpu_wake_latency_us=wake) as svc:
        for name, threads, inst in (("one-session", cores, 1), ("replicas", 1, cores)):
            dep, rep = timed_deploy(svc, sw.hand_pipeline(model, name, threads, inst, slo_ms))
            rep.update(threads=threads, instances=inst)
            rep["config"] = [u for u in sc.config_snapshot(svc, dep, 1.0) if u["served"]]
            rep["windows"] = windows(svc, name, feeds, ideal, st, slo_ms)
            svc.undeploy(name)
            baselines[name] = rep
    deploys: list[dict[str, Any]] = []
    for i in range(st["deploys"]):
        name = f"auto-{i}"
        rep: dict[str, Any] = {"deploy": i}
        state = work / f"state-{i}"
        with (
            fresh_cache(work / f"cache-{i}"),
            Service(state_dir=state, pool_mb=256, cpu_wake_latency_us=wake) as svc,
        ):
            cfg = auto_config(model, name, slo_ms)
            try:
                dep, got = timed_deploy(svc, cfg)
            except Exception as exc:  # noqa: BLE001 - a refused plan is a result
                rep["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                print(f"  {name}: deploy failed: {rep['error']}", flush=True)
                deploys.append(rep)
                continue
            rep.update(got)
            rep["config"] = [u for u in sc.config_snapshot(svc, dep, 1.0) if u["served"]]
            sc.STATE_DIR = state  # scaling.deploy_status reads the kept decision there
            rep["deploy_status"] = sc.deploy_status(svc, dep)
            print(
                f"  {name}: {rep['identity']} (deploy {rep['deploy_s']} s, plan {rep['plan_s']} s)",
                flush=True,
            )
            if i == 0:
                svc.undeploy(name)
                _, later = timed_deploy(svc, cfg)
                later.pop("progress")
                rep["later_start"] = later
                print(
                    f"  {name} later start: {later['identity']} (deploy {later['deploy_s']} s, "
                    f"kept decision {later['kept']})",
                    flush=True,
                )
            rep["windows"] = windows(svc, name, feeds, ideal, st, slo_ms)
            svc.undeploy(name)
        deploys.append(rep)
    entry = {
        "model": model,
        "calibration": cal,
        "slo_x": st["slo_x"],
        "slo_ms": round(slo_ms, 2),
        "loads": list(st["loads"]),
        "quiet_before": quiet,
        "baselines": baselines,
        "auto": deploys,
    }
    entry["summary"] = summarise(entry)
    return entry


def summarise(entry: dict[str, Any]) -> dict[str, Any]:
    """Per deploy and load auto / best baseline goodput and pass (>= :data:`RATIO_TARGET`),
    the most common configuration and its count, deploy and planning times."""
    per_load = {}
    for load in (f"{x:g}" for x in entry["loads"]):
        base = {b: r["windows"][load]["goodput_rps"] for b, r in entry["baselines"].items()}
        best = max(base, key=lambda b: base[b] or 0.0)
        ratios = []
        for d in entry["auto"]:
            g = d.get("windows", {}).get(load, {}).get("goodput_rps")
            ratios.append(round(g / base[best], 3) if g is not None and base[best] else None)
        per_load[load] = {
            "best_baseline": best,
            "best_baseline_goodput_rps": base[best],
            "ratios": ratios,
            "passed": [None if r is None else r >= RATIO_TARGET for r in ratios],
        }
    chosen = [d.get("identity") for d in entry["auto"]]
    common = Counter(c for c in chosen if c).most_common(1)
    first = entry["auto"][0] if entry["auto"] else {}
    later = first.get("later_start", {})
    n = len(entry["auto"])
    wins = [w for d in entry["auto"] for w in d.get("windows", {}).values()]
    wins += [w for b in entry["baselines"].values() for w in b["windows"].values()]
    return {
        "per_load": per_load,
        "all_ratios_passed": all(p is True for v in per_load.values() for p in v["passed"]),
        "chosen": chosen,
        "most_common": common[0][0] if common else None,
        "most_common_count": common[0][1] if common else 0,
        "same_config_needed": math.ceil(SAME_CONFIG_TARGET * n),
        "same_config_passed": bool(common) and common[0][1] >= math.ceil(SAME_CONFIG_TARGET * n),
        "live_switches": sum(
            bool(w.get("live", {}).get("switched"))
            for d in entry["auto"]
            for w in d.get("windows", {}).values()
        ),
        "first_deploy_s": first.get("deploy_s"),
        "first_plan_s": first.get("plan_s"),
        "later_start_deploy_s": later.get("deploy_s"),
        "later_start_plan_s": later.get("plan_s"),
        "later_start_kept": later.get("kept"),
        "plan_s_all": [d.get("plan_s") for d in entry["auto"]],
        "other_processes_cores_max": max((w["other_processes_cores"] for w in wins), default=None),
    }


def plot(data: dict[str, Any], path: Path) -> None:
    """Per model: auto / best baseline goodput per deploy at each load, the 0.95 line;
    each deploy's chosen configuration as a letter (the legend maps them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = data["models"]
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 5.0), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        s = m["summary"]
        n = len(m["auto"])
        top = 1.2
        for j, (load, v) in enumerate(s["per_load"].items()):
            xs = np.arange(n) + (j - (len(s["per_load"]) - 1) / 2) * 0.12
            ys = [np.nan if r is None else r for r in v["ratios"]]
            ax.plot(
                xs, ys, "o", color=f"C{j}", label=f"{load} x ideal (best: {v['best_baseline']})"
            )
            top = max([top, *(y * 1.1 for y in ys if y == y)])
        letters = {c: chr(65 + k) for k, c in enumerate(dict.fromkeys(c for c in s["chosen"] if c))}
        for i, c in enumerate(s["chosen"]):
            ax.text(
                i,
                0.02,
                letters.get(c, "-"),
                transform=ax.get_xaxis_transform(),
                ha="center",
                fontsize=9,
            )
        ax.axhline(RATIO_TARGET, color="red", lw=1, label=f"{RATIO_TARGET} target")
        ax.set_xticks(range(n), [str(i) for i in range(n)])
        ax.set_xlabel("deploy (letter: configuration chosen)")
        ax.set_ylabel("auto goodput / best baseline's")
        ax.set_ylim(0, top)
        later = s["later_start_deploy_s"]
        ax.set_title(
            f"{m['model']}, SLO {m['slo_x']:g} x L0 = {m['slo_ms']:.0f} ms\n"
            f"same config {s['most_common_count']}/{n}; deploy {s['first_deploy_s']} s, "
            f"later start {later} s",
            fontsize=8.5,
        )
        for c, k in letters.items():
            ax.plot([], [], " ", label=f"{k}: {c}"[:60])
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    if data.get("quick"):
        fig.suptitle("quick run: proves the script runs, no result", fontsize=9, color="#c33")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MODEL}, 2 deploys, 1 load, short")
    ap.add_argument("--models", default=None, help=f"default {','.join(MODELS_DEFAULT)}")
    ap.add_argument("--deploys", type=int, default=None, help="auto deploys per model (default 5)")
    ap.add_argument("--loads", default=None, help="x ideal (default 0.35,0.5)")
    ap.add_argument("--slo-x", type=float, default=3.0, help="SLO = this x L0 (default 3)")
    ap.add_argument("--min-requests", type=int, default=None, help="measured per window (300)")
    ap.add_argument("--measure-s", type=float, default=None, help="measured window at least (20)")
    ap.add_argument("--warm-s", type=float, default=None, help="discarded warm-up, s (15)")
    ap.add_argument("--quiet-wait-s", type=float, default=None, help="wait for a quiet host (120)")
    ap.add_argument(
        "--cpu-wake-latency-us",
        default=None,
        help="the services' PM QoS CPU latency setting: µs, auto or none (default: the "
        "Service's default, what a user gets)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replot", type=Path, help="redraw the PNG of a results JSON and exit")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return 0
    q = args.quick
    models = [
        m for m in (args.models or (QUICK_MODEL if q else ",".join(MODELS_DEFAULT))).split(",") if m
    ]
    known = image_models()
    if set(models) - set(known):
        ap.error(
            f"unknown models {sorted(set(models) - set(known))}: choose from {','.join(known)}"
        )
    sc.set_service_wake(args.cpu_wake_latency_us)
    st = {
        "deploys": args.deploys or (2 if q else 5),
        "loads": tuple(float(x) for x in (args.loads or ("0.35" if q else "0.35,0.5")).split(",")),
        "slo_x": args.slo_x,
        "min_requests": args.min_requests or (sc.QUICK_MIN_REQUESTS if q else sc.MIN_REQUESTS),
        "measure_s": args.measure_s if args.measure_s is not None else (3.0 if q else 20.0),
        "warm_s": args.warm_s if args.warm_s is not None else (3.0 if q else 15.0),
        "quiet_wait_s": args.quiet_wait_s
        if args.quiet_wait_s is not None
        else (5.0 if q else 120.0),
        "n_l0": 8 if q else 20,
        "arrival_seed": sc.ARRIVAL_SEED,
        "autoscale": AUTOSCALE,
    }
    default_cache_dir()
    out = args.out or RESULTS_DIR / ("auto_deploys_quick.json" if q else "auto_deploys.json")
    env = environment()
    steal0, fl = cpu_steal_seconds(), ForeignLoad(sc.own_cpu_seconds)
    quiet = wait_for_quiet(st["quiet_wait_s"])
    data: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    t_run = time.monotonic()
    for model in models:
        t = time.monotonic()
        e = run_model(model, st)
        e["wall_s"] = round(time.monotonic() - t, 1)
        results.append(e)
        data = {
            "environment": {**env, "load_average_at_end": list(os.getloadavg())},
            "quick": q,
            "note": "quick run: proves the script runs; its figures are no result" if q else "",
            "settings": st,
            "cpu_wake_latency_us": sc.service_wake_setting(),
            "host_noise": host_noise(quiet, fl.cores(), steal0),
            "wall_s": round(time.monotonic() - t_run, 1),
            "targets": {
                "ratio": f"auto goodput / best baseline's >= {RATIO_TARGET}, per deploy and load",
                "same_config": f"the most common configuration in >= {SAME_CONFIG_TARGET:.0%} "
                "of the deploys (4 of 5)",
            },
            "models": results,
        }
        write_json(out, data)
        plot(data, out.with_suffix(".png"))
    rows = []
    for m in results:
        s = m["summary"]
        for load, v in s["per_load"].items():
            rows.append(
                [
                    m["model"],
                    load,
                    f"{v['best_baseline']} {v['best_baseline_goodput_rps']}",
                    " ".join("-" if r is None else f"{r:.2f}" for r in v["ratios"]),
                    "pass" if all(p is True for p in v["passed"]) else "FAIL",
                    f"{s['most_common_count']}/{len(m['auto'])}",
                    f"{s['first_plan_s']} / {s['later_start_plan_s']}",
                ]
            )
    print_table(
        ["model", "load", "best baseline (/s)", "auto / best per deploy", ">= 0.95", "same config",
         "plan s first / later"],
        rows,
    )  # fmt: skip
    for m in results:
        print(f"{m['model']}: chosen {m['summary']['chosen']}")
    print(f"wrote {out} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
