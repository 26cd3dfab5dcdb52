"""A load step with and without the Tuner: does InferLine's proactive scale-out
(``autoscale: {tuner: true}``, ``runtime/scaling/tuner.py``; Crankshaw et al., SoCC '20,
§5 "High-Frequency Tuning") start instances sooner after a step, and how many requests
that missed the SLO does it save?

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``tuner.py``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arbitration as ab  # noqa: E402 - its pure step helpers: two_rates, attainment, at_step
import harness  # noqa: E402
from harness.scenarios import OFFLINE, SINGLE_STREAM  # noqa: E402

NAME = "det"
ARMS = ("tuner", "scaler")
SCALE_OUTS = ("scale_out", "tuner_scale_out")
#: idle after the warm-up, s: longer than the offered window the Tuner reads its arrival
#: times from (10 s, ``PipelineStats.offered_times``) and the scaler's settle window (5 s)
WARM_IDLE_S = 11.0


def host_device_yaml(path: Path) -> Path:
    """This host's ``cpu-host`` profile, unchanged, as a device YAML (the cap)."""
    from infscaler.base.device import host_profile

    path.write_text(yaml.safe_dump(host_profile().model_dump(mode="json", exclude_none=True)))
    return path


def auto_pipeline(model: str, slo_ms: float, tuner: bool, max_instances: int) -> dict:
    """The whole model in single-thread instances, autoscaled 1..``max_instances``,
    the Tuner on or off."""
    auto = {**harness.models.AUTOSCALE, "tuner": tuner}
    cfg = harness.models.pipeline(
        model, NAME, 1, 1, slo_ms, auto, max_instances=max_instances, whole=True
    )
    return cfg.model_dump(mode="json", exclude_none=True)


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
    """The arm's outcomes (the method) from its requests, decisions (``t_s``: s
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


RATIO_KEYS = ("to_decision_s", "to_ready_s", "missed_after_step", "attainment_after",
              "p99_after_ms")  # fmt: skip


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


def run_arm(res: harness.Result, a: Any, tag: str, pipe: dict, device: Path, feeds: dict,
            times: np.ndarray, slo_ms: float) -> dict[str, Any]:  # fmt: skip
    """One fresh service: warm-up, idle, the step replayed; its outcomes."""
    from infscaler.api.loadgen import LoadGenerator

    with harness.Sut([pipe], args=["--device", str(device), "--drain-timeout", "5"]) as s:
        s.watch(1.0)
        res.own_pids[:] = [s.pid]
        harness.scenarios.run(s.sock, NAME, feeds, SINGLE_STREAM, duration_s=1.0)  # warm
        time.sleep(WARM_IDLE_S)  # the warm-up out of the Tuner's envelope
        wall0 = time.time()
        rows = LoadGenerator(s.sock, NAME, feeds).replay(times)
        time.sleep(1.5)  # the last status poll
        decisions, polls = s.since(wall0)
    polls = [(t, n.get(NAME, 0)) for t, n in polls]
    out = outcomes(rows, decisions, polls, slo_ms, a.pre_s)
    keys = ("t_s", "action", "unit", "engine", "count", "needed", "reason")
    return {"pipeline": pipe, "outcomes": out, "instances": polls, "requests": rows,
            "decisions": [{k: d.get(k) for k in keys} for d in decisions]}  # fmt: skip


def capacity(a: Any, device: Path, feeds: dict) -> dict[str, Any]:
    """The served L0 (single stream P50) and C (offline, 2 in flight) on 2 static
    single-thread instances, no SLO."""
    pipe = harness.models.static_pipeline(a.model, NAME, 1, 2)
    with harness.Sut([pipe], args=["--device", str(device)]) as s:
        run = harness.scenarios.run
        l0 = run(s.sock, NAME, feeds, SINGLE_STREAM, duration_s=a.l0_s, warmup_s=1.0)
        c = run(s.sock, NAME, feeds, OFFLINE, 2, duration_s=a.duration_s, warmup_s=2.0)
    return {"served_l0_ms": l0["p50_ms"], "throughput_rps": c["throughput_rps"], "point": c}


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=12.0, quiet_wait_s=120.0)
    ap.add_argument("--model", default="ppocrv4-det")
    ap.add_argument("--slo-x", type=float, default=2.0)
    ap.add_argument("--l0", choices=("served", "session"), default="served")
    ap.add_argument("--l0-s", type=float, default=6.0)
    ap.add_argument("--max-instances", type=int, default=3)
    ap.add_argument("--before", type=float, default=0.1)
    ap.add_argument("--after", type=float, default=0.5)
    ap.add_argument("--pre-s", type=float, default=30.0)
    ap.add_argument("--post-s", type=float, default=60.0)

    def quick(a: Any) -> None:
        a.pre_s, a.post_s, a.l0_s = 12.0, 20.0, 3.0

    a = harness.cli.parse(ap, argv, quick)
    if a.max_instances < 2:
        ap.error(f"--max-instances must be >= 2 (room to scale out), got {a.max_instances}")
    res = harness.cli.start("tuner", a)
    feeds = harness.models.model_inputs(a.model)
    cal = harness.models.calibrate(a.model, feeds, 10 if a.quick else 20)
    device = host_device_yaml(Path(tempfile.mkdtemp(prefix="isc-tuner-")) / "device.yaml")
    cap = capacity(a, device, feeds)
    c = cap["throughput_rps"]
    if not c > 0:
        raise SystemExit(f"the capacity is 0 (nothing answered): {cap}")
    l0 = cap["served_l0_ms"] if a.l0 == "served" else cal["l0_ms"]
    slo = round(a.slo_x * l0, 2)
    res.summary.update(calibration=cal, capacity=cap, l0_ms=l0, slo_ms=slo)
    print(f"== {a.model}: L0 ({a.l0}) {l0} ms, SLO {slo} ms; C {c}/s: step "
          f"{a.before * c:.2f} -> {a.after * c:.2f}/s", flush=True)  # fmt: skip
    times = ab.two_rates(a.before * c, a.pre_s, a.after * c, a.post_s, a.seed)
    arms = {}
    for tag in ARMS:
        pipe = auto_pipeline(a.model, slo, tag == "tuner", a.max_instances)
        arms[tag] = run_arm(res, a, tag, pipe, device, feeds, times, slo)
        res.points += per_second(tag, arms[tag], slo)
    res.summary["arms"] = {t: {k: v for k, v in e.items() if k != "requests"}
                           for t, e in arms.items()}  # fmt: skip
    res.summary["ratios_tuner_over_scaler"] = ratios(arms)
    harness.cli.finish(res, a, plot)
    report(arms)
    print("tuner / scaler:", res.summary["ratios_tuner_over_scaler"])
    return 0


def per_second(tag: str, arm: dict[str, Any], slo_ms: float) -> list[dict[str, Any]]:
    """The arm's points: SLO attainment per 1-s window (by send time) and ready instances."""
    rs = arm["requests"]
    end = int(max((r["t_s"] for r in rs), default=0)) + 1
    att = [ab.attainment([r for r in rs if w <= r["t_s"] < w + 1], slo_ms) for w in range(end)]
    series = [("SLO attainment", enumerate(att)), ("ready instances", arm["instances"])]
    return [{"arm": tag, "metric": m, "t_s": t, "value": v} for m, tv in series for t, v in tv]


def report(arms: dict[str, Any]) -> None:
    """The compact table on stdout."""
    rows = []
    for tag, e in arms.items():
        o = e["outcomes"]
        first = o["first_scale_out"] or {}
        rows.append([tag, first.get("action"), o["to_decision_s"], o["to_ready_s"],
                     f"{o['between']['missed']}/{o['between']['sent']}", o["missed_after_step"],
                     o["attainment_before"], o["attainment_after"], o["p99_after_ms"]])  # fmt: skip
    harness.print_table(["arm", "first scale-out", "to decision s", "to ready s", "missed before it",
                         "missed after step", "att. before", "after", "P99 after ms"], rows)  # fmt: skip


def plot(data: dict[str, Any], path: Path) -> None:
    """Per arm over the run: SLO attainment per second and ready instances."""
    harness.plot(data["points"], path, x="t_s", y="value", by="arm", panel="metric",
                 xlabel="s since the window started (step at --pre-s)")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
