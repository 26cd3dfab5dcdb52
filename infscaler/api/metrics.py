"""Prometheus metrics of a running service: ``GET /metrics`` (text exposition format 0.0.4).

:class:`ServiceCollector` reads the service's own statistics at scrape time, so nothing is
counted twice on the request path. Names follow Triton's where Triton measures the same
thing (``nv_inference_*``, labels ``model`` and ``version``); the rest are ``infscaler_*``.
No label carries a file path. docs/metrics.md lists every metric.

Sources: https://prometheus.io/docs/instrumenting/exposition_formats/,
prometheus-client's custom collectors, Triton ``docs/user_guide/metrics.md``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector, CollectorRegistry

from infscaler.api.common import exec_counts
from infscaler.runtime.scaling.telemetry import JetsonSampler, JetsonState, jetson_sampler

#: the ``Content-Type`` of ``GET /metrics``: the Prometheus text format 0.0.4
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: pipelines have one version, as in ``/v2/models/{name}/stats``
VERSION = "1"

#: Triton's failure reasons (``nv_inference_request_failure{reason=...}``)
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def failure_reason(status: int) -> str:
    """Triton's failure ``reason`` for an HTTP status the front end failed a request
    with: 500 (a stage failed) -> ``BACKEND``; 499 (the client went away) ->
    ``CANCELED``; anything else (503 timed out / stopping, ...) -> ``OTHER``. Requests
    refused before admission (queue bound, ``max_pending``) count as ``REJECTED``."""
    if status == 500:
        return "BACKEND"
    if status == 499:
        return "CANCELED"
    return "OTHER"


class _TritonCounter(Metric):
    """A counter whose samples carry the family's own name (Triton's spelling, no
    ``_total``); :func:`exposition` writes its ``# TYPE`` line with that name."""

    def __init__(self, name: str, documentation: str, labels: Iterable[str]) -> None:
        super().__init__(name, documentation, "counter")
        self._labelnames = tuple(labels)

    def add_metric(self, labels: Iterable[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labelnames, labels, strict=True)), value)


class ServiceCollector(Collector):
    """Reads a :class:`~infscaler.service.service.Service`'s statistics at each scrape;
    thread-safe, a source not there (not started, stopping) is skipped."""

    def __init__(self, service: Any, jetson: JetsonSampler | None = None) -> None:
        self.service = service
        self.jetson = jetson if jetson is not None else jetson_sampler()

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        yield from jetson_families(self.jetson.state())
        yield from self._requests(svc)
        yield from self._instances(svc)
        mgr = getattr(svc, "manager", None)
        st: dict[str, Any] = {}
        if mgr is not None:
            with contextlib.suppress(Exception):  # stopping: the manager is closed
                st = mgr.stats()  # {"pool", "channel", "manager"}, each under its lock
        if st:
            yield from self._pool(st["pool"])
            yield from self._control(st["manager"], st["channel"])
        fe = getattr(svc, "frontend", None)
        if fe is not None:
            yield CounterMetricFamily(
                "infscaler_requests_shed",
                "Requests refused by load shedding (a pipeline's queue bound at the "
                "resource cap); also counted in infscaler_requests_rejected",
                value=int(fe.counters.get("shed", 0)),
            )

    # -- per pipeline: Triton's inference request metrics ---------------------------------
    def _requests(self, svc: Any) -> Iterator[Metric]:
        mv = ["model", "version"]
        success = _TritonCounter(
            "nv_inference_request_success",
            "Number of successful inference requests (each request counts 1)",
            mv,
        )
        failure = _TritonCounter(
            "nv_inference_request_failure",
            "Number of failed inference requests, by reason: REJECTED (refused before "
            "admission: queue bound or max_pending), CANCELED, BACKEND (a stage failed), "
            "OTHER (timed out, stopping)",
            [*mv, "reason"],
        )
        count = _TritonCounter(
            "nv_inference_count",
            "Number of inferences performed: items, a request of batch dim 4 counts 4 "
            "(the counting unit's, see the statistics extension; reported by the "
            "instances when idle and every second)",
            mv,
        )
        execs = _TritonCounter(
            "nv_inference_exec_count",
            "Number of inference executions: a dynamic batch of several requests run "
            "at once counts 1",
            mv,
        )
        duration = _TritonCounter(
            "nv_inference_request_duration_us",
            "Cumulative end-to-end request time of successful requests, from admission "
            "at the front end to the result, in microseconds",
            mv,
        )
        queue = _TritonCounter(
            "nv_inference_queue_duration_us",
            "Cumulative time requests waited before each unit ran (token handover plus "
            "queueing, summed over the pipeline's units), in microseconds",
            mv,
        )
        compute = _TritonCounter(
            "nv_inference_compute_infer_duration_us",
            "Cumulative time the pipeline's units spent computing for requests, in microseconds",
            mv,
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Requests admitted and not answered yet",
            labels=mv,
        )
        rejected = CounterMetricFamily(
            "infscaler_requests_rejected",
            "Requests refused before admission (503: the pipeline's queue bound set by "
            "load shedding, or max_pending)",
            labels=mv,
        )
        refused = CounterMetricFamily(
            "infscaler_requests_refused",
            "Requests refused, by reason: at arrival (queue_full: the queue policy's "
            "max_queue_size; shed, slo, deadline, overloaded, uid_quota, unavailable, "
            "not_accepting, failed, bad_timeout) or in the queue (queue_timeout: its queue timeout "
            "passed with timeout_action REJECT)",
            labels=[*mv, "reason"],
        )
        unit_queue = SummaryMetricFamily(
            "infscaler_unit_queue_duration_us",
            "Per unit: time from the previous unit's end (its token handover; the "
            "request's admission for the first unit) to this unit's start, in "
            "microseconds. The handover itself is not timed separately: with an idle "
            "unit this is the handover latency",
            labels=[*mv, "unit"],
        )
        unit_compute = SummaryMetricFamily(
            "infscaler_unit_compute_duration_us",
            "Per unit: compute time of each run for a request, in microseconds",
            labels=[*mv, "unit"],
        )
        frontend = getattr(svc, "frontend", None)
        for dep in _deployments(svc):
            name = dep.name
            t = dep.route.stats.totals()
            labels = [name, VERSION]
            success.add_metric(labels, t["success"])
            ran = exec_counts(svc, dep)
            count.add_metric(labels, ran.items)
            execs.add_metric(labels, ran.executions)
            by_reason = dict.fromkeys(REASONS, 0)
            by_reason["REJECTED"] = t["rejected"]
            for status, n in t["fail"].items():
                by_reason[failure_reason(int(status))] += n
            for reason in REASONS:
                failure.add_metric([*labels, reason], by_reason[reason])
            duration.add_metric(labels, _us(t["latency_ms"]))
            queue.add_metric(labels, _us(t["queue_ms"]))
            compute.add_metric(labels, _us(t["compute_ms"]))
            rejected.add_metric(labels, t["rejected"])
            if frontend is not None:
                pending.add_metric(labels, frontend.pending(dep.route))
            for reason, n in t["refused"].items():
                refused.add_metric([*labels, reason], n)
            for unit, u in zip(dep.pipeline.units, t["units"], strict=True):
                ul = [*labels, unit.name]
                unit_queue.add_metric(ul, u["queue_count"], _us(u["queue_ms"]))
                unit_compute.add_metric(ul, u["compute_count"], _us(u["compute_ms"]))
        yield from (success, failure, count, execs, duration, queue, compute, pending)
        yield from (rejected, refused, unit_queue, unit_compute)

    # -- instances, scaler ------------------------------------------------------------------
    def _instances(self, svc: Any) -> Iterator[Metric]:
        instances = GaugeMetricFamily(
            "infscaler_instances",
            "Instances per unit, by engine and state (starting, ready, stopping)",
            labels=["model", "unit", "engine", "state"],
        )
        pss = GaugeMetricFamily(
            "infscaler_instance_pss_bytes",
            "Proportional memory (PSS: shared pages split among their mappers) of a "
            "unit's live instances together, per engine, bytes (as last reported by the "
            "supervisor; the figure the scaler's memory cap counts)",
            labels=["model", "unit", "engine"],
        )
        restarts = CounterMetricFamily(
            "infscaler_instance_restarts",
            "Instances restarted by the supervisor after an exit or a failure",
        )
        decisions = CounterMetricFamily(
            "infscaler_scaler_decisions",
            "Autoscaler decisions applied, by action (scale_out, scale_in, shed)",
            labels=["model", "action"],
        )
        sup = getattr(svc, "supervisor", None)
        if sup is not None:
            units = {(d.name, u.index): u.name for d in _deployments(svc) for u in d.pipeline.units}
            n: dict[tuple[str, str, str, str], int] = {}
            mem: dict[tuple[str, str, str], float] = {}
            for h in sup.handles():
                unit = units.get(tuple(h.key))
                if unit is None or h.state not in ("starting", "ready", "stopping"):
                    continue
                k = (h.key[0], unit, h.unit.engine)
                n[(*k, h.state)] = n.get((*k, h.state), 0) + 1
                m = h.stats or h.info
                mem[k] = mem.get(k, 0.0) + float(m.get("pss_mb", 0.0) or 0.0) * 2**20
            for k, v in sorted(n.items()):
                instances.add_metric(list(k), v)
            for k, v in sorted(mem.items()):
                pss.add_metric(list(k), v)
            restarts.add_metric([], int(getattr(sup, "restarted", 0) or 0))
        scaler = getattr(svc, "autoscaler", None)
        if scaler is not None:
            for (pipeline, action), v in sorted(scaler.decision_counts().items()):
                decisions.add_metric([pipeline, action], v)
        moves = CounterMetricFamily(
            "infscaler_arbitration_moves",
            "Instances moved between pipelines at the device's cap (arbitration)",
            labels=["donor", "recipient"],
        )
        for (donor, recipient), v in sorted(getattr(scaler, "move_counts", dict)().items()):
            moves.add_metric([donor, recipient], v)
        yield from (instances, pss, restarts, decisions, moves)

    # -- the tensor pool --------------------------------------------------------------------
    @staticmethod
    def _pool(st: dict[str, Any]) -> Iterator[Metric]:
        in_use = sum(int(size) * c["in_use"] for size, c in st["classes"].items())
        yield GaugeMetricFamily(
            "infscaler_pool_in_use_bytes",
            "Tensor pool: bytes of the slots leased now (slot sizes, not tensor sizes)",
            value=in_use,
        )
        yield GaugeMetricFamily(
            "infscaler_pool_mapped_bytes",
            "Tensor pool: bytes of shared memory mapped (slabs)",
            value=st["mapped_bytes"],
        )
        yield GaugeMetricFamily(
            "infscaler_pool_cap_bytes",
            "Tensor pool: memory cap (--pool-mb), bytes",
            value=st["cap_bytes"],
        )
        slots = GaugeMetricFamily(
            "infscaler_pool_slots", "Tensor pool slots, by state", labels=["state"]
        )
        slots.add_metric(["in_use"], st["slots_in_use"])
        slots.add_metric(["free"], st["slots_free"])
        yield slots

    # -- token handover: manager and channel ------------------------------------------------
    @staticmethod
    def _control(c: dict[str, Any], ch: dict[str, Any]) -> Iterator[Metric]:
        tokens = CounterMetricFamily(
            "infscaler_manager_tokens",
            "Tokens the sharing manager handled, by kind: fault (a slot asked for), "
            "grant, busy (fault answered with back-pressure), free, receipt (a handover "
            "acknowledged), held (DATA parked), routed (parked DATA sent on)",
            labels=["kind"],
        )
        for kind, key in (
            ("fault", "faults"),
            ("grant", "grants"),
            ("busy", "busy"),
            ("free", "frees"),
            ("receipt", "receipts"),
            ("held", "held"),
            ("routed", "routed"),
        ):
            tokens.add_metric([kind], c.get(key, 0))
        yield tokens
        yield CounterMetricFamily(
            "infscaler_manager_rejected_tokens",
            "Tokens the sharing manager refused (protocol violations)",
            value=c.get("rejected", 0),
        )
        events = CounterMetricFamily(
            "infscaler_manager_events",
            "Recovery events: instance deaths, requests retried / failed after a death, "
            "slots reclaimed from dead instances",
            labels=["event"],
        )
        for ev, key in (
            ("death", "deaths"),
            ("retried", "retried"),
            ("failed", "failed"),
            ("reclaimed_slot", "reclaimed_slots"),
        ):
            events.add_metric([ev], c.get(key, 0))
        yield events
        path = str(ch.get("kind", ""))
        delivered = CounterMetricFamily(
            "infscaler_channel_delivered_tokens",
            "DATA tokens the control channel delivered to instances (handovers), by "
            "control path (ebpf, userspace)",
            labels=["path"],
        )
        delivered.add_metric([path], ch.get("delivered", 0))
        yield delivered
        rej = CounterMetricFamily(
            "infscaler_channel_rejected_tokens",
            "Malformed tokens the control channel dropped",
            labels=["path"],
        )
        rej.add_metric([path], ch.get("rejected_total", 0))
        yield rej


# -- Jetson telemetry (jtop) ----------------------------------------------------------------
def jetson_families(state: JetsonState) -> list[Metric]:
    """The Jetson gauges of one :class:`~infscaler.runtime.scaling.telemetry.JetsonState`
    (pure): always ``infscaler_telemetry_info``; with a reading, Triton's GPU metrics where
    they mean the same (``nv_gpu_*``, label ``gpu_uuid``: jtop's iGPU name; power is the
    module's total, memory the unified DRAM) and ``infscaler_jetson_*`` for the rest. A
    family jtop did not report is left out, never zero-filled.
    """
    info = GaugeMetricFamily(
        "infscaler_telemetry_info",
        "Host telemetry source: 1, with available=true when its gauges are exported, "
        "else reason says why not",
        labels=["source", "available", "reason"],
    )
    info.add_metric(["jtop", "true" if state.available else "false", state.reason], 1)
    out: list[Metric] = [info]
    r = state.reading
    if not state.available or r is None:
        return out
    gpu = next(iter(sorted(r.gpu_utilization)), "gpu")
    if r.gpu_utilization:
        util = GaugeMetricFamily(
            "nv_gpu_utilization",
            "GPU utilization rate [0.0 - 1.0) (jtop: iGPU load)",
            labels=["gpu_uuid"],
        )
        for name, v in sorted(r.gpu_utilization.items()):
            util.add_metric([name], v)
        out.append(util)
    if r.power_w is not None:
        power = GaugeMetricFamily(
            "nv_gpu_power_usage",
            "GPU power usage in watts (Jetson: the whole module, jtop's total power; "
            "the rails are infscaler_jetson_power_watts)",
            labels=["gpu_uuid"],
        )
        power.add_metric([gpu], r.power_w)
        out.append(power)
    if state.energy_j is not None:
        energy = _TritonCounter(
            "nv_energy_consumption",
            "GPU energy consumption in joules since the service started reading jtop "
            "(Jetson: the module's total power integrated over jtop's updates)",
            ["gpu_uuid"],
        )
        energy.add_metric([gpu], state.energy_j)
        out.append(energy)
    for name, value, doc in (
        ("nv_gpu_memory_used_bytes", r.memory_used_bytes, "GPU used memory, in bytes"),
        ("nv_gpu_memory_total_bytes", r.memory_total_bytes, "GPU total memory, in bytes"),
    ):
        if value is not None:
            fam = GaugeMetricFamily(
                name, f"{doc} (Jetson: the DRAM the GPU shares with the CPUs)", labels=["gpu_uuid"]
            )
            fam.add_metric([gpu], value)
            out.append(fam)
    if r.gpu_mapped_bytes is not None:
        out.append(
            GaugeMetricFamily(
                "infscaler_jetson_gpu_mapped_bytes",
                "DRAM the GPU has mapped (NvMap; jtop memory RAM shared), bytes",
                value=r.gpu_mapped_bytes,
            )
        )
    for name, doc, label, values in (
        (
            "infscaler_jetson_power_watts",
            "Power per rail (INA3221 / INA238 monitors, as jtop names them), watts",
            "rail",
            r.rails_w,
        ),
        (
            "infscaler_jetson_temperature_celsius",
            "Temperature per thermal sensor (jtop; sensors offline left out), degrees Celsius",
            "sensor",
            r.temperatures_c,
        ),
        (
            "infscaler_jetson_frequency_hz",
            "Current clock per engine: the iGPU (as jtop names it), emc (memory "
            "controller), and jtop's online engines (DLA, NVENC, ...), hertz",
            "engine",
            r.frequencies_hz,
        ),
    ):
        if values:
            fam = GaugeMetricFamily(name, doc, labels=[label])
            for k, v in sorted(values.items()):
                fam.add_metric([k], v)
            out.append(fam)
    if r.power_mode is not None:
        mode = GaugeMetricFamily(
            "infscaler_jetson_power_mode_info",
            "The nvpmodel power mode (1, its name in mode)",
            labels=["mode"],
        )
        mode.add_metric([r.power_mode], 1)
        out.append(mode)
    return out


def _deployments(svc: Any) -> list[Any]:
    try:
        return list(svc.deployments())
    except Exception:  # noqa: BLE001 - a service not started has none
        return []


def _us(ms: float) -> float:
    return round(float(ms) * 1e3, 3)


def make_registry(
    service: Any, *, process: bool = True, jetson: JetsonSampler | None = None
) -> CollectorRegistry:
    """A registry with a :class:`ServiceCollector` of ``service`` (its Jetson gauges from
    ``jetson``, default the process's :func:`~infscaler.runtime.scaling.telemetry.jetson_sampler`)
    and (``process``) prometheus-client's process collector (``process_*``: CPU seconds,
    resident memory, open fds of the service process)."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(service, jetson))
    if process:
        ProcessCollector(registry=registry)
    return registry


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _value(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if math.isnan(v):
        return "NaN"
    if float(v).is_integer() and abs(v) < 2**53:
        return str(int(v))
    return repr(float(v))


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in the Prometheus text format 0.0.4, as
    ``prometheus_client.generate_latest`` but a counter whose samples carry the family's own
    name (Triton's ``nv_inference_*``) keeps it in its ``# TYPE`` line."""
    out: list[str] = []
    for metric in registry.collect():
        name, mtype = metric.name, metric.type
        if mtype == "counter" and not any(s.name == name for s in metric.samples):
            name += "_total"
        elif mtype == "unknown":
            mtype = "untyped"
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        for s in metric.samples:
            if s.name.endswith("_created"):
                continue
            labels = ""
            if s.labels:
                labels = (
                    "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in s.labels.items()) + "}"
                )
            out.append(f"{s.name}{labels} {_value(s.value)}\n")
    return "".join(out).encode()
