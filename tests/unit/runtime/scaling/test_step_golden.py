"""Golden comparison: :meth:`Autoscaler.step` acts as the loop did before it was drawn
as named steps (``step_golden.json``, recorded from that code by :mod:`.step_golden`):
the same service calls, kept decisions, states, arbitration views and wake evidence,
look by look."""

from __future__ import annotations

import functools
import json

import pytest

from tests.unit.runtime.scaling.step_golden import OUT, record

GOLDEN = json.loads(OUT.read_text())
_got = functools.cache(record)


@pytest.mark.parametrize("i", range(len(GOLDEN)))
def test_each_scenario_acts_as_recorded(i: int) -> None:
    got_all = _got()
    assert len(got_all) == len(GOLDEN)
    want, got = GOLDEN[i], got_all[i]
    assert got["params"] == want["params"]
    assert len(got["looks"]) == len(want["looks"]) > 0
    for k, (g, w) in enumerate(zip(got["looks"], want["looks"], strict=True)):
        assert g == w, f"scenario {i} {want['params']}, look {k}"
