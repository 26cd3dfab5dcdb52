"""The scaler's cores rules: when more cpu threads add contention, not capacity.

With ``core_cap`` ``demand`` and the demand measured, a cpu scale-out or thread step must
fit the cores by busy share (:func:`core_refusal`); else it is refused when the cores are
saturated (:data:`SATURATED_FREE_PER_THREAD`), when the unit's own instances would pin
more threads than cores (:func:`own_cores`), or, without ``oversubscribe``, when all pinned
threads would pass the physical cores. Past the cores (:func:`beyond_cores`) a unit must
also be short of capacity to grow."""

from __future__ import annotations

from infscaler.runtime.queueing import EPS
from infscaler.runtime.scaling.demand import expected_share, fits_cores
from infscaler.runtime.scaling.types import EngineOption, ScalerConfig, Snapshot, UnitState

#: A cpu instance (or thread step) of ``t`` threads is added only while at least ``t`` x
#: this many physical cores are idle (docs/scaling.md, "The scaler's cores rules, why").
SATURATED_FREE_PER_THREAD = 0.75


def _saturated(s: Snapshot, threads: int) -> str | None:
    """Why ``threads`` more cpu threads would add no capacity (None: they would)."""
    cap = s.cap
    if threads <= 0 or not cap.physical_cores or s.cores_busy is None:
        return None
    free = cap.physical_cores - s.cores_busy
    if free >= SATURATED_FREE_PER_THREAD * threads - EPS:
        return None
    return (
        f"cores saturated: busy {s.cores_busy:.2f} of {cap.physical_cores} "
        f"(another {threads} thread(s) need {SATURATED_FREE_PER_THREAD * threads:g} idle)"
    )


def _pinned_by(u: UnitState) -> int:
    """Cpu threads pinned by ``u``'s own running instances (``threads``; where the
    thread counts are not known, its cpu instances x its fastest cpu option's cores)."""
    if u.threads:
        return sum(int(t) * int(n) for t, n in u.threads.items())
    per = max((o.cores for o in u.options if o.engine == "cpu"), default=1)
    return u.instances.get("cpu", 0) * per


def own_cores(s: Snapshot, u: UnitState, more: int) -> str | None:
    """Why ``more`` cpu threads for ``u`` would add contention, not capacity: ``u``'s own
    instances would pin more threads than the cpu has cores (None: not, or cores unknown)."""
    phys = s.cap.physical_cores
    if not phys or more <= 0:
        return None
    own = _pinned_by(u)
    if own + more <= phys:
        return None
    return f"{u.name}'s own instances would pin {own}+{more} > {phys} cores"


def _past_physical(s: Snapshot, c: ScalerConfig, more: int) -> str | None:
    """Why ``more`` pinned threads would take all instances' pinned threads past the physical
    cores (None: not, unknown, or ``oversubscribe``)."""
    phys = s.cap.physical_cores
    if not phys or more <= 0 or c.oversubscribe:
        return None
    if s.cores_used + more <= phys:
        return None
    return f"pinned threads {s.cores_used}+{more} > physical cores {phys} (oversubscribe is off)"


def beyond_cores(s: Snapshot, u: UnitState) -> str | None:
    """Why one more instance of ``u`` on its fastest engine would pin more cpu threads than
    the device has cores (None: not, not the cpu, or cores unknown)."""
    phys = s.cap.physical_cores
    if not phys or not u.options:
        return None
    o = min(u.options, key=lambda x: x.latency_ms)
    if o.engine != "cpu" or s.cores_used + o.cores <= phys:
        return None
    return f"another {o.cores}-thread cpu instance pins {s.cores_used}+{o.cores} > {phys} cores"


def core_refusal(s: Snapshot, u: UnitState, c: ScalerConfig, threads: int) -> str | None:
    """Why ``threads`` more cpu threads for ``u`` do not fit the cores (None: they do): by
    demand (:func:`~.demand.fits_cores`) with ``core_cap`` ``demand`` and the demand known,
    else :func:`_past_physical` and :func:`_saturated`."""
    why = _core_reasons(s, u, c, threads)
    return why[0] if why else None


def _core_reasons(s: Snapshot, u: UnitState, c: ScalerConfig, threads: int) -> list[str]:
    if threads <= 0:
        return []
    phys = s.cap.physical_cores
    if c.core_cap == "demand" and phys and s.cores_demand is not None:
        why = fits_cores(s.cores_demand, expected_share(u, threads), phys)
        return [] if why is None else [f"{why} ({u.name}'s share by its busy fraction)"]
    return [w for w in (_past_physical(s, c, threads), _saturated(s, threads)) if w]


def refusals(
    s: Snapshot, u: UnitState, o: EngineOption, c: ScalerConfig, blocked: str | None = None
) -> list[str]:
    """Why the cap refuses one more instance of ``u`` on ``o.engine`` ([]: admitted): engine,
    memory, slots, thread slots, :func:`own_cores`, :func:`core_refusal`, and ``blocked``."""
    cap = s.cap
    slots = cap.max_instances.get(o.engine)
    if slots is None:
        return [f"{o.engine} is not on this device"]
    why = []
    if not cap.memory_used_mb + o.memory_mb <= cap.memory_cap_mb:
        why.append(
            f"memory {cap.memory_used_mb:.6g}+{o.memory_mb:.6g} > {cap.memory_cap_mb:.6g} MB"
        )
    used = s.instances_used.get(o.engine, 0)
    if not used + 1 <= slots:
        why.append(f"{o.engine} slots {used}+1 > {slots}")
    if cap.cores and not s.cores_used + o.cores <= cap.cores:
        why.append(f"cores {s.cores_used}+{o.cores} > {cap.cores}")
    if o.engine == "cpu":
        own = own_cores(s, u, o.cores)
        why += ([own] if own else []) + _core_reasons(s, u, c, o.cores)
    if blocked is not None:
        why.append(blocked)
    return why
