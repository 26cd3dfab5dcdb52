"""Host telemetry: CPU, memory, and on a Jetson the iGPU, EMC, power mode and temperatures.

Two sources, never mixed up and never invented:

* **psutil** (https://psutil.readthedocs.io) everywhere: per-core and total CPU
  utilisation (``psutil.cpu_percent``, from ``/proc/stat``), RAM (``virtual_memory``,
  from ``/proc/meminfo``), temperatures where the kernel exposes sensors
  (``sensors_temperatures``), and per-process memory (``Process.memory_full_info``).
* **jetson-stats** (``jtop``, https://rnext.it/jetson_stats/reference/jtop.html) on a
  Jetson, imported lazily: iGPU load, the RAM the GPU maps (NvMap ``shared``), EMC
  (memory controller) bandwidth utilisation, the nvpmodel power mode, thermal zones and
  the board's total power. jtop talks to the ``jtop`` service (``jtop.service``, socket
  ``/run/jtop.sock``) that ``pip install jetson-stats`` installs.

On a Jetson with jetson-stats the record's ``source`` is ``jetson-stats``: the Jetson
fields are jtop's, the CPU and RAM figures still psutil's (jtop reads the same
``/proc`` files). Elsewhere, or when jtop is missing or fails, ``source`` is ``psutil``,
the Jetson-only fields are None and ``note`` says why.

Memory figures are MB of 2**20 bytes (psutil reports bytes, jtop KB).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcessMemory",
    "ProcessMemoryError",
    "Telemetry",
    "is_jetson",
    "process_memory",
    "read_telemetry",
]

_MB = 2**20


@dataclass(frozen=True)
class Telemetry:
    """One reading of the host (see the module docstring for the sources).

    Attributes:
        source: ``jetson-stats`` (Jetson fields from jtop) or ``psutil``.
        time: wall-clock time of the reading, s since the epoch (``time.time()``).
        cpu_percent: utilisation of all cores together, % (0-100); psutil's mean over
            ``interval_s``.
        cpu_percent_per_core: utilisation per logical CPU, % (index = CPU id; length
            ``os.cpu_count()``), psutil's over ``interval_s``.
        memory_total_mb: RAM, MB (psutil ``virtual_memory().total``).
        memory_available_mb: RAM available without swapping, MB (``MemAvailable``).
        memory_used_mb: RAM used, MB (psutil ``used``: total - free - buffers - cache).
        gpu_load_percent: iGPU load, % (jtop ``gpu[...]['status']['load']``); None off
            a Jetson.
        gpu_memory_mb: RAM mapped for the GPU, MB (jtop ``memory['RAM']['shared']``, the
            NvMap total); None off a Jetson.
        power_mode: nvpmodel mode name (jtop ``nvpmodel.name``, e.g. ``MAXN``); None off a
            Jetson or where nvpmodel is absent.
        temperatures_c: sensor name -> °C (jtop thermal zones on a Jetson, psutil
            ``sensors_temperatures`` elsewhere); None when the source has none.
        emc_percent: memory-controller (EMC) bandwidth used, % of its current frequency's
            (jtop ``memory['EMC']['val']``); None off a Jetson or when not readable.
        emc_freq_mhz: current EMC frequency, MHz (jtop ``memory['EMC']['cur']`` kHz / 1000).
        power_mw: total board power, mW (jtop ``power['tot']['power']``, INA3221 rails).
        note: why the Jetson fields are None (not a Jetson, jetson-stats missing or
            failing), or None.
    """

    source: str
    time: float
    cpu_percent: float | None
    cpu_percent_per_core: tuple[float, ...]
    memory_total_mb: float
    memory_available_mb: float | None
    memory_used_mb: float
    gpu_load_percent: float | None = None
    gpu_memory_mb: float | None = None
    power_mode: str | None = None
    temperatures_c: dict[str, float] | None = None
    emc_percent: float | None = None
    emc_freq_mhz: float | None = None
    power_mw: float | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the per-core tuple as a list)."""
        d = asdict(self)
        d["cpu_percent_per_core"] = list(self.cpu_percent_per_core)
        return d


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory (psutil ``Process.memory_full_info``), MB.

    Attributes:
        pid: the process.
        rss_mb: resident set size: every page mapped and resident, shared ones included.
        uss_mb: unique set size: pages only this process maps (what exiting would free).
        pss_mb: proportional set size: each shared page split among its mappers (Linux
            only; None elsewhere); the figure the runtime charges an instance (status,
            the scaler's memory cap, metrics, benchmarks: instances forked from the
            zygote share its pages, which no USS counts; see
            :mod:`infscaler.runtime.scaling.monitor`).
    """

    pid: int
    rss_mb: float
    uss_mb: float
    pss_mb: float | None


class ProcessMemoryError(RuntimeError):
    """A process's memory cannot be read: it does not exist (``NoSuchProcess``), or this
    user may not read its ``/proc/PID/smaps`` (``AccessDenied``: another user's process)."""


def is_jetson() -> bool:
    """Whether this host is an NVIDIA Jetson (L4T): ``/etc/nv_tegra_release`` exists or
    the device tree names an ``nvidia,tegra`` SoC."""
    if Path("/etc/nv_tegra_release").exists():
        return True
    try:
        return b"nvidia,tegra" in Path("/proc/device-tree/compatible").read_bytes()
    except OSError:
        return False


def _psutil_reading(interval_s: float) -> dict[str, Any]:
    import psutil

    per_core = psutil.cpu_percent(interval=interval_s, percpu=True)
    vm = psutil.virtual_memory()
    temps: dict[str, float] | None = None
    reader = getattr(psutil, "sensors_temperatures", None)
    if reader is not None:
        try:
            found = reader() or {}
        except (OSError, RuntimeError):
            found = {}
        temps = {}
        for chip, entries in found.items():
            for i, e in enumerate(entries):
                label = e.label or (chip if len(entries) == 1 else f"{chip}{i}")
                key = label if label not in temps else f"{chip}/{label}"
                temps[key] = float(e.current)
        temps = temps or None
    return {
        "time": time.time(),
        "cpu_percent": sum(per_core) / len(per_core) if per_core else None,
        "cpu_percent_per_core": tuple(float(p) for p in per_core),
        "memory_total_mb": vm.total / _MB,
        "memory_available_mb": vm.available / _MB,
        "memory_used_mb": vm.used / _MB,
        "temperatures_c": temps,
    }


def _jtop_fields(jetson: Any) -> dict[str, Any]:
    """The Jetson fields of a started ``jtop`` client (see :class:`Telemetry`)."""
    out: dict[str, Any] = {}
    gpus = list(jetson.gpu.values()) if jetson.gpu else []
    if gpus:
        load = gpus[0].get("status", {}).get("load")
        out["gpu_load_percent"] = None if load is None else float(load)
    memory = jetson.memory
    ram = memory.get("RAM") or {}
    if ram.get("shared") is not None:
        out["gpu_memory_mb"] = float(ram["shared"]) / 1024.0  # KB -> MB
    emc = memory.get("EMC") or {}
    if emc.get("val") is not None:
        out["emc_percent"] = float(emc["val"])
    if emc.get("cur") is not None:
        out["emc_freq_mhz"] = float(emc["cur"]) / 1000.0  # kHz -> MHz
    nvp = jetson.nvpmodel
    if nvp is not None:
        out["power_mode"] = str(nvp.name)
    temps = {
        name: float(t["temp"])
        for name, t in (jetson.temperature or {}).items()
        if t.get("online", True) and t.get("temp", -256) > -256  # jtop: -256 = offline
    }
    out["temperatures_c"] = temps or None
    power = jetson.power or {}
    total = (power.get("tot") or {}).get("power")
    if total is not None:
        out["power_mw"] = float(total)
    return out


def read_telemetry(interval_s: float = 0.1) -> Telemetry:
    """Read the host's telemetry now (see :class:`Telemetry`).

    Args:
        interval_s: the window psutil measures CPU utilisation over, s (the call blocks
            this long; 0 compares with the previous call in this process, and the first
            such call reads 0 %).

    Never raises for a missing or failing jetson-stats: the reading falls back to psutil
    and ``note`` says why.
    """
    base = _psutil_reading(interval_s)
    if not is_jetson():
        return Telemetry(
            source="psutil",
            note="not a Jetson (no /etc/nv_tegra_release): GPU, EMC and power mode not read",
            **base,
        )
    try:
        from jtop import jtop  # jetson-stats: optional, Jetson only
    except ImportError as exc:
        return Telemetry(
            source="psutil",
            note=f"jetson-stats is not installed ({exc}): pip install jetson-stats "
            "(it installs the jtop service); GPU, EMC and power mode not read",
            **base,
        )
    try:
        with jtop() as jetson:
            fields = _jtop_fields(jetson)
    except Exception as exc:  # noqa: BLE001 - jtop raises JtopException and OS errors
        return Telemetry(
            source="psutil",
            note=f"jetson-stats failed ({type(exc).__name__}: {exc}); is the jtop service "
            "running (systemctl status jtop)? GPU, EMC and power mode not read",
            **base,
        )
    temps = fields.pop("temperatures_c", None)
    base["temperatures_c"] = temps if temps is not None else base["temperatures_c"]
    return Telemetry(source="jetson-stats", **base, **fields)


def process_memory(pid: int | None = None) -> ProcessMemory:
    """RSS, USS and PSS of a process (default: this one), MB.

    psutil's ``Process.memory_full_info`` reads ``/proc/PID/smaps_rollup`` (or ``smaps``)
    for USS and PSS; reading another user's process needs root.

    Raises:
        ProcessMemoryError: the process does not exist, or its memory may not be read
            (the message says which, and the pid).
    """
    import psutil

    pid = os.getpid() if pid is None else pid
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.NoSuchProcess:
        raise ProcessMemoryError(f"process {pid} does not exist (it may have exited)") from None
    except psutil.AccessDenied:
        raise ProcessMemoryError(
            f"may not read the memory of process {pid} (another user's process: "
            "/proc/PID/smaps needs root or the same user)"
        ) from None
    pss = getattr(info, "pss", None)
    return ProcessMemory(
        pid=pid,
        rss_mb=info.rss / _MB,
        uss_mb=info.uss / _MB,
        pss_mb=None if pss is None else pss / _MB,
    )
