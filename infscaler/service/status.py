"""The service's status and statistics (``GET /v2/infscaler/status``, ``infscaler status``,
the per-unit part of the model statistics), read from a running
:class:`~infscaler.service.service.Service`; nothing here changes it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from infscaler.runtime.scaling.control import DeploymentView as Deployment
from infscaler.runtime.scaling.monitor import Monitor, step_totals
from infscaler.runtime.scaling.telemetry import jetson_sampler

if TYPE_CHECKING:
    from infscaler.runtime.processes.supervisor import Supervisor

__all__ = [
    "StatusSource",
    "cpu_priority",
    "degraded_reasons",
    "pipeline_status",
    "service_status",
]


class StatusSource(Protocol):
    """What the builders read of a running service
    (:class:`~infscaler.service.service.Service` has all of it); the service imports this
    module, so it is described here rather than imported."""

    supervisor: Supervisor | None
    channel: Any
    pool: Any
    manager: Any
    frontend: Any
    autoscaler: Any
    inflight: Any
    started_at: float | None
    cpu_wake_latency_us: int | None
    cpu_wake_latency_reason: str
    cpu_wake_auto: bool
    cpu_wake_auto_reason: str

    @property
    def stopping(self) -> bool: ...

    @property
    def cpu_wake_latency_held(self) -> bool: ...

    def device_profile(self) -> Any: ...

    def deployments(self) -> Sequence[Any]: ...

    def ready(self, name: str | None = None) -> bool: ...

    def degraded(self, name: str) -> list[str]: ...


def degraded_reasons(supervisor: Supervisor | None, dep: Deployment) -> list[str]:
    """Why ``dep`` is degraded: one line per served unit with no ready instance of its
    current stage (a pending restart with its delay and crash streak, or a replacement
    loading); [] when every unit has one, or when there is no supervisor yet."""
    if supervisor is None:
        return []
    handles = supervisor.handles()
    out = []
    for u in dep.pipeline.served_units():
        sid = dep.route.stage_ids[u.index]
        mine = [h for h in handles if h.key == (dep.name, u.index) and h.stage_id == sid]
        if any(h.state == "ready" for h in mine):
            continue
        pending = [p for p in supervisor.pending_restarts((dep.name, u.index)) if p.stage_id == sid]
        if pending:
            p = min(pending, key=lambda p: p.due)
            left = max(0.0, p.due - time.monotonic())
            out.append(
                f"unit {u.name} has no live instance (restart {p.restarts} in {left:.1f} s "
                f"after {p.streak} consecutive crash(es): {p.reason})"
            )
        elif any(h.state == "starting" for h in mine):
            out.append(f"unit {u.name} has no live instance (its replacement is loading)")
        else:
            out.append(f"unit {u.name} has no live instance")
    return out


def pipeline_status(svc: StatusSource, dep: Deployment) -> dict[str, Any]:
    """One deployed pipeline's entry of ``pipelines`` in ``GET /v2/infscaler/status``.

    Per unit: partition, B_k, instances, queue length, P50 / P99 compute and queue ms, the
    slowdown after idle and a fused unit's steps; for the pipeline: ready, why degraded, SLO,
    window, queue limit, the scaler's last 10 decisions and the request counters.
    """

    ch = svc.channel.stats()
    snap = dep.route.stats.snapshot()
    handles = [h for h in svc.supervisor.handles() if h.key[0] == dep.name]
    units = []
    for u in dep.pipeline.units:
        sid = dep.route.stage_ids[u.index]
        st = ch["stages"].get(sid, {}) if sid else {}
        mine = [h for h in handles if h.key == (dep.name, u.index)]
        restarting = [
            p.describe()
            for p in svc.supervisor.pending_restarts((dep.name, u.index))
            if p.stage_id == sid
        ]
        us = snap["units"][u.index]
        units.append(
            {
                "unit": u.name,
                "kind": u.kind,
                "partition": f"{u.partition + 1}/{u.num_partitions}" if u.kind == "model" else None,
                "stage_id": sid,
                "bottleneck": u.bottleneck,
                "engine": u.engine if not u.fan_in else "frontend",
                "per_item": u.per_item,
                "instances": [h.describe() for h in mine],
                "restarting": restarting,
                "queue": int(st.get("inflight", 0)),
                "compute_p50_ms": us["compute"]["p50_ms"],
                "compute_p99_ms": us["compute"]["p99_ms"],
                "queue_p50_ms": us["queue"]["p50_ms"],
                "queue_p99_ms": us["queue"]["p99_ms"],
                "count": us["compute"]["count"],
                "idle": us["idle"],
                "steps": step_totals(u, mine),
                "exec": _exec(svc, dep, u),
            }
        )
    return {
        "name": dep.name,
        "ready": svc.ready(dep.name),
        "degraded": svc.degraded(dep.name),
        "accepting": dep.route.accepting,
        "plans": dep.pipeline.plans,
        "slo_ms": dep.pipeline.config.slo_ms,
        "autoscale": dep.pipeline.config.autoscale is not None,
        "queue_limit": dep.route.queue_limit,
        **_queues(svc, dep),
        "window": dep.route.max_inflight,
        "decisions": svc.autoscaler.decisions(dep.name)[-10:] if svc.autoscaler else [],
        "live_check": _live_check(svc, dep),
        "requests": {k: v for k, v in snap.items() if k != "units"},
        "units": units,
    }


def _exec(svc: StatusSource, dep: Deployment, u: Any) -> dict[str, Any]:
    """Unit ``u``'s ``executions``, ``items``, ``mean_batch`` (None before the first),
    ``batch`` (the largest its instances run now) and ``batching`` (the autoscaler's last
    decision; None: none)."""
    totals = getattr(svc.supervisor, "exec_totals", None)
    ran = totals.get((dep.name, u.index)) if totals is not None else None
    mine = [h for h in svc.supervisor.handles() if h.key == (dep.name, u.index)]
    now = max((int(h.stats.get("batch", 1)) for h in mine), default=1)
    decided = getattr(svc.autoscaler, "batch_decisions", {}).get((dep.name, u.index))
    mean = ran.mean_batch if ran is not None else None
    return {
        "executions": ran.executions if ran is not None else 0,
        "items": ran.items if ran is not None else 0,
        "mean_batch": None if mean is None else round(mean, 3),
        "batch": now,
        "batching": None if decided is None else decided.reason,
    }


def _queues(svc: StatusSource, dep: Deployment) -> dict[str, Any]:
    """The pipeline's ``priority``, ``cpu_nice``, ``cpu_weight`` (None outside ``cgroup``
    mode), ``queue_policy``, ``queued_by_level`` (string keys) and ``refusals`` by reason
    code (docs/api.md "Refusal codes")."""
    cfg = dep.pipeline.config
    fe = getattr(svc, "frontend", None)
    queued, refusals = fe.queues(dep.route) if fe is not None else ({}, {})
    sup = getattr(svc, "supervisor", None)
    groups = getattr(sup, "cgroups", None)
    return {
        "priority": cfg.priority,
        "cpu_nice": getattr(sup, "nice", {}).get(dep.name, 0),
        "cpu_weight": groups.weight(dep.name) if groups is not None else None,
        "queue_policy": cfg.queue_policy.model_dump(),
        "queued_by_level": {str(k): v for k, v in queued.items()},
        "refusals": refusals,
    }


def _live_check(svc: StatusSource, dep: Any) -> dict[str, Any] | None:
    """The live check of a planned pipeline (:mod:`infscaler.runtime.planning.livecheck`): the
    configuration serving, the runner-up, the phase (``watch``, ``trial``, ``settled``),
    the capacities measured (requests/s) and the last reason; None when not checked."""
    plan = getattr(dep, "live", None)
    if plan is None:
        return None
    st = svc.autoscaler.live_state(dep.name) if svc.autoscaler else None
    return {
        "serving": plan.serving.label,
        "predicted_rps": round(plan.serving.capacity_rps, 2),
        "other": None if plan.other is None else plan.other.label,
        "phase": "watch" if st is None else st.phase,
        "measured_rps": {} if st is None else {k: round(v, 2) for k, v in st.measured},
        "switches": 0 if st is None else st.switches,
        "reason": "" if st is None else st.reason,
    }


def cpu_priority(svc: StatusSource) -> dict[str, Any]:
    """How the cores are given by priority (docs/scaling.md, "Priorities and queue policies"):
    ``mode`` ``off`` / ``nice`` / ``cgroup`` / ``cores`` (``core_sets``: ``on``, ``hold_s``,
    ``kept``, ``repins``), and ``reason`` cgroups are not used."""
    sup = getattr(svc, "supervisor", None)
    if sup is None or not getattr(sup, "cpu_priority", False):
        return {"mode": "off", "reason": getattr(sup, "cgroups_why", "")}
    if getattr(sup, "cgroups", None) is not None:
        return {"mode": "cgroup", "reason": ""}
    keeper = getattr(getattr(svc, "autoscaler", None), "core_sets", None)
    if keeper is not None and getattr(keeper, "on", False):
        return {"mode": "cores", "reason": getattr(sup, "cgroups_why", ""), **keeper.state()}
    return {"mode": "nice", "reason": getattr(sup, "cgroups_why", "")}


def service_status(svc: StatusSource) -> dict[str, Any]:
    """The whole service (``GET /v2/infscaler/status``): start time, ready and health, the
    device's cap, the control path, the tensor pool, the manager's counters, restarts, the
    zygote, the front end, the in-flight budget, Jetson telemetry, :func:`cpu_priority` and
    :func:`pipeline_status` of every pipeline.
    """
    pool = svc.pool.stats()
    ch = svc.channel.stats()
    mgr = svc.manager.stats()["manager"]
    resources: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        cap = Monitor(svc).cap()
        resources = {
            "device": svc.device_profile().name,
            "memory_cap_mb": round(cap.memory_cap_mb, 1),
            "memory_used_mb": round(cap.memory_used_mb, 1),
            "max_instances": cap.max_instances,
            "cores": cap.cores,
        }
    pipelines = [pipeline_status(svc, d) for d in svc.deployments()]
    jetson = jetson_sampler().state()
    return {
        "started_at": svc.started_at,
        "ready": svc.ready(),
        "health": "degraded" if any(p["degraded"] for p in pipelines) else "ok",
        "stopping": svc.stopping,
        "resources": resources,
        "telemetry": {"source": "jtop", "available": jetson.available, "reason": jetson.reason},
        "cpu_priority": cpu_priority(svc),
        "cpu_wake_latency": {
            "requested_us": svc.cpu_wake_latency_us,
            "held": svc.cpu_wake_latency_held,
            "reason": svc.cpu_wake_latency_reason,
            "auto": svc.cpu_wake_auto,
            "auto_reason": svc.cpu_wake_auto_reason,
        },
        "control_path": {
            "kind": ch["kind"],
            "policy": ch["policy"],
            "reason": getattr(svc.channel, "reason", ""),
            "rejected": ch["rejected_total"],
        },
        "pool": {
            "cap_mb": round(pool["cap_bytes"] / 2**20, 1),
            "mapped_mb": round(pool["mapped_bytes"] / 2**20, 1),
            "slots_in_use": pool["slots_in_use"],
            "slots_free": pool["slots_free"],
            "busy": pool["busy"],
        },
        "manager": {
            k: mgr[k]
            for k in (
                "faults",
                "grants",
                "busy",
                "retried",
                "failed",
                "deaths",
                "reclaimed_slots",
            )
        },
        "restarts": svc.supervisor.restarted,
        "zygote": svc.supervisor.zygote_status(),
        "frontend": {k: v for k, v in svc.frontend.stats().items() if k != "client"},
        "frontend_failure": svc.frontend.failure,
        "inflight": svc.inflight.stats(),
        "pipelines": pipelines,
    }
