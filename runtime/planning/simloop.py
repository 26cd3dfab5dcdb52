"""The simulator's event loop (:func:`infscaler.runtime.planning.simulator.simulate`, the
planner's estimator, InferLine §4.2): arrivals, token handovers, batches, instances
starting and finishing as timed events on one heap, and, every interval, the simulated
monitor's :class:`~infscaler.runtime.scaling.types.Snapshot` handed to the scaler
(:func:`infscaler.runtime.scaling.scaler.decide`) and its decisions applied.

What is simulated (dispatch, service times, batching, fan-out / fan-in, admission,
CPU contention, auto-scaling) is in :mod:`infscaler.runtime.planning.simulator`'s
docstring, with the profiles and configuration it reads.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from infscaler.runtime.planning.simtypes import (
    Autoscale,
    EngineProfile,
    UnitConfig,
    UnitProfile,
)
from infscaler.runtime.scaling import scaler as _scaler
from infscaler.runtime.scaling.types import (
    Decision,
    EngineOption,
    ResourceCap,
    ScalerState,
    Snapshot,
    UnitState,
)

#: Latency samples the monitor keeps per window (``stats.LatencyWindow`` size).
_WINDOW_SAMPLES = 2048
_ENGINE_CODES = {"cpu": 1, "gpu": 2, "dla": 3}

_ARRIVE, _ENQUEUE, _DONE, _GATHER, _READY, _FINISH, _TICK = range(7)


class EventLoop:
    """The simulators' clock (``now``, s) and one heap of timed events ``(t, seq, kind, a,
    b)``, popped in time order, ties in push order."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def pop(self) -> tuple[float, int, int, int]:
        """The next event ``(t, kind, a, b)``; the clock moves to its ``t``."""
        t, _, kind, a, b = heapq.heappop(self.events)
        self.now = t
        return t, kind, a, b


class Sampler:
    """Service times of one :class:`EngineProfile` (its samples resampled, else gamma of
    its mean and CV, else its mean) in units of ``unit_ms`` ms (1e3: seconds), drawn ``n``
    at a time from ``seed``: a generator, or the entropy of a stream of its own."""

    def __init__(self, prof: EngineProfile, seed: Any, n: int = 512, unit_ms: float = 1.0) -> None:
        self.p = prof
        self.rng = np.random.default_rng(seed)
        self.n = n
        self.unit_ms = unit_ms
        self.buf: np.ndarray = np.zeros(0)
        self.i = 0

    def _refill(self) -> None:
        p, n = self.p, self.n
        mean = p.mean_ms / self.unit_ms
        if p.samples_ms:
            self.buf = self.rng.choice(np.asarray(p.samples_ms) / self.unit_ms, size=n)
        elif p.cv == 0 or p.mean_ms == 0:
            self.buf = np.full(n, mean)
        else:
            k = 1.0 / p.cv**2
            self.buf = self.rng.gamma(k, mean / k, size=n)
        self.i = 0

    def item(self) -> float:
        if self.i >= len(self.buf):
            self._refill()
        v = float(self.buf[self.i])
        self.i += 1
        return v


class _Instance:
    __slots__ = (
        "iid",
        "engine",
        "state",
        "batch",
        "gather_seq",
        "busy_time",
        "ready_at",
        "avail_time",
        "memory_mb",
        "retiring",
        "cpu_threads",
        "cpu_core_s",
        "last_done",
    )

    def __init__(self, iid: int, engine: str, memory_mb: float) -> None:
        self.iid = iid
        self.engine = engine
        self.state = "starting"  # starting | idle | gathering | busy | gone
        self.batch: list[tuple[int, int]] = []
        self.gather_seq = 0
        self.busy_time = 0.0
        self.ready_at: float | None = None
        self.avail_time = 0.0
        self.memory_mb = memory_mb
        self.retiring = False
        self.cpu_threads = 0  # threads it holds in the contention count while busy
        self.cpu_core_s = 0.0  # CPU core-seconds of the item it runs
        self.last_done = 0.0  # when it last finished an item (or became ready), s


class _Unit:
    def __init__(self, idx: int, prof: UnitProfile, cfg: UnitConfig, seed: int) -> None:
        self.idx = idx
        self.p = prof
        self.batch = max(1, min(cfg.batch, prof.max_batch if prof.served else 1))
        self.wait_s = cfg.batch_wait_ms / 1e3
        self.samplers = {
            e: Sampler(ep, [seed, idx, _ENGINE_CODES.get(e, 9)]) for e, ep in prof.engines.items()
        }
        self.instances: list[_Instance] = []
        self.queue: collections.deque[tuple[int, int]] = collections.deque()
        self.idle: collections.deque[_Instance] = collections.deque()
        self.gathering: list[_Instance] = []
        self.q_area = 0.0
        self.q_last = 0.0
        self.items = 0
        self.batches = 0
        self.batch_time = 0.0
        self.inflight = 0  # items queued, gathering or in service
        self.samples: collections.deque[tuple[float, str, float]] = collections.deque(
            maxlen=_WINDOW_SAMPLES
        )
        self.completions: collections.deque[float] = collections.deque()

    def note_queue(self, t: float) -> None:
        self.q_area += len(self.queue) * (t - self.q_last)
        self.q_last = t

    def live(self) -> list[_Instance]:
        return [i for i in self.instances if i.state != "gone" and not i.retiring]

    def counts(self) -> dict[str, int]:
        return dict(collections.Counter(i.engine for i in self.live()))


class SimLoop(EventLoop):
    """One simulated run: every request, unit and instance, advanced event by event
    (:meth:`run`). ``max_per_unit``: the most instances of a unit the scaler is shown
    (the simulator's ``MAX_PER_UNIT``)."""

    def __init__(
        self,
        units: Sequence[UnitProfile],
        config: Sequence[UnitConfig],
        arrivals: np.ndarray,
        *,
        slo_ms: float | None,
        handover_ms: float,
        queue_limit: int | None,
        max_inflight: int | str | None,
        seed: int,
        warmup_s: float,
        autoscale: Autoscale | None,
        pool_mb: float,
        timeline_s: float | None,
        cpu_cores: int | None = None,
        max_per_unit: int,
    ) -> None:
        super().__init__()
        self.profiles = list(units)
        self.max_per_unit = max_per_unit
        self.cpu_cores = cpu_cores
        self.cpu_busy = 0  # cpu threads running an item now (all units)
        # (end time s, cpu core-seconds) of finished cpu items: the monitor's cores_busy
        self.cpu_work: collections.deque[tuple[float, float]] = collections.deque()
        self.units = [
            _Unit(i, p, c, seed) for i, (p, c) in enumerate(zip(units, config, strict=True))
        ]
        self.arrivals = arrivals
        self.slo_ms = slo_ms
        self.h = handover_ms / 1e3
        self.queue_limit = queue_limit
        self.max_inflight = max_inflight
        self.warmup_s = warmup_s
        self.auto = autoscale
        self.pool_mb = pool_mb
        self.tick_s = autoscale.interval_s if autoscale else timeline_s
        self.items_rng = np.random.default_rng(np.random.SeedSequence([seed, 7919]))
        self.fan_in = next((i for i, p in enumerate(units) if p.fan_in), None)
        n = len(arrivals)
        self.finish = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)
        self.items_left = np.zeros(n, dtype=np.int64)
        self.pending = 0
        self.inflight = 0
        self.backlog: collections.deque[int] = collections.deque()
        self.latency_window: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=_WINDOW_SAMPLES
        )
        self.arrival_times: collections.deque[float] = collections.deque()  # offered
        self.admitted_times: collections.deque[float] = collections.deque()
        self.timeline: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []
        self.state = ScalerState()
        self.last_tick = 0.0
        self.last_arrivals = 0
        self.arrived = 0
        for u, c in zip(self.units, config, strict=True):
            for engine, count in c.instances.items():
                if engine not in u.p.engines:
                    raise ValueError(
                        f"unit {u.p.name}: no profile for engine {engine!r} "
                        f"(options: {sorted(u.p.engines)})"
                    )
                for _ in range(count if u.p.served else 1):
                    inst = self._new_instance(u, engine)
                    self._ready(u, inst, 0.0)

    # -- events ------------------------------------------------------------------------------
    def run(self) -> None:
        for r, t in enumerate(self.arrivals):
            self.push(float(t), _ARRIVE, r)
        if self.tick_s:
            self.push(self.tick_s, _TICK)
        # items of a request are identified as (request, item); tokens go through the heap
        # as two ints, so pending ENQUEUE events carry the unit in ``b``'s high bits
        while self.events:
            t, kind, a, b = self.pop()
            if kind == _ARRIVE:
                self._arrive(a, t)
            elif kind == _ENQUEUE:
                self._enqueue(self.units[b >> 32], (a, b & 0xFFFFFFFF), t)
            elif kind == _DONE:
                self._done(self.units[a], self.units[a].instances[b], t)
            elif kind == _GATHER:
                u = self.units[a]
                inst = u.instances[b & 0xFFFFFFFF]
                if inst.state == "gathering" and inst.gather_seq == b >> 32:
                    self._start(u, inst, t)
            elif kind == _READY:
                u = self.units[a]
                inst = u.instances[b]
                if inst.state == "starting":
                    self._ready(u, inst, t)
            elif kind == _FINISH:
                self._finish(a, t)
            elif kind == _TICK:
                self._tick(t)

    def _to_unit(self, ui: int, tok: tuple[int, int], t: float) -> None:
        self.push(t + self.h, _ENQUEUE, tok[0], (ui << 32) | tok[1])

    # -- requests ----------------------------------------------------------------------------
    def _arrive(self, r: int, t: float) -> None:
        self.arrival_times.append(t)
        self.arrived += 1
        if self.queue_limit is not None and self.pending >= self.queue_limit:
            self.rejected[r] = True
            return
        self.admitted_times.append(t)
        self.pending += 1
        limit = self._window()
        if self.backlog or (limit is not None and self.inflight >= limit):
            self.backlog.append(r)
        else:
            self._start_request(r, t)

    def _start_request(self, r: int, t: float) -> None:
        self.inflight += 1
        self._to_unit(0, (r, 0), t)

    def _finish(self, r: int, t: float) -> None:
        self.finish[r] = t
        self.pending -= 1
        self.inflight -= 1
        self.latency_window.append((t, (t - float(self.arrivals[r])) * 1e3))
        self._drain(t)

    def _window(self) -> int | None:
        """Requests allowed inside the units now (None: no bound)."""
        if self.max_inflight == "auto":
            return 1 + sum(len(u.live()) * u.batch for u in self.units if u.p.served)
        return self.max_inflight  # type: ignore[return-value]

    def _drain(self, t: float) -> None:
        """Start waiting requests while the window has room."""
        limit = self._window()
        while self.backlog and (limit is None or self.inflight < limit):
            self._start_request(self.backlog.popleft(), t)

    def _after(self, ui: int, tok: tuple[int, int], t: float) -> None:
        """Route ``tok`` once unit ``ui`` is done with it."""
        r = tok[0]
        p = self.profiles[ui]
        nxt = ui + 1
        if p.fan_out:
            n = (
                p.items[int(self.items_rng.integers(len(p.items)))]
                if len(p.items) > 1
                else p.items[0]
            )
            self.items_left[r] = n
            if n == 0:
                assert self.fan_in is not None  # _check_units: a fan-out has a fan-in
                self._to_unit(self.fan_in, (r, 0), t)
                return
            if nxt < len(self.units) and self.profiles[nxt].fan_in:
                self._to_unit(nxt, (r, 0), t)
                return
            for i in range(n):
                self._to_unit(nxt, (r, i), t)
            return
        if nxt >= len(self.units):
            self.push(t + self.h, _FINISH, r)
        elif self.profiles[nxt].fan_in:
            self.items_left[r] -= 1
            if self.items_left[r] <= 0:
                self._to_unit(nxt, (r, 0), t)
        else:
            self._to_unit(nxt, tok, t)

    # -- units -------------------------------------------------------------------------------
    def _new_instance(self, u: _Unit, engine: str) -> _Instance:
        mem = u.p.engines[engine].memory_mb if u.p.served else 0.0
        inst = _Instance(len(u.instances), engine, mem)
        u.instances.append(inst)
        return inst

    def _ready(self, u: _Unit, inst: _Instance, t: float) -> None:
        inst.ready_at = t
        inst.last_done = t
        if u.queue:
            self._begin(u, inst, t)
        else:
            inst.state = "idle"
            u.idle.append(inst)

    def _enqueue(self, u: _Unit, tok: tuple[int, int], t: float) -> None:
        u.inflight += 1
        if u.idle:
            self._begin(u, u.idle.popleft(), t, first=tok)
            return
        if u.gathering:
            inst = min(u.gathering, key=lambda i: (len(i.batch), i.iid))
            inst.batch.append(tok)
            if len(inst.batch) >= u.batch:
                self._start(u, inst, t)
            return
        u.note_queue(t)
        u.queue.append(tok)

    def _begin(
        self, u: _Unit, inst: _Instance, t: float, first: tuple[int, int] | None = None
    ) -> None:
        """``inst`` takes work: ``first`` (or the queue's head) plus what is queued, up to
        the batch; then it runs, or gathers for up to the batch wait."""
        u.note_queue(t)
        batch = [first] if first is not None else [u.queue.popleft()]
        while len(batch) < u.batch and u.queue:
            batch.append(u.queue.popleft())
        inst.batch = batch
        if len(batch) < u.batch and u.wait_s > 0:
            inst.state = "gathering"
            inst.gather_seq += 1
            u.gathering.append(inst)
            self.push(t + u.wait_s, _GATHER, u.idx, (inst.gather_seq << 32) | inst.iid)
        else:
            self._start(u, inst, t)

    def _start(self, u: _Unit, inst: _Instance, t: float) -> None:
        if inst.state == "gathering":
            u.gathering.remove(inst)
        inst.state = "busy"
        b = len(inst.batch)
        prof = u.p.engines[inst.engine]
        item = u.samplers[inst.engine].item()
        dur = item * prof.batch_factor(b) / 1e3
        if prof.idle:  # its cores slept while it sat idle (EngineProfile.idle)
            dur *= prof.idle_factor(t - inst.last_done)
        if inst.engine == "cpu" and self.cpu_cores:
            # contention (simulate's cpu_cores): one share of all cores, fixed at the start
            threads = max(1, prof.cores)
            others = self.cpu_busy
            self.cpu_busy += threads
            inst.cpu_threads = threads
            # co-running: caches and memory bandwidth (EngineProfile.corun)
            if prof.corun and self.cpu_cores > threads:
                dur *= 1.0 + prof.corun * min(1.0, others / (self.cpu_cores - threads))
            # CPU time is the uncontended time on every thread (waiting is not CPU time)
            inst.cpu_core_s = dur * threads
            dur *= max(1.0, self.cpu_busy / self.cpu_cores)
        inst.busy_time += dur
        u.batches += 1
        u.items += b
        u.batch_time += dur
        for _ in range(b):
            u.samples.append((t + dur, inst.engine, dur * 1e3))
        self.push(t + dur, _DONE, u.idx, inst.iid)

    def _done(self, u: _Unit, inst: _Instance, t: float) -> None:
        inst.last_done = t
        if inst.cpu_threads:
            self.cpu_busy -= inst.cpu_threads
            inst.cpu_threads = 0
            self.cpu_work.append((t, inst.cpu_core_s))
        batch, inst.batch = inst.batch, []
        u.inflight -= len(batch)
        for tok in batch:
            u.completions.append(t)
            self._after(u.idx, tok, t)
        if inst.retiring:
            self._remove(inst, t)
        elif u.queue:
            self._begin(u, inst, t)
        else:
            inst.state = "idle"
            u.idle.append(inst)

    def _remove(self, inst: _Instance, t: float) -> None:
        if inst.ready_at is not None:
            inst.avail_time += t - inst.ready_at
            inst.ready_at = None
        inst.state = "gone"

    # -- the scaler --------------------------------------------------------------------------
    def _memory_used(self) -> float:
        return self.pool_mb + sum(i.memory_mb for u in self.units for i in u.live())

    def _snapshot(self, t: float) -> Snapshot:
        auto = self.auto
        assert auto is not None
        w = auto.window_s
        cutoff = t - w
        for times in (self.arrival_times, self.admitted_times):
            while times and times[0] < cutoff:
                times.popleft()
        # as the service's monitor: arrivals are admitted requests, the offered load
        # counts the rejected ones too
        offered = len(self.arrival_times) / w
        rate = len(self.admitted_times) / w
        lat = [ms for (ft, ms) in self.latency_window if ft >= cutoff]
        p99 = float(np.percentile(lat, 99)) if lat else None
        late = sum(1 for ms in lat if ms > auto.slo_ms)
        engines_used: dict[str, int] = {}
        pinned = 0
        demand = 0.0  # cores the model units keep busy, as the monitor's demand
        units = []
        for u in self.units:
            while u.completions and u.completions[0] < cutoff:
                u.completions.popleft()
            if u.p.kind == "model" and u.p.served:
                for i in u.live():
                    engines_used[i.engine] = engines_used.get(i.engine, 0) + 1
                    # cores count what is pinned (as runtime.monitor.Monitor.pinned_threads)
                    if i.engine == "cpu" and "cpu" in u.p.engines:
                        pinned += max(1, u.p.engines["cpu"].cores)
            if not u.p.served:
                continue
            recent = [(e, ms) for (st, e, ms) in u.samples if st >= cutoff]
            p50 = float(np.median([ms for _, ms in recent])) if recent else None
            items_per_s = len(u.completions) / w
            per_request = items_per_s / rate if rate > 0 and items_per_s else 1.0
            options = []
            for e, ep in u.p.engines.items():
                mine = [ms for en, ms in recent if en == e]
                lat_e = float(np.median(mine)) if mine else ep.mean_ms
                options.append(
                    EngineOption(
                        engine=e,
                        latency_ms=lat_e,
                        memory_mb=ep.memory_mb,
                        cores=max(1, ep.cores) if e == "cpu" else 0,
                    )
                )
            service = p50 if p50 is not None else u.p.fastest().mean_ms
            counts = u.counts()
            busy = _sim_busy(u.p, counts, items_per_s, [ms for e, ms in recent if e == "cpu"])
            demand += busy if u.p.kind == "model" else 0.0
            units.append(
                UnitState(
                    index=u.idx,
                    name=u.p.name,
                    bottleneck=float(service * per_request),
                    instances=counts,
                    options=tuple(options),
                    arrival_rate=items_per_s,
                    queue_len=u.inflight,
                    service_ms=p50,
                    min_instances=u.p.min_instances,
                    max_instances=min(u.p.max_instances or self.max_per_unit, self.max_per_unit),
                    busy=busy,
                )
            )
        cap = ResourceCap(
            memory_cap_mb=auto.cap.memory_cap_mb,
            memory_used_mb=self._memory_used(),
            max_instances=dict(auto.cap.max_instances),
            cores=auto.cap.cores,
            physical_cores=auto.cap.physical_cores,
        )
        # busy cores as the monitor reads them: CPU seconds over the window (contention
        # modelled only when the simulation knows the cores)
        while self.cpu_work and self.cpu_work[0][0] < cutoff:
            self.cpu_work.popleft()
        busy = sum(c for _, c in self.cpu_work) / w if self.cpu_cores else None
        return Snapshot(
            now=t,
            slo_ms=auto.slo_ms,
            p99_ms=p99,
            arrival_rate=rate,
            units=tuple(units),
            cap=cap,
            cores_used=pinned,
            instances_used=engines_used,
            pending=self.pending,
            offered_rate=offered,
            cores_busy=busy,
            answered=len(lat),
            late=late,
            cores_demand=demand if self.cpu_cores else None,
            served_rate=len(lat) / w,
        )

    def _apply(self, d: Decision, t: float) -> None:
        assert self.auto is not None
        if d.action == "shed":
            self.queue_limit = d.queue_limit
            return
        if d.unit is None or d.engine is None or not 0 <= d.unit < len(self.units):
            return
        u = self.units[d.unit]
        if d.engine not in u.p.engines:
            return
        if d.action == "scale_out":
            inst = self._new_instance(u, d.engine)
            self.push(t + self.auto.startup_s, _READY, u.idx, inst.iid)
            self._drain(t)  # the runtime's window grows with the instances
        elif d.action == "scale_in":
            mine = [i for i in u.live() if i.engine == d.engine]
            if not mine:
                return
            order = {"starting": 0, "idle": 1, "gathering": 2, "busy": 3}
            inst = min(mine, key=lambda i: (order[i.state], -i.iid))
            if inst.state == "starting":
                inst.state = "gone"
            elif inst.state == "idle":
                u.idle.remove(inst)
                self._remove(inst, t)
            else:
                inst.retiring = True
                if inst.state == "gathering":
                    self._start(u, inst, t)

    def _tick(self, t: float) -> None:
        entry: dict[str, Any] = {"t": round(t, 6)}
        n_new = self.arrived - self.last_arrivals
        entry["rate"] = n_new / (t - self.last_tick) if t > self.last_tick else 0.0
        self.last_tick, self.last_arrivals = t, self.arrived
        decisions: list[dict[str, Any]] = []
        if self.auto is not None:
            snap = self._snapshot(t)
            entry["p99_ms"] = snap.p99_ms
            decide = self.auto.decide or _scaler.decide
            out, self.state = decide(snap, self.state, self.auto.config)
            for d in out:
                self._apply(d, t)
                rec = {"t": round(t, 6), **asdict(d)}
                decisions.append(rec)
                self.decisions.append(rec)
        else:
            w = self.tick_s or 1.0
            lat = [ms for (ft, ms) in self.latency_window if ft >= t - w]
            entry["p99_ms"] = float(np.percentile(lat, 99)) if lat else None
        entry["instances"] = {u.p.name: len(u.live()) for u in self.units if u.p.served}
        entry["memory_mb"] = round(self._memory_used(), 3)
        entry["queue_limit"] = self.queue_limit
        entry["rejected"] = int(self.rejected.sum())
        entry["decisions"] = decisions
        self.timeline.append(entry)
        last = float(self.arrivals[-1]) if len(self.arrivals) else 0.0
        if t < last or self.pending > 0:
            self.push(t + (self.tick_s or 1.0), _TICK)


def _sim_busy(p: Any, counts: dict[str, int], items_per_s: float, cpu_ms: list[float]) -> float:
    """Cores a simulated unit's cpu instances keep busy, as the runtime's monitor reads
    them (:meth:`infscaler.runtime.scaling.monitor.Monitor.demand`): its utilisation,
    items/s x their mean ms per item (the profile's without a sample) / 1000, at most
    one per cpu instance, x their threads."""
    n = counts.get("cpu", 0)
    if n <= 0 or "cpu" not in p.engines:
        return 0.0
    ep = p.engines["cpu"]
    ms = sum(cpu_ms) / len(cpu_ms) if cpu_ms else ep.mean_ms
    share = (n / max(1, sum(counts.values()))) * items_per_s * ms / 1e3
    return min(float(n), share) * max(1, ep.cores)
