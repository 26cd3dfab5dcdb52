"""A pipeline's availability (``Service._on_instances_changed``) under the supervisor's
two threads: a stale "degraded" verdict never outlives a later "ready" one."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

import infscaler.service.service as service_mod
from infscaler.service.service import Service


def _fake_service() -> SimpleNamespace:
    route = SimpleNamespace(unavailable_reason=None, retry_after_s=1.0, stage_ids=[1])
    unit = SimpleNamespace(index=0)
    dep = SimpleNamespace(
        name="chain", route=route, pipeline=SimpleNamespace(served_units=lambda: [unit])
    )
    supervisor = SimpleNamespace(restart_eta=lambda key, stage: 2.0)
    return SimpleNamespace(
        deployments=lambda: [dep],
        supervisor=supervisor,
        _availability_lock=threading.Lock(),
        route=route,
    )


def test_a_stale_degraded_verdict_is_not_written_after_a_later_ready_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The restart thread reads the replacement still starting ("degraded") and is held
    # before it writes; meanwhile the status thread reads it ready. Serialised, the
    # status thread's call runs after the restart thread's and its "ready" stays.
    svc = _fake_service()
    state = {"ready": False}
    stale_read = threading.Event()
    ready_call_done = threading.Event()

    def degraded_reasons(_supervisor, _dep):
        if not state["ready"] and not stale_read.is_set():
            stale_read.set()
            # hold the stale verdict until the other call finished (or 0.5 s: with the
            # lock the other call cannot finish before this one)
            ready_call_done.wait(0.5)
            return ["unit slow has no live instance (restarting)"]
        return [] if state["ready"] else ["unit slow has no live instance (restarting)"]

    monkeypatch.setattr(service_mod, "degraded_reasons", degraded_reasons)
    restart_thread = threading.Thread(target=Service._on_instances_changed, args=(svc,))
    restart_thread.start()
    assert stale_read.wait(5)
    state["ready"] = True  # the replacement reads ready

    def status_thread_call() -> None:
        Service._on_instances_changed(svc)  # type: ignore[arg-type]
        ready_call_done.set()

    status_thread = threading.Thread(target=status_thread_call)
    status_thread.start()
    restart_thread.join(5)
    status_thread.join(5)
    assert not restart_thread.is_alive() and not status_thread.is_alive()
    assert svc.route.unavailable_reason is None


def test_a_unit_without_a_live_instance_makes_the_pipeline_degraded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = _fake_service()
    monkeypatch.setattr(service_mod, "degraded_reasons", lambda _s, _d: ["unit slow: restarting"])
    Service._on_instances_changed(svc)  # type: ignore[arg-type]
    assert svc.route.unavailable_reason == "pipeline chain is degraded: unit slow: restarting"
    assert svc.route.retry_after_s == 2.0
    monkeypatch.setattr(service_mod, "degraded_reasons", lambda _s, _d: [])
    Service._on_instances_changed(svc)  # type: ignore[arg-type]
    assert svc.route.unavailable_reason is None
