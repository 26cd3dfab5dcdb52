"""The CPU wake-up latency request (runtime.pmqos): the device protocol, refusals, and
the kernel honouring it where this host lets us make it."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.runtime.scaling.pmqos import (
    CPU_LATENCY_DEVICE,
    CpuLatencyRequest,
    CpuLatencyUnavailable,
    can_request,
)
from tests import REPO_ROOT


def cpuidle_states(cpu: int = 0) -> list[dict[str, object]]:
    """cpuidle states of ``cpu`` from sysfs: ``[{"name", "latency_us", "disabled"}]``
    (empty where cpuidle is absent)."""
    root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle")
    out = []
    for d in sorted(root.glob("state*"), key=lambda p: int(p.name[5:])):
        try:
            out.append(
                {
                    "name": (d / "name").read_text().strip(),
                    "latency_us": int((d / "latency").read_text()),
                    "disabled": (d / "disable").read_text().strip() == "1",
                }
            )
        except (OSError, ValueError):
            continue
    return out


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
    assert "70-infscaler-pmqos.rules" in info.value.hint  # the shipped fix, by name


RULES = REPO_ROOT / "systemd" / "70-infscaler-pmqos.rules"


def _udev_rules(text: str) -> list[dict[str, tuple[str, str]]]:
    """Each rule line as ``{KEY: (operator, value)}`` (udev(7): comma-separated
    ``KEY op "value"`` pairs; comments and blank lines skipped)."""
    import re

    rules = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pairs = [p.strip() for p in line.split(",")]
        rule = {}
        for p in pairs:
            m = re.fullmatch(r'([A-Z_]+(?:\{[^}]*\})?)\s*(==|!=|\+=|-=|:=|=)\s*"([^"]*)"', p)
            assert m, f'not a udev KEY op "value" pair: {p!r}'
            rule[m.group(1)] = (m.group(2), m.group(3))
        rules.append(rule)
    return rules


def test_the_udev_rule_gives_only_a_dedicated_group_the_pm_qos_device():
    """systemd/70-infscaler-pmqos.rules: one rule, matching the PM QoS CPU latency node
    (a misc device), making it group-writable for infscaler-pmqos, which is not the
    socket's group (infscaler: a client must not hold the cores awake), with no access
    for others and nothing run (no RUN / PROGRAM / OWNER)."""
    from tests.unit.service.test_systemd import UNIT, one, parse_unit

    (rule,) = _udev_rules(RULES.read_text())
    assert rule["KERNEL"] == ("==", Path(CPU_LATENCY_DEVICE).name)
    assert rule["SUBSYSTEM"] == ("==", "misc")
    op, group = rule["GROUP"]
    unit = parse_unit(UNIT.read_text())
    assert op == "=" and group == "infscaler-pmqos"
    assert group not in (one(unit, "Group"), "root", "video", "users")
    assert rule["MODE"] == ("=", "0660")
    assert not {"RUN", "PROGRAM", "IMPORT", "OWNER"} & {k.split("{")[0] for k in rule}
    # the install steps in the file put the service's user (not the group) in it
    text = RULES.read_text()
    assert f"usermod -aG infscaler-pmqos {one(unit, 'User')}" in text
    assert "groupadd --system infscaler-pmqos" in text


@pytest.mark.skipif(
    not Path("/sys/class/misc/cpu_dma_latency").exists(), reason="no PM QoS misc device here"
)
def test_the_kernel_files_the_pm_qos_node_under_misc():
    """The rule's SUBSYSTEM=="misc" matches where this kernel registers the node."""
    link = Path("/sys/class/misc/cpu_dma_latency").resolve()
    assert "/misc/" in str(link)
    uevent = (link / "uevent").read_text()
    assert f"DEVNAME={Path(CPU_LATENCY_DEVICE).name}" in uevent


def _usage(deep: bool = True) -> int:
    """Entries into cpuidle states deeper than polling (``deep``) or into polling ones
    (exit latency 0), summed over the CPUs."""
    total = 0
    for cpu in range(os.cpu_count() or 1):
        root = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle")
        for d in root.glob("state*"):
            try:
                if ((d / "latency").read_text().strip() != "0") == deep:
                    total += int((d / "usage").read_text())
            except (OSError, ValueError):
                pass
    return total


def _idle_s() -> float:
    """Seconds the CPUs spent idle since boot, summed (/proc/stat)."""
    ticks = 0
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            ticks += int(line.split()[4])
    return ticks / os.sysconf("SC_CLK_TCK")


#: how long each window of the test below waits for idle CPUs, s
IDLE_WAIT_S = 30.0


def _until(pred: Callable[[], bool], timeout: float = IDLE_WAIT_S) -> bool:
    """Poll ``pred`` every 50 ms until it holds (True) or ``timeout`` s pass (False)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


CAN_HOLD = can_request()


def _current_limit_us() -> int:
    """The kernel's aggregate CPU latency limit now (us; reading the PM QoS node gives it)."""
    with open(CPU_LATENCY_DEVICE, "rb") as f:
        return struct.unpack("i", f.read(4))[0]


#: the shallowest state deeper than polling (us): a limit below it keeps every CPU polling
SHALLOWEST_DEEP_US = min(
    (s["latency_us"] for s in cpuidle_states() if s["latency_us"] > 0 and not s["disabled"]),
    default=0,
)
HAS_DEEP = any(s["latency_us"] > 0 and not s["disabled"] for s in cpuidle_states())


@pytest.mark.skipif(not CAN_HOLD, reason=f"{CPU_LATENCY_DEVICE} is not writable here (root's)")
@pytest.mark.skipif(not HAS_DEEP, reason="no cpuidle state deeper than polling on this host")
def test_the_kernel_keeps_idle_cpus_out_of_deep_states_while_held():
    # Each window lasts until CPUs have gone idle in it, up to IDLE_WAIT_S: on a busy
    # host a fixed 0.3 s could pass with no CPU idle (no deep entry without the request
    # failed the test; none while held would prove nothing). A host whose CPUs stay
    # busy that long has no idle CPU to watch: skipped, saying so.
    before, idle0, limits = _usage(), _idle_s(), [_current_limit_us()]

    def went_deep() -> bool:
        limits.append(_current_limit_us())  # the lowest any other process held meanwhile
        return _usage() > before

    time.sleep(0.3)
    if not _until(went_deep):
        idle = _idle_s() - idle0
        if idle < 0.05:
            pytest.skip(f"the CPUs were idle {idle:.2f} s in {IDLE_WAIT_S:g} s: no idle CPU")
        held_by_others = min(limits)
        if held_by_others < SHALLOWEST_DEEP_US:
            pytest.skip(
                f"another process holds a CPU latency request of {held_by_others} us "
                f"(the shallowest deep state needs {SHALLOWEST_DEEP_US} us): no window without a request"
            )
        pytest.fail(
            f"the CPUs were idle {idle:.2f} s without the request, never deeper than polling"
        )
    with CpuLatencyRequest(0):
        time.sleep(0.05)  # CPUs already asleep wake at their next event
        held0, polled0, idle0 = _usage(), _usage(deep=False), _idle_s()

        def went_idle() -> bool:
            """20 entries into polling, or 50 ms idle (a host without a polling state
            idles uncounted when held out of the others)."""
            return _usage(deep=False) - polled0 >= 20 or _idle_s() - idle0 >= 0.05

        time.sleep(0.3)
        if not _until(went_idle):
            pytest.skip(f"the CPUs hardly went idle in {IDLE_WAIT_S:g} s while held")
        held = _usage() - held0
    assert held == 0


def test_can_request_is_false_for_a_missing_node(tmp_path: Path):
    node = tmp_path / "cpu_dma_latency"
    assert can_request(str(node)) is False
    node.write_bytes(b"")
    assert can_request(str(node)) is True  # writable by this process


@pytest.mark.skipif(CAN_HOLD, reason=f"this process may write {CPU_LATENCY_DEVICE}")
@pytest.mark.skipif(not os.path.exists(CPU_LATENCY_DEVICE), reason="no PM QoS device node")
def test_without_permission_the_request_is_refused_with_the_reason():
    with pytest.raises(CpuLatencyUnavailable, match="cannot open"):
        CpuLatencyRequest(0)


def test_serve_wake_option_takes_auto_none_or_microseconds():
    from infscaler.cli.service import WAKE_DEFAULT, wake_option

    assert wake_option("auto") == "auto" and wake_option(" AUTO ") == "auto"
    assert wake_option("none") is None
    assert wake_option("0") == 0 and wake_option("20") == 20
    assert wake_option(WAKE_DEFAULT) in ("auto", None)
    for bad in ("-1", "1.5", "fast", ""):
        with pytest.raises(InfScalerError, match="--cpu-wake-latency-us takes auto, none"):
            wake_option(bad)
