"""Per-pipeline cgroup v2 cpu.weight on this host: skipped with the probe's reason where
the service could not create cgroups (no cgroup v2 cpu controller, or no write access:
run under systemd with Delegate=yes). The setup runs in a child process, so the test
runner itself is never moved between cgroups."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from infscaler.runtime.processes.cgroups import probe

CHILD = textwrap.dedent(
    """
    import subprocess, sys, time
    from infscaler.runtime.processes.cgroups import CgroupCpu
    cg, why = CgroupCpu.open()
    assert cg is not None, why
    cg.set_weights({"hi": 100, "lo": 11})
    busy = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            for _ in range(2)]
    try:
        for name, p in zip(("hi", "lo"), busy):
            assert cg.add(name, p.pid) is None
            line = open(f"/proc/{p.pid}/cgroup").read()
            assert "pipeline-" + name in line, line
        assert (cg.weight("hi"), cg.weight("lo")) == (100, 11)
        cg.set_weights({"hi": 100})  # lo removed: its cgroup goes once empty
    finally:
        for p in busy:
            p.kill()
            p.wait()
    for _ in range(50):  # the emptied cgroup goes once the kernel has reaped them
        cg.set_weights({"hi": 100})
        if cg.weight("lo") is None:
            break
        time.sleep(0.1)
    assert cg.weight("lo") is None
    print("ok")
    """
)


def test_the_probe_says_why_when_cgroups_are_unavailable() -> None:
    found = probe()
    assert found.available or found.reason  # never unavailable without a reason


def test_pipelines_get_their_cpu_weight_where_cgroups_can_be_created() -> None:
    found = probe()
    if not found.available:
        pytest.skip(f"cgroup v2 cpu.weight unavailable on this host: {found.reason}")
    r = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
