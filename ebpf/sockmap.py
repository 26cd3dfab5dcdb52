"""The eBPF control channel: a SOCKMAP of TCP loopback sockets and the SK_MSG program
``tokenbus.bpf.c`` routing each token in the kernel (InfScaler §IV-B).

SOCKMAP keys: ``hop * 16 + index`` (instances); ``MGR_IN_KEY`` (the manager's ingress);
``TRASH_KEY`` (rejected bytes: SK_DROP is sticky); ``MGR_ROUTE_KEY`` / ``MGR_DIRECT_KEY``
(the manager's sending sockets).

Sources: kernel Documentation/bpf/map_sockmap.rst, net/ipv4/tcp_bpf.c, shared/notes/ebpf.md.
More: docs/architecture.md, "`ebpf/sockmap.py`".
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infscaler.ebpf import build, libbpf
from infscaler.ebpf.channel import (
    MAX_BATCH,
    MAX_HOPS,
    MAX_INSTANCE_ID,
    MAX_PER_HOP,
    MAX_TRACKED,
    REJECT_REASONS,
    Channel,
    Endpoint,
    build_stats,
)
from infscaler.ebpf.errors import ChannelClosed, ChannelError, EbpfUnavailableError
from infscaler.ebpf.token import Token

SLOTS = MAX_HOPS * MAX_PER_HOP
MGR_IN_KEY = SLOTS
TRASH_KEY = SLOTS + 1
MGR_ROUTE_KEY = SLOTS + 2
MGR_DIRECT_KEY = SLOTS + 3
ROLE_NONE, ROLE_INSTANCE, ROLE_MGR_ROUTE, ROLE_MGR_DIRECT = 0, 1, 2, 3
POLICY_CODES = {"round-robin": 0, "least-loaded": 1}
#: Seconds a removed instance's socket stays in the map (not routable) before it is closed.
ZOMBIE_GRACE_S = 1.0
PROGRAM = "tokenbus_verdict"

#: Counter indexes of tokenbus.bpf.c (enum C_*).
COUNTERS = {
    "delivered": 0,
    "direct": 1,
    "to_manager": 2,
    "acked": 3,
    "bad_magic": 4,
    "bad_crc": 5,
    "bad_kind": 6,
    "short": 7,
    "unknown_stage": 8,
    "no_instance": 9,
    "redirect_failed": 10,
    "inflight_full": 11,
    "inflight_duplicate": 12,
    "direct_unknown": 13,
    "unregistered": 14,
    "pull_failed": 15,
    "dropped": 16,
    "pulled": 17,
}
N_COUNTERS = 32

assert build.LIMITS == {
    "TB_MAX_STAGES": MAX_HOPS,
    "TB_PER_STAGE": MAX_PER_HOP,
    "TB_MAX_TRACKED": MAX_TRACKED,
}

_u32, _u64, _s64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64


class _Shared(ctypes.Structure):
    """Mirror of ``struct tb_shared`` (the program's .bss, mmap()ed)."""

    _fields_ = [
        ("policy", _u32),
        ("pad0", _u32),
        ("live_mask", _u32 * MAX_HOPS),
        ("registered", _u32 * MAX_HOPS),
        ("slot_instance", _u32 * SLOTS),
        ("slot_inflight", _s64 * SLOTS),
        ("slot_delivered", _u64 * SLOTS),
        ("slot_acked", _u64 * SLOTS),
        ("inst_slot", _u32 * (MAX_INSTANCE_ID + 1)),
        ("counters", _u64 * N_COUNTERS),
    ]


class _SockInfo(ctypes.Structure):
    _fields_ = [
        ("instance", _u32),
        ("role", _u32),
        ("slot", _u32),
        ("pad", _u32),
        ("cursor", ctypes.c_uint8 * MAX_HOPS),
    ]


class _TrackKey(ctypes.Structure):
    _fields_ = [("request", _u64), ("instance", _u32), ("pad", _u32)]


class _TokenBytes(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint8 * 32)]


@dataclass
class _Inst:
    instance: int
    hop: int
    index: int
    slot: int
    sock: socket.socket  # the instance side (the manager's copy keeps it in the map)
    peer: socket.socket  # the manager side of the TCP connection


class EbpfChannel(Channel):
    """:class:`~infscaler.ebpf.channel.Channel` on a SOCKMAP + SK_MSG program.

    Raises:
        EbpfUnavailableError: the object cannot be built, loaded or attached.
    """

    kind = "ebpf"

    def __init__(self, policy: str = "least-loaded") -> None:
        super().__init__(policy)
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._inst: dict[int, _Inst] = {}
        self._zombies: list[tuple[float, _Inst]] = []
        self._history: dict[int, dict[str, Any]] = {}
        self._socks: list[socket.socket] = []
        self._closed = False
        try:
            path = build.build_object()
            self._obj = libbpf.BpfObject(str(path))
        except libbpf.BpfError as exc:
            raise EbpfUnavailableError(f"cannot load the eBPF object: {exc}") from None
        try:
            self._setup()
        except BaseException:
            self._teardown()
            raise

    def _setup(self) -> None:
        obj = self._obj
        try:
            self._prog_fd = obj.program_fd(PROGRAM)
            self._socks_fd = obj.map_fd("socks")
            self._info_fd = obj.map_fd("sock_info")
            self._tracked_fd = obj.map_fd("tracked")
            bss_fd = obj.map_fd(".bss")
            size = obj.map_value_size(".bss")
        except libbpf.BpfError as exc:
            raise EbpfUnavailableError(f"eBPF object incomplete: {exc}") from None
        if size != ctypes.sizeof(_Shared):
            raise EbpfUnavailableError(
                f"eBPF object .bss is {size} bytes, expected {ctypes.sizeof(_Shared)}: "
                "tokenbus.bpf.c and sockmap.py disagree"
            )
        page = mmap.PAGESIZE
        self._mm = mmap.mmap(bss_fd, (size + page - 1) // page * page, mmap.MAP_SHARED)
        self._sh: _Shared | None = _Shared.from_buffer(self._mm)
        self._sh.policy = POLICY_CODES[self.policy]
        try:
            # pitfall 1: attach before inserting any socket
            libbpf.prog_attach(self._prog_fd, self._socks_fd)
        except libbpf.BpfError as exc:
            raise EbpfUnavailableError(f"cannot attach the SK_MSG verdict: {exc}") from None
        self._attached = True
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._socks.append(self._listener)
        mgr_in, _ = self._pair(MGR_IN_KEY, ROLE_NONE)
        trash, _ = self._pair(TRASH_KEY, ROLE_NONE)
        route, _ = self._pair(MGR_ROUTE_KEY, ROLE_MGR_ROUTE)
        direct, _ = self._pair(MGR_DIRECT_KEY, ROLE_MGR_DIRECT)
        self._in_ep = Endpoint(mgr_in)
        self._trash = trash
        self._trash.setblocking(False)
        self._route_ep = Endpoint(route)
        self._direct_ep = Endpoint(direct)
        self._trash_bytes = 0
        self._poll = select.poll()
        self._poll.register(mgr_in.fileno(), select.POLLIN)
        self._poll.register(trash.fileno(), select.POLLIN)

    def _connect(self) -> tuple[socket.socket, socket.socket]:
        """A connected TCP pair over 127.0.0.1 (pitfall 2: only connected TCP sockets
        go into a sockmap). The accepted end must be ours: another local process could
        connect to the listener too."""
        a = socket.create_connection(self._listener.getsockname(), timeout=5)
        self._listener.settimeout(5)
        while True:
            b, addr = self._listener.accept()
            if addr == a.getsockname():
                break
            b.close()  # not ours
        b.settimeout(None)
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.settimeout(None)
        return a, b

    def _set_info(self, sock: socket.socket, role: int, instance: int = 0, slot: int = 0) -> None:
        info = _SockInfo(instance=instance, role=role, slot=slot)
        libbpf.map_update(self._info_fd, ctypes.c_int(sock.fileno()), info)

    def _insert(self, key: int, sock: socket.socket) -> None:
        libbpf.map_update(self._socks_fd, _u32(key), _u64(sock.fileno()))

    def _pair(self, key: int, role: int) -> tuple[socket.socket, socket.socket]:
        a, b = self._connect()
        self._socks += [a, b]
        if role != ROLE_NONE:
            self._set_info(a, role)
        self._insert(key, a)
        return a, b

    # -- membership ------------------------------------------------------------------------
    def add_instance(self, hop: int, instance: int, *, live: bool = True) -> socket.socket:
        with self._lock:
            self._check_open()
            self._reap(force=False)
            self._check_new(hop, instance)
            sh = self._shared()
            used = {i.index for i in self._inst.values() if i.hop == hop}
            used |= {z.index for _, z in self._zombies if z.hop == hop}
            free = [i for i in range(MAX_PER_HOP) if i not in used]
            if not free:  # reuse slots of removed instances early
                self._reap(force=True, hop=hop)
                used = {i.index for i in self._inst.values() if i.hop == hop}
                free = [i for i in range(MAX_PER_HOP) if i not in used]
            if not free:
                raise ChannelError(f"hop {hop} already has {MAX_PER_HOP} instances")
            index = free[0]
            slot = hop * MAX_PER_HOP + index
            a, b = self._connect()
            try:
                self._set_info(a, ROLE_INSTANCE, instance, slot)
                sh.slot_instance[slot] = instance
                sh.slot_inflight[slot] = 0
                sh.slot_delivered[slot] = 0
                sh.slot_acked[slot] = 0
                self._insert(slot, a)
            except BaseException:
                a.close()
                b.close()
                raise
            sh.inst_slot[instance] = slot + 1
            sh.registered[hop] = 1
            if live:
                sh.live_mask[hop] |= 1 << index
            self._inst[instance] = _Inst(instance, hop, index, slot, a, b)
            self._hop_of[instance] = hop
            return a.dup()

    def set_live(self, instance: int) -> None:
        with self._lock:
            self._check_open()
            self._check_known(instance)
            inst = self._inst[instance]
            self._shared().live_mask[inst.hop] |= 1 << inst.index

    def remove_instance(self, instance: int) -> list[Token]:
        with self._lock:
            self._check_open()
            self._check_known(instance)
            inst = self._inst.pop(instance)
            del self._hop_of[instance]
            sh = self._shared()
            sh.live_mask[inst.hop] &= ~(1 << inst.index)
            sh.inst_slot[instance] = 0
            if not libbpf.synchronize_rcu():
                time.sleep(0.05)  # no membarrier: a generous grace period instead
            reclaimed: list[Token] = []
            for key, value in libbpf.map_items(self._tracked_fd, _TrackKey, _TokenBytes):
                if key.instance == instance:
                    reclaimed.append(Token.unpack(bytes(value.b)))
                    libbpf.map_delete(self._tracked_fd, key)
            self._history[instance] = {
                "stage": inst.hop,
                "live": False,
                "delivered": int(sh.slot_delivered[inst.slot]),
                "acked": int(sh.slot_acked[inst.slot]),
                "inflight": 0,
                "reclaimed": len(reclaimed),
            }
            sh.slot_inflight[inst.slot] = 0
            inst.peer.close()  # the instance sees EOF once its queue is empty
            self._zombies.append((time.monotonic() + ZOMBIE_GRACE_S, inst))
            self._reap(force=False)
            return reclaimed

    def _reap(self, force: bool, hop: int | None = None) -> None:
        """Close removed instances' sockets whose grace has passed (or all of ``hop``'s)."""
        now = time.monotonic()
        keep = []
        for deadline, z in self._zombies:
            if now >= deadline or (force and z.hop == hop):
                libbpf.map_delete(self._socks_fd, _u32(z.slot))
                z.sock.close()
            else:
                keep.append((deadline, z))
        self._zombies = keep

    # -- manager traffic --------------------------------------------------------------------
    def manager_recv_bytes(
        self, max_tokens: int = MAX_BATCH, timeout: float | None = None
    ) -> bytes:
        with self._recv_lock:
            self._check_open()
            deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
            while True:
                try:
                    data = self._in_ep.recv_bytes(max_tokens, timeout=0)
                except (ChannelClosed, OSError):
                    raise ChannelClosed("channel closed") from None
                if data:
                    return data
                ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                if ms == 0:
                    return b""
                ready = self._poll.poll(ms)
                if self._closed:
                    raise ChannelClosed("channel closed")
                for fd, _ in ready:
                    if fd == self._trash.fileno():
                        self._drain_trash()

    def _drain_trash(self) -> None:
        while True:
            try:
                data = self._trash.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            self._trash_bytes += len(data)

    def manager_send_bytes(self, instance: int, data: bytes) -> None:
        self._check_known(instance)
        self._check_addressed(instance, data)
        with self._send_lock:
            self._check_open()
            self._direct_ep.send_bytes(data, timeout=10)

    def route_many(self, tokens: Iterable[Token]) -> None:
        data = self._pack_route(tokens)
        with self._send_lock:
            self._check_open()
            self._route_ep.send_bytes(data, timeout=10)

    # -- introspection ----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._check_open()
            self._drain_trash()
            sh = self._shared()
            c = {name: int(sh.counters[i]) for name, i in COUNTERS.items()}
            insts: dict[int, dict[str, Any]] = dict(self._history)
            for inst in self._inst.values():
                insts[inst.instance] = {
                    "stage": inst.hop,
                    "live": True,
                    "delivered": int(sh.slot_delivered[inst.slot]),
                    "acked": int(sh.slot_acked[inst.slot]),
                    "inflight": int(sh.slot_inflight[inst.slot]),
                }
            rejected = {k: c[k] for k in REJECT_REASONS}
            rejected["short"] += c["pull_failed"]
            counters = {**c, "dead_letters": c["direct_unknown"] + c["dropped"]}
            return build_stats(
                self.kind,
                self.policy,
                counters,
                rejected,
                insts,
                unregistered=c["unregistered"],
                pulled=c["pulled"],
                trash_bytes=self._trash_bytes,
            )

    # -- lifecycle ---------------------------------------------------------------------------
    def _shared(self) -> _Shared:
        if self._sh is None:
            raise ChannelClosed("channel closed")
        return self._sh

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosed("channel closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            # wake a manager_recv() blocked in poll, and wait for it to leave
            in_ep = getattr(self, "_in_ep", None)
            if in_ep is not None:
                with contextlib.suppress(OSError):
                    in_ep.socket.shutdown(socket.SHUT_RDWR)
            got = self._recv_lock.acquire(timeout=5)
            try:
                self._teardown()
            finally:
                if got:
                    self._recv_lock.release()

    def _teardown(self) -> None:
        if getattr(self, "_attached", False):
            with contextlib.suppress(libbpf.BpfError):
                libbpf.prog_detach(self._prog_fd, self._socks_fd)
            self._attached = False
        for inst in list(self._inst.values()):
            inst.sock.close()
            inst.peer.close()
        for _, z in self._zombies:
            z.sock.close()
        self._inst.clear()
        self._zombies.clear()
        for s in self._socks:
            s.close()
        self._socks.clear()
        self._sh = None
        mm = getattr(self, "_mm", None)
        if mm is not None:
            mm.close()
            self._mm = None
        obj = getattr(self, "_obj", None)
        if obj is not None:
            obj.close()
            self._obj = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
