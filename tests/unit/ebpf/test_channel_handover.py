"""Control channel framing in one process: an Endpoint over a byte stream keeps its frames
whatever the sends' sizes. Handover, policies, faults and reclaim on both channel kinds
(eBPF loaded) are in tests/integration/ebpf/test_channel_handover.py."""

from __future__ import annotations

import socket

import pytest

from infscaler.ebpf import (
    ChannelClosed,
    Endpoint,
)
from tests.integration.ebpf.test_channel_handover import data

T = 5.0  # seconds: bound of every wait in this file


# -- Endpoint framing, without a router --------------------------------------------------------


def test_endpoint_framing_on_a_byte_stream() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ep = Endpoint(b)
    t1, t2 = data(1), data(2)
    bad = bytearray(data(3).pack())
    bad[20] ^= 1
    a.sendall(t1.pack()[:16])
    assert ep.recv_many(timeout=0) == []  # half a token is not a token
    a.sendall(t1.pack()[16:] + bytes(bad) + t2.pack() + t2.pack()[:5])
    assert ep.recv_many(timeout=T) == [t1, t2]
    assert ep.rejected == 1
    with pytest.raises(TimeoutError):
        ep.recv(timeout=0.05)
    with pytest.raises(ValueError):
        Endpoint(a).send_bytes(b"x" * 31)
    a.close()
    with pytest.raises(ChannelClosed):
        ep.recv(timeout=T)
    assert ep.truncated == 1
    ep.close()
