"""Tensor sharing manager + instance client (infscaler.shm.manager), end to end.

Every test runs on both control channels: ``ebpf`` (skipped, with the probe's reason,
where the host cannot load the program) and ``userspace``. Instances are separate
processes (this file run as a script: ``python tests/integration/shm/test_shm_manager.py ROLE ...``)
that inherit only their instance socket and attach the pool's slabs by name; the test
process is the service: manager thread, front end (a stage-0 producer and a sink
instance) and supervisor (kill -9, then ``instance_died``).

What is checked: lazy slabs and BUSY at the cap with progress after frees; a 3-stage
pipeline moving thousands of requests through real slots with checksummed tensors and
zero-copy reads; a stage instance killed mid-stream (its requests retried, each request
completed exactly once, no slot leaked); a producer killed right after a handover (the
consumer keeps its slot, intact); a producer and then its consumer dying before the
consumer read the slot (the slot waits, held, for a new consumer); the retry limit;
forged / stale tokens refused and counted with nothing changed; DATA for a stage
without instances held, re-routed or failed. Every blocking call has a timeout; nothing
asserts on timing.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from infscaler.ebpf import Endpoint, open_channel
from infscaler.shm import (
    BackPressureError,
    InstanceClient,
    RequestFailed,
    SlabMap,
    TensorPool,
    Token,
    TokenKind,
    tensors_nbytes,
    write_tensors,
)
from infscaler.shm.manager import (
    CONTROL_HOP,
    MANAGER_INSTANCE,
    NO_REQUEST,
    TensorSharingManager,
)
from infscaler.shm.tensors import allocate_tensors

T = 15.0  # seconds: bound of every wait in this file (a hang guard, not a timing check)
KiB, MiB = 1024, 1024 * 1024
STOP = NO_REQUEST  # ERROR(request=STOP) tells a worker to release its out-tokens and exit
SMALL = dict(size_classes=(4 * KiB,), slab_bytes=4 * 4 * KiB)  # 4 slots of 4 KiB per slab
SLAB_NBYTES = 4 * KiB + 4 * 4 * KiB


# -- payloads: deterministic per request, checksummed ----------------------------------------


def base_x(request: int, max_n: int) -> np.ndarray:
    rng = np.random.default_rng(request)
    n = int(rng.integers(1, max_n))
    return rng.standard_normal(n).astype(np.float32)


def expected_x(request: int, hops: int, max_n: int) -> np.ndarray:
    """The stage-0 tensor after ``hops`` stages (each adds 1.0f, in float32)."""
    x = base_x(request, max_n)
    for _ in range(hops):
        x = x + np.float32(1)
    return x


def crc(arr: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def make_tensors(request: int, x: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "x": x,
        "request": np.array(request, np.uint64),
        "crc": np.array(crc(x), np.uint32),
    }


def check_tensors(tensors: dict[str, np.ndarray], request: int) -> str | None:
    """None if the slot holds request ``request``'s tensors with a matching checksum."""
    if list(tensors) != ["x", "request", "crc"]:
        return f"request {request}: tensors {list(tensors)}"
    if int(tensors["request"]) != request:
        return f"request {request}: slot holds request {int(tensors['request'])}"
    if crc(tensors["x"]) != int(tensors["crc"]):
        return f"request {request}: checksum mismatch"
    return None


def zero_copy(slabs: SlabMap, tok: Token, tensors: dict[str, np.ndarray]) -> bool:
    """Every tensor is a read-only view inside the token's slot of the shared slab."""
    base = np.frombuffer(slabs.slab_view(tok.slab), np.uint8).ctypes.data
    for arr in tensors.values():
        addr = arr.ctypes.data - base
        if arr.flags.writeable or not tok.offset <= addr < tok.offset + tok.length:
            return False
    return True


# -- worker processes (this file as a script) -----------------------------------------------


def _client(args: argparse.Namespace) -> tuple[InstanceClient, SlabMap]:
    ep = Endpoint(args.fd, instance=args.instance)
    slabs = SlabMap(args.service)
    return (
        InstanceClient(ep, slabs, args.instance, args.stage, max_out_tokens=args.max_out_tokens),
        slabs,
    )


def _report(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)


def worker_stage(args: argparse.Namespace) -> int:
    """A pipeline stage: input x -> output x + 1, checked and re-checksummed."""
    client, slabs = _client(args)
    processed, bad, not_zero_copy, stopped, requests = 0, [], 0, False, []
    while True:
        try:
            tok, tensors = client.recv_input(timeout=60)
        except RequestFailed as exc:
            if exc.request == STOP:
                stopped = True
                break
            bad.append(f"request {exc.request} failed")
            continue
        problem = check_tensors(tensors, tok.request)
        if problem:
            bad.append(problem)
        if not zero_copy(slabs, tok, tensors):
            not_zero_copy += 1
        x = tensors["x"]
        specs = {"x": (x.shape, x.dtype), "request": ((), np.uint64), "crc": ((), np.uint32)}
        nbytes = tensors_nbytes(specs)
        slot, view = client.acquire(nbytes, tok.request, timeout=30)
        out = allocate_tensors(view, specs)
        np.add(x, np.float32(1), out=out["x"])
        out["request"][()] = tok.request
        out["crc"][()] = crc(out["x"])
        del out, view, tensors, x
        client.hand_over(slot, args.to_stage, tok.request, nbytes)
        client.done(tok)
        processed += 1
        requests.append(tok.request)
        if args.delay_ms:
            time.sleep(args.delay_ms / 1000)
    released = client.release_out_tokens()
    _report(
        {
            "processed": processed,
            "bad": bad[:5],
            "not_zero_copy": not_zero_copy,
            "stopped": stopped,
            "released": released,
            "requests": requests,
            **client.stats(),
        }
    )
    return 0


def worker_producer(args: argparse.Namespace) -> int:
    """A stage-0 producer: ``count`` requests from ``base``, each faulted, written, handed over."""
    client, _ = _client(args)
    for i in range(args.count):
        request = args.base + i
        tensors = make_tensors(request, base_x(request, args.max_n))
        slot, view = client.acquire(tensors_nbytes(tensors), request, timeout=60)
        used = write_tensors(view, tensors)
        del view
        client.hand_over(slot, args.to_stage, request, used)
    _report({"sent": args.count, **client.stats()})
    return 0


def worker_handover(args: argparse.Namespace) -> int:
    """Acquire two slots (requests base, base+1), write both, hand over only the first,
    report, then wait to be killed."""
    client, _ = _client(args)
    slots = []
    for request in (args.base, args.base + 1):
        tensors = make_tensors(request, base_x(request, args.max_n))
        slot, view = client.acquire(tensors_nbytes(tensors), request, timeout=30)
        used = write_tensors(view, tensors)
        del view
        slots.append((slot, request, used))
    slot, request, used = slots[0]
    client.hand_over(slot, args.to_stage, request, used)
    _report({"ready": True, "slots": [[s.slab, s.slot] for s, _, _ in slots]})
    sys.stdin.read()  # until killed
    return 0


def worker_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["stage", "producer", "handover"])
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--instance", type=int, required=True)
    ap.add_argument("--stage", type=int, required=True)
    ap.add_argument("--service", required=True)
    ap.add_argument("--to-stage", type=int, default=1)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--base", type=int, default=0)
    ap.add_argument("--max-n", type=int, default=1000)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--max-out-tokens", type=int, default=2)
    args = ap.parse_args(argv)
    role = {"stage": worker_stage, "producer": worker_producer, "handover": worker_handover}
    return role[args.role](args)


if __name__ == "__main__":  # pragma: no cover - worker process
    raise SystemExit(worker_main(sys.argv[1:]))


# -- harness ----------------------------------------------------------------------------------


@dataclass
class Worker:
    instance: int
    proc: subprocess.Popen[str]

    def result(self, timeout: float = T) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=T)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        res: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        res["returncode"] = self.proc.returncode
        res["stderr"] = err[-3000:]
        return res

    def read_line(self, timeout: float = T) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"worker {self.instance} printed nothing in {timeout} s"
        line = self.proc.stdout.readline()
        assert line.startswith("{"), f"worker {self.instance}: {line!r}"
        return json.loads(line)


@dataclass
class Service:
    """One service: pool, channel, manager, plus the workers and clients of a test."""

    pool: TensorPool
    ch: Any
    mgr: TensorSharingManager
    failures: list[tuple[int, str]]
    workers: list[Worker] = field(default_factory=list)
    clients: list[InstanceClient] = field(default_factory=list)
    endpoints: dict[int, Endpoint] = field(default_factory=dict)

    @property
    def service_id(self) -> str:
        return self.pool.service_id

    def client(self, instance: int, stage: int, **kw: Any) -> InstanceClient:
        ep = Endpoint(self.mgr.add_instance(stage, instance), instance=instance)
        self.endpoints[instance] = ep
        c = InstanceClient(ep, SlabMap(self.service_id), instance, stage, **kw)
        self.clients.append(c)
        return c

    def spawn(self, role: str, instance: int, stage: int, **opts: Any) -> Worker:
        sock = self.mgr.add_instance(stage, instance)
        cmd = [sys.executable, os.path.abspath(__file__), role, "--fd", str(sock.fileno())]
        cmd += ["--instance", str(instance), "--stage", str(stage), "--service", self.service_id]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        try:
            proc = subprocess.Popen(
                cmd,
                pass_fds=[sock.fileno()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            sock.close()
        w = Worker(instance, proc)
        self.workers.append(w)
        return w

    def stop_workers(self, instances: list[int]) -> dict[int, dict[str, Any]]:
        """STOP each worker, collect its report, then deregister it (clean exit)."""
        for i in instances:
            self.ch.manager_send(i, Token(TokenKind.ERROR, request=STOP))
        results = {}
        for w in self.workers:
            if w.instance in instances:
                results[w.instance] = w.result()
                assert results[w.instance]["returncode"] == 0, results[w.instance]
        for i in instances:
            # its last FREEs (out-tokens) were sent before it exited: let them land first
            # (the user-space router drops what it has not read when an instance is removed;
            # the reclaim would then free those slots itself, and report them)
            wait_until(
                lambda i=i: self.stats()["manager"]["instances"][i]["slots"] == 0,
                f"instance {i}'s last FREEs",
            )
            report = self.mgr.instance_died(i, timeout=T)
            assert report.complete and not (report.retried or report.failed or report.held), report
            assert report.freed == [] and report.handed_over == [], report
        return results

    def stats(self) -> dict[str, Any]:
        return self.mgr.stats()


@pytest.fixture
def service(kind: str) -> Iterator[Callable[..., Service]]:
    made: list[Service] = []

    def make(
        cap_bytes: int,
        *,
        policy: str = "least-loaded",
        stages: tuple[int, ...] = (0, 1, 2, 3),
        pool_kw: dict[str, Any] | None = None,
        **mgr_kw: Any,
    ) -> Service:
        pool = TensorPool(cap_bytes, **(pool_kw or {}))
        ch = open_channel(kind, policy)
        assert ch.kind == kind
        failures: list[tuple[int, str]] = []
        mgr = TensorSharingManager(
            pool, ch, hops=stages, on_failure=lambda r, why: failures.append((r, why)), **mgr_kw
        )
        svc = Service(pool, ch, mgr, failures)
        made.append(svc)
        mgr.start()
        return svc

    yield make
    for svc in made:
        for w in svc.workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.result()
        svc.mgr.stop()
        svc.ch.close()
        sid = svc.pool.service_id
        svc.pool.close()
        assert not [e for e in os.listdir("/dev/shm") if e.startswith(f"isc-{sid}-")]


def wait_until(
    pred: Callable[[], bool], what: str, timeout: float = T, step: Callable[[], Any] | None = None
) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.005)


# -- tests ---------------------------------------------------------------------------------------


def test_fault_burst_maps_slabs_lazily_answers_busy_at_the_cap_and_resumes(
    service: Callable[..., Service],
) -> None:
    """3 producer processes fault 18 slots into a pool of 8 (2 slabs of 4); the sink holds
    what it receives, so exactly 8 GRANTs go out, then only BUSY; once the sink frees,
    the producers' retries get slots again and everything arrives."""
    cap = 2 * SLAB_NBYTES
    svc = service(cap, stages=(0, 1), pool_kw=SMALL)
    assert svc.pool.stats()["slabs"] == 0 and svc.pool.stats()["mapped_bytes"] == 0
    sink = svc.client(9, 1, max_out_tokens=0)
    producers = {1: 0, 2: 1 << 32, 3: 2 << 32}
    per = 6
    for p, base in producers.items():
        svc.spawn("producer", p, 0, count=per, base=base, to_stage=1, max_n=500)
    got: Counter[int] = Counter()
    bad: list[str] = []

    def receive() -> tuple[Token, dict[str, np.ndarray]]:
        tok, tensors = sink.recv_input(timeout=T)
        problem = check_tensors(tensors, tok.request)
        if problem is None and not np.array_equal(tensors["x"], base_x(tok.request, 500)):
            problem = f"request {tok.request}: wrong values"
        if problem:
            bad.append(problem)
        got[tok.request] += 1
        return tok, tensors

    held = [receive() for _ in range(8)]
    wait_until(lambda: svc.stats()["manager"]["busy"] >= 1, "a BUSY answer at the cap")
    wait_until(
        lambda: svc.pool.stats()["owners"] == {9: 8}, "receipts moved the leases to the sink"
    )
    st = svc.stats()
    assert st["pool"]["slots_in_use"] == 8 and st["pool"]["slabs"] == 2
    assert st["pool"]["slabs_mapped"] == 2 and st["pool"]["mapped_bytes"] == cap
    assert st["manager"]["grants"] == 8
    with pytest.raises(TimeoutError):  # nothing gets through while the sink holds the pool
        sink.recv_input(timeout=0.3)
    for tok, _ in held:
        sink.done(tok)
    held.clear()
    while sum(got.values()) < per * len(producers):
        tok, tensors = receive()
        del tensors
        sink.done(tok)
    results = {w.instance: w.result() for w in svc.workers}
    for iid, res in results.items():
        assert res["returncode"] == 0 and res["sent"] == per, (iid, res)
    assert bad == []
    assert set(got) == {b + i for b in producers.values() for i in range(per)}
    assert max(got.values()) == 1
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "every slot freed")
    st = svc.stats()
    m = st["manager"]
    assert m["grants"] == per * len(producers)
    assert m["faults"] == m["grants"] + m["busy"]
    assert m["busy"] == sum(r["busy"] for r in results.values()) >= 1
    assert st["pool"]["slabs_mapped"] == 2 and st["pool"]["mapped_bytes"] <= cap
    assert m["rejected"] == 0 and m["internal_errors"] == 0 and m["failed"] == 0
    for p in producers:  # they exited cleanly: nothing to reclaim
        report = svc.mgr.instance_died(p, timeout=T)
        assert report.complete and report.freed == [] and report.retried == [], report
    assert svc.mgr.audit() == []


# -- the pipeline ----------------------------------------------------------------------------

N_REQUESTS = 3000
MAX_N = 1500  # float32 elements: slots of the 8 KiB class
PIPELINE_POOL = dict(slab_bytes=256 * KiB)


@dataclass
class FrontEndRun:
    got: Counter[int] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    not_zero_copy: int = 0


def front_end(
    svc: Service,
    n: int,
    *,
    window: int = 64,
    on_progress: Callable[[int], None] | None = None,
    deadline_s: float = 120.0,
) -> FrontEndRun:
    """Stage-0 producer (instance 100) and sink (instance 101, stage 3) in this process:
    keeps ``window`` requests in flight, checks every result bit for bit."""
    prod = svc.client(100, 0, max_out_tokens=0)
    sink = svc.client(101, 3, max_out_tokens=0)
    slabs = sink.slabs
    run = FrontEndRun()
    outstanding: set[int] = set()
    next_r = 0
    end = time.monotonic() + deadline_s
    while len(run.got) + len(run.failed) < n:
        assert time.monotonic() < end, f"{len(run.got)} of {n} done; {svc.stats()['manager']}"
        while next_r < n and len(outstanding) < window:
            tensors = make_tensors(next_r, base_x(next_r, MAX_N))
            try:
                slot, view = prod.acquire(tensors_nbytes(tensors), next_r, timeout=0.05)
            except BackPressureError:
                break
            used = write_tensors(view, tensors)
            del view
            prod.hand_over(slot, 1, next_r, used)
            outstanding.add(next_r)
            next_r += 1
        prod.poll(0)
        try:
            tok, tensors = sink.recv_input(timeout=0.2)
        except TimeoutError:
            continue
        except RequestFailed as exc:
            run.failed.append(exc.request)
            outstanding.discard(exc.request)
            continue
        r = tok.request
        problem = check_tensors(tensors, r)
        if problem is None and not np.array_equal(tensors["x"], expected_x(r, 2, MAX_N)):
            problem = f"request {r}: wrong values"
        if problem:
            run.bad.append(problem)
        if not zero_copy(slabs, tok, tensors):
            run.not_zero_copy += 1
        del tensors
        sink.done(tok)
        run.got[r] += 1
        outstanding.discard(r)
        if on_progress is not None:
            on_progress(sum(run.got.values()))
    with pytest.raises(TimeoutError):  # and nothing arrives twice
        sink.recv_input(timeout=0.3)
    return run


def check_pipeline_end(svc: Service, run: FrontEndRun, n: int) -> None:
    assert run.bad == [] and run.failed == [] and run.not_zero_copy == 0
    assert sorted(run.got) == list(range(n)), "every request completed"
    assert max(run.got.values()) == 1, "exactly once"
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "no slot left in use")
    assert svc.mgr.audit() == []
    st = svc.stats()
    assert st["manager"]["failed"] == 0 and st["manager"]["internal_errors"] == 0
    assert st["manager"]["rejected"] == 0, st["manager"]["rejections"]
    assert st["channel"]["rejected_total"] == 0
    assert svc.failures == []


def test_three_stage_pipeline_moves_thousands_of_requests(
    service: Callable[..., Service],
) -> None:
    svc = service(8 * MiB, pool_kw=PIPELINE_POOL)
    for iid, stage in ((11, 1), (12, 1), (21, 2)):
        svc.spawn("stage", iid, stage, to_stage=stage + 1)
    run = front_end(svc, N_REQUESTS)
    results = svc.stop_workers([11, 12, 21])
    for iid, res in results.items():
        assert res["bad"] == [] and res["not_zero_copy"] == 0 and res["stopped"], (iid, res)
    stage1 = results[11]["requests"] + results[12]["requests"]
    assert sorted(stage1) == list(range(N_REQUESTS)), "each request once through stage 1"
    assert results[11]["processed"] > 0 and results[12]["processed"] > 0
    assert sorted(results[21]["requests"]) == list(range(N_REQUESTS))
    # the OutToken queue: stages write into the input slots they kept, no fault needed
    assert results[21]["out_token_hits"] > 0
    check_pipeline_end(svc, run, N_REQUESTS)
    m = svc.stats()["manager"]
    assert m["retried"] == 0 and m["receipts"] >= 3 * N_REQUESTS
    print(
        f"\n{svc.ch.kind}: {N_REQUESTS} requests through 3 stages; manager {m['tokens']} tokens, "
        f"{m['faults']} faults, {m['keeps']} keeps; split {results[11]['processed']}/"
        f"{results[12]['processed']}"
    )


def test_stage_instance_killed_midstream_retries_its_requests(
    service: Callable[..., Service],
) -> None:
    """Round-robin to a slow and a fast stage-1 instance; the slow one (with a backlog)
    is killed with SIGKILL a third of the way through. Its unacknowledged inputs are
    retried on the other one; every request completes exactly once; nothing leaks."""
    svc = service(8 * MiB, policy="round-robin", pool_kw=PIPELINE_POOL)
    victim = svc.spawn("stage", 11, 1, to_stage=2, delay_ms=5)
    svc.spawn("stage", 12, 1, to_stage=2)
    svc.spawn("stage", 21, 2, to_stage=3)
    state: dict[str, Any] = {}

    def kill(done: int) -> None:
        if "report" in state or done < N_REQUESTS // 3:
            return
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(T)
        # the front end must keep serving its sockets (sync echoes): do not block here
        state["report"] = svc.mgr.instance_died(11, timeout=0)

    run = front_end(svc, N_REQUESTS, on_progress=kill)
    report = state["report"]
    assert report.wait(T), report
    assert report.retried, "the slow victim had a backlog of unacknowledged inputs"
    assert report.failed == [] and report.held == [] and report.pending == []
    assert set(report.retried) <= set(range(N_REQUESTS))
    assert svc.pool.held_by(11) == [], "every slot the victim held was reclaimed"
    results = svc.stop_workers([12, 21])
    for iid, res in results.items():
        assert res["bad"] == [] and res["not_zero_copy"] == 0, (iid, res)
    assert set(report.retried) <= set(results[12]["requests"]), "retried on the survivor"
    assert sorted(results[21]["requests"]) == list(range(N_REQUESTS))
    check_pipeline_end(svc, run, N_REQUESTS)
    m = svc.stats()["manager"]
    assert m["retried"] == len(report.retried) and m["deaths"] == 3
    assert m["reclaimed_slots"] == len(report.freed)
    print(
        f"\n{svc.ch.kind}: killed stage-1 instance 11 after {N_REQUESTS // 3} results: "
        f"{len(report.retried)} requests retried, {len(report.freed)} slots freed, "
        f"{len(report.handed_over)} handed over; {m['syncs_sent']} sync markers, "
        f"freed {[(r.slab, r.slot, r.request) for r in report.freed]}"
    )


def test_producer_killed_after_handover_leaves_the_consumer_its_slot(
    service: Callable[..., Service],
) -> None:
    """A producer process writes two slots, hands one over, and is killed with SIGKILL
    before the consumer has even read its socket. The handed-over slot stays leased
    (quarantined, never granted) until the consumer's receipt makes it the consumer's;
    the other slot is freed and its request reported failed."""
    svc = service(SLAB_NBYTES, stages=(0, 1), pool_kw=SMALL)  # 4 slots in all
    consumer = svc.client(1, 1)
    other = svc.client(2, 0, max_out_tokens=0)
    producer = svc.spawn("handover", 50, 0, base=1000, to_stage=1, max_n=500)
    ready = producer.read_line()
    (handed_slab, handed_slot), (kept_slab, kept_slot) = ready["slots"]
    os.kill(producer.proc.pid, signal.SIGKILL)
    producer.proc.wait(T)

    report = svc.mgr.instance_died(50, timeout=0)
    wait_until(lambda: len(report.pending) == 2, "the barrier: both slots quarantined")
    assert not report.complete
    assert {(r.slab, r.slot) for r in report.pending} == {
        (handed_slab, handed_slot),
        (kept_slab, kept_slot),
    }
    assert svc.pool.owner(handed_slab, handed_slot) == 50
    assert svc.pool.owner(kept_slab, kept_slot) == 50
    # another instance faults to the cap: it gets the 2 other slots, never these two
    granted = []
    with pytest.raises(BackPressureError):
        for i in range(3):
            slot, view = other.acquire(2000, 5000 + i, timeout=2.0)
            view[:4] = b"junk"
            del view
            granted.append(slot)
    assert len(granted) == 2
    assert not {(s.slab, s.slot) for s in granted} & {
        (handed_slab, handed_slot),
        (kept_slab, kept_slot),
    }
    assert not report.complete, "the consumer has not answered the sync marker yet"

    tok, tensors = consumer.recv_input(timeout=T)
    assert (tok.slab, tok.slot, tok.request) == (handed_slab, handed_slot, 1000)
    assert check_tensors(tensors, 1000) is None
    assert np.array_equal(tensors["x"], base_x(1000, 500))
    wait_until(lambda: report.complete, "the reclaim completes", step=lambda: consumer.poll(0.05))
    assert [(r.slab, r.slot) for r in report.handed_over] == [(handed_slab, handed_slot)]
    assert [(r.slab, r.slot) for r in report.freed] == [(kept_slab, kept_slot)]
    assert [r for r, _ in report.failed] == [1001] and report.retried == []
    assert svc.pool.owner(handed_slab, handed_slot) == 1, "the lease moved to the consumer"
    assert svc.pool.owner(kept_slab, kept_slot) is None
    wait_until(lambda: len(svc.failures) == 1, "on_failure called")
    assert [r for r, _ in svc.failures] == [1001]
    # the freed slot is granted again; the consumer's slot is untouched by that
    slot, view = other.acquire(2000, 5010, timeout=T)
    assert (slot.slab, slot.slot) == (kept_slab, kept_slot)
    view[:] = b"\xff" * len(view)
    del view
    assert check_tensors(tensors, 1000) is None
    assert np.array_equal(tensors["x"], base_x(1000, 500))
    del tensors
    consumer.done(tok, keep=False)
    for s in [*granted, slot]:
        other.discard(s)
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "everything freed")
    m = svc.stats()["manager"]
    assert m["handed_over"] == 1 and m["reclaimed_slots"] == 1 and m["failed"] == 1
    assert m["rejected"] == 0 and m["internal_errors"] == 0
    assert svc.mgr.audit() == []


def test_forged_and_stale_tokens_are_refused_counted_and_harmless(
    service: Callable[..., Service],
) -> None:
    svc = service(2 * SLAB_NBYTES, stages=(0, 1), pool_kw=SMALL)
    a = svc.client(1, 0, max_out_tokens=0)
    b = svc.client(2, 0, max_out_tokens=0)
    c = svc.client(3, 1, max_out_tokens=0)
    tensors_a = make_tensors(10, base_x(10, 500))
    tensors_b = make_tensors(20, base_x(20, 500))
    sa, view = a.acquire(tensors_nbytes(tensors_a), 10, timeout=T)
    used_a = write_tensors(view, tensors_a)
    sb, view = b.acquire(tensors_nbytes(tensors_b), 20, timeout=T)
    write_tensors(view, tensors_b)
    del view
    a.hand_over(sa, 1, 10, used_a)
    tok, got = c.recv_input(timeout=T)  # c reads sa now
    wait_until(lambda: svc.pool.owner(sa.slab, sa.slot) == 3, "c's receipt")
    before = svc.pool.stats()["owners"]
    assert before == {2: 1, 3: 1}
    free_slot = next(i for i in range(4) if i not in (sa.slot, sb.slot))

    def tok_(kind: TokenKind, ref: Token, instance: int = 1, **kw: int) -> Token:
        fields = dict(
            hop=1,
            slab=ref.slab,
            instance=instance,
            slot=ref.slot,
            offset=ref.offset,
            length=ref.length if kind != TokenKind.DATA else 100,
            request=ref.request,
        )
        fields.update(kw)
        return Token(kind, **fields)

    F, G = TokenKind.FREE, TokenKind.GRANT
    forged = {
        "wrong_owner": [
            tok_(F, sb),  # someone else's slot
            tok_(F, sa, request=10),  # a slot a handed over: c's now
            tok_(F, sb, hop=CONTROL_HOP),  # keep of someone else's slot
        ],
        "double_free": [tok_(F, sa, slot=free_slot, offset=4096 + free_slot * 4096)],
        "unknown_slot": [tok_(F, sa, slot=99), tok_(F, sa, slab=40)],
        "bad_offset": [tok_(F, sb, instance=2, offset=sb.offset + 64)],
        "stale_receipt": [tok_(G, sa, slot=free_slot, offset=4096 + free_slot * 4096)],
        "request_mismatch": [tok_(G, sb, request=99)],
        "malformed": [Token(TokenKind.ERROR, hop=1, instance=1, request=5)],
        "unknown_sync": [Token(TokenKind.BUSY, hop=CONTROL_HOP, instance=1, request=12345)],
        "unknown_instance": [
            Token(TokenKind.FAULT, hop=0, instance=77, length=100, request=1),
            tok_(F, sb, instance=77),
        ],
    }
    ep = svc.endpoints[1]
    ep.send_many([t for ts in forged.values() for t in ts])
    total = sum(len(ts) for ts in forged.values())
    wait_until(lambda: svc.stats()["manager"]["rejected"] == total, f"{total} rejections")
    m = svc.stats()["manager"]
    assert m["rejections"] == {reason: len(ts) for reason, ts in forged.items()}
    assert m["frees"] == 0 and m["internal_errors"] == 0
    assert svc.pool.stats()["owners"] == before, "nothing changed"
    assert svc.mgr.audit() == []
    # the two rejected receipts were answered with ERROR (the sender must not read them)
    for _ in range(2):
        with pytest.raises(RequestFailed):
            a.recv_input(timeout=T)
    # the real holders are unharmed: c still reads sa intact, b hands sb over and c gets it
    assert check_tensors(got, 10) is None and np.array_equal(got["x"], base_x(10, 500))
    del got
    c.done(tok)
    b.hand_over(sb, 1, 20, tensors_nbytes(tensors_b))
    tok2, got2 = c.recv_input(timeout=T)
    assert tok2.request == 20 and check_tensors(got2, 20) is None
    del got2
    c.done(tok2)
    # replaying c's own FREEs: double frees
    ep_c = svc.endpoints[3]
    ep_c.send_many(
        [tok_(F, tok, instance=3, length=tok.length), tok_(F, tok2, instance=3, length=tok2.length)]
    )
    wait_until(lambda: svc.stats()["manager"]["rejected"] == total + 2, "replayed FREEs refused")
    m = svc.stats()["manager"]
    assert m["rejections"]["double_free"] == 3 and m["frees"] == 2
    assert svc.pool.stats()["slots_in_use"] == 0
    assert svc.mgr.audit() == []


def test_data_without_live_instance_is_held_then_rerouted_or_failed(
    service: Callable[..., Service],
) -> None:
    svc = service(2 * SLAB_NBYTES, stages=(0, 1, 2), pool_kw=SMALL, hold_timeout_s=1.0)
    prod = svc.client(1, 0, max_out_tokens=0)
    svc.mgr.add_instance(1, 5).close()  # stage 1 exists, but its only instance is gone
    assert svc.mgr.instance_died(5, timeout=T).complete

    def send(request: int, stage: int) -> Token:
        tensors = make_tensors(request, base_x(request, 500))
        slot, view = prod.acquire(tensors_nbytes(tensors), request, timeout=T)
        used = write_tensors(view, tensors)
        del view
        prod.hand_over(slot, stage, request, used)
        return slot

    s7 = send(7, 1)
    wait_until(lambda: svc.stats()["manager"]["slots_held"] == 1, "the manager holds the DATA")
    assert svc.pool.owner(s7.slab, s7.slot) == MANAGER_INSTANCE
    cons = svc.client(6, 1)  # an instance of stage 1 appears: the held DATA goes to it
    tok, tensors = cons.recv_input(timeout=T)
    assert (tok.slab, tok.slot, tok.request) == (s7.slab, s7.slot, 7)
    assert check_tensors(tensors, 7) is None and np.array_equal(tensors["x"], base_x(7, 500))
    del tensors
    wait_until(lambda: svc.pool.owner(s7.slab, s7.slot) == 6, "the receipt")
    cons.done(tok, keep=False)

    s8 = send(8, 2)  # a pipeline stage that never gets an instance: ERROR after the hold
    with pytest.raises(RequestFailed) as failed8:
        prod.recv_input(timeout=T)
    assert failed8.value.request == 8
    assert (failed8.value.token.slab, failed8.value.token.slot) == (s8.slab, s8.slot)
    send(9, 5)  # not a stage of this pipeline: ERROR at once
    with pytest.raises(RequestFailed) as failed9:
        prod.recv_input(timeout=T)
    assert failed9.value.request == 9
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "the failed requests' slots freed")
    wait_until(lambda: len(svc.failures) == 2, "on_failure called for both")
    assert sorted(r for r, _ in svc.failures) == [8, 9]
    m = svc.stats()["manager"]
    assert m["failed"] == 2 and m["held"] == 3 and m["routed"] == 1
    assert m["rejections"] == {"unknown_stage": 1}
    assert svc.mgr.audit() == []


def test_producer_then_consumer_die_and_the_slot_waits_for_a_new_consumer(
    service: Callable[..., Service],
) -> None:
    """In-process instances: a producer hands a slot to the only consumer of stage 1 and
    dies; the consumer dies too before reading it. The slot is never freed: the
    consumer's reclaim returns the DATA, the manager holds it (no live instance of
    stage 1), and a new instance of stage 1 gets it intact."""
    svc = service(SLAB_NBYTES, stages=(0, 1), pool_kw=SMALL)
    prod = svc.client(1, 0, max_out_tokens=0)
    svc.client(2, 1)  # the consumer: never reads
    tensors = make_tensors(42, base_x(42, 500))
    slot, view = prod.acquire(tensors_nbytes(tensors), 42, timeout=T)
    used = write_tensors(view, tensors)
    del view
    prod.hand_over(slot, 1, 42, used)
    # delivered (the user-space router hands tokens over asynchronously): else the DATA
    # could reach the channel after the consumer's removal and be held without a reclaim
    wait_until(lambda: svc.ch.stats()["instances"][2]["inflight"] == 1, "the DATA delivered")
    svc.endpoints[1].close()  # the producer is gone
    report_p = svc.mgr.instance_died(1, timeout=0)
    wait_until(lambda: report_p.pending, "the producer's slot quarantined")
    assert svc.pool.owner(slot.slab, slot.slot) == 1
    svc.endpoints[2].close()  # so is the consumer, which never read the DATA
    report_c = svc.mgr.instance_died(2, timeout=T)
    assert report_c.complete and report_c.held == [42] and report_c.retried == []
    assert report_p.wait(T)
    assert [(r.slab, r.slot) for r in report_p.handed_over] == [(slot.slab, slot.slot)]
    assert report_p.freed == [] and report_p.failed == []
    assert svc.pool.owner(slot.slab, slot.slot) == MANAGER_INSTANCE
    new = svc.client(3, 1)
    tok, got = new.recv_input(timeout=T)
    assert (tok.slab, tok.slot, tok.request) == (slot.slab, slot.slot, 42)
    assert check_tensors(got, 42) is None and np.array_equal(got["x"], base_x(42, 500))
    del got
    new.done(tok, keep=False)
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "freed by the new consumer")
    m = svc.stats()["manager"]
    assert m["failed"] == 0 and m["rejected"] == 0 and m["internal_errors"] == 0
    assert svc.mgr.audit() == []


def test_retry_limit_fails_the_request_and_tells_its_producer(
    service: Callable[..., Service],
) -> None:
    svc = service(SLAB_NBYTES, stages=(0, 1), pool_kw=SMALL, max_retries=0)
    prod = svc.client(1, 0, max_out_tokens=0)
    consumers = [svc.client(2, 1), svc.client(3, 1)]  # either could take a retry
    tensors = make_tensors(7, base_x(7, 500))
    slot, view = prod.acquire(tensors_nbytes(tensors), 7, timeout=T)
    used = write_tensors(view, tensors)
    del view
    prod.hand_over(slot, 1, 7, used)
    wait_until(
        lambda: any(c.poll(0.01) for c in consumers),
        "the DATA reaches a consumer",
        step=lambda: None,
    )
    receiver = next(c for c in consumers if c.stats()["queued"])
    tok, got = receiver.recv_input(timeout=T)  # received (receipt sent), then it dies
    del got
    svc.endpoints[receiver.instance].close()
    report = svc.mgr.instance_died(receiver.instance, timeout=T)
    assert report.complete and report.retried == []
    assert [r for r, _ in report.failed] == [7]
    with pytest.raises(RequestFailed) as failed:
        prod.recv_input(timeout=T)
    assert failed.value.request == 7
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "the failed request's slot freed")
    wait_until(lambda: [r for r, _ in svc.failures] == [7], "on_failure")
    assert svc.mgr.audit() == []


def test_held_data_waits_for_a_loading_instance_until_it_is_live(
    service: Callable[..., Service],
) -> None:
    # the supervisor adds an instance with live=False while it loads its model: held DATA
    # stays with the manager until set_live, then goes to it at once
    svc = service(2 * SLAB_NBYTES, stages=(0, 1), pool_kw=SMALL, hold_timeout_s=30.0)
    prod = svc.client(1, 0, max_out_tokens=0)
    ep = Endpoint(svc.mgr.add_instance(1, 6, live=False), instance=6)
    svc.endpoints[6] = ep
    cons = InstanceClient(ep, SlabMap(svc.service_id), 6, 1)
    svc.clients.append(cons)
    tensors = make_tensors(7, base_x(7, 500))
    slot, view = prod.acquire(tensors_nbytes(tensors), 7, timeout=T)
    used = write_tensors(view, tensors)
    del view
    prod.hand_over(slot, 1, 7, used)
    wait_until(lambda: svc.stats()["manager"]["slots_held"] == 1, "the manager holds the DATA")
    assert svc.pool.owner(slot.slab, slot.slot) == MANAGER_INSTANCE
    svc.mgr.set_live(6)
    tok, got = cons.recv_input(timeout=T)
    assert (tok.slab, tok.slot, tok.request) == (slot.slab, slot.slot, 7)
    assert check_tensors(got, 7) is None
    del got
    cons.done(tok, keep=False)
    svc.mgr.set_live(99)  # unknown: ignored
    wait_until(lambda: svc.pool.stats()["slots_in_use"] == 0, "the slot freed")
    assert svc.mgr.audit() == []
