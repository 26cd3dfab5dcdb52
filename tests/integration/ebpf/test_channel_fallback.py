"""Choosing the channel: the capability probe, the fallback and its one log line."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infscaler.ebpf import (
    Endpoint,
    build,
    ebpf_available,
    libbpf,
    open_channel,
)
from infscaler.ebpf.token import Token, TokenKind

LOGGER = "infscaler.ebpf"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]


def _smoke(ch) -> None:
    """One token through the channel."""
    prod = Endpoint(ch.add_instance(0, 10))
    cons = Endpoint(ch.add_instance(1, 1))
    prod.send(Token(TokenKind.DATA, hop=1, instance=10, request=5))
    assert cons.recv(timeout=5).request == 5


def test_unloadable_object_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        libbpf.load_libbpf()
    except libbpf.BpfError as exc:
        pytest.skip(f"needs libbpf.so.1: {exc}")
    junk = tmp_path / "junk.bpf.o"
    junk.write_bytes(b"\x7fELF not really")
    monkeypatch.setattr(libbpf, "probe_sockmap", lambda: None)
    monkeypatch.setenv("INFSCALER_BPF_OBJECT", str(junk))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with open_channel("auto") as ch:
        assert ch.kind == "userspace"
        assert "cannot load the eBPF object" in ch.reason
    recs = _records(caplog)
    assert len(recs) == 1 and recs[0].levelno == logging.WARNING
    assert "\n" not in recs[0].getMessage(), "one line, even for a multi-line reason"


def test_auto_takes_ebpf_where_it_can(caplog: pytest.LogCaptureFixture) -> None:
    ok, why = ebpf_available()
    if not ok:
        pytest.skip(f"eBPF unavailable here: {why}")
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    with open_channel("auto") as ch:
        assert ch.kind == "ebpf" and ch.reason == why
        _smoke(ch)
    recs = _records(caplog)
    assert len(recs) == 1 and recs[0].levelno == logging.INFO and "eBPF" in recs[0].getMessage()


def test_unprivileged_process_falls_back(tmp_path: Path) -> None:
    """A real missing privilege: root without CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux) to drop capabilities")
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stderr, format='%(name)s|%(levelname)s|%(message)s')\n"
        "from infscaler.ebpf import open_channel, EbpfUnavailableError\n"
        "ch = open_channel('auto'); print(ch.kind); ch.close()\n"
        "try:\n    open_channel('ebpf'); print('ebpf-opened')\n"
        "except EbpfUnavailableError as e:\n    print('refused:', str(e).splitlines()[0])\n"
    )
    cmd = [setpriv, "--bounding-set", "-bpf,-net_admin,-sys_admin", "--inh-caps", "-all", "--"]
    res = subprocess.run(
        [*cmd, sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0] == "userspace"
    assert out[1].startswith("refused:") and "EPERM" in out[1]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(LOGGER + "|")]
    assert len(lines) == 1 and "WARNING" in lines[0] and "CAP_BPF" in lines[0], res.stderr


def test_probe_agrees_with_this_process() -> None:
    ok, why = ebpf_available()
    try:
        libbpf.probe_sockmap()
        privileged = True
    except libbpf.BpfError:
        privileged = False
    if not privileged:
        assert not ok and why
    elif ok:
        assert build.object_path().is_file()


def test_missing_bpf_source_is_a_clean_fallback(monkeypatch, tmp_path):
    """An installation without the BPF source (a wheel that lacked package data) reports
    eBPF unavailable with the reason, and ``auto`` falls back to user space; it is never
    a FileNotFoundError from deep inside (issue 14: `pip install .` then `serve`)."""
    from infscaler.ebpf import build, open_channel
    from infscaler.ebpf.errors import BpfBuildError

    monkeypatch.delenv("INFSCALER_BPF_OBJECT", raising=False)
    monkeypatch.setattr(build, "SOURCE", tmp_path / "tokenbus.bpf.c")
    with pytest.raises(BpfBuildError, match="package data"):
        build.object_path()
    ch = open_channel("auto")
    try:
        assert ch.kind == "userspace"
    finally:
        ch.close()
