"""Thin ctypes binding to libbpf.so.1 (loaded on first use) plus the raw ``bpf(2)`` and
``membarrier(2)`` syscalls; every failure raises :class:`BpfError` with its errno.

Sources: libbpf 1.1 ``libbpf.h`` / ``bpf.h``, kernel ``include/uapi/linux/bpf.h``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import platform
from collections import deque
from typing import Any

log = logging.getLogger("infscaler.ebpf.libbpf")
#: The last lines libbpf printed (warnings, verifier log tail), quoted in load errors.
recent: deque[str] = deque(maxlen=12)

# include/uapi/linux/bpf.h
BPF_MAP_CREATE = 0
BPF_MAP_TYPE_SOCKMAP = 15
BPF_SK_MSG_VERDICT = 7
BPF_ANY = 0

# membarrier(2)
MEMBARRIER_CMD_QUERY = 0
MEMBARRIER_CMD_GLOBAL = 1

_SYSCALLS = {  # (bpf, membarrier) per machine
    "x86_64": (321, 324),
    "aarch64": (280, 283),
    "arm64": (280, 283),
}

_c = ctypes
_vp = _c.c_void_p


class BpfError(OSError):
    """A bpf() / libbpf call failed; ``errno`` says why (EPERM: missing CAP_BPF)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall_numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in _SYSCALLS:
        raise BpfError(errno.ENOSYS, f"no bpf syscall number known for {machine}")
    return _SYSCALLS[machine]


def probe_sockmap() -> None:
    """Create (and close) a 1-entry SOCKMAP with ``bpf(BPF_MAP_CREATE)``: the capability probe.

    Raises:
        BpfError: EPERM (no CAP_BPF + CAP_NET_ADMIN), EINVAL (no sockmaps), ENOSYS.
    """
    nr_bpf, _ = _syscall_numbers()
    attr = (_c.c_uint32 * 32)()  # union bpf_attr, zeroed (128 bytes is enough)
    attr[0] = BPF_MAP_TYPE_SOCKMAP  # map_type
    attr[1] = 4  # key_size
    attr[2] = 4  # value_size
    attr[3] = 1  # max_entries
    libc = _libc()
    libc.syscall.restype = _c.c_long
    fd = libc.syscall(
        _c.c_long(nr_bpf), _c.c_long(BPF_MAP_CREATE), attr, _c.c_uint(_c.sizeof(attr))
    )
    if fd < 0:
        err = _c.get_errno()
        raise BpfError(err, f"bpf(BPF_MAP_CREATE, SOCKMAP) failed: {os.strerror(err)}")
    os.close(fd)


def synchronize_rcu() -> bool:
    """Wait for an RCU grace period (``membarrier(MEMBARRIER_CMD_GLOBAL)`` calls
    ``synchronize_rcu()``): every BPF program run that started before has ended. False
    when membarrier is unavailable (e.g. nohz_full): the caller sleeps instead."""
    _, nr_mb = _syscall_numbers()
    libc = _libc()
    libc.syscall.restype = _c.c_long
    supported = libc.syscall(_c.c_long(nr_mb), _c.c_long(MEMBARRIER_CMD_QUERY), _c.c_long(0))
    if supported < 0 or not supported & MEMBARRIER_CMD_GLOBAL:
        return False
    return libc.syscall(_c.c_long(nr_mb), _c.c_long(MEMBARRIER_CMD_GLOBAL), _c.c_long(0)) == 0


_PRINT_FN = _c.CFUNCTYPE(_c.c_int, _c.c_int, _c.c_char_p, _vp)
_lib: ctypes.CDLL | None = None
_print_cb: Any = None  # keep the callback alive


def load_libbpf() -> ctypes.CDLL:
    """Open libbpf.so.1 once; BpfError ENOENT when libbpf1 is not installed."""
    global _lib, _print_cb
    if _lib is not None:
        return _lib
    name = "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        found = ctypes.util.find_library("bpf")
        if not found:
            raise BpfError(
                errno.ENOENT, "libbpf.so.1 not found (apt-get install libbpf1)"
            ) from None
        lib = ctypes.CDLL(found, use_errno=True)
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "bpf_object__open_file": (_vp, [_c.c_char_p, _vp]),
        "bpf_object__load": (_c.c_int, [_vp]),
        "bpf_object__close": (None, [_vp]),
        "bpf_object__find_program_by_name": (_vp, [_vp, _c.c_char_p]),
        "bpf_object__find_map_by_name": (_vp, [_vp, _c.c_char_p]),
        "bpf_object__next_map": (_vp, [_vp, _vp]),
        "bpf_map__name": (_c.c_char_p, [_vp]),
        "bpf_map__fd": (_c.c_int, [_vp]),
        "bpf_map__value_size": (_c.c_uint32, [_vp]),
        "bpf_program__fd": (_c.c_int, [_vp]),
        "bpf_prog_attach": (_c.c_int, [_c.c_int, _c.c_int, _c.c_int, _c.c_uint]),
        "bpf_prog_detach2": (_c.c_int, [_c.c_int, _c.c_int, _c.c_int]),
        "bpf_map_update_elem": (_c.c_int, [_c.c_int, _vp, _vp, _c.c_uint64]),
        "bpf_map_delete_elem": (_c.c_int, [_c.c_int, _vp]),
        "bpf_map_lookup_batch": (
            _c.c_int,
            [_c.c_int, _vp, _vp, _vp, _vp, _c.POINTER(_c.c_uint32), _vp],
        ),
        "libbpf_set_print": (_vp, [_PRINT_FN]),
        "libbpf_major_version": (_c.c_uint32, []),
        "libbpf_minor_version": (_c.c_uint32, []),
    }
    for fname, (restype, argtypes) in sigs.items():
        fn = getattr(lib, fname)
        fn.restype = restype
        fn.argtypes = argtypes

    libc = _libc()
    libc.vsnprintf.argtypes = [_c.c_char_p, _c.c_size_t, _c.c_char_p, _vp]

    def _print(level: int, fmt: bytes, va_list: int) -> int:
        buf = _c.create_string_buffer(2048)
        libc.vsnprintf(buf, len(buf), fmt, va_list)
        text = buf.value.decode(errors="replace").rstrip()
        if level == 0:  # LIBBPF_WARN: kept for the error message, logged at DEBUG
            recent.extend(text.splitlines()[-12:])
        log.log(logging.DEBUG if level < 2 else 5, "%s", text)
        return 0

    _print_cb = _PRINT_FN(_print)
    lib.libbpf_set_print(_print_cb)
    _lib = lib
    return lib


def libbpf_version() -> str:
    lib = load_libbpf()
    return f"{lib.libbpf_major_version()}.{lib.libbpf_minor_version()}"


def _tail() -> str:
    return ("\nlibbpf: " + "\nlibbpf: ".join(recent)) if recent else ""


def _check(ret: int, what: str) -> int:
    if ret < 0:  # libbpf >= 1.0: -errno (errno is set too)
        raise BpfError(-ret, f"{what}: {os.strerror(-ret)}")
    return ret


class BpfObject:
    """A loaded BPF object file ``path`` (``bpf_object__open_file`` + ``__load``).

    Raises:
        BpfError: open or load failed (EPERM: no CAP_BPF; EINVAL / EACCES: the verifier);
            the message ends with libbpf's last warnings.
    """

    def __init__(self, path: str) -> None:
        self._lib = load_libbpf()
        recent.clear()
        obj = self._lib.bpf_object__open_file(os.fsencode(path), None)
        if not obj:
            err = _c.get_errno() or errno.EINVAL
            raise BpfError(err, f"bpf_object__open_file({path}): {os.strerror(err)}{_tail()}")
        self._obj: int | None = obj
        ret = self._lib.bpf_object__load(obj)
        if ret < 0:
            self.close()
            raise BpfError(-ret, f"bpf_object__load({path}): {os.strerror(-ret)}{_tail()}")

    def program_fd(self, name: str) -> int:
        """fd of program ``name``. Raises: BpfError ENOENT."""
        prog = self._lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not prog:
            raise BpfError(errno.ENOENT, f"no BPF program named {name}")
        return _check(self._lib.bpf_program__fd(prog), f"bpf_program__fd({name})")

    def _map(self, name: str) -> int:
        m = self._lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if m:
            return m
        # internal maps (.bss) are named "<object prefix>.bss": match the suffix
        m = self._lib.bpf_object__next_map(self._obj, None)
        while m:
            mname = self._lib.bpf_map__name(m) or b""
            if name.startswith(".") and mname.decode().endswith(name):
                return m
            m = self._lib.bpf_object__next_map(self._obj, m)
        raise BpfError(errno.ENOENT, f"no BPF map named {name}")

    def map_fd(self, name: str) -> int:
        """fd of map ``name`` (or of the internal map whose name ends with ``name``, e.g. '.bss')."""
        return _check(self._lib.bpf_map__fd(self._map(name)), f"bpf_map__fd({name})")

    def map_value_size(self, name: str) -> int:
        """Value size of map ``name`` in bytes."""
        return int(self._lib.bpf_map__value_size(self._map(name)))

    def close(self) -> None:
        """Close the object: its maps and programs go away with their last reference."""
        if self._obj:
            self._lib.bpf_object__close(self._obj)
            self._obj = None


def prog_attach(prog_fd: int, map_fd: int, attach_type: int = BPF_SK_MSG_VERDICT) -> None:
    """Attach a program to a sockmap. Raises: BpfError."""
    _check(load_libbpf().bpf_prog_attach(prog_fd, map_fd, attach_type, 0), "bpf_prog_attach")


def prog_detach(prog_fd: int, map_fd: int, attach_type: int = BPF_SK_MSG_VERDICT) -> None:
    """Detach a program from a sockmap. Raises: BpfError."""
    _check(load_libbpf().bpf_prog_detach2(prog_fd, map_fd, attach_type), "bpf_prog_detach2")


def map_update(fd: int, key: Any, value: Any, flags: int = BPF_ANY) -> None:
    """``bpf_map_update_elem``; key / value are ctypes objects. Raises: BpfError."""
    _check(
        load_libbpf().bpf_map_update_elem(fd, _c.byref(key), _c.byref(value), flags),
        "bpf_map_update_elem",
    )


def map_delete(fd: int, key: Any) -> bool:
    """``bpf_map_delete_elem``; False if the key was absent. Raises: BpfError."""
    ret = load_libbpf().bpf_map_delete_elem(fd, _c.byref(key))
    if ret == -errno.ENOENT:
        return False
    _check(ret, "bpf_map_delete_elem")
    return True


def map_items(fd: int, key_type: Any, value_type: Any, chunk: int = 4096) -> list[tuple[Any, Any]]:
    """All (key, value) pairs of a hash map (``bpf_map_lookup_batch``, kernel >= 5.6); BpfError."""
    lib = load_libbpf()
    out: list[tuple[Any, Any]] = []
    keys = (key_type * chunk)()
    values = (value_type * chunk)()
    in_batch = (_c.c_uint8 * 64)()
    out_batch = (_c.c_uint8 * 64)()
    first = True
    while True:
        count = _c.c_uint32(chunk)
        ret = lib.bpf_map_lookup_batch(
            fd,
            None if first else _c.cast(in_batch, _vp),
            _c.cast(out_batch, _vp),
            _c.cast(keys, _vp),
            _c.cast(values, _vp),
            _c.byref(count),
            None,
        )
        err = -ret if ret < 0 else 0
        for i in range(count.value):
            k = key_type.from_buffer_copy(keys[i])
            v = value_type.from_buffer_copy(values[i])
            out.append((k, v))
        if ret < 0:
            if err == errno.ENOENT:
                return out
            raise BpfError(err, f"bpf_map_lookup_batch: {os.strerror(err)}")
        _c.memmove(in_batch, out_batch, _c.sizeof(out_batch))
        first = False
