"""Host telemetry: a process's memory (psutil, MB of 2**20 bytes) and, on a Jetson, the
iGPU, power, clocks, memory and temperatures from jetson-stats (``jtop``, imported
lazily); what the host lacks is left out, never invented. :class:`JetsonSampler` (one per
process) keeps one jtop client in a background thread for ``/metrics`` and ``status``.
In full: docs/scaling.md, "Host telemetry in full"."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infscaler.base.threads import NamedThread

__all__ = [
    "EnergyCounter",
    "JetsonReading",
    "JetsonSampler",
    "JetsonState",
    "ProcessMemory",
    "ProcessMemoryError",
    "is_jetson",
    "jetson_reading",
    "jetson_sampler",
    "process_memory",
]

_MB = 2**20


@dataclass(frozen=True)
class ProcessMemory:
    """One process's memory (psutil ``Process.memory_full_info``), MB.

    Attributes:
        pid: the process.
        rss_mb: resident set size: every page mapped and resident, shared ones included.
        uss_mb: unique set size: pages only this process maps (what exiting would free).
        pss_mb: proportional set size: each shared page split among its mappers (Linux
            only; None elsewhere); the figure the runtime charges an instance
            (:mod:`infscaler.runtime.scaling.monitor`).
    """

    pid: int
    rss_mb: float
    uss_mb: float
    pss_mb: float | None


class ProcessMemoryError(RuntimeError):
    """A process's memory cannot be read: it does not exist, or this user may not read it."""


def is_jetson() -> bool:
    """Whether this host is an NVIDIA Jetson (``/etc/nv_tegra_release``, or an
    ``nvidia,tegra`` device tree)."""
    if Path("/etc/nv_tegra_release").exists():
        return True
    try:
        return b"nvidia,tegra" in Path("/proc/device-tree/compatible").read_bytes()
    except OSError:
        return False


def process_memory(pid: int | None = None) -> ProcessMemory:
    """RSS, USS and PSS of a process (default: this one), MB (psutil ``memory_full_info``).

    Raises:
        ProcessMemoryError: the process does not exist, or its memory may not be read."""
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


# -- jtop as Prometheus gauges: the pure mapping, the energy counter, the sampler ----------

#: jtop's temperature of a sensor that is offline (``jtop.temperature[...]['temp']``)
JTOP_OFFLINE_C = -256.0


@dataclass(frozen=True)
class JetsonReading:
    """One jtop update in SI units, as the ``nv_gpu_*`` / ``infscaler_jetson_*`` gauges show it.

    Attributes:
        gpu_utilization: iGPU name -> load, 0-1 (jtop ``gpu[name]['status']['load']``, %).
        power_w: total board power, W (jtop ``power['tot']['power']``, mW); None without
            power monitors.
        rails_w: online rail -> power, W (jtop ``power['rail'][name]['power']``, mW).
        temperatures_c: online sensor -> °C (jtop ``temperature[name]['temp']``).
        frequencies_hz: engine -> current clock, Hz (jtop ``freq['cur']`` of each iGPU,
            ``memory['EMC']['cur']`` and the online ``engine[group][name]['cur']``, kHz).
        memory_used_bytes / memory_total_bytes: DRAM, bytes (jtop ``memory['RAM']``
            ``used`` / ``tot``, KB), shared by GPU and CPUs.
        gpu_mapped_bytes: DRAM the GPU has mapped (NvMap), bytes (``memory['RAM']['shared']``).
        power_mode: the nvpmodel mode name."""

    gpu_utilization: dict[str, float]
    power_w: float | None
    rails_w: dict[str, float]
    temperatures_c: dict[str, float]
    frequencies_hz: dict[str, float]
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    gpu_mapped_bytes: float | None
    power_mode: str | None


def _num(value: Any) -> float | None:
    """A number from jtop, or None for a missing or non-numeric one (``'OFF'``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def jetson_reading(snapshot: dict[str, Any]) -> JetsonReading:
    """Map one jtop update (its properties as plain dicts under their names: ``gpu``,
    ``power``, ``temperature``, ``memory``, ``engine``; ``nvpmodel`` the mode name) to a
    :class:`JetsonReading`; what is missing is left out. Keys and units: jetson-stats'
    ``jtop/jtop.py`` and ``jtop/core/power.py``. Pure."""
    gpus = snapshot.get("gpu") or {}
    util: dict[str, float] = {}
    freq: dict[str, float] = {}
    for name, g in gpus.items():
        load = _num(((g or {}).get("status") or {}).get("load"))
        if load is not None:
            util[str(name)] = load / 100.0
        cur = _num(((g or {}).get("freq") or {}).get("cur"))
        if cur is not None:
            freq[str(name)] = cur * 1e3
    memory = snapshot.get("memory") or {}
    emc = memory.get("EMC") or {}
    emc_cur = _num(emc.get("cur"))
    if emc_cur is not None and emc.get("online", True):
        freq["emc"] = emc_cur * 1e3
    for group in (snapshot.get("engine") or {}).values():
        for name, e in (group or {}).items():
            cur = _num((e or {}).get("cur"))
            if cur is not None and e.get("online", True):
                freq[str(name)] = cur * 1e3
    power = snapshot.get("power") or {}
    rails = {
        str(name): p / 1e3
        for name, r in (power.get("rail") or {}).items()
        if (r or {}).get("online", True) and (p := _num((r or {}).get("power"))) is not None
    }
    total = _num((power.get("tot") or {}).get("power"))
    temps = {
        str(name): c
        for name, t in (snapshot.get("temperature") or {}).items()
        if (t or {}).get("online", True)
        and (c := _num((t or {}).get("temp"))) is not None
        and c > JTOP_OFFLINE_C
    }
    ram = memory.get("RAM") or {}
    used, tot, shared = (_num(ram.get(k)) for k in ("used", "tot", "shared"))
    mode = snapshot.get("nvpmodel")
    return JetsonReading(
        gpu_utilization=util,
        power_w=None if total is None else total / 1e3,
        rails_w=rails,
        temperatures_c=temps,
        frequencies_hz=freq,
        memory_used_bytes=None if used is None else used * 1024.0,
        memory_total_bytes=None if tot is None else tot * 1024.0,
        gpu_mapped_bytes=None if shared is None else shared * 1024.0,
        power_mode=None if mode is None else str(mode),
    )


class EnergyCounter:
    """Energy, J, integrated from power readings by the trapezoid rule (as Triton's
    ``nv_energy_consumption``). The first reading, and the first after a gap over
    ``max_gap_s``, only sets the baseline; a reading at or before the previous is ignored."""

    def __init__(self, max_gap_s: float = 10.0) -> None:
        self.max_gap_s = max_gap_s
        self.joules = 0.0
        self._last: tuple[float, float] | None = None

    def add(self, t_s: float, power_w: float) -> float:
        """Integrate up to ``t_s``; returns the total, J."""
        last = self._last
        if last is not None and t_s <= last[0]:
            return self.joules
        if last is not None and t_s - last[0] <= self.max_gap_s:
            self.joules += (last[1] + power_w) / 2.0 * (t_s - last[0])
        self._last = (t_s, power_w)
        return self.joules

    def reset_baseline(self) -> None:
        """Forget the last reading (the source went away): the next one starts anew."""
        self._last = None


@dataclass(frozen=True)
class JetsonState:
    """What the jtop sampler has: ``available`` (a reading within ``stale_s``), ``reason`` why
    not ("" when available), the last ``reading``, ``energy_j`` since the start (None: no
    power yet) and the reading's ``age_s``."""

    available: bool
    reason: str
    reading: JetsonReading | None = None
    energy_j: float | None = None
    age_s: float | None = None


def _jtop_snapshot(jetson: Any) -> dict[str, Any]:
    """A started jtop client's properties as the plain dicts :func:`jetson_reading` reads."""
    nvp = jetson.nvpmodel
    return {
        "gpu": dict(jetson.gpu or {}),
        "power": jetson.power or {},
        "temperature": jetson.temperature or {},
        "memory": dict(jetson.memory or {}),
        "engine": jetson.engine or {},
        "nvpmodel": None if nvp is None else str(nvp.name),
    }


def _jtop_unavailable() -> str:
    """Why jtop cannot be read on this host, as a fixed sentence (a metrics label), or ``""``."""
    if not is_jetson():
        return (
            "not a Jetson (no L4T release file, no tegra device tree): jtop has no GPU, "
            "power or temperatures to read"
        )
    try:
        import jtop  # noqa: F401 - jetson-stats: optional, Jetson only
    except ImportError:
        return (
            "jetson-stats (jtop) is not installed: sudo pip3 install jetson-stats (it "
            "installs and starts the jtop service), then restart infscaler"
        )
    return ""


def _open_jtop(interval_s: float) -> Any:
    from jtop import jtop

    return jtop(interval=interval_s)


class JetsonSampler:
    """Reads jtop in a background thread and keeps the last reading and the energy; readers
    take only the cached :meth:`state`. Off a Jetson or without jetson-stats no thread
    starts; an unreachable jtop service is retried every ``retry_s``.

    Args:
        interval_s: jtop's update interval, s.
        stale_s: a reading older than this is not shown, s (default 5 intervals + 1).
        retry_s: the wait between attempts to reach the jtop service, s.
        opener: ``interval_s -> jtop client`` (a context manager).
        unavailable: ``() -> reason`` checked once before starting (``""``: go ahead).
        clock: monotonic seconds."""

    def __init__(
        self,
        interval_s: float = 1.0,
        *,
        stale_s: float | None = None,
        retry_s: float = 30.0,
        opener: Any = None,
        unavailable: Any = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.stale_s = stale_s if stale_s is not None else 5.0 * interval_s + 1.0
        self.retry_s = retry_s
        self._opener = opener or _open_jtop
        self._unavailable = unavailable or _jtop_unavailable
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._checked: str | None = None  # the unavailable() answer, once
        self._reason = "jtop not read yet"
        self._reading: JetsonReading | None = None
        self._at: float | None = None
        self._energy = EnergyCounter(max_gap_s=max(10.0, 3.0 * interval_s))
        self._energy_seen = False

    def start(self) -> None:
        """Start the thread where jtop can be read (idempotent; cheap when it cannot)."""
        with self._lock:
            if self._checked is None:
                self._checked = self._unavailable()
                if self._checked:
                    self._reason = self._checked
            if self._checked or self._thread is not None:
                return
            self._thread = NamedThread(target=self._run, name="isc-jtop", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread (it ends at jtop's next update)."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout_s)

    def state(self) -> JetsonState:
        """The cached state (starts the sampler on first use); never blocks on jtop."""
        self.start()
        with self._lock:
            if self._reading is None or self._at is None:
                return JetsonState(False, self._reason)
            age = self._clock() - self._at
            if age > self.stale_s:
                why = self._reason if self._reason else "no jtop update"
                return JetsonState(False, f"last jtop reading {age:.0f} s old ({why})")
            energy = self._energy.joules if self._energy_seen else None
            return JetsonState(True, "", self._reading, energy, age)

    def record(self, snapshot: dict[str, Any]) -> None:
        """Take one jtop update (what the thread does at each; public for tests)."""
        reading = jetson_reading(snapshot)
        now = self._clock()
        with self._lock:
            self._reading, self._at, self._reason = reading, now, ""
            if reading.power_w is not None:
                self._energy.add(now, reading.power_w)
                self._energy_seen = True

    def _failed(self, exc: BaseException) -> None:
        with self._lock:
            self._reason = (
                f"the jtop service is not reachable ({type(exc).__name__}): "
                "systemctl status jtop.service; sudo systemctl restart jtop.service"
            )
            self._energy.reset_baseline()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._opener(self.interval_s) as jetson:
                    while not self._stop.is_set() and jetson.ok():
                        self.record(_jtop_snapshot(jetson))
                raise RuntimeError("jtop closed its connection")
            except Exception as exc:  # noqa: BLE001 - JtopException, OS errors, bad data
                if self._stop.is_set():
                    return
                self._failed(exc)
            self._stop.wait(self.retry_s)


_SAMPLER: JetsonSampler | None = None
_SAMPLER_LOCK = threading.Lock()


def jetson_sampler() -> JetsonSampler:
    """This process's :class:`JetsonSampler` (one, shared by the metrics and the status)."""
    global _SAMPLER
    with _SAMPLER_LOCK:
        if _SAMPLER is None:
            _SAMPLER = JetsonSampler()
        return _SAMPLER
