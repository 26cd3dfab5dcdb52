r"""The instance side of tensor sharing (InfScaler §IV-B, Fig. 4: the OutToken queue,
token faults, zero-copy handover), used by each instance process and the front end.

A producer :meth:`~InstanceClient.acquire`\ s a slot (an out-token, else a FAULT),
writes into it and :meth:`~InstanceClient.hand_over`\ s it (one DATA token); a consumer's
:meth:`~InstanceClient.recv_input` returns zero-copy views and
:meth:`~InstanceClient.done` frees or keeps the slot. The rules are
:mod:`infscaler.shm.protocol`'s.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from infscaler.ebpf.channel import MAX_BATCH, Endpoint
from infscaler.ebpf.token import NO_SLAB, TOKEN_SIZE, Token, TokenKind
from infscaler.shm.protocol import (
    CONTROL_HOP,
    NO_REQUEST,
    BackPressureError,
    RequestFailed,
    SharingError,
)
from infscaler.shm.slab import PoolError
from infscaler.shm.slabmap import SlabMap
from infscaler.shm.tensors import SlotFormatError, read_tensors, tensors_nbytes, write_tensors

__all__ = ["BackPressureError", "InstanceClient", "RequestFailed", "SharingError"]

_DATA, _FAULT, _GRANT, _FREE, _BUSY, _ERROR = (
    TokenKind.DATA,
    TokenKind.FAULT,
    TokenKind.GRANT,
    TokenKind.FREE,
    TokenKind.BUSY,
    TokenKind.ERROR,
)


class InstanceClient:
    """The instance side of tensor sharing (InfScaler §IV-B, Fig. 4). One per instance,
    used from one thread (but :meth:`lend` and :meth:`give_back`, which any thread may
    call); every call that reads the socket also answers what the protocol asks
    (receipts, sync echoes), so an instance idle for long should call :meth:`poll` now
    and then.

    Args:
        endpoint: the instance's :class:`~infscaler.ebpf.channel.Endpoint`.
        slabs: a :class:`SlabMap` of the service's pool.
        instance, hop: this instance's id and hop (fields of its tokens).
        max_out_tokens: the OutToken queue's bound (0: :meth:`done` always frees).
        backoff_s: first back-off after BUSY, s, doubled up to ``max_backoff_s``.
        send_timeout_s: bound on a blocked send, s.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        slabs: SlabMap,
        instance: int,
        hop: int,
        *,
        max_out_tokens: int = 2,
        backoff_s: float = 0.001,
        max_backoff_s: float = 0.05,
        send_timeout_s: float = 10.0,
    ) -> None:
        self._ep = endpoint
        self._slabs = slabs
        self.instance = instance
        self.hop = hop
        self.max_out_tokens = max(0, int(max_out_tokens))
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.send_timeout_s = send_timeout_s
        self._inputs: collections.deque[Token] = collections.deque()  # received, not returned
        self._reading: dict[tuple[int, int], Token] = {}  # returned by recv_input, not done
        self._out: list[Token] = []  # OutToken queue: idle writer slots (length = capacity)
        self._out_lock = threading.Lock()  # _out: lend() / give_back() come from other threads
        self._acquired: dict[tuple[int, int], tuple[Token, int]] = {}  # slot -> (token, request)
        self._notices: collections.deque[Token] = collections.deque()
        self._awaiting: int | None = None  # request of the outstanding FAULT
        self._reply: Token | None = None
        self._tx: list[bytes] = []
        self._corked = 0  # depth of batched(): control tokens wait for its end
        self.counters = dict.fromkeys(
            (
                "faults",
                "grants",
                "busy",
                "out_token_hits",
                "handovers",
                "received",
                "receipts",
                "frees",
                "keeps",
                "echoes",
                "errors",
                "stray_grants",
                "unexpected",
            ),
            0,
        )

    # -- producer side ---------------------------------------------------------------------
    def acquire(
        self,
        nbytes: int,
        request: int,
        timeout: float | None = 10.0,
        *,
        retry_busy: bool = True,
        spare: bool = False,
    ) -> tuple[Token, memoryview]:
        """A slot of at least ``nbytes`` bytes (:func:`~infscaler.shm.tensors.tensors_nbytes`)
        for request ``request``'s output: the smallest fitting out-token, else a FAULT
        answered by GRANT; on BUSY, back off (doubling) and fault again until ``timeout``
        s (None: no limit); ``retry_busy`` False: the first BUSY raises at once (a caller
        with other work, the front end, waits for a freed slot instead of polling);
        ``spare``: fault for a new slot first, leaving the out-tokens idle for
        :meth:`lend` (the first BUSY, or no answer, and an out-token is taken after all).

        Returns:
            ``(slot token, writable view of the whole slot)``; the token's ``length`` is
            the slot's capacity. Write, then :meth:`hand_over` (or :meth:`discard`).

        Raises:
            BackPressureError: only BUSY until ``timeout`` (or once, without
                ``retry_busy``), or no answer within it.
            SharingError: the manager refused (ERROR), or ``request`` out of range.
            ChannelClosed: the instance was removed or the channel closed.
        """
        _check_request(request)
        deadline = None if timeout is None else time.monotonic() + timeout
        tok = None
        if spare:
            with contextlib.suppress(BackPressureError):
                tok = self._fault(nbytes, request, deadline, retry_busy=False)
        if tok is None:
            with self._out_lock:
                tok = self._pop_out_token(nbytes)
        if tok is None:
            tok = self._fault(nbytes, request, deadline, retry_busy)
        self._acquired[(tok.slab, tok.slot)] = (tok, request)
        return tok, self._slabs.slot_view(tok)

    def _pop_out_token(self, nbytes: int) -> Token | None:
        fits = [t for t in self._out if t.length >= nbytes]
        if not fits:
            return None
        best = min(fits, key=lambda t: t.length)
        self._out.remove(best)
        self.counters["out_token_hits"] += 1
        return best

    def _fault(
        self, nbytes: int, request: int, deadline: float | None, retry_busy: bool = True
    ) -> Token:
        backoff = self.backoff_s
        busy = 0
        fault = Token(_FAULT, self.hop, NO_SLAB, self.instance, 0, 0, nbytes, request)

        def timed_out() -> BackPressureError:
            self._awaiting = None  # a late GRANT is given back when it arrives
            return BackPressureError(
                f"no slot of {nbytes} bytes for request {request} (instance {self.instance}): "
                f"{busy} BUSY answers"
                + (
                    " (the pool is at its memory cap)"
                    if busy
                    else " (no answer from the manager within the timeout)"
                ),
                hint="downstream hops are not returning slots: raise cap_bytes, slow the "
                "producer, or check that the manager runs",
            )

        while True:
            self._awaiting, self._reply = request, None
            self.counters["faults"] += 1
            self._send(fault, now=True)
            while self._reply is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise timed_out()
                self._pump(left)
            reply, self._reply, self._awaiting = self._reply, None, None
            if reply.kind == _GRANT:
                self.counters["grants"] += 1
                return reply
            if reply.kind == _ERROR:
                raise SharingError(
                    f"the manager refused a fault of {nbytes} bytes for request {request}",
                    hint="larger than the largest slot, or this hop is not in the pipeline",
                )
            busy += 1  # BUSY: back-pressure
            self.counters["busy"] += 1
            self._release_unfitting(nbytes)
            if not retry_busy:
                raise timed_out()
            end = time.monotonic() + backoff
            if deadline is not None:
                end = min(end, deadline)
            while (left := end - time.monotonic()) > 0:
                self._pump(left)
            backoff = min(backoff * 2, self.max_backoff_s)
            if deadline is not None and time.monotonic() >= deadline:
                raise timed_out()

    def _release_unfitting(self, nbytes: int) -> None:
        """At the cap, out-tokens too small to use go back to the pool."""
        with self._out_lock:
            keep = [t for t in self._out if t.length >= nbytes]
            for t in self._out:
                if t.length < nbytes:
                    self._tx.append(self._free_frame(t, NO_REQUEST))
                    self.counters["frees"] += 1
            self._out = keep
        self._flush()

    def hand_over(self, slot: Token, hop: int, request: int, length: int) -> None:
        """Hand a written ``slot`` from :meth:`acquire` to hop ``hop`` (one DATA token,
        zero copy) with the ``request`` it was acquired for and ``length`` bytes used.

        Raises:
            SharingError: not a slot this client acquired (or already handed over),
                another request, ``length`` above the capacity.
            ChannelClosed / TimeoutError: the send failed.
        """
        key = (slot.slab, slot.slot)
        entry = self._acquired.get(key)
        if entry is None:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was not acquired by this instance"
            )
        tok, acquired_for = entry
        if request != acquired_for:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was acquired for request {acquired_for}, not {request}"
            )
        if not 0 <= length <= tok.length:
            raise SharingError(f"length {length} outside the slot's capacity {tok.length}")
        del self._acquired[key]
        self._send(
            Token(_DATA, hop, tok.slab, self.instance, tok.slot, tok.offset, length, request),
            now=True,
        )
        self.counters["handovers"] += 1

    def send_tensors(
        self,
        tensors: Mapping[str, np.ndarray],
        hop: int,
        request: int,
        timeout: float | None = 10.0,
        *,
        retry_busy: bool = True,
        spare: bool = False,
    ) -> int:
        """Write named tensors into a slot and hand it to hop ``hop``: :meth:`acquire`
        (OutToken queue or token fault; ``spare`` as there), one copy in with
        :func:`~infscaler.shm.tensors.write_tensors`, :meth:`hand_over`. A slot that
        cannot be written is given back (:meth:`discard`).

        Returns:
            bytes handed over (header + data).

        Raises:
            BackPressureError: no slot within ``timeout`` s; SlotFormatError: a tensor
            the slot layout refuses; SharingError / ChannelClosed as :meth:`acquire`.
        """
        nbytes = tensors_nbytes(tensors)
        slot, view = self.acquire(
            nbytes, request, timeout=timeout, retry_busy=retry_busy, spare=spare
        )
        try:
            length = write_tensors(view, tensors)
        except BaseException:
            self.discard(slot)
            raise
        del view
        self.hand_over(slot, hop, request, length)
        return length

    def discard(self, slot: Token) -> None:
        """Give an acquired, not handed-over slot back to the pool (FREE).

        Raises:
            SharingError: not a slot this client acquired.
        """
        entry = self._acquired.pop((slot.slab, slot.slot), None)
        if entry is None:
            raise SharingError(
                f"slab {slot.slab} slot {slot.slot} was not acquired by this instance"
            )
        self._send_free(entry[0], NO_REQUEST)

    def release_out_tokens(self) -> int:
        """FREE every idle out-token (scale-in, shutdown). Returns how many."""
        with self._out_lock:
            n = len(self._out)
            for t in self._out:
                self._tx.append(self._free_frame(t, NO_REQUEST))
            self.counters["frees"] += n
            self._out = []
        self._flush()
        return n

    def lend(self, nbytes: int) -> tuple[Token, memoryview] | None:
        """Any thread: the smallest idle out-token of at least ``nbytes`` bytes, taken off
        the OutToken queue, and a writable view of its whole slot; None when none fits
        (nothing is sent: the slot stays this instance's, as a kept out-token is). The
        borrower writes it and has it handed over by this client's thread
        (:meth:`hand_over_lent`) or returns it (:meth:`give_back`), once.
        """
        with self._out_lock:
            tok = self._pop_out_token(nbytes)
        if tok is None:
            return None
        return tok, self._slabs.slot_view(tok)

    def give_back(self, token: Token) -> None:
        """Any thread: an out-token from :meth:`lend` back on the OutToken queue
        (unwritten or written, never handed over)."""
        with self._out_lock:
            self._out.append(token)

    def hand_over_lent(self, token: Token, hop: int, request: int, length: int) -> None:
        """Hand a written out-token from :meth:`lend` to hop ``hop`` for ``request``
        (``length`` bytes used), as :meth:`acquire` + :meth:`hand_over` would.

        Raises:
            SharingError / ChannelClosed / TimeoutError: as :meth:`hand_over`.
        """
        _check_request(request)
        self._acquired[(token.slab, token.slot)] = (token, request)
        self.hand_over(token, hop, request, length)

    # -- consumer side ---------------------------------------------------------------------
    def recv_input(self, timeout: float | None = None) -> tuple[Token, dict[str, np.ndarray]]:
        """The next input: its DATA token and read-only zero-copy tensor views (valid
        until :meth:`done`), waiting up to ``timeout`` s (None: forever).

        Raises:
            TimeoutError: nothing arrived in time.
            RequestFailed: the manager sent an ERROR for a request; call again.
            ChannelClosed: the instance was removed or the channel closed.
            SlotFormatError, PoolError: a bad slot (the token is still held: call
                :meth:`done` with the exception's ``token``).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._notices:
                raise RequestFailed(self._notices.popleft())
            if self._inputs:
                tok = self._inputs.popleft()
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no input within {timeout} s")
            self._pump(left)
        self._reading[(tok.slab, tok.slot)] = tok
        try:
            return tok, read_tensors(self._slabs.slot_view(tok)[: tok.length])
        except (SlotFormatError, PoolError) as exc:
            exc.token = tok  # type: ignore[attr-defined] - the caller must still done() it
            raise

    def done(self, token: Token, *, keep: bool | None = None) -> None:
        """Finish with an input slot: keep it as an out-token or FREE it (``keep`` None:
        keep while the queue holds fewer than ``max_out_tokens``). This acknowledges the
        request at this hop, so call it after handing its output over (rule 4).

        Raises:
            SharingError: not an input this client is reading (or already done).
        """
        key = (token.slab, token.slot)
        tok = self._reading.pop(key, None)
        if tok is None:
            raise SharingError(
                f"slab {token.slab} slot {token.slot} is not an input of this instance"
            )
        if keep is None:
            keep = len(self._out) < self.max_out_tokens
        if keep:
            capacity = len(self._slabs.slot_view(tok))
            self._send(
                Token(
                    _FREE,
                    CONTROL_HOP,
                    tok.slab,
                    self.instance,
                    tok.slot,
                    tok.offset,
                    tok.length,
                    tok.request,
                )
            )
            kept = Token(
                _GRANT,
                self.hop,
                tok.slab,
                self.instance,
                tok.slot,
                tok.offset,
                capacity,
                NO_REQUEST,
            )
            with self._out_lock:
                self._out.append(kept)
            self.counters["keeps"] += 1
        else:
            self._send_free(tok, tok.request)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Within it, the control tokens this client sends (receipts, sync echoes, keeps,
        frees) wait and leave together in one send at its end (one write, one wake-up
        of the manager, instead of one each); DATA and FAULT leave at once, with what
        waits before them (the order of tokens never changes). Nests; a send failure
        at its end raises as the send would have.

        Raises:
            ChannelClosed / TimeoutError / ChannelError: the send at its end failed.
        """
        self._corked += 1
        try:
            yield
        finally:
            self._corked -= 1
            if not self._corked:
                self._flush()

    def poll(self, timeout: float | None = 0.0) -> int:
        """Serve the socket once (receipts, echoes, buffering inputs), waiting up to
        ``timeout`` seconds for something. Returns tokens handled.

        Raises:
            ChannelClosed: the instance was removed or the channel closed.
        """
        return self._pump(timeout)

    @property
    def slabs(self) -> SlabMap:
        """The :class:`SlabMap` this client maps slots through."""
        return self._slabs

    def out_tokens(self) -> list[Token]:
        """The OutToken queue (idle slots this instance may write), a copy."""
        return list(self._out)

    def queued(self) -> int:
        """Inputs received and buffered, not yet taken by :meth:`recv_input` (what
        :meth:`stats` calls ``queued``, without building the dict)."""
        return len(self._inputs)

    def stats(self) -> dict[str, Any]:
        """Counters plus ``out_tokens``, ``acquired``, ``reading`` and ``queued`` (inputs
        received and not yet returned)."""
        return {
            **self.counters,
            "out_tokens": len(self._out),
            "acquired": len(self._acquired),
            "reading": len(self._reading),
            "queued": len(self._inputs),
        }

    # -- socket ----------------------------------------------------------------------------
    def _free_frame(self, tok: Token, request: int) -> bytes:
        return Token(
            _FREE, self.hop, tok.slab, self.instance, tok.slot, tok.offset, tok.length, request
        ).pack()

    def _send_free(self, tok: Token, request: int) -> None:
        self._tx.append(self._free_frame(tok, request))
        self.counters["frees"] += 1
        self._flush()

    def _send(self, tok: Token, now: bool = False) -> None:
        self._tx.append(tok.pack())
        self._flush(now)

    def _flush(self, force: bool = False) -> None:
        if self._tx and (force or not self._corked):
            data = b"".join(self._tx)
            self._tx.clear()
            self._ep.send_bytes(data, timeout=self.send_timeout_s)

    def _pump(self, timeout: float | None) -> int:
        data = self._ep.recv_bytes(MAX_BATCH, timeout)
        n = len(data) // TOKEN_SIZE
        for off in range(0, len(data), TOKEN_SIZE):
            self._dispatch(Token.unpack(data[off : off + TOKEN_SIZE]))
        self._flush()  # receipts and echoes leave before anything else happens
        return n

    def _dispatch(self, tok: Token) -> None:
        kind = tok.kind
        if kind == _DATA:
            self.counters["received"] += 1
            self.counters["receipts"] += 1
            self._tx.append(
                Token(
                    _GRANT,
                    tok.hop,
                    tok.slab,
                    self.instance,
                    tok.slot,
                    tok.offset,
                    tok.length,
                    tok.request,
                ).pack()
            )
            self._inputs.append(tok)
        elif kind == _GRANT:
            if self._awaiting == tok.request and self._reply is None:
                self._reply = tok
            else:  # the answer to a fault that timed out: give it back
                self.counters["stray_grants"] += 1
                self.counters["frees"] += 1
                self._tx.append(self._free_frame(tok, NO_REQUEST))
        elif kind == _BUSY:
            if tok.hop == CONTROL_HOP:  # sync marker: echo after the receipts above
                self.counters["echoes"] += 1
                self._tx.append(
                    Token(_BUSY, CONTROL_HOP, NO_SLAB, self.instance, 0, 0, 0, tok.request).pack()
                )
            elif self._awaiting == tok.request and self._reply is None:
                self._reply = tok
        elif kind == _ERROR:
            if self._awaiting == tok.request and self._reply is None and tok.slab == NO_SLAB:
                self._reply = tok
                return
            self.counters["errors"] += 1
            if tok.slab != NO_SLAB:  # drop a queued input the manager disowned
                self._inputs = collections.deque(
                    t for t in self._inputs if (t.slab, t.slot) != (tok.slab, tok.slot)
                )
            self._notices.append(tok)
        else:
            self.counters["unexpected"] += 1


def _check_request(request: int) -> None:
    """Raises SharingError for a request id outside the token's ``0..2**64-2``."""
    if not 0 <= request < NO_REQUEST:
        raise SharingError(f"request id {request} outside 0..2**64-2")
