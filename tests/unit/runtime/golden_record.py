"""The decisions and figures the golden comparison records: one function per policy,
each over its parameter grid from :mod:`.cases`, called through the policies' public
entry points (the same before and after the one-model change). ``gen_models_golden.py``
wrote their output from the code before it; ``test_models_golden.py`` compares."""

from __future__ import annotations

import dataclasses
from typing import Any

from infscaler.modelless.selector import served_capacity_qps, vertical_scale
from infscaler.runtime.planning import livecheck, resources
from infscaler.runtime.scaling import arbitration, scaler, tuner
from infscaler.runtime.serving import admission
from tests.unit.runtime import golden_cases as cases


def _dec(d: Any) -> Any:
    if d is None:
        return None
    return [d.action, d.unit, d.engine, d.queue_limit, d.threads, d.from_threads]


def scaler_records() -> list[dict]:
    out = []
    for p in cases.scaler_params():
        s = cases.snapshot(p)
        ds, st = scaler.decide(s, cases.scaler_state(), cases.scaler_config())
        later = dataclasses.replace(s, now=s.now + 3.0)  # past sustain_s: a violation acts
        ds2, _ = scaler.decide(later, st, cases.scaler_config())
        v = tuner.scale_out_now(
            s, cases.arrivals(max(s.arrival_rate, 1.0) * 3.0), cases.scaler_state()
        )
        out.append(
            {
                "capacity_rps": scaler.pipeline_capacity_rps(s),
                "shed_limit": scaler.shed_queue_limit(s),
                "slo_rate_rps": tuner.slo_rate_rps(s),
                "decisions": [_dec(d) for d in ds],
                "decisions_later": [_dec(d) for d in ds2],
                "tuner": [_dec(v.decision), v.blocked, v.count, v.needed, v.required_rps],
            }
        )
    return out


def arbitration_records() -> list[dict]:
    params = cases.scaler_params()
    out = []
    for i in range(0, len(params) - 1, 7):
        a, b = cases.snapshot(params[i]), cases.snapshot(params[i + 1])
        used = sum(u.total_instances for u in (*a.units, *b.units))
        cap = dataclasses.replace(a.cap, max_instances={"cpu": used})  # at the cap
        a = dataclasses.replace(a, cap=cap, instances_used={"cpu": used})
        b = dataclasses.replace(b, cap=cap, instances_used={"cpu": used}, p99_ms=b.slo_ms / 4)
        for pa, pb in ((1, 2), (2, 2)):
            views = [
                arbitration.PipelineView("a", pa, a, violated=True, blocked=True),
                arbitration.PipelineView("b", pb, b),
            ]
            moves, _ = arbitration.arbitrate(views, arbitration.ArbitrationState())
            out.append({"moves": [dataclasses.astuple(m)[:6] for m in moves]})
    return out


def admission_records() -> list[dict]:
    out = []
    for ahead, s, itv, slo, units, rem, len_, ov in cases.admission_params():
        a = admission.admit_latency(
            ahead, s, itv, slo, "SLO", rem, units, lenience=len_, overloaded=ov
        )
        rec: dict[str, Any] = {"admit": a.admit, "estimate_ms": a.estimate_ms}
        if units and s is not None:
            rec["drain_ms"] = admission.drain_ms(ahead, s, units)
        out.append(rec)
    return out


def livecheck_records() -> list[dict]:
    out = []
    for p in cases.livecheck_params():
        serving = cases.expected(p)
        other = cases.expected(p, "other", 0.7)
        v, st = livecheck.check(cases.observed(p), cases.live_state(), serving, other)
        live = None if p[5] is None else p[5]
        out.append(
            {
                "capacity_rps": serving.capacity_rps,
                "capacity_at": serving.capacity_at(live),
                "verdict": v.action,
                "phase": st.phase,
            }
        )
    return out


def resources_records() -> list[dict]:
    out = []
    for p in cases.resources_params():
        units, cfg, cores = cases.resources_case(p)
        out.append({"capacity_rps": resources.capacity_rps(units, cfg, cores)})
    return out


def selector_records() -> list[dict]:
    out = []
    for p in cases.selector_params():
        prof, load, rep = cases.selector_case(p)
        act = vertical_scale(prof, load, cases.variants(), can_replicate=rep)
        out.append(
            {
                "served_qps": served_capacity_qps(prof, load),
                "action": None if act is None else [act.action, act.target, act.instances],
            }
        )
    return out


ALL = {
    "scaler": scaler_records,
    "arbitration": arbitration_records,
    "admission": admission_records,
    "livecheck": livecheck_records,
    "resources": resources_records,
    "selector": selector_records,
}
