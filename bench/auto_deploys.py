"""The auto mode against the obvious hand configurations, over repeated deploys.

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``auto_deploys.py``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness.scenarios import poisson_times, replay_summary  # noqa: E402

MODELS_DEFAULT = ("resnet50", "alexnet", "zfnet512", "densenet121", "inception-v2")
QUICK_MODEL = "squeezenet"
#: auto's goodput / the best baseline's, at least, per deploy and load
RATIO_TARGET = 0.95
#: share of the deploys that must choose the most common configuration (4 of 5)
SAME_CONFIG_TARGET = 0.8
#: where the services' state and the per-deploy cache directories go (removed per model)
WORK_DIR = Path("/tmp/isc-auto-deploys")
NAME = "m"


def fresh_cache(path: Path) -> Path:
    """A model cache at ``path``: every entry of the shared cache linked but ``idle`` (no
    served idle slowdown kept from an earlier deploy)."""
    shared = Path(os.environ.get("INFSCALER_CACHE_DIR", "/tmp/isc-cache"))
    for sub in ("models", "profiles"):
        (shared / sub).mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for entry in shared.iterdir():
        if entry.name != "idle":
            (path / entry.name).symlink_to(entry)
    return path


def identity(label: str | None) -> str | None:
    """A planner label without the partition objectives that found its cuts
    (``K=1 cuts=[] [eq1] t=2 inst=1`` -> ``K=1 cuts=[] t=2 inst=1``): two deploys that
    chose the same cuts, threads and instances chose the same configuration.

    >>> identity("K=2 cuts=[120] [eq1/minmax] t=1 inst=1+1")
    'K=2 cuts=[120] t=1 inst=1+1'
    """
    return None if label is None else re.sub(r" \[[^\]]*\]", "", label).strip()


def _live(s: harness.Sut) -> dict[str, Any]:
    p = next((p for p in s.status()["pipelines"] if p.get("name") == NAME), {})
    return p.get("live_check") or {}


def windows(s: harness.Sut, a: Any, feeds: dict, cal: dict, slo_ms: float) -> dict[str, Any]:
    """Every load's window on the served pipeline, keyed by the load (str)."""
    from infscaler.api.loadgen import LoadGenerator

    out = {}
    for load in map(float, a.loads.split(",")):
        rate = load * cal["ideal_rps"]
        n = max(a.min_requests, math.ceil(rate * a.measure_s))
        times = poisson_times(rate, a.warm_s + n / rate, a.seed)
        wall0 = time.time()
        rows = LoadGenerator(s.sock, NAME, feeds).replay(times)
        measured = [r for r in rows if r["t_s"] >= a.warm_s]
        w = replay_summary(measured, slo_ms, max(float(times[-1]) - a.warm_s, 1e-9))
        decisions, _ = s.since(wall0)
        live = _live(s)
        w.update(load=load, rate_rps=round(rate, 3), serving_end=identity(live.get("serving")),
                 live_switches=sum(d.get("action") == "live_switch" for d in decisions))  # fmt: skip
        out[f"{load:g}"] = w
        print(f"    load {load:g}: goodput {w['goodput_rps']}/s of {rate:.2f}/s, P99 "
              f"{w['p99_all_ms']} ms, refused {w['refused']}, serving {w['serving_end']}",
              flush=True)  # fmt: skip
    return out


def deploy(pipe: dict, work: Path, i: int, later: bool = False) -> harness.Sut:
    """Auto deploy ``i``: a fresh service on its own state directory and cache."""
    cache = work / f"cache-{i}"
    env = {"INFSCALER_CACHE_DIR": str(cache if later else fresh_cache(cache))}
    return harness.Sut([pipe], args=["--state-dir", str(work / f"state-{i}")], env=env)


def run_model(model: str, a: Any, res: harness.Result) -> dict[str, Any]:
    """Calibration, the baselines, then the auto deploys (the method)."""
    feeds = harness.models.model_inputs(model)
    cal = harness.models.calibrate(model, feeds, 8 if a.quick else 20)
    cores, slo_ms = cal["cores"], a.slo_x * cal["l0_ms"]
    print(f"== {model}: L0 {cal['l0_ms']} ms, ideal {cal['ideal_rps']}/s, SLO {slo_ms:.1f} ms")
    work = WORK_DIR / model
    shutil.rmtree(work, ignore_errors=True)
    entry: dict[str, Any] = {"model": model, "calibration": cal, "slo_ms": round(slo_ms, 2)}
    for base, threads, inst in (("one-session", cores, 1), ("replicas", 1, cores)):
        pipe = harness.models.static_pipeline(model, NAME, threads, inst, slo_ms)
        with harness.Sut([pipe]) as s:
            res.own_pids[:] = [s.pid]
            print(f"  {base}: {inst} x {threads} thread(s)", flush=True)
            w = windows(s, a, feeds, cal, slo_ms)
        res.add(model=model, config=base, deploy=None, ready_s=s.ready_s, windows=w)
    auto = harness.models.auto_pipeline(model, NAME, slo_ms)
    auto = auto.model_dump(mode="json", exclude_none=True, exclude_unset=True)
    auto["autoscale"] = {}  # the defaults a user who names none gets
    for i in range(a.deploys):
        try:
            with deploy(auto, work, i) as s:
                s.watch(1.0)
                res.own_pids[:] = [s.pid]
                label = identity(_live(s).get("serving"))
                print(f"  auto-{i}: {label} (ready in {s.ready_s} s)", flush=True)
                w = windows(s, a, feeds, cal, slo_ms)
        except RuntimeError as exc:  # a refused plan is a result
            res.add(model=model, config="auto", deploy=i, error=str(exc)[:300])
            continue
        p = res.add(model=model, config="auto", deploy=i, ready_s=s.ready_s, identity=label,
                    windows=w)  # fmt: skip
        if i == 0:
            with deploy(auto, work, i, later=True) as s2:
                p["later_start"] = {"ready_s": s2.ready_s, "identity": identity(_live(s2).get("serving")),
                                    "kept": "decision for it is kept" in s2.log_path.read_text()}  # fmt: skip
    return entry


def summarise(points: list[dict[str, Any]], model: str, loads: list[str]) -> dict[str, Any]:
    """Per load auto / best baseline goodput per deploy and pass (>= :data:`RATIO_TARGET`),
    the most common configuration and its count, ready times."""
    mine = [p for p in points if p["model"] == model]
    autos = [p for p in mine if p["config"] == "auto"]
    per_load = {}
    for load in loads:
        base = {
            p["config"]: p["windows"][load]["goodput_rps"] for p in mine if p["config"] != "auto"
        }
        best = max(base, key=lambda b: base[b] or 0.0)
        g = [p.get("windows", {}).get(load, {}).get("goodput_rps") for p in autos]
        ratios = [round(x / base[best], 3) if x is not None and base[best] else None for x in g]
        per_load[load] = {"best_baseline": best, "best_baseline_goodput_rps": base[best],
                          "ratios": ratios, "passed": [r is not None and r >= RATIO_TARGET for r in ratios]}  # fmt: skip
    chosen = [p.get("identity") for p in autos]
    common = Counter(c for c in chosen if c).most_common(1)
    need = math.ceil(SAME_CONFIG_TARGET * len(autos))
    later = (autos[0].get("later_start") if autos else None) or {}
    return {"model": model, "per_load": per_load, "chosen": chosen,
            "all_ratios_passed": all(all(v["passed"]) for v in per_load.values()),
            "most_common": common[0][0] if common else None,
            "most_common_count": common[0][1] if common else 0,
            "same_config_passed": bool(common) and common[0][1] >= need,
            "first_ready_s": autos[0].get("ready_s") if autos else None,
            "later_start_ready_s": later.get("ready_s"), "later_start_kept": later.get("kept")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0, quiet_wait_s=120.0)
    ap.add_argument("--models", default=",".join(MODELS_DEFAULT))
    ap.add_argument("--deploys", type=int, default=5, help="auto deploys per model")
    ap.add_argument("--loads", default="0.35,0.5", help="x ideal")
    ap.add_argument("--slo-x", type=float, default=3.0, help="SLO = this x L0")
    ap.add_argument("--min-requests", type=int, default=300, help="measured per window")
    ap.add_argument("--measure-s", type=float, default=20.0, help="measured window at least")
    ap.add_argument("--warm-s", type=float, default=15.0, help="unmeasured warm-up, s")

    def quick(a: Any) -> None:
        a.models, a.deploys, a.loads, a.min_requests, a.measure_s, a.warm_s = (
            QUICK_MODEL, 2, "0.35", 40, 3.0, 3.0)  # fmt: skip

    a = harness.cli.parse(ap, argv, quick)
    from infscaler.base.models import MODELS

    if bad := sorted(m for m in a.models.split(",") if m not in MODELS or MODELS[m].shapes):
        ap.error(f"unknown or dynamic-shape models {bad}: choose bundled fixed-shape aliases")
    res = harness.cli.start("auto_deploys", a)
    loads = [f"{float(x):g}" for x in a.loads.split(",")]
    for model in a.models.split(","):
        res.summary.setdefault("calibration", {})[model] = run_model(model, a, res)["calibration"]
        res.summary.setdefault("models", []).append(summarise(res.points, model, loads))
    harness.cli.finish(res, a, plot)
    harness.print_table(
        ["model", "load", "best baseline", "auto / best per deploy", "same config"],
        [[m["model"], load, v["best_baseline"], " ".join(str(r) for r in v["ratios"]),
          f"{m['most_common_count']}/{len(m['chosen'])}"]
         for m in res.summary["models"] for load, v in m["per_load"].items()],
    )  # fmt: skip
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """auto / best baseline goodput per deploy, one line per load, one panel per model,
    the 0.95 target as a line."""
    pts = [{"model": m["model"], "load": f"{load} x ideal", "deploy": i, "ratio": r}
           for m in data["summary"]["models"] for load, v in m["per_load"].items()
           for i, r in enumerate(v["ratios"])]  # fmt: skip
    harness.plot(pts, path, x="deploy", y="ratio", by="load", panel="model",
                 hlines={"target": RATIO_TARGET}, ylabel="auto goodput / best baseline's")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
