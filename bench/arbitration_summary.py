"""bench/arbitration.py's summaries of its arms over the rounds: each round's moves
without its requests, medians and spread per arm, each auto arm against the best static
split, and the ratios over the per-pipeline arm. Pure functions of the results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: the two pipelines' names (priority 1 and 2)
HIGH, LOW = "high", "low"


def round_moves(step: dict[str, Any]) -> dict[str, Any]:
    """One round's step window without its requests: the moves, the decisions, the
    instances at the step and each change of the polled instances ``[t_s, {pipeline:
    ready}]`` (what an arm did, kept for every round)."""
    polls = step.get("instances", [])
    changes = [p for i, p in enumerate(polls) if i == 0 or p[1] != polls[i - 1][1]]
    keep = ("moves", "decisions", "instances_at_step")
    return {**{k: step.get(k) for k in keep}, "instance_changes": changes}


def _stats(xs: list[float | None]) -> dict[str, Any]:
    v = [float(x) for x in xs if x is not None]
    if not v:
        return {"median": None, "min": None, "max": None, "values": xs}
    return {
        "median": round(float(np.median(v)), 4),
        "min": round(min(v), 4),
        "max": round(max(v), 4),
        "values": xs,
    }


def spread(runs: list[dict], slots: int | None = None) -> dict[str, Any]:
    """Median, min, max and the values over the rounds of an arm's step outcomes: the
    high pipeline's attainment after the step and over the whole window, each
    pipeline's goodput and their sum; with ``slots``, ``cap_bound_rounds``: the rounds
    whose pipelines ran ``slots`` instances together at the step (the cap bound), and
    ``over_cap_rounds``: more than ``slots`` (the cap did not hold them)."""
    o = [e["step"]["outcomes"] for e in runs]
    out: dict[str, Any] = {"rounds": len(runs)}
    if slots is not None:
        at = [sum((e["step"].get("instances_at_step") or {}).values()) for e in runs]
        out["cap_bound_rounds"] = sum(n == slots for n in at)
        out["over_cap_rounds"] = sum(n > slots for n in at)
    return {
        **out,
        "high_attainment_after": _stats([x[HIGH].get("attainment_after") for x in o]),
        "high_attainment": _stats([x[HIGH].get("attainment") for x in o]),
        "high_goodput_rps": _stats([x[HIGH]["goodput_rps"] for x in o]),
        "low_goodput_rps": _stats([x[LOW]["goodput_rps"] for x in o]),
        "total_goodput_rps": _stats([x[HIGH]["goodput_rps"] + x[LOW]["goodput_rps"] for x in o]),
    }


#: the auto arms: arbitration, arbitration without warm spares, each pipeline's scaler alone
AUTO_ARMS = ("arbitration", "lend-only", "per-pipeline")
#: the metrics ``versus`` compares: the priority-1 pipeline's attainment, total goodput
VERSUS = ("high_attainment_after", "high_attainment", "total_goodput_rps")


def versus(summary: dict[str, dict], best: str) -> dict[str, Any]:
    """Each auto arm run (of :data:`AUTO_ARMS`, in ``summary``) against the best static
    split, per metric of :data:`VERSUS`:
    ``ratio`` (auto median / static median), ``rounds`` (auto / static round by round,
    round r against round r: median, min, max), and ``at_least_static``: the median
    ratios of the high pipeline's attainment after the step and of the total goodput
    both >= 1."""
    out: dict[str, Any] = {"best_static": best}
    for tag in (t for t in AUTO_ARMS if t in summary):
        r: dict[str, Any] = {}
        for k in VERSUS:
            x, b = summary[tag][k]["median"], summary[best][k]["median"]
            pairs = zip(summary[tag][k]["values"], summary[best][k]["values"], strict=False)
            per = [u / v if u is not None and v else None for u, v in pairs]
            r[k] = {
                "ratio": round(x / b, 3) if x is not None and b else None,
                "rounds": _stats(per),
            }
        r["at_least_static"] = all(
            r[k]["ratio"] is not None and r[k]["ratio"] >= 1.0
            for k in ("high_attainment_after", "total_goodput_rps")
        )
        out[tag] = r
    return out


def ratios(arms: dict[str, dict], scenario: str) -> dict[str, Any]:
    """Each arm's outcomes over the ``per-pipeline`` arm's (same run)."""
    base = arms.get("per-pipeline", {}).get(scenario)
    out: dict[str, Any] = {}
    if not base:
        return out
    for tag, e in arms.items():
        if scenario not in e:
            continue
        r = {}
        for name in (HIGH, LOW):
            for k in ("attainment_after", "attainment", "goodput_rps"):
                x, b = e[scenario]["outcomes"][name].get(k), base["outcomes"][name].get(k)
                if x is not None and b:
                    r[f"{name}_{k}"] = round(x / b, 3)
        out[tag] = r
    return out


def plot_rounds(data: dict[str, Any], path: Path) -> None:
    """Per step arm, round by round (``data["step_summary"]``): the high pipeline's
    attainment after the step and the total goodput, one panel each, the best static
    split's median as a line (``harness.plot``)."""
    import harness

    summary = data["step_summary"]
    best = data["auto_vs_best_static"]["best_static"]
    pts = [
        {"metric": k, "arm": tag, "round": r, "value": v, "best_median": summary[best][k]["median"]}
        for k in ("high_attainment_after", "total_goodput_rps")
        for tag in summary
        for r, v in enumerate(summary[tag][k]["values"])
    ]
    st = data["settings"]
    harness.plot(pts, path, x="round", y="value", by="arm", panel="metric",
                 hline_key="best_median", xlabel="round",
                 title=f"{st['high']} (priority 1) / {st['low']} (priority 2), {st['slots']} "
                 f"slots, {st['rounds']} rounds; line: best static ({best}) median")  # fmt: skip
