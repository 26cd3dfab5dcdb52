"""Executions, items and per batch size counts as Triton's ModelStatistics counts them
(infscaler.runtime.serving.batching.ExecCounts / ExecTotals / counting_unit)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infscaler.runtime.serving.batching import ExecCounts, ExecTotals, counting_unit


def test_a_batch_counts_one_execution_and_its_items() -> None:
    c = ExecCounts()
    c.add(4, 10, 200, 30)  # one run of 4 stacked items
    c.add(1, 0, 90, 5)
    c.add(4, 20, 180, 40)
    assert c.executions == 3 and c.items == 9
    assert c.mean_batch == pytest.approx(3.0)
    assert c.batch_stats() == [
        {
            "batch_size": 1,
            "compute_input": {"count": 1, "ns": 0},
            "compute_infer": {"count": 1, "ns": 90},
            "compute_output": {"count": 1, "ns": 5},
        },
        {
            "batch_size": 4,
            "compute_input": {"count": 2, "ns": 30},
            "compute_infer": {"count": 2, "ns": 380},
            "compute_output": {"count": 2, "ns": 70},
        },
    ]
    back = ExecCounts.from_json(c.to_json())
    assert back == c
    assert ExecCounts().mean_batch is None and ExecCounts().batch_stats() == []


def test_bad_executions_and_reports_are_refused() -> None:
    with pytest.raises(ValueError, match="size >= 1"):
        ExecCounts().add(0, 0, 1, 0)
    with pytest.raises(ValueError, match="times >= 0"):
        ExecCounts().add(1, 0, -1, 0)
    with pytest.raises(ValueError, match="by_size"):
        ExecCounts.from_json({"by_size": {"2": [1, 2, 3]}})
    with pytest.raises(ValueError, match="by_size"):
        ExecCounts.from_json({"by_size": {"0": [1, 0, 0, 0]}})


def test_totals_add_reports_and_keep_what_exited_instances_ran() -> None:
    t = ExecTotals()
    a = ExecCounts()
    a.add(2, 1, 10, 1)
    t.observe("u", 1, a.to_json())
    t.observe("u", 1, a.to_json())  # the same report again adds nothing
    assert t.get("u").executions == 1 and t.get("u").items == 2
    a.add(1, 0, 5, 1)
    t.observe("u", 1, a.to_json())
    b = ExecCounts()
    b.add(3, 0, 7, 0)
    t.observe("u", 2, b.to_json())
    t.forget_instance(1)  # instance 1 exits: what it ran stays
    t.observe("u", 1, a.to_json())  # its last report read late: not counted twice
    got = t.get("u")
    assert (got.executions, got.items) == (3, 6)
    assert {s["batch_size"]: s["compute_infer"]["count"] for s in got.batch_stats()} == {
        1: 1,
        2: 1,
        3: 1,
    }
    assert t.get("other") == ExecCounts()


def test_totals_drop_old_exited_instances_but_keep_their_counts() -> None:
    t = ExecTotals()
    for iid in range(ExecTotals.KEEP_GONE + 5):
        c = ExecCounts()
        c.add(1, 0, 1, 0)
        t.observe("u", iid, c.to_json())
        t.forget_instance(iid)
    assert len(t._last) <= ExecTotals.KEEP_GONE
    assert t.get("u").executions == ExecTotals.KEEP_GONE + 5


def _unit(index: int, kind: str, max_batch: int = 1, fan_in: bool = False) -> SimpleNamespace:
    return SimpleNamespace(index=index, kind=kind, max_batch=max_batch, fan_in=fan_in)


def test_the_counting_unit_is_the_batching_one_else_the_first_model() -> None:
    pre, model, batched = _unit(0, "function"), _unit(1, "model"), _unit(2, "model", 4)
    assert counting_unit([pre, model, batched]) is batched
    assert counting_unit([pre, model]) is model
    assert counting_unit([pre, _unit(1, "function", fan_in=True)]) is pre
    assert counting_unit([]) is None
