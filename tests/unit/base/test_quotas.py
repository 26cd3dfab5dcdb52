"""Quotas per client uid (infscaler.base.quotas), the per-peer byte budget
(runtime.admission) and rate-limited logging (infscaler.base.ratelog): pure decisions
on hand-computed inputs."""

from __future__ import annotations

import logging

import pytest

from infscaler.base.errors import InfScalerError
from infscaler.base.quotas import (
    FD_RESERVE,
    LoadBudget,
    PeerQuotas,
    admit_connection,
    plan_fds,
)
from infscaler.base.ratelog import RateLimitedLog, RateLimitFilter
from infscaler.runtime.serving.admission import ByteBudget, admit_bytes


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- connections ---------------------------------------------------------------------------


def test_connections_per_uid_and_the_operators_share() -> None:
    q = PeerQuotas(connections_per_uid=3, operator_connections=2)
    assert admit_connection(False, 0, 0, 10, q) is None
    assert "per user" in admit_connection(False, 5, 3, 10, q)
    # 8 open: the last 2 of 10 are the operator's
    assert "kept for the operator" in admit_connection(False, 8, 0, 10, q)
    assert admit_connection(True, 8, 7, 10, q) is None  # no per-uid limit for the operator
    assert admit_connection(True, 9, 9, 10, q) is None
    assert "at most 10" in admit_connection(True, 10, 0, 10, q)


def test_quota_values_are_checked() -> None:
    with pytest.raises(InfScalerError, match="connections_per_uid must be an integer >= 1"):
        PeerQuotas(connections_per_uid=0)
    with pytest.raises(InfScalerError, match="inflight_mb_per_uid must be a number > 0"):
        PeerQuotas(inflight_mb_per_uid=float("nan"))
    with pytest.raises(InfScalerError, match="operator_connections must be an integer >= 0"):
        PeerQuotas(operator_connections=-1)


@pytest.mark.parametrize(
    ("field", "bad", "why"),
    [
        ("pending_per_uid", 0, "pending_per_uid must be an integer >= 1"),
        ("pending_per_uid", 2.5, "pending_per_uid must be an integer >= 1"),
        ("operator_pending", -1, "operator_pending must be an integer >= 0"),
        ("operator_pending", True, "operator_pending must be an integer >= 0"),
    ],
)
def test_the_pending_quotas_are_checked(field: str, bad, why: str) -> None:
    q = PeerQuotas()
    assert (q.pending_per_uid, q.operator_pending) == (256, 64)  # of max_pending 1024
    assert PeerQuotas(operator_pending=0).operator_pending == 0
    with pytest.raises(InfScalerError, match=why):
        PeerQuotas(**{field: bad})


# -- file descriptors ----------------------------------------------------------------------


def test_plan_fds_fits_clients_under_the_limit_with_a_reserve() -> None:
    ok = plan_fds(65536, 512, 256)
    assert (ok.max_connections, ok.regions, ok.warning) == (512, 256, "")
    low = plan_fds(1024, 512, 256, reserve=256)  # 768 for clients, 1280 asked
    assert 2 * low.max_connections + low.regions <= 1024 - 256
    assert low.max_connections < 512 and low.regions <= 256
    assert "fd limit 1024" in low.warning and "LimitNOFILE" in low.warning
    with pytest.raises(InfScalerError, match="leaves 0 fds for clients"):
        plan_fds(200, 512, 256, reserve=256)


def test_plan_fds_counts_the_grpc_sockets_connections_three_fds_each() -> None:
    # 512 HTTP (twice: refusals) + 512 gRPC x 3 (client, gate upstream, grpcio) + 256
    assert plan_fds(3072, 512, 256, grpc=True).warning == ""
    low = plan_fds(3071, 512, 256, grpc=True)
    assert low.max_connections < 512 and "fd limit" in low.warning
    assert 5 * low.max_connections + low.regions <= 3071 - FD_RESERVE
    assert plan_fds(3071, 512, 256).warning == ""  # HTTP alone fits


# -- variant loads -------------------------------------------------------------------------


def test_variant_loads_are_a_token_bucket_per_uid() -> None:
    clock = Clock()
    b = LoadBudget(2, clock=clock)  # 2 a minute, burst 2
    assert b.take(1000) is None and b.take(1000) is None
    wait = b.take(1000)
    assert wait == pytest.approx(30.0)  # one token every 30 s
    assert b.take(1001) is None  # another uid has its own
    clock.t += 30.0
    assert b.take(1000) is None
    assert b.refused == 1


# -- bytes in flight per peer --------------------------------------------------------------


def test_admit_bytes_per_peer() -> None:
    assert admit_bytes(10, 0, 100, peer_inflight_bytes=0, peer_budget_bytes=5).admit
    refused = admit_bytes(10, 20, 100, peer_inflight_bytes=1, peer_budget_bytes=5)
    assert not refused.admit and "budget of one user" in refused.reason
    assert refused.retry_after_s is not None
    assert admit_bytes(10, 20, 100, peer_inflight_bytes=1, peer_budget_bytes=None).admit


def test_byte_budget_keeps_each_peers_share() -> None:
    b = ByteBudget(100, 40)
    assert b.reserve(30, peer=7).admit
    assert not b.reserve(20, peer=7).admit  # 50 > 40 for uid 7
    assert b.reserve(30, peer=8).admit  # uid 8 has its own 40
    assert b.reserve(30).admit  # the operator: the service-wide 100 only
    assert not b.reserve(20).admit  # 110 > 100
    assert b.stats()["refused_per_peer"] == 1 and b.stats()["refused"] == 2
    b.release(30, peer=7)
    assert b.reserve(20, peer=7).admit  # 80 of 100 in all, 20 of 40 for uid 7
    assert b.stats()["peers_holding"] == 2 and b.inflight_bytes == 80


def test_request_reservation_counts_json_at_its_decoded_size() -> None:
    from infscaler.runtime.serving.admission import JSON_DECODE_FACTOR, request_reservation

    assert JSON_DECODE_FACTOR == 20
    assert request_reservation(1000, 10_000, None) == 20_000  # all JSON
    assert request_reservation(1000, 10_000, 100) == 2 * 900 + 20 * 100  # binary after 100
    assert request_reservation(None, 10_000, 0) == 20_000  # chunked: the limit, binary
    assert request_reservation(50_000, 10_000, 20_000) == 20 * 10_000  # capped at the limit


# -- rate-limited logs ---------------------------------------------------------------------


def test_rate_limit_filter_one_line_per_cause_with_a_count() -> None:
    clock = Clock()
    f = RateLimitFilter(10.0, clock=clock)

    def rec(msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, args, None)

    assert f.filter(rec("socket.accept() out of system resource"))
    assert not any(f.filter(rec("socket.accept() out of system resource")) for _ in range(500))
    assert f.filter(rec("refusing: %d open", 5))  # another cause
    assert not f.filter(rec("refusing: %d open", 6))  # numbers masked: the same cause
    clock.t += 10.0
    r = rec("socket.accept() out of system resource")
    assert f.filter(r) and "500 more like this" in r.getMessage()
    debug = logging.LogRecord("x", logging.DEBUG, __file__, 1, "d", (), None)
    assert all(f.filter(debug) for _ in range(5))  # below INFO: never limited


def test_rate_limited_log(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RateLimitedLog(logging.getLogger("infscaler.test.ratelog"), 5.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="infscaler.test.ratelog"):
        sent = [log.warning("refusing %s", i, key="conn") for i in range(100)]
        clock.t += 5.0
        log.warning("refusing %s", "again", key="conn")
    assert sent.count(True) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["refusing 0", "refusing again [99 more in the last interval not logged]"]


# -- BYTES tensors: decoded size bounded by the data ----------------------------------------


def test_bytes_tensors_decode_to_at_most_twice_their_data() -> None:
    import struct

    from infscaler.api.codec import ProtocolError
    from infscaler.api.codec_tensors import BYTES_DECODE_SLACK, parse_bytes

    n = 200_000  # 2-byte elements: 6 bytes each in the body, ~43 decoded
    data = b"".join(struct.pack("<I", 2) + b"ab" for _ in range(n))
    with pytest.raises(ProtocolError) as ei:
        parse_bytes(data, n, "input 't'", exact=True)
    assert ei.value.status == 413 and "UINT8" in (ei.value.hint or "")
    # the same count of empty or one-byte elements (shared singletons) decodes fine
    ones = b"".join(struct.pack("<I", 1) + b"a" for _ in range(n))
    arr, used = parse_bytes(ones, n, "input 't'", exact=True)
    assert used == len(ones) and arr[-1] == b"a"
    # a few short strings are within the slack
    few = b"".join(struct.pack("<I", 5) + b"hello" for _ in range(1000))
    assert BYTES_DECODE_SLACK > 1000 * 46 and parse_bytes(few, 1000, "t", exact=True)[1] == 9000
