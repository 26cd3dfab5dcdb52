"""The simulator's model of cores shared by single-thread instances of several pipelines
at priority levels, under the modes of ``INFSCALER_CPU_PRIORITY`` (the one-pipeline loop,
:mod:`~infscaler.runtime.planning.simloop`, shares the cores as one factor, with no
weights or affinities).

- **Affinity**: as the service pins (:func:`~infscaler.runtime.scaling.placement.
  pick_cores`, highest level deployed first): one core while one is free, else all.
- **Placement**: a waking thread (a request starts) goes to its allowed core with the
  least runnable weight (idle first, ties in turn); a re-pin moves it at once.
- **Sharing**: weighted processor sharing per core, re-timed at every event. ``off``:
  1024 each; ``nice``: ``sched_prio_to_weight`` of the pipeline's nice
  (:func:`~infscaler.base.levels.cpu_nice`; kernel/sched/core.c); ``cgroup``: the
  pipeline's ``cpu.weight`` (:func:`~infscaler.base.levels.cpu_weight`) split over its
  runnable threads (Documentation/admin-guide/cgroup-v2.rst "Weights"); ``cores``: nice,
  plus :func:`~infscaler.runtime.scaling.coresets.allowed_cores` every ``interval_s``,
  a pipeline at risk when its P99 over ``window_s`` passes its SLO, held ``hold_s``.
- **Load**: open loop (Poisson, one FIFO queue) or closed loop (every instance always
  busy); gamma service times on a whole core.

Not modelled: caches, memory bandwidth, SMT, wake-up latency, time slices, the service's
own threads. Pure (no process I/O): a run is a function of its arguments.
"""

from __future__ import annotations

import collections
import heapq
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from infscaler.base.levels import cpu_nice, cpu_weight
from infscaler.runtime.scaling.coresets import HOLD_S, allowed_cores, hold_risk, target_affinity
from infscaler.runtime.scaling.placement import core_load, pick_cores

__all__ = ["MODES", "SCHED_PRIO_TO_WEIGHT", "SharedPipeline", "nice_weight", "simulate_shared"]

#: The kernel's CFS weight of nice -20..19 (kernel/sched/core.c ``sched_prio_to_weight``).
SCHED_PRIO_TO_WEIGHT = (
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip

#: the modes of ``INFSCALER_CPU_PRIORITY`` the model shares the cores by
MODES = ("off", "nice", "cgroup", "cores")


def nice_weight(nice: int) -> int:
    """CFS weight of a nice value (-20..19); ValueError outside."""
    if not -20 <= nice <= 19:
        raise ValueError(f"nice {nice} not in -20..19")
    return SCHED_PRIO_TO_WEIGHT[nice + 20]


@dataclass(frozen=True)
class SharedPipeline:
    """One pipeline of single-thread instances.

    Attributes:
        name: its name.
        level: its priority level (1 the highest).
        service_ms: a request's time on a whole core, mean, ms (> 0).
        instances: its instances (>= 1).
        rate_rps: Poisson arrivals, req/s; None: closed loop (flooded).
        cv: the service time's coefficient of variation (gamma; 0: fixed).
        slo_ms: its SLO, ms (None: none; needed for a risk).
    """

    name: str
    level: int
    service_ms: float
    instances: int = 1
    rate_rps: float | None = None
    cv: float = 0.0
    slo_ms: float | None = None

    def __post_init__(self) -> None:
        if self.service_ms <= 0 or self.instances < 1:
            raise ValueError(f"{self.name}: service_ms > 0 and instances >= 1 needed")


@dataclass
class _Thread:
    p: int  # pipeline index
    home: list[int]
    affinity: list[int]
    core: int | None = None
    left: float = 0.0  # core-seconds of the current request
    arrived: float = 0.0
    rate: float = 0.0


@dataclass
class _Run:
    pipes: list[SharedPipeline]
    cores: list[int]
    mode: str
    rng: np.random.Generator
    threads: list[_Thread] = field(default_factory=list)
    queues: list[collections.deque] = field(default_factory=list)
    lat: list[list[tuple[float, float]]] = field(default_factory=list)  # (end, ms)
    nice: dict[str, int] = field(default_factory=dict)
    cg: dict[str, int] = field(default_factory=dict)
    turn: int = 0

    def weight(self, t: _Thread, runnable: dict[int, int]) -> float:
        name = self.pipes[t.p].name
        if self.mode == "off":
            return 1024.0
        if self.mode == "cgroup":
            return self.cg[name] / max(1, runnable.get(t.p, 1))
        return float(nice_weight(self.nice[name]))

    def service(self, p: int) -> float:
        sp = self.pipes[p]
        mean = sp.service_ms / 1e3
        if sp.cv <= 0:
            return mean
        k = 1.0 / sp.cv**2
        return float(self.rng.gamma(k, mean / k))

    def place(self, t: _Thread) -> None:
        """Put a waking thread on its allowed core with the least runnable weight."""
        load = dict.fromkeys(self.cores, 0.0)
        runnable = collections.Counter(x.p for x in self.threads if x.core is not None)
        for x in self.threads:
            if x.core is not None and x is not t:
                load[x.core] += self.weight(x, runnable)
        n = len(self.cores)
        self.turn += 1
        t.core = min(t.affinity, key=lambda c: (load[c], (self.cores.index(c) - self.turn) % n))

    def start(self, t: _Thread, arrived: float) -> None:
        t.left, t.arrived = self.service(t.p), arrived
        self.place(t)

    def rates(self) -> None:
        runnable = collections.Counter(x.p for x in self.threads if x.core is not None)
        total: dict[int, float] = collections.defaultdict(float)
        for x in self.threads:
            if x.core is not None:
                total[x.core] += self.weight(x, runnable)
        for x in self.threads:
            x.rate = self.weight(x, runnable) / total[x.core] if x.core is not None else 0.0


def _pins(pipes: list[SharedPipeline], cores: list[int]) -> list[list[int]]:
    """Each instance's cores as the service pins them, highest level deployed first."""
    handles: list[Any] = []
    out: list[list[int]] = []
    order = sorted(range(len(pipes)), key=lambda i: pipes[i].level)
    pins: dict[int, list[list[int]]] = {}
    for i in order:
        for _ in range(pipes[i].instances):
            got = pick_cores(1, cores, core_load(handles, (pipes[i].name, 0)), len(handles))
            handles.append(SimpleNamespace(key=(pipes[i].name, 0), state="ready", cores=got))
            pins.setdefault(i, []).append(got)
    for i in range(len(pipes)):
        out += pins[i]
    return out


def simulate_shared(
    pipelines: list[SharedPipeline],
    cores: int,
    mode: str,
    duration_s: float,
    *,
    warmup_s: float = 10.0,
    seed: int = 1,
    hold_s: float = HOLD_S,
    window_s: float = 5.0,
    interval_s: float = 0.5,
) -> dict[str, dict[str, Any]]:
    """Run ``pipelines`` on ``cores`` cores under ``mode`` (:data:`MODES`) for
    ``duration_s`` simulated seconds; the first ``warmup_s`` are not counted.

    Returns:
        Per pipeline: ``answered`` (requests finished after the warm-up), ``goodput_rps``
        (those per second), ``p99_ms`` (None: none finished), ``attainment`` (finished
        within its SLO over those finished plus those arrived after the warm-up and not
        finished; None without an SLO or arrivals), ``kept_s`` (seconds its instances
        were kept off some cores, mode ``cores``).

    Raises:
        ValueError: an unknown mode, ``cores`` < 1, no pipelines, a bad pipeline.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} not one of {MODES}")
    if cores < 1 or not pipelines:
        raise ValueError("need cores >= 1 and at least one pipeline")
    pipes, core_ids = list(pipelines), list(range(cores))
    run = _Run(pipes, core_ids, mode, np.random.default_rng(np.random.SeedSequence([seed, 11])))
    levels = {p.name: p.level for p in pipes}
    run.nice, run.cg = cpu_nice(levels), cpu_weight(levels)
    idx = [i for i, p in enumerate(pipes) for _ in range(p.instances)]
    run.threads = [
        _Thread(i, pin, list(pin)) for i, pin in zip(idx, _pins(pipes, core_ids), strict=True)
    ]
    run.queues = [collections.deque() for _ in pipes]
    run.lat = [[] for _ in pipes]
    arrivals: list[tuple[float, int]] = []
    for i, p in enumerate(pipes):
        if p.rate_rps:
            arng = np.random.default_rng(np.random.SeedSequence([seed, 17, i]))
            ts = np.cumsum(
                arng.exponential(1.0 / p.rate_rps, int(p.rate_rps * duration_s * 1.3) + 10)
            )
            arrivals += [(float(t), i) for t in ts if t < duration_s]
    heapq.heapify(arrivals)
    for t in run.threads:
        if pipes[t.p].rate_rps is None:
            run.start(t, 0.0)
    kept_s = [0.0] * len(pipes)
    last_risk: dict[str, float] = {}
    allowed = {p.name: core_ids for p in pipes}
    now, tick = 0.0, interval_s
    while now < duration_s:
        run.rates()
        busy = [t for t in run.threads if t.core is not None]
        t_done = min((now + t.left / t.rate for t in busy if t.rate > 0), default=np.inf)
        t_arr = arrivals[0][0] if arrivals else np.inf
        nxt = min(t_done, t_arr, tick if mode == "cores" else np.inf, duration_s)
        for t in busy:
            t.left -= t.rate * (nxt - now)
        now = nxt
        for t in busy:
            if t.left <= 1e-9:
                _finish(run, t, now)
        while arrivals and arrivals[0][0] <= now:
            _, i = heapq.heappop(arrivals)
            idle = next((t for t in run.threads if t.p == i and t.core is None), None)
            if idle is None:
                run.queues[i].append(now)
            else:
                run.start(idle, now)
        if mode == "cores" and now >= tick:
            allowed, last_risk = _core_sets(run, now, window_s, hold_s, last_risk)
            for i, p in enumerate(pipes):
                if now > warmup_s and len(allowed[p.name]) < cores:
                    kept_s[i] += interval_s
            tick += interval_s
    return {p.name: _result(run, i, now, warmup_s, kept_s[i]) for i, p in enumerate(pipes)}


def _finish(run: _Run, t: _Thread, now: float) -> None:
    run.lat[t.p].append((now, (now - t.arrived) * 1e3))
    t.core = None
    p = run.pipes[t.p]
    if p.rate_rps is None:
        run.start(t, now)
    elif run.queues[t.p]:
        run.start(t, run.queues[t.p].popleft())


def _core_sets(
    run: _Run, now: float, window_s: float, hold_s: float, last: dict[str, float]
) -> tuple[dict[str, list[int]], dict[str, float]]:
    """The core sets at ``now`` (risk: P99 over the window > SLO) and each thread re-pinned."""
    risk = {}
    for i, p in enumerate(run.pipes):
        recent = [ms for end, ms in run.lat[i][-4096:] if end >= now - window_s]
        risk[p.name] = bool(p.slo_ms and recent and np.percentile(recent, 99) > p.slo_ms)
    flags, last = hold_risk(now, risk, last, hold_s)
    levels = {p.name: p.level for p in run.pipes}
    pinned: dict[str, list[list[int]]] = collections.defaultdict(list)
    for t in run.threads:
        pinned[run.pipes[t.p].name].append(t.home)
    allowed = allowed_cores(run.cores, levels, pinned, flags)
    for t in run.threads:
        t.affinity = target_affinity(t.home, allowed[run.pipes[t.p].name], run.cores, False)
        if t.core is not None and t.core not in t.affinity:
            run.place(t)
    return allowed, last


def _result(run: _Run, i: int, end: float, warmup_s: float, kept_s: float) -> dict[str, Any]:
    p = run.pipes[i]
    ms = np.array([m for e, m in run.lat[i] if e - m / 1e3 >= warmup_s])
    unfinished = sum(1 for a in run.queues[i] if a >= warmup_s)
    unfinished += sum(
        1 for t in run.threads if t.p == i and t.core is not None and t.arrived >= warmup_s
    )
    att = None
    if p.slo_ms is not None and p.rate_rps and len(ms) + unfinished:
        att = float((ms <= p.slo_ms).sum()) / (len(ms) + unfinished)
    done = np.array([e for e, _ in run.lat[i] if e >= warmup_s])
    return {
        "answered": int(len(done)),
        "goodput_rps": round(len(done) / max(1e-9, end - warmup_s), 3),
        "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None,
        "attainment": None if att is None else round(att, 4),
        "kept_s": round(kept_s, 1),
    }
