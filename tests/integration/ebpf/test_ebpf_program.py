"""The BPF side: building tokenbus.bpf.o, the ctypes libbpf binding, the object's layout."""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
from pathlib import Path

import pytest

from infscaler.ebpf import (
    BpfBuildError,
    build,
    ebpf_available,
    libbpf,
)

SOURCE = build.SOURCE.read_text()


def _need_clang() -> None:
    if shutil.which(os.environ.get("CLANG", "clang")) is None:
        pytest.skip("clang not installed (apt-get install -y clang libbpf-dev)")


def _need_libbpf() -> None:
    try:
        libbpf.load_libbpf()
    except libbpf.BpfError as exc:
        pytest.skip(f"libbpf.so.1 not installed: {exc}")


def test_build_is_cached_by_content(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _need_clang()
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INFSCALER_BPF_OBJECT", raising=False)
    path = build.build_object()
    assert path.parent == tmp_path / "ebpf" and path.name.startswith("tokenbus-")
    assert path.read_bytes()[:4] == b"\x7fELF"
    mtime = path.stat().st_mtime_ns
    assert build.build_object() == path and path.stat().st_mtime_ns == mtime  # no rebuild
    edited = tmp_path / "tokenbus.bpf.c"
    edited.write_text(SOURCE + "\n/* edited */\n")
    monkeypatch.setattr(build, "SOURCE", edited)
    assert build.object_path() != path  # a changed source gets a new object


def test_compile_error_carries_clangs_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _need_clang()
    broken = tmp_path / "broken.bpf.c"
    broken.write_text("int oops( {\n")
    monkeypatch.setattr(build, "SOURCE", broken)
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INFSCALER_BPF_OBJECT", raising=False)
    with pytest.raises(BpfBuildError, match="clang failed") as info:
        build.build_object()
    assert "error" in str(info.value)
    assert not list((tmp_path / "ebpf").glob("*.o")), "no half-written object left behind"


def test_libbpf_binding_reports_errno(tmp_path: Path) -> None:
    _need_libbpf()
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(libbpf.BpfError) as info:
        libbpf.BpfObject(str(junk))
    assert info.value.errno
    with pytest.raises(libbpf.BpfError) as info:
        libbpf.map_update(10**6, ctypes.c_uint32(0), ctypes.c_uint64(0))
    assert info.value.errno == errno.EBADF
    assert re.fullmatch(r"\d+\.\d+", libbpf.libbpf_version())


def test_object_loads_and_matches_the_python_layout() -> None:
    ok, why = ebpf_available()
    if not ok:
        pytest.skip(f"eBPF unavailable: {why}")
    from infscaler.ebpf import sockmap

    obj = libbpf.BpfObject(str(build.build_object()))
    try:
        assert obj.program_fd(sockmap.PROGRAM) > 0
        for name in ("socks", "sock_info", "tracked", ".bss"):
            assert obj.map_fd(name) > 0
        assert obj.map_value_size(".bss") == ctypes.sizeof(sockmap._Shared)
        assert obj.map_value_size("tracked") == 32
        with pytest.raises(libbpf.BpfError):
            obj.map_fd("no_such_map")
    finally:
        obj.close()
    assert isinstance(libbpf.synchronize_rcu(), bool)
