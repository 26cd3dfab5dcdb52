"""systemd's ``sd_notify`` protocol, implemented directly (no libsystemd).

Sources: sd_notify(3), sd_watchdog_enabled(3), systemd.service(5), systemd.exec(5).
More: docs/systemd.md, "`infscaler/service/systemd.py`".
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
from collections.abc import Callable, Mapping

from infscaler.base.threads import NamedThread

log = logging.getLogger("infscaler.service.systemd")

#: Seconds a blocked send may wait (the manager's queue full) before it counts as failed.
SEND_TIMEOUT_S = 1.0


def _parse_positive_int(value: str | None) -> int | None:
    if not value:
        return None
    try:
        n = int(value, 10)
    except ValueError:
        return None
    return n if n > 0 else None


def _one_line(text: str) -> str:
    """``STATUS=`` and friends are one field each: a newline would end the field."""
    return " ".join(text.splitlines())


class SystemdNotifier:
    """Sends service state to systemd (sd_notify(3)); every method is a no-op returning
    False when not run under a ``Type=notify`` unit, and none ever raises.

    Args:
        environ: where to read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID``
            (default :data:`os.environ`), once.

    Attributes:
        enabled: ``NOTIFY_SOCKET`` is set (non-empty).
        watchdog_interval_s: ``WATCHDOG_USEC`` / 2 in seconds, or None when no watchdog is
            asked for this process (sd_watchdog_enabled(3)).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = env.get("NOTIFY_SOCKET") or ""
        self.enabled: bool = bool(self._address)
        self._watchdog_usec = _parse_positive_int(env.get("WATCHDOG_USEC"))
        self._watchdog_pid_set = bool(env.get("WATCHDOG_PID"))
        self._watchdog_pid = _parse_positive_int(env.get("WATCHDOG_PID"))
        self._logged_disabled = False
        self._lock = threading.Lock()
        self._wd_thread: threading.Thread | None = None
        self._wd_stop: threading.Event | None = None

    def __repr__(self) -> str:
        return (
            f"SystemdNotifier(enabled={self.enabled}, address={self._address!r}, "
            f"watchdog_interval_s={self.watchdog_interval_s})"
        )

    # -- watchdog parameters ------------------------------------------------------------

    @property
    def watchdog_interval_s(self) -> float | None:
        """``WATCHDOG_USEC`` / 2 in seconds, or None (see the class docstring). Checked
        against the current pid, so a forked child never pings on its parent's behalf."""
        if self._watchdog_usec is None or not self._watchdog_for_us():
            return None
        return self._watchdog_usec / 2 / 1e6

    def _watchdog_for_us(self) -> bool:
        if not self._watchdog_pid_set:
            return True
        return self._watchdog_pid == os.getpid()

    # -- the protocol --------------------------------------------------------------------

    def _sockaddr(self) -> str | None:
        addr = self._address
        if addr.startswith("@"):
            return "\0" + addr[1:]
        if addr.startswith("/"):
            return addr
        return None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` (each ``KEY=VALUE``) as one datagram, joined by newlines. Returns
        whether it was sent (False, logged at debug: not under systemd, a malformed field, an
        unsupported address, a failed send)."""
        if not self.enabled:
            if not self._logged_disabled:
                self._logged_disabled = True
                log.debug("sd_notify disabled: NOTIFY_SOCKET is not set")
            return False
        if not fields:
            log.debug("sd_notify: nothing to send")
            return False
        for f in fields:
            if not isinstance(f, str) or "=" not in f or "\n" in f:
                log.debug("sd_notify: malformed field %r (want one-line KEY=VALUE)", f)
                return False
        addr = self._sockaddr()
        if addr is None:
            log.debug("sd_notify: unsupported NOTIFY_SOCKET address %r", self._address)
            return False
        data = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.settimeout(SEND_TIMEOUT_S)
                s.connect(addr)
                s.sendall(data)
        except (OSError, ValueError) as exc:  # ValueError: embedded NUL in a path
            log.debug("sd_notify to %r failed: %s", self._address, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1`` (start-up finished, or a reload done), with ``STATUS=`` if given."""
        fields = ["READY=1"]
        if status is not None:
            fields.append(f"STATUS={_one_line(status)}")
        return self.notify(*fields)

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: shutdown begins (from here on the stop timeout applies)."""
        fields = ["STOPPING=1"]
        if status is not None:
            fields.append(f"STATUS={_one_line(status)}")
        return self.notify(*fields)

    def status(self, text: str) -> bool:
        """``STATUS=text`` (one line; newlines become spaces), shown by ``systemctl status``."""
        return self.notify(f"STATUS={_one_line(text)}")

    def extend_timeout(self, seconds: float) -> bool:
        """``EXTEND_TIMEOUT_USEC=``: the current start (or stop) timeout now ends no sooner
        than ``seconds`` from now. Send it again before that runs out to keep extending."""
        if not isinstance(seconds, (int, float)) or math.isnan(seconds):
            log.debug("sd_notify: bad timeout extension %r", seconds)
            return False
        usec = int(min(max(float(seconds), 0.0), 2**63 / 1e6 - 1) * 1e6)
        return self.notify(f"EXTEND_TIMEOUT_USEC={usec}")

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: one keep-alive ping. False without sending when
        ``$WATCHDOG_PID`` names another process."""
        if not self._watchdog_for_us():
            log.debug("sd_notify: WATCHDOG_PID is not our pid %d: not pinging", os.getpid())
            return False
        return self.notify("WATCHDOG=1")

    # -- watchdog thread -----------------------------------------------------------------

    def start_watchdog(self, healthy: Callable[[], bool] | None = None) -> None:
        """Ping ``WATCHDOG=1`` every :attr:`watchdog_interval_s` from a daemon thread, first at
        once, each time only if ``healthy()`` returns true (an exception or a hang counts as
        unhealthy: systemd restarts the service after ``WatchdogSec=``). No-op without a
        watchdog; calling it again replaces the thread.
        """
        interval = self.watchdog_interval_s
        if interval is None or not self.enabled:
            log.debug("systemd watchdog not requested: no watchdog thread")
            return
        self.stop_watchdog()
        stop = threading.Event()
        thread = NamedThread(
            target=self._watchdog_loop,
            args=(interval, healthy, stop),
            name="isc-watchdog",
            daemon=True,
        )
        with self._lock:
            self._wd_stop, self._wd_thread = stop, thread
        thread.start()
        log.debug("systemd watchdog: pinging every %.3f s", interval)

    def _watchdog_loop(
        self, interval: float, healthy: Callable[[], bool] | None, stop: threading.Event
    ) -> None:
        was_healthy = True
        while not stop.is_set():
            ok = True
            if healthy is not None:
                try:
                    ok = bool(healthy())
                except Exception:
                    log.exception("systemd watchdog: health check raised")
                    ok = False
            if stop.is_set():
                break
            if ok:
                if not was_healthy:
                    log.warning("systemd watchdog: healthy again, pings resumed")
                self.watchdog()
            elif was_healthy:
                log.warning(
                    "systemd watchdog: service unhealthy, pings suspended "
                    "(systemd restarts the service if this lasts WatchdogSec)"
                )
            was_healthy = ok
            stop.wait(interval)

    def stop_watchdog(self) -> None:
        """Stop the watchdog thread (if any) and wait for it briefly. Idempotent."""
        with self._lock:
            stop, thread = self._wd_stop, self._wd_thread
            self._wd_stop = self._wd_thread = None
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
