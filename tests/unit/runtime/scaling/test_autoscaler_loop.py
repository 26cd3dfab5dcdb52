"""The autoscaler loop survives a pipeline undeployed between its look and its action:
the decision is dropped with one info line, not an error with a traceback."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from infscaler.base.errors import ServiceError
from infscaler.runtime.scaling.autoscaler import Autoscaler


def _dep(name: str) -> SimpleNamespace:
    cfg = SimpleNamespace(autoscale=SimpleNamespace(interval_s=0.01))
    return SimpleNamespace(
        name=name,
        pipeline=SimpleNamespace(config=cfg, units=[]),
        route=SimpleNamespace(accepting=True),
    )


@pytest.mark.parametrize(("status", "level"), [(404, logging.INFO), (503, logging.ERROR)])
def test_a_pipeline_gone_mid_step_is_dropped_quietly(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, status: int, level: int
) -> None:
    service = SimpleNamespace(deployments=lambda: [_dep("gone")])
    auto = Autoscaler(service, tick_s=0.01)
    calls = []

    def step(dep):
        calls.append(dep.name)
        raise ServiceError(f"pipeline {dep.name!r} is no longer deployed", status)

    monkeypatch.setattr(auto, "step", step)
    monkeypatch.setattr(auto, "_learn", lambda dep: None)
    monkeypatch.setattr(auto, "wake", lambda: None)
    with caplog.at_level(logging.INFO, logger="infscaler.autoscaler"):
        auto.start()
        deadline = time.monotonic() + 10
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        auto.close()
    assert len(calls) >= 3  # the loop went on
    quiet = [r for r in caplog.records if "no longer deployed" in r.getMessage()]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    if level == logging.INFO:
        assert quiet and all(r.levelno == logging.INFO for r in quiet) and not errors
    else:  # any other refusal is still an error, with its traceback
        assert errors and all(r.exc_info for r in errors) and not quiet
