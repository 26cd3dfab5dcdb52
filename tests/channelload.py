"""Producer and consumer processes that drive a control channel (tests).

Each process gets only its instance socket (an inherited fd) and talks tokens through
:class:`~infscaler.ebpf.channel.Endpoint`, like a real partition instance:

- ``producer``: sends ``count`` DATA tokens for ``--to-hop`` with request ids
  ``base .. base+count-1``, at most ``--credits`` outstanding: every GRANT received
  returns one credit (tokens are credits, notes pitfall 3).
- ``consumer``: receives DATA, appends each request id (u64, little-endian) to
  ``--out`` *before* acknowledging it with a FREE token (same request id), optionally
  "works" ``--delay-us`` per token (sleeping), and stops on an ERROR token whose request
  id is :data:`STOP_REQUEST` (or on EOF).

``--drop-privileges`` (when started as root): switch to uid/gid 65534 after the socket
and output file are open, then check that the process has no capability left and that
creating a BPF map fails: the instance side of the eBPF channel needs no privilege.

Each prints one JSON line with its counts on stdout.

Usage: ``python -m tests.channelload producer --fd 5 --instance 100 --to-hop 1 --count 500000``

The manager side for tests: :func:`spawn` starts a worker on a new
instance of a channel; :class:`Pump` runs the manager loop (FREE in, GRANT back to the
producer of that request, undeliverable DATA kept) and records every acknowledgement.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infscaler.base.procutil import module_command
from infscaler.ebpf import libbpf
from infscaler.ebpf.channel import MAX_BATCH, Channel, Endpoint, frame_fields, pack_frame
from infscaler.ebpf.errors import ChannelClosed
from infscaler.ebpf.token import Token, TokenKind
from tests import REPO_ROOT

STOP_REQUEST = (1 << 64) - 1
_NOBODY = 65534


def drop_privileges() -> dict[str, Any]:
    """Become uid/gid 65534 with no capabilities (if root); report what is left.

    Returns:
        {"uid", "cap_eff" (effective capability mask), "bpf_denied" (creating a SOCKMAP
        fails), "bpf_fds" (BPF map / program fds this process holds: must be 0, whoever
        holds the map fd can insert sockets)}.
    """
    bpf_fds = 0  # counted first: /proc/self/fd is unreadable once the uid changed
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            bpf_fds += os.readlink(f"/proc/self/fd/{fd}").startswith("anon_inode:bpf")
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
    cap_eff = -1
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                cap_eff = int(line.split()[1], 16)
    try:
        libbpf.probe_sockmap()
        denied = False
    except libbpf.BpfError:
        denied = True
    return {"uid": os.getuid(), "cap_eff": cap_eff, "bpf_denied": denied, "bpf_fds": bpf_fds}


_DATA, _FREE, _GRANT, _ERROR = (
    int(k) for k in (TokenKind.DATA, TokenKind.FREE, TokenKind.GRANT, TokenKind.ERROR)
)


def run_producer(
    ep: Endpoint,
    instance: int,
    hop: int,
    count: int,
    base: int = 0,
    credits: int = 1024,
    batch: int = MAX_BATCH,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Send ``count`` DATA tokens (request ids ``base``..), at most ``credits`` unacknowledged.

    A GRANT token returns ``length`` credits (the load generator's slots are 1 byte, so a
    grant of ``length`` bytes is ``length`` slots). Returns counts.
    """
    t0 = time.monotonic()
    sent = grants = 0
    while sent < count:
        data = ep.recv_bytes(4096, timeout=0 if credits else timeout)
        if not data and not credits:
            return {
                "role": "producer",
                "instance": instance,
                "sent": sent,
                "error": "no GRANT in time",
            }
        for off in range(0, len(data), 32):
            f = frame_fields(data, off)
            if f[1] == _GRANT:
                credits += f[7]
                grants += 1
        n = min(batch, credits, count - sent)
        if n:
            ep.send_bytes(
                b"".join(
                    pack_frame(
                        _DATA, hop, 0, instance, (sent + i) & 0xFFFFFFFF, 0, 1, base + sent + i
                    )
                    for i in range(n)
                ),
                timeout=timeout,
            )
            sent += n
            credits -= n
    return {
        "role": "producer",
        "instance": instance,
        "sent": sent,
        "grants": grants,
        "seconds": time.monotonic() - t0,
    }


def run_consumer(
    ep: Endpoint,
    instance: int,
    out_fd: int,
    batch: int = MAX_BATCH,
    delay_us: float = 0.0,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Receive DATA, record, acknowledge with FREE, until STOP / EOF. Returns counts."""
    t0 = time.monotonic()
    received = other = 0
    total = 0
    stopped = closed = False
    while not stopped:
        try:
            data = ep.recv_bytes(batch, timeout=timeout)
        except ChannelClosed:
            closed = True
            break
        if not data:
            return {
                "role": "consumer",
                "instance": instance,
                "received": received,
                "error": "idle timeout",
            }
        ids = array.array("Q")
        frees = []
        for off in range(0, len(data), 32):
            _, kind, hop, slab, _, slot, offset, length, request, _ = frame_fields(data, off)
            if kind == _DATA:
                ids.append(request)
                frees.append(pack_frame(_FREE, hop, slab, instance, slot, offset, length, request))
            elif kind == _ERROR and request == STOP_REQUEST:
                stopped = True
            else:
                other += 1
        if ids:
            if out_fd >= 0:
                if sys.byteorder != "little":
                    ids.byteswap()
                os.write(out_fd, ids.tobytes())  # reported before acknowledged
            received += len(ids)
            total += sum(ids)
        if delay_us and frees:
            time.sleep(delay_us * len(frees) / 1e6)
        if frees:
            try:
                ep.send_bytes(b"".join(frees), timeout=timeout)
            except ChannelClosed:
                closed = True
                break
    return {
        "role": "consumer",
        "instance": instance,
        "received": received,
        "sum": total,
        "other": other,
        "stopped": stopped,
        "closed": closed,
        "rejected": ep.rejected,
        "seconds": time.monotonic() - t0,
    }


@dataclass
class Worker:
    """A loadgen process attached to one instance of a channel."""

    role: str
    instance: int
    proc: subprocess.Popen[str]
    out: str | None = None

    def result(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait for the process (killing it after ``timeout`` s); its JSON report plus
        ``returncode`` and ``stderr`` (tail)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=10)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        res: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        res["returncode"] = self.proc.returncode
        res["stderr"] = err[-2000:]
        return res

    def received(self) -> array.array:
        """Request ids this consumer recorded (u64), in arrival order."""
        ids = array.array("Q")
        if self.out and os.path.exists(self.out):
            with open(self.out, "rb") as f:
                data = f.read()
            ids.frombytes(data[: len(data) - len(data) % 8])
            if sys.byteorder != "little":
                ids.byteswap()
        return ids


def _child_env() -> dict[str, str]:
    """This environment with the repository root on PYTHONPATH (``tests`` importable)."""
    old = os.environ.get("PYTHONPATH", "")
    root = str(REPO_ROOT)
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{old}" if old else root}


def spawn(
    ch: Channel,
    role: str,
    instance: int,
    hop: int,
    *,
    out: str | None = None,
    drop_privileges: bool = False,
    **opts: Any,
) -> Worker:
    """Add ``instance`` to ``ch`` for ``hop`` and start a loadgen process on its socket.

    ``opts`` become ``--option value`` (underscores to dashes). Only the instance socket
    is inherited (``close_fds``): the child never sees the map or program fds.
    """
    sock = ch.add_instance(hop, instance)
    cmd = module_command("tests.channelload", role, "--fd", str(sock.fileno()))
    cmd += ["--instance", str(instance)]
    if out:
        cmd += ["--out", out]
    if drop_privileges:
        cmd.append("--drop-privileges")
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    try:
        proc = subprocess.Popen(
            cmd,
            pass_fds=[sock.fileno()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
    finally:
        sock.close()
    return Worker(role, instance, proc, out)


@dataclass
class Pump:
    """The manager loop of a load run.

    Every FREE is an acknowledgement: it is recorded (per producer, per request id) and
    its credit goes back to the producer that owns the request id, as one GRANT per
    batch (``length`` = credits), until that producer has been granted all it needs
    (``count - credits``). DATA coming back (undeliverable) is kept in
    :attr:`undeliverable` for the caller to re-route.

    Args:
        ch: the channel.
        producers: producer instance id -> (base request id, count).
        credits: the producers' initial credits.
    """

    ch: Channel
    producers: dict[int, tuple[int, int]]
    credits: int
    acks: dict[int, bytearray] = field(init=False)
    acked_by: Counter[int] = field(init=False, default_factory=Counter)
    undeliverable: list[Token] = field(init=False, default_factory=list)
    other: list[Token] = field(init=False, default_factory=list)
    total: int = field(init=False, default=0)
    _granted: dict[int, int] = field(init=False)
    _need: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.acks = {p: bytearray(n) for p, (_, n) in self.producers.items()}
        self._granted = {p: 0 for p in self.producers}
        self._need = {p: max(0, n - self.credits) for p, (_, n) in self.producers.items()}
        self._ranges = sorted((base, base + n, p) for p, (base, n) in self.producers.items())

    def _owner(self, request: int) -> int | None:
        for lo, hi, p in self._ranges:
            if lo <= request < hi:
                return p
        return None

    def run(
        self,
        until: Callable[[Pump], bool],
        deadline_s: float,
        on_batch: Callable[[Pump], None] | None = None,
        watch: list[Worker] | None = None,
    ) -> None:
        """Serve the manager side until ``until(self)`` is true.

        Args:
            watch: workers that must not fail meanwhile (a non-zero exit stops the run).

        Raises:
            TimeoutError: ``deadline_s`` seconds passed first.
            RuntimeError: a watched worker exited with an error.
        """
        end = time.monotonic() + deadline_s
        owner = self._owner
        while not until(self):
            if time.monotonic() > end:
                raise TimeoutError(f"load run: {self.total} acknowledgements after {deadline_s} s")
            for w in watch or ():
                rc = w.proc.poll()
                if rc is not None and rc > 0:
                    raise RuntimeError(f"{w.role} {w.instance} failed: {w.result(5)}")
            data = self.ch.manager_recv_bytes(4096, timeout=0.5)
            due: Counter[int] = Counter()
            for off in range(0, len(data), 32):
                kind = data[off + 1]
                if kind == _FREE:
                    f = frame_fields(data, off)
                    p = owner(f[8])
                    if p is None:
                        self.other.append(Token.unpack(data[off : off + 32]))
                        continue
                    self.acks[p][f[8] - self.producers[p][0]] += 1
                    self.acked_by[f[4]] += 1
                    self.total += 1
                    due[p] += 1
                elif kind == _DATA:
                    self.undeliverable.append(Token.unpack(data[off : off + 32]))
                else:
                    self.other.append(Token.unpack(data[off : off + 32]))
            for p, n in due.items():
                n = min(n, self._need[p] - self._granted[p])
                if n > 0:
                    self._granted[p] += n
                    self.ch.manager_send_bytes(p, pack_frame(_GRANT, 0, 0xFFFF, p, 0, 0, n, 0))
            if on_batch is not None:
                on_batch(self)

    def duplicates(self) -> int:
        """Request ids acknowledged more than once."""
        return sum(sum(1 for v in a if v > 1) for a in self.acks.values())

    def missing(self) -> int:
        """Request ids never acknowledged."""
        return sum(a.count(0) for a in self.acks.values())

    def stop_consumers(self, consumers: list[int]) -> None:
        """Send each consumer the STOP token (ERROR, request :data:`STOP_REQUEST`)."""
        for c in consumers:
            self.ch.manager_send(c, Token(TokenKind.ERROR, request=STOP_REQUEST))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["producer", "consumer"])
    ap.add_argument("--fd", type=int, required=True, help="inherited instance socket")
    ap.add_argument("--instance", type=int, required=True)
    ap.add_argument("--to-hop", type=int, default=1, help="producer: hop of its DATA tokens")
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--base", type=int, default=0)
    ap.add_argument("--credits", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=MAX_BATCH)
    ap.add_argument("--out", help="consumer: file for received request ids")
    ap.add_argument("--delay-us", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds without progress")
    ap.add_argument("--drop-privileges", action="store_true")
    args = ap.parse_args(argv)

    ep = Endpoint(socket.socket(fileno=args.fd), instance=args.instance)
    out_fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.out else -1
    priv = drop_privileges() if args.drop_privileges else {}
    if args.role == "producer":
        res = run_producer(
            ep,
            args.instance,
            args.to_hop,
            args.count,
            args.base,
            args.credits,
            args.batch,
            args.timeout,
        )
    else:
        res = run_consumer(ep, args.instance, out_fd, args.batch, args.delay_us, args.timeout)
    res.update(priv)
    print(json.dumps(res), flush=True)
    return 0 if "error" not in res else 3


if __name__ == "__main__":
    raise SystemExit(main())
