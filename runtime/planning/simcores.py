"""The simulator's model of cores shared by single-thread instances of several pipelines
at priority levels (the modes of ``INFSCALER_CPU_PRIORITY``), run on the one-pipeline
loop's :class:`~.simloop.EventLoop` and :class:`~.simloop.Sampler`.

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
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from infscaler.base.levels import cpu_nice, cpu_weight
from infscaler.runtime.planning.simloop import EventLoop, Sampler
from infscaler.runtime.planning.simtypes import EngineProfile
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

_ARRIVE, _TICK = range(2)


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


class _Run(EventLoop):
    """One run's threads (pipeline order), and per pipeline a FIFO of arrival times and
    each request's (end s, ms); service times from one stream, drawn in turn."""

    def __init__(self, pipes: list[SharedPipeline], cores: int, mode: str, seed: int) -> None:
        super().__init__()
        self.pipes, self.cores, self.mode = pipes, list(range(cores)), mode
        levels = {p.name: p.level for p in pipes}
        self.nice, self.cg = cpu_nice(levels), cpu_weight(levels)
        rng = np.random.default_rng([seed, 11])
        profs = [EngineProfile("cpu", p.service_ms, p.cv) for p in pipes]
        self.samplers = [Sampler(ep, rng, 1, 1e3) for ep in profs]
        idx = [i for i, p in enumerate(pipes) for _ in range(p.instances)]
        pins = zip(idx, _pins(pipes, self.cores), strict=True)
        self.threads = [_Thread(i, pin, list(pin)) for i, pin in pins]
        self.queues: list[collections.deque[float]] = [collections.deque() for _ in pipes]
        self.lat: list[list[tuple[float, float]]] = [[] for _ in pipes]
        self.turn = 0

    def weight(self, t: _Thread, runnable: dict[int, int]) -> float:
        name = self.pipes[t.p].name
        if self.mode == "off":
            return 1024.0
        if self.mode == "cgroup":
            return self.cg[name] / max(1, runnable.get(t.p, 1))
        return float(nice_weight(self.nice[name]))

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
        t.left, t.arrived = self.samplers[t.p].item(), arrived
        self.place(t)

    def finish(self, t: _Thread, now: float) -> None:
        self.lat[t.p].append((now, (now - t.arrived) * 1e3))
        t.core = None
        if self.pipes[t.p].rate_rps is None:
            self.start(t, now)
        elif self.queues[t.p]:
            self.start(t, self.queues[t.p].popleft())

    def rates(self) -> None:
        runnable = collections.Counter(x.p for x in self.threads if x.core is not None)
        total: dict[int, float] = collections.defaultdict(float)
        for x in self.threads:
            if x.core is not None:
                total[x.core] += self.weight(x, runnable)
        for x in self.threads:
            x.rate = self.weight(x, runnable) / total[x.core] if x.core is not None else 0.0


def _pins(pipes: list[SharedPipeline], cores: list[int]) -> list[list[int]]:
    """Each instance's cores (pipeline order) as the service pins them, highest level first."""
    handles: list[Any] = []
    pins: dict[int, list[list[int]]] = collections.defaultdict(list)
    for i in sorted(range(len(pipes)), key=lambda i: pipes[i].level):
        key = (pipes[i].name, 0)
        for _ in range(pipes[i].instances):
            got = pick_cores(1, cores, core_load(handles, key), len(handles))
            handles.append(SimpleNamespace(key=key, state="ready", cores=got))
            pins[i].append(got)
    return [pin for i in range(len(pipes)) for pin in pins[i]]


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
    pipes = list(pipelines)
    run = _Run(pipes, cores, mode, seed)
    for i, p in enumerate(pipes):
        if p.rate_rps:
            arng = np.random.default_rng([seed, 17, i])
            gaps = arng.exponential(1.0 / p.rate_rps, int(p.rate_rps * duration_s * 1.3) + 10)
            ts = np.cumsum(gaps)
            for t_arr in ts[ts < duration_s]:
                run.push(float(t_arr), _ARRIVE, i)
    if mode == "cores":
        run.push(interval_s, _TICK)
    for t in run.threads:
        if pipes[t.p].rate_rps is None:
            run.start(t, 0.0)
    kept_s = [0.0] * len(pipes)
    last_risk: dict[str, float] = {}
    while run.now < duration_s:  # between events the busy threads share their cores
        run.rates()
        busy = [t for t in run.threads if t.core is not None]
        t_done = min((run.now + t.left / t.rate for t in busy if t.rate > 0), default=np.inf)
        nxt = min(t_done, run.events[0][0] if run.events else np.inf, duration_s)
        for t in busy:
            t.left -= t.rate * (nxt - run.now)
        run.now = nxt
        for t in busy:
            if t.left <= 1e-9:
                run.finish(t, nxt)
        while run.events and run.events[0][0] <= nxt:
            now, kind, i, _ = run.pop()
            if kind == _ARRIVE:
                idle = next((t for t in run.threads if t.p == i and t.core is None), None)
                if idle is None:
                    run.queues[i].append(now)
                else:
                    run.start(idle, now)
                continue
            allowed, last_risk = _core_sets(run, now, window_s, hold_s, last_risk)
            for i, p in enumerate(pipes):
                if now > warmup_s and len(allowed[p.name]) < cores:
                    kept_s[i] += interval_s
            run.push(now + interval_s, _TICK)
    return {p.name: _result(run, i, run.now, warmup_s, kept_s[i]) for i, p in enumerate(pipes)}


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
