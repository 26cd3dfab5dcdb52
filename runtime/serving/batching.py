"""MArk dynamic batching as pure functions (Zhang et al., USENIX ATC'19, §4 "Batching").

MArk tunes two knobs per instance type: N_batch (the largest batch) and W_batch (the
longest an instance waits to fill it). From a light profile of the batch latency T_b it
grows the batch size b from 1 until one of two constraints no longer holds:

* ``W_batch + T_b <= RT_max``: waiting plus processing stays within the response-time
  budget (here ``budget_ms``, the unit's share of the pipeline's SLO);
* ``W_batch + T_b <= b / mu*_nb``: batching must beat serving the same b requests one
  after another without batching; mu*_nb = 1 / T_1, so the bound is ``b x T_1``.

W_batch for a batch of b at an arrival rate lambda (requests/s reaching one instance) is
the time the b-th request takes to arrive after the first: ``(b - 1) / lambda`` s, i.e.
``(b - 1) x 1000 / lambda`` ms (0 for b = 1).

Units throughout: latencies and waits in ms, rates in requests (items) per second.
The autoscaler loop (:meth:`infscaler.runtime.scaling.autoscaler.Autoscaler.tune_batches`) calls
:func:`choose_batch` with each instance's measured ``{batch: ms}`` profile and sends the
chosen size to the instance. :class:`ExecCounts` / :class:`ExecTotals` count what ran as
Triton's statistics do (executions, items, per batch size); nothing here starts or times.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# relative slack when comparing sums of floats (30.000000000000004 + 50 <= 80 holds)
_REL = 1e-9


@dataclass(frozen=True)
class BatchChoice:
    """MArk's batching configuration for one instance.

    Attributes:
        batch_size: N_batch, the batch size to run (>= 1).
        wait_ms: W_batch, how long to wait for the batch to fill, ms (0 for batch 1).
        batch_latency_ms: T_b, the (interpolated) time to process a batch of
            ``batch_size``, ms.
        throughput_rps: mu*, the instance's processing rate at this batch size,
            ``batch_size x 1000 / batch_latency_ms`` requests/s.
        reason: one line a user can read: the constraints checked and which one stopped
            the batch from growing.
    """

    batch_size: int
    wait_ms: float
    batch_latency_ms: float
    throughput_rps: float
    reason: str


def _check_profile(batch_latency_ms: Mapping[int, float]) -> list[tuple[int, float]]:
    """The profile as sorted ``(b, T_b)`` pairs, validated."""
    if not batch_latency_ms:
        raise ValueError("batch_latency_ms is empty: profile at least batch size 1")
    points: list[tuple[int, float]] = []
    for b, t in batch_latency_ms.items():
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"batch_latency_ms: batch sizes must be integers >= 1, got {b!r}")
        t = float(t)
        if not math.isfinite(t) or t <= 0:
            raise ValueError(
                f"batch_latency_ms[{b}] must be a finite latency > 0 ms, got {batch_latency_ms[b]!r}"
            )
        points.append((b, t))
    points.sort()
    if points[0][0] != 1:
        raise ValueError(
            f"batch_latency_ms has no entry for batch size 1 (profiled: "
            f"{[b for b, _ in points]}): T_1 is needed for the no-batching rate"
        )
    return points


def _interp(points: list[tuple[int, float]], b: int) -> float:
    if b < 1:
        raise ValueError(f"batch_size must be >= 1, got {b}")
    if b > points[-1][0]:
        raise ValueError(
            f"batch size {b} is beyond the largest profiled size {points[-1][0]} (no extrapolation)"
        )
    for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
        if b0 <= b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return points[0][1]  # b == 1 and only batch 1 profiled


def choose_batch(
    batch_latency_ms: Mapping[int, float],
    arrival_rate: float,
    budget_ms: float,
    max_batch: int = 32,
) -> BatchChoice:
    """MArk §4 "Batching": the largest batch size b, grown from 1, for which both
    ``W_b + T_b <= budget_ms`` and ``W_b + T_b <= b x T_1`` hold (growth stops at the
    first b that breaks either, as in MArk).

    Args:
        batch_latency_ms: profiled T_b, ``{batch size: ms to process the batch}``; must
            contain batch size 1. Sizes between profiled ones are interpolated linearly;
            b never exceeds the largest profiled size.
        arrival_rate: requests (items) per second reaching the instance, req/s (>= 0;
            at 0 no batch ever fills, so b = 1).
        budget_ms: RT_max, the response-time budget of this unit, ms (> 0).
        max_batch: the largest batch the instance may run (>= 1).

    Returns:
        :class:`BatchChoice`. When even batch 1 exceeds the budget (T_1 > budget_ms),
        batch 1 with a reason saying so (batching would only make it worse).

    Raises:
        ValueError: empty profile, no batch size 1, a latency <= 0 or not finite, a budget
            <= 0 or not finite, a negative or non-finite arrival rate, max_batch < 1.
    """
    points = _check_profile(batch_latency_ms)
    if not (math.isfinite(budget_ms) and budget_ms > 0):
        raise ValueError(f"budget_ms must be a finite time > 0 ms, got {budget_ms!r}")
    if not (math.isfinite(arrival_rate) and arrival_rate >= 0):
        raise ValueError(f"arrival_rate must be a finite rate >= 0 req/s, got {arrival_rate!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")

    t1 = points[0][1]

    def choice(b: int, t: float, reason: str) -> BatchChoice:
        w = _wait_ms(b, arrival_rate)
        return BatchChoice(b, w, t, b * 1000.0 / t, reason)

    if not _le(t1, budget_ms):
        return choice(
            1, t1, f"even batch 1 violates the budget: T_1 {t1:.4g} ms > {budget_ms:.4g} ms"
        )
    limit = min(max_batch, points[-1][0])
    b = 1
    stop = ""
    while b < limit:
        nb = b + 1
        w = _wait_ms(nb, arrival_rate)
        t = _interp(points, nb)
        total = w + t
        if not _le(total, budget_ms):
            stop = (
                f"b={nb} would break the budget: W {w:.4g} + T {t:.4g} = {total:.4g} ms > "
                f"{budget_ms:.4g} ms"
            )
            break
        if not _le(total, nb * t1):
            stop = (
                f"b={nb} would not beat no batching: W {w:.4g} + T {t:.4g} = {total:.4g} ms "
                f"> {nb} x T_1 = {nb * t1:.4g} ms"
            )
            break
        b = nb
    else:
        which = "max_batch" if limit == max_batch else "largest profiled size"
        stop = f"b={b} is the {which}"
    t = _interp(points, b)
    w = _wait_ms(b, arrival_rate)
    head = (
        f"b={b} at {arrival_rate:.4g} req/s: W {w:.4g} + T {t:.4g} = {w + t:.4g} ms <= "
        f"budget {budget_ms:.4g} ms and <= {b} x T_1 = {b * t1:.4g} ms"
    )
    return choice(b, t, f"{head}; {stop}")


def _wait_ms(b: int, rate: float) -> float:
    """W_batch = (b - 1) / lambda s, in ms (0 for b = 1; infinite at rate 0)."""
    if b <= 1:
        return 0.0
    return (b - 1) * 1000.0 / rate if rate > 0 else math.inf


def _le(x: float, bound: float) -> bool:
    return x <= bound + _REL * max(1.0, abs(bound))


#: the least saving per item, relative to batch 1, for batching to count as paying: the
#: uncertainty of a few timed runs on a shared host (docs/scaling.md: every measured time
#: carries at least 10 %)
PAYS_MARGIN = 0.10


@dataclass(frozen=True)
class BatchDecision:
    """Whether dynamic batching pays for one unit, from its measured batch latencies.

    Attributes:
        on: batching is worth it (some size saves more than the margin per item).
        batch_size: the size to batch up to (1 when off).
        delay_ms: the longest to wait for a batch to fill, ms (0 when off).
        per_item_ms: ``{b: T_b / b}``, the measured ms per item at each size.
        reason: one line naming the per-item times and why.
    """

    on: bool
    batch_size: int
    delay_ms: float
    per_item_ms: dict[int, float]
    reason: str


def decide_batching(
    batch_latency_ms: Mapping[int, float],
    budget_ms: float | None = None,
    max_batch: int = 64,
    margin: float = PAYS_MARGIN,
) -> BatchDecision:
    """Batch or not, decided by measurement: the size b (profiled, <= ``max_batch``,
    with ``T_b <= budget_ms`` when a budget is given) with the least time per item
    ``T_b / b`` (the most items/s an instance serves while it is busy); batching is on
    when that beats batch 1 by more than ``margin`` (relative), else off. When on, the
    wait for a batch to fill is at most what one more item saves by joining it,
    ``T_1 - T_b / b`` (waiting longer costs more than it can gain), and at most the time
    the budget leaves, ``budget_ms - T_b``.

    Args:
        batch_latency_ms: measured ``{batch size: ms}``, with batch size 1.
        budget_ms: the unit's share of the SLO, ms (None: no SLO: throughput only).
        max_batch: the largest size allowed (>= 1).
        margin: the least relative saving per item that counts (0 <= margin < 1).

    Raises:
        ValueError: an invalid profile (as :func:`choose_batch`), budget, max_batch or
            margin.
    """
    points = _check_profile(batch_latency_ms)
    if budget_ms is not None and not (math.isfinite(budget_ms) and budget_ms > 0):
        raise ValueError(f"budget_ms must be a finite time > 0 ms or None, got {budget_ms!r}")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}")
    t1 = points[0][1]
    per_item = {b: t / b for b, t in points if b <= max_batch}
    shown = ", ".join(f"b={b} {v:.3g}" for b, v in per_item.items())
    fits = [b for b, t in points if b <= max_batch and (budget_ms is None or _le(t, budget_ms))]
    best = min(fits, key=lambda b: (per_item[b], b)) if fits else 1
    saving = 1.0 - per_item[best] / t1
    if best > 1 and saving > margin:
        tb = dict(points)[best]
        wait = t1 - per_item[best]
        if budget_ms is not None:
            wait = min(wait, budget_ms - tb)
        wait = max(0.0, wait)
        return BatchDecision(
            True,
            best,
            wait,
            per_item,
            f"on up to b={best}: ms per item {shown}; b={best} saves {saving:.0%} per item "
            f"(> {margin:.0%}); wait at most {wait:.3g} ms",
        )
    why = (
        f"no size within the budget {budget_ms:.4g} ms beyond b=1"
        if budget_ms is not None and best == 1 and len(fits) <= 1 and len(per_item) > 1
        else f"the best, b={best}, saves {saving:.0%} per item (<= {margin:.0%})"
    )
    return BatchDecision(False, 1, 0.0, per_item, f"off: ms per item {shown}; {why}")


class WaitPolicy:
    """When an instance waits for a batch to fill (its ``max_delay_ms``), learnt from its
    own recent batches: inputs already queued are always taken (no wait); the wait
    then stops once the batch is as large as the largest of the last ``history``
    batches (under a closed loop of c clients, c: waiting for more only delays them), and
    is skipped while the last ``history`` waits caught nothing (one client at a time:
    no one else can arrive), but tried again every ``probe_every`` batches in case the
    load changed. Not thread-safe: one instance's serving loop owns it.
    """

    def __init__(self, history: int = 8, probe_every: int = 16) -> None:
        if history < 1 or probe_every < 1:
            raise ValueError(f"history and probe_every must be >= 1, got {history}, {probe_every}")
        self._sizes: collections.deque[int] = collections.deque(maxlen=history)
        self._hits: collections.deque[bool] = collections.deque(maxlen=history)
        self._probe_every = probe_every
        self._skipped = 0

    def target(self, limit: int) -> int:
        """The batch size worth waiting for (<= ``limit``): the largest recent batch, at
        least 2; ``limit`` before any batch was formed."""
        if not self._sizes:
            return limit
        return min(limit, max(2, *self._sizes))

    def should_wait(self) -> bool:
        """False while the last waits (a full history of them) caught nothing, except
        once every ``probe_every`` batches."""
        if len(self._hits) < (self._hits.maxlen or 1) or any(self._hits):
            return True
        self._skipped += 1
        if self._skipped >= self._probe_every:
            self._skipped = 0
            return True
        return False

    def waited(self, caught: int) -> None:
        """A wait caught ``caught`` inputs."""
        self._hits.append(caught > 0)

    def formed(self, size: int) -> None:
        """A batch of ``size`` inputs was formed (queued and caught)."""
        self._sizes.append(int(size))


# -- what ran: executions and items per batch size (Triton's ModelStatistics) ---------------

#: the three phases an execution is timed in, as Triton's ``InferBatchStatistics`` names
#: them: stacking the inputs, the engine call, splitting and handing the outputs on
PHASES = ("compute_input", "compute_infer", "compute_output")


@dataclass
class ExecCounts:
    """Executions of one unit, counted as Triton's ``ModelStatistics`` counts them
    (``extension_statistics.md``: ``inference_count``, ``execution_count``,
    ``batch_stats``).

    Attributes:
        executions: engine (or function) runs that succeeded; a batch of requests
            stacked into one run counts 1.
        items: the inferences those runs made: the sum of their batch sizes (a request
            whose input has batch dim 4 counts 4).
        by_size: batch size -> ``[count, compute_input ns, compute_infer ns,
            compute_output ns]``: runs of that size and their cumulative time per phase
            (:data:`PHASES`), ns.
    """

    executions: int = 0
    items: int = 0
    by_size: dict[int, list[int]] = field(default_factory=dict)

    def add(self, size: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """Count one run of ``size`` items (>= 1) that took these ns per phase.

        Raises:
            ValueError: ``size`` < 1 or a negative time.
        """
        if size < 1 or min(input_ns, infer_ns, output_ns) < 0:
            raise ValueError(
                f"an execution has size >= 1 and times >= 0 ns, got size {size}, "
                f"ns {(input_ns, infer_ns, output_ns)}"
            )
        row = self.by_size.setdefault(int(size), [0, 0, 0, 0])
        row[0] += 1
        row[1] += int(input_ns)
        row[2] += int(infer_ns)
        row[3] += int(output_ns)
        self.executions += 1
        self.items += int(size)

    def to_json(self) -> dict[str, Any]:
        """``{"executions", "items", "by_size": {"<b>": [count, in ns, infer ns, out ns]}}``
        (what an instance's ``stats`` report carries: JSON keys are strings)."""
        return {
            "executions": self.executions,
            "items": self.items,
            "by_size": {str(b): list(r) for b, r in sorted(self.by_size.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ExecCounts:
        """The inverse of :meth:`to_json`; None or ``{}`` is no execution.

        Raises:
            ValueError: a malformed report (a size < 1, a row not of 4 integers >= 0).
        """
        out = cls()
        for b, row in ((data or {}).get("by_size") or {}).items():
            vals = [int(v) for v in row]
            if int(b) < 1 or len(vals) != 4 or min(vals) < 0:
                raise ValueError(f"by_size[{b!r}] = {row!r}: want size >= 1, 4 counts >= 0")
            out.by_size[int(b)] = vals
            out.executions += vals[0]
            out.items += int(b) * vals[0]
        return out

    def plus(self, other: ExecCounts, sign: int = 1) -> ExecCounts:
        """``self + sign x other``, size by size (``sign`` -1: what was added since
        ``other``, an earlier report of the same instance)."""
        out = ExecCounts(self.executions, self.items, {b: list(r) for b, r in self.by_size.items()})
        for b, row in other.by_size.items():
            mine = out.by_size.setdefault(b, [0, 0, 0, 0])
            for i in range(4):
                mine[i] += sign * row[i]
            if not any(mine):
                del out.by_size[b]
        out.executions += sign * other.executions
        out.items += sign * other.items
        return out

    @property
    def mean_batch(self) -> float | None:
        """Items per execution (None before the first)."""
        return self.items / self.executions if self.executions else None

    def batch_stats(self) -> list[dict[str, Any]]:
        """Triton's ``batch_stats``: one entry per batch size run, in size order,
        ``{"batch_size", "compute_input", "compute_infer", "compute_output"}``, each
        phase ``{"count": runs, "ns": cumulative ns}``."""
        return [
            {
                "batch_size": b,
                **{p: {"count": r[0], "ns": r[1 + i]} for i, p in enumerate(PHASES)},
            }
            for b, r in sorted(self.by_size.items())
        ]


#: the fewest runs of a batch size whose mean time replaces the one timed at load
LIVE_MIN_RUNS = 20


def live_batch_ms(counts: ExecCounts, min_runs: int = LIVE_MIN_RUNS) -> dict[int, float]:
    """``{batch size: mean compute_infer ms}`` of the sizes a unit ran at least
    ``min_runs`` times (engine time only, as T_b timed at load is): the T_b of real
    requests on the host as it is loaded now, which replaces a profile timed once at
    load, when other processes may have been busier or quieter."""
    return {
        b: row[2] / row[0] / 1e6
        for b, row in sorted(counts.by_size.items())
        if row[0] >= min_runs and row[2] > 0
    }


#: a unit within this share of the most loaded unit's load counts as a bottleneck too
BOTTLENECK_WITHIN = 0.8


def bottlenecks(loads: Mapping[int, float | None], within: float = BOTTLENECK_WITHIN) -> set[int]:
    """The units where batching can raise a pipeline's throughput: those whose load
    (busy ms per second per instance, e.g. compute ms x items per request / instances)
    is at least ``within`` x the largest; every unit when a load is unknown (None) or
    all are 0 (nothing measured yet). Batching elsewhere only adds its wait.

    Raises:
        ValueError: ``within`` not in (0, 1], or a negative load.
    """
    if not 0 < within <= 1:
        raise ValueError(f"within must be in (0, 1], got {within!r}")
    if any(v is not None and v < 0 for v in loads.values()):
        raise ValueError(f"loads must be >= 0, got {dict(loads)}")
    known = [v for v in loads.values() if v is not None]
    if len(known) < len(loads) or not known or max(known) <= 0:
        return set(loads)
    top = max(known)
    return {k for k, v in loads.items() if v is not None and v >= within * top}


class ExecTotals:
    """Per unit, the executions of every instance it ever ran, kept across restarts and
    scale-in (an instance's report counts since its own start; what it counted is
    added here report by report, so an instance that exits takes nothing away).

    Thread-safe; keyed by whatever the caller names a unit by (the supervisor: the
    ``(pipeline, unit index)`` pair of an instance handle).
    """

    #: exited instances whose last report is kept (a report read after the exit is
    #: still a difference, never counted twice); older ones are dropped
    KEEP_GONE = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, ExecCounts] = {}
        self._gone: dict[int, None] = {}
        self._totals: dict[Any, ExecCounts] = {}

    def observe(self, key: Any, iid: int, report: Mapping[str, Any] | None) -> None:
        """Take instance ``iid``'s cumulative report (:meth:`ExecCounts.to_json`) for
        unit ``key``; a malformed one is ignored (logged by the caller's reader)."""
        new = ExecCounts.from_json(report)
        with self._lock:
            delta = new.plus(self._last.get(iid, ExecCounts()), -1)
            if delta.executions < 0:  # a counter went back: a new process, same id
                delta = new
            self._last[iid] = new
            self._totals[key] = self._totals.get(key, ExecCounts()).plus(delta)

    def forget_instance(self, iid: int) -> None:
        """Instance ``iid`` exited (its counts stay in the total): its last report is
        dropped once :data:`KEEP_GONE` later ones exited too."""
        with self._lock:
            self._gone[iid] = None
            while len(self._gone) > self.KEEP_GONE:
                old = next(iter(self._gone))
                del self._gone[old]
                self._last.pop(old, None)

    def get(self, key: Any) -> ExecCounts:
        """A copy of unit ``key``'s totals (empty when nothing ran)."""
        with self._lock:
            return ExecCounts().plus(self._totals.get(key, ExecCounts()))


def counting_unit(units: Sequence[Any]) -> Any | None:
    """The unit whose executions a pipeline's model-level counts report (one model, as
    Triton counts one model): the first unit that batches (``max_batch`` > 1), else the
    first model unit, else the first unit an instance runs (not a fan-in); None when
    there is none. ``units``: :class:`~infscaler.runtime.serving.pipeline.Unit` s."""
    served = [u for u in units if not getattr(u, "fan_in", False)]
    return next(
        (u for u in served if getattr(u, "max_batch", 1) > 1),
        next((u for u in served if u.kind == "model"), served[0] if served else None),
    )
