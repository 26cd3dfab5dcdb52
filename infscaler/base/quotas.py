"""Quotas per client uid of the inference socket (``SO_PEERCRED``, ``RLIMIT_NOFILE``; like
NGINX's ``limit_conn``). More: docs/security.md, "`infscaler/base/quotas.py`".
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from infscaler.base.errors import InfScalerError

__all__ = [
    "FD_RESERVE",
    "FdPlan",
    "LoadBudget",
    "PeerQuotas",
    "admit_connection",
    "plan_fds",
]

#: fds kept for the service itself whatever clients hold: instances' channels and pipes,
#: the zygote, tensor pool slabs, eBPF maps, log files, model files being read.
FD_RESERVE = 256


@dataclass(frozen=True)
class PeerQuotas:
    """Limits per client uid on the inference socket (the service's user and root are exempt).

    Attributes:
        connections_per_uid: connections open at once (503 beyond).
        operator_connections: of ``max_connections``, those only privileged peers may use.
        pending_per_uid: inference requests pending, every pipeline and protocol (503).
        operator_pending: of ``max_pending``, those only privileged peers may use.
        inflight_mb_per_uid: request bytes in flight, MB, as ``--max-inflight-mb`` (503).
        control_body_kb: largest non-inference body, KB (413).
        regions_per_uid / regions: shared memory regions per uid / for all unprivileged (429).
        variant_loads_per_min: model-less queries a minute that load or switch a variant
            (token bucket; 429 with Retry-After).
        streams_per_uid: gRPC streams open over all connections (RESOURCE_EXHAUSTED).
    """

    connections_per_uid: int = 64
    operator_connections: int = 16
    pending_per_uid: int = 256
    operator_pending: int = 64
    inflight_mb_per_uid: float = 128.0
    control_body_kb: int = 1024
    regions_per_uid: int = 64
    regions: int = 256
    variant_loads_per_min: float = 6.0
    streams_per_uid: int = 256

    def __post_init__(self) -> None:
        for name in (
            "connections_per_uid",
            "pending_per_uid",
            "regions_per_uid",
            "regions",
            "control_body_kb",
            "streams_per_uid",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InfScalerError(f"quota {name} must be an integer >= 1, got {v!r}")
        for name in ("operator_connections", "operator_pending"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InfScalerError(f"quota {name} must be an integer >= 0, got {v!r}")
        for name in ("inflight_mb_per_uid", "variant_loads_per_min"):
            v = getattr(self, name)
            if (
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or v <= 0
            ):
                raise InfScalerError(f"quota {name} must be a number > 0, got {v!r}")

    @property
    def control_body_bytes(self) -> int:
        return self.control_body_kb << 10


def admit_connection(
    privileged: bool,
    open_total: int,
    open_by_uid: int,
    max_connections: int,
    quotas: PeerQuotas,
) -> str | None:
    """None to admit a new connection, else why not (503): privileged peers may use all
    ``max_connections``, the others ``max_connections - operator_connections`` together and
    each uid ``connections_per_uid``.
    """
    if open_total >= max_connections:
        return f"too many connections (at most {max_connections}); retry"
    if privileged:
        return None
    shared = max(1, max_connections - quotas.operator_connections)
    if open_total >= shared:
        return (
            f"too many connections ({open_total} open; the last "
            f"{max_connections - shared} are kept for the operator); retry"
        )
    if open_by_uid >= quotas.connections_per_uid:
        return (
            f"too many connections from your uid ({open_by_uid} open, at most "
            f"{quotas.connections_per_uid} per user); close some or retry"
        )
    return None


@dataclass(frozen=True)
class FdPlan:
    """What :func:`plan_fds` decided: ``nofile``, the fitting ``max_connections`` / ``regions``,
    the ``reserve`` kept, and a ``warning`` ("" when nothing was lowered).
    """

    nofile: int
    max_connections: int
    regions: int
    reserve: int
    warning: str = ""


def plan_fds(
    nofile: int,
    max_connections: int,
    regions: int,
    reserve: int = FD_RESERVE,
    grpc: bool = False,
) -> FdPlan:
    """Fit the client-held fds (per HTTP connection, registered region and refused connection;
    three per gRPC connection) under ``nofile`` less ``reserve``, lowering connections then
    regions in proportion.

    Raises:
        InfScalerError: fewer than 32 fds are left for clients.
    """
    room = nofile - reserve
    if room < 32:
        raise InfScalerError(
            f"the fd limit (RLIMIT_NOFILE {nofile}) leaves {max(room, 0)} fds for clients "
            f"after the {reserve} the service keeps for itself",
            hint="raise it (LimitNOFILE= in the unit, or ulimit -n 65536)",
        )
    # a refused connection holds its fd until its 503 is written: count connections twice
    per = 2 + (3 if grpc else 0)
    need = per * max_connections + regions
    if need <= room:
        return FdPlan(nofile, max_connections, regions, reserve)
    scale = room / need
    conns = max(8, int(max_connections * scale))
    regs = max(8, min(regions, room - per * conns))
    return FdPlan(
        nofile,
        conns,
        regs,
        reserve,
        f"the fd limit {nofile} fits {conns} connections and {regs} shared memory regions "
        f"(asked for {max_connections} and {regions}, with {reserve} fds kept for the "
        "service); raise LimitNOFILE / ulimit -n for more",
    )


class LoadBudget:
    """Variant loads per uid: a thread-safe token bucket of ``per_min`` a minute (burst as many);
    privileged uids are never charged. ``clock``: monotonic seconds.
    """

    def __init__(self, per_min: float, clock=time.monotonic) -> None:
        self.per_min = float(per_min)
        self._clock = clock
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, at)
        self._lock = threading.Lock()
        self.refused = 0

    def take(self, uid: int) -> float | None:
        """Take one load for ``uid``: None when allowed, else seconds until one is."""
        now = self._clock()
        rate = self.per_min / 60.0
        with self._lock:
            tokens, at = self._buckets.get(uid, (self.per_min, now))
            tokens = min(self.per_min, tokens + (now - at) * rate)
            if tokens >= 1.0:
                self._buckets[uid] = (tokens - 1.0, now)
                return None
            self._buckets[uid] = (tokens, now)
            self.refused += 1
            if len(self._buckets) > 4096:  # uids long refilled cost nothing to forget
                full = [
                    u for u, (t, a) in self._buckets.items() if t + (now - a) * rate >= self.per_min
                ]
                for u in full:
                    del self._buckets[u]
            return (1.0 - tokens) / rate
