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

from tests.unit.runtime.golden.record import ALL

GOLDEN = json.loads(Path(__file__).with_name("models_golden.json").read_text())


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
        _same(g, w, f"{policy}[{i}]")
