"""The load generator's pure parts (infscaler.api.loadgen), against hand-computed cases:
ranges and shapes as perf_analyzer writes them, nearest-rank percentiles, goodput, the
stability rule, the statistics deltas and the inputs built from metadata."""

from __future__ import annotations

import numpy as np
import pytest

from infscaler.api.loadgen import (
    MAX_REASONS,
    LoadSpec,
    Window,
    arrival_times,
    count_key,
    input_tensors,
    is_stable,
    parse_range,
    parse_shapes,
    percentile,
    server_delta,
    summarize,
)
from infscaler.base.errors import InfScalerError


def test_parse_range_is_perf_analyzers_inclusive_start_end_step() -> None:
    assert parse_range("1:8:2", integer=True) == [1, 3, 5, 7]
    assert parse_range("1:7:2", integer=True) == [1, 3, 5, 7]
    assert parse_range("4", integer=True) == [4]
    assert parse_range("1:3", integer=True) == [1, 2, 3]
    assert parse_range("5:20:5", integer=False) == [5, 10, 15, 20]
    assert parse_range("0.5:1.5:0.5", integer=False) == [0.5, 1.0, 1.5]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("8:1", "below start"),
        ("0:4", "positive"),
        ("1:4:0", "positive"),
        ("1.5", "whole number"),
        ("a:b", "cannot read"),
        ("1:2:3:4", "cannot read"),
        ("1:5000", "at most 1000"),
    ],
)
def test_parse_range_refuses_with_the_form(text: str, needle: str) -> None:
    with pytest.raises(InfScalerError, match=needle) as e:
        parse_range(text, integer=True)
    assert "START[:END[:STEP]]" in (e.value.hint or "")


def test_parse_shapes() -> None:
    assert parse_shapes(["x:1x3x224x224", "mask:2,5"]) == {"x": [1, 3, 224, 224], "mask": [2, 5]}
    assert parse_shapes(["ns:in:4"]) == {"ns:in": [4]}  # the last ':' splits
    for bad in ("x", "x:", ":4", "x:1xa", "x:-1"):
        with pytest.raises(InfScalerError):
            parse_shapes([bad])


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([40, 10, 30, 20], 50) == 20  # ceil(0.5 * 4) = 2nd
    assert percentile([40, 10, 30, 20], 90) == 40  # ceil(3.6) = 4th
    v = list(range(1, 101))  # 1..100
    assert (percentile(v, 50), percentile(v, 95), percentile(v, 99)) == (50, 95, 99)
    assert percentile([7.0], 99) == 7.0


def _w(n: int, ms: float, s: float = 1.0) -> Window:
    return Window(s, [ms] * n)


def test_stability_needs_three_windows_within_the_percentage() -> None:
    assert not is_stable([_w(100, 10), _w(100, 10)], 10)
    assert is_stable([_w(100, 10), _w(105, 10.5), _w(95, 9.5)], 10)  # mean 100, 10
    # throughput 100, 100, 125: mean 108.3, 125 is 15.4 % off
    assert not is_stable([_w(100, 10), _w(100, 10), _w(125, 10)], 10)
    assert is_stable([_w(100, 10), _w(100, 10), _w(125, 10)], 20)
    # latency 10, 10, 13: mean 11, 13 is 18 % off
    assert not is_stable([_w(100, 10), _w(100, 10), _w(100, 13)], 10)
    # only the last three count
    assert is_stable([_w(1, 500), _w(100, 10), _w(100, 10), _w(100, 10)], 10)
    assert is_stable([Window(1.0), Window(1.0), Window(1.0)], 10)  # nothing answered
    assert not is_stable([Window(1.0), _w(1, 10), Window(1.0)], 10)


def test_summary_goodput_and_rates() -> None:
    a = Window(2.0, [5.0, 15.0, 25.0, 35.0], {"queue_full": 2}, {"client_timeout": 1})
    b = Window(2.0, [45.0, 55.0, 65.0, 75.0, 85.0, 95.0], {"queue_full": 2})
    s = summarize([_w(50, 1.0), a, b, _w(0, 0.0, 1.0)], slo_ms=50.0)
    # the last three: a, b and an empty 1 s window: 10 answers in 5 s
    assert s["measured_s"] == 5.0 and s["throughput"] == 2.0
    assert s["goodput"] == 5 / 5.0  # 5, 15, 25, 35, 45 within 50 ms
    assert s["latency_ms"]["p50"] == 45.0 and s["latency_ms"]["p90"] == 85.0
    assert s["latency_ms"]["mean"] == 50.0
    assert s["refused_per_s"] == 4 / 5.0 and s["refused_by_code"] == {"queue_full": 4}
    assert s["errors_per_s"] == 1 / 5.0 and s["errors_by_code"] == {"client_timeout": 1}
    assert summarize([a], None)["goodput"] is None


def _stats(success: int, fail: int, queue_ms: float, compute_ms: float) -> dict:
    return {
        "model_stats": [
            {
                "inference_stats": {
                    "success": {"count": success, "ns": 0},
                    "fail": {"count": fail, "ns": 0},
                    "queue": {"count": 2 * success, "ns": int(queue_ms * 1e6)},
                    "compute_infer": {"count": 2 * success, "ns": int(compute_ms * 1e6)},
                }
            }
        ]
    }


def test_server_delta_is_per_request_ms_over_the_window() -> None:
    d = server_delta(_stats(100, 1, 50.0, 300.0), _stats(140, 3, 130.0, 500.0))
    assert d == {"success": 40, "fail": 2, "queue_ms": 2.0, "compute_ms": 5.0}
    assert server_delta(None, _stats(1, 0, 0, 0)) is None
    assert server_delta({"model_stats": []}, _stats(1, 0, 0, 0)) is None
    idle = server_delta(_stats(5, 0, 1.0, 1.0), _stats(5, 0, 1.0, 1.0))
    assert idle == {"success": 0, "fail": 0, "queue_ms": 0.0, "compute_ms": 0.0}
    # merged over windows, weighted by the requests
    w1, w2 = Window(1.0, [1.0]), Window(1.0, [1.0])
    w1.server = {"success": 10, "fail": 0, "queue_ms": 1.0, "compute_ms": 4.0}
    w2.server = {"success": 30, "fail": 0, "queue_ms": 3.0, "compute_ms": 4.0}
    assert summarize([w1, w2])["server"]["queue_ms"] == 2.5


def test_reasons_are_bounded() -> None:
    d: dict[str, int] = {}
    for i in range(MAX_REASONS + 5):
        count_key(d, f"reason {i}")
    assert len(d) == MAX_REASONS + 1 and d["(other)"] == 5


META = {
    "name": "m",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3, 4]},
        {"name": "ids", "datatype": "INT64", "shape": [2]},
        {"name": "s", "datatype": "BYTES", "shape": [1]},
    ],
}


def test_inputs_from_metadata() -> None:
    t = input_tensors(META, seed=1)
    assert t["x"].dtype == np.float32 and t["x"].shape == (1, 3, 4)
    assert ((t["x"] >= 0) & (t["x"] < 1)).all()
    assert t["ids"].dtype == np.int64 and t["ids"].shape == (2,)
    assert t["s"].tolist() == [b"infscaler"]
    assert input_tensors(META, {"x": [8, 3, 4]})["x"].shape == (8, 3, 4)
    given = np.ones((2, 3, 4), np.float32)
    assert input_tensors(META, given={"x": given})["x"] is given


def test_inputs_refuse_what_does_not_fit() -> None:
    with pytest.raises(InfScalerError, match="no input 'y'"):
        input_tensors(META, {"y": [1]})
    with pytest.raises(InfScalerError, match="rank 2"):
        input_tensors(META, {"x": [1, 3]})
    with pytest.raises(InfScalerError, match="was given float64"):
        input_tensors(META, given={"x": np.ones((1, 3, 4))})


def test_arrival_times() -> None:
    assert arrival_times("constant", 4.0, 1.0).tolist() == [0.0, 0.25, 0.5, 0.75]
    p = arrival_times("poisson", 100.0, 10.0, seed=3)
    assert 800 < p.size < 1200 and (np.diff(p) >= 0).all()
    with pytest.raises(InfScalerError, match="unknown arrivals"):
        arrival_times("zipf", 1.0, 1.0)
    with pytest.raises(InfScalerError):
        LoadSpec("bursts", 1.0)


def test_answers_are_counted_by_their_code_never_by_their_message() -> None:
    from infscaler.api.loadgen import answer_code

    body = b'{"error": "over the SLO: 812 ms expected > 100 ms", "code": "slo"}'
    assert answer_code(503, body) == "slo"
    other = b'{"error": "over the SLO: 97 ms expected > 90 ms", "code": "slo"}'
    assert answer_code(503, other) == answer_code(503, body)
    # no code (another server), or not a code: the status
    assert answer_code(503, b'{"error": "queue full: retry"}') == "http_503"
    assert answer_code(500, b"<html>") == "http_500"
    assert answer_code(503, b'{"error": "x", "code": "Not A Code 1"}') == "http_503"
    assert answer_code(429, b'{"error": "x", "code": "' + b"a" * 40 + b'"}') == "http_429"
    assert answer_code(503, b'{"error": "x", "code": 7}') == "http_503"


def test_outcomes_fall_into_the_window_by_kind_and_code() -> None:
    from infscaler.api.loadgen import Outcome, window_of

    w = window_of(
        [
            Outcome("ok", 4.0),
            Outcome("refused", 1.0, "slo"),
            Outcome("refused", 1.0, "slo"),
            Outcome("error", 9.0, "http_500"),
            Outcome("ok", 6.0),
        ],
        2.0,
    )
    assert w.latencies_ms == [4.0, 6.0] and w.throughput == 1.0 and w.mean_ms == 5.0
    assert w.refused == {"slo": 2} and w.errors == {"http_500": 1}


def test_a_count_window_ends_after_its_answers() -> None:
    import asyncio
    import time

    from infscaler.api.loadgen import LoadRun, Outcome

    async def main() -> tuple[int, float]:
        run = LoadRun()

        async def answers() -> None:
            for _ in range(50):
                await asyncio.sleep(0.002)
                run.add(Outcome("ok", 2.0))

        load = asyncio.ensure_future(answers())
        t0 = time.perf_counter()
        await run.window_end(load, 0, t0 + 30.0, 10)  # 10 answers, not 30 s
        got, took = len(run.outcomes), time.perf_counter() - t0
        await load
        return got, took

    got, took = asyncio.run(main())
    assert 10 <= got < 50 and took < 5.0


def test_perf_shared_memory_is_group_readable_and_named_unguessably(tmp_path) -> None:
    """``perf --shared-memory system``: the object is 0660 and of the socket's group (a
    service running as its own user in that group can open it), and its key and region
    name are random, so another member of the group cannot take them first."""
    import os
    import stat
    from types import SimpleNamespace

    from infscaler.api import loadgen

    sock = tmp_path / "api.sock"
    sock.write_bytes(b"")
    registered: list[tuple] = []
    client = SimpleNamespace(
        socket_path=str(sock), register_system_shm=lambda *a: registered.append(a)
    )
    made = []
    try:
        for _ in range(2):
            (name, region), tensors = loadgen._shm_inputs(
                client, {"x": np.arange(4, dtype=np.float32)}
            )
            made.append(region)
            st = os.stat("/dev/shm" + region.key)
            assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.stat(sock).st_gid
            assert tensors["x"].byte_size == 16
        assert registered[0][0] != registered[1][0] and made[0].key != made[1].key
        assert len(registered[0][0]) > len(f"perf-{os.getpid()}-") + 8
    finally:
        for r in made:
            r.close()
