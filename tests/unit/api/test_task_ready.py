"""Readiness of a model-less task (``infscaler.api.taskroute.task_ready``) on a
stand-in router and service: ready when the service takes requests and a variant can
run (deployed and ready, or its model file or plan directory on disk)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from infscaler.api.taskroute import task_ready


class _Service:
    def __init__(self, up: bool, deployed: dict[str, bool]) -> None:
        self.up, self.deployed = up, deployed

    def ready(self, name: str | None = None) -> bool:
        return self.up if name is None else self.deployed[name]

    def deployments(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=n) for n in self.deployed]


def _router(service: _Service, variants: dict[str, SimpleNamespace]) -> SimpleNamespace:
    catalog = SimpleNamespace(
        variants=lambda task: tuple(SimpleNamespace(name=n) for n in variants)
    )
    return SimpleNamespace(
        service=service, catalog=lambda: catalog, variant=lambda name: variants[name]
    )


def _variant(path: Path, plan: Path | None = None) -> SimpleNamespace:
    return SimpleNamespace(path=str(path), plan=str(plan) if plan else None)


def test_a_variant_whose_file_exists_makes_the_task_ready(tmp_path: Path) -> None:
    (tmp_path / "b.onnx").write_bytes(b"")
    variants = {"a": _variant(tmp_path / "a.onnx"), "b": _variant(tmp_path / "b.onnx")}
    assert task_ready(_router(_Service(True, {}), variants), "t") == []


def test_no_runnable_variant_names_each_missing_file(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")  # a partitioned variant runs its plan only
    variants = {
        "a": _variant(tmp_path / "a.onnx"),
        "p": _variant(tmp_path / "model.onnx", plan=tmp_path / "plan"),
    }
    (why,) = task_ready(_router(_Service(True, {}), variants), "t")
    assert why.startswith("no variant of task 't' can run: ")
    assert f"variant a: {tmp_path / 'a.onnx'} missing" in why
    assert f"variant p: {tmp_path / 'plan'} missing" in why
    (tmp_path / "plan").mkdir()
    assert task_ready(_router(_Service(True, {}), variants), "t") == []


def test_a_deployed_variant_counts_by_its_readiness_not_its_file(tmp_path: Path) -> None:
    variants = {"a": _variant(tmp_path / "gone.onnx")}
    assert task_ready(_router(_Service(True, {"a": True}), variants), "t") == []
    (why,) = task_ready(_router(_Service(True, {"a": False}), variants), "t")
    assert "variant a is deployed and not ready" in why


def test_a_service_not_taking_requests_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "a.onnx").write_bytes(b"")
    variants = {"a": _variant(tmp_path / "a.onnx")}
    assert task_ready(_router(_Service(False, {}), variants), "t") == [
        "the service is starting or stopping"
    ]
    (why,) = task_ready(_router(_Service(True, {}), {}), "t")
    assert why.endswith("can run: none registered")


def test_a_group_member_is_not_told_the_variants_file_paths(monkeypatch, tmp_path: Path) -> None:
    """``/v2/models/{task}/ready`` answers 503 with why, but the variants' file paths are
    the operator's: a client that is not privileged reads ``<path>`` instead."""
    import asyncio
    import json

    from infscaler.api import routes
    from infscaler.api.common import SERVICE, TASKS

    variants = {"a": _variant(tmp_path / "a.onnx")}
    router = _router(_Service(True, {}), variants)
    monkeypatch.setattr(routes, "task_router", lambda service, tasks, name: router)
    request = SimpleNamespace(
        app={SERVICE: router.service, TASKS: {"router": router}},
        match_info={"name": "t"},
        transport=None,  # no credentials: never privileged
    )
    resp = asyncio.run(routes.model_ready(request))
    assert resp.status == 503
    error = json.loads(resp.body)["error"]
    assert "variant a: <path> missing" in error and str(tmp_path) not in error
