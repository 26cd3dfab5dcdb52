"""The CPU wake-up latency request (runtime.pmqos): the device protocol, refusals, and
the kernel honouring it where this host lets us make it."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.pmqos import (
    CPU_LATENCY_DEVICE,
    CpuLatencyRequest,
    CpuLatencyUnavailable,
    cpuidle_states,
)


def test_writes_one_s32_in_microseconds_and_closes(tmp_path: Path):
    node = tmp_path / "cpu_dma_latency"
    node.write_bytes(b"")
    with CpuLatencyRequest(25, device=str(node)) as req:
        assert req.held and req.max_us == 25
    assert not req.held
    req.close()  # idempotent
    assert struct.unpack("=i", node.read_bytes()) == (25,)


@pytest.mark.parametrize("bad", [-1, 2**31, 1.5, "0", True])
def test_refuses_values_outside_s32_microseconds(tmp_path: Path, bad):
    with pytest.raises(ValueError, match="max_us"):
        CpuLatencyRequest(bad, device=str(tmp_path / "x"))


def test_a_missing_device_says_what_to_do(tmp_path: Path):
    with pytest.raises(CpuLatencyUnavailable) as info:
        CpuLatencyRequest(0, device=str(tmp_path / "absent"))
    assert "cannot open" in str(info.value) and "cpu_wake_latency_us" in info.value.hint


def _deep_usage() -> int:
    """Entries into cpuidle states deeper than polling, summed over the CPUs."""
    total = 0
    for cpu in range(os.cpu_count() or 1):
        root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle")
        for d in root.glob("state*"):
            try:
                if (d / "latency").read_text().strip() != "0":
                    total += int((d / "usage").read_text())
            except (OSError, ValueError):
                pass
    return total


CAN_HOLD = os.access(CPU_LATENCY_DEVICE, os.W_OK)
HAS_DEEP = any(s["latency_us"] > 0 and not s["disabled"] for s in cpuidle_states())


@pytest.mark.skipif(not CAN_HOLD, reason=f"{CPU_LATENCY_DEVICE} is not writable here (root's)")
@pytest.mark.skipif(not HAS_DEEP, reason="no cpuidle state deeper than polling on this host")
def test_the_kernel_keeps_idle_cpus_out_of_deep_states_while_held():
    before = _deep_usage()
    time.sleep(0.3)
    assert _deep_usage() > before  # idle CPUs sleep without the request
    with CpuLatencyRequest(0):
        time.sleep(0.05)  # CPUs already asleep wake at their next event
        held0 = _deep_usage()
        time.sleep(0.3)
        held = _deep_usage() - held0
    assert held == 0


@pytest.mark.skipif(CAN_HOLD, reason=f"this process may write {CPU_LATENCY_DEVICE}")
@pytest.mark.skipif(not os.path.exists(CPU_LATENCY_DEVICE), reason="no PM QoS device node")
def test_without_permission_the_request_is_refused_with_the_reason():
    with pytest.raises(CpuLatencyUnavailable, match="cannot open"):
        CpuLatencyRequest(0)


def test_serve_wake_option_takes_auto_none_or_microseconds():
    from infscaler.cli_service import WAKE_DEFAULT, wake_option

    assert wake_option("auto") == "auto" and wake_option(" AUTO ") == "auto"
    assert wake_option("none") is None
    assert wake_option("0") == 0 and wake_option("20") == 20
    assert wake_option(WAKE_DEFAULT) in ("auto", None)
    for bad in ("-1", "1.5", "fast", ""):
        with pytest.raises(InfScalerError, match="--cpu-wake-latency-us takes auto, none"):
            wake_option(bad)
