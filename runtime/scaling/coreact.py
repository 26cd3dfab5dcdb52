"""Applying core sets by priority (:mod:`infscaler.runtime.scaling.coresets`) to the live
instances: re-pinning lower-level instance processes off the cores of a higher-level
pipeline at risk, and back once the risk has passed for the hold time.

On with ``INFSCALER_CPU_PRIORITY=cores`` (nice values as mode ``nice``, plus the core
sets); the autoscaler calls :meth:`CoreSetKeeper.step` every tick and keeps its records
with the other decisions (actions ``core_set`` and ``core_set_release``); the service
places a new instance among :meth:`CoreSetKeeper.cores_for` its pipeline. Only
auto-scaled pipelines have a risk (their monitor's snapshot); any pipeline may be kept
off cores. Instances run as the service's user, so re-pinning needs no privilege.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from infscaler.runtime.processes.affinity import repin_process
from infscaler.runtime.scaling.arbitration import pressure_ahead
from infscaler.runtime.scaling.coresets import HOLD_S, allowed_cores, hold_risk, target_affinity

log = logging.getLogger(__name__)

__all__ = ["CoreSetKeeper", "enabled", "risk_of"]


def enabled(env: Mapping[str, str]) -> bool:
    """Whether core sets by priority are on: ``INFSCALER_CPU_PRIORITY=cores``."""
    return env.get("INFSCALER_CPU_PRIORITY", "on").lower() == "cores"


def risk_of(view: Any, calm_ratio: float = 0.8) -> str | None:
    """Why a pipeline is at risk (None: it is not, or it has no view): its last look
    counted its SLO violated, or :func:`~infscaler.runtime.scaling.arbitration.
    pressure_ahead` (``calm_ratio``: the arbitration's ``release_ratio``).

    Args:
        view: its :class:`~infscaler.runtime.scaling.arbitration.PipelineView` or None.
    """
    if view is None:
        return None
    s = view.snapshot
    if view.violated:
        p99 = "none" if s.p99_ms is None else f"{s.p99_ms:.0f} ms"
        return f"misses its SLO (P99 {p99}, SLO {s.slo_ms:.0f} ms)"
    return pressure_ahead(s, calm_ratio)


class CoreSetKeeper:
    """The core sets in force and the instances re-pinned (thread-safe).

    Args:
        on: whether it acts (:func:`enabled`); off, :meth:`step` does nothing.
        hold_s: how long a risk counts after it was last seen, s.
        repin: ``(pid, cores) -> None or why not`` (tests pass a stand-in).
    """

    def __init__(
        self,
        on: bool,
        hold_s: float = HOLD_S,
        repin: Callable[[int, Sequence[int]], str | None] = repin_process,
    ) -> None:
        self.on = on
        self.hold_s = hold_s
        self._repin = repin
        self._lock = threading.Lock()
        self._allowed: dict[str, list[int]] = {}
        self._cores: list[int] = []
        self._last: dict[str, float] = {}
        self._kept_since: dict[str, float] = {}  # pipeline -> when it was first kept off
        self._placed_in: set[int] = set()  # pids started while their pipeline was kept off
        self._applied: dict[int, list[int]] = {}  # pid -> cores it runs on now
        self.repins = 0

    def cores_for(self, pipeline: str, cores: Sequence[int]) -> list[int]:
        """The cores of ``cores`` a new instance of ``pipeline`` may be placed on: all of
        them, or those its core set keeps (where they meet; else all)."""
        with self._lock:
            kept = self._allowed.get(pipeline)
        inside = [c for c in cores if kept is None or c in kept]
        return inside or list(cores)

    def state(self) -> dict[str, Any]:
        """For ``status``: whether it is on, the hold, and the pipelines kept off cores
        (``{pipeline: cores it may use}``), with the re-pins applied so far."""
        with self._lock:
            kept = {p: a for p, a in self._allowed.items() if set(a) < set(self._cores)}
            return {"on": self.on, "hold_s": self.hold_s, "kept": kept, "repins": self.repins}

    def step(
        self,
        now: float,
        cores: Sequence[int],
        levels: Mapping[str, int],
        risk: Mapping[str, str | None],
        handles: Iterable[Any],
    ) -> list[tuple[str, dict[str, Any]]]:
        """One look: the core sets (:func:`~.coresets.allowed_cores` with the risks held
        :func:`~.coresets.hold_risk`) and every ready instance re-pinned to its
        :func:`~.coresets.target_affinity` where that changed.

        Args:
            now: monotonic s.
            cores: the cores instances may be pinned to.
            levels: every deployed pipeline's priority level.
            risk: per pipeline, why it is at risk now (None: it is not; :func:`risk_of`).
            handles: the supervisor's instance handles (``key``, ``state``, ``cores``,
                ``proc.pid``, ``started``: monotonic s; one started while its pipeline was
                kept off cores was placed among the rest, and floats over all once
                released).

        Returns:
            ``(pipeline, record)`` for each pipeline whose core set changed (actions
            ``core_set``: kept off cores, with the higher pipelines and their reasons;
            ``core_set_release``: all cores back), for the decisions.
        """
        if not self.on or not cores:
            return []
        live = [h for h in handles if str(getattr(h.state, "value", h.state)) == "ready"]
        pinned: dict[str, list[Sequence[int]]] = {}
        for h in live:
            if h.cores:
                pinned.setdefault(h.key[0], []).append(h.cores)
        with self._lock:
            flags, self._last = hold_risk(
                now, {n: risk.get(n) is not None for n in levels}, self._last, self.hold_s
            )
            allowed = allowed_cores(list(cores), levels, pinned, flags)
            old, self._allowed, self._cores = self._allowed, allowed, sorted(cores)
            for name in list(self._kept_since):
                if set(allowed.get(name, cores)) >= set(cores):
                    del self._kept_since[name]  # released, or undeployed
            for name, a in allowed.items():
                if not set(a) >= set(cores):
                    self._kept_since.setdefault(name, now)
        records = self._records(old, allowed, sorted(cores), levels, flags, risk)
        self._pin(live, allowed, sorted(cores))
        return records

    def _records(
        self,
        old: Mapping[str, list[int]],
        allowed: Mapping[str, list[int]],
        cores: list[int],
        levels: Mapping[str, int],
        flags: Mapping[str, bool],
        risk: Mapping[str, str | None],
    ) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for name, now_set in allowed.items():
            before = old.get(name, cores)
            if now_set == before:
                continue
            if now_set == cores:
                reason = f"no higher pipeline at risk for {self.hold_s:g} s"
                out.append(
                    (name, {"action": "core_set_release", "cores": now_set, "reason": reason})
                )
                continue
            higher = [n for n, lv in levels.items() if lv < levels[name] and flags.get(n)]
            why = "; ".join(f"{n}: {risk.get(n) or 'held'}" for n in higher)
            entry = {"action": "core_set", "cores": now_set, "kept_for": higher, "reason": why}
            out.append((name, entry))
        return out

    def _pin(self, live: list[Any], allowed: Mapping[str, list[int]], cores: list[int]) -> None:
        pids = set()
        for h in live:
            pid, name = h.proc.pid, h.key[0]
            pids.add(pid)
            if not h.cores or name not in allowed:
                continue
            if pid not in self._applied:
                self._applied[pid] = sorted(h.cores)
                since = self._kept_since.get(name)
                if since is not None and getattr(h, "started", since - 1.0) >= since:
                    self._placed_in.add(pid)
            want = target_affinity(h.cores, allowed[name], cores, pid in self._placed_in)
            if want == self._applied[pid]:
                continue
            why = self._repin(pid, want)
            if why is not None:
                log.warning("instance %s of %s: %s", getattr(h, "iid", "?"), name, why)
                continue
            self._applied[pid] = want
            self.repins += 1
        for gone in set(self._applied) - pids:
            self._applied.pop(gone, None)
            self._placed_in.discard(gone)
