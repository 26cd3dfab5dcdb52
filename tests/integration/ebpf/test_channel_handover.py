"""Control channel, in one process: handover, policies, faults, bad input, reclaim.

Every test runs on both channels: ``ebpf`` (skipped, with the probe's reason, where the
host cannot load the program) and ``userspace``. Every blocking call has a timeout.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import pytest

from infscaler.ebpf import (
    MAX_PER_HOP,
    MAX_TRACKED,
    ChannelClosed,
    ChannelError,
    Endpoint,
    open_channel,
)
from infscaler.ebpf.channel import Channel, pack_frame
from infscaler.ebpf.token import Token, TokenKind

T = 5.0  # seconds: bound of every wait in this file


@pytest.fixture
def make_channel(kind: str) -> Iterator[Callable[..., Channel]]:
    opened: list[Channel] = []

    def make(policy: str = "least-loaded") -> Channel:
        ch = open_channel(kind, policy)
        assert ch.kind == kind
        opened.append(ch)
        return ch

    yield make
    for ch in opened:
        ch.close()


def wait_until(pred: Callable[[], bool], what: str, timeout: float = T) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.005)


def recv_n(ep: Endpoint, n: int) -> list[Token]:
    out: list[Token] = []
    end = time.monotonic() + T
    while len(out) < n:
        left = end - time.monotonic()
        assert left > 0, f"got {len(out)} of {n} tokens"
        out += ep.recv_many(n - len(out), timeout=left)
    return out


def mgr_recv_n(ch: Channel, n: int) -> list[Token]:
    out: list[Token] = []
    end = time.monotonic() + T
    while len(out) < n:
        left = end - time.monotonic()
        assert left > 0, f"manager got {len(out)} of {n} tokens"
        out += ch.manager_recv_many(n - len(out), timeout=left)
    return out


def data(request: int, stage: int = 1, instance: int = 10, **kw: int) -> Token:
    return Token(TokenKind.DATA, hop=stage, instance=instance, request=request, **kw)


def free(tok: Token, instance: int) -> Token:
    return Token(
        TokenKind.FREE, tok.hop, tok.slab, instance, tok.slot, tok.offset, tok.length, tok.request
    )


def test_fault_grant_round_trip(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    prod = Endpoint(ch.add_instance(0, 10))
    ch.add_instance(1, 1).close()
    fault = Token(TokenKind.FAULT, hop=1, instance=10, length=4096, request=42)
    prod.send(fault)
    assert ch.manager_recv(timeout=T) == fault
    ch.manager_send(
        10, Token(TokenKind.GRANT, hop=1, slab=2, slot=9, offset=8192, length=4096, request=42)
    )
    reply = prod.recv(timeout=T)
    assert reply == Token(
        TokenKind.GRANT, hop=1, slab=2, instance=10, slot=9, offset=8192, length=4096, request=42
    )
    ch.manager_send(10, Token(TokenKind.BUSY, hop=1, request=43))
    assert prod.recv(timeout=T).kind == TokenKind.BUSY
    st = ch.stats()
    assert st["kind"] == ch.kind
    assert st["to_manager"] == 1
    assert st["direct"] == 2
    assert st["delivered"] == 0  # no DATA moved
    assert st["rejected_total"] == 0
    assert ch.manager_recv(timeout=0.05) is None


def test_round_robin_is_exact_per_producer(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel("round-robin")
    p1 = Endpoint(ch.add_instance(0, 10))
    p2 = Endpoint(ch.add_instance(0, 11))
    cons = [Endpoint(ch.add_instance(1, i)) for i in (1, 2, 3)]
    p1.send_many([data(r) for r in range(300)])  # 3 sends of 128/128/44 tokens
    got = [recv_n(c, 100) for c in cons]
    for i, toks in enumerate(got):
        assert [t.request for t in toks] == list(range(i, 300, 3)), "in order, every third"
        assert all(t.instance == 10 and t.hop == 1 for t in toks)
    # a second producer has its own cursor: its first 3 tokens go to 1, 2, 3 too
    p2.send_many([data(1000 + r, instance=11) for r in range(3)])
    assert [recv_n(c, 1)[0].request for c in cons] == [1000, 1001, 1002]
    st = ch.stats()
    assert [st["instances"][i]["delivered"] for i in (1, 2, 3)] == [101, 101, 101]
    assert st["stages"][1]["delivered"] == 303
    assert st["stages"][1]["inflight"] == 303  # nobody acknowledged


def test_least_loaded_follows_acknowledgements(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel("least-loaded")
    prod = Endpoint(ch.add_instance(0, 10))
    a, b, c = (Endpoint(ch.add_instance(1, i)) for i in (1, 2, 3))
    prod.send_many([data(r) for r in range(3)])  # all idle: ties rotate -> one each
    ta, tb, tc = recv_n(a, 1)[0], recv_n(b, 1)[0], recv_n(c, 1)[0]
    assert (ta.request, tb.request, tc.request) == (0, 1, 2)
    b.send(free(tb, 2))  # b acknowledges: the only instance with nothing in flight
    assert mgr_recv_n(ch, 1)[0].kind == TokenKind.FREE  # (the ack is applied by now)
    assert {i: ch.stats()["instances"][i]["inflight"] for i in (1, 2, 3)} == {1: 1, 2: 0, 3: 1}
    prod.send_many([data(r) for r in (10, 11)])
    assert recv_n(b, 1)[0].request == 10  # least loaded
    assert recv_n(c, 1)[0].request == 11  # all at 1 again: tie -> cursor after b
    # a DATA hand-over to the next stage is an acknowledgement too
    d = Endpoint(ch.add_instance(2, 20))
    a.send(Token(TokenKind.DATA, hop=2, instance=1, request=ta.request))
    assert recv_n(d, 1)[0].request == ta.request
    wait_until(lambda: ch.stats()["instances"][1]["inflight"] == 0, "a's hand-over acknowledged")
    st = ch.stats()
    assert st["acked"] == 2
    assert st["instances"][20]["inflight"] == 1


def test_malformed_and_unknown_stage_are_rejected(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel("round-robin")
    prod = Endpoint(ch.add_instance(0, 10))
    cons = Endpoint(ch.add_instance(1, 1))
    raw = prod.socket
    good = [data(r, slab=3, slot=r, offset=64 * r, length=64) for r in range(6)]

    bad_magic = bytearray(good[0].pack())
    bad_magic[0] = 0x5A
    bad_magic[28:32] = zlib.crc32(bytes(bad_magic[:28])).to_bytes(4, "little")
    bad_crc = bytearray(good[0].pack())
    bad_crc[24] ^= 0xFF  # a torn request id
    body = bytearray(good[0].pack()[:28])
    body[1] = 9  # no such kind
    bad_kind = bytes(body) + zlib.crc32(bytes(body)).to_bytes(4, "little")

    raw.send(bytes(bad_magic))
    raw.send(good[0].pack())
    raw.send(bytes(bad_crc))
    raw.send(bad_kind)
    raw.send(data(7, stage=40).pack())  # registered nowhere
    raw.send(data(8, stage=70).pack())  # beyond MAX_HOPS
    raw.send(good[1].pack() + bytes(bad_crc) + good[2].pack())  # one send: routed per token
    raw.send(good[3].pack())

    # a second producer writes a frame and a half, then closes
    other = socket.socket(fileno=ch.add_instance(0, 11).detach())
    other.send(good[4].pack() + good[5].pack()[:20])
    other.close()

    got = recv_n(cons, 5)
    assert [t.pack() for t in got] == [g.pack() for g in good[:5]], "valid tokens intact, in order"
    unknown = mgr_recv_n(ch, 2)
    assert sorted(t.request for t in unknown) == [7, 8]
    assert all(t.kind == TokenKind.DATA for t in unknown)
    expected = {"bad_magic": 1, "bad_crc": 2, "bad_kind": 1, "short": 1, "unknown_stage": 2}
    wait_until(lambda: ch.stats()["rejected"] == expected, f"rejected counts {expected}")
    st = ch.stats()
    assert st["rejected_total"] == 7
    assert st["delivered"] == 5
    assert cons.rejected == 0 and cons.truncated == 0
    # the first producer is unharmed
    prod.send(data(99))
    assert recv_n(cons, 1)[0].request == 99
    assert ch.manager_recv(timeout=0.05) is None


def test_misaligned_sends_keep_framing(make_channel: Callable[..., Channel]) -> None:
    """After a torn send (which also shifts the kernel's page fragment, so later tokens
    straddle page boundaries: the program linearises them with bpf_msg_pull_data),
    every following token still arrives intact."""
    ch = make_channel("round-robin")
    prod = Endpoint(ch.add_instance(0, 10))
    cons = Endpoint(ch.add_instance(1, 1))
    sent = b""
    for shift, base in ((20, 0), (7, 10_000), (13, 20_000)):
        # the torn send: wait for room first (a loaded host's router may lag behind)
        select.select([], [prod.socket], [], T)
        prod.socket.send(b"x" * shift)
        batch = b"".join(
            pack_frame(TokenKind.DATA, 1, 0, 10, 0, 0, 0, base + r) for r in range(128 * 20)
        )
        prod.send_bytes(batch)
        sent += batch
    got = b""
    end = time.monotonic() + T
    while len(got) < len(sent) and time.monotonic() < end:
        got += cons.recv_bytes(4096, timeout=0.5)
    assert got == sent
    st = ch.stats()
    assert st["rejected"]["short"] == 3 and st["rejected_total"] == 3
    if ch.kind == "ebpf":
        assert st["pulled"] >= 1, "no token straddled a page: the pull path was not exercised"


def test_remove_instance_returns_unacknowledged_tokens(
    make_channel: Callable[..., Channel],
) -> None:
    ch = make_channel("round-robin")
    prod = Endpoint(ch.add_instance(0, 10))
    a, b, c = (Endpoint(ch.add_instance(1, i)) for i in (1, 2, 3))
    prod.send_many([data(r) for r in range(30)])
    mine = recv_n(b, 10)
    assert [t.request for t in mine] == list(range(1, 30, 3))
    b.send_many([free(t, 2) for t in mine[:4]])
    assert len(mgr_recv_n(ch, 4)) == 4
    reclaimed = ch.remove_instance(2)
    assert sorted(t.request for t in reclaimed) == [t.request for t in mine[4:]]
    assert all(t.kind == TokenKind.DATA and t.hop == 1 for t in reclaimed)
    with pytest.raises(ChannelClosed):  # b's connection ends
        b.recv_many(timeout=T)
    ch.route_many(reclaimed)
    got_a, got_c = recv_n(a, 13), recv_n(c, 13)  # 10 each + 3 each of the 6 re-routed
    routed = {t.request for t in got_a[10:]} | {t.request for t in got_c[10:]}
    assert routed == {t.request for t in reclaimed}
    st = ch.stats()
    assert st["instances"][2]["live"] is False
    assert st["instances"][2]["reclaimed"] == 6
    assert st["instances"][2]["acked"] == 4
    assert 2 not in st["stages"][1]["instances"]
    assert ch.instances() == {10: 0, 1: 1, 3: 1}
    assert st["delivered"] == 36  # 30 + 6 re-routed


def test_stage_without_live_instance_goes_to_manager(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    prod = Endpoint(ch.add_instance(0, 10))
    ch.add_instance(1, 1).close()
    assert ch.remove_instance(1) == []
    prod.send(data(5))
    back = ch.manager_recv(timeout=T)
    assert back is not None and back.kind == TokenKind.DATA and back.request == 5
    st = ch.stats()
    assert st["no_instance"] == 1
    assert st["rejected"]["unknown_stage"] == 0


def test_an_instance_added_not_live_gets_nothing_until_set_live(
    make_channel: Callable[..., Channel],
) -> None:
    # the supervisor adds a loading instance with live=False: tokens go to the live one,
    # or to the manager when there is none, never to the one still loading its model
    ch = make_channel()
    prod = Endpoint(ch.add_instance(0, 10))
    loading = Endpoint(ch.add_instance(1, 1, live=False))
    prod.send(data(1))
    back = ch.manager_recv(timeout=T)
    assert back is not None and back.request == 1 and ch.stats()["no_instance"] == 1
    ready = Endpoint(ch.add_instance(1, 2))
    prod.send_many([data(r) for r in range(2, 6)])
    assert sorted(t.request for t in recv_n(ready, 4)) == [2, 3, 4, 5]
    assert loading.recv_many(8, timeout=0.2) == []
    ch.set_live(1)
    ch.set_live(1)  # idempotent
    prod.send_many([data(r) for r in range(6, 10)])  # least-loaded: 1 holds none, 2 holds 4
    assert sorted(t.request for t in recv_n(loading, 4)) == [6, 7, 8, 9]
    with pytest.raises(ChannelError):
        ch.set_live(99)


def test_manager_send_data_is_in_flight(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    cons = Endpoint(ch.add_instance(1, 7))
    ch.manager_send(7, data(77, instance=123))
    got = cons.recv(timeout=T)
    assert (got.kind, got.request, got.instance) == (TokenKind.DATA, 77, 7)
    assert ch.stats()["instances"][7]["inflight"] == 1
    cons.send(free(got, 7))
    assert mgr_recv_n(ch, 1)[0].kind == TokenKind.FREE
    assert ch.stats()["instances"][7]["inflight"] == 0


def test_duplicate_in_flight_request_goes_to_manager(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    prod = Endpoint(ch.add_instance(0, 10))
    cons = Endpoint(ch.add_instance(1, 1))
    prod.send_many([data(5), data(5)])
    assert recv_n(cons, 1)[0].request == 5
    assert mgr_recv_n(ch, 1)[0].request == 5
    assert ch.stats()["inflight_duplicate"] == 1


def test_full_inflight_table_sends_the_overflow_to_the_manager(
    make_channel: Callable[..., Channel],
) -> None:
    """The backstop for a consumer that never acknowledges (SK_MSG has no back-pressure,
    notes pitfall 3): past MAX_TRACKED tokens in flight, DATA goes to the manager."""
    ch = make_channel()
    prod = Endpoint(ch.add_instance(0, 10))
    idle = Endpoint(ch.add_instance(1, 1))  # never reads, never acknowledges
    extra = 10
    prod.send_bytes(
        b"".join(
            pack_frame(TokenKind.DATA, 1, 0, 10, 0, 0, 0, r) for r in range(MAX_TRACKED + extra)
        ),
        timeout=30,
    )
    back = mgr_recv_n(ch, extra)
    assert sorted(t.request for t in back) == list(range(MAX_TRACKED, MAX_TRACKED + extra))
    st = ch.stats()
    assert st["inflight_full"] == extra
    assert st["instances"][1]["inflight"] == MAX_TRACKED
    idle.close()


def test_refusals(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    ch.add_instance(1, 1).close()
    with pytest.raises(ChannelError, match="already registered"):
        ch.add_instance(2, 1)
    with pytest.raises(ChannelError, match="outside"):
        ch.add_instance(64, 2)
    with pytest.raises(ChannelError, match="outside"):
        ch.add_instance(1, 70000)
    with pytest.raises(ChannelError, match="unknown instance"):
        ch.remove_instance(99)
    with pytest.raises(ChannelError, match="unknown instance"):
        ch.manager_send(99, Token(TokenKind.GRANT))
    with pytest.raises(ChannelError, match="addressed to instance 2"):
        ch.manager_send_bytes(1, pack_frame(TokenKind.GRANT, instance=2))
    with pytest.raises(ChannelError, match="DATA"):
        ch.route(Token(TokenKind.FAULT, hop=1))
    for i in range(2, MAX_PER_HOP + 1):
        ch.add_instance(3, 100 + i).close()
    ch.add_instance(3, 100).close()
    with pytest.raises(ChannelError, match="already has 16"):
        ch.add_instance(3, 99)
    with pytest.raises(ChannelError, match="unknown routing policy"):
        open_channel("userspace", "random")


def test_close_ends_every_connection(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    cons = Endpoint(ch.add_instance(1, 1))
    ch.close()
    with pytest.raises(ChannelClosed):
        cons.recv_many(timeout=T)
    with pytest.raises(ChannelClosed):
        ch.manager_recv(timeout=0)
    ch.close()  # idempotent


def test_close_wakes_a_blocked_manager_recv(make_channel: Callable[..., Channel]) -> None:
    ch = make_channel()
    outcome: list[object] = []

    def wait_forever() -> None:
        try:
            outcome.append(ch.manager_recv(timeout=None))
        except ChannelClosed as exc:
            outcome.append(exc)

    th = threading.Thread(target=wait_forever, daemon=True)
    th.start()
    time.sleep(0.1)  # let it block in poll
    ch.close()
    th.join(timeout=T)
    assert not th.is_alive(), "manager_recv still blocked after close()"
    assert len(outcome) == 1 and isinstance(outcome[0], ChannelClosed)
