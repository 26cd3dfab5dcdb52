"""The fleet planner: place streams (a pipeline at a rate and an SLO) onto edge nodes so
that every stream meets its SLO with the fewest nodes (docs/fleet.md; docs/planner.md,
"Fleet").

:func:`capacity_curve`: per (pipeline, SLO, device) the highest feasible rate R* and a
ladder of rates with their resource vectors. :func:`place`: multi-resource first-fit
decreasing over heterogeneous bins (Panigrahy et al., "Heuristics for Vector Bin
Packing", 2011). :func:`lower_bound`: per resource, the streams' smallest node fractions
summed, rounded up. :func:`realise`: node labels and Helm values. Pure: no I/O."""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infscaler.runtime.planning.planner import plan, resource_cap
from infscaler.runtime.planning.resources import arrival_rates, busy_cores, cap_usage, per_item_ms
from infscaler.runtime.planning.simulator import MAX_PER_UNIT, UnitConfig, UnitProfile
from infscaler.runtime.queueing import capacity_rps
from infscaler.runtime.scaling.types import ResourceCap

__all__ = [
    "BISECT_STEPS",
    "LEVELS",
    "CapacityCurve",
    "FleetNode",
    "NodeAssignment",
    "Placement",
    "Stream",
    "capacity_curve",
    "lower_bound",
    "place",
    "realise",
]

#: Planner runs that bisect for R* (each halves the interval: 2**-7 of the ceiling).
BISECT_STEPS = 7
#: Ladder rates R* x k / LEVELS (k = 1..LEVELS) planned after the bisection.
LEVELS = 8
#: Requests each planner simulation covers (duration = this / rate, at most 600 s).
SIM_REQUESTS = 2000


# -- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stream:
    """One source of requests (a camera, a robot): ``rate`` requests/s of ``pipeline``
    with an end-to-end P99 SLO of ``slo_ms`` ms."""

    name: str
    pipeline: str
    rate: float
    slo_ms: float

    @property
    def key(self) -> tuple[str, float]:
        return (self.pipeline, self.slo_ms)


@dataclass(frozen=True)
class FleetNode:
    """One edge node: its Kubernetes node name, its device profile's name and cap."""

    name: str
    device: str
    cap: ResourceCap


# -- capacity ------------------------------------------------------------------------------


def _resources(cap: ResourceCap) -> tuple[str, ...]:
    names = ["memory_mb"] + [f"slots:{e}" for e in sorted(cap.max_instances)]
    if cap.cores:
        names.append("cores")
    return tuple(names)


def _cap_vector(cap: ResourceCap, pool_mb: float) -> tuple[float, ...]:
    v = [cap.memory_cap_mb - pool_mb] + [
        float(cap.max_instances[e]) for e in sorted(cap.max_instances)
    ]
    if cap.cores:
        v.append(float(cap.cores))
    return tuple(v)


@dataclass(frozen=True)
class CapacityCurve:
    """What one pipeline needs on one device type, as a function of its rate.

    Attributes:
        pipeline / slo_ms / device: the pair.
        max_rate: R*, requests/s (0: no configuration at any rate; ``reason`` says why).
        rates: the ladder, requests/s, increasing (R* last).
        vectors: per ladder rate, the resources (``resources`` order), non-decreasing.
        resources: ``memory_mb`` (MB), ``slots:ENGINE`` (instances), ``cores`` (busy).
        configs: per ladder rate, the planner's rows.
        planner_runs: how many times the planner ran for this pair."""

    pipeline: str
    slo_ms: float
    device: str
    max_rate: float
    rates: tuple[float, ...]
    vectors: tuple[tuple[float, ...], ...]
    resources: tuple[str, ...]
    configs: tuple[tuple[dict[str, Any], ...], ...] = ()
    reason: str = ""
    planner_runs: int = 0

    def level(self, rate: float) -> int | None:
        """Index of the lowest ladder rate >= ``rate`` (None: above R*)."""
        i = bisect.bisect_left(self.rates, rate - 1e-9)
        return i if i < len(self.rates) else None

    def efficiency(self) -> dict[str, float]:
        """Per resource: the least use per request/s over the ladder (for the bound)."""
        out: dict[str, float] = {}
        for j, name in enumerate(self.resources):
            out[name] = min(v[j] / r for v, r in zip(self.vectors, self.rates, strict=True))
        return out


def _ceiling(units: Sequence[UnitProfile], cap: ResourceCap) -> float:
    """Requests/s the device could serve with every slot on every unit (no queueing): an
    upper bound of R*, the one capacity model's
    (:func:`~infscaler.runtime.queueing.capacity_rps`) at the most instances the cap
    allows each served unit on each of its engines the device has."""
    service_ms: list[float | None] = []
    instances: list[int] = []
    for u in units:
        most = {}
        for e in u.engines:
            n = min(MAX_PER_UNIT, u.max_instances or MAX_PER_UNIT)
            if cap.max_instances and u.kind == "model":  # slots bound model instances only
                n = min(n, cap.max_instances.get(e, 0))
            if n > 0 and (not cap.max_instances or e in cap.max_instances):
                most[e] = n
        if not u.served:
            service_ms.append(None)  # the front end's: not bounded here
        elif most:
            service_ms.append(per_item_ms(u, UnitConfig(most)))
        else:  # none of its engines on this device: it serves nothing
            service_ms.append(1.0)
        instances.append(1 if most else 0)
    best = capacity_rps(service_ms, instances, arrival_rates(units, 1.0))
    return best if math.isfinite(best) else 1e6


def capacity_curve(
    pipeline: str,
    units: Sequence[UnitProfile],
    slo_ms: float,
    device: str,
    profile: Any,
    *,
    pool_mb: float = 0.0,
    handover_ms: float = 0.1,
    seed: int = 0,
    bisect_steps: int = BISECT_STEPS,
    levels: int = LEVELS,
    sim_requests: int = SIM_REQUESTS,
    planner: Callable[..., Any] = plan,
) -> CapacityCurve:
    """R* and the resource ladder of ``units`` on ``device`` at ``slo_ms``: at most
    ``bisect_steps + levels + 1`` runs of ``planner`` on ``sim_requests`` Poisson arrivals
    (``profile``: a DeviceProfile or ResourceCap; ``pool_mb``: the node's tensor pool, MB)."""
    cap = resource_cap(profile)
    names = _resources(cap)
    runs = 0
    feasible: dict[float, tuple[tuple[float, ...], tuple[dict[str, Any], ...]]] = {}
    last_reason = ""

    def infeasible(reason: str) -> CapacityCurve:
        return CapacityCurve(pipeline, slo_ms, device, 0.0, (), (), names, (), reason, runs)

    def run(rate: float) -> bool:
        nonlocal runs, last_reason
        runs += 1
        duration = min(600.0, sim_requests / rate)  # the same simulated work at any rate
        res = planner(
            units,
            rate,
            slo_ms,
            profile,
            duration_s=duration,
            seed=seed,
            handover_ms=handover_ms,
            pool_mb=pool_mb,
        )
        if not res.feasible:
            last_reason = res.reason
            return False
        mem, slots, _ = cap_usage(units, res.config, 0.0)
        vec = [mem] + [float(slots.get(e, 0)) for e in sorted(cap.max_instances)]
        if cap.cores:
            vec.append(busy_cores(units, res.config, rate))
        feasible[rate] = (tuple(vec), tuple(res.rows()))
        return True

    hi = _ceiling(units, cap)
    lo = 0.0
    for _ in range(bisect_steps):
        mid = (lo + hi) / 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0.0:
        # below the lowest bisection point: one try at a small rate, else infeasible
        small = hi / 4
        if not run(small):
            return infeasible(last_reason)
        lo = small
    for k in range(1, levels):
        r = lo * k / levels
        if r not in feasible:
            run(r)
    # a level whose vector alone exceeds the node cannot run: dropped, with those above
    capv = _cap_vector(cap, pool_mb)
    rates = []
    for r in sorted(feasible):
        if not all(x <= c + 1e-9 for x, c in zip(feasible[r][0], capv, strict=True)):
            break
        rates.append(r)
    if not rates:
        return infeasible(
            f"the planner's configurations exceed the device's cap (busy cores {capv})"
        )
    vectors: list[tuple[float, ...]] = []
    running = [0.0] * len(names)
    for r in rates:
        running = [max(a, b) for a, b in zip(running, feasible[r][0], strict=True)]
        vectors.append(tuple(running))
    return CapacityCurve(
        pipeline,
        slo_ms,
        device,
        rates[-1],
        tuple(rates),
        tuple(vectors),
        names,
        tuple(feasible[r][1] for r in rates),
        "",
        runs,
    )


# -- placement -----------------------------------------------------------------------------


@dataclass
class NodeAssignment:
    """One node used: per (pipeline, SLO) the aggregate rate, the streams and the
    ladder level (the planner's configuration) it runs."""

    node: str
    device: str
    rates: dict[tuple[str, float], float] = field(default_factory=dict)
    streams: dict[tuple[str, float], list[str]] = field(default_factory=dict)
    levels: dict[tuple[str, float], int] = field(default_factory=dict)
    used: tuple[float, ...] = ()

    def pipelines(self) -> list[str]:
        return sorted({p for p, _ in self.rates})


@dataclass
class Placement:
    """What :func:`place` found: the ``nodes`` used in the order opened, ``unplaced`` (stream
    -> why), the :func:`lower_bound` and its resource, the ``curves`` and the wall times of
    the packing (``seconds``) and of the curves (``curve_seconds``)."""

    nodes: list[NodeAssignment]
    unplaced: dict[str, str]
    lower_bound: int
    bound_by: str
    curves: dict[tuple[str, float, str], CapacityCurve]
    seconds: float = 0.0
    curve_seconds: float = 0.0

    @property
    def feasible(self) -> bool:
        return not self.unplaced

    def to_dict(self, curves: Mapping[tuple[str, float, str], CapacityCurve] | None = None) -> dict:
        curves = self.curves if curves is None else curves
        nodes = []
        for n in self.nodes:
            pipes = []
            for key, rate in sorted(n.rates.items()):
                c = curves[(key[0], key[1], n.device)]
                pipes.append(
                    {
                        "pipeline": key[0],
                        "slo_ms": key[1],
                        "rate": round(rate, 4),
                        "streams": n.streams[key],
                        "planned_rate": round(c.rates[n.levels[key]], 4),
                        "config": list(c.configs[n.levels[key]]) if c.configs else [],
                    }
                )
            nodes.append({"node": n.node, "device": n.device, "pipelines": pipes})
        return {
            "feasible": self.feasible,
            "nodes_used": len(self.nodes),
            "lower_bound": self.lower_bound,
            "lower_bound_resource": self.bound_by,
            "unplaced": dict(self.unplaced),
            "seconds": round(self.seconds, 4),
            "curve_seconds": round(self.curve_seconds, 4),
            "capacity": [
                {
                    "pipeline": c.pipeline,
                    "slo_ms": c.slo_ms,
                    "device": c.device,
                    "max_rate": round(c.max_rate, 4),
                    "planner_runs": c.planner_runs,
                    "reason": c.reason,
                }
                for c in curves.values()
            ],
            "placement": nodes,
        }


class _Open:
    """An open node: its use and, per pipeline key, its rate and level."""

    __slots__ = ("assign", "cap", "used", "node")

    def __init__(self, node: FleetNode, pool_mb: float) -> None:
        self.node = node
        self.cap = _cap_vector(node.cap, pool_mb)
        self.used = [0.0] * len(self.cap)
        self.assign = NodeAssignment(node.name, node.device)


def _headroom(o: _Open, key: tuple[str, float], curve: CapacityCurve) -> float:
    """The largest extra rate of ``key`` node ``o`` can take."""
    a = o.assign
    cur = a.rates.get(key, 0.0)
    base = list(o.used)
    if key in a.levels:
        base = [u - v for u, v in zip(base, curve.vectors[a.levels[key]], strict=True)]
    # largest ladder level whose vector fits with the others' use (vectors non-decreasing)
    lo, hi = -1, len(curve.rates) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        v = curve.vectors[mid]
        if all(b + x <= c + 1e-9 for b, x, c in zip(base, v, o.cap, strict=True)):
            lo = mid
        else:
            hi = mid - 1
    return curve.rates[lo] - cur if lo >= 0 else -math.inf


def place(
    streams: Sequence[Stream],
    nodes: Sequence[FleetNode],
    curves: Mapping[tuple[str, float, str], CapacityCurve],
    *,
    pool_mb: float = 0.0,
) -> Placement:
    """Place ``streams`` on ``nodes`` (see the module docstring); ``curves``: a
    :class:`CapacityCurve` per (pipeline, slo_ms, device); ``pool_mb``: each node's pool, MB.

    Raises:
        KeyError: a curve is missing."""
    t0 = time.perf_counter()
    devices = sorted({n.device for n in nodes})
    free: dict[str, list[FleetNode]] = {d: [] for d in devices}
    for n in reversed(nodes):
        free[n.device].append(n)  # pop() takes them in the order given
    order, unplaced = _order(streams, devices, curves)
    opened = _pack(order, devices, free, curves, pool_mb, unplaced, len(nodes))
    for o in opened:
        o.assign.used = tuple(round(u, 4) for u in o.used)
    placed = [s for s in streams if s.name not in unplaced]
    lb, by = lower_bound(placed, devices, curves, {n.device: n.cap for n in nodes}, pool_mb)
    return Placement(
        nodes=[o.assign for o in opened],
        unplaced=unplaced,
        lower_bound=lb,
        bound_by=by,
        curves=dict(curves),
        seconds=time.perf_counter() - t0,
    )


def _order(
    streams: Sequence[Stream],
    devices: Sequence[str],
    curves: Mapping[tuple[str, float, str], CapacityCurve],
) -> tuple[list[Stream], dict[str, str]]:
    """``(the streams to place, largest first, why each of the others is not placed)``:
    a stream's size is its rate / R* on the best device type for it; one whose rate is
    not a positive number, or above what one node of any type serves, is not placed."""
    unplaced: dict[str, str] = {}
    best_rate: dict[tuple[str, float], float] = {}
    for s in streams:
        if s.key not in best_rate:
            best_rate[s.key] = max(curves[(s.key[0], s.key[1], d)].max_rate for d in devices)
    order = []
    for s in streams:
        br = best_rate[s.key]
        if not s.rate > 0 or not math.isfinite(s.rate):
            unplaced[s.name] = f"rate {s.rate!r} is not a positive number"
        elif s.rate > br:
            cs = [(d, curves[(s.key[0], s.key[1], d)]) for d in devices]
            why = [
                f"{d}: {c.max_rate:.3g}/s" + (f" ({c.reason})" if c.reason else "") for d, c in cs
            ]
            unplaced[s.name] = (
                f"{s.rate:g} requests/s of {s.pipeline} at SLO {s.slo_ms:g} ms exceeds what "
                f"one node serves ({'; '.join(why)}): split the stream"
            )
        else:
            order.append(s)
    order.sort(key=lambda s: (-s.rate / best_rate[s.key], s.name))
    return order, unplaced


def _pack(
    order: Sequence[Stream],
    devices: Sequence[str],
    free: dict[str, list[FleetNode]],
    curves: Mapping[tuple[str, float, str], CapacityCurve],
    pool_mb: float,
    unplaced: dict[str, str],
    n_nodes: int,
) -> list[_Open]:
    """First-fit decreasing: each stream of ``order`` to the first open node with
    headroom for it, else to a node opened from ``free`` (:func:`_open_node`); the nodes
    opened, in the order opened. A stream no free node can take goes to ``unplaced``."""
    # smallest rate still to place per key (streams are placed largest first)
    remaining_min: dict[tuple[str, float], list[float]] = {}
    for s in reversed(order):
        remaining_min.setdefault(s.key, []).append(s.rate)  # ascending rates per key
    opened: list[_Open] = []
    candidates: dict[tuple[str, float], list[_Open]] = {}
    for s in order:
        key = s.key
        mins = remaining_min[key]
        mins.pop()  # ascending: this stream, the largest of its key left, is the last
        smallest = mins[0] if mins else 0.0
        cands = candidates.get(key)
        if cands is None:
            cands = list(opened)  # a key seen first: every node opened so far
        target, keep = _first_fit(cands, s, smallest, curves)
        candidates[key] = keep
        if target is None:
            target = _open_node(s, devices, free, curves, pool_mb)
            if target is not None:
                opened.append(target)
                # a new node is a candidate for every key (added lazily below)
                for k2, lst in candidates.items():
                    if k2 != key:
                        lst.append(target)
                keep.append(target)
        if target is None:
            unplaced[s.name] = (
                f"no free node can take {s.rate:g} requests/s of {s.pipeline} "
                f"(all {n_nodes} nodes are used or too small)"
            )
            continue
        _assign(target, s, curves)
    return opened


def _first_fit(
    cands: list[_Open],
    s: Stream,
    smallest: float,
    curves: Mapping[tuple[str, float, str], CapacityCurve],
) -> tuple[_Open | None, list[_Open]]:
    """``(the first of cands with headroom for s, or None; the candidates to keep for
    s's key)``: those from the target on, and before it those with headroom for the
    smallest rate of the key still to place (``smallest``; 0: none left)."""
    key = s.key
    target = None
    keep: list[_Open] = []
    for i, o in enumerate(cands):
        curve = curves[(key[0], key[1], o.node.device)]
        room = _headroom(o, key, curve)
        if target is None and room >= s.rate - 1e-9:
            target = o
            keep.extend(cands[i:])
            break
        if room >= smallest - 1e-9 and smallest > 0:
            keep.append(o)
    return target, keep


def _open_node(
    s: Stream,
    devices: Sequence[str],
    free: dict[str, list[FleetNode]],
    curves: Mapping[tuple[str, float, str], CapacityCurve],
    pool_mb: float,
) -> _Open | None:
    """Open the free node type with the highest R* for ``s``'s key that can take it
    (taken from ``free``), or None."""
    key = s.key
    types = sorted(
        (d for d in devices if free[d]),
        key=lambda d: -curves[(key[0], key[1], d)].max_rate,
    )
    for d in types:
        o = _Open(free[d][-1], pool_mb)
        curve = curves[(key[0], key[1], d)]
        if _headroom(o, key, curve) >= s.rate - 1e-9:
            free[d].pop()
            return o
    return None


def _assign(
    target: _Open, s: Stream, curves: Mapping[tuple[str, float, str], CapacityCurve]
) -> None:
    """Add ``s`` to node ``target``: its key's rate, the ladder level for it and the
    node's use (the old level's vector out, the new one's in)."""
    key = s.key
    a = target.assign
    curve = curves[(key[0], key[1], target.node.device)]
    old = a.levels.get(key)
    rate = a.rates.get(key, 0.0) + s.rate
    lvl = curve.level(rate)
    assert lvl is not None
    if old is not None:
        target.used = [u - v for u, v in zip(target.used, curve.vectors[old], strict=True)]
    target.used = [u + v for u, v in zip(target.used, curve.vectors[lvl], strict=True)]
    a.rates[key] = rate
    a.levels[key] = lvl
    a.streams.setdefault(key, []).append(s.name)


def lower_bound(
    streams: Sequence[Stream],
    devices: Sequence[str],
    curves: Mapping[tuple[str, float, str], CapacityCurve],
    caps: Mapping[str, ResourceCap],
    pool_mb: float = 0.0,
) -> tuple[int, str]:
    """``(nodes, resource)``: no placement in this model uses fewer nodes (see the module
    docstring); ``resource`` is the one that binds."""
    if not streams:
        return 0, "-"
    need: dict[str, float] = {}
    cache: dict[tuple[str, float], dict[str, float]] = {}
    for s in streams:
        per = cache.get(s.key)
        if per is None:
            per = {}
            for d in devices:
                c = curves[(s.key[0], s.key[1], d)]
                if c.max_rate <= 0:
                    continue
                capv = dict(zip(_resources(caps[d]), _cap_vector(caps[d], pool_mb), strict=True))
                for m, e in c.efficiency().items():
                    frac = e / capv[m] if capv[m] > 0 else math.inf
                    per[m] = min(per.get(m, math.inf), frac)
            # a resource some device type lacks entirely is not needed there: 0
            for m in list(per):
                if any(
                    m not in _resources(caps[d])
                    for d in devices
                    if curves[(s.key[0], s.key[1], d)].max_rate > 0
                ):
                    per[m] = 0.0
            cache[s.key] = per
        for m, f in per.items():
            need[m] = need.get(m, 0.0) + s.rate * f
    m, v = max(need.items(), key=lambda kv: kv[1])
    return max(1, math.ceil(v - 1e-9)), m


# -- realisation ---------------------------------------------------------------------------

#: Node label the chart's DaemonSets select on (one DaemonSet per group).
GROUP_LABEL = "infscaler.io/group"


def realise(placement: Placement) -> dict[str, Any]:
    """The Kubernetes side of a placement: nodes with the same device and the same set
    of pipelines form a group; each group is one entry of the Helm chart's ``groups``
    value (a DaemonSet selecting ``infscaler.io/group=<group>``), and each node gets that
    label. Returns ``{"labels": {node: group}, "values": {"groups": [...]}}``."""
    groups: dict[tuple[str, tuple[str, ...]], str] = {}
    labels: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    for n in placement.nodes:
        sig = (n.device, tuple(n.pipelines()))
        if sig not in groups:
            name = f"g{len(groups) + 1}-{n.device}"
            groups[sig] = name
            entries.append(
                {
                    "name": name,
                    "device": n.device,
                    "nodeSelector": {GROUP_LABEL: name},
                    "pipelines": list(sig[1]),
                }
            )
        labels[n.node] = groups[sig]
    return {"labels": labels, "values": {"groups": entries}}
