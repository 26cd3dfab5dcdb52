"""The v2 gRPC socket (infscaler.api.grpc) with Triton's own client, tritonclient.grpc,
against a real Service: outputs bit-exact with the HTTP client's for the same inputs (a
function pipeline and an ONNX model), metadata, refusals with their gRPC codes, an
oversized message refused cleanly, and a non-root member of the socket's group held to
what HTTP allows it (subprocesses as uid 65534: the same refusals, the per-uid connection
limit, the per-uid in-flight byte budget), and an admission refusal as UNAVAILABLE with
its reason."""

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

from infscaler.api.client import Client, InferenceServerError  # noqa: E402
from infscaler.api.grpc.mapping import grpc_code  # noqa: E402
from infscaler.api.http import HttpLimits  # noqa: E402
from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.base.config import load_pipeline  # noqa: E402
from infscaler.base.quotas import PeerQuotas  # noqa: E402
from infscaler.base.security import SecurityPolicy  # noqa: E402
from infscaler.service.service import Service  # noqa: E402
from tests import TESTS_DIR  # noqa: E402
from tests.helpers import residual_model, save  # noqa: E402

GROUP = 4242
PER_UID = 2  # gRPC (and HTTP) connections one uid other than root may hold open
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
    body limit 1 MB, PER_UID connections per uid; the sockets in a directory others may
    traverse, group GROUP."""
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
            limits = HttpLimits(quotas=PeerQuotas(connections_per_uid=PER_UID))
            with ServerThread(
                svc,
                http,
                max_body_mb=1,
                security=policy,
                socket_group=group,
                grpc_socket=grpc_sock,
                limits=limits,
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
    assert gc.is_model_ready("chain", model_version="1")
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:  # only version 1 exists, as over HTTP
        gc.is_model_ready("chain", model_version="2")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    meta = gc.get_server_metadata()
    assert meta.name == "infscaler" and "system_shared_memory" in meta.extensions
    m = gc.get_model_metadata("chain", as_json=True)
    assert m["name"] == "chain" and m["platform"] == "infscaler_pipeline"
    assert m["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "4"]}]
    cfg = gc.get_model_config("chain", as_json=True)["config"]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32" and cfg["input"][0]["dims"] == ["-1", "4"]
    with Client(served["http"]) as h:
        assert h.status()["grpc_socket"] == served["grpc"]
        doc = h.request("GET", "/v2/models/chain/config").json()
    # a pipeline (not a Triton repository model): its own view, the same over HTTP
    assert (doc["name"], doc["platform"]) == ("chain", "infscaler_pipeline")
    assert doc["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]
    assert [o["name"] for o in doc["output"]] == [o["name"] for o in cfg["output"]]


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
    from tests.helpers import wait_for

    def counted() -> bool:  # instances report their executions when idle
        stats = gc.get_inference_statistics(name, as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)) >= 2

    wait_for(counted, 20.0, f"{name}: 2 inferences counted")


def test_infer_parameters_are_scalars_over_http_and_grpc(served, gc) -> None:
    """KServe v2 / Triton parameters are scalars: per-unit times come as one double
    ``unit_ms.<unit>`` each, the same units over both protocols, never a JSON string."""
    import httpx

    arr = np.ones((2, 4), np.float32)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [1.0] * 8}]}
    transport = httpx.HTTPTransport(uds=served["http"])
    with httpx.Client(transport=transport, base_url="http://infscaler", timeout=30) as h:
        doc = h.post("/v2/models/chain/infer", json=body).json()
    params = doc["parameters"]
    assert all(isinstance(v, str | int | float | bool) for v in params.values()), params
    assert "unit_ms" not in params
    http_units = {k: v for k, v in params.items() if k.startswith("unit_ms.")}
    assert set(http_units) == {"unit_ms.scale", "unit_ms.add"}
    assert all(isinstance(v, float) and v >= 0 for v in http_units.values())

    grpc_params = _infer(gc, "chain", arr).get_response().parameters
    kinds = {k: p.WhichOneof("parameter_choice") for k, p in grpc_params.items()}
    assert set(kinds.values()) <= {"bool_param", "int64_param", "string_param", "double_param"}
    assert "unit_ms" not in kinds
    assert {k for k in kinds if k.startswith("unit_ms.")} == set(http_units)
    assert kinds["unit_ms.scale"] == kinds["unit_ms.add"] == "double_param"
    assert kinds["latency_ms"] == "double_param"
    with Client(served["http"]) as c:
        assert set(c.infer("chain", {"x": arr}).unit_ms) == {"scale", "add"}


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


def test_the_queue_parameters_pass_through_grpc(served, gc) -> None:
    """Triton's ``priority`` request parameter reaches the queue over gRPC as over HTTP:
    a level is served, one past the bound is refused as the HTTP codec refuses it."""
    from tritonclient.utils import InferenceServerException

    arr = np.ones((1, 4), np.float32)
    i = tg.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(arr)
    ok = gc.infer("chain", [i], priority=1)
    with Client(served["http"]) as h:
        want = h.infer("chain", {"x": arr}).outputs
    for out, expected in want.items():
        assert ok.as_numpy(out).tobytes() == expected.tobytes()
    with pytest.raises(InferenceServerException) as e:
        gc.infer("chain", [i], priority=10**9)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "parameter priority must be an integer" in e.value.message()


def test_an_oversized_message_is_refused_and_the_socket_serves_on(served, gc) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:  # 1.1 MB over the 1 MB limit
        _infer(gc, "chain", np.zeros((70_000, 4), np.float32))
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "larger than max" in e.value.message()
    r = _infer(gc, "chain", np.ones((1, 4), np.float32))
    assert r.as_numpy("z").tolist() == [[3.0, 3.0, 3.0, 3.0]]


def test_an_admission_refusal_is_unavailable_with_its_reason(served, gc) -> None:
    """A pipeline whose queue bound is reached: 503 over HTTP, UNAVAILABLE over gRPC,
    with the same reason; served again once the bound is lifted."""
    from tritonclient.utils import InferenceServerException

    svc, x = served["svc"], np.ones((1, 4), np.float32)
    dep = svc.deployment("chain")
    svc.set_queue_limit(dep, 0, "shed by the test at its resource cap")
    try:
        with Client(served["http"]) as h, pytest.raises(InferenceServerError) as http_err:
            h.infer("chain", {"x": x})
        with pytest.raises(InferenceServerException) as e:
            _infer(gc, "chain", x)
    finally:
        svc.set_queue_limit(dep, None)
    assert http_err.value.status == 503
    assert "shed by the test at its resource cap" in http_err.value.message
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message().startswith(http_err.value.message)
    assert _infer(gc, "chain", x).as_numpy("z").tolist() == [[3.0, 3.0, 3.0, 3.0]]


_NOBODY = r"""
import json, os, sys
import numpy as np
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException
from infscaler.api.client import Client, InferenceServerError, ShmTensor
# what httpx imports on its first transport (certifi reads importlib.resources from the
# standard library's files, which root's 0700 home hides from nobody)
import httpcore, certifi, importlib.resources  # noqa: E401,F401
os.setgroups([int(sys.argv[3])])  # imported as root (the venv is root's), now nobody
os.setresgid(65534, 65534, 65534)
os.setresuid(65534, 65534, 65534)
"""

_AS_NOBODY = (
    _NOBODY
    + r"""
grpc_sock, http_sock, key = sys.argv[1], sys.argv[4], sys.argv[2]
out = {}
def grpc_code(fn):
    try:
        fn()
        return ["OK", ""]
    except InferenceServerException as e:
        return [e.status().removeprefix("StatusCode."), e.message()]
def http_code(fn):
    try:
        fn()
        return [200, ""]
    except InferenceServerError as e:
        return [e.status, e.message]
c = tg.InferenceServerClient(url="unix:" + grpc_sock)
h = Client(http_sock)
x = np.ones((1, 4), np.float32)
i = tg.InferInput("x", [1, 4], "FP32"); i.set_data_from_numpy(x)
out["infer"] = c.infer("chain", [i]).as_numpy("z").tolist()
stolen = tg.InferInput("x", [1, 4], "FP32"); stolen.set_shared_memory("rootreg", 16)
chain = {"name": "chain", "stages": [{"name": "m", "function": "stagefuncs:scale"}]}
acts = {
    "index": (lambda: c.get_model_repository_index(), lambda: h.repository_index()),
    "load": (lambda: c.load_model("chain"), lambda: h.load("chain", chain)),
    "unload": (lambda: c.unload_model("chain"), lambda: h.unload("chain")),
    "register": (
        lambda: c.register_system_shared_memory("stolen", key, 64),
        lambda: h.register_system_shm("stolen", key, 64),
    ),
    "status_of_root_region": (
        lambda: c.get_system_shared_memory_status("rootreg"),
        lambda: h.system_shm_status("rootreg"),
    ),
    "infer_from_root_region": (
        lambda: c.infer("chain", [stolen]),
        lambda: h.infer("chain", {"x": ShmTensor("rootreg", "FP32", [1, 4], 16)}),
    ),
    "unregister_root_region": (
        lambda: c.unregister_system_shared_memory("rootreg"),
        lambda: h.unregister_system_shm("rootreg"),
    ),
    "status": (lambda: c.get_system_shared_memory_status(), lambda: h.system_shm_status()),
}
for act, (g, hh) in acts.items():
    out[act] = {"grpc": grpc_code(g), "http": http_code(hh)}
c.close(); h.close()
print(json.dumps(out))
"""
)


def _as_nobody(script: str, *args: str, **kw):
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_a_group_member_gets_what_http_gives_it(served, gc) -> None:
    """uid 65534 in the socket's group may infer; everything else it tries is refused
    over gRPC with the code of HTTP's status and the same reason: the repository
    (index, load, unload), registering root's 0600 shm object, and using, seeing or
    unregistering a region root registered."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the client runs as uid 65534 in the socket's group")
    key = f"isc_grpc_{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    gc.register_system_shared_memory("rootreg", "/" + key, 64)
    try:
        proc = _as_nobody(_AS_NOBODY, served["grpc"], "/" + key, str(GROUP), served["http"])
        stdout, stderr = proc.communicate(timeout=60)
        assert gc.get_system_shared_memory_status("rootreg", as_json=True)["regions"]
    finally:
        gc.unregister_system_shared_memory("rootreg")
        os.unlink(f"/dev/shm/{key}")
    assert proc.returncode == 0, stderr[-2000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out.pop("infer") == [[3.0, 3.0, 3.0, 3.0]]
    assert out.pop("status") == {"grpc": ["OK", ""], "http": [200, ""]}
    for act, got in out.items():
        (code, message), (status, http_message) = got["grpc"], got["http"]
        assert status == 403, (act, got)
        assert code == grpc_code(status).name == "PERMISSION_DENIED", (act, got)
        assert message and message == http_message, (act, got)
    assert "reserved to the service's own user" in out["index"]["grpc"][1]
    assert "may not read and write" in out["register"]["grpc"][1]
    for act in ("status_of_root_region", "infer_from_root_region", "unregister_root_region"):
        assert "rootreg" in out[act]["grpc"][1], out[act]


_HOLD_CONNECTIONS = (
    _NOBODY
    + r"""
import time
def live(c):
    try:
        return "OK" if c.is_server_live() else "not live"
    except InferenceServerException as e:
        return e.status()
def client():  # a channel of its own: not grpc's shared connection to the same address
    args = [("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0)]
    return tg.InferenceServerClient(url="unix:" + sys.argv[1], channel_args=args)
held = [client() for _ in range(int(sys.argv[2]) + 1)]
print(json.dumps([live(c) for c in held]), flush=True)
sys.stdin.readline()  # the test checks that others are served meanwhile
for c in held:
    c.close()
time.sleep(0.5)
print(json.dumps(live(client())), flush=True)
"""
)


def test_the_per_uid_connection_limit_holds_over_grpc(served, gc) -> None:
    """uid 65534 gets PER_UID connections and no more (the next is refused at once:
    UNAVAILABLE) while the socket serves root; once it closes them it gets one again."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the client runs as uid 65534 in the socket's group")
    proc = _as_nobody(_HOLD_CONNECTIONS, served["grpc"], str(PER_UID), str(GROUP))
    try:
        first = json.loads(proc.stdout.readline() or "null")
        assert first == ["OK"] * PER_UID + ["StatusCode.UNAVAILABLE"], proc.stderr.read()[-2000:]
        assert gc.is_server_live()
        assert _infer(gc, "chain", np.ones((1, 4), np.float32)).as_numpy("z")[0, 0] == 3.0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline() or "null") == "OK"
    finally:
        proc.kill()
        proc.communicate(timeout=30)


_CONCURRENT_BIG = (
    _NOBODY
    + r"""
import threading
c = tg.InferenceServerClient(url="unix:" + sys.argv[1])
x = np.ones((int(sys.argv[2]), 4), np.float32)
barrier, got = threading.Barrier(4), []
def one():
    i = tg.InferInput("x", list(x.shape), "FP32"); i.set_data_from_numpy(x)
    barrier.wait()
    try:
        r = c.infer("chain", [i])
        got.append(["OK", float(r.as_numpy("y").sum())])
    except InferenceServerException as e:
        got.append([e.status().removeprefix("StatusCode."), e.message()])
ts = [threading.Thread(target=one) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(got), flush=True)
"""
)


@pytest.mark.usefixtures("stagefuncs_on_path")
def test_a_uids_inflight_byte_budget_holds_over_grpc(tmp_path: Path) -> None:
    """uid 65534 sends 4 concurrent ModelInfer of 0.6 MB (1.2 MB reserved each: the
    message and its decoded tensors) against a 2.5 MB budget per uid, while a 3-s stage
    holds the admitted ones: two are served, the others refused at once with
    UNAVAILABLE and the budget's reason; the reservations all come back."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the client runs as uid 65534 in the socket's group")
    from tests.helpers import chain_pipeline

    public = Path(tempfile.mkdtemp(prefix="isc-grpc-q-"))
    public.chmod(0o711)
    rows = 37_500  # 600 KB of FP32
    with Service(
        state_dir=tmp_path / "state",
        control_path="userspace",
        pool_mb=64,
        max_inflight_mb_per_uid=2.5,
    ) as svc:
        svc.deploy(load_pipeline(chain_pipeline(ms=3000)))
        policy = SecurityPolicy.create(allow_functions=["stagefuncs"])
        grpc_sock = str(public / "api-grpc.sock")
        with ServerThread(
            svc,
            str(public / "api.sock"),
            security=policy,
            socket_group=GROUP,
            grpc_socket=grpc_sock,
        ):
            before = svc.inflight.stats()
            proc = _as_nobody(_CONCURRENT_BIG, grpc_sock, str(rows), str(GROUP))
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-2000:]
            got = json.loads(stdout.strip().splitlines()[-1])
            after = svc.inflight.stats()
    served = [g for g in got if g[0] == "OK"]
    refused = [g for g in got if g[0] != "OK"]
    assert len(served) == 2 and all(g[1] == 2.0 * rows * 4 for g in served), got
    assert len(refused) == 2, got
    for code, message in refused:
        assert code == "UNAVAILABLE" and "in-flight memory budget" in message, (code, message)
    assert after["refused_per_peer"] - before["refused_per_peer"] == 2
    assert after["inflight_bytes"] == before["inflight_bytes"]
