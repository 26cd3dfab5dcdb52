"""HTTP/2 framing for the gRPC gate (pure): frame boundaries and gRPC message prefixes in a
byte stream, headers never decoded (:class:`Scanner`), and the few frames the gate sends.

Sources: RFC 9113 (HTTP/2), RFC 7541 (HPACK), grpc ``doc/PROTOCOL-HTTP2.md``. More:
docs/api.md, "`infscaler/api/grpc/h2frames.py`".
"""

from __future__ import annotations

__all__ = [
    "CANCEL",
    "DEFAULT_MAX_FRAME",
    "FRAME",
    "MESSAGE",
    "NO_ERROR",
    "PREFACE",
    "SETTING",
    "FrameError",
    "Scanner",
    "frame",
    "hpack_literal",
    "percent_encode",
    "rst_stream",
    "trailers_only",
    "window_update",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types (RFC 9113 section 6) and flags
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
#: error codes (RFC 9113 section 7)
NO_ERROR, CANCEL = 0x0, 0x8
#: SETTINGS_MAX_FRAME_SIZE: its initial value and its largest allowed (section 6.5.2)
DEFAULT_MAX_FRAME, LARGEST_FRAME = 16384, (1 << 24) - 1
SETTINGS_MAX_FRAME_SIZE = 0x5
#: event kinds of :meth:`Scanner.feed`
FRAME, MESSAGE, SETTING = 0, 1, 2


class FrameError(Exception):
    """Not HTTP/2 as RFC 9113 frames it: close the connection (section 5.4.1)."""


class Scanner:
    """Frame boundaries and gRPC message prefixes of one direction of a connection.

    Args:
        preface: expect the client connection preface first.
        max_frame: the largest frame payload allowed, bytes (``SETTINGS_MAX_FRAME_SIZE``).
        settings: report the values of SETTINGS frames (``SETTING`` events).
        track_new: follow the messages of every stream a HEADERS frame opens.

    :meth:`feed` returns events, in stream order:

    - ``(FRAME, type, flags, stream, length, start)``: a frame header at chunk offset
      ``start`` (negative: begun in an earlier chunk); it ends at ``start + 9 + length``;
    - ``(MESSAGE, stream, length, offset)``: a gRPC message prefix on a tracked stream,
      complete at chunk ``offset``;
    - ``(SETTING, identifier, value)``: one parameter of a SETTINGS frame (not an ACK).
    """

    def __init__(
        self,
        preface: bool,
        max_frame: int = DEFAULT_MAX_FRAME,
        settings: bool = False,
        track_new: bool = False,
    ) -> None:
        self.max_frame = max_frame
        self._track_new = track_new
        self._newest = 0
        self._preface_left = len(PREFACE) if preface else 0
        self._settings = settings
        self._hdr = b""  # a frame header split across chunks
        self._left = 0  # payload bytes of the current frame still to come
        self._type = -1
        self._stream = 0
        self._pad_pending = False  # a PADDED DATA frame's pad length byte is next
        self._data_left = 0  # DATA bytes (padding excluded) of the current frame to come
        self._msg: list | None = None  # the current DATA frame's stream's message state
        self._buf: bytearray | None = None  # a SETTINGS payload being gathered
        # stream -> [prefix bytes gathered, message body bytes still to come]
        self._msgs: dict[int, list] = {}

    # -- streams --------------------------------------------------------------------------

    def track(self, stream: int) -> None:
        """Follow gRPC messages in ``stream``'s DATA frames from now on."""
        self._msgs.setdefault(stream, [b"", 0])

    def forget(self, stream: int) -> None:
        """Stop following ``stream`` (ended or refused)."""
        self._msgs.pop(stream, None)
        if self._type == DATA and self._stream == stream:
            self._msg = None

    def partial(self, stream: int) -> bool:
        """Whether a message of ``stream`` has begun and not ended."""
        st = self._msgs.get(stream)
        return st is not None and (bool(st[0]) or st[1] > 0)

    @property
    def stream(self) -> int:
        """The stream of the frame in progress (0 between frames)."""
        return self._stream if self._left else 0

    @property
    def mid_frame(self) -> bool:
        """Whether the bytes so far end inside a frame (or the preface)."""
        return bool(self._left or self._hdr or 0 < self._preface_left < len(PREFACE))

    @property
    def preface_done(self) -> bool:
        return self._preface_left == 0

    # -- scanning -------------------------------------------------------------------------

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[tuple]:
        """Scan ``chunk`` (the bytes after all those fed before); returns its events.

        Raises:
            FrameError: a bad preface, a frame longer than :attr:`max_frame`, padding
                longer than its frame.
        """
        mv = memoryview(chunk)
        n, i, out = len(mv), 0, []
        if self._preface_left:
            k = len(PREFACE) - self._preface_left
            take = min(self._preface_left, n)
            if mv[:take] != PREFACE[k : k + take]:
                raise FrameError("not an HTTP/2 connection: the client preface is wrong")
            self._preface_left -= take
            i = take
        while i < n:
            if not self._left:
                if self._hdr or n - i < 9:
                    need = 9 - len(self._hdr)
                    self._hdr += bytes(mv[i : i + need])
                    i += min(need, n - i)
                    if len(self._hdr) < 9:
                        break
                    h, start, self._hdr = self._hdr, i - 9, b""
                else:
                    h, start = mv[i : i + 9], i
                    i += 9
                self._begin(h, start, out)
                if not self._left or i == n:
                    continue
            take = min(self._left, n - i)
            if self._type == DATA and self._msg is not None:
                self._data(mv, i, take, out)
            elif self._buf is not None:
                self._buf += mv[i : i + take]
            self._left -= take
            i += take
            if not self._left and self._buf is not None:
                self._settings_done(out)
        return out

    def _begin(self, h: bytes | memoryview, start: int, out: list) -> None:
        length = (h[0] << 16) | (h[1] << 8) | h[2]
        typ, flags = h[3], h[4]
        stream = int.from_bytes(h[5:9], "big") & 0x7FFFFFFF
        if length > self.max_frame:
            raise FrameError(
                f"a frame of {length} bytes is over the maximum frame size, {self.max_frame}"
            )
        out.append((FRAME, typ, flags, stream, length, start))
        self._type, self._stream, self._left = typ, stream, length
        if typ == DATA:
            self._msg = self._msgs.get(stream)
            self._pad_pending = bool(flags & PADDED)
            self._data_left = 0 if self._pad_pending else length
            if self._pad_pending and length == 0:
                raise FrameError("a PADDED DATA frame without its pad length")
        elif typ == HEADERS and self._track_new and stream > self._newest:
            self._newest = stream
            self._msgs[stream] = [b"", 0]
        elif typ == SETTINGS and self._settings and not flags & ACK and length:
            self._buf = bytearray()

    def _data(self, mv: memoryview, i: int, take: int, out: list) -> None:
        end = i + take
        if self._pad_pending:
            pad = mv[i]
            if pad > self._left - 1:
                raise FrameError("DATA padding longer than its frame")
            self._data_left = self._left - 1 - pad
            self._pad_pending = False
            i += 1
        d = min(self._data_left, end - i)
        self._data_left -= d
        st, stream, end = self._msg, self._stream, i + d
        while i < end:
            if st[1]:
                t = min(st[1], end - i)
                st[1] -= t
                i += t
                continue
            t = min(5 - len(st[0]), end - i)
            st[0] += bytes(mv[i : i + t])
            i += t
            if len(st[0]) == 5:
                st[1] = int.from_bytes(st[0][1:5], "big")
                st[0] = b""
                out.append((MESSAGE, stream, st[1], i))

    def _settings_done(self, out: list) -> None:
        buf, self._buf = self._buf, None
        for k in range(0, len(buf) - 5, 6):
            out.append(
                (
                    SETTING,
                    int.from_bytes(buf[k : k + 2], "big"),
                    int.from_bytes(buf[k + 2 : k + 6], "big"),
                )
            )


# -- frames the gate sends -------------------------------------------------------------------


def frame(typ: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame (RFC 9113 section 4.1)."""
    return (
        len(payload).to_bytes(3, "big") + bytes((typ, flags)) + stream.to_bytes(4, "big") + payload
    )


def rst_stream(stream: int, code: int) -> bytes:
    """RST_STREAM (section 6.4) of ``stream`` with error ``code``."""
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def window_update(stream: int, increment: int) -> bytes:
    """WINDOW_UPDATE (section 6.9) giving ``increment`` bytes (1 .. 2**31 - 1) back."""
    return frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def _hpack_int(value: int, bits: int, first: int = 0) -> bytes:
    """An HPACK integer with a ``bits``-bit prefix (RFC 7541 section 5.1)."""
    cap = (1 << bits) - 1
    if value < cap:
        return bytes((first | value,))
    out, value = bytearray((first | cap,)), value - cap
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name: bytes, value: bytes) -> bytes:
    """One header field as "literal without indexing, new name", both strings raw
    (RFC 7541 section 6.2.2, first byte 0x00; strings section 5.2, H bit 0)."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, each byte outside ``%x20-%x24 / %x26-%x7E``
    written ``%XX`` (grpc ``doc/PROTOCOL-HTTP2.md``, "Percent-Encoded")."""
    out = bytearray()
    for b in message.encode():
        out += bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b
    return bytes(out)


def trailers_only(
    stream: int, status: int, message: str, headers_sent: bool = False, code: str | None = None
) -> bytes:
    """A gRPC status for ``stream`` as one HEADERS frame (END_STREAM | END_HEADERS):
    ``:status 200`` and ``content-type`` (unless ``headers_sent``), ``grpc-status``,
    ``grpc-message`` and, with ``code``, ``infscaler-code`` (grpc Trailers-Only)."""
    block = (
        b""
        if headers_sent
        else (
            hpack_literal(b":status", b"200") + hpack_literal(b"content-type", b"application/grpc")
        )
    )
    block += hpack_literal(b"grpc-status", str(status).encode())
    block += hpack_literal(b"grpc-message", percent_encode(message))
    if code is not None:
        block += hpack_literal(b"infscaler-code", code.encode("ascii"))
    return frame(HEADERS, END_STREAM | END_HEADERS, stream, block)
