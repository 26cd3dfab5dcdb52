"""The Tuner: scale out when the arrival envelope exceeds what the configuration sustains.

InferLine (Crankshaw et al., SoCC '20), §5 "High-Frequency Tuning": a traffic envelope
maps each window length ``w`` to ``q(w)``, the largest number of requests that arrived
within any interval of that length (network calculus, Le Boudec and Thiran). The Tuner
compares the envelope observed with the one the configuration was planned for and
scales out as soon as any window exceeds it (Algorithm 3), before a queue builds up
and the P99 window (:func:`infscaler.runtime.scaling.scaler.decide`) shows a violation;
scale-in stays with the scaler's conservative Algorithm 4.

InferLine plans from a sample trace; here no trace is kept, so the planned envelope is
the configuration's own, from the scaler's capacity estimate
(:func:`~infscaler.runtime.scaling.scaler.pipeline_capacity_rps`, ``mu`` requests/s):

    q_planned(w) = rho x mu x w + mu x (SLO - T) / 1000

* ``rho`` (:data:`TUNER_RHO`, 0.75) is InferLine's max-provisioning ratio: the
  configuration is planned for arrival rates up to ``rho x mu`` (InferLine's ``k_m =
  r_max s_m / (mu_m rho_m)`` read backwards). It lies above the scaler's
  ``scale_in_utilisation`` (0.6, Algorithm 4's ``rho_min``), so an instance the Tuner
  adds at a rate above ``rho x mu`` is not taken back by the scale-in at that rate.
* ``mu x (SLO - T) / 1000`` (``T``: the pipeline's service time, the sum of its units'
  service times, ms) is the burst the configuration absorbs: with a rate-latency
  service curve ``mu (t - T)+`` a backlog of that many requests still drains within the
  SLO (Le Boudec and Thiran, "Network Calculus", Thm 1.4.2, the delay bound of a
  token bucket). Bursts within it cause no action.

Windows: 0.25, 0.5, 1, 2 and 5 s (:data:`WINDOWS_S`; InferLine starts at the service
time and doubles up to 60 s; the scaler's P99 window is 10 s, so longer windows would
not react sooner than it does). Like the scaler, this module is pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infscaler.runtime.scaling.queueing import _service_ms
from infscaler.runtime.scaling.scaler import _scale_out, pipeline_capacity_rps
from infscaler.runtime.scaling.types import Decision, ScalerConfig, ScalerState, Snapshot

#: Window lengths of the envelope, s (ascending).
WINDOWS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 5.0)
#: InferLine's max-provisioning ratio: the configuration is planned for ``rho x mu``.
TUNER_RHO = 0.75
#: The shortest window that counts as a sustained rate (the scale-in guard, below), s.
SUSTAINED_MIN_S = 1.0
_TIE_S = 1e-9


@dataclass(frozen=True)
class TunerVerdict:
    """What :func:`scale_out_now` decided.

    Attributes:
        decision: a ``scale_out`` (None: no action).
        reason: what was seen (the decision's reason, or why nothing is done; "" when
            the envelope is within the planned one).
        blocked: the envelope was exceeded and the device's cap refused every unit (the
            arbitration between pipelines may lend).
        exceeded: the window that triggered (the one with the largest rate), if any.
    """

    decision: Decision | None
    reason: str = ""
    blocked: bool = False
    exceeded: Exceedance | None = None


@dataclass(frozen=True)
class Exceedance:
    """One window where the observed envelope exceeds the planned one.

    Attributes:
        window_s: the window's length, s.
        observed: requests that arrived within one such window (the envelope), count.
        sustainable: what the configuration was planned for in it (may be fractional).
    """

    window_s: float
    observed: int
    sustainable: float

    @property
    def rate_rps(self) -> float:
        """The observed rate in this window, requests/s (InferLine's ``r_obs``)."""
        return self.observed / self.window_s


def envelope(
    times: Sequence[float] | np.ndarray, windows: Sequence[float] = WINDOWS_S
) -> tuple[int, ...]:
    """The arrival envelope: per window length ``w``, the most arrivals in any half-open
    interval ``[t, t + w)`` starting at an arrival (InferLine §5, Fig. 4); an arrival
    within 1 ns of the interval's end counts as beyond it (periodic arrivals at ``n``
    per window count ``n``, whatever the float rounding). O(n log n) per window.

    Args:
        times: arrival times, s (any origin; sorted here). windows: lengths, s (> 0).

    Returns:
        One count per window, in the order given (0 for no arrivals).

    Raises:
        ValueError: a window <= 0 s.
    """
    t = np.sort(np.asarray(times, dtype=float))
    out = []
    for w in windows:
        if not w > 0:
            raise ValueError(f"a window must be > 0 s, got {w}")
        if t.size == 0:
            out.append(0)
            continue
        ends = np.searchsorted(t, t + w - _TIE_S, side="left")
        out.append(int((ends - np.arange(t.size)).max()))
    return tuple(out)


def service_time_ms(snapshot: Snapshot) -> float:
    """The pipeline's service time ``T``, ms: the sum of its units' service times (a
    unit's P50, else its fastest option's latency; 0 for a unit with neither)."""
    return sum(_service_ms(u) or 0.0 for u in snapshot.units)


def planned_envelope(
    capacity_rps: float,
    slo_ms: float,
    service_ms: float,
    windows: Sequence[float] = WINDOWS_S,
    rho: float = TUNER_RHO,
) -> tuple[float, ...]:
    """What the configuration sustains within the SLO per window (module docstring):
    ``rho x mu x w + mu x max(0, SLO - T) / 1000`` requests.

    Args:
        capacity_rps: ``mu``, requests/s the current instances finish. slo_ms: the
        SLO, ms. service_ms: ``T``, ms. windows: lengths, s. rho: in (0, 1].

    Raises:
        ValueError: ``rho`` outside (0, 1] or a negative capacity.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    if not capacity_rps >= 0:
        raise ValueError(f"capacity_rps must be >= 0, got {capacity_rps}")
    burst = capacity_rps * max(0.0, slo_ms - service_ms) / 1000.0
    return tuple(rho * capacity_rps * w + burst for w in windows)


def exceedances(
    observed: Sequence[int], planned: Sequence[float], windows: Sequence[float] = WINDOWS_S
) -> list[Exceedance]:
    """The windows where ``observed`` > ``planned`` (InferLine Algorithm 3, lines 3-6)."""
    return [
        Exceedance(w, int(q), float(p))
        for w, q, p in zip(windows, observed, planned, strict=True)
        if q > p + 1e-9
    ]


def scale_out_now(
    snapshot: Snapshot,
    times: Sequence[float] | np.ndarray,
    state: ScalerState,
    config: ScalerConfig = ScalerConfig(),  # noqa: B008 (frozen: an immutable default)
    windows: Sequence[float] = WINDOWS_S,
    rho: float = TUNER_RHO,
) -> TunerVerdict:
    """Whether to scale out now, before the P99 shows it.

    ``times``: the offered requests' arrival times (s, the snapshot's clock) since the
    last change. Nothing is done within ``config.cooldown_s`` of the last scale-out, nor
    when no capacity is known. Otherwise, where the observed envelope exceeds the
    planned one at any window, the unit and engine are Algorithm 1's (the scaler's
    :func:`~infscaler.runtime.scaling.scaler.decide` order: the largest B_k / S_k the
    device's cap admits), with the scaler's guard against a unit not short of capacity
    applied at the **sustained** rate: the largest ``q(w) / w`` over windows >=
    :data:`SUSTAINED_MIN_S` (a burst seen only in the short windows, at a mean rate the
    instances serve at ``scale_in_utilisation``, would be taken back by the scale-in).

    Returns:
        A :class:`TunerVerdict`: its decision a ``scale_out`` whose reason names the
        window, the observed and sustainable counts and the rate.
    """
    now = snapshot.now
    if state.last_scale_out is not None and now - state.last_scale_out < config.cooldown_s:
        return TunerVerdict(None, "within the cooldown of the last scale-out")
    mu = pipeline_capacity_rps(snapshot)
    if mu is None or mu <= 0:
        return TunerVerdict(None, "no capacity known")
    svc = service_time_ms(snapshot)
    observed = envelope(times, windows)
    planned = planned_envelope(mu, snapshot.slo_ms, svc, windows, rho)
    over = exceedances(observed, planned, windows)
    if not over:
        return TunerVerdict(None)
    worst = max(over, key=lambda e: e.rate_rps)
    sustained = max(
        (q / w for w, q in zip(windows, observed, strict=True) if w >= SUSTAINED_MIN_S),
        default=worst.rate_rps,
    )
    seen = (
        f"arrival envelope {worst.observed} requests in {worst.window_s:g} s > "
        f"{worst.sustainable:.2f} sustainable (rho {rho:g} x capacity {mu:.3g} requests/s "
        f"x {worst.window_s:g} s + burst {mu:.3g} x (SLO {snapshot.slo_ms:g} - service "
        f"{svc:.3g} ms)); rate {worst.rate_rps:.3g} requests/s, sustained "
        f"{sustained:.3g} requests/s"
    )
    out, passed = _scale_out(snapshot, config, sustained)
    if out is None:
        why = f"{seen}; no unit to scale: {'; '.join(passed) or 'none'}"
        # blocked by the cap only where a unit short of capacity was refused (a unit
        # the scale-in would give back is not a reason to borrow from another pipeline)
        capped = any("is not short of capacity" not in p for p in passed)
        return TunerVerdict(None, why, blocked=capped, exceeded=worst)
    if out.action != "scale_out":
        return TunerVerdict(None, f"{seen}; the scaler's pick is a thread step", exceeded=worst)
    name = next((u.name for u in snapshot.units if u.index == out.unit), str(out.unit))
    reason = f"{seen}; {name} on {out.engine} (Algorithm 1's pick)"
    d = Decision("scale_out", unit=out.unit, engine=out.engine, reason=reason)
    return TunerVerdict(d, reason, exceeded=worst)
