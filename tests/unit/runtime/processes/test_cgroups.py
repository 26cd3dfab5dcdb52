"""The cgroup v2 probe's reading of /proc/self/mounts and /proc/self/cgroup, and its
reasons when per-pipeline cpu.weight cannot be used (files written to a temporary
directory stand for /proc; nothing here touches the host's cgroups)."""

from __future__ import annotations

from pathlib import Path

from infscaler.runtime.processes.cgroups import (
    CgroupCpu,
    CgroupProbe,
    own_cgroup_path,
    probe,
    unified_mount,
)

HYBRID = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_the_unified_mount_is_the_cgroup2_line() -> None:
    assert unified_mount(HYBRID) == Path("/sys/fs/cgroup/unified")
    assert unified_mount("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n") is None
    assert unified_mount("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0") == Path("/sys/fs/cgroup")


def test_the_own_path_is_the_0_line() -> None:
    text = "1:cpu:/\n0::/system.slice/infscaler.service\n"
    assert own_cgroup_path(text) == "/system.slice/infscaler.service"
    assert own_cgroup_path("0::/\n") == "/"
    assert own_cgroup_path("4:memory:/x\n") is None


def _proc(tmp_path: Path, mounts: str, cgroup: str) -> tuple[str, str]:
    (tmp_path / "mounts").write_text(mounts)
    (tmp_path / "cgroup").write_text(cgroup)
    return str(tmp_path / "mounts"), str(tmp_path / "cgroup")


def test_no_cgroup_v2_is_reported_unavailable_with_the_reason(tmp_path: Path) -> None:
    found = probe(*_proc(tmp_path, "cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n", "1:cpu:/\n"))
    assert found == CgroupProbe(False, None, "no cgroup v2 hierarchy is mounted (cgroup v1 only)")
    assert CgroupCpu.open(found) == (None, found.reason)


def test_a_v2_without_the_cpu_controller_is_unavailable(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    (root / "svc").mkdir(parents=True)
    (root / "svc" / "cgroup.controllers").write_text("hugetlb\n")
    found = probe(*_proc(tmp_path, f"cgroup2 {root} cgroup2 rw 0 0\n", "0::/svc\n"))
    assert not found.available and found.path == root / "svc"
    assert "cpu controller is not available" in found.reason and "hugetlb" in found.reason


def test_an_unreadable_proc_is_a_reason_not_an_error(tmp_path: Path) -> None:
    found = probe(str(tmp_path / "none"), str(tmp_path / "none"))
    assert not found.available and "cannot read the cgroup mounts" in found.reason
