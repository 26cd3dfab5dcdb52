"""The v2 gRPC socket (infscaler.api.grpc) with Triton's own client, tritonclient.grpc,
against a real Service: outputs bit-exact with the HTTP client's for the same inputs (a
function pipeline and an ONNX model), metadata, refusals with their gRPC codes, an
oversized message refused cleanly, and a non-root member of the socket's group held to
what HTTP allows it (a subprocess as uid 65534)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

tg = pytest.importorskip("tritonclient.grpc")

from infscaler.api.client import Client  # noqa: E402
from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.base.config import load_pipeline  # noqa: E402
from infscaler.base.security import SecurityPolicy  # noqa: E402
from infscaler.service.service import Service  # noqa: E402
from tests import TESTS_DIR  # noqa: E402
from tests.helpers import residual_model, save  # noqa: E402

GROUP = 4242
CHAIN = {
    "name": "chain",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": ["z"],
    "stages": [
        {"name": "scale", "function": "stagefuncs:scale", "inputs": ["x"], "outputs": ["y"]},
        {"name": "add", "function": "stagefuncs:add_one", "inputs": ["y"], "outputs": ["z"]},
    ],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """chain + an ONNX model (tests.helpers.residual_model) on an HTTP and a gRPC socket,
    body limit 1 MB; the sockets in a directory others may traverse, group GROUP."""
    tmp = tmp_path_factory.mktemp("grpc")
    public = Path(tempfile.mkdtemp(prefix="isc-grpc-t-"))
    public.chmod(0o711)
    model = save(residual_model(), tmp / "res.onnx")
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{TESTS_DIR}{os.pathsep}{old}" if old else str(TESTS_DIR)
    sys.path.insert(0, str(TESTS_DIR))
    group = GROUP if os.geteuid() == 0 else None
    try:
        with Service(state_dir=tmp / "state", control_path="userspace", pool_mb=64) as svc:
            svc.deploy(load_pipeline(CHAIN))
            svc.deploy(
                load_pipeline({"name": "res", "stages": [{"name": "m", "model": str(model)}]})
            )
            policy = SecurityPolicy.create(allow_functions=["stagefuncs"])
            http, grpc_sock = str(public / "api.sock"), str(public / "api-grpc.sock")
            with ServerThread(
                svc, http, max_body_mb=1, security=policy, socket_group=group, grpc_socket=grpc_sock
            ):
                yield {"http": http, "grpc": grpc_sock, "svc": svc}
    finally:
        os.environ["PYTHONPATH"] = old
        sys.path.remove(str(TESTS_DIR))


@pytest.fixture
def gc(served):
    c = tg.InferenceServerClient(url="unix:" + served["grpc"])
    yield c
    c.close()


def _infer(c, name: str, arr: np.ndarray, input_name: str = "x"):
    i = tg.InferInput(input_name, list(arr.shape), "FP32")
    i.set_data_from_numpy(arr)
    return c.infer(name, [i])


def test_socket_mode_health_and_metadata(served, gc) -> None:
    st = os.stat(served["grpc"])
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert gc.is_server_live() and gc.is_server_ready() and gc.is_model_ready("chain")
    meta = gc.get_server_metadata()
    assert meta.name == "infscaler" and "system_shared_memory" in meta.extensions
    m = gc.get_model_metadata("chain", as_json=True)
    assert m["name"] == "chain" and m["platform"] == "infscaler_pipeline"
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    cfg = gc.get_model_config("chain", as_json=True)["config"]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32" and cfg["input"][0]["dims"] == ["-1", "4"]
    with Client(served["http"]) as h:
        assert h.status()["grpc_socket"] == served["grpc"]


@pytest.mark.parametrize(
    ("name", "arr"),
    [
        ("chain", np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)),
        ("res", np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)),
    ],
)
def test_outputs_bit_exact_with_http(served, gc, name: str, arr: np.ndarray) -> None:
    with Client(served["http"]) as h:
        want = h.infer(name, {"x": arr}).outputs
    r = _infer(gc, name, arr)
    for out, expected in want.items():
        got = r.as_numpy(out)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()
    assert r.get_response().parameters["latency_ms"].double_param > 0
    stats = gc.get_inference_statistics(name, as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 2


def test_refusals_carry_their_codes(served, gc) -> None:
    from tritonclient.utils import InferenceServerException

    arr = np.zeros((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        _infer(gc, "nope", arr)
    assert e.value.status() == "StatusCode.NOT_FOUND" and "deployed: chain" in e.value.message()
    with pytest.raises(InferenceServerException) as e:  # the model's shape is [-1, 4]
        _infer(gc, "chain", np.zeros((1, 5), np.float32))
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "does not match the model's [-1, 4]" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gc.unregister_cuda_shared_memory()
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"


def test_an_oversized_message_is_refused_and_the_socket_serves_on(served, gc) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:  # 1.1 MB over the 1 MB limit
        _infer(gc, "chain", np.zeros((70_000, 4), np.float32))
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in e.value.message()
    r = _infer(gc, "chain", np.ones((1, 4), np.float32))
    assert r.as_numpy("z").tolist() == [[3.0, 3.0, 3.0, 3.0]]


_AS_NOBODY = r"""
import json, os, sys
import numpy as np
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException
os.setgroups([int(sys.argv[3])])  # imported as root (the venv is root's), now nobody
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
c = tg.InferenceServerClient(url="unix:" + sys.argv[1])
out = {}
def code(fn):
    try:
        fn()
        return "OK"
    except InferenceServerException as e:
        return e.status() + " " + e.message()
i = tg.InferInput("x", [1, 4], "FP32"); i.set_data_from_numpy(np.ones((1, 4), np.float32))
out["infer"] = c.infer("chain", [i]).as_numpy("z").tolist()
out["index"] = code(lambda: c.get_model_repository_index())
out["load"] = code(lambda: c.load_model("chain"))
out["register"] = code(lambda: c.register_system_shared_memory("stolen", sys.argv[2], 64))
out["status"] = code(lambda: c.get_system_shared_memory_status())
print(json.dumps(out))
"""


def test_a_group_member_gets_what_http_gives_it(served) -> None:
    """uid 65534 in the socket's group: may infer; the repository and another user's
    shm object (root's, mode 0600) are PERMISSION_DENIED, as 403 over HTTP."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the client runs as uid 65534 in the socket's group")
    key = f"isc_grpc_{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _AS_NOBODY, served["grpc"], "/" + key, str(GROUP)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.unlink(f"/dev/shm/{key}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["infer"] == [[3.0, 3.0, 3.0, 3.0]]
    assert out["index"].startswith("StatusCode.PERMISSION_DENIED")
    assert "reserved to the service's own user" in out["index"]
    assert out["load"].startswith("StatusCode.PERMISSION_DENIED")
    assert out["register"].startswith("StatusCode.PERMISSION_DENIED")
    assert "may not read and write" in out["register"]
    assert out["status"] == "OK"
