"""How close is the scaler's P99 model to the P99 a served pipeline shows, with the
service time's median alone (M/D/c) and with its measured tail too (M/G/c)?

The scale-in guard, the Tuner's planned rate and arbitration's donor guard all ask
``queueing.p99_response_ms`` whether a count of instances keeps a unit's P99 within
its SLO share at a rate. Fed the live median service time alone it assumes a
deterministic service (M/D/c); on a loaded host the service time stretches (the front
end, the load generator and the instances share the cores), and a model that ignores
the stretch is optimistic exactly where the decisions matter. Here the same model is
fed the unit's live compute P50 alone, and its P50 and P99 (``service_p99_ms``: a
shifted-exponential service, ``queueing.service_moments``), and both are compared with
the P99 the clients measured.

Writes ``results/p99_model.json`` and ``.png`` (``--quick``: ``_quick``, short
points: proves the script runs, no result).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/p99_model.py`".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arbitration as ab  # noqa: E402
import overload as ov  # noqa: E402
import scaling as sc  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    default_cache_dir,
    environment,
    print_table,
    wait_for_quiet,
    write_json,
)
from tuner import host_device_yaml  # noqa: E402

NAME = "m"


def unit_compute(sock: str) -> dict[str, float | None]:
    """The pipeline's (single) unit's compute P50 / P99 (ms) and count from ``status``."""
    from infscaler.api.client import Client

    with Client(sock, timeout=10) as c:
        (p,) = [p for p in c.status()["pipelines"] if p["name"] == NAME]
    u = p["units"][0]
    return {k: u.get(k) for k in ("compute_p50_ms", "compute_p99_ms", "count")}


def predict(rate: float, c: int, comp: dict, overhead_ms: float) -> dict[str, float | None]:
    """The M/D/c and M/G/c predictions of the client P99 at ``rate``/s, ms."""
    from infscaler.runtime.queueing import p99_response_ms

    p50, p99 = comp["compute_p50_ms"], comp["compute_p99_ms"]
    if not p50:
        return {"md_c_ms": None, "mg_c_ms": None}
    md = p99_response_ms(rate, c, p50) + overhead_ms
    mg = p99_response_ms(rate, c, p50, p99) + overhead_ms
    return {"md_c_ms": round(md, 1), "mg_c_ms": round(mg, 1)}


def _err(model: float | None, measured: float | None) -> float | None:
    if model is None or not measured or not np.isfinite(model):
        return None
    return round((model - measured) / measured, 3)


def run_config(
    tmp: Path, c: int, a: argparse.Namespace, device: Path, req: tuple, l0_session: float
) -> dict:
    from infscaler.api.loadgen import arrival_times

    pipe = ab.static_pipeline(a.model, NAME, None, 1, c)
    s = ab.Served(tmp, f"c{c}", [pipe], device, {}).start()
    body, headers = req
    out: dict[str, Any] = {"instances": c, "points": []}
    sampler = ov.Sampler(s.svc.proc.pid, 0.5).start()
    try:
        asyncio.run(ov.closed_loop(s.sock, NAME, body, headers, 1, 4))
        l0 = ab.served_l0(s.sock, NAME, req)
        idle = unit_compute(s.sock)
        overhead = max(0.0, l0 - (idle["compute_p50_ms"] or l0))
        out.update(served_l0_ms=l0, idle_compute=idle, overhead_ms=round(overhead, 2))
        for i, load in enumerate(a.loads):
            rate = load * c * 1000.0 / l0_session
            times = arrival_times("poisson", rate, a.seconds, a.seed + i)
            rows = asyncio.run(ab.replay(s.sock, NAME, req, times))
            comp = unit_compute(s.sock)
            ms = [r["ms"] for r in rows if r["outcome"] == "ok" and r["t_s"] >= 5.0]
            measured = round(float(np.percentile(ms, 99)), 1) if ms else None
            pred = predict(rate, c, comp, overhead)
            out["points"].append(
                {
                    "load": load,
                    "rate_rps": round(rate, 3),
                    "sent": len(rows),
                    "answered": len(ms),
                    "outcomes": {
                        o: sum(r["outcome"] == o for r in rows)
                        for o in {r["outcome"] for r in rows}
                    },
                    "compute": comp,
                    "measured_p99_ms": measured,
                    **pred,
                    "md_c_err": _err(pred["md_c_ms"], measured),
                    "mg_c_err": _err(pred["mg_c_ms"], measured),
                }
            )
            p = out["points"][-1]
            print(
                f"  c={c} load {load} ({rate:.2f}/s): measured P99 {measured} ms, "
                f"M/D/c {p['md_c_ms']} ({p['md_c_err']}), M/G/c {p['mg_c_ms']} ({p['mg_c_err']}); "
                f"compute P50/P99 {comp['compute_p50_ms']}/{comp['compute_p99_ms']}",
                flush=True,
            )
            time.sleep(2.0)
    finally:
        out["samples"] = sampler.stop()
        out["stop"] = s.stop()
    out["other_processes_cores"] = ab.mean_other_cores(out["samples"])
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ppocrv4-det")
    ap.add_argument("--loads", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.75])
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quiet-wait-s", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.loads, a.seconds = [0.3, 0.6], 12.0
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    default_cache_dir()
    from infscaler.api.codec import encode_infer_request

    quiet = wait_for_quiet(a.quiet_wait_s)
    data: dict[str, Any] = {
        "environment": environment(),
        "settings": vars(a),
        "quiet_before": quiet,
    }
    feeds = sc.model_inputs(a.model)
    cal = sc.calibrate(a.model, feeds, 10 if a.quick else 20)
    data["calibration"] = cal
    req = encode_infer_request(feeds)
    tmp = Path(tempfile.mkdtemp(prefix="isc-p99-"))
    device = host_device_yaml(tmp / "device.yaml")
    print(f"== {a.model}: L0 (session) {cal['l0_ms']} ms", flush=True)
    data["configs"] = [run_config(tmp, c, a, device, req, cal["l0_ms"]) for c in (1, 2)]
    errs = {
        k: [abs(p[k]) for cfg in data["configs"] for p in cfg["points"] if p[k] is not None]
        for k in ("md_c_err", "mg_c_err")
    }
    data["mean_abs_error"] = {
        k: round(float(np.mean(v)), 3) if v else None for k, v in errs.items()
    }
    data["optimistic_points"] = {
        k: sum(p[k] is not None and p[k] < -0.1 for cfg in data["configs"] for p in cfg["points"])
        for k in ("md_c_err", "mg_c_err")
    }
    data["environment"]["load_average_at_end"] = list(os.getloadavg())
    name = "p99_model" + ("_quick" if a.quick else "")
    write_json(RESULTS_DIR / f"{name}.json", data)
    plot(data, RESULTS_DIR / f"{name}.png")
    rows = [
        [
            cfg["instances"],
            p["load"],
            p["rate_rps"],
            p["measured_p99_ms"],
            p["md_c_ms"],
            p["md_c_err"],
            p["mg_c_ms"],
            p["mg_c_err"],
        ]
        for cfg in data["configs"]
        for p in cfg["points"]
    ]
    print_table(["c", "load", "rate/s", "measured P99", "M/D/c", "err", "M/G/c", "err"], rows)
    print(
        f"mean |error|: {data['mean_abs_error']}; optimistic by > 10 %: {data['optimistic_points']}"
    )
    return 0


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data["configs"]), figsize=(10, 4), squeeze=False)
    for ax, cfg in zip(axes[0], data["configs"], strict=True):
        pts = cfg["points"]
        x = [p["rate_rps"] for p in pts]
        ax.plot(x, [p["measured_p99_ms"] for p in pts], "ko-", label="measured P99")
        ax.plot(x, [p["md_c_ms"] for p in pts], "s--", label="M/D/c (compute P50)")
        ax.plot(x, [p["mg_c_ms"] for p in pts], "^--", label="M/G/c (P50 + P99)")
        ax.set_title(f"{cfg['instances']} instance(s)")
        ax.set_xlabel("Poisson rate, requests/s")
        ax.set_ylabel("P99 latency, ms")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
