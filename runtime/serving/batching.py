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
chosen size to the instance; nothing here starts or measures anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

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


def batch_latency_from_profile(batch_latency_ms: Mapping[int, float], batch_size: int) -> float:
    """T_b for ``batch_size`` from a profile ``{batch size: latency ms}``, ms.

    A profiled size returns its latency; between two profiled sizes the latency is
    interpolated linearly. Never extrapolates.

    Raises:
        ValueError: an invalid profile (empty, no batch size 1, latencies <= 0), a batch
            size < 1, or one above the largest profiled size.
    """
    points = _check_profile(batch_latency_ms)
    return _interp(points, batch_size)


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
