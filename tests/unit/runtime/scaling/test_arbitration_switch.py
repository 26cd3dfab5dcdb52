"""``INFSCALER_ARBITRATION=off`` turns the autoscaler's arbitration between pipelines off:
the same views that make a move with it on make none with it off."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from infscaler.runtime.scaling.autoscaler import Autoscaler
from tests.unit.runtime.scaling.test_arbitration import hot, idle


class _Service:
    """Two auto-scaled deployments; scale_in / scale_out only recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.done = threading.Event()
        cfg = SimpleNamespace(autoscale=object())
        self._deps = [
            SimpleNamespace(
                name=n, pipeline=SimpleNamespace(config=cfg), route=SimpleNamespace(accepting=True)
            )
            for n in ("hi", "lo")
        ]

    def deployments(self) -> list:
        return self._deps

    def scale_in(self, dep, unit, engine) -> bool:
        self.calls.append(("scale_in", dep.name))
        return True

    def scale_out(self, dep, unit, engine) -> None:
        self.calls.append(("scale_out", dep.name))
        self.done.set()


def _autoscaler(monkeypatch: pytest.MonkeyPatch, value: str | None) -> tuple[Autoscaler, _Service]:
    if value is None:
        monkeypatch.delenv("INFSCALER_ARBITRATION", raising=False)
    else:
        monkeypatch.setenv("INFSCALER_ARBITRATION", value)
    svc = _Service()
    a = Autoscaler(svc)  # the loop thread is not started
    a._views = {"hi": hot(), "lo": idle()}
    return a, svc


def test_on_by_default_moves_an_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    a, svc = _autoscaler(monkeypatch, None)
    assert a.arbitration_on
    moves = a.arbitrate()
    assert [(m.giver, m.taker) for m in moves] == [("lo", "hi")]
    assert svc.done.wait(5)
    assert svc.calls == [("scale_in", "lo"), ("scale_out", "hi")]


@pytest.mark.parametrize("value", ["off", "OFF"])
def test_off_makes_no_move(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    a, svc = _autoscaler(monkeypatch, value)
    assert not a.arbitration_on
    assert a.arbitrate() == []
    assert a.arbitration_state().loans == ()
    assert svc.calls == []


def test_the_parties_to_a_loan_are_observed_on_loan(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lend, both the taker and the donor are observed ``on_loan`` (the threads
    move holds for them: :func:`~infscaler.runtime.scaling.threads.step`); a pipeline
    outside every loan is not."""
    from infscaler.base.config import AutoscaleConfig

    a, svc = _autoscaler(monkeypatch, None)
    auto = AutoscaleConfig()
    for d in svc._deps:
        d.pipeline = SimpleNamespace(config=SimpleNamespace(autoscale=auto), units=())
    third = SimpleNamespace(name="other", pipeline=svc._deps[0].pipeline)
    fake = SimpleNamespace(
        pipeline=lambda dep, window: None, snapshot=lambda dep, p: hot().snapshot
    )
    monkeypatch.setattr(a, "_monitor", lambda dep: fake)
    assert not a._observe(svc._deps[0]).on_loan
    assert a.arbitrate() and svc.done.wait(5)
    assert [(ln.donor, ln.taker) for ln in a.arbitration_state().loans] == [("lo", "hi")]
    assert a._observe(svc._deps[0]).on_loan and a._observe(svc._deps[1]).on_loan
    assert not a._observe(third).on_loan
