"""`infscaler perf`'s output: perf_analyzer's CSV columns and the 80-column table."""

from __future__ import annotations

import pytest
from rich.console import Console

from infscaler.base.errors import InfScalerError
from infscaler.cli.perf import csv_rows, load_specs, perf_table


def _point(value: float, mode: str = "concurrency", **kw) -> dict:
    p = {
        "mode": mode,
        "value": value,
        "throughput": 250.0,
        "stable": True,
        "trials": 3,
        "latency_ms": {"p50": 3.5, "p90": 4.25, "p95": 5.0, "p99": 9.0, "mean": 3.75},
        "goodput": None,
        "refused_per_s": 0.0,
        "errors_per_s": 0.0,
        "server": {"success": 750, "fail": 0, "queue_ms": 0.5, "compute_ms": 2.0},
    }
    return {**p, **kw}


def test_csv_has_perf_analyzers_columns_in_usec() -> None:
    rows = csv_rows([_point(1), _point(4, stable=False, trials=10, goodput=200.0, server=None)])
    assert rows[0][:9] == [
        "Concurrency",
        "Inferences/Second",
        "Server Queue",
        "Server Compute Infer",
        "p50 latency",
        "p90 latency",
        "p95 latency",
        "p99 latency",
        "Avg latency",
    ]
    assert rows[1] == ["1", "250.00", "500", "2000", "3500", "4250", "5000", "9000", "3750",
                       "", "0.00", "0.00", "1", "3"]  # fmt: skip
    assert rows[2][2:4] == ["", ""] and rows[2][9] == "200.00" and rows[2][-2:] == ["0", "10"]
    assert all(len(r) == len(rows[0]) for r in rows)
    assert csv_rows([_point(5.0, "request_rate")])[0][0] == "Request Rate"


def test_table_fits_80_columns_with_big_numbers() -> None:
    big = _point(
        128,
        throughput=12345.6,
        stable=False,
        goodput=12345.6,
        refused_per_s=1234.5,
        errors_per_s=123.4,
        latency_ms={"p50": 999.9, "p90": 1234.5, "p95": 12345.6, "p99": 99999.0, "mean": 1.0},
        server={"queue_ms": 999.9, "compute_ms": 12345.0},
    )
    console = Console(width=80, record=True)
    console.print(perf_table([big, _point(1)], slo=True))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) == 4  # header, rule, two rows: nothing wrapped
    assert "12345.6*" in lines[2] and "99999" in lines[2]  # * marks an unstable point
    assert "…" not in "".join(lines)


def test_sweep_options() -> None:
    assert [s.value for s in load_specs(None, None, "constant", None)] == [1]
    specs = load_specs(None, "5:15:5", "poisson", None)
    assert [(s.mode, s.value, s.distribution) for s in specs] == [
        ("request_rate", 5, "poisson"),
        ("request_rate", 10, "poisson"),
        ("request_rate", 15, "poisson"),
    ]
    assert load_specs(None, "5", "constant", "azure")[0].distribution == "azure"
    with pytest.raises(InfScalerError, match="not both"):
        load_specs("1", "5", "constant", None)
    with pytest.raises(InfScalerError, match="request-rate-range"):
        load_specs(None, None, "constant", "azure")
    with pytest.raises(InfScalerError, match="constant or poisson"):
        load_specs(None, "5", "gamma", None)


def test_input_data_names_with_a_slash_come_from_subfolders(tmp_path) -> None:
    import numpy as np

    from infscaler.cli.perf import load_input_dir

    (tmp_path / "gpu_0").mkdir()
    np.save(tmp_path / "gpu_0" / "data_0.npy", np.ones((1, 3), np.float32))
    np.save(tmp_path / "x.npy", np.zeros(2, np.int64))
    got = load_input_dir(tmp_path)
    assert sorted(got) == ["gpu_0/data_0", "x"]
    assert got["gpu_0/data_0"].shape == (1, 3) and got["x"].dtype == np.int64
    (tmp_path / "empty").mkdir()
    with pytest.raises(InfScalerError, match="no .npy"):
        load_input_dir(tmp_path / "empty")


def test_a_progress_line_per_window_says_the_codes_not_the_messages() -> None:
    from infscaler.api.loadgen import LoadSpec, Window
    from infscaler.cli.perf import window_line

    w = Window(2.0, [4.0, 6.0], {"slo": 3, "queue_full": 1}, {"http_500": 2})
    w.server = {"success": 2, "fail": 0, "queue_ms": 0.5, "compute_ms": 2.0}
    line = window_line(LoadSpec("concurrency", 4), 2, w)
    assert line.startswith("concurrency 4: pass [2] 1.0 infer/s, mean 5.0 ms")
    assert "refused 2.0/s (slo 3, queue_full 1)" in line
    assert "errors 1.0/s (http_500 2)" in line
    assert "server queue 0.5 / comp 2.0 ms" in line
    quiet = window_line(LoadSpec("request_rate", 5.0, "poisson"), 1, Window(1.0))
    assert quiet == "5 req/s poisson: pass [1] 0.0 infer/s, mean -"
