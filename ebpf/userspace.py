"""The user-space control channel: the eBPF channel's behaviour without CAP_BPF, over
AF_UNIX SOCK_SEQPACKET pairs and one event-driven router thread.

More: docs/architecture.md, "`ebpf/userspace.py`".
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import threading
import zlib
from collections import deque
from collections.abc import Iterable
from typing import Any

from infscaler.base.threads import NamedThread
from infscaler.ebpf.channel import (
    MAX_BATCH,
    MAX_HOPS,
    MAX_PER_HOP,
    MAX_TRACKED,
    REJECT_REASONS,
    Channel,
    Endpoint,
    build_stats,
)
from infscaler.ebpf.errors import ChannelClosed, ChannelError
from infscaler.ebpf.token import TOKEN_MAGIC, TOKEN_SIZE, Token, TokenKind

_FRAME = struct.Struct("<BBHHHIIIQI")
_DATA, _FREE = int(TokenKind.DATA), int(TokenKind.FREE)
_RECORD = MAX_BATCH * TOKEN_SIZE
_READ_BUDGET = 32  # records read from one socket per wake-up (fairness)
_CMD_TIMEOUT_S = 10.0
_ROUTE_SRC = -1  # cursor key of the manager's route()


class _Future:
    def __init__(self) -> None:
        self._ev = threading.Event()
        self._value: Any = None
        self._exc: BaseException | None = None

    def set(self, value: Any = None, exc: BaseException | None = None) -> None:
        self._value, self._exc = value, exc
        self._ev.set()

    def result(self, timeout: float = _CMD_TIMEOUT_S) -> Any:
        if not self._ev.wait(timeout):
            raise ChannelError(f"the token router did not answer within {timeout} s")
        if self._exc is not None:
            raise self._exc
        return self._value


class _Dest:
    """A socket the router writes records to, with an outbox for when it is full."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.batch = bytearray()  # frames of the current router iteration
        self.outbox: deque[bytes] = deque()  # records the socket could not take yet
        self.open = True
        self.want_write = False


class _UInst(_Dest):
    def __init__(self, sock: socket.socket, instance: int, hop: int, index: int) -> None:
        super().__init__(sock)
        self.instance = instance
        self.hop = hop
        self.index = index
        self.live = True  # routable
        self.inflight: dict[int, bytes] = {}  # request -> frame
        self.delivered = 0
        self.acked = 0


class UserspaceChannel(Channel):
    """:class:`~infscaler.ebpf.channel.Channel` over SEQPACKET and a router thread."""

    kind = "userspace"

    def __init__(self, policy: str = "least-loaded") -> None:
        super().__init__(policy)
        self._ll = policy == "least-loaded"
        self._lock = threading.Lock()
        self._cmds: deque[tuple[Any, ...]] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        mgr_router, mgr_user = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mgr_router.setblocking(False)
        self._mgr = _Dest(mgr_router)
        self._mgr_ep = Endpoint(mgr_user)
        self._recv_lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._by_fd: dict[int, _UInst] = {}
        self._insts: dict[int, _UInst] = {}
        self._slots: dict[int, list[_UInst | None]] = {}
        self._registered: set[int] = set()
        self._cursor: dict[tuple[int, int], int] = {}
        self._tracked = 0
        self._dirty: list[_Dest] = []
        self._history: dict[int, dict[str, Any]] = {}
        self._c = {
            k: 0
            for k in (
                "delivered",
                "acked",
                "to_manager",
                "direct",
                "no_instance",
                "inflight_full",
                "inflight_duplicate",
                "dead_letters",
                *REJECT_REASONS,
            )
        }
        self._rx = bytearray(256 * 1024)  # > the largest SEQPACKET record (wmem_max)
        self._rxv = memoryview(self._rx)
        self._closed = False
        self._stopping = False
        self._thread = NamedThread(target=self._run, name="isc-router", daemon=True)
        self._thread.start()

    # -- API (any thread) --------------------------------------------------------------------
    def _command(self, *cmd: Any) -> None:
        if self._closed:
            raise ChannelClosed("channel closed")
        self._cmds.append(cmd)
        with contextlib.suppress(BlockingIOError):  # full: wake-ups are pending anyway
            os.write(self._wake_w, b"\0")

    def _call(self, *cmd: Any) -> Any:
        fut = _Future()
        self._command(*cmd, fut)
        return fut.result()

    def add_instance(self, hop: int, instance: int, *, live: bool = True) -> socket.socket:
        with self._lock:
            self._check_new(hop, instance)
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            mine.setblocking(False)
            try:
                self._call("add", mine, hop, instance, live)
            except BaseException:
                mine.close()
                theirs.close()
                raise
            self._hop_of[instance] = hop
            return theirs

    def set_live(self, instance: int) -> None:
        with self._lock:
            self._check_known(instance)
            self._call("live", instance)

    def remove_instance(self, instance: int) -> list[Token]:
        with self._lock:
            self._check_known(instance)
            frames = self._call("remove", instance)
            del self._hop_of[instance]
            return [Token.unpack(f) for f in frames]

    def manager_recv_bytes(
        self, max_tokens: int = MAX_BATCH, timeout: float | None = None
    ) -> bytes:
        with self._recv_lock:
            if self._closed:
                raise ChannelClosed("channel closed")
            try:
                return self._mgr_ep.recv_bytes(max_tokens, timeout)
            except OSError:  # closed under us
                raise ChannelClosed("channel closed") from None

    def manager_send_bytes(self, instance: int, data: bytes) -> None:
        self._check_known(instance)
        self._check_addressed(instance, data)
        self._command("send", instance, bytes(data))

    def route_many(self, tokens: Iterable[Token]) -> None:
        self._command("route", self._pack_route(tokens))

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(ChannelError):
                self._call("close")
            self._closed = True
            self._thread.join(timeout=_CMD_TIMEOUT_S)
            for inst in list(self._insts.values()):
                inst.sock.close()
            self._mgr.sock.close()  # a manager_recv() blocked on the other end sees EOF
            got = self._recv_lock.acquire(timeout=5)
            try:
                self._mgr_ep.close()
            finally:
                if got:
                    self._recv_lock.release()
            self._sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- router thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            for key, events in self._sel.select():
                inst = key.data
                if inst is None:
                    self._drain_wake()
                    self._do_commands()
                    continue
                if events & selectors.EVENT_WRITE:
                    self._flush(inst)
                if events & selectors.EVENT_READ and isinstance(inst, _UInst) and inst.open:
                    self._read(inst)
            self._flush_dirty()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _do_commands(self) -> None:
        while self._cmds:
            cmd = self._cmds.popleft()
            op = cmd[0]
            fut = cmd[-1] if isinstance(cmd[-1], _Future) else None
            try:
                if op == "send":
                    self._direct(cmd[1], cmd[2])
                elif op == "route":
                    self._process(None, memoryview(cmd[1]), len(cmd[1]))
                elif op == "add":
                    self._add(*cmd[1:5])
                    fut.set()
                elif op == "live":
                    inst = self._insts.get(cmd[1])
                    if inst is not None and inst.open:  # never revive one at EOF
                        inst.live = True
                    fut.set()
                elif op == "remove":
                    fut.set(self._remove(cmd[1]))
                elif op == "stats":
                    fut.set(self._stats())
                elif op == "close":
                    self._stopping = True
                    fut.set()
            except Exception as exc:  # a router bug must not kill the router silently
                if fut is not None:
                    fut.set(exc=exc)
                else:
                    raise

    def _add(self, sock: socket.socket, hop: int, instance: int, live: bool = True) -> None:
        slots = self._slots.setdefault(hop, [None] * MAX_PER_HOP)
        free = [i for i, s in enumerate(slots) if s is None]
        if not free:
            raise ChannelError(f"hop {hop} already has {MAX_PER_HOP} instances")
        inst = _UInst(sock, instance, hop, free[0])
        inst.live = live
        slots[free[0]] = inst
        self._insts[instance] = inst
        self._by_fd[inst.fd] = inst
        self._registered.add(hop)
        self._sel.register(inst.fd, selectors.EVENT_READ, inst)

    def _remove(self, instance: int) -> list[bytes]:
        inst = self._insts.pop(instance)
        self._slots[inst.hop][inst.index] = None
        self._by_fd.pop(inst.fd, None)
        if inst.open:
            self._sel.unregister(inst.fd)
            inst.open = False
        inst.sock.close()
        frames = list(inst.inflight.values())
        self._tracked -= len(frames)
        self._history[instance] = {
            "stage": inst.hop,
            "live": False,
            "delivered": inst.delivered,
            "acked": inst.acked,
            "inflight": 0,
            "reclaimed": len(frames),
        }
        return frames

    def _closed_socket(self, inst: _UInst) -> None:
        """EOF or error on an instance socket: it is gone; keep its in-flight tokens."""
        if not inst.open:
            return
        inst.open = False
        inst.live = False
        inst.want_write = False
        self._sel.unregister(inst.fd)
        # queued DATA stays tracked (remove_instance returns it); the rest is lost mail
        for rec in (*inst.outbox, bytes(inst.batch)):
            for off in range(0, len(rec), TOKEN_SIZE):
                if rec[off + 1] != _DATA:
                    self._c["dead_letters"] += 1
        inst.outbox.clear()
        inst.batch.clear()

    def _read(self, inst: _UInst) -> None:
        for _ in range(_READ_BUDGET):
            try:
                n, _, flags, _ = inst.sock.recvmsg_into([self._rx])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._closed_socket(inst)
                return
            if n == 0:
                self._closed_socket(inst)
                return
            if flags & socket.MSG_TRUNC:  # cannot happen below wmem_max; count, skip
                self._c["short"] += 1
                continue
            self._process(inst, self._rxv, n)

    def _process(self, src: _UInst | None, view: memoryview, n: int) -> None:
        """Route the frames of one record (src None: the manager's route())."""
        c = self._c
        full = n - n % TOKEN_SIZE
        if full < n:
            c["short"] += 1
        unpack = _FRAME.unpack_from
        crc32 = zlib.crc32
        for off in range(0, full, TOKEN_SIZE):
            magic, kind, hop, _, _, _, _, _, request, check = unpack(view, off)
            if magic != TOKEN_MAGIC:
                c["bad_magic"] += 1
                continue
            if crc32(view[off : off + 28]) != check:
                c["bad_crc"] += 1
                continue
            if not 1 <= kind <= 6:
                c["bad_kind"] += 1
                continue
            frame = bytes(view[off : off + TOKEN_SIZE])
            if (
                src is not None
                and kind in (_DATA, _FREE)
                and src.inflight.pop(request, None) is not None
            ):
                src.acked += 1  # the acknowledgement rule of the module docstring
                c["acked"] += 1
                self._tracked -= 1
            if kind != _DATA:
                self._to_manager(frame)
                continue
            self._route_data(src, hop, request, frame)

    def _route_data(self, src: _UInst | None, hop: int, request: int, frame: bytes) -> None:
        c = self._c
        if hop >= MAX_HOPS or hop not in self._registered:
            c["unknown_stage"] += 1
            self._to_manager(frame)
            return
        slots = self._slots[hop]
        key = (src.instance if src is not None else _ROUTE_SRC, hop)
        cur = self._cursor.get(key, 0)
        chosen: _UInst | None = None
        best = 1 << 62
        for i in range(MAX_PER_HOP):
            inst = slots[(cur + i) % MAX_PER_HOP]
            if inst is None or not inst.live:
                continue
            if not self._ll:
                chosen = inst
                break
            load = len(inst.inflight)
            if load < best:
                best, chosen = load, inst
        if chosen is None:
            c["no_instance"] += 1
            self._to_manager(frame)
            return
        self._cursor[key] = (chosen.index + 1) % MAX_PER_HOP
        self._deliver(chosen, request, frame)

    def _deliver(self, inst: _UInst, request: int, frame: bytes) -> None:
        c = self._c
        if request in inst.inflight:
            c["inflight_duplicate"] += 1
            self._to_manager(frame)
            return
        if self._tracked >= MAX_TRACKED:
            c["inflight_full"] += 1
            self._to_manager(frame)
            return
        inst.inflight[request] = frame
        self._tracked += 1
        inst.delivered += 1
        c["delivered"] += 1
        if inst.open:
            self._queue(inst, frame)

    def _direct(self, instance: int, data: bytes) -> None:
        inst = self._insts.get(instance)
        for off in range(0, len(data), TOKEN_SIZE):
            frame = data[off : off + TOKEN_SIZE]
            if inst is None:
                self._c["dead_letters"] += 1
                continue
            if frame[1] == _DATA:
                self._deliver(inst, _FRAME.unpack_from(frame)[8], frame)
            elif inst.open:
                self._queue(inst, frame)
            else:
                self._c["dead_letters"] += 1
                continue
            self._c["direct"] += 1

    def _to_manager(self, frame: bytes) -> None:
        self._c["to_manager"] += 1
        self._queue(self._mgr, frame)

    def _queue(self, dest: _Dest, frame: bytes) -> None:
        if not dest.batch:
            self._dirty.append(dest)
        dest.batch += frame

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        for dest in dirty:
            if dest.batch:
                data = bytes(dest.batch)
                dest.batch.clear()
                for off in range(0, len(data), _RECORD):
                    dest.outbox.append(data[off : off + _RECORD])
            self._flush(dest)

    def _flush(self, dest: _Dest) -> None:
        if not dest.open:
            return
        while dest.outbox:
            try:
                dest.sock.send(dest.outbox[0])
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                if isinstance(dest, _UInst):
                    self._closed_socket(dest)
                else:
                    dest.outbox.clear()  # the manager's own end closed: shutting down
                return
            dest.outbox.popleft()
        want = bool(dest.outbox)
        if want != dest.want_write:
            dest.want_write = want
            ev = selectors.EVENT_WRITE | (selectors.EVENT_READ if isinstance(dest, _UInst) else 0)
            if dest is self._mgr:
                if want:
                    self._sel.register(dest.fd, selectors.EVENT_WRITE, dest)
                else:
                    self._sel.unregister(dest.fd)
            else:
                self._sel.modify(dest.fd, ev if want else selectors.EVENT_READ, dest)

    def _stats(self) -> dict[str, Any]:
        c = self._c
        insts: dict[int, dict[str, Any]] = dict(self._history)
        for inst in self._insts.values():
            insts[inst.instance] = {
                "stage": inst.hop,
                "live": inst.live,
                "delivered": inst.delivered,
                "acked": inst.acked,
                "inflight": len(inst.inflight),
            }
        rejected = {k: c[k] for k in REJECT_REASONS}
        return build_stats(self.kind, self.policy, {**c, "redirect_failed": 0}, rejected, insts)
