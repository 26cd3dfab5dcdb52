"""What a killed service left in ``/dev/shm``: the pool records and stale-slab removal.

A pool unlinks its slabs when it closes, but not after SIGKILL or a power cut: the
service records each pool (:func:`record_pool`, :func:`unrecord_pool` on a clean close)
and at start unlinks the slabs of records whose process is gone
(:func:`remove_stale_pools`). Only names with our prefix and a recorded id are touched.

Sources: POSIX ``shm_unlink(3)``, ``rename(2)``; psutil ``Process.create_time``.
"""

from __future__ import annotations

import _posixshmem
import contextlib
import json
import os

import psutil

from infscaler.shm.slab import (
    SERVICE_OBJECT_SUFFIXES,
    SHM_DIR,
    PoolError,
    check_service_id,
    slab_name,
)

__all__ = ["record_pool", "remove_stale_pools", "remove_stale_slabs", "unrecord_pool"]


def remove_stale_slabs(service_id: str) -> list[str]:
    """Unlink the ``/dev/shm/isc-<service_id>-<n>`` slabs and the service's other objects
    (:data:`~infscaler.shm.slab.SERVICE_OBJECT_SUFFIXES`): what a killed manager left.

    For a supervisor restarting a crashed manager under the same service id; never call
    it while a pool with that id is alive. Linux only (lists ``/dev/shm``).

    Returns:
        the names unlinked.
    """
    prefix = slab_name(service_id, 0)[1:-1]  # "isc-<id>-"
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.listdir(SHM_DIR)):
            rest = entry[len(prefix) :]
            if entry.startswith(prefix) and (rest.isdigit() or rest in SERVICE_OBJECT_SUFFIXES):
                with contextlib.suppress(FileNotFoundError):
                    _posixshmem.shm_unlink("/" + entry)
                    removed.append("/" + entry)
    return removed


#: Where a service records its pools, under its state dir (one JSON file per pool).
POOLS_DIR = "pools"


def _process_start(pid: int) -> float | None:
    """The start time of process ``pid`` (psutil ``create_time``, s since the epoch), or
    None when no such process exists (or it cannot be read)."""
    try:
        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001 - gone, a zombie, or unreadable: treat as gone
        return None


def record_pool(state_dir: str | os.PathLike[str], service_id: str, pid: int | None = None) -> str:
    """Record atomically that process ``pid`` (default: this one) owns the slabs of
    ``service_id``: ``<state_dir>/pools/<service_id>.json`` with its pid and start time.
    Returns the path.

    Raises:
        PoolError: invalid service id; OSError: the state dir is not writable.
    """
    check_service_id(service_id)
    pid = os.getpid() if pid is None else int(pid)
    folder = os.path.join(os.fspath(state_dir), POOLS_DIR)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{service_id}.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    body = {"service_id": service_id, "pid": pid, "started": _process_start(pid)}
    with open(tmp, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def unrecord_pool(state_dir: str | os.PathLike[str], service_id: str) -> None:
    """Remove the record :func:`record_pool` wrote (after a clean close)."""
    check_service_id(service_id)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(os.fspath(state_dir), POOLS_DIR, f"{service_id}.json"))


def remove_stale_pools(state_dir: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Unlink the slabs (:func:`remove_stale_slabs`) of each record in
    ``<state_dir>/pools/`` whose process is gone (or whose pid now names a process
    started at another time) and remove the record; live ones are left alone, unreadable
    ones removed and reported under ``"?<file name>"``.

    Returns:
        ``{service_id: [slab names unlinked]}`` for every stale record found.
    """
    folder = os.path.join(os.fspath(state_dir), POOLS_DIR)
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[str, list[str]] = {}
    for name in names:
        path = os.path.join(folder, name)
        if name.endswith(".tmp"):  # a record interrupted while being written
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if not name.endswith(".json"):
            continue
        try:
            with open(path) as f:
                rec = json.load(f)
            sid = check_service_id(rec["service_id"])
            pid = int(rec["pid"])
            started = rec.get("started")
        except (OSError, ValueError, KeyError, TypeError, PoolError):
            out[f"?{name}"] = []
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        now_started = _process_start(pid)
        alive = now_started is not None and (
            started is None or abs(float(started) - now_started) < 1.0
        )
        if alive:
            continue
        out[sid] = remove_stale_slabs(sid)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return out
