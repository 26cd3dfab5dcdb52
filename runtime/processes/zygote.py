"""The fork server ("zygote"): instances forked from one warm, thread-free process that has
the instance stack imported, sharing those pages copy-on-write (a fresh interpreter
costs ~0.5 s and ~45 MB USS before its model).

More: docs/serving.md, "`runtime/processes/zygote.py`".
"""

from __future__ import annotations

import array
import collections
import concurrent.futures
import contextlib
import ctypes
import gc
import importlib
import json
import logging
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from infscaler.base.errors import InfScalerError
from infscaler.base.procutil import cuda_libraries_mapped, module_command
from infscaler.base.threads import NamedThread

log = logging.getLogger("infscaler.zygote")

#: ``INFSCALER_ZYGOTE=0`` (or ``false`` / ``no`` / ``off``): start instances the old way.
ENV_SWITCH = "INFSCALER_ZYGOTE"

#: imported by the zygote before it forks anything (what every instance needs).
BASE_MODULES = (
    "numpy",
    "numpy.random",  # the child re-seeds it
    "onnxruntime",
    "onnx",
    "psutil",
    "infscaler.runtime.serving.instance",
    "infscaler.engines",
    "infscaler.engines.cpu",
    "infscaler.shm.client",
    "infscaler.shm.slabmap",
    "infscaler.shm.tensors",
    "infscaler.shm.deadlines",
    "infscaler.ebpf.channel",
    "infscaler.ebpf.errors",
)

_HDR = struct.Struct("!I")
_MAX_FRAME = 64 << 20
_MAX_FDS = 16


def enabled_by_env() -> bool:
    """False when ``INFSCALER_ZYGOTE`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


class ZygoteUnavailable(InfScalerError):
    """The fork server cannot start this instance; ``sent``: the request reached it (a child
    may exist: do not reuse the fds).
    """

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


# -- framing -----------------------------------------------------------------------------------
def send_frame(sock: socket.socket, obj: dict[str, Any], fds: Sequence[int] = ()) -> None:
    """Send ``obj`` as one JSON frame with ``fds`` as ``SCM_RIGHTS``; OSError when the peer died."""
    data = json.dumps({**obj, "nfds": len(fds)}).encode()
    payload = _HDR.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [payload], list(fds))
        if sent < len(payload):
            sock.sendall(payload[sent:])
    else:
        sock.sendall(payload)


class FrameReader:
    """Reassembles frames (and their fds) from a stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.fds: collections.deque[int] = collections.deque()

    def read(self) -> list[tuple[dict[str, Any], list[int]]] | None:
        """The complete frames available, with their fds (blocks for one chunk); None at EOF.

        Raises:
            ValueError: a malformed frame.
        """
        fds = array.array("i")
        data, anc, _flags, _addr = self.sock.recvmsg(
            1 << 16, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC
        )
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(cdata[: len(cdata) - (len(cdata) % fds.itemsize)])
        self.fds.extend(fds)
        if not data:
            return None
        self.buf += data
        out = []
        while len(self.buf) >= _HDR.size:
            (n,) = _HDR.unpack_from(self.buf)
            if n > _MAX_FRAME:
                raise ValueError(f"frame of {n} bytes")
            if len(self.buf) < _HDR.size + n:
                break
            obj = json.loads(self.buf[_HDR.size : _HDR.size + n])
            self.buf = self.buf[_HDR.size + n :]
            k = int(obj.get("nfds", 0))
            if k > len(self.fds):
                raise ValueError(f"frame announces {k} fds, {len(self.fds)} arrived")
            out.append((obj, [self.fds.popleft() for _ in range(k)]))
        return out

    def close_fds(self) -> None:
        while self.fds:
            with contextlib.suppress(OSError):
                os.close(self.fds.popleft())


# -- the zygote process ------------------------------------------------------------------------
def _threads() -> list[str]:
    """This process's threads (names), from ``/proc/self/task``."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out.append(f.read().strip())
        except OSError:
            continue
    return out


def _settle_threads() -> list[str]:
    """Fork once to a child that exits at once (runs the libraries' ``pthread_atfork``
    handlers: OpenBLAS joins its pool), then return the threads left."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return _threads()


def _trim() -> None:
    """``malloc_trim(0)``: hand the heap's free pages back before forking (they would
    be resident in every child's mapping, and so in its PSS). glibc only."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _set_name(name: bytes) -> None:
    """``prctl(PR_SET_NAME)``: the name ``ps -o comm`` / ``top`` show (15 bytes)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)


def _exit_status(pidfd: int) -> int | None:
    """Reap the child of ``pidfd``: its status in Popen's convention (None: not ours)."""
    try:
        info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
    except ChildProcessError:
        return None
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _child(sock: socket.socket, spec: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: clean up what it inherited from the zygote, then run the
    instance (:func:`infscaler.runtime.serving.instance.serve`). Never returns."""
    code = 1
    try:
        keep = {0, 1, 2, *fds}
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd not in keep:
                with contextlib.suppress(OSError):
                    os.close(fd)
        sock.detach()  # closed above; its object must not close a reused number later
        for sig in (signal.SIGCHLD, signal.SIGUSR1, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        gc.enable()  # the zygote froze what it had: the collector leaves those pages alone
        import random

        import numpy as np

        random.seed()
        np.random.seed()
        _set_name(b"infscaler-inst")
        sys.argv = ["infscaler-instance"]
        spec = {**spec, "fd": fds[0], "status_fd": fds[1], "cmd_fd": fds[2]}
        # why: imported here, not at the top: the service imports this module (ForkServer)
        # and must not load the instance stack; the zygote has it preloaded (BASE_MODULES)
        from infscaler.runtime.serving import instance

        code = instance.serve(spec)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on stderr; the child must not return
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


class _Zygote:
    """The zygote's loop (runs in the zygote process)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = FrameReader(sock)
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ, None)
        self.children: dict[int, int] = {}  # pidfd -> pid

    def send(self, obj: dict[str, Any], fds: Sequence[int] = ()) -> None:
        send_frame(self.sock, obj, fds)

    def run(self) -> int:
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    frames = self.reader.read()
                    if frames is None:
                        return 0  # the service closed its end (it stopped or died)
                    for obj, fds in frames:
                        if self.handle(obj, fds):
                            return 3
                else:
                    self.reap(key.fd)

    def reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd, None)
        self.sel.unregister(pidfd)
        status = _exit_status(pidfd)
        os.close(pidfd)
        self.send({"event": "exit", "pid": pid, "status": status})

    def handle(self, obj: dict[str, Any], fds: list[int]) -> bool:
        """One request; True when the zygote must exit (it is no longer fork-safe)."""
        op, rid = obj.get("op"), obj.get("id")
        if op == "fork":
            try:
                return self.fork(rid, obj["spec"], fds)
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if op == "preload":
            return self.preload(rid, [str(m) for m in obj.get("modules", [])])
        self.send({"reply": rid, "ok": False, "error": f"unknown op {op!r}"})
        return False

    def fork(self, rid: Any, spec: dict[str, Any], fds: list[int]) -> bool:
        """Fork one instance; True when the zygote must exit (CUDA got mapped into it)."""
        threads = _threads()
        if len(threads) != 1:
            self.send(
                {"reply": rid, "ok": False, "error": f"the zygote runs {len(threads)} threads"}
            )
            return False
        if len(fds) != 3:
            self.send({"reply": rid, "ok": False, "error": f"fork needs 3 fds, got {len(fds)}"})
            return False
        cuda = cuda_libraries_mapped()
        if cuda:  # a child could not use CUDA: refuse, exit, be restarted clean
            self.send({"reply": rid, "ok": False, "error": cuda_error(cuda)})
            return True
        gc.freeze()  # into the permanent generation: no collection in a child writes to them
        pid = os.fork()
        if pid == 0:
            _child(self.sock, spec, fds)
        pidfd = os.pidfd_open(pid)  # ours until we reap it: no pid-reuse race
        self.children[pidfd] = pid
        self.sel.register(pidfd, selectors.EVENT_READ, pid)
        self.send({"reply": rid, "ok": True, "pid": pid, "cuda_free": True}, [pidfd])
        return False

    def preload(self, rid: Any, modules: list[str]) -> bool:
        errors: dict[str, str] = {}
        rejected: list[str] = []
        for name in modules:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except BaseException as exc:  # noqa: BLE001 - the instance reports it itself
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            cuda = cuda_libraries_mapped()
            if cuda:
                rejected.append(name)
                errors[name] = f"importing {name} mapped CUDA: " + cuda_error(cuda)
                self.send({"reply": rid, "ok": False, "errors": errors, "rejected": rejected})
                return True
            if len(_threads()) > 1 and len(_settle_threads()) > 1:
                rejected.append(name)
                errors[name] = f"importing {name} started threads: instances cannot fork"
                self.send({"reply": rid, "ok": False, "errors": errors, "rejected": rejected})
                return True
        _trim()
        self.send({"reply": rid, "ok": not errors, "errors": errors, "rejected": rejected})
        return False


def cuda_error(libraries: Sequence[str]) -> str:
    """Why a zygote with ``libraries`` (CUDA) mapped must not fork."""
    return (
        f"the zygote has CUDA mapped ({', '.join(libraries)}): a CUDA context does not "
        "survive fork(), so no instance may be forked from it; a preloaded module or "
        "BASE_MODULES initialised CUDA (engines must import tensorrt / pycuda and create "
        "sessions in the instance, after the fork)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the zygote process: ``argv[0]`` is its socket's fd number."""
    args = list(sys.argv[1:] if argv is None else argv)
    gc.disable()  # no collection in the zygote: it would leave holes in shared pages
    # before anything imports onnxruntime: its telemetry thread would make forking unsafe
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    # why: after ORT_DISABLE_TELEMETRY is set (the instance stack may import onnxruntime),
    # and never in the service, which imports this module for ForkServer
    from infscaler.runtime.serving.instance import drop_capabilities, set_pdeathsig

    set_pdeathsig()
    drop_capabilities()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the service drains its instances first
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_name(b"infscaler-zygot")
    sock = socket.socket(fileno=int(args[0]))
    for name in BASE_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    threads = _settle_threads()
    _trim()
    cuda = cuda_libraries_mapped()
    if cuda:
        with contextlib.suppress(OSError):
            send_frame(sock, {"event": "hello", "ok": False, "error": cuda_error(cuda)})
        return 3
    if len(threads) != 1:
        with contextlib.suppress(OSError):
            send_frame(
                sock,
                {"event": "hello", "ok": False, "error": f"{len(threads)} threads: {threads}"},
            )
        return 3
    try:
        send_frame(sock, {"event": "hello", "ok": True, "pid": os.getpid(), "threads": 1})
        return _Zygote(sock).run()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the service went away (e.g. it stopped while we imported)
    except (OSError, ValueError) as exc:
        print(f"infscaler zygote: {exc}", file=sys.stderr)
        return 2


# -- the service's side ------------------------------------------------------------------------
class ForkedProcess:
    """A zygote-forked instance on a pidfd, with the :class:`subprocess.Popen` methods the
    supervisor uses; ``returncode`` stays None when the status is unknown.
    """

    args = "infscaler-zygote-fork"

    def __init__(self, pid: int, pidfd: int, server: _Generation) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.returncode: int | None = None
        self.exited = False
        self._gen = server
        self._status = threading.Event()
        self._lock = threading.Lock()

    def _set_status(self, status: int | None) -> None:
        self._code = status
        self._status.set()

    def _dead(self, timeout: float | None) -> bool:
        with self._lock:
            if self.exited:
                return True
            p = select.poll()
            p.register(self.pidfd, select.POLLIN)
        ms = None if timeout is None else max(0, int(timeout * 1000))
        return bool(p.poll(ms)) or self.exited

    def _finish(self) -> None:
        # the zygote reports the status right after the exit: wait for it briefly
        if not self._gen.dead.is_set():
            self._status.wait(2.0)
        with self._lock:
            if self.exited:
                return
            self.exited = True
            if self._status.is_set():
                self.returncode = getattr(self, "_code", None)
            with contextlib.suppress(OSError):
                os.close(self.pidfd)

    def poll(self) -> int | None:
        """The exit status once it exited (None: running, or exited with an unknown
        status: see :attr:`exited`)."""
        if self._dead(0):
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the exit; returns :attr:`returncode`; subprocess.TimeoutExpired after ``timeout``."""
        if not self._dead(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        self._finish()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """``pidfd_send_signal``; nothing once it exited; ProcessLookupError if it exits meanwhile."""
        with self._lock:
            if self.exited:
                return
            signal.pidfd_send_signal(self.pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if not self.exited:
                os.close(self.pidfd)


class _Generation:
    """One zygote process, as the service sees it."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.started = time.monotonic()
        self.ready = threading.Event()
        self.dead = threading.Event()
        self.hello: dict[str, Any] = {}
        self.waiting: dict[int, concurrent.futures.Future] = {}
        self.procs: dict[int, ForkedProcess] = {}
        self.send_lock = threading.Lock()
        self.forks = 0
        self.cuda_free_forks = 0

    @property
    def pid(self) -> int:
        return self.proc.pid


class ForkServer:
    """The service's handle on its zygote: starts it, forks instances through it, restarts it.

    Args:
        env: the environment of the zygote and its instances.
        spawn: runs a callable on the supervisor's long-lived spawn thread.
        ready_timeout_s: how long a fork waits for a starting zygote, s.
    """

    def __init__(
        self,
        env: dict[str, str],
        spawn: Callable[[Callable[[], Any]], Any],
        *,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.env = env
        self._spawn = spawn
        self.ready_timeout_s = ready_timeout_s
        self._lock = threading.Lock()
        self._gen: _Generation | None = None
        self._modules: list[str] = []
        self._next_id = 0
        self._closing = False
        self._fails = 0
        self._restart_timer: threading.Timer | None = None
        self.restarts = 0
        self.last_error: str | None = None

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Launch the zygote (returns once the process exists; it becomes ready in the
        background). Errors are logged: forks then fall back."""
        try:
            self._launch()
        except Exception as exc:  # noqa: BLE001 - the supervisor falls back to spawning
            self.last_error = f"cannot start the zygote: {exc}"
            log.warning("%s; instances start as fresh processes", self.last_error)

    def _launch(self) -> _Generation:

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = self._spawn(
                lambda: subprocess.Popen(
                    module_command("infscaler.runtime.processes.zygote", str(theirs.fileno())),
                    stdin=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    env=self.env,
                    close_fds=True,
                )
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        gen = _Generation(proc, ours)
        with self._lock:
            if self._closing:
                ours.close()
                proc.kill()
                proc.wait()
                raise ZygoteUnavailable("the supervisor is closing")
            self._gen = gen
            modules = list(self._modules)
        NamedThread(target=self._read, args=(gen,), name="isc-zygote", daemon=True).start()
        if modules:
            self._request(gen, {"op": "preload", "modules": modules}, wait=False)
        log.info("zygote started (pid %d)", proc.pid)
        return gen

    def close(self) -> None:
        """Stop the zygote (instances it forked are not touched)."""
        with self._lock:
            self._closing = True
            gen, self._gen = self._gen, None
            if self._restart_timer is not None:
                self._restart_timer.cancel()
        if gen is None:
            return
        if not gen.ready.is_set():
            # still importing (it reads its socket only after): it holds nothing yet
            with contextlib.suppress(OSError):
                gen.proc.kill()
        with contextlib.suppress(OSError):
            gen.sock.shutdown(socket.SHUT_RDWR)
        try:
            gen.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            gen.proc.kill()
            gen.proc.wait()
        gen.dead.wait(5.0)

    @property
    def pid(self) -> int | None:
        gen = self._gen
        return gen.pid if gen is not None and not gen.dead.is_set() else None

    def status(self) -> dict[str, Any]:
        """``enabled``, ``pid`` (None: down), ``ready``, ``restarts``, ``forks``,
        ``cuda_free_forks`` (forks made after the zygote checked it has no CUDA library
        mapped), ``modules`` (function modules preloaded), ``last_error``."""
        gen = self._gen
        alive = gen is not None and not gen.dead.is_set()
        return {
            "enabled": True,
            "pid": gen.pid if alive else None,
            "ready": bool(alive and gen.ready.is_set()),
            "restarts": self.restarts,
            "forks": gen.forks if gen is not None else 0,
            # forks the zygote made after checking it had no CUDA library mapped
            "cuda_free_forks": gen.cuda_free_forks if gen is not None else 0,
            "modules": list(self._modules),
            "last_error": self.last_error,
        }

    # -- requests --------------------------------------------------------------------------
    def _request(
        self, gen: _Generation, obj: dict[str, Any], fds: Sequence[int] = (), *, wait: bool = True
    ) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with gen.send_lock:
            with self._lock:
                self._next_id += 1
                rid = self._next_id
            gen.waiting[rid] = fut
            try:
                send_frame(gen.sock, {**obj, "id": rid}, fds)
            except OSError as exc:
                gen.waiting.pop(rid, None)
                raise ZygoteUnavailable(f"the zygote is gone ({exc})") from None
        return fut

    def _ready_generation(self) -> _Generation:
        gen = self._gen
        if gen is None or gen.dead.is_set():
            raise ZygoteUnavailable(
                "the zygote is not running" + (f" ({self.last_error})" if self.last_error else "")
            )
        if not gen.ready.wait(self.ready_timeout_s):
            # stuck in its imports: kill it (restarted with backoff) rather than have
            # every start wait this long
            with contextlib.suppress(OSError):
                gen.proc.kill()
            raise ZygoteUnavailable(f"the zygote was not ready within {self.ready_timeout_s} s")
        if gen.dead.is_set():
            raise ZygoteUnavailable(self.last_error or "the zygote died while starting")
        return gen

    def fork(
        self, spec: dict[str, Any], fds: Sequence[int], timeout: float = 60.0
    ) -> ForkedProcess:
        """Fork an instance serving ``spec`` with copies of ``fds`` (the caller closes its own).

        Raises:
            ZygoteUnavailable: not ready, refused, or no reply within ``timeout`` s.
        """
        gen = self._ready_generation()
        fut = self._request(gen, {"op": "fork", "spec": spec}, fds)
        try:
            reply, got = fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ZygoteUnavailable(f"no reply from the zygote in {timeout} s", sent=True) from None
        except ZygoteUnavailable as exc:
            exc.sent = True
            raise
        if not reply.get("ok"):
            for fd in got:
                os.close(fd)
            raise ZygoteUnavailable(f"the zygote refused: {reply.get('error')}")
        if not isinstance(got, ForkedProcess):  # a reply without the child's pidfd
            raise ZygoteUnavailable(f"the zygote's reply had no pidfd: {reply}", sent=True)
        gen.forks += 1
        return got  # the reader thread built it (registered before any exit report)

    def preload(self, modules: Sequence[str], timeout: float = 120.0) -> dict[str, str]:
        """Import ``modules`` in the zygote (again after a restart); ``{module: error}`` for failures."""
        new = [m for m in dict.fromkeys(modules) if m and m not in self._modules]
        if not new:
            return {}
        with self._lock:
            self._modules.extend(new)
        try:
            gen = self._ready_generation()
            reply, _ = self._request(gen, {"op": "preload", "modules": new}).result(timeout)
        except (ZygoteUnavailable, concurrent.futures.TimeoutError) as exc:
            return dict.fromkeys(new, f"not preloaded: {exc}")
        return dict(reply.get("errors") or {})

    # -- the reader thread -----------------------------------------------------------------
    def _read(self, gen: _Generation) -> None:
        reader = FrameReader(gen.sock)
        try:
            while True:
                try:
                    frames = reader.read()
                except (OSError, ValueError) as exc:
                    log.warning("zygote %d: %s", gen.pid, exc)
                    frames = None
                if frames is None:
                    break
                for obj, fds in frames:
                    self._on_frame(gen, obj, fds)
        finally:
            reader.close_fds()
            self._on_death(gen)

    def _on_frame(self, gen: _Generation, obj: dict[str, Any], fds: list[int]) -> None:
        if obj.get("event") == "hello":
            gen.hello = obj
            if obj.get("ok"):
                gen.ready.set()
                log.info("zygote %d ready", gen.pid)
            else:
                self.last_error = f"the zygote refused to serve: {obj.get('error')}"
                log.warning("%s", self.last_error)
            return
        if obj.get("event") == "exit":
            proc = gen.procs.pop(int(obj.get("pid") or 0), None)
            if proc is not None:
                proc._set_status(obj.get("status"))
            return
        fut = gen.waiting.pop(obj.get("reply"), None)
        result: Any = fds
        if obj.get("ok") and "pid" in obj and fds:
            gen.cuda_free_forks += bool(obj.get("cuda_free"))
            proc = ForkedProcess(int(obj["pid"]), fds[0], gen)
            gen.procs[proc.pid] = proc
            result = proc
        for name, err in (obj.get("errors") or {}).items():
            # not imported: a restarted zygote must not try again (nor die again)
            with self._lock:
                if name in self._modules:
                    self._modules.remove(name)
            log.warning("zygote: %s not preloaded: %s", name, err)
        if fut is None:
            # a fork whose caller gave up (timeout): that instance must not run
            if isinstance(result, ForkedProcess):
                with contextlib.suppress(ProcessLookupError):
                    result.kill()
            return
        fut.set_result((obj, result))

    def _on_death(self, gen: _Generation) -> None:
        gen.dead.set()
        gen.ready.set()  # wake waiters; they see dead
        for fut in list(gen.waiting.values()):
            fut.set_exception(ZygoteUnavailable("the zygote died", sent=True))
        gen.waiting.clear()
        for proc in list(gen.procs.values()):
            proc._status.set()  # unknown status from now on
        with contextlib.suppress(OSError):
            gen.sock.close()
        try:
            code = gen.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            gen.proc.kill()
            code = gen.proc.wait()
        with self._lock:
            if self._gen is gen:
                self._gen = None
            if self._closing:
                return
            lived = time.monotonic() - gen.started
            self._fails = self._fails + 1 if lived < 10.0 else 1
            delay = min(30.0, 0.1 * 2 ** (self._fails - 1))
            self.last_error = f"the zygote (pid {gen.pid}) exited with status {code}"
            self._restart_timer = threading.Timer(delay, self._restart)
            self._restart_timer.daemon = True
            self._restart_timer.start()
        log.warning("%s; restarting it in %.1f s", self.last_error, delay)

    def _restart(self) -> None:
        with self._lock:
            if self._closing:
                return
        try:
            self._launch()
            self.restarts += 1
        except Exception as exc:  # noqa: BLE001 - retried after a longer delay
            self.last_error = f"cannot restart the zygote: {exc}"
            with self._lock:
                if self._closing:
                    return
                self._fails += 1
                delay = min(30.0, 0.1 * 2 ** (self._fails - 1))
                self._restart_timer = threading.Timer(delay, self._restart)
                self._restart_timer.daemon = True
                self._restart_timer.start()
            log.error("%s; trying again in %.1f s", self.last_error, delay)


if __name__ == "__main__":
    sys.exit(main())
