"""The service's CPU wake-up setting (``cpu_wake_latency_us``) and which PM QoS CPU latency
request it holds, with what latency, and why.

The setting is µs (an int; 0: polling only), ``"auto"`` (none until the wake policy,
:mod:`infscaler.runtime.scaling.wakepolicy`, holds the CPUs awake at 0 µs; its word
applies only in the epoch it was taken in) or None. The planner plans for 0 µs under
``auto`` where the request can be made, else the limit in force. Pure functions and a
frozen state; the service makes the request (:class:`~.pmqos.CpuLatencyRequest`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from infscaler.base.errors import InfScalerError
from infscaler.runtime.scaling.pmqos import check_max_us

__all__ = [
    "AUTO",
    "WakeChange",
    "WakeSetting",
    "checked_wake_latency",
    "in_force_us",
    "planned_us",
    "policy_change",
    "wake_setting",
]

#: ``cpu_wake_latency_us`` left to the wake policy
AUTO = "auto"


def checked_wake_latency(max_us: Any) -> int | str | None:
    """``max_us`` if it is None, ``"auto"`` or a PM QoS limit the kernel takes.

    Raises:
        InfScalerError: anything else."""
    if max_us is None or max_us == AUTO:
        return max_us
    try:
        return check_max_us(max_us)
    except ValueError:
        raise InfScalerError(
            f"cpu_wake_latency_us must be an int >= 0 (microseconds), 'auto' or None, got "
            f"{max_us!r}",
            hint="0 keeps idle CPUs polling; auto holds them awake once an SLO is missed; "
            "None lets them sleep",
        ) from None


@dataclass(frozen=True)
class WakeSetting:
    """The wake-up setting and what it asks for now.

    Attributes:
        auto: ``cpu_wake_latency_us`` is ``"auto"``.
        requested_us: the limit requested now, µs (None: none).
        auto_reason: the wake policy's reason for its last decision applied.
        unavailable_reason: why the request could not be made ("": it could, or none asked)."""

    auto: bool = False
    requested_us: int | None = None
    auto_reason: str = ""
    unavailable_reason: str = ""


def wake_setting(wake: int | str | None) -> WakeSetting:
    """The setting of a checked ``cpu_wake_latency_us`` (:func:`checked_wake_latency`),
    from no request and no reasons."""
    auto = wake == AUTO
    return WakeSetting(auto=auto, requested_us=None if auto else wake)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WakeChange:
    """What the wake policy's decision does: the ``setting`` from now on, whether to ``take``
    the request ``setting.requested_us``, and whether to ``drop`` the one in force."""

    setting: WakeSetting
    take: bool = False
    drop: bool = False


def policy_change(
    setting: WakeSetting,
    hold: bool,
    reason: str,
    *,
    holding: bool,
    epoch: int | None = None,
    current_epoch: int | None = None,
) -> WakeChange | None:
    """The wake policy's decision (``hold``, ``reason``) applied to ``setting`` (``holding``: a
    request is in force now).

    Returns:
        None where it does not apply (not ``auto``, or ``epoch`` differs from
        ``current_epoch``); else the change: hold -> take 0 µs, release -> drop, hold while
        held -> only the reason."""
    if not setting.auto:
        return None
    if epoch is not None and current_epoch is not None and current_epoch != epoch:
        return None
    setting = replace(setting, auto_reason=reason)
    if hold and not holding:
        return WakeChange(replace(setting, requested_us=0, unavailable_reason=""), take=True)
    if not hold:
        return WakeChange(replace(setting, requested_us=None), drop=True)
    return WakeChange(setting)


def in_force_us(setting: WakeSetting, held: bool) -> int | None:
    """The limit in force, µs: the one requested while a request is held (None: none)."""
    return setting.requested_us if held else None


def planned_us(setting: WakeSetting, held: bool, may_request: bool) -> int | None:
    """The limit the deploy-time planner plans for, µs (None: sleeping idle CPUs): under
    ``auto``, 0 where the request can be made (``may_request``), else None; otherwise
    the one in force (:func:`in_force_us`)."""
    if setting.auto:
        return 0 if may_request else None
    return in_force_us(setting, held)
