"""systemd integration: the sd_notify client (:mod:`infscaler.service.systemd`) against a fake
NOTIFY_SOCKET, the unit file ``systemd/infscaler.service`` (parsed, and checked with
``systemd-analyze verify`` when that exists), and ``infscaler serve`` under a fake
service manager (READY / WATCHDOG / STOPPING as a real one would see them).

The fake manager is what systemd does (sd_notify(3)): an AF_UNIX SOCK_DGRAM socket whose
address goes in $NOTIFY_SOCKET, a file path or an abstract name written ``@name``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import REPO_ROOT
from tests.unit.service.test_systemd import FakeManager

ROOT = REPO_ROOT
UNIT = ROOT / "systemd" / "infscaler.service"


# -- a fake service manager ---------------------------------------------------------------


@pytest.fixture
def path_manager(tmp_path: Path) -> Iterator[FakeManager]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    s.bind(str(path))
    try:
        yield FakeManager(s, str(path))
    finally:
        s.close()


# -- systemd-analyze verify -----------------------------------------------------------------

#: What verify may say about a User= / Group= this machine lacks (the unit's user exists
#: only on the device). Filtered line by line; anything else about the unit fails.
MISSING_USER = re.compile(
    r"(user|group)\W+infscaler\W.*(not found|does not exist|no such|unknown)"
    r"|(no such|unknown|failed to resolve) (user|group)\W+infscaler",
    re.IGNORECASE,
)


def _installed_entry_point() -> Path:
    for p in (ROOT / ".venv" / "bin" / "infscaler", Path(sys.executable).parent / "infscaler"):
        if p.is_file() and os.access(p, os.X_OK):
            return p
    which = shutil.which("infscaler")
    if which is None:
        pytest.skip("no installed `infscaler` entry point for ExecStart= (pip install -e .)")
    return Path(which)


def _verify(unit_text: str, tmp_path: Path) -> tuple[int, list[str], str]:
    """Run ``systemd-analyze verify`` on ``unit_text`` saved as tmp_path/infscaler.service.
    Returns the exit code, the output lines about this unit, and the whole output."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze not installed (Debian/Ubuntu: apt-get install systemd)")
    path = tmp_path / "infscaler.service"
    path.write_text(unit_text)
    proc = subprocess.run(
        [exe, "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""},
    )
    output = proc.stdout + proc.stderr
    about_unit = [line for line in output.splitlines() if "infscaler.service" in line]
    return proc.returncode, about_unit, output


def _with_exec(text: str, exe: Path) -> str:
    new, n = re.subn(r"^ExecStart=\S+", f"ExecStart={exe}", text, count=1, flags=re.M)
    assert n == 1
    return new


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """verify loads the unit as PID 1 would: unknown keys, bad values, a non-executable
    ExecStart binary are all reported. ExecStart points at this checkout's entry point
    (the unit's /opt path exists only on the device)."""
    text = _with_exec(UNIT.read_text(), _installed_entry_point())
    rc, about_unit, output = _verify(text, tmp_path)
    problems = [line for line in about_unit if not MISSING_USER.search(line)]
    assert not problems, output
    tolerated = len(about_unit) - len(problems)
    assert rc == 0 or tolerated, f"exit {rc}:\n{output}"


def test_systemd_analyze_verify_is_not_vacuous(tmp_path: Path) -> None:
    """The same check flags a broken copy (typo'd key, bad value, missing binary)."""
    text = _with_exec(UNIT.read_text(), Path("/nonexistent/bin/infscaler"))
    text = text.replace("KillMode=mixed", "KillMode=mixd\nTimeoutStopSecs=45")
    rc, about_unit, output = _verify(text, tmp_path)
    assert rc != 0, output
    joined = "\n".join(about_unit)
    assert "mixd" in joined and "TimeoutStopSecs" in joined and "/nonexistent" in joined, output


# -- infscaler serve under a fake service manager ------------------------------------------


def test_serve_speaks_sd_notify(path_manager: FakeManager, tmp_path: Path) -> None:
    """``infscaler serve`` (no pipelines, user-space channel) as ``Type=notify`` sees it:
    READY=1 with a STATUS once listening, WATCHDOG=1 pings at WATCHDOG_USEC/2 from the
    main pid, and on SIGTERM STOPPING=1 then exit 0 with the socket removed."""
    exe = _installed_entry_point()
    api = tmp_path / "api.sock"
    env = {
        **os.environ,
        "NOTIFY_SOCKET": path_manager.address,
        "WATCHDOG_USEC": "400000",  # ping every 0.2 s
        "INFSCALER_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [
            str(exe),
            "serve",
            "--socket",
            str(api),
            "--state-dir",
            str(tmp_path / "state"),
            "--control-path",
            "userspace",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        got = path_manager.recv_until("READY=1", timeout=60)
        ready = got[-1].split("\n")
        assert ready[0] == "READY=1" and ready[1].startswith("STATUS=") and str(api) in ready[1]
        assert api.exists()
        assert (api.stat().st_mode & 0o777) == 0o660
        t0 = time.monotonic()
        pings = path_manager.recv_until("WATCHDOG=1", timeout=5)
        pings += path_manager.recv_until("WATCHDOG=1", timeout=5)
        assert time.monotonic() - t0 < 2.0  # ~0.2 s apart, generous
        proc.send_signal(signal.SIGTERM)
        stopping = path_manager.recv_until("STOPPING=1", timeout=20)
        assert stopping[-1].startswith("STOPPING=1")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate(timeout=10)[0]
    assert not api.exists(), out
