"""A load step with and without the Tuner: does InferLine's proactive scale-out
(``autoscale: {tuner: true}``, ``runtime/scaling/tuner.py``; Crankshaw et al., SoCC '20,
§5 "High-Frequency Tuning") start instances sooner after a step, and how many requests
that missed the SLO does it save?

Writes ``results/tuner.json`` and ``.png`` (``--quick``: ``_quick``, short windows:
proves the script runs, no result).

More (details, why it is so, history, figures): bench/HISTORY.md, "`bench/tuner.py`".
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
import yaml

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

NAME = "det"
ARMS = ("tuner", "scaler")
SCALE_OUTS = ("scale_out", "tuner_scale_out")
#: idle after the warm-up, s: longer than the offered window the Tuner reads its arrival
#: times from (10 s, ``PipelineStats.offered_times``), so the 4 back-to-back warm-up
#: requests are not a burst in its envelope (in a first run they made the Tuner arm
#: scale out 3.6 s into the window), and longer than the scaler's settle window (5 s)
WARM_IDLE_S = 11.0


# -- configurations --------------------------------------------------------------------------


def host_device_yaml(path: Path) -> Path:
    """This host's ``cpu-host`` profile, unchanged, as a device YAML (the cap)."""
    from infscaler.base.device import host_profile

    path.write_text(yaml.safe_dump(host_profile().model_dump(mode="json", exclude_none=True)))
    return path


def auto_pipeline(model: str, slo_ms: float, tuner: bool, max_instances: int) -> dict:
    """The whole model in single-thread instances, autoscaled 1..``max_instances``,
    the Tuner on or off."""
    auto = {**sc.AUTOSCALE, "tuner": tuner}
    cfg = sc.pipeline(model, NAME, 1, 1, slo_ms, auto, max_instances=max_instances, whole=True)
    return cfg.model_dump(mode="json", exclude_none=True)


def capacity(tmp: Path, a: argparse.Namespace, device: Path, req: tuple) -> dict:
    """C: closed loop with 2 clients on 2 static single-thread instances, no SLO; and the
    served L0 before it (``arbitration.served_l0``)."""
    pipe = ab.static_pipeline(a.model, NAME, None, 1, 2)
    s = ab.Served(tmp, "capacity", [pipe], device, {}).start()
    body, headers = req
    try:
        l0 = ab.served_l0(s.sock, NAME, req)
        out = asyncio.run(ov.closed_loop(s.sock, NAME, body, headers, 2, a.capacity_requests))
    finally:
        out_stop = s.stop()
    return {**out, "served_l0_ms": l0, "stop": out_stop}


def step_times(c: float, a: argparse.Namespace) -> np.ndarray:
    """Poisson at ``--before`` x C for ``--pre-s``, then ``--after`` x C for ``--post-s``."""
    return ab.two_rates(a.before * c, a.pre_s, a.after * c, a.post_s, a.seed)


# -- outcomes --------------------------------------------------------------------------------


def _missed(rows: list[dict], slo_ms: float) -> int:
    return sum(not ok for ok in ab.within_slo(rows, slo_ms))


def _p99(rows: list[dict]) -> float | None:
    ms = [r["ms"] for r in rows if r["outcome"] == "ok"]
    return round(float(np.percentile(ms, 99)), 2) if ms else None


def _span(rows: list[dict], slo_ms: float, lo: float, hi: float = np.inf) -> dict[str, int]:
    """Requests sent in [lo, hi) and how many missed the SLO."""
    mine = [r for r in rows if lo <= r["t_s"] < hi]
    return {"sent": len(mine), "missed": _missed(mine, slo_ms)}


def outcomes(
    rows: list[dict], decisions: list[dict], polls: list[tuple], slo_ms: float, step_s: float
) -> dict[str, Any]:
    """The arm's outcomes (module docstring) from its requests, decisions (``t_s``: s
    since the window started) and instance polls (``(t_s, ready)``)."""
    at_step = ab.at_step(polls, step_s)
    first = next((d for d in decisions if d["action"] in SCALE_OUTS and d["t_s"] >= step_s), None)
    out: dict[str, Any] = {
        "instances_at_step": at_step,
        "scale_outs_before_step": [
            d for d in decisions if d["action"] in SCALE_OUTS and d["t_s"] < step_s
        ],
        "first_scale_out": first,
        "to_decision_s": None,
        "to_ready_s": None,
        "attainment_before": ab.attainment([r for r in rows if r["t_s"] < step_s], slo_ms),
        "attainment_after": ab.attainment([r for r in rows if r["t_s"] >= step_s], slo_ms),
        "p99_before_ms": _p99([r for r in rows if r["t_s"] < step_s]),
        "p99_after_ms": _p99([r for r in rows if r["t_s"] >= step_s]),
        "missed_after_step": _span(rows, slo_ms, step_s)["missed"],
        "sent": len(rows),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in {r["outcome"] for r in rows}},
    }
    if first is None:
        out["between"] = _span(rows, slo_ms, step_s)
        out["after_decision"] = None
        return out
    t_dec = first["t_s"]
    out["to_decision_s"] = round(t_dec - step_s, 2)
    ready = next((t for t, n in polls if t >= t_dec and at_step is not None and n > at_step), None)
    out["to_ready_s"] = None if ready is None else round(ready - step_s, 2)
    out["between"] = _span(rows, slo_ms, step_s, t_dec)
    out["after_decision"] = _span(rows, slo_ms, t_dec)
    return out


def run_arm(
    tmp: Path,
    tag: str,
    pipe: dict,
    device: Path,
    req: tuple,
    times: np.ndarray,
    slo_ms: float,
    step_s: float,
) -> dict[str, Any]:
    """One fresh service: warm-up, the step, its outcomes and the CPU samples."""
    s = ab.Served(tmp, tag, [pipe], device, {}).start()
    out: dict[str, Any] = {"pipeline": pipe}
    sampler = ov.Sampler(s.svc.proc.pid, 0.5).start()
    body, headers = req
    try:
        asyncio.run(ov.closed_loop(s.sock, NAME, body, headers, 1, 4))  # warm
        time.sleep(WARM_IDLE_S)  # the warm-up's back-to-back requests out of the envelope
        wall0 = time.time()
        rows = asyncio.run(ab.replay(s.sock, NAME, req, times))
        time.sleep(1.5)  # the last status poll
        decisions, polls = s.since(wall0)
        polls = [(t, n.get(NAME, 0)) for t, n in polls]
    finally:
        out["samples"] = sampler.stop()
        out["stop"] = s.stop()
    out["outcomes"] = outcomes(rows, decisions, polls, slo_ms, step_s)
    out["decisions"] = [
        {k: d.get(k) for k in ("t_s", "action", "unit", "engine", "count", "needed", "reason")}
        for d in decisions
    ]
    out["instances"] = polls
    out["requests"] = rows
    out["other_processes_cores"] = ab.mean_other_cores(out["samples"])
    return out


RATIO_KEYS = (
    "to_decision_s",
    "to_ready_s",
    "missed_after_step",
    "attainment_after",
    "p99_after_ms",
)


def ratios(arms: dict[str, dict]) -> dict[str, float | None]:
    """``tuner`` / ``scaler`` per outcome (None where either is missing or the
    denominator is 0), and the requests missed between the step and the scale-out."""
    t, s = arms["tuner"]["outcomes"], arms["scaler"]["outcomes"]
    out: dict[str, float | None] = {}
    for k in RATIO_KEYS:
        x, b = t.get(k), s.get(k)
        out[k] = round(x / b, 3) if x is not None and b else None
    x, b = t["between"]["missed"], s["between"]["missed"]
    out["missed_before_scale_out"] = round(x / b, 3) if b else None
    return out


# -- the run ---------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ppocrv4-det")
    p.add_argument("--slo-x", type=float, default=2.0)
    p.add_argument("--l0", choices=("served", "session"), default="served")
    p.add_argument("--max-instances", type=int, default=3)
    p.add_argument("--before", type=float, default=0.1)
    p.add_argument("--after", type=float, default=0.5)
    p.add_argument("--pre-s", type=float, default=30.0)
    p.add_argument("--post-s", type=float, default=60.0)
    p.add_argument("--capacity-requests", type=int, default=60)
    p.add_argument("--quiet-wait-s", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.pre_s, a.post_s, a.capacity_requests, a.quiet_wait_s = 12.0, 20.0, 16, 5.0
    if a.max_instances < 2:
        p.error(f"--max-instances must be >= 2 (room to scale out), got {a.max_instances}")
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
    req = encode_infer_request(feeds)
    tmp = Path(tempfile.mkdtemp(prefix="isc-tuner-"))
    device = host_device_yaml(tmp / "device.yaml")
    cap = capacity(tmp, a, device, req)
    c = cap["throughput_rps"]
    if not c > 0:
        raise SystemExit(f"the capacity is 0 (nothing answered): {cap}")
    l0 = cap["served_l0_ms"] if a.l0 == "served" else cal["l0_ms"]
    slo = a.slo_x * l0
    data.update(calibration=cal, l0_ms=l0, slo_ms=round(slo, 2))
    print(f"== {a.model}: L0 ({a.l0}) {l0} ms (session {cal['l0_ms']}), SLO {slo:.1f} ms")
    data["capacity"] = cap
    print(f"  C (2 instances) {c}/s: step {a.before * c:.2f} -> {a.after * c:.2f}/s", flush=True)
    times = step_times(c, a)
    data["sent"] = int(times.size)
    arms = {}
    for tag in ARMS:
        print(f"  {tag} arm", flush=True)
        pipe = auto_pipeline(a.model, slo, tag == "tuner", a.max_instances)
        arms[tag] = run_arm(tmp, tag, pipe, device, req, times, slo, a.pre_s)
    data["arms"] = arms
    data["ratios_tuner_over_scaler"] = ratios(arms)
    data["environment"]["load_average_at_end"] = list(os.getloadavg())
    name = "tuner" + ("_quick" if a.quick else "")
    write_json(RESULTS_DIR / f"{name}.json", data)
    plot(data, RESULTS_DIR / f"{name}.png")
    report(data)
    return 0


def report(data: dict[str, Any]) -> None:
    """The compact table on stdout."""
    rows = []
    for tag, e in data["arms"].items():
        o = e["outcomes"]
        first = o["first_scale_out"] or {}
        rows.append(
            [
                tag,
                first.get("action"),
                first.get("count"),
                o["to_decision_s"],
                o["to_ready_s"],
                f"{o['between']['missed']}/{o['between']['sent']}",
                o["missed_after_step"],
                o["attainment_before"],
                o["attainment_after"],
                o["p99_after_ms"],
                e["other_processes_cores"],
            ]
        )
    print_table(
        [
            "arm",
            "first scale-out",
            "count",
            "to decision s",
            "to ready s",
            "missed before it",
            "missed after step",
            "att. before",
            "after",
            "P99 after ms",
            "other cores",
        ],
        rows,
    )
    print("tuner / scaler:", data["ratios_tuner_over_scaler"])


def plot(data: dict[str, Any], path: Path) -> None:
    """Per arm: SLO attainment per 1-s window (by send time) with the step, the first
    scale-out (dashed) and the new instance ready (dotted); ready instances per poll."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step_s = data["settings"]["pre_s"]
    slo = data["slo_ms"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for tag, e in data["arms"].items():
        rs = e["requests"]
        end = int(max((r["t_s"] for r in rs), default=0)) + 1
        ys = [ab.attainment([r for r in rs if w <= r["t_s"] < w + 1], slo) for w in range(end)]
        (line,) = axes[0].plot(range(end), [np.nan if y is None else y for y in ys], label=tag)
        o = e["outcomes"]
        for key, ls in (("to_decision_s", "--"), ("to_ready_s", ":")):
            if o[key] is not None:
                for ax in axes:
                    ax.axvline(step_s + o[key], color=line.get_color(), ls=ls, lw=1)
        ts = [t for t, _ in e["instances"]]
        axes[1].step(ts, [n for _, n in e["instances"]], where="post", label=tag)
    for ax in axes:
        ax.axvline(step_s, color="k", lw=1)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("SLO attainment per 1 s")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylabel("ready instances")
    axes[1].set_xlabel("s since the window started")
    st = data["settings"]
    axes[0].set_title(
        f"{st['model']}, SLO {st['slo_x']:g} x L0 = {slo} ms, step {st['before']} -> "
        f"{st['after']} x C at {step_s:g} s; dashed: first scale-out, dotted: ready",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
