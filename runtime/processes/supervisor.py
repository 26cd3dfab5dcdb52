"""The supervisor: starts, watches, restarts and stops instance processes.

Each instance is a process bound to one unit, engine and core set, with a control socket,
a status pipe and a pidfd watched without polling. An instance that dies unasked has its
tokens reclaimed by the manager (re-routed or held, InfScaler §IV-B), then is replaced.

More: docs/serving.md, "`runtime/processes/supervisor.py`".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infscaler.base.errors import InfScalerError
from infscaler.base.levels import cpu_nice, cpu_weight
from infscaler.base.procutil import module_command
from infscaler.base.threads import NamedThread, named_executor
from infscaler.runtime.processes.cgroups import CgroupCpu
from infscaler.runtime.processes.handles import InstanceHandle, PendingRestart
from infscaler.runtime.processes.nice import renice_process
from infscaler.runtime.processes.zygote import ForkServer, ZygoteUnavailable, enabled_by_env
from infscaler.runtime.serving.batching import ExecTotals
from infscaler.runtime.serving.pipeline import Unit
from infscaler.runtime.serving.states import InstanceState

log = logging.getLogger("infscaler.supervisor")

#: The highest instance id the supervisor gives (u16 token field); the ones above it are
#: the runtime's own (:data:`~infscaler.runtime.serving.pipeline.FRONTEND_INSTANCE`).
_MAX_IID = 0xFFFD


class InstanceStartError(InfScalerError):
    """An instance could not start (engine unavailable, model failed to load, ...)."""


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential restart backoff (restarts never stop).

    Attributes:
        initial_s: delay before the first restart after a healthy run, s.
        factor: growth per consecutive crash. max_s: the largest delay, s.
        healthy_after_s: ready this long resets the crash count, s.
        hold_through_s: requests of a unit without a live instance wait for its
            replacement only when the delay is at most this, s; else 503 at once.
    """

    initial_s: float = 0.05
    factor: float = 2.0
    max_s: float = 10.0
    healthy_after_s: float = 0.5
    hold_through_s: float = 1.0

    def __post_init__(self) -> None:
        if not (0 <= self.initial_s <= self.max_s and self.factor >= 1):
            raise ValueError(
                f"restart policy: need 0 <= initial_s <= max_s and factor >= 1, got "
                f"initial_s={self.initial_s}, max_s={self.max_s}, factor={self.factor}"
            )
        if self.healthy_after_s < 0 or self.hold_through_s < 0:
            raise ValueError("restart policy: healthy_after_s and hold_through_s must be >= 0")

    def delay(self, streak: int) -> float:
        """Seconds to wait before restarting after the ``streak``-th consecutive crash
        (1: the first): ``min(max_s, initial_s x factor^(streak-1))``."""
        n = max(1, int(streak))
        if n > 64:  # factor ** n overflows long before; the cap applies anyway
            return self.max_s
        return min(self.max_s, self.initial_s * self.factor ** (n - 1))


class Supervisor:
    """Start / stop / restart instance processes.

    Args:
        manager: the running :class:`~infscaler.shm.manager.TensorSharingManager`.
        service_id: the tensor pool's service id.
        policy: the restart backoff.
        on_change: called from the supervisor thread when an instance becomes ready,
            exits or is restarted.
        env: extra environment for instances.
        fork_server: fork instances from a zygote (None: unless ``INFSCALER_ZYGOTE=0``;
            False: spawn fresh interpreters).
    """

    def __init__(
        self,
        manager: Any,
        service_id: str,
        *,
        policy: RestartPolicy | None = None,
        on_change: Callable[[], None] | None = None,
        env: dict[str, str] | None = None,
        fork_server: bool | None = None,
    ) -> None:
        self.manager = manager
        self.service_id = service_id
        self.policy = policy or RestartPolicy()
        self._on_change = on_change or (lambda: None)
        # systemd's notify / watchdog variables are the service's alone
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS")
        }
        self.env = {**base, **(env or {})}
        self._lock = threading.RLock()
        #: one reader of an instance's status pipe at a time: the watcher, or stop()'s
        #: last drain before the pipe closes
        self._status_lock = threading.Lock()
        self._handles: dict[int, InstanceHandle] = {}
        self._pending: dict[int, PendingRestart] = {}
        self._pending_seq = 0
        self._held_limited: set[int] = set()
        self._next_iid = 1
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._closing = False
        self._thread = NamedThread(target=self._run, name="isc-supervisor", daemon=True)
        self._thread.start()
        self._spawner = named_executor("isc-spawn", 1)
        self.restarted = 0
        #: per ``(pipeline, unit index)``: executions and items per batch size of every
        #: instance it ran (:class:`~infscaler.runtime.serving.batching.ExecTotals`)
        self.exec_totals = ExecTotals()
        #: instances started per way: ``forked`` (zygote), ``spawned`` (fresh process)
        self.started_by = {"forked": 0, "spawned": 0}
        #: each deployed pipeline's priority level, and the nice value its instances run
        #: at from them (:func:`~infscaler.base.levels.cpu_nice`)
        self._levels: dict[str, int] = {}
        self.nice: dict[str, int] = {}
        #: False with ``INFSCALER_CPU_PRIORITY=off`` (benchmarks: every instance at the
        #: service's own nice value, as before CPU by priority)
        mode = os.environ.get("INFSCALER_CPU_PRIORITY", "on").lower()
        self.cpu_priority = mode != "off"
        #: per-pipeline cgroup v2 cpu.weight (``on``: under systemd, where the service can
        #: create cgroups; ``cgroup``: wherever it can; ``nice``: never), and why not
        #: (:mod:`~infscaler.runtime.processes.cgroups`)
        self.cgroups: CgroupCpu | None = None
        self.cgroups_why = f"INFSCALER_CPU_PRIORITY={mode}"
        if mode == "on" and not os.environ.get("INVOCATION_ID"):
            self.cgroups_why = "not a systemd service (INFSCALER_CPU_PRIORITY=cgroup to try)"
        elif mode in ("on", "cgroup"):
            self.cgroups, self.cgroups_why = CgroupCpu.open()
            if self.cgroups is None:
                log.info("CPU by priority with nice values only: %s", self.cgroups_why)
        #: the service's own nice value: instances run at it plus their pipeline's
        self._base_nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.zygote: ForkServer | None = None
        if enabled_by_env() if fork_server is None else fork_server:
            self.zygote = ForkServer(self.env, lambda fn: self._spawner.submit(fn).result())
            self.zygote.start()

    def preload(self, modules: Any) -> dict[str, str]:
        """Have the zygote import ``modules`` (function stages' modules of a pipeline
        being deployed) so its instances share them; ``{module: error}`` of those it
        could not (their instances import them themselves). Nothing without a zygote."""
        if self.zygote is None:
            return {}
        return self.zygote.preload(list(modules))

    def zygote_status(self) -> dict[str, Any]:
        """The fork server (:meth:`ForkServer.status`; ``{"enabled": False}`` without
        one) and how many instances started each way."""
        st = self.zygote.status() if self.zygote is not None else {"enabled": False}
        return {**st, "started": dict(self.started_by)}

    def on_change(self) -> None:
        """Tell the owner that instances changed (its callback's errors are logged: the
        supervisor's threads must survive them)."""
        try:
            self._on_change()
        except Exception:  # noqa: BLE001 - e.g. a pipeline removed meanwhile
            log.exception("the on_change callback failed")

    # -- CPU by priority ---------------------------------------------------------------------
    def set_level(self, pipeline: str, level: int | None) -> None:
        """Record ``pipeline``'s priority level (None: it is gone) and renice every live
        instance whose nice value changes with it: the highest level deployed runs at
        the service's own nice value, lower levels that plus
        :func:`~infscaler.base.levels.cpu_nice`'s (at most 19),
        so the kernel gives a higher-priority pipeline's instances the cores first.
        Instances started later take their pipeline's value when they start."""
        with self._lock:
            if level is None:
                self._levels.pop(pipeline, None)
            else:
                self._levels[pipeline] = level
            old = self.nice
            self.nice = cpu_nice(self._levels) if self.cpu_priority else {}
            changed = {p for p, n in self.nice.items() if old.get(p, 0) != n}
            if self.cgroups is not None:
                try:
                    self.cgroups.set_weights(cpu_weight(self._levels))
                except OSError as exc:
                    log.warning("cgroup cpu.weight not set: %s", exc)
            handles = [h for h in self._handles.values() if h.key[0] in changed]
        for h in handles:
            self._renice(h)

    def _renice(self, h: InstanceHandle) -> None:
        why = renice_process(h.proc.pid, min(19, self._base_nice + self.nice.get(h.key[0], 0)))
        if why is not None and h.state is not InstanceState.STOPPING:
            log.warning("instance %d of %s: %s", h.iid, h.unit.name, why)

    # -- starting ---------------------------------------------------------------------------
    def _alloc_iid(self) -> int:
        with self._lock:
            for _ in range(_MAX_IID):
                iid = self._next_iid
                self._next_iid = 1 if iid >= _MAX_IID else iid + 1
                if iid not in self._handles:
                    return iid
        raise InstanceStartError("no free instance id (65533 instances live)")

    def start(
        self,
        key: tuple[str, int],
        unit: Unit,
        stage_id: int,
        next_stage: int,
        cores: list[int],
        *,
        restarts: int = 0,
        streak: int = 0,
        spawn: bool = False,
    ) -> InstanceHandle:
        """Start one instance of ``unit`` (returns at once; see :meth:`wait_ready`):
        forked by the zygote, else (``spawn``, or the zygote unavailable) spawned.

        Raises:
            SharingError / ChannelError: the channel refused the instance (stage full).
            InstanceStartError: the process could not be created.
        """
        iid = self._alloc_iid()
        # routed to once ready (set_live in _on_status): tokens must not wait for the load
        sock = self.manager.add_instance(stage_id, iid, live=False)
        status_r, status_w = os.pipe()
        cmd_r, cmd_w = os.pipe()
        spec = {
            "service_id": self.service_id,
            "instance": iid,
            "stage_id": stage_id,
            "next_stage": next_stage,
            "fd": sock.fileno(),
            "status_fd": status_w,
            "cmd_fd": cmd_r,
            "unit": unit.to_dict(),
            "cores": cores,
        }
        fds = (sock.fileno(), status_w, cmd_r)

        def undo() -> None:
            sock.close()
            for fd in (status_r, status_w, cmd_r, cmd_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(Exception):
                self.manager.instance_died(iid, timeout=0)

        proc: Any = None
        if self.zygote is not None and not spawn:
            try:
                proc = self.zygote.fork(spec, fds)
            except ZygoteUnavailable as exc:
                log.warning(
                    "%s: starting instance %d of %s as a fresh process", exc, iid, unit.name
                )
                if exc.sent:
                    # a child may exist with these fds: give up this id and its socket
                    # (such a child exits on ChannelClosed), start anew the old way
                    undo()
                    return self.start(
                        key, unit, stage_id, next_stage, cores,
                        restarts=restarts, streak=streak, spawn=True,
                    )  # fmt: skip
        if proc is None:
            proc = self._spawn(unit, fds, undo)
        sock.close()
        os.close(status_w)
        os.close(cmd_r)
        os.set_blocking(cmd_w, False)
        pidfd = self._hand_over(proc, spec)
        os.set_blocking(status_r, False)
        h = InstanceHandle(
            iid,
            key,
            unit,
            stage_id,
            next_stage,
            cores,
            proc,
            status_r,
            pidfd,
            restarts=restarts,
            streak=streak,
            cmd_fd=cmd_w,
        )
        with self._lock:
            self._handles[iid] = h
            self._sel.register(status_r, selectors.EVENT_READ, ("status", h))
            self._sel.register(pidfd, selectors.EVENT_READ, ("exit", h))
        if self.nice.get(key[0], 0):
            self._renice(h)  # its threads so far; those it starts later inherit it
        if self.cgroups is not None:
            with self._lock:
                why = self.cgroups.add(key[0], proc.pid)
            if why is not None:
                log.warning("instance %d of %s: %s", iid, unit.name, why)
        self._wake()
        log.info(
            "started instance %d of %s (pid %d, %s, cores %s)",
            iid,
            unit.name,
            proc.pid,
            "spawned" if isinstance(proc, subprocess.Popen) else "forked",
            cores,
        )
        return h

    def _spawn(self, unit: Unit, fds: tuple[int, ...], undo: Callable[[], None]) -> Any:
        """A fresh interpreter running the instance module with ``fds`` (``undo`` runs on failure).

        Raises:
            InstanceStartError: the process could not be created.
        """
        try:
            # forked from one long-lived thread: PR_SET_PDEATHSIG fires when the
            # thread that forked the child exits (prctl(2)), so a deploy or restart
            # from a short-lived thread would otherwise kill its instances with it
            return self._spawner.submit(
                subprocess.Popen,
                module_command("infscaler.runtime.serving.instance"),
                stdin=subprocess.PIPE,
                pass_fds=fds,
                env=self.env,
                close_fds=True,
            ).result()
        except OSError as exc:
            undo()
            raise InstanceStartError(f"cannot start an instance of {unit.name}: {exc}") from None

    def _hand_over(self, proc: Any, spec: dict[str, Any]) -> int:
        """Send a spawned instance its ``spec`` on stdin (a forked one has it already),
        count how it started, and return a pidfd of it to watch its exit."""
        if isinstance(proc, subprocess.Popen):
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(json.dumps(spec).encode())
                proc.stdin.close()
            pidfd = os.pidfd_open(proc.pid)
            self.started_by["spawned"] += 1
        else:
            pidfd = os.dup(proc.pidfd)
            self.started_by["forked"] += 1
        return pidfd

    def wait_ready(self, handles: list[InstanceHandle], timeout: float) -> None:
        """Block until every handle is ready.

        Raises:
            InstanceStartError: one failed or exited, or ``timeout`` passed (names unit and reason).
        """
        deadline = time.monotonic() + timeout
        for h in handles:
            left = deadline - time.monotonic()
            if not h._ready.wait(max(0.0, left)):
                raise InstanceStartError(
                    f"instance {h.iid} of {h.unit.name} was not ready within {timeout:.0f} s"
                )
            if h.state is not InstanceState.READY:
                raise InstanceStartError(
                    f"instance of {h.unit.name} failed to start: {h.error or 'exited'}",
                    hint="check the model / engine of this stage (`infscaler inspect`)",
                )

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, h: InstanceHandle, timeout: float = 10.0) -> None:
        """Stop an instance gracefully (SIGUSR1: after its current request), SIGKILL
        after ``timeout`` s, then deregister it (its queued inputs are re-routed)."""
        with self._lock:
            if h.state in (InstanceState.EXITED, InstanceState.FAILED):
                return
            if h.state is not InstanceState.STOPPING:
                h.move(InstanceState.STOPPING)
        with contextlib.suppress(ProcessLookupError):
            h.proc.send_signal(signal.SIGUSR1)
        try:
            h.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                h.proc.kill()
            h.proc.wait()
        self._exited(h)

    def stop_all(self, handles: list[InstanceHandle] | None = None, timeout: float = 10.0) -> None:
        """Stop many instances in parallel."""
        with self._lock:
            todo = list(self._handles.values()) if handles is None else list(handles)
            for h in todo:
                if h.state in (InstanceState.STARTING, InstanceState.READY):
                    h.move(InstanceState.STOPPING)
        for h in todo:
            with contextlib.suppress(ProcessLookupError):
                h.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        for h in todo:
            try:
                h.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    h.proc.kill()
                h.proc.wait()
            self._exited(h)

    def close(self, timeout: float = 10.0) -> None:
        """Stop every instance and the supervisor thread (pending restarts are dropped)."""
        self._closing = True
        self.cancel_restarts()
        self.stop_all(timeout=timeout)
        self._wake()
        self._thread.join(5.0)
        if self.zygote is not None:
            with contextlib.suppress(Exception):
                self.zygote.close()
        self._spawner.shutdown(wait=False)
        with contextlib.suppress(OSError):
            os.close(self._wake_r)
            os.close(self._wake_w)

    def cancel_restarts(self, stage_ids: Any = None) -> int:
        """Drop the pending restarts of the units on ``stage_ids`` (None: all), e.g. when
        their pipeline is undeployed. After it returns no replacement of those stages
        starts. Returns how many were dropped."""
        stages = None if stage_ids is None else {int(s) for s in stage_ids if s}
        with self._lock:
            gone = [k for k, p in self._pending.items() if stages is None or p.stage_id in stages]
            for k in gone:
                p = self._pending.pop(k)
                p.cancelled = True
                p.wake.set()
        return len(gone)

    # -- introspection ----------------------------------------------------------------------
    def handles(self, key: tuple[str, int] | None = None) -> list[InstanceHandle]:
        with self._lock:
            return [h for h in self._handles.values() if key is None or h.key == key]

    def pending_restarts(self, key: tuple[str, int] | None = None) -> list[PendingRestart]:
        """Replacements waiting for their backoff delay (of ``key``, or all)."""
        with self._lock:
            return [p for p in self._pending.values() if key is None or p.key == key]

    def restart_eta(self, key: tuple[str, int], stage_id: int) -> float | None:
        """Seconds until unit ``key`` (on ``stage_id``) is expected to have a ready
        instance again: the pending restart's delay plus its last load time, or the load
        time left of a starting one; 0.0 when one is ready; None when none is coming."""
        now = time.monotonic()
        with self._lock:
            mine = [h for h in self._handles.values() if h.key == key and h.stage_id == stage_id]
            if any(h.state is InstanceState.READY for h in mine):
                return 0.0
            etas = [
                max(0.0, p.due - now) + p.load_s
                for p in self._pending.values()
                if p.key == key and p.stage_id == stage_id
            ]
            for h in mine:
                if h.state is InstanceState.STARTING:
                    etas.append(max(0.1, h.load_s - (now - h.started)))
        return min(etas) if etas else None

    # -- the watcher ------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._closing:
            try:
                events = self._sel.select(timeout=1.0)
            except (OSError, ValueError):
                time.sleep(0.05)
                continue
            for key, _ in events:
                what, h = key.data
                try:
                    if what == "wake":
                        with contextlib.suppress(BlockingIOError, OSError):
                            while os.read(self._wake_r, 4096):
                                pass
                    elif what == "status":
                        self._read_status(h)
                    elif what == "exit":
                        self._read_status(h)
                        self._on_exit(h)
                except Exception:  # noqa: BLE001 - e.g. IllegalTransition: the watcher goes on
                    log.exception(
                        "supervisor: handling %s of instance %s failed", what, h and h.iid
                    )

    def _read_status(self, h: InstanceHandle) -> None:
        """Read and handle what the instance wrote to its status pipe (non-blocking)."""
        with self._status_lock:
            if h.status_fd is not None:
                self._drain_status(h)

    def _drain_status(self, h: InstanceHandle) -> None:
        while True:
            try:
                chunk = os.read(h.status_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._sel.unregister(h.status_fd)
                return
            h._buf += chunk
            while b"\n" in h._buf:
                line, h._buf = h._buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                self._on_status(h, msg)

    def _on_status(self, h: InstanceHandle, msg: dict[str, Any]) -> None:
        ev = msg.get("event")
        if ev == "ready":
            h.info = msg
            h.stats = {k: msg[k] for k in ("rss_mb", "uss_mb", "pss_mb") if k in msg}
            with self._lock:  # stop() may be moving it to stopping meanwhile
                became_ready = h.state is InstanceState.STARTING
                if became_ready:
                    h.move(InstanceState.READY)
                    h.ready_at = time.monotonic()
            if became_ready:
                if self.nice.get(h.key[0], 0):
                    self._renice(h)  # the engine's threads, started while loading
                try:
                    self.manager.set_live(h.iid)
                except Exception:  # noqa: BLE001 - a closing channel: nothing to route
                    log.exception("routing to instance %d failed", h.iid)
                self._unlimit_hold(h.stage_id)
            h._ready.set()
            self.on_change()
        elif ev == "stats":
            # an idle report carries the counters alone: the last memory reading stays
            h.stats = {**h.stats, **msg}
            try:
                self.exec_totals.observe(h.key, h.iid, msg.get("exec"))
            except (TypeError, ValueError) as exc:
                log.warning("instance %d: bad exec counts %r (%s)", h.iid, msg.get("exec"), exc)
        elif ev == "fatal":
            h.error = str(msg.get("error"))
            log.error("instance %d of %s: %s", h.iid, h.unit.name, h.error)

    def _on_exit(self, h: InstanceHandle) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(h.pidfd)
        h.exit_code = h.proc.poll()
        if h.exit_code is None:
            with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                h.proc.wait(1.0)
            h.exit_code = h.proc.returncode
        self.exec_totals.forget_instance(h.iid)
        # None: a forked instance whose zygote died before it reported the status
        # (runtime.zygote.ForkedProcess); the restart is the same, the log says so
        status = "unknown (its zygote died first)" if h.exit_code is None else h.exit_code
        with self._lock:  # stop() may be moving it to stopping meanwhile
            if h.state in (InstanceState.STOPPING, InstanceState.EXITED):
                return  # asked to stop: stop() deregisters it (and may already have)
            was_ready = h.state is InstanceState.READY
            h.move(InstanceState.EXITED if was_ready else InstanceState.FAILED)
        if not h._ready.is_set():
            h.error = h.error or f"exited with status {status} while starting"
            h._ready.set()
        log.warning(
            "instance %d of %s (pid %d) died with status %s",
            h.iid,
            h.unit.name,
            h.pid,
            status,
        )
        pending = None
        # a replacement (restarts > 0) that dies while loading is restarted too; only a
        # first deploy's instances that fail to load are not (the deploy fails instead)
        if not self._closing and (was_ready or h.restarts > 0):
            pending = self._schedule_restart(h, f"exited with status {status}")
        self.on_change()  # the unit may have no live instance now: degraded at once
        # reclaim in a worker: it waits for every live instance's sync echo
        NamedThread(
            target=self._reclaim_and_restart, args=(h, pending), name="isc-restart", daemon=True
        ).start()

    def _schedule_restart(self, h: InstanceHandle, reason: str) -> PendingRestart:
        now = time.monotonic()
        healthy = h.ready_at is not None and now - h.ready_at >= self.policy.healthy_after_s
        streak = 1 if healthy else h.streak + 1
        delay = self.policy.delay(streak)
        p = PendingRestart(
            h.key,
            h.unit,
            h.stage_id,
            h.next_stage,
            h.cores,
            h.restarts + 1,
            streak,
            now + delay,
            h.load_s,
            reason,
        )
        with self._lock:
            self._pending_seq += 1
            p.id = self._pending_seq
            self._pending[p.id] = p
        return p

    def _exited(self, h: InstanceHandle) -> None:
        """Deregister a stopped instance (clean exit or killed by stop())."""
        with self._lock:
            if h.state is InstanceState.EXITED and h.iid not in self._handles:
                return
            if h.state is not InstanceState.EXITED:
                h.move(InstanceState.EXITED)
            self._handles.pop(h.iid, None)
        # its last reports before the pipe closes: an instance's final ``stats`` (the
        # items it ran since its last report) would be lost with the pipe otherwise
        self._read_status(h)
        self.exec_totals.forget_instance(h.iid)
        self._release_fds(h)
        with contextlib.suppress(Exception):
            self.manager.instance_died(h.iid, timeout=5.0)
        self.on_change()

    def command(self, h: InstanceHandle, msg: dict[str, Any]) -> bool:
        """Send ``msg`` (one JSON line) to instance ``h``'s command pipe (e.g.
        ``{"cmd": "batch", "size": 4, "delay_ms": 2}``). False if it cannot take it now."""
        if h.cmd_fd is None or h.state not in (InstanceState.STARTING, InstanceState.READY):
            return False
        try:
            os.write(h.cmd_fd, (json.dumps(msg) + "\n").encode())
            return True
        except OSError:
            return False

    def _release_fds(self, h: InstanceHandle) -> None:
        if h.cmd_fd is not None:
            with contextlib.suppress(OSError):
                os.close(h.cmd_fd)
            h.cmd_fd = None
        with self._status_lock:
            fds, h.status_fd = (h.status_fd, h.pidfd), None
        for fd in fds:
            if fd is None:
                continue
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(fd)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _reclaim_and_restart(self, h: InstanceHandle, pending: PendingRestart | None) -> None:
        if pending is not None:
            self._limit_hold(pending)
        report = None
        try:
            # deregisters at once; the report completes when every live instance has
            # answered its sync marker (logged by another thread: the restart need not
            # wait for it, the replacement has a new instance id)
            report = self.manager.instance_died(h.iid, timeout=0)
        except Exception as exc:  # noqa: BLE001 - logged; the restart still happens
            log.error("reclaiming instance %d failed: %s", h.iid, exc)
        if report is not None:
            NamedThread(
                target=self._log_reclaim,
                args=(h.iid, report),
                name="isc-reclaim",
                daemon=True,
            ).start()
        with self._lock:
            self._handles.pop(h.iid, None)
        self._release_fds(h)
        self.on_change()
        while pending is not None:
            pending = self._restart_when_due(pending)

    @staticmethod
    def _log_reclaim(iid: int, report: Any) -> None:
        if not report.wait(10.0):
            log.warning("reclaim of instance %d still waits for sync echoes after 10 s", iid)
            return
        log.warning(
            "reclaimed instance %d: retried %s, held %s, failed %s, freed %d slots",
            iid,
            report.retried,
            report.held,
            [r for r, _ in report.failed],
            len(report.freed),
        )

    def _restart_when_due(self, p: PendingRestart) -> PendingRestart | None:
        """Wait for ``p``'s delay, start the replacement; returns the next pending
        restart when the start itself failed (never gives up), else None."""
        delay = p.due - time.monotonic()
        if delay > 0:
            log.warning(
                "restarting %s in %.2f s (consecutive crashes: %d)", p.unit.name, delay, p.streak
            )
            p.wake.wait(delay)
        with self._lock:
            if p.cancelled or self._closing or self._pending.get(p.id) is not p:
                return None
            try:
                new = self.start(
                    p.key,
                    p.unit,
                    p.stage_id,
                    p.next_stage,
                    p.cores,
                    restarts=p.restarts,
                    streak=p.streak,
                )
            except Exception as exc:  # noqa: BLE001 - logged; tried again after a delay
                log.error("restarting %s failed: %s", p.unit.name, exc)
                nxt = dataclasses.replace(
                    p,
                    streak=p.streak + 1,
                    due=time.monotonic() + self.policy.delay(p.streak + 1),
                    reason=f"start failed: {exc}",
                    wake=threading.Event(),
                )
                self._pending[p.id] = nxt
                self._limit_hold(nxt)
                return nxt
            self._pending.pop(p.id, None)
            self.restarted += 1
        log.warning("restarted %s as instance %d (pid %d)", p.unit.name, new.iid, new.pid)
        self.on_change()
        return None

    def _limit_hold(self, p: PendingRestart) -> None:
        """Bound how long requests held for ``p``'s stage wait (module docstring)."""
        with self._lock:
            others = any(
                h.stage_id == p.stage_id and h.state is InstanceState.READY
                for h in self._handles.values()
            )
        if others:
            return
        delay = max(0.0, p.due - time.monotonic())
        if delay > self.policy.hold_through_s:
            seconds = 0.0
            why = (
                f"unit {p.unit.name} has no live instance: its restart waits {delay:.1f} s "
                f"(backoff after {p.streak} consecutive crashes)"
            )
        else:
            seconds = delay + p.load_s + 1.0
            why = f"unit {p.unit.name} was not back within {seconds:.1f} s of its restart"
        setter = getattr(self.manager, "set_hold_limit", None)
        if setter is None:
            return
        with contextlib.suppress(Exception):
            setter(p.stage_id, seconds, why)
            with self._lock:
                self._held_limited.add(p.stage_id)

    def _unlimit_hold(self, stage_id: int) -> None:
        with self._lock:
            if stage_id not in self._held_limited:
                return
            self._held_limited.discard(stage_id)
        with contextlib.suppress(Exception):
            self.manager.set_hold_limit(stage_id, None)
