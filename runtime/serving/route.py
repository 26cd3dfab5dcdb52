"""A deployed pipeline as the front end routes it (:class:`Route`: its stage ids,
statistics, load-shedding and availability flags, and the measured service-time
estimates the admission judges on) and a completed request (:class:`Result`).

The estimates: :meth:`Route.seed_compute` starts them from the instances' warm-up runs,
:meth:`Route.record_compute` folds each completed request's trace in (EWMA), and
:meth:`Route.record_estimate` / :meth:`Route.record_expiry` keep :attr:`Route.correction`
(observed latency / estimate) so that :meth:`Route.estimates` covers what compute time
alone misses. :func:`~infscaler.runtime.serving.admission.admit_request` decides on them.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infscaler.runtime import queueing
from infscaler.runtime.serving.admission import SHED_MIN_LOAD
from infscaler.runtime.serving.pipeline import CompiledPipeline, load_function
from infscaler.runtime.serving.stats import PipelineStats

__all__ = ["Result", "Route"]

#: the most the observed / estimated latency ratio may scale estimates by
_MAX_CORRECTION = 4.0
#: weight of a new measurement in the service-time averages (EWMA)
_EWMA = 0.2
#: completed (or expired) requests whose latency / estimate ratios :attr:`Route.correction`
#: is the median of
_RATIOS = 31
#: in overload admission scales its estimates by this quantile of the latency /
#: estimate ratios (at least 1, at least :attr:`Route.correction`): a request is
#: admitted when 9 in 10 like it finished within their estimate, not 1 in 2
#: (:meth:`Route.factor`)
OVERLOAD_QUANTILE = 0.9
#: a burst: the offered load over the last :data:`BURST_WINDOW_S` s at least this
#: multiple of the capacity also counts as overload (:meth:`Route.overloaded`)
BURST_LOAD = 1.25
BURST_WINDOW_S = 1.0
#: below capacity (the offered load under the scaler's
#: :data:`~infscaler.runtime.serving.admission.SHED_MIN_LOAD` of it), admission refuses only a
#: request whose estimate times this quantile of the ratios (over their median) is
#: past the SLO (:meth:`Route.lenience`)
LENIENT_QUANTILE = 0.1


@dataclass
class Route:
    """A deployed pipeline as the front end routes it.

    Attributes:
        pipeline: the compiled pipeline.
        stage_ids: channel stage of each unit (0 for the fan-in, run here).
        stats: its statistics.
        queue_limit: requests of this pipeline admitted at once (None: only
            ``max_pending`` bounds them); set by the autoscaler when the device's cap is
            reached (load shedding), with ``shed_reason`` for the 503.
        max_inflight: requests of this pipeline in the token pipeline at once (more wait
            in the front end's backlog), so the stages downstream always find pool room.
        unavailable_reason: set while a unit has no live instance: new requests get a 503
            with this reason and ``retry_after_s`` (expected time until it is back, s).
        instances: live instances per unit (1 for units run in the front end).
        service_ms: measured compute ms of one request, all units (EWMA; None until
            a request completed).
        unit_ms: measured compute ms per unit per request (EWMA, summed over items).
        admitted: requests of this pipeline admitted and not answered.
        measured: True once a request completed (before: :attr:`service_ms` is a seed
            from the instances' warm-up runs, or None).
        correction: observed latency / admission estimate of completed requests (the
            median of the last ones, :meth:`record_estimate`); the admission scales its
            estimates by it (within [0.5, 4]).
        dues: per admitted request (its sequence number), when admission expected it
            answered (``time.monotonic()`` s), in admission order (:meth:`progress`).
        queued: requests admitted and not started per priority level (levels with none
            left out).
        refusals: requests refused over the pipeline's life, by reason (the
            :class:`~infscaler.runtime.serving.admission.Refusal` values and
            ``queue_timeout``): the metric ``infscaler_requests_refused_total``.
    """

    pipeline: CompiledPipeline
    stage_ids: list[int]
    stats: PipelineStats
    max_inflight: int = 8
    accepting: bool = True
    queue_limit: int | None = None
    shed_reason: str = ""
    unavailable_reason: str | None = None
    retry_after_s: float = 1.0
    instances: list[int] | None = None
    service_ms: float | None = None
    unit_ms: list[float] | None = None
    admitted: int = 0
    measured: bool = False
    correction: float = 1.0
    dues: dict[int, float] = field(default_factory=dict)
    queued: collections.Counter[int] = field(default_factory=collections.Counter)
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)
    _ratios: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_RATIOS)
    )
    #: :attr:`_ratios` sorted, kept by :meth:`record_estimate` (once per completed
    #: request) so that the arrival path reads its quantiles without sorting
    _ranked: list[float] = field(default_factory=list)
    _fan_in_fn: Any = None

    def __post_init__(self) -> None:
        # refusals count over the pipeline's life: its statistics' counter, which the
        # next configuration's statistics share (PipelineStats.successor)
        life = getattr(self.stats, "refused", None)
        if isinstance(life, collections.Counter) and not self.refusals:
            self.refusals = life

    def seed_compute(self, unit_ms: list[float | None]) -> None:
        """Start the service-time estimates from per-unit ms measured at load (the
        instances' warm-up runs; None for a unit without one, 0 for units run in the
        front end). Ignored unless every unit has a value, or once real requests were
        measured."""
        if self.measured or any(ms is None for ms in unit_ms):
            return
        self.unit_ms = [float(ms) for ms in unit_ms]  # type: ignore[arg-type]
        self.service_ms = sum(self.unit_ms)

    def estimates(self, overloaded: bool = False) -> tuple[float | None, float | None]:
        """``(service_ms, interval_ms)`` for :func:`~infscaler.runtime.serving.admission.admit_latency`:
        the measured compute of one request, and the bottleneck interval (the slowest
        unit's compute divided by its instances), both scaled by :meth:`factor`;
        ``(None, None)`` before a measurement."""
        if self.service_ms is None or self.unit_ms is None:
            return None, None
        f = self.factor(overloaded)
        interval = max((ms / k for ms, k in self._units(f)), default=0.0)
        return self.service_ms * f, interval

    def factor(self, overloaded: bool = False) -> float:
        """What the measured compute times are scaled by for admission: the
        :attr:`correction`; while ``overloaded`` (:meth:`overloaded`) the
        :data:`OVERLOAD_QUANTILE` of the last latency / estimate ratios (once 10 are
        known), and never below 1 or the correction. Why: docs/scaling.md, "The route's
        estimates, why".
        """
        if not overloaded:
            return self.correction
        tail = self.ratio_quantile(OVERLOAD_QUANTILE)
        return max(1.0, self.correction, tail or 0.0)

    def ratio_quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank, in [0, 1]) of the last latency / estimate
        ratios (:meth:`record_estimate`); None while fewer than 10 are known."""
        ranked = self._ranked
        if len(ranked) < 10:
            return None
        return ranked[min(len(ranked) - 1, int(q * (len(ranked) - 1) + 0.5))]

    def units(self, overloaded: bool = False) -> tuple[tuple[float, int], ...] | None:
        """``(ms per request, instances)`` of every unit scaled by :meth:`factor`, as
        :func:`~infscaler.runtime.serving.admission.drain_ms` takes them; None before a
        measurement."""
        if self.service_ms is None or self.unit_ms is None:
            return None
        return self._units(self.factor(overloaded))

    def _units(self, factor: float | None = None) -> tuple[tuple[float, int], ...]:
        """``(ms per request x factor, instances >= 1)`` per unit (needs
        :attr:`unit_ms`; ``factor`` None: :attr:`correction`)."""
        assert self.unit_ms is not None
        f = self.correction if factor is None else factor
        n = self.instances or [1] * len(self.unit_ms)
        return tuple((ms * f, max(1, int(k))) for ms, k in zip(self.unit_ms, n, strict=False))

    def progress(
        self, now: float
    ) -> tuple[tuple[float, ...] | None, tuple[tuple[float, int], ...] | None]:
        """``(remaining_ms, units)`` for :func:`~infscaler.runtime.serving.admission.estimate_ms`:
        the ms the most recently admitted requests have left until admission's estimate
        of them (most recent first, as many as the most instances of any unit), and
        ``(ms per request, instances)`` of every unit, scaled by :attr:`correction` like
        :meth:`estimates`. ``(None, None)`` before a measurement.

        Args:
            now: ``time.monotonic()``, s.
        """
        if self.service_ms is None or self.unit_ms is None:
            return None, None
        units = self._units()
        depth = max((k for _ms, k in units), default=1)
        recent = itertools.islice(reversed(self.dues.values()), depth)
        return tuple((due - now) * 1e3 for due in recent), units

    def lenience(self, now: float | None = None, overloaded: bool | None = None) -> float:
        """What admission scales its estimate by before comparing it with the SLO, in
        [0.5, 1]: 1 in overload, or before :data:`LENIENT_QUANTILE`'s ratio is known; while
        the offered load is below :data:`~infscaler.runtime.serving.admission.SHED_MIN_LOAD`
        of :meth:`capacity_rps`, the :data:`LENIENT_QUANTILE` of the last latency / estimate
        ratios over their median (:attr:`correction`). ``overloaded``: :meth:`overloaded`
        when the caller has it (None: computed). Why: docs/scaling.md, "The route's
        estimates, why".
        """
        if len(self._ranked) < 10 or self.unit_ms is None:
            return 1.0
        if self.overloaded(now) if overloaded is None else overloaded:
            return 1.0
        low = self._ranked[int(LENIENT_QUANTILE * (len(self._ranked) - 1))]
        # the ratios' median is the correction (record_estimate)
        return max(0.5, min(1.0, low / self.correction)) if self.correction > 0 else 1.0

    def capacity_rps(self) -> float | None:
        """Requests/s the pipeline's slowest unit can take: its instances x 1000 / its ms
        per request (:func:`~infscaler.runtime.queueing.capacity_rps`), scaled by
        :attr:`correction` floored at 1 (a correction below 1
        says that requests ahead expired, not that the units got faster); None before a
        measurement."""
        if self.unit_ms is None:
            return None
        # the median correction (not the overload's tail quantile): a capacity
        units = self._units(max(1.0, self.correction))
        cap = queueing.capacity_rps([ms for ms, _ in units], [k for _, k in units])
        return None if math.isinf(cap) else cap

    def overloaded(self, now: float | None = None) -> bool:
        """True while the offered load (admitted and refused, last 10 s) is at least
        :data:`~infscaler.runtime.serving.admission.SHED_MIN_LOAD` of :meth:`capacity_rps`,
        or over the last :data:`BURST_WINDOW_S` s at least :data:`BURST_LOAD` x it (False
        before a measurement): what switches admission to its drain-time estimate and its
        lenience off. Why the short window: docs/scaling.md, "The route's estimates, why".
        """
        capacity = self.capacity_rps()
        if capacity is None:
            return False
        if self.stats.offered_rate(now) >= SHED_MIN_LOAD * capacity:
            return True
        return self.stats.offered_rate(now, BURST_WINDOW_S) >= BURST_LOAD * capacity

    def record_estimate(
        self, estimate_ms: float | None, latency_ms: float, factor: float | None = None
    ) -> None:
        """Fold a completed request's latency against what admission expected into
        :attr:`correction`: the median of the last :data:`_RATIOS` ratios of latency to the
        uncorrected estimate (a median, not an EWMA: docs/scaling.md, "The route's
        estimates, why").

        ``factor``: what the estimate's compute times were scaled by (:meth:`factor` at
        admission; None: the current :attr:`correction`).
        """
        if estimate_ms is None or estimate_ms <= 0:
            return
        f = self.correction if factor is None else factor
        ratio = min(_MAX_CORRECTION, max(0.5, f * latency_ms / estimate_ms))  # raw estimate
        # the ranked copy changes by one insertion (and the ratio the window drops), and
        # is replaced whole: admission reads it from other threads
        ranked = self._ranked.copy()
        if len(self._ratios) == self._ratios.maxlen:
            ranked.remove(self._ratios[0])
        self._ratios.append(ratio)
        bisect.insort(ranked, ratio)
        self._ranked = ranked
        mid = len(ranked) // 2  # the median, as statistics.median takes it
        self.correction = ranked[mid] if len(ranked) % 2 else (ranked[mid - 1] + ranked[mid]) / 2

    def record_expiry(
        self, estimate_ms: float | None, elapsed_ms: float, factor: float | None = None
    ) -> None:
        """A request admitted on ``estimate_ms`` expired after ``elapsed_ms`` unfinished:
        its latency was at least ``elapsed_ms``. When that is past the estimate, the
        estimate was too low: fold it in like a completed request (else it says
        nothing). Without this only the requests fast enough to finish fed
        :attr:`correction`, so an underestimating model kept admitting requests that
        then expired half computed (the 10x overload bench: 290 of 451 admitted
        requests expired, 0.41 x capacity served)."""
        if estimate_ms is not None and estimate_ms > 0 and elapsed_ms > estimate_ms:
            self.record_estimate(estimate_ms, elapsed_ms, factor)

    def record_compute(self, trace: np.ndarray) -> None:
        """Fold one completed request's trace rows (unit, instance, start ns, end ns)
        into :attr:`service_ms` / :attr:`unit_ms`."""
        units = len(self.pipeline.units)
        per = [0.0] * units
        for unit, _inst, start, end in trace.tolist():
            if 0 <= unit < units:
                per[int(unit)] += (end - start) / 1e6
        total = sum(per)
        if not self.measured or self.unit_ms is None or self.service_ms is None:
            self.unit_ms, self.service_ms, self.measured = per, total, True
            return
        self.unit_ms = [(1 - _EWMA) * a + _EWMA * b for a, b in zip(self.unit_ms, per, strict=True)]
        self.service_ms = (1 - _EWMA) * self.service_ms + _EWMA * total

    def fan_in_fn(self) -> Any:
        if self._fan_in_fn is None:
            fi = self.pipeline.fan_in_index
            assert fi is not None
            self._fan_in_fn = load_function(self.pipeline.units[fi].function or "")
        return self._fan_in_fn


@dataclass
class Result:
    """A completed request.

    Attributes:
        outputs: the pipeline's output tensors (owned copies).
        trace: int64 [n, 4] rows (unit, instance, start ns, end ns) of every unit run.
        latency_ms: submit to completion, ms.
        items: number of fan-out items (None without a fan-out).
    """

    outputs: dict[str, np.ndarray]
    trace: np.ndarray
    latency_ms: float
    items: int | None = None

    def unit_ms(self, units: list[str]) -> dict[str, float]:
        """Compute ms per unit name (summed over items)."""
        out = dict.fromkeys(units, 0.0)
        for unit, _inst, start, end in self.trace.tolist():
            if 0 <= unit < len(units):
                out[units[int(unit)]] += (end - start) / 1e6
        return {k: round(v, 3) for k, v in out.items()}


def merge_traces(traces: list[np.ndarray]) -> np.ndarray:
    """A request's trace from the traces its tokens brought back: int64 ``[n, 4]`` rows
    (unit, instance, start ns, end ns), each row once, sorted (fan-out items repeat the
    rows of the units before the fan-out). One trace whose unit column strictly rises
    (a chain) is that already and is returned as it is, without ``np.unique``'s sort."""
    if not traces:
        return np.zeros((0, 4), dtype=np.int64)
    if len(traces) == 1:
        t = traces[0]
        if len(t) < 2 or bool((t[1:, 0] > t[:-1, 0]).all()):
            return t
    return np.unique(np.concatenate(traces), axis=0)
