"""Tensor pool on POSIX shared memory (infscaler.shm.pool): faults, cap, leases, MPMC.

Cross-process tests use multiprocessing with the 'spawn' start method (fresh
interpreters that attach slabs by name, as instances do) and plain subprocesses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from infscaler.shm import (
    SlabMap,
    TensorPool,
    Token,
    TokenKind,
    read_tensors,
    remove_stale_slabs,
    tensors_nbytes,
    write_tensors,
)
from infscaler.shm.slab import SLAB_HEADER_BYTES
from tests.unit.shm.test_shm_pool import shm_entries

KiB, MiB = 1024, 1024 * 1024
SPAWN = mp.get_context("spawn")


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Arbitrary bit patterns (NaN payloads included) of a dtype; bools are 0/1."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    return np.frombuffer(rng.bytes(n * dtype.itemsize), dtype=dtype).reshape(shape).copy()


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)).hexdigest()


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and digest(a) == digest(b)


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


# -- cross-process round trip: 4 KB .. 64 MB ------------------------------------------


def round_trip_cases() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    wide = random_array(rng, (512, 1024), np.int64)  # 4 MiB, sliced to a 1 MiB strided view
    return [
        {  # 4 KB + the odd ones: bool, 0-d, non-contiguous
            "x": random_array(rng, (1024,), np.float32),
            "mask": random_array(rng, (7, 3), np.bool_),
            "scalar": np.array(-0.0, np.float64),
            "strided": random_array(rng, (16, 16), np.float32)[::3, ::2],
        },
        {"x": random_array(rng, (64 * KiB,), np.uint8)},  # 64 KB
        {"x": wide[::2, ::2]},  # 1 MB int64, non-contiguous input
        {"x": random_array(rng, (8 * MiB,), np.float16)},  # 16 MB
        {"x": random_array(rng, (4, 4 * MiB), np.float32)},  # 64 MB
    ]


def _round_trip_child(service_id: str, jobs: list[tuple[bytes, bytes]], results) -> None:
    """Attach by name, read each DATA slot zero-copy, hash it, echo it into the GRANT slot."""
    try:
        slabs = SlabMap(service_id)
        out = []
        for data_raw, grant_raw in jobs:
            data = Token.unpack(data_raw)
            view = slabs.slot_view(data)
            slot = np.frombuffer(view, np.uint8)
            tensors = read_tensors(view[: data.length])
            info = {
                name: (
                    arr.dtype.str,
                    arr.shape,
                    digest(arr),
                    bool(arr.nbytes == 0 or np.shares_memory(arr, slot)),
                    bool(arr.flags.writeable),
                )
                for name, arr in tensors.items()
            }
            used = write_tensors(slabs.slot_view(Token.unpack(grant_raw)), tensors)
            out.append((info, used))
            del tensors, slot, view
        slabs.close()
        results.put(("ok", out))
    except BaseException as exc:  # report, don't hang the parent
        results.put(("error", repr(exc)))


def test_cross_process_round_trip_4kb_to_64mb(make_pool):
    pool = make_pool(600 * MiB)
    cases = round_trip_cases()
    assert [c["x"].nbytes for c in cases] == [4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB]
    jobs, echo_refs = [], []
    for i, tensors in enumerate(cases):
        need = tensors_nbytes(tensors)
        ref = pool.fault(need, owner=1, request=i)
        used = write_tensors(pool.slot_view(ref), tensors)
        assert used == need
        echo = pool.fault(need, owner=2, request=i)
        jobs.append(
            (
                ref.to_token(TokenKind.DATA, hop=1, instance=1, length=used).pack(),
                echo.to_token(TokenKind.GRANT, hop=1, instance=2).pack(),
            )
        )
        echo_refs.append(echo)
    results = SPAWN.Queue()
    child = SPAWN.Process(target=_round_trip_child, args=(pool.service_id, jobs, results))
    child.start()
    try:
        status, out = results.get(timeout=180)
    finally:
        child.join(timeout=60)
    assert status == "ok", out
    assert child.exitcode == 0
    for tensors, (info, used), echo in zip(cases, out, echo_refs, strict=True):
        assert list(info) == list(tensors)
        for name, arr in tensors.items():
            dtype, shape, dig, shared, writeable = info[name]
            assert (dtype, tuple(shape)) == (arr.dtype.str, arr.shape), name
            assert dig == digest(arr), name  # bit-exact in the other process
            assert shared, f"{name}: the child's array is not a view into the slot"
            assert not writeable
        # and back: what the child wrote into its slot reads bit-exact here
        back = read_tensors(pool.slot_view(echo)[:used])
        assert all(same_bits(back[k], v) for k, v in tensors.items())
    # the attaching process exited: the slabs are still there (it never unlinks)
    assert len(shm_entries(pool.service_id)) == pool.stats()["slabs"] > 0


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_exit_without_close_unlinks_but_sigkill_needs_remove_stale_slabs():
    sid = f"t{os.getpid()}x{time.monotonic_ns() % 10**9}"
    setup = (
        "from infscaler.shm import TensorPool\n"
        f"p = TensorPool(1 << 22, service_id={sid!r}, slab_bytes=65536)\n"
        "p.fault(10, 1); p.fault(40000, 1)\n"
    )
    done = _run_python(setup + "print('mapped')\n")  # normal exit: atexit finalizer
    assert done.returncode == 0 and "mapped" in done.stdout, done.stderr
    assert shm_entries(sid) == []
    killed = _run_python(setup + "import os; os._exit(0)\n")  # no cleanup at all
    assert killed.returncode == 0, killed.stderr
    assert shm_entries(sid) == [f"isc-{sid}-0", f"isc-{sid}-1"]
    assert remove_stale_slabs(sid) == [f"/isc-{sid}-0", f"/isc-{sid}-1"]
    assert shm_entries(sid) == []


def test_attaching_process_exit_never_unlinks(make_pool):
    pool = make_pool(MiB, slab_bytes=32 * KiB)
    ref = pool.fault(100, owner=1)
    pool.slot_view(ref)[:5] = b"hello"
    tok = ref.to_token(TokenKind.DATA, length=5).pack().hex()
    code = (
        "from infscaler.shm import SlabMap, Token\n"
        f"m = SlabMap({pool.service_id!r})\n"
        f"v = m.slot_view(Token.unpack(bytes.fromhex({tok!r})))\n"
        "assert bytes(v[:5]) == b'hello'\n"
        "v[:5] = b'world'\n"
    )
    res = _run_python(code)
    assert res.returncode == 0, res.stderr
    assert shm_entries(pool.service_id) == [pool.slab_name(0)[1:]]
    assert bytes(pool.slot_view(ref)[:5]) == b"world"


PRODUCERS = (1, 2)
CONSUMERS = (11, 12, 13)
PER_PRODUCER = 1500
DTYPES = ("<f4", "|u1", "<i8", "<f2", "|b1")


def mpmc_payload(request: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(request)
    n = int(rng.integers(1, 6000))
    return {
        "x": random_array(rng, (n,), DTYPES[request % len(DTYPES)]),
        "request": np.array(request, np.uint64),
    }


def _mpmc_producer(service_id: str, me: int, n: int, ctl, replies) -> None:
    slabs = SlabMap(service_id)
    busy = 0
    for i in range(n):
        request = (me << 32) | i
        tensors = mpmc_payload(request)
        need = tensors_nbytes(tensors)
        while True:  # OutToken queue empty: token fault
            ctl.put(Token(TokenKind.FAULT, hop=1, instance=me, length=need, request=request).pack())
            reply = Token.unpack(replies.get(timeout=60))
            if reply.kind == TokenKind.GRANT:
                break
            busy += 1  # BUSY: back-pressure, retry
            time.sleep(0.0005)
        assert reply.request == request and reply.instance == me
        used = write_tensors(slabs.slot_view(reply), tensors)
        data = dataclasses.replace(reply, kind=TokenKind.DATA, hop=2, length=used)
        ctl.put(data.pack())
    slabs.close()
    ctl.put(("done", me, busy))


def _mpmc_consumer(service_id: str, me: int, inbox, ctl, results) -> None:
    slabs = SlabMap(service_id)
    count, errors = 0, []
    while True:
        raw = inbox.get(timeout=120)
        if raw is None:
            break
        token = Token.unpack(raw)
        try:
            got = read_tensors(slabs.slot_view(token)[: token.length])
            want = mpmc_payload(token.request)
            if list(got) != list(want) or not all(same_bits(got[k], v) for k, v in want.items()):
                errors.append(f"request {token.request:x}: data differs")
            del got
        except Exception as exc:
            errors.append(f"request {token.request:x}: {exc!r}")
        count += 1
        ctl.put(dataclasses.replace(token, kind=TokenKind.FREE, instance=me).pack())
    slabs.close()
    results.put((me, count, errors[:5]))


def test_mpmc_two_producers_three_consumers(make_pool):
    """2 producer and 3 consumer processes; the test body is the manager + router
    (the stand-in for the control path): FAULT -> GRANT/BUSY, DATA -> transfer + route,
    FREE -> free. The lease table must never grant a slot that is out."""
    slab_nbytes = SLAB_HEADER_BYTES + 128 * KiB
    cap = 4 * slab_nbytes  # 4 slabs for 5 size classes: back-pressure and slab churn
    pool = make_pool(cap, slab_bytes=128 * KiB)
    ctl, results = SPAWN.Queue(), SPAWN.Queue()
    replies = {p: SPAWN.Queue() for p in PRODUCERS}
    inboxes = {c: SPAWN.Queue() for c in CONSUMERS}
    procs = [
        SPAWN.Process(
            target=_mpmc_producer, args=(pool.service_id, p, PER_PRODUCER, ctl, replies[p])
        )
        for p in PRODUCERS
    ] + [
        SPAWN.Process(target=_mpmc_consumer, args=(pool.service_id, c, inboxes[c], ctl, results))
        for c in CONSUMERS
    ]
    for p in procs:
        p.start()
    out: dict[tuple[int, int], int] = {}  # (slab, slot) -> holder, as the router sees it
    violations, done, routed, max_mapped, finished = [], {}, 0, 0, False
    try:
        deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
        while len(done) < len(PRODUCERS) or out:
            assert time.monotonic() < deadline, f"no completion; {pool.stats()}"
            msg = ctl.get(timeout=120)
            if isinstance(msg, tuple):
                done[msg[1]] = msg[2]
                continue
            token = Token.unpack(msg)
            key = (token.slab, token.slot)
            if token.kind == TokenKind.FAULT:
                ref = pool.fault(token.length, owner=token.instance, request=token.request)
                if ref is None:
                    busy = Token(TokenKind.BUSY, hop=1, instance=token.instance)
                    replies[token.instance].put(busy.pack())
                    continue
                key = (ref.slab, ref.slot)
                if key in out:
                    violations.append(f"{key} granted to {token.instance}, held by {out[key]}")
                    break  # fail fast: the finally kills the workers
                out[key] = token.instance
                max_mapped = max(max_mapped, pool.stats()["mapped_bytes"])
                grant = ref.to_token(TokenKind.GRANT, hop=1, instance=token.instance)
                replies[token.instance].put(grant.pack())
            elif token.kind == TokenKind.DATA:
                ref = pool.validate(token, hops={2}, check_owner=True)
                consumer = CONSUMERS[routed % len(CONSUMERS)]
                routed += 1
                pool.transfer(ref.slab, ref.slot, consumer, from_owner=token.instance)
                out[key] = consumer
                inboxes[consumer].put(msg)
            elif token.kind == TokenKind.FREE:
                if out.get(key) != token.instance:
                    violations.append(f"{key} freed by {token.instance}, held by {out.get(key)}")
                    break
                pool.free(token.slab, token.slot, owner=token.instance)
                del out[key]
        assert not violations
        for c in CONSUMERS:
            inboxes[c].put(None)
        reports = [results.get(timeout=60) for _ in CONSUMERS]
        finished = True
    finally:
        for p in procs:
            p.join(timeout=30 if finished else 0)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)
    total = len(PRODUCERS) * PER_PRODUCER
    assert sum(count for _, count, _ in reports) == routed == total
    assert all(count > 0 for _, count, _ in reports)  # every consumer took part
    assert [errs for _, _, errs in reports] == [[]] * len(CONSUMERS)
    s = pool.stats()
    assert s["grants"] == total and s["slots_in_use"] == 0 and s["rejected"] == 0
    assert s["faults"] == total + s["busy"] == total + sum(done.values())
    assert max_mapped <= cap and s["mapped_bytes"] <= cap
    assert s["slabs_mapped"] >= 2  # lazily grown, and slabs churned between classes
