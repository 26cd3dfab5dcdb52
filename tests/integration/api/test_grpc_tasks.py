"""Model-less task queries over the gRPC socket with Triton's own client: a name that
is a registered task (MiniLM-L3 registered as ``text-embedding``, profiled on this host)
is routed by the same selector as over HTTP: the same variant, the same outputs bit for
bit, the variant named in the response parameters, and the HTTP refusals with their
gRPC codes (unknown task NOT_FOUND, a bad requirement INVALID_ARGUMENT)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from tritonclient.utils import InferenceServerException  # noqa: E402

from infscaler.api.client import Client  # noqa: E402
from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.modelless.register import register  # noqa: E402
from infscaler.modelless.tasks import TaskRouter  # noqa: E402
from infscaler.modelless.variants import VariantRegistry  # noqa: E402
from infscaler.service.service import Service  # noqa: E402

pytestmark = pytest.mark.slow

L3 = "minilm-l3.cpu.fp32.b1"
TEXTS = ["A cat sleeps on the sofa.", "The kitten naps."]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("grpc-tasks")
    state = tmp / "state"
    reg = VariantRegistry(state)
    register("minilm-l3", accuracy=0.83, registry=reg, batch_sizes=(1,), repeats=2, warmup=1)
    mp = pytest.MonkeyPatch()
    mp.setattr(TaskRouter, "autoscale_default", False)  # deterministic: one instance
    sock, grpc_sock = tmp / "api.sock", tmp / "api-grpc.sock"
    try:
        with (
            Service(state_dir=state, control_path="userspace", pool_mb=128) as svc,
            ServerThread(svc, sock, grpc_socket=grpc_sock),
        ):
            yield SimpleNamespace(svc=svc, http=str(sock), grpc=str(grpc_sock))
    finally:
        mp.undo()


@pytest.fixture
def gc(served):
    c = tg.InferenceServerClient(url="unix:" + served.grpc)
    yield c
    c.close()


def _text_input() -> object:
    t = tg.InferInput("text", [len(TEXTS)], "BYTES")
    t.set_data_from_numpy(np.array([s.encode() for s in TEXTS], dtype=object))
    return t


def test_a_task_name_is_routed_over_grpc_as_over_http(served, gc) -> None:
    # tritonclient.grpc's parameters are int, str or bool
    r = gc.infer("text-embedding", [_text_input()], parameters={"latency_ms": 1000})
    params = r.get_response().parameters
    assert r.get_response().model_name == "text-embedding"
    assert params["variant"].string_param == L3
    assert params["meets_requirements"].bool_param is True
    assert params["selection"].string_param in ("inactive", "active")
    units = [k for k in params if k.startswith("unit_ms.")]
    assert units and all(params[k].WhichOneof("parameter_choice") == "double_param" for k in units)
    got = r.as_numpy("embedding")
    assert got.shape == (2, 384) and np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-4)
    with Client(served.http, timeout=120) as h:
        want = h.infer_task(
            "text-embedding", {"text": np.array(TEXTS, dtype=object)}, latency_ms=1000
        )
    assert want.parameters["variant"] == L3
    assert got.dtype == want.outputs["embedding"].dtype
    assert got.tobytes() == want.outputs["embedding"].tobytes()
    md = gc.get_model_metadata("text-embedding", as_json=True)
    assert md["platform"] == "infscaler_task"
    assert gc.is_model_ready("text-embedding") is True  # a query can be served
    assert [t["name"] for t in md["inputs"]] == ["text"]


@pytest.mark.parametrize(
    ("model", "parameters", "code", "text"),
    [
        ("speech-to-text", {}, "NOT_FOUND", "registered tasks: text-embedding"),
        ("text-embedding", {"latency_ms": -5}, "INVALID_ARGUMENT", "latency_ms must be > 0"),
        ("text-embedding", {"min_accuracy": "high"}, "INVALID_ARGUMENT", "min_accuracy must be"),
    ],
)
def test_task_refusals_carry_the_http_statuses_as_codes(
    served, gc, model: str, parameters: dict, code: str, text: str
) -> None:
    with pytest.raises(InferenceServerException) as e:
        gc.infer(model, [_text_input()], parameters=parameters)
    assert e.value.status() == f"StatusCode.{code}" and text in e.value.message()
