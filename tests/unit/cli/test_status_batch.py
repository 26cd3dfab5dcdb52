"""The batch column of ``infscaler status`` (infscaler.cli.client._batch / unit_row)."""

from __future__ import annotations

from infscaler.cli.client import batch_text, unit_row


def test_the_batch_column_shows_the_mean_and_the_size_run_now() -> None:
    assert batch_text({}) == "-"
    assert batch_text({"executions": 0, "items": 0, "mean_batch": None, "batch": 4}) == "-"
    assert batch_text({"executions": 5, "items": 9, "mean_batch": 1.8, "batch": 4}) == "1.80 (<=4)"
    assert batch_text({"executions": 3, "items": 6, "mean_batch": 2.0, "batch": 1}) == "2.00"


def test_a_status_row_ends_with_the_batch_column() -> None:
    unit = {
        "unit": "m",
        "partition": "1/1",
        "bottleneck": 1.0,
        "engine": "cpu",
        "instances": [],
        "queue": 0,
        "compute_p50_ms": 2.0,
        "compute_p99_ms": 3.0,
        "exec": {"executions": 2, "items": 8, "mean_batch": 4.0, "batch": 8},
    }
    assert unit_row(unit)[-1] == "4.00 (<=8)"
    assert unit_row({**unit, "exec": None})[-1] == "-"  # a status from an older service
