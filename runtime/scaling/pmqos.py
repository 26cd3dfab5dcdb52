"""A CPU wake-up latency request (Linux PM QoS, ``/dev/cpu_dma_latency``) held while
serving: while the file is held open with N µs written, cpuidle picks no state whose exit
latency exceeds N; the kernel drops it on close. Source: Linux,
``Documentation/power/pm_qos_interface.rst``; why: docs/scaling.md, "Holding the CPUs
awake"."""

from __future__ import annotations

import os
import struct

from infscaler.base.errors import InfScalerError

__all__ = [
    "CPU_LATENCY_DEVICE",
    "CpuLatencyRequest",
    "CpuLatencyUnavailable",
    "can_request",
    "check_max_us",
]

CPU_LATENCY_DEVICE = "/dev/cpu_dma_latency"


class CpuLatencyUnavailable(InfScalerError):
    """The CPU latency request cannot be made here (reason in the message)."""


def can_request(device: str = CPU_LATENCY_DEVICE) -> bool:
    """Whether this process may open ``device`` for writing (a check, not a promise)."""
    return os.access(device, os.W_OK)


def check_max_us(max_us: object) -> int:
    """``max_us`` if it is an int (not a bool) in ``[0, 2**31 - 1]`` µs.

    Raises:
        ValueError: anything else."""
    if isinstance(max_us, bool) or not isinstance(max_us, int) or not 0 <= max_us <= 2**31 - 1:
        raise ValueError(f"max_us must be an int in [0, 2**31 - 1], got {max_us!r}")
    return max_us


class CpuLatencyRequest:
    """Hold a CPU wake-up latency limit of ``max_us`` µs (0: poll only) until :meth:`close`;
    ``device``: the PM QoS device node.

    Raises:
        ValueError: ``max_us`` negative or above 2**31 - 1.
        CpuLatencyUnavailable: the device node is missing or not writable (run as root, or
            the udev rule ``systemd/70-infscaler-pmqos.rules``)."""

    def __init__(self, max_us: int, device: str = CPU_LATENCY_DEVICE) -> None:
        self._fd: int | None = None
        self.max_us = check_max_us(max_us)
        self.device = device
        try:
            self._fd = os.open(device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CpuLatencyUnavailable(
                f"cannot open {device} to limit CPU wake-up latency: {exc.strerror}",
                hint="it is root's (crw-------): run the service as root, or give its user "
                "write access with the udev rule systemd/70-infscaler-pmqos.rules (group "
                "infscaler-pmqos); or set cpu_wake_latency_us none",
            ) from None
        try:
            os.write(self._fd, struct.pack("=i", max_us))
        except OSError as exc:
            os.close(self._fd)
            self._fd = None
            raise CpuLatencyUnavailable(f"writing {device} failed: {exc.strerror}") from None

    @property
    def held(self) -> bool:
        """Whether the request is still in force."""
        return self._fd is not None

    def close(self) -> None:
        """Drop the request (idempotent): the kernel forgets it with the file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> CpuLatencyRequest:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
