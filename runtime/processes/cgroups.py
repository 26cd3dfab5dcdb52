"""CPU by priority with cgroup v2: one child cgroup per pipeline, ``cpu.weight`` by its rank
(:func:`~infscaler.base.levels.cpu_weight`; cgroup-v2.rst, "Weights"). Needs the ``cpu``
controller delegated to the service's cgroup (:func:`probe` says why not; the caller then
keeps to nice values). More: docs/scaling.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["CgroupCpu", "CgroupProbe", "own_cgroup_path", "probe", "unified_mount"]


@dataclass(frozen=True)
class CgroupProbe:
    """Whether per-pipeline ``cpu.weight`` can be used: ``path`` the service's own cgroup
    v2 directory (None: no cgroup v2 found), ``reason`` why not ("" when ``available``)."""

    available: bool
    path: Path | None
    reason: str = ""


def unified_mount(mounts: str) -> Path | None:
    """The mount point of the cgroup v2 hierarchy in ``mounts`` (``/proc/self/mounts``
    text: device, mount point, type, ...); None when there is none."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def own_cgroup_path(cgroup: str) -> str | None:
    """The process's cgroup v2 path from ``/proc/self/cgroup`` text (its ``0::`` line);
    None when there is none."""
    for line in cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def probe(
    mounts_file: str = "/proc/self/mounts", cgroup_file: str = "/proc/self/cgroup"
) -> CgroupProbe:
    """Whether this process can give its pipelines cgroup v2 ``cpu.weight``: a cgroup v2
    mount, the process's cgroup in it, the ``cpu`` controller there, and write access to
    the directory and its ``cgroup.subtree_control``. Reads only; creates nothing."""
    try:
        mount = unified_mount(Path(mounts_file).read_text())
        rel = own_cgroup_path(Path(cgroup_file).read_text())
    except OSError as exc:
        return CgroupProbe(False, None, f"cannot read the cgroup mounts: {exc}")
    if mount is None or rel is None:
        return CgroupProbe(False, None, "no cgroup v2 hierarchy is mounted (cgroup v1 only)")
    path = mount / rel.lstrip("/")
    try:
        controllers = (path / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return CgroupProbe(False, path, f"cannot read {path}/cgroup.controllers: {exc}")
    if "cpu" not in controllers:
        return CgroupProbe(
            False,
            path,
            f"the cpu controller is not available in cgroup v2 at {path} (controllers: "
            f"{' '.join(controllers) or 'none'}); on a hybrid host cpu is bound to cgroup "
            "v1: boot with systemd.unified_cgroup_hierarchy=1",
        )
    writable = os.access(path, os.W_OK) and os.access(path / "cgroup.subtree_control", os.W_OK)
    if not writable:
        return CgroupProbe(
            False,
            path,
            f"{path} is not writable by this process: run the service under systemd with "
            "Delegate=yes (systemd/infscaler.service)",
        )
    return CgroupProbe(True, path)


def _leaf(pipeline: str) -> str:
    """A cgroup directory name for ``pipeline`` (its name where it is safe, with a hash)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", pipeline)[:64]
    return f"pipeline-{safe}-{hashlib.sha1(pipeline.encode()).hexdigest()[:8]}"


class CgroupCpu:
    """The service's cgroup with a ``service`` leaf (the service's own process) and one
    child per pipeline whose instances it holds (I/O; not thread-safe: the supervisor
    calls it under its lock)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def open(cls, found: CgroupProbe | None = None) -> tuple[CgroupCpu | None, str]:
        """Move this process into a ``service`` leaf and enable ``+cpu`` for the children:
        ``(CgroupCpu, "")``, or ``(None, why not)``.
        """
        found = probe() if found is None else found
        if not found.available or found.path is None:
            return None, found.reason
        path = found.path
        try:
            (path / "service").mkdir(exist_ok=True)
            (path / "service" / "cgroup.procs").write_text(str(os.getpid()))
            (path / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            return None, f"cannot enable the cpu controller under {path}: {exc}"
        return cls(path), ""

    def set_weights(self, weights: dict[str, int]) -> None:
        """Give each pipeline's cgroup its ``cpu.weight`` (1..10000; created as needed);
        remove the cgroups of pipelines not in ``weights`` once they hold no process
        (``EBUSY`` meanwhile: tried again next time)."""
        for pipeline, weight in weights.items():
            if not 1 <= weight <= 10000:
                raise ValueError(f"pipeline {pipeline!r}: cpu.weight {weight} not in 1..10000")
            d = self.path / _leaf(pipeline)
            d.mkdir(exist_ok=True)
            (d / "cpu.weight").write_text(str(weight))
        keep = {_leaf(p) for p in weights} | {"service"}
        for d in self.path.iterdir():
            if d.is_dir() and d.name.startswith("pipeline-") and d.name not in keep:
                with contextlib.suppress(OSError):  # its instances are still stopping
                    d.rmdir()

    def add(self, pipeline: str, pid: int) -> str | None:
        """Move process ``pid`` (every thread, and those it starts later) into
        ``pipeline``'s cgroup (created at weight 100 if :meth:`set_weights` has not named
        it). Returns None, or why not (the process is gone, the kernel refused)."""
        d = self.path / _leaf(pipeline)
        try:
            d.mkdir(exist_ok=True)
            (d / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            return f"process {pid} not moved into {d}: {exc}"
        return None

    def weight(self, pipeline: str) -> int | None:
        """``pipeline``'s ``cpu.weight`` as the kernel has it (None: no cgroup)."""
        try:
            return int((self.path / _leaf(pipeline) / "cpu.weight").read_text())
        except (OSError, ValueError):
            return None
