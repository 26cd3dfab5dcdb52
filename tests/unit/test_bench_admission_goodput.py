"""bench/admission_goodput.py's comparison on hand-made rows (no service): goodput on
against off per point with the tolerance, and the 16 keep-alive connections' P99 bound."""

from __future__ import annotations

from tests.helpers import bench_module


def row(kind: str, factor: float, goodput: float, p99: float | None = 100.0) -> dict:
    return {
        "kind": kind,
        "factor": factor,
        "load": 1,
        "goodput_rps": goodput,
        "admitted_p99_ms": p99,
    }


def test_each_point_compares_on_with_off_within_the_tolerance() -> None:
    ag = bench_module("admission_goodput")
    data = {
        "modes": [
            {"mode": "off", "http": [row("closed", 1, 10.0), row("open", 5, 2.0)], "grpc": None},
            {
                "mode": "on",
                "http": [row("closed", 1, 8.9), row("open", 5, 9.0)],
                "grpc": None,
                "keepalive16": row("keepalive16", 2, 5.0, 190.0),
            },
        ]
    }
    got = ag.compare(data, 0.9, 100.0)
    assert got["checks"] == {
        "goodput_on_ge_off_http_closed_1x": False,  # 8.9 < 0.9 x 10
        "goodput_on_ge_off_http_open_5x": True,
        "keepalive16_2x_admitted_p99_within_2x_slo": True,  # 190 <= 2 x 100
    }
    assert not got["passed"]
    assert [r["on_over_off"] for r in got["rows"]] == [0.89, 4.5]
    data["modes"][1]["http"][0]["goodput_rps"] = 9.0
    data["modes"][1]["keepalive16"]["admitted_p99_ms"] = 201.0
    got = ag.compare(data, 0.9, 100.0)
    assert got["checks"]["goodput_on_ge_off_http_closed_1x"]
    assert not got["checks"]["keepalive16_2x_admitted_p99_within_2x_slo"]


def test_no_answer_off_still_compares_and_none_on_fails_the_bound() -> None:
    ag = bench_module("admission_goodput")
    data = {
        "modes": [
            {"mode": "off", "http": [row("closed", 5, 0.0, None)], "grpc": [row("closed", 5, 1.0)]},
            {
                "mode": "on",
                "http": [row("closed", 5, 3.0)],
                "grpc": [row("closed", 5, 0.5)],
                "keepalive16": row("keepalive16", 2, 0.0, None),
            },
        ]
    }
    got = ag.compare(data, 0.9, 100.0)
    assert got["rows"][0]["on_over_off"] is None  # nothing answered in time without it
    assert got["checks"]["goodput_on_ge_off_http_closed_5x"]
    assert not got["checks"]["goodput_on_ge_off_grpc_closed_5x"]
    assert not got["checks"]["keepalive16_2x_admitted_p99_within_2x_slo"]
