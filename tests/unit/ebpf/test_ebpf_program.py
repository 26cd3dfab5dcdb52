"""The BPF side without loading it: the CRC table, the limits shared with the C source, and
clear build errors. Building, loading and the object's layout are in
tests/integration/ebpf/test_ebpf_program.py."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest

from infscaler.ebpf import (
    MAX_HOPS,
    MAX_PER_HOP,
    MAX_TRACKED,
    BpfBuildError,
    build,
)

SOURCE = build.SOURCE.read_text()


def test_crc_table_is_zlibs() -> None:
    body = SOURCE.split("crc_table[256] = {", 1)[1].split("};", 1)[0]
    table = [int(x, 16) for x in re.findall(r"0x[0-9a-f]{8}", body)]
    expected = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        expected.append(c)
    assert table == expected
    # and that table computes what shm/token.py checks
    crc = 0xFFFFFFFF
    for b in b"token body":
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    assert crc ^ 0xFFFFFFFF == zlib.crc32(b"token body")


def test_limits_agree_with_the_c_source() -> None:
    for name, value in build.LIMITS.items():
        assert re.search(rf"#define {name} {value}\b", SOURCE), name
    assert build.LIMITS == {
        "TB_MAX_STAGES": MAX_HOPS,
        "TB_PER_STAGE": MAX_PER_HOP,
        "TB_MAX_TRACKED": MAX_TRACKED,
    }
    from infscaler.ebpf import sockmap

    for name, idx in sockmap.COUNTERS.items():
        assert re.search(rf"C_{name.upper()} = {idx},", SOURCE), name


def test_build_errors_are_clear(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("INFSCALER_BPF_OBJECT", raising=False)
    monkeypatch.setenv("CLANG", str(tmp_path / "missing-clang"))
    with pytest.raises(BpfBuildError, match="clang not found") as info:
        build.build_object()
    assert "apt-get install" in str(info.value)
    monkeypatch.setenv("INFSCALER_BPF_OBJECT", str(tmp_path / "nowhere.o"))
    with pytest.raises(BpfBuildError, match="does not exist"):
        build.build_object()
