"""The former ``scaling.py``'s in-process helpers (``Service.submit`` load, the per-step
recorder, the bench's own Poisson gaps), kept for the scripts not yet on :mod:`harness`:
``same_config``, ``auto_deploys``, ``live_check``, ``memory_trace``, ``sim_jetson``,
``idle_wake``, ``hop_latency``. New scripts use ``harness.scenarios``
and ``harness.search``; this module goes with the last of those scripts.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from harness.models import (  # noqa: F401 - re-exported for the scripts above
    AUTOSCALE,
    MODEL_SETTINGS,
    PIPELINE_CASES,
    calibrate,
    model_inputs,
    pipeline,
    pipeline_case,
)
from scaling import auto_pipeline  # noqa: F401 - re-exported for the scripts above

STATE_DIR = Path("/tmp/isc-bench-state")

#: every step of every configuration draws its Poisson gaps from this one seed: the
#: gaps are the same standard-exponential sequence divided by the step's rate (common
#: random numbers), so two configurations measured at one rate face the same arrival
#: pattern, and a step at a higher rate is the same pattern compressed in time. With a
#: seed per step, identical configurations (auto choosing a baseline's shape) landed
#: one bisection step apart (ResNet-50 at 3x: 15.2 vs 16.1/s, bench/HISTORY.md)
ARRIVAL_SEED = 1

#: requests per measured window at least (the issue's "at least 300 per bisection step")
MIN_REQUESTS = 300

QUICK_MIN_REQUESTS = 40

#: Extra keyword arguments of every Service the cells run (``--cpu-wake-latency-us``).
SERVICE_OPTIONS: dict[str, Any] = {}


def set_service_wake(option: str | None) -> None:
    """``--cpu-wake-latency-us``: the wake-up setting of every service this run makes
    (``auto``, ``none`` or µs, :func:`infscaler.cli.service.wake_option`); None keeps the
    Service's default.

    Raises:
        InfScalerError: an option the CLI would refuse.
    """
    if option is not None:
        from infscaler.cli.service import wake_option

        SERVICE_OPTIONS["cpu_wake_latency_us"] = wake_option(option)


def service_wake_setting() -> Any:
    """The wake-up setting of this run's services: ``--cpu-wake-latency-us``, else the
    Service constructor's default (what a user who names none gets)."""
    import inspect

    from infscaler.service.service import Service

    default = inspect.signature(Service).parameters["cpu_wake_latency_us"].default
    return SERVICE_OPTIONS.get("cpu_wake_latency_us", default)


def instances_of(svc: Any, dep: Any) -> list[int]:
    """Live (starting or ready) instances per served unit, in unit order."""
    handles = [h for h in svc.supervisor.handles() if h.key[0] == dep.name]
    return [
        sum(1 for h in handles if h.key == (dep.name, u.index) and h.state in ("starting", "ready"))
        for u in dep.pipeline.served_units()
    ]


class Recorder:
    """Answers of one bisection step: per request its scheduled arrival and latency."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[int, float] = {}  # id -> scheduled arrival (perf_counter)
        self.done: dict[int, tuple[float, bool, str]] = {}  # id -> (latency ms, ok, error)
        self.all_done = threading.Condition(self.lock)

    def sent_at(self, rid: int, t: float) -> None:
        with self.lock:
            self.sent[rid] = t

    def finish(self, rid: int, ok: bool, err: str = "") -> None:
        now = time.perf_counter()
        with self.lock:
            t = self.sent.get(rid, now)
            self.done[rid] = ((now - t) * 1e3, ok, err)
            if len(self.done) >= len(self.sent):
                self.all_done.notify_all()

    def wait_all(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        with self.lock:
            while len(self.done) < len(self.sent):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.all_done.wait(left)
        return True


class InProcess:
    """Requests through ``Service.submit`` (front end -> shared-memory pool -> tokens)."""

    kind = "in-process (shared-memory pool, tokens)"

    def __init__(self, svc: Any, name: str, feeds: dict[str, np.ndarray]) -> None:
        self.svc, self.name, self.feeds = svc, name, feeds

    def send(self, rid: int, rec: Recorder) -> None:
        try:
            fut = self.svc.submit(self.name, self.feeds)
        except Exception as exc:  # noqa: BLE001 - a 503 at admission is a failed request
            rec.finish(rid, False, str(exc)[:200])
            return

        def done(f: Any) -> None:
            exc = f.exception()
            rec.finish(rid, exc is None, "" if exc is None else str(exc)[:200])

        fut.add_done_callback(done)

    def close(self) -> None:
        pass


def _own_cpu(svc: Any) -> dict[int, float]:
    """CPU seconds so far of this process and of every live instance process."""
    from _common import process_cpu_seconds

    pids = [os.getpid()]
    if svc is not None:
        pids += [h.pid for h in svc.supervisor.handles() if h.pid]
    return {p: process_cpu_seconds([p]) for p in pids}


def deploy_status(svc: Any, dep: Any) -> dict[str, Any]:
    """What the deploy step itself reported about its choice (a deploy-time planner's
    plans and prediction, where the runtime has one): every status key of the
    deployment naming a plan or an objective."""
    status = svc.pipeline_status(dep)
    out = {k: v for k, v in status.items() if "plan" in k or "objective" in k}
    # the deploy-time search's own figure: the kept decision's winner line
    # (runtime.autoplan.plan_pipeline: "... goodput G/s max M/s P99 ...")
    kept = sorted(
        (STATE_DIR / "plans" / "decisions").glob(f"{dep.name}-*.json"),
        key=lambda p: p.stat().st_mtime,
    )
    if kept:
        chosen = json.loads(kept[-1].read_text()).get("chosen", "")
        out["planner_chosen"] = chosen
        m = re.search(r"max ([0-9.]+)/s", chosen)
        out["planner_max_rps"] = float(m.group(1)) if m else None
    return out


def config_snapshot(svc: Any, dep: Any, window_s: float) -> list[dict[str, Any]]:
    """The deployment's units over the last ``window_s`` s (the service's monitor): per
    unit its name, kind, engine, threads, live instances (the front end's fan-in: 1),
    service time per item (``service_ms``: compute p50, ms) and items per request."""
    from infscaler.runtime.scaling.monitor import Monitor

    mon = Monitor(svc)
    m = mon.pipeline(dep, max(1.0, window_s))
    served = {u.index for u in dep.pipeline.served_units()}
    out = []
    for u, um in zip(dep.pipeline.units, m.units, strict=True):
        out.append(
            {
                "unit": u.name,
                "kind": u.kind,
                "served": u.index in served,
                "engine": u.engine,
                "threads": int(u.threads),
                "instances": sum(um.instances.values()) if u.index in served else 1,
                "service_ms": None if um.compute_p50_ms is None else round(um.compute_p50_ms, 3),
                "items_per_request": round(mon.items_per_request(m, um), 3),
            }
        )
    return out


def arrival_gaps(rate: float, seed: int = ARRIVAL_SEED) -> Iterator[float]:
    """Poisson inter-arrival gaps at ``rate`` (s), the one stream :func:`step` sends by
    and :func:`bench_arrivals` replays."""
    rng = np.random.default_rng(seed)
    while True:
        yield float(rng.exponential(1.0 / rate))


def p99_every(latencies_ms: Sequence[float], missing: int) -> float:
    """P99 of a window's requests, ms: the answered ones' latencies with ``missing``
    (refused or unanswered) requests counted as later than any (``math.inf`` when the
    percentile reaches them), as :func:`step` judges a step."""
    never = 1e18
    every = [*latencies_ms, *([never] * missing)]
    if not every:
        return math.inf
    p = float(np.percentile(every, 99))
    return math.inf if p > max(latencies_ms, default=0.0) else p


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its exited (reaped) children: the instances,
    once the services are closed. Read at the end of a run, other processes' CPU is the
    host's busy time minus this."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
