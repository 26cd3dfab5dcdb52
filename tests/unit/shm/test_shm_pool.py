"""Tensor pool on POSIX shared memory (infscaler.shm.pool): faults, cap, leases, MPMC.

Cross-process tests use multiprocessing with the 'spawn' start method (fresh
interpreters that attach slabs by name, as instances do) and plain subprocesses.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import stat
import struct
import threading
import time

import numpy as np
import pytest

from infscaler.base.errors import InfScalerError
from infscaler.shm import (
    PoolError,
    SlabMap,
    SlotRef,
    TensorPool,
    Token,
    TokenKind,
    read_tensors,
    slab_name,
    write_tensors,
)
from infscaler.shm.slab import SLAB_HEADER_BYTES

KiB, MiB = 1024, 1024 * 1024


def shm_entries(service_id: str) -> list[str]:
    prefix = f"isc-{service_id}-"
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(prefix))


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make_pool():
    pools: list[TensorPool] = []

    def make(cap_bytes: int = 64 * MiB, **kw) -> TensorPool:
        pool = TensorPool(cap_bytes, **kw)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()
        assert shm_entries(pool.service_id) == []


# -- token faults: lazy allocation, cap, back-pressure ----------------------------------


def test_burst_of_faults_maps_lazily_and_stops_at_the_cap(make_pool):
    slab_nbytes = SLAB_HEADER_BYTES + MiB  # 16 slots of 64 KiB
    cap = 4 * slab_nbytes + 1000  # room for 4 slabs, not 5
    pool = make_pool(cap, slab_bytes=MiB)
    assert pool.stats()["mapped_bytes"] == 0  # nothing mapped before the first fault
    grants, mapped = [], []
    for i in range(100):
        ref = pool.fault(40_000, owner=i % 3, request=i)  # class 64 KiB
        mapped.append(pool.stats()["mapped_bytes"])
        if ref is not None:
            grants.append(ref)
            assert ref.size == 64 * KiB and ref.request == i
            # lazily: a new slab only when the previous ones are full
            assert mapped[-1] == -(-len(grants) // 16) * slab_nbytes
        assert mapped[-1] <= cap
    assert len(grants) == 64 and len({(r.slab, r.slot) for r in grants}) == 64
    s = pool.stats()
    assert s["faults"] == 100 and s["grants"] == 64 and s["busy"] == 36
    assert s["slabs"] == 4 == s["slabs_mapped"] and s["mapped_bytes"] == 4 * slab_nbytes
    assert s["classes"][64 * KiB] == {
        "slabs": 4,
        "slots": 64,
        "in_use": 64,
        "free": 0,
        "mapped_bytes": 4 * slab_nbytes,
    }
    assert len(shm_entries(pool.service_id)) == 4
    # frees make room again, without mapping anything new
    pool.free(grants[5].slab, grants[5].slot)
    again = pool.fault(50_000, owner=9)
    assert (again.slab, again.slot) == (grants[5].slab, grants[5].slot)
    assert pool.fault(50_000, owner=9) is None
    assert pool.stats()["slabs_mapped"] == 4


def test_fault_releases_free_slabs_of_other_classes_under_pressure(make_pool):
    slab_nbytes = SLAB_HEADER_BYTES + MiB
    pool = make_pool(2 * slab_nbytes, slab_bytes=MiB)
    small = pool.fault(100, owner=1)  # class 4 KiB, slab 0
    big = pool.fault(40_000, owner=1)  # class 64 KiB, slab 1
    pool.free(small.slab, small.slot)  # slab 0 now entirely free
    # a 2 MiB slot would need both slabs' room: nothing is released for nothing
    assert pool.fault(2 * MiB, owner=2) is None
    assert pool.stats()["slabs_released"] == 0 and pool.stats()["slabs"] == 2
    huge = pool.fault(200_000, owner=2)  # class 256 KiB: no room unless slab 0 goes
    assert huge is not None and huge.size == 256 * KiB
    s = pool.stats()
    assert s["slabs_released"] == 1 and s["bytes_released"] == slab_nbytes
    assert sorted(s["classes"]) == [64 * KiB, 256 * KiB]
    assert s["mapped_bytes"] == 2 * slab_nbytes
    assert pool.owner(big.slab, big.slot) == 1  # the busy slab was not touched
    # nothing free anywhere now: back-pressure, not growth
    assert pool.fault(100, owner=3) is None


def test_impossible_requests_raise(make_pool):
    pool = make_pool(8 * MiB, slab_bytes=MiB)
    with pytest.raises(PoolError, match="largest slot is 134217728 bytes"):
        pool.fault(128 * MiB + 1, owner=1)
    with pytest.raises(PoolError, match="above the pool cap"):
        pool.fault(9 * MiB, owner=1)  # a 16 MiB slot can never fit under 8 MiB
    with pytest.raises(PoolError):
        pool.fault(-1, owner=1)
    with pytest.raises(PoolError, match="instance id"):
        pool.fault(10, owner=70_000)
    s = pool.stats()
    assert s["rejected"] == 4 and s["mapped_bytes"] == 0
    assert isinstance(PoolError("x"), InfScalerError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"service_id": "has-dash"},
        {"service_id": ""},
        {"size_classes": [8192, 4096]},
        {"size_classes": [100]},
        {"slab_bytes": 0},
        {"idle_release_s": -1},
        {"size_classes": [4096, 4 * 1024 * MiB]},  # offsets would overflow u32
    ],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(PoolError):
        TensorPool(MiB, **kwargs)


# -- bad input: rejected, counted, nothing corrupted ------------------------------------


def test_bad_frees_and_tokens_are_rejected_counted_and_harmless(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)  # 8 slots of 4 KiB per slab
    refs = [pool.fault(1000, owner=1 if i < 4 else 2, request=100 + i) for i in range(8)]
    assert {r.slab for r in refs} == {0}
    slabs = SlabMap(pool.service_id)
    for r in refs:  # a pattern in every slot, through another mapping
        slabs.slot_view(r.to_token(TokenKind.GRANT))[:] = bytes([r.slot + 1]) * r.size
    pool.free(0, 3)
    freed = refs[3]
    owners_before = [pool.owner(0, i) for i in range(8)]
    held_before = (pool.held_by(1), pool.held_by(2))

    def data(ref: SlotRef, **kw) -> Token:
        return dataclasses.replace(ref.to_token(TokenKind.DATA, hop=2, instance=1), **kw)

    bad = [
        (lambda: pool.free(0, 3), "double_free"),
        (lambda: pool.free(5, 0), "unknown_slab"),
        (lambda: pool.free(0, 99), "unknown_slot"),
        (lambda: pool.free(0, 4, owner=1), "wrong_owner"),
        (lambda: pool.transfer(0, 3, 2), "not_leased"),
        (lambda: pool.transfer(0, 4, 1, from_owner=1), "wrong_owner"),
        (lambda: pool.validate(data(freed)), "freed_slot"),
        (lambda: pool.validate(data(refs[0], hop=9), hops={1, 2}), "unknown_stage"),
        (lambda: pool.validate(data(refs[0], slab=0xFFFF)), "unknown_slab"),
        (lambda: pool.validate(data(refs[0], offset=refs[0].offset + 64)), "bad_offset"),
        (lambda: pool.validate(data(refs[0], length=4097)), "bad_length"),
        (lambda: pool.validate(data(refs[4]), check_owner=True), "wrong_owner"),
        (lambda: pool.validate(Token(TokenKind.FAULT, length=10)), "bad_kind"),
    ]
    for i, (op, reason) in enumerate(bad):
        with pytest.raises(PoolError):
            op()
        s = pool.stats()
        assert s["rejected"] == i + 1, reason
        assert s["rejections"].get(reason, 0) >= 1, reason
    assert sum(pool.stats()["rejections"].values()) == len(bad)
    # nothing changed: leases, free slots, neighbours' bytes
    assert [pool.owner(0, i) for i in range(8)] == owners_before
    assert (pool.held_by(1), pool.held_by(2)) == held_before
    assert pool.stats()["slots_in_use"] == 7
    for r in refs:
        if r is not freed:
            view = slabs.slot_view(r.to_token(TokenKind.DATA))
            assert bytes(view) == bytes([r.slot + 1]) * r.size, r
    # a valid token passes and carries the lease's request
    ok = pool.validate(data(refs[0]), hops={1, 2}, check_owner=True)
    assert ok == refs[0] and ok.request == 100
    slabs.close()


def test_slab_map_checks_tokens_against_the_slab(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)
    ref = pool.fault(1000, owner=1)
    slabs = SlabMap(pool.service_id)
    tok = ref.to_token(TokenKind.DATA, length=100)
    assert len(slabs.slot_view(tok)) == ref.size
    for bad in (
        dataclasses.replace(tok, offset=tok.offset + 8),
        dataclasses.replace(tok, slot=99, offset=SLAB_HEADER_BYTES + 99 * 4096),
        dataclasses.replace(tok, length=ref.size + 1),
        dataclasses.replace(tok, slab=7),
    ):
        with pytest.raises(PoolError):
            slabs.slot_view(bad)
    with pytest.raises(PoolError, match="outside"):
        slabs.view(ref.slab, 0, 16)  # the slab header is not a slot
    with pytest.raises(PoolError, match="outside"):
        slabs.view(ref.slab, ref.offset, 10 * MiB)
    with pytest.raises(PoolError, match="does not exist"):
        SlabMap("nosuchservice").slot_view(tok)
    with pytest.raises(PoolError):
        SlabMap("bad-id")
    slabs.close()


# -- leases: transfer, reclaim ------------------------------------------------------------


def test_transfer_moves_the_lease(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)
    ref = pool.fault(500, owner=1, request=42)
    pool.transfer(ref.slab, ref.slot, 5, from_owner=1)
    assert pool.owner(ref.slab, ref.slot) == 5
    assert pool.held_by(1) == [] and pool.held_by(5) == [ref]
    assert pool.held_by(5)[0].request == 42
    pool.transfer(ref.slab, ref.slot, 6, request=43)
    assert pool.held_by(6)[0].request == 43 and pool.stats()["owners"] == {6: 1}
    with pytest.raises(PoolError):
        pool.free(ref.slab, ref.slot, owner=5)  # the old holder cannot free it
    pool.free(ref.slab, ref.slot, owner=6)
    assert pool.owner(ref.slab, ref.slot) is None and pool.held_by(6) == []


def test_reclaim_returns_exactly_the_dead_instance_slots(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)  # 8 slots per slab
    refs = {}
    for i in range(16):  # two full slabs, owners interleaved
        owner = (1, 2, 3)[i % 3]
        refs[(owner, i)] = pool.fault(1000, owner=owner, request=i)
    assert pool.stats()["slabs"] == 2 and pool.stats()["slots_free"] == 0
    expected = sorted(r for (o, _), r in refs.items() if o == 2)
    held_1, held_3 = pool.held_by(1), pool.held_by(3)
    lost = pool.reclaim(2)
    assert lost == expected
    assert sorted(r.request for r in lost) == [i for i in range(16) if i % 3 == 1]
    assert all(pool.owner(r.slab, r.slot) is None for r in lost)
    assert pool.held_by(2) == [] and pool.reclaim(2) == []
    assert pool.held_by(1) == held_1 and pool.held_by(3) == held_3
    # the reclaimed slots are granted again (they are the only free ones)
    regranted = [pool.fault(1000, owner=4) for _ in lost]
    assert sorted(regranted) == lost
    assert pool.fault(1000, owner=4) is not None  # a third slab: the cap allows it
    assert pool.stats()["slabs"] == 3


# -- idle release, slab id reuse ---------------------------------------------------------


def test_release_idle_unmaps_only_idle_slabs(make_pool):
    clock = FakeClock()
    pool = make_pool(16 * MiB, slab_bytes=64 * KiB, idle_release_s=10.0, clock=clock)
    a1, a2 = pool.fault(1000, owner=1), pool.fault(1000, owner=1)  # slab 0, class 4 KiB
    b = pool.fault(40_000, owner=1)  # slab 1, class 64 KiB
    assert (a1.slab, a2.slab, b.slab) == (0, 0, 1)
    names = {s: pool.slab_name(s)[1:] for s in (0, 1)}
    nbytes = {c: v["mapped_bytes"] for c, v in pool.stats()["classes"].items()}
    pool.free(a1.slab, a1.slot)
    assert pool.release_idle(now=100.0) == 0  # slab 0 still has a slot in use
    pool.free(a2.slab, a2.slot)  # slab 0 idle since t=0
    clock.t = 5.0
    pool.free(b.slab, b.slot)  # slab 1 idle since t=5
    assert pool.release_idle(now=9.9) == 0
    assert pool.release_idle(now=10.0) == nbytes[4 * KiB]
    assert shm_entries(pool.service_id) == [names[1]]
    clock.t = 12.0
    assert pool.release_idle() == 0  # default now: the clock; slab 1 idle for 7 s
    # a slab used again restarts its idle time
    c = pool.fault(40_000, owner=2)
    clock.t = 20.0
    pool.free(c.slab, c.slot)
    assert pool.release_idle(now=29.0) == 0
    assert pool.release_idle(now=30.0) == nbytes[64 * KiB]
    s = pool.stats()
    assert s["slabs"] == 0 and s["mapped_bytes"] == 0 and s["slabs_released"] == 2
    assert shm_entries(pool.service_id) == []


def test_reused_slab_id_never_serves_stale_data(make_pool):
    clock = FakeClock()
    pool = make_pool(MiB, slab_bytes=32 * KiB, idle_release_s=0.0, clock=clock)
    slabs = SlabMap(pool.service_id)
    old = pool.fault(1000, owner=1)
    write_tensors(slabs.slot_view(old.to_token(TokenKind.GRANT)), {"v": np.full(8, 1, np.int32)})
    got = read_tensors(slabs.slot_view(old.to_token(TokenKind.DATA)))
    assert got["v"].tolist() == [1] * 8
    del got
    assert slabs.attached() == [0]
    pool.free(old.slab, old.slot)
    assert pool.release_idle() > 0  # slab 0 unmapped and unlinked
    # the same id, the same class, the same slot: only the slab header tells them apart
    new = pool.fault(1000, owner=1)
    assert new == old
    write_tensors(pool.slot_view(new), {"v": np.full(8, 2, np.int32)})
    got = read_tensors(slabs.slot_view(new.to_token(TokenKind.DATA)))
    assert got["v"].tolist() == [2] * 8  # not the stale mapping's 1s
    del got
    # released and not re-created: refused, not served from the stale mapping
    pool.free(new.slab, new.slot)
    pool.release_idle()
    with pytest.raises(PoolError, match="does not exist"):
        slabs.slot_view(new.to_token(TokenKind.DATA))
    slabs.close()


def test_restarted_pool_with_same_service_id_is_not_confused_with_the_old(make_pool):
    first = make_pool(MiB, slab_bytes=32 * KiB)
    sid = first.service_id
    slabs = SlabMap(sid)
    ref = first.fault(1000, owner=1)
    slabs.slot_view(ref.to_token(TokenKind.GRANT))[:4] = b"old!"
    first.close()  # the manager restarts under the same service id
    second = TensorPool(MiB, slab_bytes=32 * KiB, service_id=sid)
    try:
        ref2 = second.fault(1000, owner=1)
        assert ref2 == ref
        second.slot_view(ref2)[:4] = b"new!"
        assert bytes(slabs.slot_view(ref2.to_token(TokenKind.DATA))[:4]) == b"new!"
        assert slabs.attached() == [0]
    finally:
        second.close()
    slabs.close()
    assert shm_entries(sid) == []


# -- shared memory hygiene: names, mode, no leaks ----------------------------------------


def test_slabs_are_mode_0600_and_named_per_service(make_pool):
    old = os.umask(0)  # even with a permissive umask
    try:
        pool = make_pool(MiB, slab_bytes=32 * KiB)
        other = make_pool(MiB, slab_bytes=32 * KiB)
        ref = pool.fault(10, owner=1)
        other.fault(10, owner=1)
    finally:
        os.umask(old)
    assert pool.service_id != other.service_id
    name = pool.slab_name(ref.slab)
    assert name == slab_name(pool.service_id, ref.slab) == f"/isc-{pool.service_id}-0"
    st = os.stat("/dev/shm" + name)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert st.st_size == SLAB_HEADER_BYTES + 32 * KiB
    with pytest.raises(PoolError, match="already exists"):  # never adopts someone's slab
        clash = TensorPool(MiB, service_id=pool.service_id, slab_bytes=32 * KiB)
        try:
            clash.fault(10, owner=1)
        finally:
            clash.close()
    assert pool.owner(ref.slab, ref.slot) == 1  # the clash unlinked nothing of ours
    assert shm_entries(pool.service_id) == [name[1:]]


def test_close_and_garbage_collection_leave_no_shm_entries():
    pool = TensorPool(64 * MiB, slab_bytes=64 * KiB)
    for n in (100, 10_000, 100_000, 1_000_000):
        assert pool.fault(n, owner=1) is not None
    sid = pool.service_id
    slabs = SlabMap(sid)
    held = slabs.slab_view(0)  # an attached process still holding a view
    assert len(shm_entries(sid)) == 4
    pool.close()
    pool.close()  # idempotent
    assert shm_entries(sid) == [] and pool.closed
    with pytest.raises(PoolError, match="closed"):
        pool.fault(10, owner=1)
    assert len(held) > 0  # the view stays valid memory until dropped
    del held
    slabs.close()

    pool = TensorPool(MiB, slab_bytes=64 * KiB)
    pool.fault(100, owner=1)
    sid = pool.service_id
    assert len(shm_entries(sid)) == 1
    del pool
    gc.collect()
    assert shm_entries(sid) == []


# -- concurrency: threads on one pool, processes on one service --------------------------


def test_threads_never_get_the_same_slot(make_pool):
    pool = make_pool(2 * (SLAB_HEADER_BYTES + 32 * KiB), slab_bytes=32 * KiB)
    errors, grants = [], [0]
    lock = threading.Lock()

    def worker(tid: int) -> None:
        for i in range(400):
            ref = pool.fault(3000 if i % 2 else 6000, owner=tid)
            if ref is None:
                time.sleep(0)
                continue
            stamp = struct.pack("<QQ", tid, i)
            view = pool.slot_view(ref)
            view[:16] = stamp
            time.sleep(0)  # let others run while we hold the slot
            if bytes(view[:16]) != stamp or pool.owner(ref.slab, ref.slot) != tid:
                errors.append((tid, i, ref))
            del view
            pool.free(ref.slab, ref.slot, owner=tid)
            with lock:
                grants[0] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    s = pool.stats()
    assert s["grants"] == grants[0] > 0 and s["slots_in_use"] == 0 and s["rejected"] == 0
    assert s["mapped_bytes"] <= pool.cap_bytes


def test_slot_ref_token_round_trip(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)
    ref = pool.fault(2000, owner=3, request=77)
    tok = Token.unpack(ref.to_token(TokenKind.DATA, hop=4, instance=3, length=2000).pack())
    assert (tok.slab, tok.slot, tok.offset, tok.length) == (ref.slab, ref.slot, ref.offset, 2000)
    assert tok.request == 77 and tok.hop == 4  # the ref's request by default
    assert pool.validate(tok, check_owner=True) == ref
    grant = ref.to_token(TokenKind.GRANT, request=5)
    assert grant.length == ref.size and grant.request == 5


def test_free_listeners_hear_every_freed_slot_and_no_refused_free(make_pool):
    pool = make_pool()
    heard: list[int] = []
    pool.free_listeners.append(lambda: heard.append(pool.stats()["grants"]))
    refs = [pool.fault(1000, owner=1, request=i) for i in range(3)]
    assert heard == []  # grants are not frees
    pool.free(refs[0].slab, refs[0].slot)
    with pytest.raises(PoolError):
        pool.free(refs[0].slab, refs[0].slot)  # a double free frees nothing
    assert heard == [3]
    pool.reclaim(1)  # the other two, at once
    assert heard == [3, 3, 3]
