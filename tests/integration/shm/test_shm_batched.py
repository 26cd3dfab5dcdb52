"""InstanceClient.batched(): control tokens (receipts, keeps, frees) leave together in one
send at the block's end; DATA leaves at once; the manager sees the same tokens in the
same order as without it. ``acquire(retry_busy=False)``: one BUSY raises at once (each
channel kind)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from infscaler.ebpf import Endpoint, open_channel
from infscaler.shm import InstanceClient, TensorPool, TensorSharingManager
from infscaler.shm.slabmap import SlabMap
from infscaler.shm.tensors import tensors_nbytes, write_tensors

KiB = 1024
T = 15.0  # seconds: bound of every wait here (a hang guard, not a timing check)


def wait_until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + T
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class Sends:
    """Wraps an endpoint's ``send_bytes``: the tokens of each send call, in order."""

    def __init__(self, ep: Endpoint) -> None:
        self.calls: list[int] = []
        orig = ep.send_bytes

        def send_bytes(data: Any, timeout: float | None = None) -> None:
            self.calls.append(len(data) // 32)
            orig(data, timeout)

        ep.send_bytes = send_bytes  # type: ignore[method-assign]


@pytest.fixture
def setup(
    kind: str,
) -> Iterator[tuple[TensorSharingManager, InstanceClient, InstanceClient, Sends]]:
    pool = TensorPool(64 * KiB, size_classes=(4 * KiB,), slab_bytes=16 * KiB)
    ch = open_channel(kind, "least-loaded")
    mgr = TensorSharingManager(pool, ch, hops=(0, 1))
    mgr.start()
    eps = []
    try:
        prod_ep = Endpoint(mgr.add_instance(0, 1), instance=1)
        cons_ep = Endpoint(mgr.add_instance(1, 6), instance=6)
        eps = [prod_ep, cons_ep]
        prod = InstanceClient(prod_ep, SlabMap(pool.service_id), 1, 0, max_out_tokens=0)
        cons = InstanceClient(cons_ep, SlabMap(pool.service_id), 6, 1, max_out_tokens=2)
        yield mgr, prod, cons, Sends(cons_ep)
    finally:
        for ep in eps:
            ep.close()
        mgr.stop()
        ch.close()
        pool.close()


def _send(prod: InstanceClient, request: int) -> None:
    tensors = {"x": np.arange(64, dtype=np.float32) + request}
    slot, view = prod.acquire(tensors_nbytes(tensors), request, timeout=T)
    used = write_tensors(view, tensors)
    del view
    prod.hand_over(slot, 1, request, used)


def _receipts_and_releases(mgr: TensorSharingManager) -> tuple[int, int]:
    s = mgr.stats()["manager"]
    return s["receipts"], s["frees"] + s["keeps"]


def test_receipts_and_frees_of_a_batch_leave_in_one_send(setup: Any) -> None:
    mgr, prod, cons, sends = setup
    for r in (3, 4):
        _send(prod, r)
    sends.calls.clear()
    with cons.batched():
        wait_until(lambda: cons.poll(0.05) >= 0 and cons.queued() == 2, "both DATA here")
        for keep in (True, False):
            tok, tensors = cons.recv_input(0)
            assert float(tensors["x"][0]) == tok.request
            del tensors
            cons.done(tok, keep=keep)
        assert sends.calls == []  # nothing left before the block's end
        assert _receipts_and_releases(mgr) == (0, 0)  # so the manager saw none of them
    # the receipts came with the DATA's poll; keep and free after: one send of four tokens
    assert sends.calls == [4]
    wait_until(lambda: _receipts_and_releases(mgr) == (2, 2), "receipts, keep and free")
    assert mgr.audit() == []


def test_data_leaves_at_once_inside_a_batch(setup: Any) -> None:
    mgr, prod, cons, _ = setup
    with prod.batched():
        _send(prod, 9)  # the fault and the DATA are not held back by the block
        tok, tensors = cons.recv_input(T)
        assert tok.request == 9 and float(tensors["x"][0]) == 9.0
        del tensors
    cons.done(tok, keep=False)
    wait_until(lambda: _receipts_and_releases(mgr) == (1, 1), "receipt and free")
    assert mgr.audit() == []


def test_a_busy_answer_raises_at_once_without_retry_busy(setup: Any) -> None:
    # the front end's hand-over: at the pool's cap one FAULT, one BUSY, then
    # BackPressureError (it waits for a freed slot, not polling the manager)
    from infscaler.shm import BackPressureError

    mgr, prod, _, _ = setup
    held = []
    while True:  # take every slot the cap allows
        try:
            held.append(prod.acquire(4 * KiB - 64, 100 + len(held), timeout=1.0, retry_busy=False))
        except BackPressureError as exc:
            assert "memory cap" in str(exc)
            break
        assert len(held) <= 64, "the pool never answered BUSY"
    faults, busy = prod.counters["faults"], prod.counters["busy"]
    assert busy == 1 and faults == len(held) + 1
    with pytest.raises(BackPressureError):
        prod.acquire(4 * KiB - 64, 999, timeout=T, retry_busy=False)
    assert (prod.counters["faults"], prod.counters["busy"]) == (faults + 1, busy + 1)
    with pytest.raises(BackPressureError):  # the default retries BUSY until its timeout
        prod.acquire(4 * KiB - 64, 999, timeout=2.0)
    assert prod.counters["busy"] >= busy + 3  # 1 above, then at least 2 in the retries
    for slot, view in held:
        del view
        prod.discard(slot)
    wait_until(lambda: mgr.stats()["pool"]["slots_in_use"] == 0, "every slot freed")
    assert mgr.audit() == []
