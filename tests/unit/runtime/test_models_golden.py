"""Golden comparison: the policies that use the capacity and latency model (the scaler
and the Tuner, arbitration, admission, the live check, the planner's resources, the
selector) decide as the code before the model was made one
(``models_golden.json``, written by ``gen_models_golden.py`` from that code): the same
decisions, and figures within 1e-9 relative."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.unit.runtime import golden_cases as cases
from tests.unit.runtime.golden_record import ALL

GOLDEN = json.loads(Path(__file__).with_name("models_golden.json").read_text())


def _corrected(policy: str, i: int, want: dict) -> dict:
    """The one place the copies disagreed in a way that changed a decision, and the
    answer the model now gives. The live check's capacity skipped a unit with no
    instance (as if it did not bound the pipeline) where the scaler's counted it as 0;
    the live check compares the scaler's measured capacity (0 rule) with its own
    prediction (skip rule), so a planned or live unit at 0 instances predicted 83/s
    against a measured 10-60/s and switched to the runner-up. By the pipeline model
    (InferLine §4: a pipeline's throughput is its slowest stage's; a stage with no
    replica finishes nothing) the bound is 0: predicted 0, nothing falls short, keep."""
    if policy != "livecheck":
        return want
    ms, planned, _items, measured, _offered, live = cases.livecheck_params()[i]
    if 0 not in planned:
        return want
    out = dict(want, capacity_rps=0.0)
    if live is None:  # capacity_at falls back to the planned instances
        out["capacity_at"] = 0.0
    if measured is not None:
        out.update(verdict="keep", phase="settled")
    return out


def _same(got: object, want: object, where: str) -> None:
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and isinstance(want, (int, float)), where
        if math.isinf(want) or math.isinf(got):
            assert got == want, where
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("policy", sorted(ALL))
def test_decisions_match_the_recorded_ones(policy: str) -> None:
    got = json.loads(json.dumps(ALL[policy]()))  # tuples as lists, as recorded
    want = GOLDEN[policy]
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, _corrected(policy, i, w), f"{policy}[{i}]")
