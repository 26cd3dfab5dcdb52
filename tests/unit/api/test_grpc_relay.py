"""The gRPC gate's per-connection policy (infscaler.api.grpc.relay.Relay) on hand-made
frames: a call's bytes held from its message prefix to its end, a call over the uid's
budget or stream quota refused in the protocol (status to the client at a frame
boundary, RST_STREAM to grpcio, its DATA dropped and credited), responses charged while
unread, and the quiet-request deadline."""

from __future__ import annotations

from infscaler.api.grpc import h2frames as h2
from infscaler.api.grpc.relay import RESOURCE_EXHAUSTED, UNAVAILABLE, Relay
from infscaler.runtime.serving.admission import ByteBudget
from tests.unit.api.test_h2frames import grpc_message, hpack_literals

UID = 65534
HELLO = h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0)
HDRS = b"\x00\x01a\x01b"  # any header block: the relay never decodes one


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def relay(budget: ByteBudget, quota: int | None = None, uid: int | None = UID, **kw) -> Relay:
    r = Relay(
        uid, budget, {}, quota, kw.pop("max_message", 1 << 20), 10.0, kw.pop("clock", Clock())
    )
    pieces, back = r.from_client(HELLO)
    assert b"".join(pieces) == HELLO and back == b""
    r.from_server(h2.frame(h2.SETTINGS, 0, 0))
    return r


def up(r: Relay, data: bytes) -> tuple[bytes, bytes]:
    pieces, back = r.from_client(data)
    return b"".join(pieces), back


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, i = [], 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 3], "big")
        out.append(
            (
                data[i + 3],
                data[i + 4],
                int.from_bytes(data[i + 5 : i + 9], "big"),
                data[i + 9 : i + 9 + n],
            )
        )
        i += 9 + n
    return out


def status_of(f: tuple) -> tuple[int, str]:
    fields = dict(hpack_literals(f[3]))
    return int(fields["grpc-status"]), fields["grpc-message"]


def test_a_calls_bytes_are_held_from_its_prefix_to_its_end() -> None:
    b = ByteBudget(None, 1000)
    r = relay(b)
    call = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
    call += h2.frame(h2.DATA, h2.END_STREAM, 1, grpc_message(b"x" * 100))
    assert up(r, call) == (call, b"")  # forwarded as it came
    assert b.stats()["inflight_bytes"] == 200 and r.open_streams == 1
    assert r.streams == {UID: 1}
    resp = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
    resp += h2.frame(h2.DATA, 0, 1, grpc_message(b"y" * 50))
    assert b"".join(r.from_server(resp)) == resp
    assert b.stats()["inflight_bytes"] == 250  # the response, unread so far, charged
    end = h2.frame(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1, HDRS)
    assert b"".join(r.from_server(end)) == end
    assert b.stats()["inflight_bytes"] == 0 and r.streams == {} and r.open_streams == 0


def test_a_call_over_the_budget_is_refused_before_its_message_is_forwarded() -> None:
    b = ByteBudget(None, 1000)
    r = relay(b)
    first = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
    first += h2.frame(h2.DATA, h2.END_STREAM, 1, grpc_message(b"x" * 200))
    up(r, first)
    big = grpc_message(b"z" * 400)  # 800 more: over the uid's 1000
    hdrs3 = h2.frame(h2.HEADERS, h2.END_HEADERS, 3, HDRS)
    data3 = h2.frame(h2.DATA, 0, 3, big[:300])
    fwd, back = up(r, hdrs3 + data3)
    # grpcio gets the header block (its HPACK table must) and a cancel, not the DATA
    assert frames(fwd) == [
        (h2.HEADERS, h2.END_HEADERS, 3, HDRS),
        (h2.RST_STREAM, 0, 3, b"\0\0\0\x08"),
    ]
    got = frames(back)
    assert [f[:3] for f in got] == [
        (h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 3),
        (h2.RST_STREAM, 0, 3),
        (h2.WINDOW_UPDATE, 0, 0),
    ]
    code, message = status_of(got[0])
    assert code == UNAVAILABLE and "in-flight memory budget" in message
    assert "budget of one user" in message and "(retry after 1 s)" in message
    assert dict(hpack_literals(got[0][3]))["infscaler-code"] == "bytes_in_flight"
    assert int.from_bytes(got[2][3], "big") == 300  # the dropped DATA given back
    assert b.stats()["inflight_bytes"] == 400 and b.stats()["refused_per_peer"] == 1
    # the rest of the refused message: dropped, credited; grpcio's late frames dropped
    rest = h2.frame(h2.DATA, h2.END_STREAM, 3, big[300:])
    fwd, back = up(r, rest)
    assert fwd == b"" and frames(back) == [(h2.WINDOW_UPDATE, 0, 0, (105).to_bytes(4, "big"))]
    assert r.from_server(h2.frame(h2.WINDOW_UPDATE, 0, 3, b"\0\0\1\0")) == []
    # the next call on the connection is served
    call5 = h2.frame(h2.HEADERS, h2.END_HEADERS, 5, HDRS)
    call5 += h2.frame(h2.DATA, h2.END_STREAM, 5, grpc_message(b"q" * 10))
    assert up(r, call5) == (call5, b"")
    r.close()
    assert b.stats()["inflight_bytes"] == 0 and r.streams == {}


def test_a_status_waits_for_a_boundary_of_the_servers_frames() -> None:
    b = ByteBudget(None, 100)
    r = relay(b)
    up(
        r,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
        + h2.frame(h2.DATA, 0, 1, grpc_message(b"a" * 40)),
    )
    # grpcio is mid-way through a header block (HEADERS, CONTINUATION) and a frame
    head = h2.frame(h2.HEADERS, 0, 1, HDRS)
    cont = h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, HDRS)
    assert b"".join(r.from_server(head + cont[:4])) == head + cont[:4]
    _, back = up(
        r,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 3, HDRS)
        + h2.frame(h2.DATA, 0, 3, grpc_message(b"b" * 60)),
    )
    assert back == b""  # it would land inside the header block
    out = b"".join(r.from_server(cont[4:] + h2.frame(h2.PING, 0, 0, b"\0" * 8)))
    got = frames(head + cont[:4] + out)
    assert [f[:3] for f in got] == [
        (h2.HEADERS, 0, 1),
        (h2.CONTINUATION, h2.END_HEADERS, 1),
        (h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 3),
        (h2.RST_STREAM, 0, 3),
        (h2.WINDOW_UPDATE, 0, 0),
        (h2.PING, 0, 0),
    ]


def test_the_stream_quota_refuses_a_call_past_it_and_spares_the_operator() -> None:
    b = ByteBudget(None, 10_000)
    r = relay(b, quota=1)
    h1 = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
    h3 = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 3, HDRS)
    up(r, h1)
    fwd, back = up(r, h3)
    assert frames(fwd) == [frames(h3)[0], (h2.RST_STREAM, 0, 3, b"\0\0\0\x08")]
    got = frames(back)
    assert len(got) == 1  # the client had ended its side: no RST_STREAM for it
    code, message = status_of(got[0])
    assert code == RESOURCE_EXHAUSTED and "at most 1 per user" in message
    assert dict(hpack_literals(got[0][3]))["infscaler-code"] == "uid_streams"
    assert r.streams == {UID: 1}
    op = relay(b, quota=1, uid=None)
    assert up(op, h1 + h3) == (h1 + h3, b"") and op.open_streams == 2


def test_an_unread_response_holds_the_uids_budget_until_the_call_ends() -> None:
    b = ByteBudget(None, 1000)
    r = relay(b)
    up(
        r,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
        + h2.frame(h2.DATA, h2.END_STREAM, 1, grpc_message(b"")),
    )
    r.from_server(
        h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
        + h2.frame(h2.DATA, 0, 1, grpc_message(b"r" * 900)[:100])
    )
    assert b.stats()["inflight_bytes"] == 900
    _, back = up(
        r,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 3, HDRS)
        + h2.frame(h2.DATA, 0, 3, grpc_message(b"s" * 100)),
    )
    assert status_of(frames(back)[0])[0] == UNAVAILABLE
    r.from_server(h2.rst_stream(1, h2.CANCEL))
    assert b.stats()["inflight_bytes"] == 0


def test_a_request_gone_quiet_has_a_deadline() -> None:
    clock = Clock()
    r = relay(ByteBudget(None, 1000), clock=clock)
    assert r.deadline() is None
    up(r, h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS) + h2.frame(h2.DATA, 0, 1, b"\0\0"))
    assert r.deadline() == 110.0
    clock.t = 105.0
    up(r, h2.frame(h2.DATA, 0, 1, b"\0"))
    assert r.deadline() == 115.0
    r.stalled(108.0)  # the gate could not write to grpcio meanwhile
    assert r.deadline() == 118.0
    up(r, h2.frame(h2.DATA, h2.END_STREAM, 1, b"\0\0"))
    assert r.deadline() is None
    up(r, h2.frame(h2.PING, 0, 0, b"\0" * 8)[:5])  # a frame begun
    assert r.deadline() == 118.0


def test_a_message_over_the_servers_limit_is_left_to_grpcio() -> None:
    b = ByteBudget(None, 1000)
    r = relay(b, max_message=500)
    call = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS) + h2.frame(
        h2.DATA, 0, 1, grpc_message(b"x" * 600)[:50]
    )
    assert up(r, call) == (call, b"") and b.stats()["inflight_bytes"] == 0


def test_a_charge_is_never_refused_and_makes_the_next_reserve_refuse() -> None:
    b = ByteBudget(1000, 500)
    b.charge(800, UID)  # past the uid's 500: counted all the same
    assert b.stats()["inflight_bytes"] == 800 and b.stats()["peak_bytes"] == 800
    assert not b.reserve(10, UID).admit
    assert b.reserve(10, None).admit  # the operator: the service-wide 1000 only
    b.release(800, UID)
    b.release(10, None)
    assert b.reserve(400, UID).admit and b.stats()["inflight_bytes"] == 400


class Refusal(Exception):
    """What ``Service.precheck`` returns: a refusal with the seconds to hold it."""

    hold_s = 0.25
    code = "slo"


def infer_message(model: str, n: int) -> bytes:
    from infscaler.proto import grpc_service_pb2 as pb

    req = pb.ModelInferRequest(model_name=model, raw_input_contents=[b"r" * n])
    req.inputs.add(name="x", datatype="UINT8", shape=[n])
    return grpc_message(req.SerializeToString())


def test_an_inference_refused_at_its_prefix_is_answered_after_its_hold() -> None:
    asked: list[tuple[str, int | None]] = []

    def precheck(model: str, uid: int | None):
        asked.append((model, uid))
        return Refusal("pipeline det refuses the request at arrival") if model == "det" else None

    clock, b = Clock(), ByteBudget(None, 10_000)
    r = Relay(UID, b, {}, None, 1 << 20, 10.0, clock, precheck)
    up(r, HELLO)
    r.from_server(h2.frame(h2.SETTINGS, 0, 0))
    msg = infer_message("det", 2000)
    hdrs = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, HDRS)
    fwd, back = up(r, hdrs + h2.frame(h2.DATA, 0, 1, msg[:1000]))
    # grpcio: the header block and a cancel, never the message; nothing held for it
    assert frames(fwd) == [
        (h2.HEADERS, h2.END_HEADERS, 1, HDRS),
        (h2.RST_STREAM, 0, 1, b"\0\0\0\x08"),
    ]
    assert asked == [("det", UID)] and b.stats()["inflight_bytes"] == 0
    # the client: its DATA credited at once, its status not yet
    assert [f[:3] for f in frames(back)] == [(h2.WINDOW_UPDATE, 0, 0)]
    assert r.holding == 1 and r.next_due() == clock.t + 0.25
    # the rest of its message comes and is dropped; then the status falls due
    fwd, back = up(r, h2.frame(h2.DATA, h2.END_STREAM, 1, msg[1000:]))
    assert fwd == b"" and [f[:3] for f in frames(back)] == [(h2.WINDOW_UPDATE, 0, 0)]
    assert r.release_due(clock.t + 0.2) == b"" and r.holding == 1
    got = frames(r.release_due(clock.t + 0.25))
    # the client ended its side: trailers only, no RST_STREAM (the stream is closed)
    assert [f[:3] for f in got] == [(h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1)]
    code, message = status_of(got[0])
    assert code == UNAVAILABLE and "refuses the request at arrival" in message
    assert dict(hpack_literals(got[0][3]))["infscaler-code"] == "slo"
    assert r.holding == 0 and r.next_due() is None
    # another model's inference, and a call that is not an inference, go through
    call = h2.frame(h2.HEADERS, h2.END_HEADERS, 3, HDRS)
    call += h2.frame(h2.DATA, h2.END_STREAM, 3, infer_message("ocr", 10))
    assert up(r, call) == (call, b"")
    meta = h2.frame(h2.HEADERS, h2.END_HEADERS, 5, HDRS)
    meta += h2.frame(h2.DATA, h2.END_STREAM, 5, grpc_message(b"\x0a\x03det"))
    assert up(r, meta) == (meta, b"")
    assert asked == [("det", UID), ("ocr", UID)]


def test_a_held_refusal_of_a_client_still_sending_ends_its_stream_and_a_reset_drops_it() -> None:
    clock = Clock()
    r = Relay(None, ByteBudget(None), {}, None, 1 << 20, 10.0, clock, lambda m, u: Refusal("no"))
    up(r, HELLO)
    msg = infer_message("det", 500)
    for s in (1, 3):
        up(r, h2.frame(h2.HEADERS, h2.END_HEADERS, s, HDRS) + h2.frame(h2.DATA, 0, s, msg[:100]))
    assert r.holding == 2
    # the client resets stream 3 meanwhile: its status is never sent
    up(r, h2.frame(h2.RST_STREAM, 0, 3, b"\0\0\0\x08"))
    got = frames(r.release_due(clock.t + 1))
    # stream 1 still open on the client's side: status, then RST_STREAM(NO_ERROR)
    assert [f[:3] for f in got] == [
        (h2.HEADERS, h2.END_STREAM | h2.END_HEADERS, 1),
        (h2.RST_STREAM, 0, 1),
    ]
    assert r.holding == 0
