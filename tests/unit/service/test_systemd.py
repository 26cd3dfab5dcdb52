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
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from infscaler.service.systemd import SystemdNotifier
from tests import REPO_ROOT

ROOT = REPO_ROOT
UNIT = ROOT / "systemd" / "infscaler.service"
ENV_FILE = ROOT / "systemd" / "infscaler.env"


# -- a fake service manager ---------------------------------------------------------------


class FakeManager:
    """The receiving end of $NOTIFY_SOCKET."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address  # as it goes in NOTIFY_SOCKET

    def env(self, **extra: str) -> dict[str, str]:
        return {"NOTIFY_SOCKET": self.address, **extra}

    def recv(self, timeout: float = 2.0) -> str:
        self.sock.settimeout(timeout)
        return self.sock.recv(65536).decode()

    def drain(self) -> list[str]:
        out = []
        self.sock.setblocking(False)
        try:
            while True:
                out.append(self.sock.recv(65536).decode())
        except BlockingIOError:
            pass
        return out

    def recv_until(self, needle: str, timeout: float) -> list[str]:
        """Messages up to and including the first that contains ``needle``."""
        deadline = time.monotonic() + timeout
        got: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {needle!r} within {timeout} s; got {got}")
            try:
                got.append(self.recv(left))
            except TimeoutError:
                continue
            if needle in got[-1]:
                return got


@pytest.fixture(params=["path", "abstract"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FakeManager]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        path = tmp_path / "notify"
        s.bind(str(path))
        address = str(path)
    else:
        name = f"infscaler-test-{uuid.uuid4().hex}"
        s.bind("\0" + name)
        address = "@" + name
    try:
        yield FakeManager(s, address)
    finally:
        s.close()


@pytest.fixture
def path_manager(tmp_path: Path) -> Iterator[FakeManager]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    s.bind(str(path))
    try:
        yield FakeManager(s, str(path))
    finally:
        s.close()


# -- the protocol ---------------------------------------------------------------------------


def test_messages_arrive_exactly_as_sent(manager: FakeManager) -> None:
    n = SystemdNotifier(manager.env())
    assert n.enabled
    assert n.ready("serving ocr on /run/infscaler/infscaler.sock") is True
    assert manager.recv() == "READY=1\nSTATUS=serving ocr on /run/infscaler/infscaler.sock"
    assert n.ready() is True
    assert manager.recv() == "READY=1"
    assert n.stopping("draining in-flight requests") is True
    assert manager.recv() == "STOPPING=1\nSTATUS=draining in-flight requests"
    assert n.stopping() is True
    assert manager.recv() == "STOPPING=1"
    assert n.watchdog() is True
    assert manager.recv() == "WATCHDOG=1"
    assert n.extend_timeout(120) is True
    assert manager.recv() == "EXTEND_TIMEOUT_USEC=120000000"
    assert n.extend_timeout(0.25) is True
    assert manager.recv() == "EXTEND_TIMEOUT_USEC=250000"
    assert n.status("deploying ocr") is True
    assert manager.recv() == "STATUS=deploying ocr"
    assert n.notify("FDSTORE=0", "ERRNO=5") is True
    assert manager.recv() == "FDSTORE=0\nERRNO=5"


def test_status_is_kept_on_one_line(path_manager: FakeManager) -> None:
    n = SystemdNotifier(path_manager.env())
    assert n.status("line one\nline two") is True
    assert path_manager.recv() == "STATUS=line one line two"
    # a raw field with a newline would smuggle in a second assignment: refused
    assert n.notify("STATUS=a\nREADY=1") is False
    assert n.notify("no-equals-sign") is False
    assert path_manager.drain() == []


def test_disabled_without_notify_socket(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="infscaler.service.systemd")
    n = SystemdNotifier({})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert n.ready("x") is False
    assert n.stopping() is False
    assert n.status("x") is False
    assert n.extend_timeout(10) is False
    assert n.watchdog() is False
    n.start_watchdog(lambda: True)  # no-op
    n.stop_watchdog()
    disabled = [r for r in caplog.records if "NOTIFY_SOCKET is not set" in r.getMessage()]
    assert len(disabled) == 1  # logged once, at debug
    assert disabled[0].levelname == "DEBUG"
    assert SystemdNotifier({"NOTIFY_SOCKET": ""}).enabled is False


def test_environ_defaults_to_os_environ(
    path_manager: FakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", path_manager.address)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    n = SystemdNotifier()
    assert n.enabled and n.ready()
    assert path_manager.recv() == "READY=1"


@pytest.mark.parametrize(
    "address",
    [
        "/nonexistent/dir/notify",  # no such path
        "@infscaler-test-nobody-listens-here",  # abstract name nobody bound
        "relative/notify",  # not an address sd_notify accepts
        "/" + "x" * 200,  # longer than sun_path
        "/bad\0path",
    ],
)
def test_unreachable_socket_returns_false(address: str) -> None:
    n = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})
    assert n.enabled
    assert n.ready("x") is False
    assert n.watchdog() is False
    assert n.extend_timeout(5) is False


def test_notify_to_a_stream_socket_returns_false(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(tmp_path / "stream"))
        s.listen(1)
        assert SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "stream")}).ready() is False


def test_bad_timeout_extension_is_refused(path_manager: FakeManager) -> None:
    n = SystemdNotifier(path_manager.env())
    assert n.extend_timeout(float("nan")) is False
    assert n.extend_timeout(-3) is True  # clamped: "no extension"
    assert path_manager.recv() == "EXTEND_TIMEOUT_USEC=0"


# -- watchdog -----------------------------------------------------------------------------


def test_watchdog_interval_is_half_watchdog_usec() -> None:
    env = {"NOTIFY_SOCKET": "/run/systemd/notify"}
    assert SystemdNotifier({**env, "WATCHDOG_USEC": "30000000"}).watchdog_interval_s == 15.0
    assert SystemdNotifier(env).watchdog_interval_s is None
    assert SystemdNotifier({**env, "WATCHDOG_USEC": "0"}).watchdog_interval_s is None
    assert SystemdNotifier({**env, "WATCHDOG_USEC": "soon"}).watchdog_interval_s is None
    mine = {**env, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier(mine).watchdog_interval_s == 1.0


def test_watchdog_pid_of_another_process_means_no_watchdog(path_manager: FakeManager) -> None:
    other = str(os.getpid() + 1)
    n = SystemdNotifier(path_manager.env(WATCHDOG_USEC="20000", WATCHDOG_PID=other))
    assert n.watchdog_interval_s is None
    assert n.watchdog() is False
    n.start_watchdog(lambda: True)
    time.sleep(0.15)
    n.stop_watchdog()
    assert path_manager.drain() == []
    # the rest of the protocol is not affected
    assert n.ready() is True
    assert path_manager.recv() == "READY=1"
    # an unparsable WATCHDOG_PID is not ours either (sd_watchdog_enabled(3): -EINVAL)
    bad = SystemdNotifier(path_manager.env(WATCHDOG_USEC="20000", WATCHDOG_PID="x"))
    assert bad.watchdog_interval_s is None and bad.watchdog() is False


def test_start_watchdog_pings_at_half_the_interval(path_manager: FakeManager) -> None:
    # WATCHDOG_USEC 0.1 s -> a ping every 0.05 s: about 16 in 0.8 s
    n = SystemdNotifier(path_manager.env(WATCHDOG_USEC="100000", WATCHDOG_PID=str(os.getpid())))
    assert n.watchdog_interval_s == pytest.approx(0.05)
    n.start_watchdog()
    try:
        first = path_manager.recv(timeout=1.0)  # the first ping goes out at once
        t0 = time.monotonic()
        time.sleep(0.8)
        pings = path_manager.drain()
        elapsed = time.monotonic() - t0
    finally:
        n.stop_watchdog()
    assert first == "WATCHDOG=1"
    assert set(pings) == {"WATCHDOG=1"}
    expected = elapsed / 0.05
    assert 0.4 * expected <= len(pings) <= 1.5 * expected + 2, (len(pings), elapsed)


def test_watchdog_stops_pinging_while_unhealthy(path_manager: FakeManager) -> None:
    n = SystemdNotifier(path_manager.env(WATCHDOG_USEC="40000"))  # ping every 20 ms
    healthy = threading.Event()
    healthy.set()
    n.start_watchdog(healthy.is_set)
    try:
        path_manager.recv(timeout=1.0)
        time.sleep(0.2)
        assert len(path_manager.drain()) >= 3
        healthy.clear()
        time.sleep(0.1)  # at most one check was already past healthy() when we cleared
        path_manager.drain()
        time.sleep(0.3)
        assert path_manager.drain() == []  # 15 intervals, no ping: systemd would restart us
        healthy.set()
        assert path_manager.recv(timeout=1.0) == "WATCHDOG=1"  # recovers before the deadline
    finally:
        n.stop_watchdog()


def test_watchdog_health_check_that_raises_counts_as_unhealthy(path_manager: FakeManager) -> None:
    def broken() -> bool:
        raise RuntimeError("manager gone")

    n = SystemdNotifier(path_manager.env(WATCHDOG_USEC="40000"))
    n.start_watchdog(broken)
    time.sleep(0.15)
    n.stop_watchdog()
    assert path_manager.drain() == []


def test_stop_watchdog_stops_the_thread(path_manager: FakeManager) -> None:
    n = SystemdNotifier(path_manager.env(WATCHDOG_USEC="40000"))
    n.start_watchdog()
    n.start_watchdog()  # replaces the first thread, does not add a second
    path_manager.recv(timeout=1.0)
    assert sum(t.name == "isc-watchdog" for t in threading.enumerate()) == 1
    n.stop_watchdog()
    n.stop_watchdog()  # idempotent
    assert not any(t.name == "isc-watchdog" for t in threading.enumerate())
    path_manager.drain()
    time.sleep(0.1)
    assert path_manager.drain() == []


# -- the unit file --------------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, list[tuple[str, str]]]:
    """systemd.syntax(7): sections, ``Key=value`` (a key may repeat), ``#`` / ``;``
    comments, a trailing backslash joins the next line (comment lines in between are
    skipped)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if pending:
            if line.startswith(("#", ";")):
                continue
            line = pending + " " + line
            pending = ""
        elif not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"assignment outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not Key=value: {line!r}"
        current.append((key.strip(), value.strip()))
    assert not pending, "unit ends in a continuation"
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, list[tuple[str, str]]]:
    return parse_unit(UNIT.read_text())


def values(unit: dict[str, list[tuple[str, str]]], key: str, section: str = "Service") -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], key: str, section: str = "Service") -> str:
    vs = values(unit, key, section)
    assert len(vs) == 1, f"{section}/{key}: {vs}"
    return vs[0]


def words(unit: dict[str, list[tuple[str, str]]], key: str) -> set[str]:
    return {w for v in values(unit, key) for w in v.split()}


def seconds(span: str) -> float:
    m = re.fullmatch(r"(\d+)\s*(s|min)?", span)
    assert m, f"unsupported time span in test: {span!r}"
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def test_unit_is_type_notify_with_watchdog(unit) -> None:
    assert one(unit, "Type") == "notify"
    assert one(unit, "NotifyAccess") == "main"
    assert seconds(one(unit, "WatchdogSec")) > 0
    assert one(unit, "Restart") == "on-failure"
    assert one(unit, "KillSignal") == "SIGTERM"
    assert "multi-user.target" in one(unit, "WantedBy", "Install")


def test_unit_execstart(unit) -> None:
    argv = one(unit, "ExecStart").split()
    assert argv[0].startswith("/") and argv[0].endswith("/infscaler")
    assert argv[1] == "serve"
    joined = " ".join(argv)
    assert "--socket %t/infscaler/infscaler.sock" in joined
    assert "--state-dir %S/infscaler" in joined
    assert "--device=${INFSCALER_DEVICE}" in argv
    assert "$INFSCALER_PIPELINES" in argv  # unbraced: split into zero or more arguments
    # the stop timeout covers the drain
    drain = float(argv[argv.index("--drain-timeout") + 1])
    assert seconds(one(unit, "TimeoutStopSec")) >= drain + 10


def test_unit_environment_file_matches_the_example(unit) -> None:
    assert one(unit, "EnvironmentFile") == "-/etc/infscaler/infscaler.env"
    example = {
        line.split("=", 1)[0]
        for line in ENV_FILE.read_text().splitlines()
        if line and not line.startswith("#")
    }
    used = set(re.findall(r"\$\{?(INFSCALER_[A-Z_]+)", one(unit, "ExecStart")))
    assert used <= example, used - example
    defaults = {w.split("=", 1)[0] for w in words(unit, "Environment")}
    assert used <= defaults, "each variable ExecStart uses has a default in Environment="


def test_unit_directories_user_and_umask(unit) -> None:
    assert one(unit, "RuntimeDirectory") == "infscaler"
    assert one(unit, "RuntimeDirectoryMode") == "0750"
    assert one(unit, "StateDirectory") == "infscaler"
    # clients share the group (for the socket) but must not reach plans / engine caches
    assert one(unit, "StateDirectoryMode") == "0700"
    assert one(unit, "CacheDirectoryMode") == "0700"
    assert one(unit, "User") == "infscaler"
    assert one(unit, "Group") == "infscaler"
    assert not values(unit, "DynamicUser")
    assert one(unit, "UMask") == "0007"


def test_unit_capabilities(unit) -> None:
    caps = {"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"}
    ambient, bounding = words(unit, "AmbientCapabilities"), words(unit, "CapabilityBoundingSet")
    assert caps <= ambient
    assert caps <= bounding
    assert ambient <= bounding, "an ambient capability outside the bounding set is dropped"
    assert not any(w.startswith("~") for w in bounding)
    assert one(unit, "LimitMEMLOCK") == "infinity"
    # the unprivileged service may lower its instances' nice values back to 0
    assert one(unit, "LimitNICE") == "+0"


def test_unit_hardening_leaves_what_the_service_needs(unit) -> None:
    for key in (
        "NoNewPrivileges",
        "PrivateTmp",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "LockPersonality",
        "RemoveIPC",
    ):
        assert one(unit, key) == "yes", key
    assert one(unit, "ProtectSystem") == "strict"
    assert one(unit, "ProtectHome") in ("yes", "true", "tmpfs", "read-only")
    assert words(unit, "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert one(unit, "RestrictNamespaces") == "yes"
    assert {"@system-service", "bpf"} <= words(unit, "SystemCallFilter")
    assert one(unit, "SystemCallArchitectures") == "native"
    # the Jetson iGPU / DLA device nodes must stay reachable
    assert values(unit, "PrivateDevices") in ([], ["no"])
    assert not values(unit, "DeviceAllow")
    assert not values(unit, "ProtectClock")  # implies DeviceAllow=char-rtc r
    assert not values(unit, "MemoryDenyWriteExecute")
    assert not values(unit, "PrivateNetwork")
