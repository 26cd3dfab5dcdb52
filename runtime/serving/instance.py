"""A partition instance: one process running one unit on one engine (InfScaler §IV-B).

The loop (paper Fig. 4): block on the control socket for a DATA token, map its slot
and read the input tensors zero-copy, run the engine (or the function), take an
out-token (token fault to the manager when the OutToken queue is empty), write the
outputs plus the tensors later units still need, hand the token to the next stage, and
return the input slot (kept as an out-token, or freed).

Started by the supervisor (:mod:`infscaler.runtime.processes.supervisor`): forked from the zygote
(:mod:`infscaler.runtime.processes.zygote`, which calls :func:`serve`), or as
``python -m infscaler.runtime.serving.instance``, with the channel socket and a status pipe
inherited as file descriptors and its spec (JSON) on stdin. It reports to the
supervisor on the status pipe, one JSON object per line: ``ready`` (after loading and a
warm-up run: pid, memory, engine), ``stats`` (every ``stats_interval_s`` while serving:
requests, errors, busy ms, RSS / USS MB; ``exec``: executions and items per batch size,
:class:`~infscaler.runtime.serving.batching.ExecCounts`; the counters alone, at most every
``IDLE_REPORT_S``, when it goes idle) and ``fatal`` (it could not start).

More (details, why it is so, history, figures): docs/serving.md, "`runtime/serving/instance.py`".
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np

from infscaler.ebpf.channel import Endpoint
from infscaler.ebpf.errors import ChannelClosed
from infscaler.runtime.serving.batching import ExecCounts, WaitPolicy
from infscaler.runtime.serving.pipeline import ERROR, FANOUT, TRACE, Unit, encode_error
from infscaler.runtime.serving.runners import (
    ITEM_MASK,
    FunctionRunner,
    FusedRunner,
    ModelRunner,
    StageError,
    StageInputError,
)
from infscaler.shm import RequestFailed
from infscaler.shm.client import InstanceClient
from infscaler.shm.deadlines import DeadlineTable
from infscaler.shm.slab import PoolError
from infscaler.shm.slabmap import SlabMap
from infscaler.shm.tensors import SlotFormatError

__all__ = [
    "Instance",
    "StageError",
    "StageInputError",
    "drop_capabilities",
    "main",
    "serve",
    "set_pdeathsig",
]

log = logging.getLogger("infscaler.instance")

_TRACE_COLS = 4  # unit index, instance id, start ns, end ns
#: the least time between two ``stats`` reports sent when the instance goes idle, s
IDLE_REPORT_S = 0.05
#: how long a batch's first look for queued inputs waits, s (one poll of the channel)
_GREEDY_S = 0.0002


def set_pdeathsig() -> None:
    """Die with the parent (Linux prctl PR_SET_PDEATHSIG = 1)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def drop_capabilities() -> None:
    """Give up every capability (the service may hold CAP_BPF / CAP_NET_ADMIN for the
    eBPF control path, and ambient capabilities survive exec): an instance needs none,
    so a compromised model or function cannot load BPF programs. capset(2) with empty
    sets, after clearing the ambient set (prctl PR_CAP_AMBIENT_CLEAR_ALL). Best effort."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL

        class _Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class _Data(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        header = _Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (_Data * 2)()
        libc.capset(ctypes.byref(header), data)


def _memory() -> dict[str, float]:
    try:
        import psutil

        p = psutil.Process()
        try:
            full = p.memory_full_info()
            return {
                "rss_mb": full.rss / 2**20,
                "uss_mb": full.uss / 2**20,
                "pss_mb": getattr(full, "pss", 0) / 2**20,
            }
        except (psutil.AccessDenied, AttributeError):
            return {"rss_mb": p.memory_info().rss / 2**20, "uss_mb": 0.0}
    except Exception:  # noqa: BLE001 - telemetry never stops serving
        return {"rss_mb": 0.0, "uss_mb": 0.0}


class Instance:
    """The serving loop of one instance (see the module docstring).

    Args:
        spec: ``service_id``, ``instance``, ``stage_id``, ``next_stage``, ``fd``,
            ``status_fd``, ``unit`` (:meth:`Unit.to_dict`), ``cores``,
            ``max_out_tokens``, ``acquire_timeout_s``, ``stats_interval_s``.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.unit = Unit(**spec["unit"])
        self.iid = int(spec["instance"])
        self.stage_id = int(spec["stage_id"])
        self.next_stage = int(spec["next_stage"])
        self.status = os.fdopen(spec["status_fd"], "w", buffering=1)
        self.endpoint = Endpoint(spec["fd"], self.iid)
        self.slabs = SlabMap(spec["service_id"])
        self.client = InstanceClient(
            self.endpoint,
            self.slabs,
            self.iid,
            self.stage_id,
            max_out_tokens=int(spec.get("max_out_tokens", 2)),
        )
        self.deadlines = DeadlineTable(spec["service_id"])
        self.dropped = 0
        cores = spec.get("cores") or None
        self.runner: ModelRunner | FunctionRunner | FusedRunner = (
            FusedRunner(self.unit, cores)
            if self.unit.steps
            else ModelRunner(self.unit, cores)
            if self.unit.kind == "model"
            else FunctionRunner(self.unit, cores)
        )
        self.acquire_timeout_s = float(spec.get("acquire_timeout_s", 30.0))
        self.stats_interval_s = float(spec.get("stats_interval_s", 1.0))
        self.stopping = False
        self.served = 0
        self.errors = 0
        self.busy_ns = 0
        self.last_ms = 0.0
        # dynamic batching (MArk §4): the size the autoscaler chose, or the fixed one
        self.max_batch = int(self.unit.max_batch) if self.unit.batch_policy == "fixed" else 1
        self.batch_delay_s = float(self.unit.batch_delay_ms) / 1e3
        self.batches = 0
        self.batched = 0
        # executions and items per batch size (Triton's execution_count / batch_stats)
        self.execs = ExecCounts()
        self.wait_policy = WaitPolicy()
        self.batch_axis = False  # axis 0 of the inputs is a batch dim (set at load)
        self.cmd_fd = spec.get("cmd_fd")
        self._cmd_buf = b""
        if self.cmd_fd is not None:
            os.set_blocking(int(self.cmd_fd), False)

    def report(self, event: str, **fields: Any) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.status.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")

    def run(self) -> int:
        t0 = time.perf_counter()
        try:
            describe = self.runner.load()
        except Exception as exc:  # noqa: BLE001 - reported to the supervisor, then exit
            msg = str(exc) if hasattr(exc, "hint") else f"{type(exc).__name__}: {exc}"
            self.report("fatal", error=f"unit {self.unit.name}: {msg}")
            return 1
        self.batch_axis = bool(getattr(self.runner, "batch_axis", False))
        self.report(
            "ready",
            batch_ms=getattr(self.runner, "batch_ms", {}),
            warm_ms=getattr(self.runner, "warm_ms", None),
            warm_ms_by_threads=getattr(self.runner, "warm_ms_by_threads", {}),
            load_ms=round((time.perf_counter() - t0) * 1e3, 1),
            memory_mb=round(self.runner.memory_mb, 2),
            engine=describe,
            cores=self.spec.get("cores") or [],
            **_memory(),
        )
        next_stats = time.monotonic() + self.stats_interval_s
        dirty = False
        last_report = 0.0
        try:
            while not self.stopping:
                now = time.monotonic()
                wait = max(0.0, min(0.5, next_stats - now))
                if dirty:  # served since the last report: once idle, report soon
                    wait = min(wait, max(0.0005, last_report + IDLE_REPORT_S - now))
                try:
                    self.serve_one(wait)
                    dirty = busy = True
                except TimeoutError:
                    busy = False
                now = time.monotonic()
                self._commands()
                if now >= next_stats:
                    if dirty:
                        self._report_stats(memory=True)
                        last_report, dirty = now, False
                    next_stats = now + self.stats_interval_s
                elif dirty and not busy and now >= last_report + IDLE_REPORT_S:
                    self._report_stats(memory=False)  # idle: the counters, cheaply
                    last_report, dirty = now, False
        except ChannelClosed:
            self._report_stats(memory=False)
            return 0
        self._report_stats(memory=False)
        with contextlib.suppress(Exception):
            self.client.release_out_tokens()
        return 0

    def _report_stats(self, memory: bool) -> None:
        """One ``stats`` report: the counters since start (``exec``: executions and items
        per batch size, :meth:`ExecCounts.to_json`); with ``memory``, RSS / USS / PSS too
        (reading them costs a walk of the process's mappings: the periodic report only)."""
        self.report(
            "stats",
            served=self.served,
            errors=self.errors,
            busy_ms=round(self.busy_ns / 1e6, 3),
            last_ms=round(self.last_ms, 3),
            batch=self.max_batch,
            batches=self.batches,
            batched=self.batched,
            dropped=self.dropped,
            exec=self.execs.to_json(),
            **self._step_stats(),
            **(_memory() if memory else {}),
        )

    def _step_stats(self) -> dict[str, Any]:
        """``{"steps": [...]}`` for a fused unit (:meth:`FusedRunner.step_stats`)."""
        if isinstance(self.runner, FusedRunner):
            return {"steps": self.runner.step_stats()}
        return {}

    def _carry(self, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The tensors this unit passes on besides its outputs (``unit.carry``): received
        ones, or (a fused unit) written by an earlier step."""
        made = getattr(self.runner, "produced", None) or {}
        return {k: made[k] if k in made else tensors[k] for k in self.unit.carry}

    def _commands(self) -> None:
        """Apply commands from the supervisor (JSON lines on ``cmd_fd``):
        ``{"cmd": "batch", "size": b, "delay_ms": w}`` sets the dynamic batch."""
        if self.cmd_fd is None:
            return
        try:
            chunk = os.read(int(self.cmd_fd), 65536)
        except BlockingIOError:
            return
        except OSError:
            self.cmd_fd = None
            return
        if not chunk:
            self.cmd_fd = None
            return
        self._cmd_buf += chunk
        *lines, self._cmd_buf = self._cmd_buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
                if msg.get("cmd") == "batch":
                    self.max_batch = max(1, min(int(msg["size"]), int(self.unit.max_batch)))
                    self.batch_delay_s = max(0.0, float(msg.get("delay_ms", 0.0))) / 1e3
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("bad command from the supervisor: %r (%s)", line[:200], exc)

    def serve_one(self, timeout: float) -> None:
        """Serve one input token (wait up to ``timeout`` s).

        Raises:
            TimeoutError: nothing arrived.
            ChannelClosed: removed from the channel (the service is stopping).
        """
        try:
            tok, tensors = self.client.recv_input(timeout)
        except RequestFailed:
            return  # the manager failed a request we never saw: nothing to do here
        except (SlotFormatError, PoolError) as exc:
            bad = getattr(exc, "token", None)
            if bad is not None:
                self._send_error(bad, None, f"unit {self.unit.name}: unreadable input slot: {exc}")
                self.client.done(bad, keep=False)
            self.errors += 1
            return
        if self._drop_dead(tok):
            del tensors
            return
        batch = [(tok, tensors)]
        if self.max_batch > 1:
            batch += self._gather(self.max_batch - 1, self.batch_delay_s)
        if len(batch) > 1 and self._run_batch(batch):
            return
        for tok, tensors in batch:
            self._process(tok, tensors)

    def _dead(self, tok: Any) -> bool:
        """``tok``'s request is past its deadline or cancelled; counted in ``dropped``."""
        try:
            dead = self.deadlines.dead(tok.request)
        except Exception:  # noqa: BLE001 - a broken table never stops serving
            return False
        if dead:
            self.dropped += 1
        return dead

    def _drop_dead(self, tok: Any) -> bool:
        """Return the slot of a dead request's token at once (normal ``done`` path)."""
        if not self._dead(tok):
            return False
        self.client.done(tok)
        return True

    def _gather(self, n: int, delay_s: float) -> list[tuple[Any, dict[str, np.ndarray]]]:
        """Up to ``n`` more inputs for a batch (dynamic batching): first those already
        queued (no wait), then, while the batch is below the size recent batches
        reached (:class:`~infscaler.runtime.serving.batching.WaitPolicy`), those
        arriving within ``delay_s`` s, unless recent waits caught nothing."""
        more = self._take(n, _GREEDY_S)
        want = self.wait_policy.target(n + 1) - 1
        if len(more) < want and delay_s > 0 and self.wait_policy.should_wait():
            caught = self._take(want - len(more), delay_s)
            self.wait_policy.waited(len(caught))
            more += caught
        self.wait_policy.formed(1 + len(more))
        return more

    def _take(self, n: int, within_s: float) -> list[tuple[Any, dict[str, np.ndarray]]]:
        """Up to ``n`` inputs arriving within ``within_s`` s (dead ones returned)."""
        more: list[tuple[Any, dict[str, np.ndarray]]] = []
        deadline = time.monotonic() + within_s
        while len(more) < n:
            left = deadline - time.monotonic()
            try:
                got = self.client.recv_input(max(0.0, left))
                if not self._drop_dead(got[0]):
                    more.append(got)
            except TimeoutError:
                break
            except RequestFailed:
                continue
            except (SlotFormatError, PoolError) as exc:
                bad = getattr(exc, "token", None)
                if bad is not None:
                    self._send_error(bad, None, f"unit {self.unit.name}: unreadable input: {exc}")
                    self.client.done(bad, keep=False)
                self.errors += 1
        return more

    def _run_batch(self, batch: list[tuple[Any, dict[str, np.ndarray]]]) -> bool:
        """Run ``batch`` as one engine call, inputs stacked along axis 0 (MArk §4
        batching). Returns False, having run nothing, when the inputs do not stack
        (shapes differ beyond axis 0) or the batched run fails: the caller then runs
        them one by one, so a bad request still fails alone."""
        names = self.unit.inputs
        first = batch[0][1]
        for _tok, t in batch:
            for n in names:
                a, b = t[n], first[n]
                if a.ndim == 0 or a.shape[1:] != b.shape[1:] or a.dtype != b.dtype:
                    return False
        rows = [t[names[0]].shape[0] for _tok, t in batch]
        if any(t[n].shape[0] != r for (_tok, t), r in zip(batch, rows, strict=True) for n in names):
            return False
        start = time.monotonic_ns()
        try:
            stacked = {n: np.concatenate([t[n] for _tok, t in batch]) for n in names}
            stacked_at = time.monotonic_ns()
            result = self.runner(stacked)
            total = sum(rows)
            if any(v.ndim == 0 or v.shape[0] != total for v in result.values()):
                return False
        except Exception:  # noqa: BLE001 - retried one by one, where it fails alone
            return False
        end = time.monotonic_ns()
        offsets = np.cumsum([0, *rows])
        try:
            for i, (tok, tensors) in enumerate(batch):
                part = {k: v[offsets[i] : offsets[i + 1]] for k, v in result.items()}
                trace = self._trace(tensors.get(TRACE), start, end)
                out = {**{k: tensors[k] for k in self.unit.carry}, **part, TRACE: trace}
                if FANOUT in tensors:
                    out[FANOUT] = tensors[FANOUT]
                if self._dead(tok):
                    continue
                try:
                    self._hand_over(out, self.next_stage, tok.request)
                    self.served += 1
                except Exception as exc:  # noqa: BLE001 - this request fails alone
                    if self._dead(tok):
                        continue
                    self.errors += 1
                    self._send_error(tok, tensors, f"stage {self.unit.name}: {exc}")
        finally:
            done = time.monotonic_ns()
            self.busy_ns += done - start
            self.last_ms = (end - start) / 1e6
            self.batches += 1
            self.batched += len(batch)
            self.execs.add(total, stacked_at - start, end - stacked_at, done - end)
            for tok, _t in batch:
                self.client.done(tok)
        return True

    def _process(self, tok: Any, tensors: dict[str, np.ndarray]) -> None:
        """Run one input and hand its outputs on (or its error to the front end)."""
        start = time.monotonic_ns()
        trace_in = tensors.get(TRACE)
        try:
            result = self.runner(tensors)
            end = time.monotonic_ns()
            size = self._rows(tensors)
            if self._dead(tok):  # it died while we computed: nothing to hand on
                self.execs.add(size, 0, end - start, 0)
                return
            trace = self._trace(trace_in, start, end)
            if self.unit.fan_out:
                self._hand_over_items(tok, tensors, result, trace)
            else:
                out = {**self._carry(tensors), **result, TRACE: trace}
                if FANOUT in tensors:
                    out[FANOUT] = tensors[FANOUT]
                self._hand_over(out, self.next_stage, tok.request)
            self.served += 1
            self.execs.add(size, 0, end - start, time.monotonic_ns() - end)
        except Exception as exc:  # noqa: BLE001 - one request fails, the instance goes on
            end = time.monotonic_ns()
            if self._dead(tok):  # e.g. no slot before its deadline: no one waits for it
                return
            self.errors += 1
            detail = (
                str(exc)
                if isinstance(exc, StageError) or hasattr(exc, "hint")
                else (f"{type(exc).__name__}: {exc}")
            )
            # a fused unit names the step that failed (None: it failed handing over)
            step = getattr(self.runner, "current", None) or self.unit.name
            log.log(  # a client's bad input is not the service's problem: INFO
                logging.INFO if isinstance(exc, StageInputError) else logging.WARNING,
                "unit %s failed on request %d: %s",
                self.unit.name if step == self.unit.name else f"{self.unit.name} ({step})",
                tok.request,
                detail,
            )
            if not isinstance(exc, StageError) and not hasattr(exc, "hint"):
                traceback.print_exc(file=sys.stderr)
            self._send_error(
                tok,
                tensors,
                f"stage {step}: {detail}",
                trace_in,
                start,
                end,
                status=400 if isinstance(exc, StageInputError) else 500,
            )
        finally:
            self.busy_ns += time.monotonic_ns() - start
            self.last_ms = (time.monotonic_ns() - start) / 1e6
            # the inputs' views die with the slot: nothing above keeps one
            del tensors
            if isinstance(self.runner, FusedRunner):
                self.runner.produced = {}
            self.client.done(tok)

    def _rows(self, tensors: Mapping[str, np.ndarray]) -> int:
        """The items one run on ``tensors`` infers: the first input's axis 0 when it is a
        batch dim (a model whose inputs declare a dynamic axis 0), else 1."""
        if not self.batch_axis or not self.unit.inputs:
            return 1
        x = tensors.get(self.unit.inputs[0])
        return int(x.shape[0]) if x is not None and x.ndim > 0 and x.shape[0] > 0 else 1

    def _trace(self, trace_in: np.ndarray | None, start: int, end: int) -> np.ndarray:
        row = np.array([[self.unit.index, self.iid, start, end]], dtype=np.int64)
        if trace_in is None or trace_in.ndim != 2 or trace_in.shape[1] != _TRACE_COLS:
            return row
        return np.concatenate([trace_in, row])

    def _hand_over(
        self, out: dict[str, np.ndarray], stage: int, request: int, timeout: float | None = None
    ) -> None:
        wait = self.acquire_timeout_s if timeout is None else timeout
        with contextlib.suppress(Exception):
            left = self.deadlines.remaining_s(request)
            if left is not None:  # never wait for a slot past the request's deadline
                wait = min(wait, max(left, 0.001))
        self.client.send_tensors(out, stage, request, timeout=wait)

    def _hand_over_items(
        self, tok: Any, tensors: Mapping[str, np.ndarray], items: list[dict], trace: np.ndarray
    ) -> None:
        carry = self._carry(tensors)
        n = len(items)
        if n == 0:  # a marker straight to the front end: nothing to run per item
            marker = {**carry, FANOUT: np.array([0, 0], np.int64), TRACE: trace}
            self._hand_over(marker, 0, tok.request)
            return
        base = tok.request & ~ITEM_MASK
        for i, item in enumerate(items):
            out = {**carry, **item, FANOUT: np.array([i, n], np.int64), TRACE: trace}
            self._hand_over(out, self.next_stage, base | (i + 1))

    def _send_error(
        self,
        tok: Any,
        tensors: Mapping[str, np.ndarray] | None,
        message: str,
        trace_in: np.ndarray | None = None,
        start: int = 0,
        end: int = 0,
        status: int = 500,
    ) -> None:
        out: dict[str, np.ndarray] = {ERROR: encode_error(message, status)}
        if start:
            out[TRACE] = self._trace(trace_in, start, end)
        if tensors is not None and FANOUT in tensors:
            out[FANOUT] = np.asarray(tensors[FANOUT])
        try:
            self._hand_over(out, 0, tok.request, timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - last resort: the front end times it out
            log.error(
                "unit %s could not report a failure of request %d: %s",
                self.unit.name,
                tok.request,
                exc,
            )


def main() -> int:
    """Entry point of a spawned instance (``python -m``; the supervisor's fallback when
    its fork server is down): die with the parent, read the spec from stdin, serve."""
    set_pdeathsig()
    return serve(json.loads(sys.stdin.read()))


def serve(spec: dict[str, Any]) -> int:
    """Run one instance in this process until told to stop; returns the exit status.

    Called by :func:`main` and, in an instance forked by the zygote
    (:mod:`infscaler.runtime.processes.zygote`), after the fork. A forked instance has no
    parent-death signal (its parent is the zygote, whose death must not take it along):
    it exits when the service's end of its channel socket closes.
    """
    drop_capabilities()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=os.environ.get("INFSCALER_LOG_LEVEL", "WARNING"),
        format="%(asctime)s instance[%(process)d] %(levelname)s %(message)s",
        force=True,
    )
    inst = Instance(spec)

    def stop(_sig: int, _frame: Any) -> None:
        inst.stopping = True

    signal.signal(signal.SIGUSR1, stop)
    return inst.run()


if __name__ == "__main__":
    # why function-level: run as __main__, this file is a second copy of the module; run
    # the importable module's main, so that StageError / StageInputError raised by
    # function stages (imported from infscaler.runtime.serving.instance) are this code's classes
    from infscaler.runtime.serving import instance as _module

    sys.exit(_module.main())
