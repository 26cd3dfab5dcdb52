"""One-hop token handover: latency and throughput of the control path vs baselines
(InfScaler §IV-B, shaped like paper Fig. 6 "tensor sharing overhead against baselines").

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``handover.py``.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from multiprocessing import reduction
from pathlib import Path
from typing import Any

import harness
import numpy as np

harness.host.default_cache_dir()

from infscaler.ebpf.channel import (  # noqa: E402
    MAX_BATCH,
    Endpoint,
    frame_fields,
    pack_frame,
    valid_frame,
)
from infscaler.ebpf.probe import ebpf_available, open_channel  # noqa: E402
from infscaler.ebpf.token import NO_SLAB, TOKEN_SIZE, TokenKind  # noqa: E402

MECHANISMS = ["ebpf", "userspace", "direct", "mpqueue", "shmring"]
TARGET_P50_US = 15.0
TARGET_RATIO = 0.5

_DATA = int(TokenKind.DATA)
PRODUCER_ID = 100
NOREPLY = 1 << 63  # request-id flag: a throughput token, not answered
STOP = (1 << 63) - 1  # request id of the end-of-run token (one per consumer)
IO_TIMEOUT_S = 60.0  # a bound on every wait, not a performance figure
RING_SLOTS = 4096
RING_HDR = 128  # head u64 at 0, tail u64 at 64 (own cache lines), slots from 128
RING_BYTES = RING_HDR + RING_SLOTS * TOKEN_SIZE


# ---------------------------------------------------------------------------------------
# busy-polling SPSC ring in shared memory (the SPRIGHT-style baseline)
# ---------------------------------------------------------------------------------------
class SpscRing:
    """Single-producer single-consumer ring of 32-byte frames over a shared buffer.

    ``head`` (written by the producer only) and ``tail`` (consumer only) are u64
    counters on separate cache lines; a slot is written before ``head`` moves past it.
    On x86 (TSO) stores become visible in program order, so no fence is needed; the
    consumer CRC-checks every frame anyway. Both sides spin (SPRIGHT / DPDK style).
    """

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.head = 0  # producer's copy
        self.tail = 0  # consumer's copy
        self._tail_seen = 0  # producer's last read of the consumer's tail
        self.words = buf[:RING_HDR].cast("Q")  # [0] head, [8] tail

    def put(self, frame: bytes, deadline_ns: int) -> None:
        h = self.head
        if h - self._tail_seen >= RING_SLOTS:
            spins = 0
            while h - self.words[8] >= RING_SLOTS:
                spins += 1
                if not spins & 0xFFFF and time.monotonic_ns() > deadline_ns:
                    raise TimeoutError("ring full past the deadline")
            self._tail_seen = self.words[8]
        off = RING_HDR + (h & (RING_SLOTS - 1)) * TOKEN_SIZE
        self.buf[off : off + TOKEN_SIZE] = frame
        self.words[0] = h + 1
        self.head = h + 1

    def get(self, max_frames: int, deadline_ns: int) -> bytes:
        """Spin until at least one frame is there; return up to ``max_frames``."""
        t = self.tail
        words = self.words
        spins = 0
        while True:
            h = words[0]
            if h != t:
                break
            spins += 1
            if not spins & 0xFFFF and time.monotonic_ns() > deadline_ns:
                raise TimeoutError("ring empty past the deadline")
        n = min(h - t, max_frames, RING_SLOTS - (t & (RING_SLOTS - 1)))  # no wrap per read
        off = RING_HDR + (t & (RING_SLOTS - 1)) * TOKEN_SIZE
        out = bytes(self.buf[off : off + n * TOKEN_SIZE])
        words[8] = t + n
        self.tail = t + n
        return out

    def release(self) -> None:
        self.words.release()
        self.buf.release()


def _rings(fd: int, n: int) -> tuple[mmap.mmap, list[SpscRing], list[SpscRing]]:
    """Map the memfd: request ring i at 2i, reply ring i at 2i+1."""
    mm = mmap.mmap(fd, 2 * n * RING_BYTES)
    view = memoryview(mm)
    reqs = [SpscRing(view[2 * i * RING_BYTES : (2 * i + 1) * RING_BYTES]) for i in range(n)]
    reps = [SpscRing(view[(2 * i + 1) * RING_BYTES : (2 * i + 2) * RING_BYTES]) for i in range(n)]
    view.release()
    return mm, reqs, reps


# ---------------------------------------------------------------------------------------
# worker side (runs in the spawned processes)
# ---------------------------------------------------------------------------------------
class _Transport:
    """One process's view of a mechanism: send / receive 32-byte frames.

    ``send(frame, i)``: i is the consumer index (used by ``direct`` and ``shmring``, where
    the producer picks; the channels route by themselves, the queue is shared).
    ``recv(i)``: frames (a multiple of 32 bytes, at least one), CRC-checked.
    """

    def __init__(self, mech: str, role: str, index: int, n: int, fds: list[int], queues) -> None:
        self.mech, self.role, self.index, self.n = mech, role, index, n
        self.rejected = 0
        self._mm = None
        self.deadline_ns = 0
        self.arm()
        if mech in ("ebpf", "userspace", "direct"):
            self.eps = [Endpoint(socket.socket(fileno=fd)) for fd in fds]
        elif mech == "mpqueue":
            self.req_q, self.rep_q = queues
        elif mech == "shmring":
            self._mm, self.reqs, self.reps = _rings(fds[0], n)
            os.close(fds[0])
        else:
            raise ValueError(mech)

    def arm(self, seconds: float = IO_TIMEOUT_S) -> None:
        self.deadline_ns = time.monotonic_ns() + int(seconds * 1e9)

    def send(self, frame: bytes, i: int) -> None:
        m = self.mech
        if m == "ebpf" or m == "userspace":
            self.eps[0].send_bytes(frame, IO_TIMEOUT_S)
        elif m == "direct":
            self.eps[i if self.role == "producer" else 0].send_bytes(frame, IO_TIMEOUT_S)
        elif m == "mpqueue":
            (self.req_q if self.role == "producer" else self.rep_q).put(frame)
        else:
            ring = self.reqs[i] if self.role == "producer" else self.reps[self.index]
            ring.put(frame, self.deadline_ns)

    def recv(self, i: int) -> bytes:
        m = self.mech
        if m == "ebpf" or m == "userspace" or m == "direct":
            ep = self.eps[i if (m == "direct" and self.role == "producer") else 0]
            data = ep.recv_bytes(MAX_BATCH, IO_TIMEOUT_S)
            if not data:
                raise TimeoutError(f"{m}: nothing received in {IO_TIMEOUT_S} s")
            self.rejected = sum(e.rejected for e in self.eps)
            return data
        if m == "mpqueue":
            q = self.rep_q if self.role == "producer" else self.req_q
            data = q.get(timeout=IO_TIMEOUT_S)
        else:
            ring = self.reps[i] if self.role == "producer" else self.reqs[self.index]
            data = ring.get(MAX_BATCH, self.deadline_ns)
        # the sockets' Endpoint checks magic / kind / CRC; do the same work here
        good = [
            data[off : off + TOKEN_SIZE]
            for off in range(0, len(data), TOKEN_SIZE)
            if valid_frame(data, off)
        ]
        if len(good) * TOKEN_SIZE != len(data):
            self.rejected += len(data) // TOKEN_SIZE - len(good)
            data = b"".join(good)
        return data

    def close(self) -> None:
        if self.mech in ("ebpf", "userspace", "direct"):
            for ep in self.eps:
                ep.close()
        elif self.mech == "shmring":
            for r in self.reqs + self.reps:
                r.release()
            self._mm.close()


def _producer(tr: _Transport, cmd: dict[str, Any]) -> dict[str, Any]:
    n = cmd["n"]
    # -- latency: ping-pong, RTT / 2 ------------------------------------------------------
    warmup, iters = cmd["warmup"], cmd["iters"]
    t_begin = time.monotonic_ns()
    warm_end = t_begin + int(cmd["lat_budget_s"] * 0.25e9)  # warm-up: at most 1/4 of it
    budget_end = t_begin + int(cmd["lat_budget_s"] * 1e9)
    tr.arm()
    rtt: list[int] = []
    mismatched = 0
    clock = time.perf_counter_ns
    k = 0
    while k < warmup + iters:
        i = k % n
        frame = pack_frame(_DATA, 1, NO_SLAB, PRODUCER_ID, 0, 0, 0, k + 1)
        t0 = clock()
        tr.send(frame, i)
        reply = tr.recv(i)
        t1 = clock()
        if len(reply) != TOKEN_SIZE or frame_fields(reply)[8] != k + 1:
            mismatched += 1
        k += 1
        if k <= warmup:
            if k < warmup and time.monotonic_ns() > warm_end:
                warmup = k  # the warm-up ends here
            continue
        rtt.append(t1 - t0)
        if len(rtt) >= 50 and time.monotonic_ns() > budget_end:
            break
    # -- throughput: stream, one token per send ---------------------------------------------
    count = cmd["count"]
    frames = [
        pack_frame(_DATA, 1, NO_SLAB, PRODUCER_ID, 0, 0, 0, NOREPLY | k) for k in range(count)
    ]
    stop = pack_frame(_DATA, 1, NO_SLAB, PRODUCER_ID, 0, 0, 0, STOP)
    tr.arm()
    budget_ns = int(cmd["tp_budget_s"] * 1e9)
    send = tr.send
    t_start = time.monotonic_ns()
    sent = 0
    for k in range(count):
        send(frames[k], k % n)
        sent += 1
        if not k & 63 and time.monotonic_ns() - t_start > budget_ns:
            break
    t_sent = time.monotonic_ns()
    for i in range(n):  # n consecutive tokens: one per consumer on every mechanism
        send(stop, (sent + i) % n)
    return {
        "rtt_ns": rtt,
        "warmup_done": warmup,
        "mismatched_replies": mismatched,
        "sent": sent,
        "t_start_ns": t_start,
        "t_sent_ns": t_sent,
        "rejected": tr.rejected,
    }


def _consumer(tr: _Transport, cmd: dict[str, Any]) -> dict[str, Any]:
    me = cmd["index"]
    replied = received = 0
    t_first = t_last = 0
    tr.arm()
    stage0 = 0
    while True:
        data = tr.recv(me)
        now = time.monotonic_ns()
        stopped = False
        got = 0
        for off in range(0, len(data), TOKEN_SIZE):
            request = frame_fields(data, off)[8]
            if request == STOP:
                stopped = True
            elif request & NOREPLY:
                got += 1
            else:
                tr.send(pack_frame(_DATA, stage0, NO_SLAB, me + 1, 0, 0, 0, request), me)
                replied += 1
        if got:
            if not received:
                t_first = now
            received += got
            t_last = now
        if stopped:
            break
    return {
        "index": me,
        "replied": replied,
        "received": received,
        "t_first_ns": t_first,
        "t_last_ns": t_last,
        "rejected": tr.rejected,
    }


def _worker_main(conn, req_q, rep_q) -> None:
    """A long-lived benchmark process: runs commands from the main process, each pinned
    to the command's CPU."""
    fdsock = socket.socket(fileno=os.dup(conn.fileno()))
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        os.sched_setaffinity(0, {cmd["cpu"]})
        fds = reduction.recvfds(fdsock, cmd["nfds"]) if cmd["nfds"] else []
        tr = None
        try:
            tr = _Transport(
                cmd["mech"], cmd["role"], cmd.get("index", 0), cmd["n"], fds, (req_q, rep_q)
            )
            if cmd["role"] == "consumer":
                conn.send({"ready": True})
                res = _consumer(tr, cmd)
            else:
                res = _producer(tr, cmd)
        except Exception:
            res = {"error": traceback.format_exc(limit=4)}
        finally:
            if tr is not None:
                tr.close()
        res["cpu"] = sorted(os.sched_getaffinity(0))
        conn.send(res)
    fdsock.close()


# ---------------------------------------------------------------------------------------
# main process
# ---------------------------------------------------------------------------------------
def placements(cpus: list[int]) -> dict[str, dict[str, int]]:
    """Where each process runs. ``main`` hosts the user-space router thread."""
    out = {}
    if len(cpus) > 1:
        out["cross-core"] = {"main": cpus[0], "producer": cpus[0], "consumers": cpus[-1]}
    out["same-core"] = {"main": cpus[-1], "producer": cpus[-1], "consumers": cpus[-1]}
    return out


class _Worker:
    def __init__(self, ctx, name: str, queues) -> None:
        self.name = name
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, *queues), name=name, daemon=True)
        self.proc.start()
        child.close()
        self._fdsock = socket.socket(fileno=os.dup(self.conn.fileno()))

    def command(self, cmd: dict[str, Any], fds: list[int]) -> None:
        self.conn.send({**cmd, "nfds": len(fds)})
        if fds:
            reduction.sendfds(self._fdsock, fds)

    def reply(self, timeout: float) -> dict[str, Any]:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"{self.name}: no answer within {timeout} s")
        return self.conn.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
        self._fdsock.close()
        self.conn.close()


class _Pool:
    """The producer and consumer workers (and the queues they inherited)."""

    def __init__(self, ctx, n: int) -> None:
        self.args = (ctx, n)
        self.queues = (ctx.Queue(), ctx.Queue())
        self.producer = _Worker(ctx, "producer", self.queues)
        self.consumers = [_Worker(ctx, f"consumer{i}", self.queues) for i in range(n)]

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by this process and the live workers."""
        pids = [os.getpid(), *(w.proc.pid for w in [self.producer, *self.consumers])]
        return harness.host.process_cpu_seconds([p for p in pids if p is not None])

    def close(self) -> None:
        for w in [self.producer, *self.consumers]:
            w.close()
        for q in self.queues:
            q.close()

    def restart(self) -> None:
        self.close()
        self.__init__(*self.args)


def _drain(q) -> None:
    while True:
        try:
            q.get(timeout=0.05)
        except queue.Empty:
            return


def run_once(mech: str, n: int, where: dict[str, int], pool: _Pool, params: dict) -> dict[str, Any]:
    """One run of one mechanism with n consumers: latency phase then throughput phase."""
    os.sched_setaffinity(0, {where["main"]})  # the user-space router thread inherits it
    ch = None
    keep: list[Any] = []  # main-side objects closed after the run
    p_fds: list[int] = []
    c_fds: list[list[int]] = [[] for _ in range(n)]
    if mech in ("ebpf", "userspace"):
        ch = open_channel(mech, "round-robin")
        ps = ch.add_instance(0, PRODUCER_ID)
        cs = [ch.add_instance(1, i + 1) for i in range(n)]
        keep += [ps, *cs]
        p_fds = [ps.fileno()]
        c_fds = [[s.fileno()] for s in cs]
    elif mech == "direct":
        for i in range(n):
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            keep += [a, b]
            p_fds.append(a.fileno())
            c_fds[i] = [b.fileno()]
    elif mech == "shmring":
        fd = os.memfd_create("isc-bench-rings")
        os.ftruncate(fd, 2 * n * RING_BYTES)
        keep.append(fd)
        p_fds = [fd]
        c_fds = [[fd] for _ in range(n)]
    elif mech == "mpqueue":
        for q in pool.queues:
            _drain(q)
    base = {"mech": mech, "n": n, **params}
    out: dict[str, Any] = {"mechanism": mech, "consumers": n}
    foreign = harness.host.ForeignLoad(pool.cpu_seconds)
    consumers = pool.consumers[:n]
    try:
        for i, w in enumerate(consumers):
            w.command({**base, "role": "consumer", "index": i, "cpu": where["consumers"]}, c_fds[i])
        for w in consumers:
            ready = w.reply(IO_TIMEOUT_S)
            if "error" in ready:
                raise RuntimeError(f"{w.name}: {ready['error']}")
        pool.producer.command({**base, "role": "producer", "cpu": where["producer"]}, p_fds)
        wait = IO_TIMEOUT_S + params["lat_budget_s"] + params["tp_budget_s"]
        pres = pool.producer.reply(wait)
        cres = [w.reply(wait) for w in consumers]
    finally:
        for obj in keep:
            if isinstance(obj, int):
                os.close(obj)
            else:
                obj.close()
        if ch is not None:
            st = ch.stats()
            keys = ("delivered", "to_manager", "rejected_total", "inflight_full", "no_instance")
            out["channel_stats"] = {k: st.get(k) for k in keys}
            ch.close()
    out["other_cores"] = foreign.cores()  # CPU other processes used meanwhile
    errors = [r["error"] for r in [pres, *cres] if "error" in r]
    if errors:
        out["error"] = errors
        return out
    half_us = np.asarray(pres["rtt_ns"], dtype=np.float64) / 2e3
    received = [c["received"] for c in cres]
    t_end = max(c["t_last_ns"] for c in cres)
    seconds = (t_end - pres["t_start_ns"]) / 1e9
    out.update(
        {
            "latency_samples": int(half_us.size),
            **harness.percentiles(half_us, "us", extra=("mean",)),
            "mismatched_replies": pres["mismatched_replies"],
            "sent": pres["sent"],
            "received": received,
            "lost": pres["sent"] - sum(received),
            "throughput_tok_s": sum(received) / seconds if seconds > 0 else 0.0,
            "producer_send_tok_s": pres["sent"] / ((pres["t_sent_ns"] - pres["t_start_ns"]) / 1e9),
            "stream_seconds": seconds,
            "rejected": pres["rejected"] + sum(c["rejected"] for c in cres),
            "replies_per_consumer": [c["replied"] for c in cres],
            "cpus": {"producer": pres["cpu"], "consumers": [c["cpu"] for c in cres]},
        }
    )
    return out


def aggregate(runs: list[dict]) -> list[dict]:
    """Per (placement, mechanism, consumers): the median over repetitions of each run's
    P50 / P99 (us) and throughput (M tokens/s), the losses, and the errors."""
    keys = sorted({(r["placement"], r["mechanism"], r["consumers"]) for r in runs},
                  key=lambda k: (k[0], MECHANISMS.index(k[1]), k[2]))  # fmt: skip
    rows = []
    for pl, m, n in keys:
        these = [r for r in runs if (r["placement"], r["mechanism"], r["consumers"]) == (pl, m, n)]
        ok = [r for r in these if "error" not in r]
        row: dict[str, Any] = {"placement": pl, "mechanism": m, "consumers": n, "reps": len(ok),
                               "errors": [e for r in these for e in r.get("error", [])]}  # fmt: skip
        if ok:

            def med(k: str, ok: list = ok) -> float:
                return float(np.median([r[k] for r in ok]))

            row.update(p50_us=round(med("p50_us"), 2), p99_us=round(med("p99_us"), 2),
                       throughput_mtok_s=round(med("throughput_tok_s") / 1e6, 4),
                       lost_total=sum(r["lost"] for r in ok),
                       rejected_total=sum(r["rejected"] for r in ok),
                       mismatched_replies_total=sum(r["mismatched_replies"] for r in ok))  # fmt: skip
        rows.append(row)
    return rows


def check_targets(rows: list[dict], ebpf_why: str | None) -> dict[str, Any]:
    """Per placement and N: eBPF P50 <= :data:`TARGET_P50_US` and eBPF / broker P50 <=
    :data:`TARGET_RATIO`; ``all_pass`` when every N of every placement was measured and
    passed."""
    by = {(r["placement"], r["mechanism"], r["consumers"]): r for r in rows if "p50_us" in r}
    out: dict[str, Any] = {"per": []}
    for pl, n in sorted({(r["placement"], r["consumers"]) for r in rows}):
        e, u = by.get((pl, "ebpf", n)), by.get((pl, "userspace", n))
        t: dict[str, Any] = {"placement": pl, "consumers": n, "measured": bool(e and u)}
        if e and u:
            t.update(ebpf_p50_us=e["p50_us"], ebpf_p50_pass=e["p50_us"] <= TARGET_P50_US,
                     ratio=round(e["p50_us"] / u["p50_us"], 3),
                     ratio_pass=e["p50_us"] / u["p50_us"] <= TARGET_RATIO)  # fmt: skip
        out["per"].append(t)
    out["all_pass"] = all(
        t["measured"] and t["ebpf_p50_pass"] and t["ratio_pass"] for t in out["per"]
    )
    if ebpf_why:
        out["not_measured_because"] = ebpf_why
    return out


def measure(a: Any, res: harness.Result, mechs: list[str], ns: list[int], places: dict) -> None:
    """Every repetition of every (placement, N, mechanism), each run a point."""
    params = ({"warmup": 100, "iters": 1000, "lat_budget_s": 0.4, "count": 12000, "tp_budget_s": 0.3}
              if a.quick else
              {"warmup": 300, "iters": 3000, "lat_budget_s": 1.0, "count": 30000, "tp_budget_s": 0.7})  # fmt: skip
    res.summary["params"] = params
    pool = _Pool(mp.get_context("spawn"), max(ns))
    try:
        for rep in range(a.reps):
            for pl, where in places.items():
                for n in ns:
                    for m in mechs[rep % len(mechs) :] + mechs[: rep % len(mechs)]:
                        res.own_pids[:] = [w.proc.pid for w in [pool.producer, *pool.consumers]]
                        try:
                            r = run_once(m, n, where, pool, params)
                        except Exception as exc:
                            traceback.print_exc()
                            err = [f"{type(exc).__name__}: {exc}"]
                            r = {"mechanism": m, "consumers": n, "error": err}
                            pool.restart()  # a failed run may leave answers in the pipes
                        r.update(placement=pl, rep=rep)
                        res.add(**r)
                        print(f"[handover] rep {rep} {pl} {m:9s} N={n}: "
                              + str(r.get("error") or f"p50 {r['p50_us']:.1f} us, p99 {r['p99_us']:.1f} us"),
                              file=sys.stderr, flush=True)  # fmt: skip
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("--reps", type=int, default=5, help="repetitions per (mechanism, N)")
    ap.add_argument("--consumers", default="1,2,3,4", help="consumer counts")
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS))
    ap.add_argument("--placements", default="cross-core,same-core")

    def quick(a: Any) -> None:
        a.reps, a.consumers = 3, "1,2,4"

    a = harness.cli.parse(ap, argv, quick)
    ns = [int(x) for x in a.consumers.split(",")]
    mechs = [m for m in a.mechanisms.split(",") if m]
    if unknown := set(mechs) - set(MECHANISMS):
        ap.error(f"unknown mechanisms {sorted(unknown)}; use {MECHANISMS}")
    cpus = sorted(os.sched_getaffinity(0))
    places = {p: w for p, w in placements(cpus).items() if p in a.placements.split(",")}
    if not places:
        ap.error(f"no usable placement among {a.placements!r}; have {list(placements(cpus))}")
    ebpf_why = None
    if "ebpf" in mechs and not (probe := ebpf_available())[0]:
        ebpf_why = probe[1]
        mechs.remove("ebpf")
        print(f"[handover] eBPF channel unavailable, skipped: {ebpf_why}", file=sys.stderr)
    res = harness.cli.start("handover", a)
    res.summary.update(kernel=os.uname().release, placements=places, ring_slots=RING_SLOTS)
    measure(a, res, mechs, ns, places)
    os.sched_setaffinity(0, set(cpus))
    rows = aggregate(res.points)
    res.summary.update(results=rows, targets=check_targets(rows, ebpf_why))
    harness.cli.finish(res, a, plot)
    harness.print_table(["placement", "mechanism", "N", "p50 us", "p99 us", "Mtok/s", "lost"],
                        [[r["placement"], r["mechanism"], r["consumers"], r.get("p50_us", "ERROR"),
                          r.get("p99_us"), r.get("throughput_mtok_s"), r.get("lost_total")]
                         for r in rows])  # fmt: skip
    for t in res.summary["targets"]["per"]:
        print(f"{t['placement']} N={t['consumers']}: {t}")
    return 0 if all(not r["errors"] for r in rows) else 1


def plot(data: dict[str, Any], path: Path) -> None:
    """Median P50 and P99 (us, log) against the consumers, one line per mechanism, one
    panel per placement, the eBPF P50 target as a line."""
    harness.plot(data["summary"]["results"], path, x="consumers", y=["p50_us", "p99_us"],
                 by="mechanism", panel="placement", hlines={"eBPF P50 target": TARGET_P50_US},
                 logy=True, xlabel="consumers N", ylabel="one-hop handover, us (RTT/2)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
