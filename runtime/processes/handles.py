"""What the supervisor knows of each instance process (:class:`InstanceHandle`: its
unit, stage, cores, process, state and last reports) and of each replacement waiting for
its restart backoff (:class:`PendingRestart`). :mod:`infscaler.runtime.processes.supervisor`
creates and changes them; the service, the monitor and the metrics read them.

An instance's state changes only through :meth:`InstanceHandle.move`, checked against
the one table of :mod:`infscaler.runtime.serving.states`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from infscaler.runtime.serving.pipeline import Unit
from infscaler.runtime.serving.states import INSTANCE_TRANSITIONS, InstanceState, advance

__all__ = ["InstanceHandle", "PendingRestart"]


@dataclass
class PendingRestart:
    """A replacement waiting for its backoff delay (what ``status`` shows for a slot
    with no instance).

    Attributes:
        key / unit / stage_id / next_stage / cores: what the replacement runs.
        restarts: restarts of this slot so far (the replacement's ``restarts``).
        streak: consecutive crashes (the delay's exponent).
        due: monotonic time the replacement starts. load_s: the last load time, s.
        reason: why the last instance ended.
    """

    key: tuple[str, int]
    unit: Unit
    stage_id: int
    next_stage: int
    cores: list[int]
    restarts: int
    streak: int
    due: float
    load_s: float
    reason: str
    id: int = 0
    cancelled: bool = False
    wake: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> dict[str, Any]:
        return {
            "state": "restarting",
            "engine": self.unit.engine,
            "restarts": self.restarts,
            "consecutive_crashes": self.streak,
            "restart_in_s": round(max(0.0, self.due - time.monotonic()), 3),
            "reason": self.reason,
        }


@dataclass
class InstanceHandle:
    """One instance process as the supervisor sees it.

    Attributes:
        iid: instance id (the token's ``instance`` field).
        key: ``(pipeline, unit index)`` it serves. unit: the unit.
        stage_id / next_stage: its channel stage and where it hands over.
        cores: CPU cores it is pinned to.
        state: an :class:`~infscaler.runtime.serving.states.InstanceState` (``starting``,
            ``ready``, ``stopping``, ``exited``, ``failed``); changed only by
            :meth:`move`.
        info: the ``ready`` report (engine, memory, load ms). stats: the last ``stats``.
        restarts: how many instances of this slot were restarted before this one.
        streak: consecutive crashes of this slot before this instance (backoff).
        ready_at: monotonic time it became ready (None: not yet).
    """

    iid: int
    key: tuple[str, int]
    unit: Unit
    stage_id: int
    next_stage: int
    cores: list[int]
    proc: Any  # subprocess.Popen, or zygote.ForkedProcess (the same methods)
    status_fd: int | None  # None once closed (the instance deregistered)
    pidfd: int
    state: InstanceState = InstanceState.STARTING
    info: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    restarts: int = 0
    streak: int = 0
    ready_at: float | None = None
    exit_code: int | None = None
    cmd_fd: int | None = None
    _buf: bytes = b""
    _ready: threading.Event = field(default_factory=threading.Event)

    def move(self, to: InstanceState) -> None:
        """Change :attr:`state` to ``to`` (checked against the one table:
        :func:`~infscaler.runtime.serving.states.advance`; the caller holds the supervisor's lock).

        Raises:
            IllegalTransition: the table does not allow it (a bug).
        """
        self.state = advance(
            INSTANCE_TRANSITIONS, self.state, to, f"instance {self.iid} of {self.unit.name}"
        )

    @property
    def load_s(self) -> float:
        """How long this instance took to load, s (its ``ready`` report's ``load_ms``;
        1 s until it reported)."""
        return float(self.info.get("load_ms") or 1000.0) / 1e3

    @property
    def pid(self) -> int:
        return self.proc.pid

    def describe(self) -> dict[str, Any]:
        mem = self.stats or self.info
        return {
            "instance": self.iid,
            "pid": self.pid,
            "state": self.state.value,  # a plain str in the status JSON
            "engine": self.unit.engine,
            "cores": self.cores,
            "threads": self.unit.threads,
            "rss_mb": round(float(mem.get("rss_mb", 0.0)), 1),
            "uss_mb": round(float(mem.get("uss_mb", 0.0)), 1),
            "pss_mb": round(float(mem.get("pss_mb", 0.0)), 1),
            "served": int(self.stats.get("served", 0)),
            "errors": int(self.stats.get("errors", 0)),
            "busy_ms": float(self.stats.get("busy_ms", 0.0)),
            "restarts": self.restarts,
            "load_ms": self.info.get("load_ms"),
            "error": self.error,
            # a fused unit's per-step served / errors / busy_ms (runtime.runners.FusedRunner)
            **({"steps": self.stats["steps"]} if self.stats.get("steps") else {}),
        }
