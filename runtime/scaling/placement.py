"""Core placement: which cpu cores a new instance is pinned to, and which instance of a
unit a scale-in stops.

A unit's instances are spread over the cores: a new one goes to the cores least loaded
by its own unit's live instances, then by every live instance, ties taken in turn from a
cursor the service advances by each placement. Once every core holds an instance, a new
one floats over all of them. A scale-in stops the instance on the cores most shared with
its unit's other instances, then the youngest. Why: docs/serving.md,
"`runtime/scaling/placement.py`".

Pure functions of what the service read: the host's cpu affinity, the device profile's
cpu ``cores`` and the supervisor's instance handles (anything with ``key``, ``state``,
``cores`` and ``started``); the service pins the instances
(:meth:`infscaler.service.service.Service._cores`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["LIVE_STATES", "core_load", "pick_cores", "pinnable_cores", "scale_in_victim"]

#: the states of an instance that holds its cores (a stopped or failed one holds none)
LIVE_STATES = ("starting", "ready")

#: a unit key: (pipeline name, unit index)
Key = tuple[str, int]


def core_load(handles: Iterable[Any], key: Key | None = None) -> dict[int, tuple[int, int]]:
    """Per cpu core: ``(threads pinned there by live instances of unit key, by all live
    instances)`` (live: starting or ready).

    Args:
        handles: the instances (``state``, ``cores``: None or the cores pinned, ``key``).
        key: the unit whose own instances are counted first (None: none).
    """
    load: dict[int, list[int]] = {}
    for h in handles:
        if h.state not in LIVE_STATES:
            continue
        for c in h.cores or ():
            mine, every = load.setdefault(c, [0, 0])
            load[c] = [mine + (h.key == key), every + 1]
    return {c: (v[0], v[1]) for c, v in load.items()}


def pinnable_cores(host: Sequence[int], device: Any = None) -> list[int]:
    """The cores cpu instances may be pinned to: the device profile's cpu ``cores`` this
    host has (the last cpu accelerator that lists cores), else ``host``.

    Args:
        host: the cores this process may run on (``sorted(os.sched_getaffinity(0))``).
        device: the :class:`~infscaler.base.device.DeviceProfile` (None: this host as is).
    """
    wanted = None
    if device is not None:
        for acc in device.accelerators:
            if acc.engine == "cpu" and acc.cores:
                wanted = [c for c in acc.cores if c in host]
    return wanted or list(host)


def pick_cores(
    n: int, cores: Sequence[int], load: Mapping[int, tuple[int, int]], start: int
) -> list[int]:
    """The ``n`` of ``cores`` a new cpu instance is pinned to, sorted: all of them when
    ``n`` covers them **or when every core already holds a live instance's thread**
    (oversubscribed: the instance floats over all of them), else the least loaded
    (:func:`core_load`: by the unit's own instances, then by every instance), ties in turn
    from the cursor ``start`` (an index into ``cores``, any int). Why float: docs/serving.md,
    "`runtime/scaling/placement.py`".
    """
    if n >= len(cores) or all(load.get(c, (0, 0))[1] > 0 for c in cores):
        return sorted(cores)
    order = sorted(
        range(len(cores)),
        key=lambda i: (*load.get(cores[i], (0, 0)), (i - start) % len(cores)),
    )
    return sorted(cores[i] for i in order[:n])


def scale_in_victim(candidates: Sequence[Any], load: Mapping[int, tuple[int, int]]) -> Any:
    """Of ``candidates`` (a unit's live instances on one engine, at least one), the one a
    scale-in stops: the one whose cores the unit's instances share most (``load`` of
    that unit, :func:`core_load`), then the youngest (the latest ``started``)."""
    return max(
        candidates,
        key=lambda h: (sum(load.get(c, (0, 0))[0] for c in h.cores or ()), h.started),
    )
