"""Model-less variant selection: INFaaS (Romero et al., USENIX ATC'21) as pure functions.

:func:`classify` (Fig. 4 states), :func:`select` (Algorithm 1), :func:`vertical_scale`
(§4.2.2), :func:`validate_query`. No I/O, no clock.

More: docs/variants.md, "The selector in full".
"""

from __future__ import annotations

import enum
import math
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from infscaler.base.errors import InfScalerError
from infscaler.runtime.queueing import capacity_rps

__all__ = [
    "Catalog",
    "Query",
    "ScalingAction",
    "ScalingConfig",
    "Selection",
    "SelectionError",
    "SelectorConfig",
    "VariantLoad",
    "VariantProfile",
    "VariantState",
    "classify",
    "select",
    "served_capacity_qps",
    "validate_query",
    "vertical_scale",
]


class SelectionError(InfScalerError):
    """A query the selector refuses; ``status``: 404 unknown task, 400 bad values."""

    def __init__(self, message: str, status: int = 400, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


class VariantState(str, enum.Enum):
    """A variant's state (INFaaS Fig. 4)."""

    INACTIVE = "inactive"
    ACTIVE = "active"
    OVERLOADED = "overloaded"
    INTERFERED = "interfered"


@dataclass(frozen=True)
class VariantProfile:
    """What the selector reads of a registered variant.

    Attributes:
        name: unique variant name (``ppocrv5-rec.cpu.fp32.b1``).
        task / model: the task served and the registered model.
        engine / precision / batch / partitions: how it runs.
        latency_ms: the profiled P99 at ``batch``, ms.
        throughput_qps: one instance's saturation throughput (``batch`` x 1000 / P50).
        load_ms: time to load one instance, ms; accuracy: 0-1; memory_mb: peak per instance.
    """

    name: str
    task: str
    model: str
    latency_ms: float
    accuracy: float
    load_ms: float = 0.0
    memory_mb: float = 0.0
    throughput_qps: float = 0.0
    engine: str = "cpu"
    precision: str = "fp32"
    batch: int = 1
    partitions: int = 1

    @property
    def capacity_qps(self) -> float:
        """Saturation throughput of one instance (from ``latency_ms`` when not given)."""
        if self.throughput_qps > 0:
            return self.throughput_qps
        return self.batch * 1000.0 / max(self.latency_ms, 1e-6)


@dataclass(frozen=True)
class VariantLoad:
    """One variant as the monitor sees it now: ``state``, ready ``instances``, ``pending``
    requests, arrival ``rate`` /s, ``utilisation`` (Algorithm 1's load) and measured P50
    ``service_ms`` (None: no sample).
    """

    state: VariantState = VariantState.INACTIVE
    instances: int = 0
    pending: int = 0
    rate: float = 0.0
    utilisation: float = 0.0
    service_ms: float | None = None


INACTIVE = VariantLoad()


@dataclass(frozen=True)
class SelectorConfig:
    """Thresholds of :func:`classify`: Overloaded at ``overload_utilisation`` x throughput or
    ``overload_queue_per_instance`` pending per slot; Interfered beyond ``interference_ratio``
    x the profiled time, after ``min_samples`` requests.
    """

    overload_utilisation: float = 0.9
    overload_queue_per_instance: float = 4.0
    interference_ratio: float = 1.5
    min_samples: int = 5


def classify(
    profile: VariantProfile,
    *,
    ready: int,
    pending: int = 0,
    rate: float = 0.0,
    service_ms: float | None = None,
    samples: int = 0,
    shedding: bool = False,
    config: SelectorConfig = SelectorConfig(),
) -> VariantLoad:
    """The state of ``profile`` from ``ready`` instances, ``pending`` requests, ``rate`` /s,
    measured ``service_ms`` (over ``samples`` runs) and ``shedding``.
    """
    if ready <= 0:
        return VariantLoad(VariantState.INACTIVE, 0, pending, rate, 0.0, service_ms)
    capacity = ready * profile.capacity_qps
    slots = ready * max(1, profile.batch)
    utilisation = max(rate / capacity if capacity > 0 else 0.0, pending / slots)
    overloaded = (
        shedding
        or (capacity > 0 and rate >= config.overload_utilisation * capacity)
        or pending > config.overload_queue_per_instance * slots
    )
    if overloaded:
        state = VariantState.OVERLOADED
    elif (
        service_ms is not None
        and samples >= config.min_samples
        and service_ms > config.interference_ratio * profile.latency_ms
    ):
        state = VariantState.INTERFERED
    else:
        state = VariantState.ACTIVE
    return VariantLoad(state, ready, pending, rate, utilisation, service_ms)


@dataclass(frozen=True)
class Query:
    """A model-less query: ``task``, ``latency_ms`` and ``min_accuracy`` (None: any)."""

    task: str
    latency_ms: float | None = None
    min_accuracy: float | None = None


@dataclass(frozen=True)
class Selection:
    """The selector's answer: ``variant``, ``meets_requirements`` (False for the closest one or
    an overloaded match), its ``state``, ``step`` (``active`` / ``inactive`` / ``closest``)
    and a readable ``reason``.
    """

    variant: VariantProfile
    meets_requirements: bool
    state: VariantState
    step: str
    reason: str


@dataclass
class Catalog:
    """Variant ``profiles`` by task, sorted by latency (INFaaS §5's sorted sets)."""

    profiles: Iterable[VariantProfile] = ()
    by_task: dict[str, tuple[VariantProfile, ...]] = field(init=False)

    def __post_init__(self) -> None:
        groups: dict[str, list[VariantProfile]] = {}
        for p in self.profiles:
            groups.setdefault(p.task, []).append(p)
        self.by_task = {
            t: tuple(sorted(v, key=lambda p: (p.latency_ms, -p.accuracy, p.name)))
            for t, v in groups.items()
        }
        self.profiles = tuple(p for v in self.by_task.values() for p in v)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.by_task)

    def variants(self, task: str) -> tuple[VariantProfile, ...]:
        return self.by_task.get(task, ())

    def get(self, name: str) -> VariantProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


def _number(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise SelectionError(f"{what} must be a number, got {value!r}")
    if not isinstance(value, int | float):
        try:
            value = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SelectionError(f"{what} must be a number, got {value!r}") from None
    v = float(value)
    if math.isnan(v):
        raise SelectionError(f"{what} must be a number, got NaN")
    return v


def validate_query(query: Query, tasks: Iterable[str]) -> Query:
    """The query with its numbers as floats.

    Raises:
        SelectionError: (404) unregistered task; (400) bad ``latency_ms`` or ``min_accuracy``.
    """
    if not isinstance(tasks, Container):
        tasks = tuple(tasks)
    if not isinstance(query.task, str) or query.task not in tasks:
        known = sorted(tasks)
        listed = (
            ", ".join(known) if known else "none: register one with `infscaler variants register`"
        )
        raise SelectionError(
            f"unknown task {query.task!r} (registered tasks: {listed})",
            404,
            hint="name a registered task, or register variants for it first",
        )
    latency = _number(query.latency_ms, "latency_ms")
    if latency is not None and latency <= 0:
        raise SelectionError(f"latency_ms must be > 0 ms, got {latency:g}")
    accuracy = _number(query.min_accuracy, "min_accuracy")
    if accuracy is not None and not 0.0 <= accuracy <= 1.0:
        raise SelectionError(f"min_accuracy must be within [0, 1], got {accuracy:g}")
    return Query(query.task, latency, accuracy)


def _meets(p: VariantProfile, latency: float, accuracy: float) -> bool:
    return p.latency_ms <= latency and p.accuracy >= accuracy


def _shortfall(p: VariantProfile, latency: float, accuracy: float) -> float:
    """Relative distance to the requirements (0 when ``p`` meets them)."""
    lat = max(0.0, p.latency_ms / latency - 1.0) if math.isfinite(latency) else 0.0
    acc = max(0.0, accuracy - p.accuracy) / max(accuracy, 1e-9)
    return lat + acc


def _describe(p: VariantProfile) -> str:
    return f"{p.name} (P99 {p.latency_ms:.3g} ms, accuracy {p.accuracy:.3f})"


def _wants(latency: float, accuracy: float) -> str:
    parts = []
    if math.isfinite(latency):
        parts.append(f"latency <= {latency:g} ms")
    if accuracy > 0:
        parts.append(f"accuracy >= {accuracy:g}")
    return " and ".join(parts) or "no requirement"


def select(
    query: Query,
    catalog: Catalog,
    loads: Mapping[str, VariantLoad] | None = None,
    *,
    validated: bool = False,
) -> Selection:
    """INFaaS Algorithm 1; ``loads``: variant -> :class:`VariantLoad` (missing: Inactive);
    ``validated``: skip re-checking ``query``.

    Raises:
        SelectionError: an invalid query, or the task has no generated variant.
    """
    q = query if validated else validate_query(query, catalog.by_task)
    variants = catalog.by_task[q.task]
    if not variants:
        raise SelectionError(f"task {q.task!r} has no generated variant", 404)
    loads = loads or {}
    latency = q.latency_ms if q.latency_ms is not None else math.inf
    accuracy = q.min_accuracy if q.min_accuracy is not None else 0.0

    # 1. Active variants meeting both: the least loaded (ties: the fastest).
    best: VariantProfile | None = None
    best_key: tuple[float, float] | None = None
    for p in variants:
        ld = loads.get(p.name, INACTIVE)
        if ld.state is VariantState.ACTIVE and _meets(p, latency, accuracy):
            key = (ld.utilisation, p.latency_ms)
            if best_key is None or key < best_key:
                best, best_key = p, key
    if best is not None:
        ld = loads[best.name]
        return Selection(
            best,
            True,
            VariantState.ACTIVE,
            "active",
            f"active {_describe(best)} meets {_wants(latency, accuracy)}; "
            f"least loaded (utilisation {ld.utilisation:.2f}, {ld.instances} instances)",
        )

    # 2. Inactive variants meeting both: the lowest load + inference latency.
    best = None
    best_cost = math.inf
    for p in variants:
        ld = loads.get(p.name, INACTIVE)
        if ld.state is VariantState.INACTIVE and _meets(p, latency, accuracy):
            cost = p.load_ms + p.latency_ms
            if cost < best_cost:
                best, best_cost = p, cost
    if best is not None:
        busy = [
            p.name
            for p in variants
            if loads.get(p.name, INACTIVE).state
            in (VariantState.OVERLOADED, VariantState.INTERFERED)
            and _meets(p, latency, accuracy)
        ]
        why = f" ({', '.join(busy)} overloaded or interfered)" if busy else ""
        return Selection(
            best,
            True,
            VariantState.INACTIVE,
            "inactive",
            f"no active variant meets {_wants(latency, accuracy)}{why}; inactive "
            f"{_describe(best)} has the lowest load + inference time "
            f"({best.load_ms:.0f} + {best.latency_ms:.3g} ms)",
        )

    # 3. The closest variant, flagged (INFaaS's suggestVariant).
    order = {
        VariantState.ACTIVE: 0,
        VariantState.INACTIVE: 1,
        VariantState.INTERFERED: 2,
        VariantState.OVERLOADED: 3,
    }
    best = None
    best_rank: tuple[float, int, float] | None = None
    for p in variants:
        st = loads.get(p.name, INACTIVE).state
        rank = (_shortfall(p, latency, accuracy), order[st], p.latency_ms)
        if best_rank is None or rank < best_rank:
            best, best_rank = p, rank
    assert best is not None and best_rank is not None
    state = loads.get(best.name, INACTIVE).state
    if best_rank[0] == 0.0:
        reason = (
            f"every variant meeting {_wants(latency, accuracy)} is overloaded or "
            f"interfered; {_describe(best)} is {state.value}"
        )
    else:
        reason = (
            f"no variant of {q.task} meets {_wants(latency, accuracy)}; the closest is "
            f"{_describe(best)}"
        )
    return Selection(best, False, state, "closest", reason)


# -- vertical scaling (INFaaS §4.2.2) ------------------------------------------------------


@dataclass(frozen=True)
class ScalingConfig:
    """Tuning of :func:`vertical_scale`: ``slack`` (INFaaS's 1.05), ``load_weight`` (lambda, 1/s),
    ``downgrade_utilisation`` (the cheaper variant's most business) and ``hold_s`` (least
    wait after a change before a downgrade, besides T_v).
    """

    slack: float = 1.05
    load_weight: float = 1.0
    downgrade_utilisation: float = 0.5
    hold_s: float = 10.0


@dataclass(frozen=True)
class ScalingAction:
    """``upgrade`` / ``downgrade`` from ``current`` to ``target``, with ``instances`` of it needed
    and a readable ``reason``.
    """

    action: str
    current: str
    target: str
    instances: int
    reason: str


def _cost(p: VariantProfile, n: int, config: ScalingConfig) -> float:
    return max(p.memory_mb, 1.0) * n * (1.0 + config.load_weight * p.load_ms / 1000.0)


def _needed(p: VariantProfile, rate: float, slack: float) -> int:
    return max(1, math.ceil(rate * slack / max(p.capacity_qps, 1e-9)))


def served_capacity_qps(profile: VariantProfile, load: VariantLoad) -> float:
    """One instance's saturation throughput as served now: the profiled capacity, or less when
    the measured ``load.service_ms`` is slower
    (:func:`~infscaler.runtime.queueing.capacity_rps`).
    """
    served = capacity_rps([load.service_ms], [1], [1.0 / max(1, profile.batch)])
    return min(profile.capacity_qps, served)


def vertical_scale(
    current: VariantProfile,
    load: VariantLoad,
    candidates: Sequence[VariantProfile],
    *,
    slo_ms: float | None = None,
    min_accuracy: float | None = None,
    can_replicate: bool = True,
    since_change_s: float = math.inf,
    memory_free_mb: float | None = None,
    config: ScalingConfig = ScalingConfig(),
) -> ScalingAction | None:
    """Upgrade or downgrade ``current``, or None (keep; replicate if the scaler can). Pure.

    Args:
        load: ``rate``, ``instances`` and ``service_ms`` are read.
        candidates: the task's variants.
        slo_ms, min_accuracy: the query's; None: the current variant's.
        can_replicate: the scaler can still add an instance within the cap.
        since_change_s: seconds since this variant's last change.
        memory_free_mb: what the device can still give (None: unchecked).
    """
    slo = slo_ms if slo_ms is not None else current.latency_ms
    floor = min_accuracy if min_accuracy is not None else current.accuracy
    instances = max(load.instances, 1)
    rate = max(load.rate, 0.0)
    capacity = instances * served_capacity_qps(current, load)
    headroom = capacity / rate if rate > 0 else math.inf
    freed = current.memory_mb * instances

    def fits(p: VariantProfile, n: int) -> bool:
        return memory_free_mb is None or p.memory_mb * n <= memory_free_mb + freed

    others = [
        p
        for p in candidates
        if p.name != current.name and p.latency_ms <= slo and p.accuracy >= floor
    ]
    if headroom < config.slack and not can_replicate:
        ups = [p for p in others if p.capacity_qps > current.capacity_qps]
        same = [p for p in ups if p.model == current.model]
        best: tuple[float, VariantProfile, int] | None = None
        for pool in (same, ups):
            for p in pool:
                n = _needed(p, rate, config.slack)
                if not fits(p, n):
                    continue
                c = _cost(p, n, config)
                if best is None or c < best[0]:
                    best = (c, p, n)
            if best is not None:
                break
        if best is None:
            return None
        _, p, n = best
        return ScalingAction(
            "upgrade",
            current.name,
            p.name,
            n,
            f"headroom {headroom:.2f} < slack {config.slack} at {rate:.1f} req/s and the "
            f"scaler cannot add another {current.name}; {p.name} serves "
            f"{p.capacity_qps:.1f} req/s per instance (P99 {p.latency_ms:.3g} ms <= "
            f"{slo:g} ms, accuracy {p.accuracy:.3f}) with {n} instance(s)",
        )
    hold = max(config.hold_s, current.load_ms / 1000.0)
    if (
        since_change_s < hold
        or headroom < config.slack
        or rate <= 0
        or load.state is VariantState.OVERLOADED
    ):
        return None  # an overloaded variant (backlog, or the scaler sheds) keeps its load
    here = _cost(current, instances, config)
    best = None
    for p in others:
        n = _needed(p, rate, config.slack)
        if rate / (n * p.capacity_qps) > config.downgrade_utilisation or not fits(p, n):
            continue
        c = _cost(p, n, config)
        if c < here and (best is None or c < best[0]):
            best = (c, p, n)
    if best is None:
        return None
    c, p, n = best
    return ScalingAction(
        "downgrade",
        current.name,
        p.name,
        n,
        f"load {rate:.1f} req/s fits {n} instance(s) of {p.name} (cost {c:.0f} < "
        f"{here:.0f}: memory MB x instances x load-time weight), which meets P99 "
        f"{slo:g} ms and accuracy {floor:.3f}",
    )
