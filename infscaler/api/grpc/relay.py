"""What the gRPC gate does with one connection's bytes (pure: no sockets, no clock of its
own): :class:`Relay` scans both directions, holds each call's bytes against the in-flight
budget under the client's uid, counts its open calls, and refuses a call in the protocol
(Trailers-Only status) when the budget, the quota or admission says no.

Sources: RFC 9113 sections 5.1, 6.4, 6.9, 8.1; grpc ``doc/PROTOCOL-HTTP2.md``. How and
why: docs/api.md, "`infscaler/api/grpc/relay.py`".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infscaler.api.grpc import h2frames as h2
from infscaler.api.grpc.wire import peek_model_name

__all__ = ["RESOURCE_EXHAUSTED", "UNAVAILABLE", "Relay"]

#: gRPC status codes (grpc ``doc/statuscodes.md``)
RESOURCE_EXHAUSTED, UNAVAILABLE = 8, 14
#: refused streams remembered (to drop their late frames), per connection
_REFUSED_KEPT = 1024


def _cut(mv: memoryview, cuts: list[tuple[int, int]], inserts: list[tuple[int, bytes]]) -> list:
    """``mv`` without the ranges ``cuts`` and with ``inserts`` (``(offset, bytes)``, each
    before the bytes at its offset), both in offset order."""
    out, at, k = [], 0, 0
    for a, b in cuts:
        while k < len(inserts) and inserts[k][0] <= a:
            p, data = inserts[k]
            if p > at:
                out.append(mv[at:p])
                at = p
            out.append(data)
            k += 1
        if a > at:
            out.append(mv[at:a])
        at = max(at, b)
    for p, data in inserts[k:]:
        if p > at:
            out.append(mv[at:p])
            at = p
        out.append(data)
    if at < len(mv):
        out.append(mv[at:])
    return out


class Relay:
    """One gate connection's bookkeeping; not thread-safe (the event loop's).

    Args:
        uid: the client's uid (None: the operator: service-wide budget only, no stream quota).
        budget: the service's :class:`~infscaler.runtime.serving.admission.ByteBudget`.
        streams: open calls per uid, shared by the gate's connections.
        stream_quota: calls one uid may have open at once (None: no quota).
        max_message: the server's largest request message, bytes (a longer one is not
            reserved: grpcio refuses it).
        body_timeout_s: see :meth:`deadline`.
        clock: monotonic seconds.
        precheck: ``precheck(model, uid)``: the refusal an inference of ``model`` would get
            now (with ``hold_s`` and ``code``), or None (None: no admission at the prefix).
    """

    def __init__(
        self,
        uid: int | None,
        budget: Any,
        streams: dict[int, int],
        stream_quota: int | None,
        max_message: int,
        body_timeout_s: float,
        clock: Callable[[], float],
        precheck: Callable[[str, int | None], Any] | None = None,
    ) -> None:
        self.uid, self.budget, self.streams = uid, budget, streams
        self.precheck = precheck
        #: refused streams whose status waits: stream -> [due, frame, client still open]
        self._later: dict[int, list] = {}
        self.stream_quota = stream_quota
        self.max_message = max_message
        self.body_timeout_s = body_timeout_s
        self.clock = clock
        self.up = h2.Scanner(preface=True, track_new=True)
        self.down = h2.Scanner(preface=False, max_frame=h2.LARGEST_FRAME, settings=True)
        self._held: dict[int, int] = {}  # open stream -> bytes it holds
        self._refused: dict[int, None] = {}  # insertion-ordered
        self._headers_sent: set[int] = set()
        self._receiving: dict[int, float] = {}  # stream -> its last byte's time
        self._max_id = 0
        self._to_client: list[bytes] = []
        self._to_server: list[bytes] = []
        self._credit = 0
        self._drop_up = self._drop_down = 0  # bytes of a dropped frame in later chunks
        self._up_block = self._down_block = False  # inside a header block
        self._last = self._stall = clock()
        #: calls refused (budget, quota), for the log
        self.refusals: list[str] = []

    # -- state ---------------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        return len(self._held)

    def stalled(self, now: float) -> None:
        """The gate could not write to grpcio until ``now``: the client was not late."""
        self._stall = now

    def deadline(self) -> float | None:
        """When the connection must be closed for a client gone quiet: ``body_timeout_s`` after
        the last byte of the quietest partial call or frame (None: nothing partial), not
        counting time blocked writing to grpcio (:meth:`stalled`)."""
        t = min(self._receiving.values(), default=None)
        if self.up.mid_frame or self._up_block:
            t = self._last if t is None else min(t, self._last)
        return None if t is None else max(t, self._stall) + self.body_timeout_s

    def close(self) -> None:
        """The connection is gone: release every call."""
        for s in list(self._held):
            self._end(s)
        self._later.clear()

    @property
    def holding(self) -> int:
        """Refusals held (:meth:`release_due`)."""
        return len(self._later)

    def next_due(self) -> float | None:
        """When the first held refusal is due (:meth:`release_due`), clock seconds (None:
        none is held)."""
        return min((v[0] for v in self._later.values()), default=None)

    def release_due(self, now: float) -> bytes:
        """The held refusals due by ``now``, as bytes for the client now (those that
        cannot go yet, inside a frame of grpcio's, go with its next frame boundary)."""
        for s in [s for s, v in self._later.items() if v[0] <= now]:
            _, frame, client_open = self._later.pop(s)
            self._to_client.append(frame)
            if client_open:  # RFC 9113 section 8.1: the response is whole; stop sending
                self._to_client.append(h2.rst_stream(s, h2.NO_ERROR))
        return self._flush_client()

    # -- client -> server ----------------------------------------------------------------

    def from_client(self, chunk: bytes) -> tuple[list, bytes]:
        """Scan the client's ``chunk``; returns ``(pieces for grpcio, bytes for the
        client now)``.

        Raises:
            FrameError: not HTTP/2 (close the connection).
        """
        now = self._last = self.clock()
        cont = self.up.stream
        if cont in self._receiving:
            self._receiving[cont] = now
        mv, events = memoryview(chunk), self.up.feed(chunk)
        n, cuts, inserts = len(mv), [], []
        if self._drop_up:
            d = min(self._drop_up, n)
            cuts.append((0, d))
            self._drop_up -= d
        cur = None
        for ev in events:
            if ev[0] == h2.FRAME:
                _, typ, flags, s, length, start = ev
                if self._to_server and not self._up_block and start >= 0:
                    inserts.append((start, b"".join(self._to_server)))
                    self._to_server.clear()
                if typ == h2.HEADERS:
                    self._up_block = not flags & h2.END_HEADERS
                    self._client_headers(s, flags, now)
                elif typ == h2.CONTINUATION:
                    self._up_block = not flags & h2.END_HEADERS
                elif typ == h2.DATA:
                    cur = (s, start, length)
                    if s in self._refused:
                        self._drop(cuts, start, length, n)
                        if flags & h2.END_STREAM and s in self._later:
                            self._later[s][2] = False
                    elif s in self._receiving:
                        if flags & h2.END_STREAM:
                            del self._receiving[s]
                        else:
                            self._receiving[s] = now
                elif typ == h2.RST_STREAM:
                    self._end(s)
                    self._refused.pop(s, None)
                    self._later.pop(s, None)
            elif ev[0] == h2.MESSAGE:
                _, s, length, off = ev
                if s not in self._held or length > self.max_message:
                    continue
                if self.precheck is not None and cur is not None and cur[0] == s:
                    head = mv[off : min(n, cur[1] + 9 + cur[2], off + length)]
                    if self._admitted(s, head) is False:
                        self._drop(cuts, cur[1], cur[2], n)
                        continue
                verdict = self.budget.reserve(2 * length, self.uid)
                if verdict.admit:
                    self._held[s] += 2 * length
                    continue
                retry = max(1, round(verdict.retry_after_s or 1))
                self._refuse(
                    s,
                    UNAVAILABLE,
                    f"the service is at its in-flight memory budget: {verdict.reason}\nHint: "
                    f"send fewer concurrent requests, or raise --max-inflight-mb (retry after "
                    f"{retry} s)",
                    code="bytes_in_flight",
                )
                if cur is not None and cur[0] == s:
                    self._drop(cuts, cur[1], cur[2], n)
        if self._to_server and not self._up_block and not self.up.mid_frame:
            inserts.append((n, b"".join(self._to_server)))
            self._to_server.clear()
        pieces = _cut(mv, cuts, inserts) if cuts or inserts else [mv]
        return pieces, self._flush_client()

    def _admitted(self, s: int, head: memoryview) -> bool | None:
        """``precheck`` on call ``s`` from its message's first bytes: False when refused (its
        status held), else None."""
        model = peek_model_name(head)
        refusal = None if model is None else self.precheck(model, self.uid)  # type: ignore[misc]
        if refusal is None:
            return None
        hold = getattr(refusal, "hold_s", 0.0)
        code = getattr(refusal, "code", None)
        self._refuse(
            s,
            UNAVAILABLE,
            str(refusal),
            code=code if isinstance(code, str) else None,
            hold_s=hold if len(self._later) < _REFUSED_KEPT else 0.0,
        )
        return False

    def _drop(self, cuts: list, start: int, length: int, n: int) -> None:
        """Drop a client DATA frame none of whose bytes went out yet (else let it pass:
        grpcio counts it) and give its bytes back to the client's connection window."""
        if start < 0 or (cuts and cuts[-1][0] == start):
            return
        end = start + 9 + length
        cuts.append((start, min(end, n)))
        self._drop_up = max(0, end - n)
        self._credit += length

    def _client_headers(self, s: int, flags: int, now: float) -> None:
        if s <= self._max_id or s in self._held:
            return  # trailers, or a stream ended or refused: grpcio answers for it
        self._max_id = s
        uid, quota = self.uid, self.stream_quota
        if uid is not None and quota is not None and self.streams.get(uid, 0) >= quota:
            self._refuse(
                s,
                RESOURCE_EXHAUSTED,
                f"too many concurrent calls from your uid ({self.streams.get(uid, 0)} open, at "
                f"most {quota} per user: --max-streams-per-uid); wait for some to end",
                client_open=not flags & h2.END_STREAM,
                code="uid_streams",
            )
            return
        self._held[s] = 0
        if uid is not None:
            self.streams[uid] = self.streams.get(uid, 0) + 1
        self.down.track(s)
        if not flags & h2.END_STREAM:
            self._receiving[s] = now

    def _refuse(
        self,
        s: int,
        status: int,
        message: str,
        client_open: bool | None = None,
        code: str | None = None,
        hold_s: float = 0.0,
    ) -> None:
        """Refuse call ``s``: RST_STREAM(CANCEL) to grpcio now, its status (``code`` as
        ``infscaler-code``) to the client now or after ``hold_s`` (:meth:`release_due`)."""
        if client_open is None:
            client_open = s in self._receiving
        headers_sent = s in self._headers_sent
        self._end(s)
        self.up.forget(s)
        self.down.forget(s)
        self._refused[s] = None
        if len(self._refused) > _REFUSED_KEPT:
            del self._refused[next(iter(self._refused))]
        frame = h2.trailers_only(s, status, message, headers_sent, code)
        if hold_s > 0:
            self._later[s] = [self.clock() + hold_s, frame, client_open]
        else:
            self._to_client.append(frame)
            if client_open:  # RFC 9113 section 8.1: the response is whole; stop sending
                self._to_client.append(h2.rst_stream(s, h2.NO_ERROR))
        self._to_server.append(h2.rst_stream(s, h2.CANCEL))
        self.refusals.append(message)

    def _end(self, s: int) -> None:
        held = self._held.pop(s, None)
        if held is None:
            return
        if held:
            self.budget.release(held, self.uid)
        if self.uid is not None:
            left = self.streams.get(self.uid, 0) - 1
            if left > 0:
                self.streams[self.uid] = left
            else:
                self.streams.pop(self.uid, None)
        self.up.forget(s)
        self.down.forget(s)
        self._receiving.pop(s, None)
        self._headers_sent.discard(s)

    # -- server -> client ----------------------------------------------------------------

    def _flush_client(self) -> bytes:
        """The pending frames for the client, when what it was sent ends between frames
        outside a header block (else they wait for such a point)."""
        if (not self._to_client and not self._credit) or self._down_block or self.down.mid_frame:
            return b""
        return self._take_client()

    def _take_client(self) -> bytes:
        if self._credit:
            self._to_client.append(h2.window_update(0, self._credit))
            self._credit = 0
        out = b"".join(self._to_client)
        self._to_client.clear()
        return out

    def from_server(self, chunk: bytes) -> list:
        """Scan grpcio's ``chunk``; returns the pieces for the client (with any frames
        waiting for a boundary).

        Raises:
            FrameError: not HTTP/2 (close the connection).
        """
        mv, events = memoryview(chunk), self.down.feed(chunk)
        n, cuts, inserts = len(mv), [], []
        if self._drop_down:
            d = min(self._drop_down, n)
            cuts.append((0, d))
            self._drop_down -= d
        for ev in events:
            if ev[0] == h2.FRAME:
                _, typ, flags, s, length, start = ev
                if (self._to_client or self._credit) and not self._down_block and start >= 0:
                    inserts.append((start, self._take_client()))
                if typ == h2.HEADERS or typ == h2.CONTINUATION:
                    self._down_block = not flags & h2.END_HEADERS
                    if s in self._held:
                        self._headers_sent.add(s)
                        if typ == h2.HEADERS and flags & h2.END_STREAM:
                            self._end(s)
                elif s in self._refused:
                    if start >= 0:
                        end = start + 9 + length
                        cuts.append((start, min(end, n)))
                        self._drop_down = max(0, end - n)
                elif typ == h2.RST_STREAM or (typ == h2.DATA and flags & h2.END_STREAM):
                    self._end(s)
            elif ev[0] == h2.MESSAGE:
                _, s, length, _off = ev
                if s in self._held:
                    self.budget.charge(length, self.uid)
                    self._held[s] += length
            elif ev[1] == h2.SETTINGS_MAX_FRAME_SIZE:  # what grpcio accepts from the client
                self.up.max_frame = max(self.up.max_frame, min(ev[2], h2.LARGEST_FRAME))
        if (self._to_client or self._credit) and not self._down_block and not self.down.mid_frame:
            inserts.append((n, self._take_client()))
        return _cut(mv, cuts, inserts) if cuts or inserts else [mv]
