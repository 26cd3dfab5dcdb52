"""What the supervisor knows of each instance process (:class:`InstanceHandle`) and of each
replacement waiting for its backoff (:class:`PendingRestart`).
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
    """A replacement waiting for its backoff delay.

    Attributes:
        key / unit / stage_id / next_stage / cores: what the replacement runs.
        restarts / streak: restarts of this slot so far / consecutive crashes.
        due: monotonic start time. load_s: the last load time, s. reason: why it ended.
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
        key: ``(pipeline, unit index)``; unit: the unit.
        stage_id / next_stage: its channel stage and where it hands over.
        cores: CPU cores it is pinned to.
        state: an :class:`~infscaler.runtime.serving.states.InstanceState`, changed only by
            :meth:`move`.
        info / stats: the ``ready`` report and the last ``stats``.
        restarts / streak: restarts before this one / consecutive crashes (backoff).
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
        """Change :attr:`state` to ``to`` (the caller holds the supervisor's lock).

        Raises:
            IllegalTransition: :func:`~infscaler.runtime.serving.states.advance` forbids it.
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
