"""Tensor handover time vs tensor size: zero-copy tokens vs copying (InfScaler §IV-B,
the data side of paper Fig. 6).

Method, settings and outputs: bench/HISTORY.md, "The scripts' methods", ``tensor_size.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import socket
import statistics
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import harness
import numpy as np

harness.host.default_cache_dir()

from handover import placements  # noqa: E402

from infscaler.ebpf.channel import Endpoint, pack_frame  # noqa: E402
from infscaler.ebpf.probe import ebpf_available, open_channel  # noqa: E402
from infscaler.ebpf.token import Token, TokenKind  # noqa: E402
from infscaler.shm.pool import TensorPool  # noqa: E402
from infscaler.shm.slabmap import SlabMap  # noqa: E402
from infscaler.shm.tensors import read_tensors, tensors_nbytes, write_tensors  # noqa: E402

KiB, MiB = 1024, 1024 * 1024
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
TARGET_RATIO = 1.2
PRODUCER_ID, CONSUMER_ID = 100, 1
STOP = (1 << 64) - 1
_DATA = int(TokenKind.DATA)
_HDR = struct.Struct("<QQQ")  # size index, payload bytes, t0 (ns); size index STOP ends
IO_TIMEOUT_S = 60.0


def size_label(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def tensor(size_index: int, nbytes: int) -> np.ndarray:
    """The seeded float32 tensor of ``nbytes`` bytes (both processes build it)."""
    rng = np.random.default_rng(1000 + size_index)
    return rng.standard_normal(nbytes // 4, dtype=np.float32)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("peer closed")
        got += n


# ---------------------------------------------------------------------------------------
# producer and consumer processes
# ---------------------------------------------------------------------------------------
def _producer(cfg: dict[str, Any], ep: Endpoint, copy_sock: socket.socket) -> dict[str, Any]:
    sizes = cfg["sizes"]
    grants = [Token.unpack(b) for b in cfg["grants"]]
    smap = SlabMap(cfg["service_id"])
    arrays = [tensor(i, n) for i, n in enumerate(sizes)]
    # -- write each tensor into its slot (the producer's one copy), timed apart ----------
    write_ns: list[list[int]] = [[] for _ in sizes]
    used = [0] * len(sizes)
    scratch = bytearray(tensors_nbytes({"x": arrays[0]}))
    for _ in range(3):  # warm the code paths on private memory, not on a slot
        write_tensors(memoryview(scratch), {"x": arrays[0]})
    for i, (g, arr) in enumerate(zip(grants, arrays, strict=True)):  # size by size
        view = smap.slot_view(g)
        for _ in range(cfg["write_reps"]):  # the first write also maps the slot's pages
            t0 = time.perf_counter_ns()
            used[i] = write_tensors(view, {"x": arr})
            write_ns[i].append(time.perf_counter_ns() - t0)
        view.release()
    # -- zero-copy handover, sizes interleaved --------------------------------------------
    zc_rtt: list[list[int]] = [[] for _ in sizes]
    clock = time.monotonic_ns
    end = clock() + int(cfg["zc_budget_s"] * 1e9)
    warm, iters = cfg["zc_warmup"], cfg["zc_iters"]
    for k in range(warm + iters):
        for i, g in enumerate(grants):
            t0 = clock()
            ep.send_bytes(
                pack_frame(_DATA, 1, g.slab, PRODUCER_ID, g.slot, g.offset, used[i], t0),
                IO_TIMEOUT_S,
            )
            if not ep.recv_bytes(1, IO_TIMEOUT_S):
                raise TimeoutError("no acknowledgement from the consumer")
            t1 = clock()
            if k >= warm:
                zc_rtt[i].append(t1 - t0)
        if k >= warm + 20 and clock() > end:
            break
    ep.send_bytes(pack_frame(_DATA, 1, 0xFFFF, PRODUCER_ID, 0, 0, 0, STOP), IO_TIMEOUT_S)
    # -- copying: pickle over an AF_UNIX stream socket, size by size ---------------------
    cp_rtt: list[list[int]] = [[] for _ in sizes]
    dumps_ns: list[list[int]] = [[] for _ in sizes]
    ack = bytearray(1)
    for i, arr in enumerate(arrays):
        end = clock() + int(cfg["copy_budget_s"] * 1e9)
        k = 0
        while k < cfg["copy_warmup"] + cfg["copy_iters"]:
            t0 = clock()
            payload = pickle.dumps(arr, protocol=5)
            t_d = clock()
            copy_sock.sendall(_HDR.pack(i, len(payload), t0))
            copy_sock.sendall(payload)
            _recv_exact(copy_sock, memoryview(ack))
            t1 = clock()
            del payload
            if k >= cfg["copy_warmup"]:
                cp_rtt[i].append(t1 - t0)
                dumps_ns[i].append(t_d - t0)
            k += 1
            if k >= cfg["copy_warmup"] + cfg["copy_min"] and clock() > end:
                break
    copy_sock.sendall(_HDR.pack(STOP, 0, 0))
    smap.close()
    return {
        "used_bytes": used,
        "write_ns": write_ns,
        "zc_rtt_ns": zc_rtt,
        "copy_rtt_ns": cp_rtt,
        "copy_dumps_ns": dumps_ns,
        "zc_warmup": warm,
        "copy_warmup": cfg["copy_warmup"],
    }


def _consumer(cfg: dict[str, Any], ep: Endpoint, copy_sock: socket.socket) -> dict[str, Any]:
    sizes = cfg["sizes"]
    slot_index = {(t.slab, t.slot): i for i, t in enumerate(Token.unpack(b) for b in cfg["grants"])}
    smap = SlabMap(cfg["service_id"])
    zc: list[list[int]] = [[] for _ in sizes]
    seen = [0] * len(sizes)
    checks: dict[str, list[Any]] = {
        "zero_copy_equal": [None] * len(sizes),
        "read_only": [None] * len(sizes),
    }
    clock = time.monotonic_ns
    # -- zero-copy -------------------------------------------------------------------------
    while True:
        tok = ep.recv(IO_TIMEOUT_S)
        if tok.request == STOP:
            break
        view = smap.slot_view(tok)
        x = read_tensors(view)["x"]
        t1 = clock()
        i = slot_index[(tok.slab, tok.slot)]
        seen[i] += 1
        if seen[i] > cfg["zc_warmup"]:
            zc[i].append(t1 - tok.request)
            if checks["zero_copy_equal"][i] is None:  # outside the timed region
                checks["zero_copy_equal"][i] = bool(np.array_equal(x, tensor(i, sizes[i])))
                checks["read_only"][i] = not x.flags.writeable
        del x
        view.release()
        ep.send_bytes(
            pack_frame(
                _DATA, 0, tok.slab, CONSUMER_ID, tok.slot, tok.offset, tok.length, tok.request
            ),
            IO_TIMEOUT_S,
        )
    # -- copying -----------------------------------------------------------------------------
    cp: list[list[int]] = [[] for _ in sizes]
    seen = [0] * len(sizes)
    checks["copy_equal"] = [None] * len(sizes)
    hdr = bytearray(_HDR.size)
    while True:
        _recv_exact(copy_sock, memoryview(hdr))
        i, n, t0 = _HDR.unpack(hdr)
        if i == STOP:
            break
        buf = bytearray(n)
        _recv_exact(copy_sock, memoryview(buf))
        arr = pickle.loads(buf)
        t1 = clock()
        del buf
        seen[i] += 1
        if seen[i] > cfg["copy_warmup"]:
            cp[i].append(t1 - t0)
            if checks["copy_equal"][i] is None:
                checks["copy_equal"][i] = bool(np.array_equal(arr, tensor(i, sizes[i])))
        del arr
        copy_sock.sendall(b"k")
    smap.close()
    return {"zc_ns": zc, "copy_ns": cp, "checks": checks}


def _proc_main(
    role: str, cpu: int, conn, ep_sock: socket.socket, copy_sock: socket.socket, cfg
) -> None:
    os.sched_setaffinity(0, {cpu})
    ep = Endpoint(ep_sock)
    try:
        conn.send({"ready": True})
        if not conn.poll(IO_TIMEOUT_S):
            raise TimeoutError("no go from the main process")
        conn.recv()
        res = (_producer if role == "producer" else _consumer)(cfg, ep, copy_sock)
    except Exception:
        res = {"error": traceback.format_exc(limit=5)}
    res["cpu"] = sorted(os.sched_getaffinity(0))
    conn.send(res)
    ep.close()
    copy_sock.close()


# ---------------------------------------------------------------------------------------
# main process
# ---------------------------------------------------------------------------------------
def _stats_us(ns: list[int]) -> dict[str, float]:
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return {**harness.percentiles(a, None), "n": int(a.size)}


def run_once(ctx, where: dict[str, int], channel_kind: str, params: dict) -> dict[str, Any]:
    os.sched_setaffinity(0, {where["main"]})
    foreign = harness.host.ForeignLoad(harness.host.own_cpu_seconds)
    ch = open_channel(channel_kind, "round-robin")
    pool = TensorPool(512 * MiB, idle_release_s=3600)
    procs, conns = [], []
    try:
        grants = []
        for i, n in enumerate(SIZES):
            need = tensors_nbytes({"x": ((n // 4,), np.float32)})
            ref = pool.fault(need, PRODUCER_ID, request=i)
            if ref is None:
                raise RuntimeError(f"the pool refused a slot of {need} bytes")
            grants.append(ref.to_token(TokenKind.GRANT, instance=PRODUCER_ID).pack())
        cfg = {"sizes": SIZES, "service_id": pool.service_id, "grants": grants, **params}
        p_ep = ch.add_instance(0, PRODUCER_ID)
        c_ep = ch.add_instance(1, CONSUMER_ID)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for role, cpu, eps, cs in (
            ("consumer", where["consumers"], c_ep, b),
            ("producer", where["producer"], p_ep, a),
        ):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_proc_main, args=(role, cpu, child, eps, cs, cfg), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            conns.append(parent)
        for s in (p_ep, c_ep, a, b):
            s.close()
        for c in conns:
            if not c.poll(IO_TIMEOUT_S):
                raise TimeoutError("a worker did not start")
            c.recv()
        for c in conns:
            c.send("go")
        wait = IO_TIMEOUT_S + params["zc_budget_s"] + len(SIZES) * params["copy_budget_s"]
        res = []
        for c in conns:
            if not c.poll(wait):
                raise TimeoutError("a worker did not finish")
            res.append(c.recv())
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        st = ch.stats()
        ch.close()
        pool.close()
    other_cores = foreign.cores()  # the workers have been joined: their CPU is ours
    cres, pres = res
    errors = [r["error"] for r in res if "error" in r]
    if errors:
        return {"error": errors, "other_cores": other_cores}
    rows = []
    for i, n in enumerate(SIZES):
        w = np.asarray(pres["write_ns"][i], dtype=np.float64) / 1e3
        rows.append(
            {
                "size_bytes": n,
                "size": size_label(n),
                "slot_bytes_used": pres["used_bytes"][i],
                "zero_copy_us": _stats_us(cres["zc_ns"][i]),
                "zero_copy_rtt_half_us": _stats_us([x // 2 for x in pres["zc_rtt_ns"][i]]),
                "write_us": {"first": float(w[0]), "median": float(np.median(w)), "n": int(w.size)},
                "copy_us": _stats_us(cres["copy_ns"][i]),
                "copy_dumps_us": _stats_us(pres["copy_dumps_ns"][i]),
            }
        )
    return {
        "sizes": rows,
        "checks": cres["checks"],
        "cpus": {"producer": pres["cpu"], "consumer": cres["cpu"]},
        "channel_stats": {k: st.get(k) for k in ("delivered", "to_manager", "rejected_total")},
        "other_cores": other_cores,
    }


#: a size's aggregate key -> (a run's key, its statistic), the median over repetitions
MEDIANS = {"zero_copy_p50_us": ("zero_copy_us", "p50"), "zero_copy_p99_us": ("zero_copy_us", "p99"),
           "zero_copy_rtt_half_p50_us": ("zero_copy_rtt_half_us", "p50"),
           "write_median_us": ("write_us", "median"), "write_first_us": ("write_us", "first"),
           "copy_p50_us": ("copy_us", "p50"), "copy_p99_us": ("copy_us", "p99"),
           "copy_dumps_p50_us": ("copy_dumps_us", "p50")}  # fmt: skip


def aggregate(runs: list[dict], places: list[str]) -> dict[str, Any]:
    """Per placement: each size's medians over the runs without error (:data:`MEDIANS`),
    the 64 MiB / 4 KiB zero-copy P50 ratio against :data:`TARGET_RATIO`, the checks."""
    out: dict[str, Any] = {}
    for pl in places:
        ok = [r for r in runs if r["placement"] == pl and "error" not in r]
        if not ok:
            out[pl] = {"error": [e for r in runs if r["placement"] == pl for e in r["error"]]}
            continue
        rows = []
        for i, n in enumerate(SIZES):
            per = [r["sizes"][i] for r in ok]
            med = {k: statistics.median(s[a][b] for s in per) for k, (a, b) in MEDIANS.items()}
            rows.append({"size_bytes": n, "size": size_label(n),
                         **{k: round(v, 2) for k, v in med.items()},
                         "copy_over_zero_copy": round(med["copy_p50_us"] / med["zero_copy_p50_us"], 2),
                         "zero_copy_p50_us_reps": [round(s["zero_copy_us"]["p50"], 2) for s in per],
                         "copy_p50_us_reps": [round(s["copy_us"]["p50"], 2) for s in per],
                         "samples_zero_copy_reps": [s["zero_copy_us"]["n"] for s in per],
                         "samples_copy_reps": [s["copy_us"]["n"] for s in per]})  # fmt: skip
        ratio = rows[-1]["zero_copy_p50_us"] / rows[0]["zero_copy_p50_us"]
        ratio_reps = [
            r["sizes"][-1]["zero_copy_us"]["p50"] / r["sizes"][0]["zero_copy_us"]["p50"] for r in ok
        ]
        checks = [r["checks"] for r in ok]
        out[pl] = {
            "reps": len(ok),
            "sizes": rows,
            "ratio_64MiB_over_4KiB": round(ratio, 3),
            "ratio_per_rep": [round(x, 3) for x in ratio_reps],
            "target_ratio": TARGET_RATIO,
            "pass": ratio <= TARGET_RATIO,
            "all_tensors_verified": all(v is True for c in checks for key in c for v in c[key]),
            "channel_stats_last_rep": ok[-1]["channel_stats"],
            "other_cores_reps": [r["other_cores"] for r in ok],
        }
    return out


QUICK = {"write_reps": 5, "zc_warmup": 20, "zc_iters": 200, "zc_budget_s": 1.0,
         "copy_warmup": 1, "copy_iters": 40, "copy_min": 5, "copy_budget_s": 0.4}  # fmt: skip
FULL = {"write_reps": 9, "zc_warmup": 50, "zc_iters": 600, "zc_budget_s": 3.0,
        "copy_warmup": 2, "copy_iters": 150, "copy_min": 10, "copy_budget_s": 1.2}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = harness.cli.parser(__doc__, duration_s=1.0)
    ap.add_argument("--reps", type=int, default=3, help="repetitions per placement; >= 3")
    ap.add_argument("--placements", default="cross-core,same-core")
    a = harness.cli.parse(ap, argv)
    cpus = sorted(os.sched_getaffinity(0))
    places = {p: w for p, w in placements(cpus).items() if p in a.placements.split(",")}
    if not places:
        ap.error(f"no usable placement among {a.placements!r}; have {list(placements(cpus))}")
    ok, why = ebpf_available()
    channel_kind = "ebpf" if ok else "userspace"
    if not ok:
        print(
            f"[tensor_size] eBPF unavailable, tokens over the user-space channel: {why}",
            file=sys.stderr,
        )
    res = harness.cli.start("tensor_size", a)
    params = QUICK if a.quick else FULL
    res.summary.update(kernel=os.uname().release, channel=channel_kind, channel_reason=why,
                       placements=places, sizes_bytes=SIZES, params=params)  # fmt: skip
    ctx = mp.get_context("spawn")
    runs = []
    for rep in range(a.reps):
        for pl, where in places.items():
            try:
                r = run_once(ctx, where, channel_kind, params)
            except Exception as exc:
                traceback.print_exc()
                r = {"error": [f"{type(exc).__name__}: {exc}"]}
            r.update(placement=pl, rep=rep)
            runs.append(r)
            print(
                f"[tensor_size] rep {rep} {pl}: {str(r.get('error', 'ok'))[:300]}", file=sys.stderr
            )
    os.sched_setaffinity(0, set(cpus))
    agg = aggregate(runs, list(places))
    for pl, v in agg.items():
        for row in v.get("sizes", []):
            res.add(placement=pl, **row)
    res.summary.update(runs=runs, results={pl: {k: x for k, x in v.items() if k != "sizes"}
                                           for pl, v in agg.items()})  # fmt: skip
    res.summary["all_pass"] = all(v.get("pass", False) for v in agg.values())
    harness.cli.finish(res, a, plot)
    harness.print_table(["placement", "size", "zc p50", "zc p99", "copy p50", "copy/zc"],
                        [[p["placement"], p["size"], p["zero_copy_p50_us"], p["zero_copy_p99_us"],
                          p["copy_p50_us"], p["copy_over_zero_copy"]] for p in res.points])  # fmt: skip
    for pl, v in agg.items():
        print(f"{pl}: 64 MiB / 4 KiB = {v.get('ratio_64MiB_over_4KiB')} (pass: {v.get('pass')})")
    return 0 if all("error" not in r for r in runs) else 1


def plot(data: dict[str, Any], path: Path) -> None:
    """Zero-copy and copying P50 / P99 (us, log) against the tensor size (log), one panel
    per placement, the producer's write into its slot (not in the hand-over) dashed."""
    harness.plot(data["points"], path, x="size_bytes", panel="placement", logx=True, logy=True,
                 y=["zero_copy_p50_us", "zero_copy_p99_us", "copy_p50_us", "copy_p99_us",
                    "write_median_us"],
                 xlabel="tensor size, bytes (float32)", ylabel="one-way hand-over, us")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
