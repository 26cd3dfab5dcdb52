"""Choosing the channel without loading eBPF: the fallback and its one log line when a
privilege, clang or the user's preference rules eBPF out (the probe mocked). The probe and
the load on this host are in tests/integration/ebpf/test_channel_fallback.py."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest

from infscaler.ebpf import (
    EbpfUnavailableError,
    ebpf_available,
    libbpf,
    open_channel,
)
from tests.integration.ebpf.test_channel_fallback import _records, _smoke

LOGGER = "infscaler.ebpf"


def _deny_bpf(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> None:
        raise libbpf.BpfError(
            errno.EPERM, "bpf(BPF_MAP_CREATE, SOCKMAP) failed: Operation not permitted"
        )

    monkeypatch.setattr(libbpf, "probe_sockmap", probe)


def test_missing_privilege_falls_back_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _deny_bpf(monkeypatch)
    ok, why = ebpf_available()
    assert not ok
    assert "EPERM" in why and "CAP_BPF" in why
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with open_channel("auto", "round-robin") as ch:
        assert ch.kind == "userspace"
        assert ch.policy == "round-robin"
        assert ch.reason == why
        _smoke(ch)
    recs = _records(caplog)
    assert len(recs) == 1, [r.getMessage() for r in recs]
    assert recs[0].levelno == logging.WARNING
    assert "user-space" in recs[0].getMessage() and "EPERM" in recs[0].getMessage()


def test_prefer_ebpf_raises_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _deny_bpf(monkeypatch)
    with pytest.raises(EbpfUnavailableError, match="EPERM"):
        open_channel("ebpf")


def test_forced_userspace_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with open_channel("userspace") as ch:
        assert ch.kind == "userspace" and ch.policy == "least-loaded"
        _smoke(ch)
    recs = _records(caplog)
    assert len(recs) == 1 and "forced" in recs[0].getMessage()


def test_missing_clang_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(libbpf, "probe_sockmap", lambda: None)  # as if privileged
    monkeypatch.setenv("INFSCALER_CACHE_DIR", str(tmp_path))  # nothing cached
    monkeypatch.setenv("CLANG", str(tmp_path / "no-such-clang"))
    monkeypatch.delenv("INFSCALER_BPF_OBJECT", raising=False)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    ok, why = ebpf_available()
    assert not ok
    assert "clang not found" in why or "libbpf" in why  # a host without libbpf1 fails earlier
    with open_channel("auto") as ch:
        assert ch.kind == "userspace"
    assert len(_records(caplog)) == 1
