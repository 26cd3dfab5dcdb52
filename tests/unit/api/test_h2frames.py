"""The gRPC gate's HTTP/2 framing (infscaler.api.grpc.h2frames): frames and gRPC messages
found the same whatever the chunk splits, the framing errors, and the frames the gate
makes (HPACK literals checked by hand against RFC 7541's examples)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infscaler.api.grpc import h2frames as h2


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


def hpack_int(block: bytes, i: int, bits: int) -> tuple[int, int]:
    """An HPACK integer at ``block[i]`` with a ``bits``-bit prefix (RFC 7541 5.1):
    (value, next offset)."""
    cap = (1 << bits) - 1
    v, i = block[i] & cap, i + 1
    if v < cap:
        return v, i
    shift = 0
    while True:
        b, i = block[i], i + 1
        v += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def hpack_literals(block: bytes) -> list[tuple[str, str]]:
    """Decode a block of "literal without indexing, new name" fields (RFC 7541 6.2.2,
    no Huffman): the only representation the gate writes."""
    out, i = [], 0
    while i < len(block):
        assert block[i] == 0x00, block[i:]
        assert not block[i + 1] & 0x80  # H bit: no Huffman
        n, i = hpack_int(block, i + 1, 7)
        name, i = block[i : i + n], i + n
        assert not block[i] & 0x80
        m, i = hpack_int(block, i, 7)
        out.append((name.decode(), block[i : i + m].decode()))
        i += m
    return out


def sample_stream() -> tuple[bytes, list[tuple], list[tuple]]:
    """A client's bytes: preface, SETTINGS, a header block in HEADERS + CONTINUATION, two
    messages split over DATA frames (one PADDED, one frame ending a message and starting
    the next), an empty message, a RST_STREAM; and the frames and messages it holds
    (absolute offsets)."""
    a, b, c = b"A" * 3000, b"B" * 7, b""
    payload1 = grpc_message(a) + grpc_message(b)[:3]
    payload2 = grpc_message(b)[3:] + grpc_message(c)
    parts = [
        h2.PREFACE,
        h2.frame(h2.SETTINGS, 0, 0, (5).to_bytes(2, "big") + (32768).to_bytes(4, "big")),
        h2.frame(h2.HEADERS, 0, 1, b"\x00\x01a\x01b"),
        h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, b"\x00\x01c\x01d"),
        h2.frame(h2.DATA, 0, 1, payload1[:1000]),
        h2.frame(h2.DATA, h2.PADDED, 1, bytes((4,)) + payload1[1000:] + b"\0" * 4),
        h2.frame(h2.DATA, h2.END_STREAM, 1, payload2),
        h2.frame(h2.HEADERS, h2.END_HEADERS, 3, b"\x00\x01a\x01b"),
        h2.rst_stream(3, h2.CANCEL),
    ]
    data = b"".join(parts)
    frames, at = [], len(h2.PREFACE)
    for p in parts[1:]:
        length = int.from_bytes(p[:3], "big")
        frames.append((p[3], p[4], int.from_bytes(p[5:9], "big"), length, at))
        at += len(p)
    d1 = len(h2.PREFACE) + len(parts[1]) + len(parts[2]) + len(parts[3]) + 9
    d3 = d1 + 1000 + len(parts[5])  # the third DATA frame's header
    messages = [
        (1, 3000, d1 + 5),
        (1, 7, d3 + 9 + 2),  # its prefix: 3 bytes in the PADDED frame, 2 in the next
        (1, 0, d3 + 9 + 2 + 7 + 5),
    ]
    return data, frames, messages


def scan(data: bytes, cuts: list[int]) -> tuple[list, list, list]:
    sc = h2.Scanner(preface=True, settings=True, track_new=True)
    frames, messages, settings_ = [], [], []
    base = 0
    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
        for ev in sc.feed(data[a:b]):
            if ev[0] == h2.FRAME:
                frames.append((*ev[1:5], base + ev[5]))
            elif ev[0] == h2.MESSAGE:
                messages.append((ev[1], ev[2], base + ev[3]))
            else:
                settings_.append(ev[1:])
        base = b
    assert not sc.mid_frame
    return frames, messages, settings_


def test_a_whole_stream_gives_its_frames_and_messages() -> None:
    data, frames, messages = sample_stream()
    got_frames, got_messages, got_settings = scan(data, [])
    assert got_frames == frames
    assert got_messages == messages
    assert got_settings == [(5, 32768)]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_split_into_chunks_gives_the_same_frames_and_messages(data_) -> None:
    data, frames, messages = sample_stream()
    cuts = sorted(set(data_.draw(st.lists(st.integers(1, len(data) - 1), max_size=40))))
    got_frames, got_messages, got_settings = scan(data, cuts)
    assert got_frames == frames and got_messages == messages
    assert got_settings == [(5, 32768)]


def test_a_split_right_after_a_padded_frames_header() -> None:
    data, frames, messages = sample_stream()
    padded = next(f[4] for f in frames if f[0] == h2.DATA and f[1] & h2.PADDED)
    assert scan(data, [padded + 9])[:2] == (frames, messages)


def test_a_stream_not_tracked_has_no_messages_and_a_forgotten_one_stops() -> None:
    sc = h2.Scanner(preface=False)
    body = h2.frame(h2.DATA, 0, 1, grpc_message(b"xy"))
    assert [e[0] for e in sc.feed(body)] == [h2.FRAME]  # stream 1 not tracked
    sc.track(1)
    half = h2.frame(h2.DATA, 0, 1, grpc_message(b"xyz")[:6])
    assert [e[:3] for e in sc.feed(half) if e[0] == h2.MESSAGE] == [(h2.MESSAGE, 1, 3)]
    assert sc.partial(1)
    sc.forget(1)
    assert not sc.partial(1)


def test_framing_errors() -> None:
    with pytest.raises(h2.FrameError, match="preface"):
        h2.Scanner(preface=True).feed(b"GET / HTTP/1.1\r\n")
    sc = h2.Scanner(preface=False)
    with pytest.raises(h2.FrameError, match="over the maximum frame size, 16384"):
        sc.feed((16385).to_bytes(3, "big") + b"\0\0\0\0\0\1")
    sc = h2.Scanner(preface=False)
    sc.max_frame = 1 << 20  # the receiver raised SETTINGS_MAX_FRAME_SIZE
    assert sc.feed((16385).to_bytes(3, "big") + b"\0\0\0\0\0\1")[0][4] == 16385
    sc = h2.Scanner(preface=False)
    sc.track(1)
    with pytest.raises(h2.FrameError, match="padding"):
        sc.feed(h2.frame(h2.DATA, h2.PADDED, 1, bytes((9,)) + b"abc"))


def test_hpack_integers_and_literals_follow_rfc_7541() -> None:
    # C.1.1 and C.1.2: 10 and 1337 with a 5-bit prefix
    assert h2._hpack_int(10, 5) == b"\x0a"
    assert h2._hpack_int(1337, 5) == b"\x1f\x9a\x0a"
    # C.2.1's field as "without indexing" (6.2.2: first byte 0000 0000, then the strings)
    assert h2.hpack_literal(b"custom-key", b"custom-header") == (
        b"\x00\x0acustom-key\x0dcustom-header"
    )
    long = h2.hpack_literal(b"k", b"v" * 200)  # a length past the 7-bit prefix
    assert long[:5] == b"\x00\x01k\x7f\x49" and len(long) == 5 + 200


def test_grpc_message_is_percent_encoded() -> None:
    assert h2.percent_encode("a%b\n é~") == b"a%25b%0A %C3%A9~"


def test_a_trailers_only_status_is_one_headers_frame() -> None:
    f = h2.trailers_only(5, 14, "over budget: 1.2 MB\n(retry after 1 s)")
    assert int.from_bytes(f[:3], "big") == len(f) - 9
    assert f[3] == h2.HEADERS and f[4] == h2.END_STREAM | h2.END_HEADERS
    assert int.from_bytes(f[5:9], "big") == 5
    assert hpack_literals(f[9:]) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "14"),
        ("grpc-message", "over budget: 1.2 MB%0A(retry after 1 s)"),
    ]
    later = h2.trailers_only(5, 8, "x", headers_sent=True)  # trailers: no pseudo-header
    assert hpack_literals(later[9:]) == [("grpc-status", "8"), ("grpc-message", "x")]
    coded = h2.trailers_only(5, 14, "x", code="bytes_in_flight")  # a refusal's reason code
    assert hpack_literals(coded[9:])[-1] == ("infscaler-code", "bytes_in_flight")
    assert h2.window_update(0, 70000) == b"\0\0\4\x08\0\0\0\0\0" + (70000).to_bytes(4, "big")
    assert h2.rst_stream(3, h2.CANCEL) == b"\0\0\4\x03\0\0\0\0\3\0\0\0\x08"
