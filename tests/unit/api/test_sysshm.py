"""System shared memory (infscaler.api.sysshm): the server registry's bounds and refusals, and
the client's SharedMemoryRegion (``extension_shared_memory.md``, System Shared Memory)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from infscaler.api.codec import ProtocolError
from infscaler.api.sysshm import SharedMemoryRegion, SystemSharedMemoryRegistry, normalize_key
from infscaler.base.errors import InfScalerError
from infscaler.base.security import Peer


def _key() -> str:
    return f"/infscaler-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def keys() -> Iterator[list[str]]:
    """Fresh shm keys (append more with keys.append(_key())); all unlinked afterwards."""
    made = [_key()]
    yield made
    for k in made:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("/dev/shm" + k)


@pytest.fixture
def region(keys: list[str]) -> Iterator[SharedMemoryRegion]:
    with SharedMemoryRegion.create(keys[0], 10_000) as r:
        yield r


@pytest.fixture
def reg() -> Iterator[SystemSharedMemoryRegistry]:
    with SystemSharedMemoryRegistry() as r:
        yield r


def refused(fn, *args, status: int = 400) -> str:
    with pytest.raises(ProtocolError) as ei:
        fn(*args)
    assert ei.value.status == status
    return str(ei.value)


# -- keys ---------------------------------------------------------------------------------


def test_keys_normalize_to_one_component() -> None:
    assert normalize_key("abc") == "/abc"
    assert normalize_key("/abc") == "/abc"
    for bad in ("", "/", "a/b", "/a/b", ".", "/..", "a\0b"):
        with pytest.raises(ProtocolError, match="bad shared memory key"):
            normalize_key(bad)
    with pytest.raises(ProtocolError, match="longer than 255 bytes"):
        normalize_key("x" * 256)


def test_tensor_pool_keys_are_reserved(reg: SystemSharedMemoryRegistry) -> None:
    msg = refused(reg.register, "r", "/isc-0123456789ab-0", 0, 16)
    assert "is reserved" in msg and "tensor pool" in msg


# -- registry -----------------------------------------------------------------------------


def test_register_status_view_unregister(
    region: SharedMemoryRegion, reg: SystemSharedMemoryRegistry
) -> None:
    payload = np.arange(256, dtype=np.uint8)
    region.buf[4096 + 100 : 4096 + 356] = payload.tobytes()
    reg.register("a", region.key, 0, 4096)
    reg.register("b", region.key.lstrip("/"), 4096 + 100, 1000)  # unaligned offset
    assert reg.status() == [
        {"name": "a", "key": region.key, "offset": 0, "byte_size": 4096},
        {"name": "b", "key": region.key, "offset": 4196, "byte_size": 1000},
    ]
    assert reg.status("b") == [{"name": "b", "key": region.key, "offset": 4196, "byte_size": 1000}]
    got = reg.read("b", 0, 256)
    assert got.format == "B" and not got.readonly and bytes(got) == payload.tobytes()
    region.buf[4196] = 0  # a copy: later changes of the object do not reach it
    assert got[0] == payload[0]
    reg.write("b", 0, b"xyz")  # written into the object: the client sees it
    assert bytes(region.buf[4196:4199]) == b"xyz"
    assert bytes(reg.read("b", 1000, 0)) == b""  # an empty range at the very end is fine
    reg.check("b", 0, 1000)
    reg.unregister("a")
    assert [s["name"] for s in reg.status()] == ["b"]
    reg.unregister("a")  # unknown: nothing happens (Triton semantics)
    reg.unregister()
    assert reg.status() == [] and len(reg) == 0


def test_view_bounds_and_unknown_regions(
    region: SharedMemoryRegion, reg: SystemSharedMemoryRegistry
) -> None:
    reg.register("r", region.key, 64, 128)
    assert "offset 100 + byte_size 29 is beyond shared memory region 'r' (128 bytes)" in refused(
        reg.read, "r", 100, 29
    )
    assert "beyond shared memory region 'r'" in refused(reg.read, "r", -1, 4)
    assert "beyond shared memory region 'r'" in refused(reg.write, "r", 127, b"ab")
    assert "beyond shared memory region 'r'" in refused(reg.check, "r", 0, 129)
    msg = refused(reg.read, "nope", 0, 1)
    assert "shared memory region 'nope' is not registered" in msg and "register" in msg
    assert "shared memory region 'nope' is not registered" in refused(
        reg.status, "nope", status=404
    )
    reg.close()
    assert "'r' is not registered" in refused(reg.read, "r", 0, 1)


def test_register_refusals(
    region: SharedMemoryRegion, reg: SystemSharedMemoryRegistry, keys: list[str]
) -> None:
    missing = _key()
    msg = refused(reg.register, "m", missing, 0, 16)
    assert f"shared memory object {missing} does not exist" in msg and "create it first" in msg
    msg = refused(reg.register, "big", region.key, 9_000, 1_001)
    assert (
        f"offset 9000 + byte_size 1001 = 10001 is beyond shared memory object {region.key} "
        "(10000 bytes)" in msg
    )
    assert "byte_size must be >= 1, got 0" in refused(reg.register, "z", region.key, 0, 0)
    assert "offset must be >= 0, got -1" in refused(reg.register, "n", region.key, -1, 8)
    assert "offset must be an integer" in refused(reg.register, "n", region.key, 1.5, 8)
    assert "bad shared memory region name ''" in refused(reg.register, "", region.key, 0, 8)
    assert "bad shared memory key 'a/b'" in refused(reg.register, "k", "a/b", 0, 8)
    reg.register("dup", region.key, 0, 8)
    msg = refused(reg.register, "dup", region.key, 8, 8)
    assert (
        "shared memory region 'dup' is already registered" in msg and "unregister it first" in msg
    )
    assert reg.status("dup")[0]["offset"] == 0  # the first registration stands


def test_symlinks_in_dev_shm_are_not_followed(
    tmp_path, reg: SystemSharedMemoryRegistry, keys: list[str]
) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"s" * 64)
    link = keys[0]
    os.symlink(target, "/dev/shm" + link)
    msg = refused(reg.register, "l", link, 0, 16)
    assert "cannot open shared memory object" in msg


def test_a_shrunk_object_is_refused_instead_of_sigbus(
    keys: list[str], reg: SystemSharedMemoryRegistry
) -> None:
    with SharedMemoryRegion.create(keys[0], 8192) as r:
        reg.register("r", r.key, 0, 8192)
        os.truncate("/dev/shm" + r.key, 100)
        assert len(reg.read("r", 0, 16)) == 16  # what is left of the object still reads
        msg = refused(reg.read, "r", 96, 16)
        assert "shrank to 100 (or fewer) bytes" in msg and "register it again" in msg
        msg = refused(reg.write, "r", 4000, b"x" * 16)
        assert "shrank to 100 bytes" in msg
        assert os.stat("/dev/shm" + r.key).st_size == 100  # the refused write grew nothing
        os.truncate("/dev/shm" + r.key, 0)
        assert "shrank to 0 (or fewer) bytes" in refused(reg.read, "r", 0, 16)
        os.truncate("/dev/shm" + r.key, 8192)  # grown back: served again (zeros now)
        assert bytes(reg.read("r", 0, 16)) == bytes(16)
        os.unlink("/dev/shm" + r.key)  # removed: the registered fd still reads it
        reg.write("r", 8, b"abc")
        assert bytes(reg.read("r", 8, 3)) == b"abc"


def test_the_shrink_race_never_signals_and_never_serves_a_torn_read(
    keys: list[str], reg: SystemSharedMemoryRegistry
) -> None:
    """A thread shrinks the object to 0 and back while reads and writes go on: each read
    is either the whole range (all of one fill value, or zeros where it was regrown) or a
    400 saying it shrank; the process gets no SIGBUS."""
    size = 1 << 16
    with SharedMemoryRegion.create(keys[0], size) as r:
        reg.register("r", r.key, 0, size)
        path = "/dev/shm" + r.key
        stop = threading.Event()

        def shrink() -> None:
            fd = os.open(path, os.O_RDWR)
            try:
                while not stop.is_set():
                    os.ftruncate(fd, 0)
                    os.ftruncate(fd, size)
                    os.pwrite(fd, b"\x07" * size, 0)
            finally:
                os.close(fd)

        t = threading.Thread(target=shrink, daemon=True)
        t.start()
        served = short = 0
        try:
            for i in range(1000):
                try:
                    if i % 2:
                        reg.write("r", 0, b"\x07" * size)
                    data = reg.read("r", 0, size)
                except ProtocolError as exc:
                    assert exc.status == 400 and "shrank" in exc.message
                    short += 1
                    continue
                assert len(data) == size
                served += 1
        finally:
            stop.set()
            t.join(10)
        assert served + short == 1000  # each answered, none with a signal
        reg.write("r", 0, b"\x05" * size)  # quiet again: served whole
        assert bytes(reg.read("r", 0, size)) == b"\x05" * size


def test_unregister_during_a_read_keeps_the_fd_until_it_ends(
    region: SharedMemoryRegion, reg: SystemSharedMemoryRegistry
) -> None:
    region.buf[0:4] = b"abcd"
    reg.register("r", region.key, 0, 64)
    held = reg._acquire("r", 0, 4, None)  # a read in progress
    fd = held.fd
    reg.unregister("r")
    assert os.pread(fd, 4, 0) == b"abcd"  # still this object's fd: not closed, not reused
    reg._release(held)
    with pytest.raises(OSError):
        os.fstat(fd)
    assert "'r' is not registered" in refused(reg.read, "r", 0, 1)


def test_region_quotas_per_uid_and_in_all(region: SharedMemoryRegion, keys: list[str]) -> None:
    os.chmod("/dev/shm" + region.key, 0o666)
    alice = Peer(1, 60001, 60001)
    bob = Peer(2, 60002, 60002)
    with SystemSharedMemoryRegistry(max_regions_per_uid=2, max_regions=3) as reg:
        reg.register("a1", region.key, 0, 8, alice)
        reg.register("a2", region.key, 0, 8, alice)
        msg = refused(reg.register, "a3", region.key, 0, 8, alice, status=429)
        assert "hold 2 registered shared memory regions" in msg and "unregister" in msg
        reg.register("b1", region.key, 0, 8, bob)
        msg = refused(reg.register, "b2", region.key, 0, 8, bob, status=429)
        assert "--max-regions 3" in msg
        reg.register("own", region.key, 0, 8, None)  # the service's own: no quota
        assert reg.counts() == {"regions": 4, "client_regions": 3, "fds": 4, "refused": 2}
        reg.unregister("a1", alice)
        reg.register("b2", region.key, 0, 8, bob)  # room again


# -- SharedMemoryRegion (client side) ------------------------------------------------------


def test_create_modes(keys: list[str]) -> None:
    keys.append(_key())
    old = os.umask(0o077)  # the umask must not strip the group bits we ask for
    try:
        with SharedMemoryRegion.create(keys[0], 100) as a:
            assert stat.S_IMODE(os.stat("/dev/shm" + a.key).st_mode) == 0o600
        with SharedMemoryRegion.create(keys[1], 100, group=True) as b:
            assert stat.S_IMODE(os.stat("/dev/shm" + b.key).st_mode) == 0o660
    finally:
        os.umask(old)


def test_create_refusals(region: SharedMemoryRegion) -> None:
    with pytest.raises(InfScalerError, match="already exists"):
        SharedMemoryRegion.create(region.key, 10)
    with pytest.raises(InfScalerError, match="byte_size must be an integer >= 1"):
        SharedMemoryRegion.create(_key(), 0)
    with pytest.raises(ProtocolError, match="bad shared memory key"):
        SharedMemoryRegion.create("a/b", 10)


def test_set_get_roundtrip_bit_exact(region: SharedMemoryRegion) -> None:
    f = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    h = np.array([np.nan, -0.0, 65504], np.float16)
    b = np.array([True, False, True])
    s = np.array(["\u00e9t\u00e9", "", "x"])
    n = region.set([f, h, b], offset=8)
    assert n == f.nbytes + h.nbytes + b.nbytes
    assert region.get(np.float32, [4, 3], offset=8).tobytes() == f.tobytes()
    assert region.get("FP16", [3], offset=8 + f.nbytes).tobytes() == h.tobytes()
    assert region.get(bool, [3], offset=8 + f.nbytes + h.nbytes).tolist() == [True, False, True]
    ns = region.set(s, offset=1000)
    assert ns == 4 * 3 + 5 + 0 + 1
    got = region.get(object, [3], offset=1000)
    assert got.dtype == object and got.tolist() == [x.encode() for x in s]
    assert region.get("BYTES", [1, 3], offset=1000).shape == (1, 3)
    out = region.get(np.float32, [4, 3], offset=8)
    out[0, 0] = 1.0  # a copy, writable
    assert region.get(np.float32, [4, 3], offset=8)[0, 0] == f[0, 0]
    assert region.get(np.int32, [], offset=0).shape == ()


def test_set_get_bounds(region: SharedMemoryRegion) -> None:
    with pytest.raises(InfScalerError, match="writing of 40 bytes at offset 9990 does not fit"):
        region.set(np.zeros(10, np.float32), offset=9990)
    with pytest.raises(InfScalerError, match="reading of 16 bytes at offset 9990 does not fit"):
        region.get(np.float32, [4], offset=9990)
    region.buf[9996:10000] = (1000).to_bytes(4, "little")  # a BYTES length running off the end
    with pytest.raises(ProtocolError, match="claims 1000 bytes but only 0 remain"):
        region.get("BYTES", [1], offset=9996)
    with pytest.raises(ProtocolError, match="no v2 datatype"):
        region.set(np.zeros(2, np.complex64))


def test_attach_close_and_unlink(keys: list[str]) -> None:
    r = SharedMemoryRegion.create(keys[0], 64)
    r.set(np.arange(4, dtype=np.int16))
    other = SharedMemoryRegion.attach(keys[0].lstrip("/"))
    assert other.byte_size == 64 and other.get(np.int16, [4]).tolist() == [0, 1, 2, 3]
    other.close()  # attach does not own: the object stays
    assert os.path.exists("/dev/shm" + keys[0])
    r.close(unlink=False)
    assert os.path.exists("/dev/shm" + keys[0])
    with pytest.raises(InfScalerError, match="is closed"):
        r.get(np.int16, [1])
    again = SharedMemoryRegion.attach(keys[0])
    again.close(unlink=True)
    assert not os.path.exists("/dev/shm" + keys[0])
    again.close()  # idempotent
    with pytest.raises(InfScalerError, match="cannot open shared memory object"):
        SharedMemoryRegion.attach(keys[0])
    with SharedMemoryRegion.create(keys[0], 16) as r2:
        assert "open" in repr(r2)
    assert not os.path.exists("/dev/shm" + keys[0])  # the context manager unlinks what it created


class _Budget:
    """A stand-in for the service's in-flight budget: refuses beyond ``cap`` per uid."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.held: dict[int | None, int] = {}

    def reserve_bytes(self, nbytes: int, uid: int | None) -> None:
        if uid is not None and self.held.get(uid, 0) + nbytes > self.cap:
            raise InfScalerError(f"over the budget of uid {uid}")
        self.held[uid] = self.held.get(uid, 0) + nbytes

    def release_bytes(self, nbytes: int, uid: int | None) -> None:
        self.held[uid] -= nbytes


def test_a_request_s_reads_are_charged_before_they_are_allocated(
    reg: SystemSharedMemoryRegistry, keys: list[str]
) -> None:
    """Twice each read is reserved under the client's uid before its buffer exists, the
    request's reads are bounded in all (413), and release gives everything back."""
    me = Peer(1, 60001, 60001)
    region = SharedMemoryRegion.create(keys[0], 10_000, mode=0o666)
    reg.register("r", region.key, 0, 10_000, me)
    budget = _Budget(cap=8_000)
    view = reg.for_peer(me, budget=budget, max_read_bytes=5_000)
    assert len(view.read("r", 0, 3_000)) == 3_000
    assert budget.held[me.uid] == 6_000 and view.read_bytes == 3_000
    with pytest.raises(InfScalerError, match="over the budget"):
        view.read("r", 0, 1_500)  # 6000 + 3000 > 8000: refused, nothing read
    assert budget.held[me.uid] == 6_000 and view.read_bytes == 3_000
    with pytest.raises(ProtocolError, match="at most 5000 bytes") as exc:
        view.read("r", 0, 2_500)  # 3000 + 2500 > 5000 in all
    assert exc.value.status == 413
    view.release()
    view.release()  # idempotent
    assert budget.held[me.uid] == 0
    # the service's own user and root: the service-wide budget only (uid None)
    root = reg.for_peer(None, budget=budget)
    root.read("r", 0, 9_000)
    assert budget.held[None] == 18_000
    root.release()
    assert budget.held[None] == 0
    region.close()
