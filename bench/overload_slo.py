"""Overload at a multiple of capacity, the load generator on the same cores: does
admission keep the SLO it admits to, and does it keep the goodput?

A user who writes ``slo:`` is promised that an admitted request finishes within it,
and that refusing the rest does not cost what the configuration can serve. This script
measures both as a user on the device meets them: one ``infscaler serve`` process, the
load generator (this process) competing with it for the same cores, every request on
its own connection with binary tensor data.

1. **Calibration** (``scaling.calibrate``, in this process before the service starts):
   L0 = the whole model's median latency at 1 intra-op thread; SLO = ``--slo-x`` (3)
   x L0.
2. **The configuration**, written as a pipeline YAML and served: ``replicas`` (default:
   the whole model in ``cores`` single-thread instances), ``one-session`` (one instance
   with ``cores`` threads) or ``auto`` (``slo`` and ``autoscale: {}`` only), each with
   the SLO (``same_config.hand_pipeline`` / ``auto_deploys.auto_config``).
3. **Capacity** C: closed loop, ``--clients`` connections back to back, ``--calibrate``
   requests: completed / wall s.
4. **Sustained rate** R: the highest Poisson open-loop rate the same service answers
   with every request's P99 within the SLO (a refused request counts as later than any,
   ``scaling.p99_every``), by bisection in (0.2 C, 1.1 C), ``--bisect-steps`` steps of at
   least ``--bisect-requests`` requests each (the first ``--warm-s`` of each discarded).
5. **Overload** at each of ``--factors`` (2, 5) x C for ``--duration-s`` (20 s): each
   request gets a result (200), a refusal (429 / 503) whose body is JSON with an
   ``error`` (``overload.one``: a refusal with another body is its own outcome), another
   status, a connection error or none within 60 s. Latency is measured from the
   request's send. Goodput = results within the SLO / the window (s).

Criteria per factor (``checks`` in the JSON): every request answered (result or JSON
refusal, no connection error, none unanswered), admitted P99 <= ``--p99-x`` (1.25) x SLO,
goodput >= ``--goodput-x`` (0.8) x R.

Sampled every 0.25 s (``overload.Sampler``): the service's and its instances' CPU, this
process's (the load generator's) and every other process's (cores).

Writes ``results/overload_slo.json`` and ``.png`` (another ``--config`` adds its name,
another ``--slo-x`` ``_slo<x>x``, ``--quick`` ``_quick``: 6 s windows, 3 bisection steps
of 60 requests; proves the script runs, no result).

```sh
.venv/bin/python bench/overload_slo.py                       # ResNet-50, replicas, 2x and 5x
.venv/bin/python bench/overload_slo.py --config auto --factors 2
```
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scaling_v1 as sc  # noqa: E402
import overload as ov  # noqa: E402
import same_config as sw  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    default_cache_dir,
    environment,
    print_table,
    wait_for_quiet,
    write_json,
)

CONFIGS = ("replicas", "one-session", "auto")


def pipeline_yaml(model: str, config: str, slo_ms: float, cores: int, path: Path) -> Path:
    """The served configuration as a pipeline YAML (module docstring, step 2)."""
    if config == "auto":
        import auto_deploys as ad

        cfg = ad.auto_config(model, model, slo_ms)
    else:
        threads, inst = (1, cores) if config == "replicas" else (cores, 1)
        cfg = sw.hand_pipeline(model, model, threads, inst, slo_ms)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    return path


def window_summary(rows: list[dict[str, Any]], window_s: float, slo_ms: float) -> dict[str, Any]:
    """``overload.summarize`` plus goodput (results within ``slo_ms`` / ``window_s``) and
    the P99 of every request (refusals later than any)."""
    out = ov.summarize(rows, window_s, slo_ms)
    ok = [r["ms"] for r in rows if r["outcome"] == "ok"]
    out["goodput_rps"] = round(sum(x <= slo_ms for x in ok) / window_s, 3)
    p99 = sc.p99_every(ok, len(rows) - len(ok))
    out["p99_every_ms"] = round(p99, 2) if p99 < math.inf else None
    return out


async def open_window(
    sock: str, model: str, body: bytes, headers: dict, rate: float, n: int, warm_s: float, seed: int
) -> tuple[list[dict[str, Any]], float]:
    """Poisson arrivals at ``rate`` for ``warm_s`` + ``n`` / ``rate`` s; returns the rows
    sent after ``warm_s`` and their window, s."""
    duration = warm_s + n / rate
    rows = await ov.open_loop(sock, model, body, headers, rate, duration, seed)
    kept = [r for r in rows if r["t_s"] >= warm_s]
    return kept, duration - warm_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", choices=sorted(sc.MODEL_SETTINGS))
    p.add_argument("--config", default="replicas", choices=CONFIGS)
    p.add_argument("--slo-x", type=float, default=3.0)
    p.add_argument("--factors", default="2,5")
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--calibrate", type=int, default=60)
    p.add_argument("--bisect-steps", type=int, default=5)
    p.add_argument("--bisect-requests", type=int, default=200)
    p.add_argument("--warm-s", type=float, default=2.0)
    p.add_argument("--p99-x", type=float, default=1.25)
    p.add_argument("--goodput-x", type=float, default=0.8)
    p.add_argument("--quiet-wait-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.duration_s, a.bisect_steps, a.bisect_requests, a.calibrate = 6.0, 3, 60, 16
    default_cache_dir()
    from infscaler.api.codec import encode_infer_request

    quiet = wait_for_quiet(a.quiet_wait_s)
    feeds = sc.model_inputs(a.model)
    cal = sc.calibrate(a.model, feeds, 20)
    cores = cal["cores"]
    slo_ms = a.slo_x * cal["l0_ms"]
    tmp = Path(tempfile.mkdtemp(prefix="isc-overload-slo-"))
    target = pipeline_yaml(a.model, a.config, slo_ms, cores, tmp / "pipeline.yaml")
    sock = str(tmp / "s.sock")
    svc = ov.Service(str(target), ["--drain-timeout", "5"], sock, tmp / "serve.log")
    data: dict[str, Any] = {
        "environment": environment(),
        "settings": vars(a),
        "quiet_before": quiet,
        "calibration": cal,
        "slo_ms": round(slo_ms, 2),
        "pipeline": yaml.safe_load(target.read_text()),
    }
    print(f"== {a.model} {a.config}: L0 {cal['l0_ms']} ms, SLO {slo_ms:.1f} ms", flush=True)
    try:
        svc.wait_ready(600)
        body, headers = encode_infer_request(feeds)
        asyncio.run(ov.closed_loop(sock, a.model, body, headers, 1, 8))  # warm
        cap = asyncio.run(ov.closed_loop(sock, a.model, body, headers, a.clients, a.calibrate))
        c = cap["throughput_rps"]
        data["capacity"] = cap
        print(f"  capacity {c}/s (closed loop, {a.clients} clients)", flush=True)
        sampler = ov.Sampler(svc.proc.pid, 0.25).start()

        def run(rate: float) -> dict[str, Any]:
            rows, win = asyncio.run(
                open_window(sock, a.model, body, headers, rate, a.bisect_requests, a.warm_s, a.seed)
            )
            s = window_summary(rows, win, slo_ms)
            p99 = s["p99_every_ms"]
            return {
                "rate": round(rate, 3),
                "passed": p99 is not None and p99 <= slo_ms,
                "p99_ms": p99,
                "throughput_rps": s["goodput_rps"],
                "aborted": None,
                "other_processes_cores": None,
                "summary": s,
            }

        best, trace = sc.bisect(run, 0.2 * c, 1.1 * c, a.bisect_steps)
        sustained = best["summary"]["goodput_rps"] if best else 0.0
        data["sustained"] = {
            "rate_rps": best["rate"] if best else None,
            "goodput_rps": sustained,
            "steps": trace,
        }
        print(f"  sustained within the SLO: {data['sustained']['rate_rps']}/s", flush=True)
        data["overload"] = []
        for f in (float(x) for x in a.factors.split(",")):
            t0 = time.monotonic() - sampler.t0
            rows = asyncio.run(
                ov.open_loop(sock, a.model, body, headers, f * c, a.duration_s, a.seed + 1)
            )
            t1 = time.monotonic() - sampler.t0
            s = window_summary(rows, a.duration_s, slo_ms)
            checks = {
                # no unanswered, connection error, other status or non-JSON refusal
                "every_request_answered": set(s["outcomes"]) <= {"ok", "refused"},
                "admitted_p99_within": s["admitted_p99_ms"] is not None
                and s["admitted_p99_ms"] <= a.p99_x * slo_ms,
                "goodput_within": sustained > 0 and s["goodput_rps"] >= a.goodput_x * sustained,
            }
            entry = {
                "factor": f,
                "rate_rps": round(f * c, 2),
                "window_s": [round(t0, 2), round(t1, 2)],
                "summary": s,
                "goodput_over_sustained": round(s["goodput_rps"] / sustained, 3)
                if sustained
                else None,
                "admitted_p99_over_slo": round(s["admitted_p99_ms"] / slo_ms, 3)
                if s["admitted_p99_ms"]
                else None,
                "checks": checks,
                "passed": all(checks.values()),
                "requests": rows,
            }
            data["overload"].append(entry)
            print(
                f"  {f:g}x ({f * c:.1f}/s): ok {s['admitted']}, refused {s['refused']}, "
                f"admitted P50/P99 {s['admitted_p50_ms']}/{s['admitted_p99_ms']} ms "
                f"({entry['admitted_p99_over_slo']} x SLO), goodput {s['goodput_rps']}/s "
                f"({entry['goodput_over_sustained']} x sustained), passed {entry['passed']}",
                flush=True,
            )
        data["samples"] = sampler.stop()
    finally:
        data["stop"] = svc.stop()
        data["serve_log_tail"] = (tmp / "serve.log").read_text().splitlines()[-40:]
    data["environment"]["load_average_at_end"] = list(os.getloadavg())
    name = "overload_slo" + ("" if a.config == "replicas" else f"_{a.config}")
    name += "" if a.slo_x == 3.0 else f"_slo{a.slo_x:g}x"
    name += "_quick" if a.quick else ""
    write_json(RESULTS_DIR / f"{name}.json", data)
    plot(data, RESULTS_DIR / f"{name}.png")
    print_table(
        [
            "factor",
            "offered/s",
            "ok",
            "refused",
            "P99 ok ms",
            "x SLO",
            "goodput/s",
            "x R",
            "passed",
        ],
        [
            [
                e["factor"],
                e["rate_rps"],
                e["summary"]["admitted"],
                e["summary"]["refused"],
                e["summary"]["admitted_p99_ms"],
                e["admitted_p99_over_slo"],
                e["summary"]["goodput_rps"],
                e["goodput_over_sustained"],
                e["passed"],
            ]
            for e in data.get("overload", [])
        ],
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    """Per overload factor: latency of each request over time (results, refusals), the
    SLO and the P99 bound; and the cores used by the service, its instances, the load
    generator and other processes over the whole run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = data.get("overload", [])
    if not runs:
        return
    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 7), squeeze=False)
    slo = data["slo_ms"]
    p99x = data["settings"]["p99_x"]
    for j, e in enumerate(runs):
        ax = axes[0][j]
        for outcome, color in (("ok", "g"), ("refused", "orange")):
            pts = [r for r in e["requests"] if r["outcome"] == outcome]
            ax.scatter([r["t_s"] for r in pts], [r["ms"] for r in pts], s=3, c=color, label=outcome)
        ax.axhline(slo, color="k", ls=":", lw=1, label="SLO")
        ax.axhline(p99x * slo, color="r", ls="--", lw=1, label=f"{p99x:g} x SLO")
        ax.set_yscale("log")
        ax.set_title(
            f"{data['settings']['model']} {data['settings']['config']}, {e['factor']:g}x "
            f"({e['rate_rps']}/s): P99 {e['admitted_p99_over_slo']} x SLO, goodput "
            f"{e['goodput_over_sustained']} x R",
            fontsize=9,
        )
        ax.set_xlabel("s since the window started")
        ax.set_ylabel("latency from send, ms")
        ax.legend(fontsize=7)
        ax = axes[1][j]
        t0, t1 = e["window_s"]
        rows = [s for s in data.get("samples", []) if t0 <= s["t_s"] <= t1]
        ts = [s["t_s"] - t0 for s in rows]
        for key in ("service_cores", "instances_cores", "loadgen_cores", "other_cores"):
            ax.plot(ts, [s[key] for s in rows], label=key)
        ax.set_ylabel("cores")
        ax.set_xlabel("s since the window started")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
