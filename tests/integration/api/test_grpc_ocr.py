"""tritonclient.grpc against the bundled ``ocr`` pipeline (real PP-OCRv4 models) and a
small ONNX model on the gRPC socket: the outputs are bit-exact with the HTTP client's
for the same image, in-band and through system shared memory
(``tritonclient.utils.shared_memory``: regions created by the client, registered over
gRPC, the input read from one, outputs written into others)."""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rapidocr_onnxruntime", reason="pip install rapidocr_onnxruntime==1.4.4")
tg = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import np_to_triton_dtype  # noqa: E402

with warnings.catch_warnings():  # tritonclient < 2.50 imports pkg_resources (setuptools < 81)
    warnings.simplefilter("ignore")
    tshm = pytest.importorskip("tritonclient.utils.shared_memory")

from infscaler.api.client import Client  # noqa: E402
from infscaler.api.server import ServerThread  # noqa: E402
from infscaler.base.config import load_pipeline  # noqa: E402
from infscaler.base.samples import render_text_image  # noqa: E402
from infscaler.pipelines.ocr import PIPELINE_YAML  # noqa: E402
from infscaler.service.service import Service  # noqa: E402
from tests.helpers import residual_model, save  # noqa: E402

pytestmark = pytest.mark.slow

IMAGES = {
    "two_lines": ["InfScaler serves partitioned models", "Edge inference on Jetson 2026"],
    "one_line": ["Zero copy tokens"],
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """ocr + a small ONNX model (tests.helpers.residual_model) on an HTTP and a gRPC
    socket."""
    tmp = tmp_path_factory.mktemp("grpc-ocr")
    public = Path(tempfile.mkdtemp(prefix="isc-grpc-ocr-"))
    model = save(residual_model(), tmp / "res.onnx")
    with Service(state_dir=tmp / "state", pool_mb=256) as svc:
        svc.deploy(load_pipeline(PIPELINE_YAML))
        svc.deploy(load_pipeline({"name": "res", "stages": [{"name": "m", "model": str(model)}]}))
        http, grpc_sock = str(public / "api.sock"), str(public / "api-grpc.sock")
        with ServerThread(svc, http, grpc_socket=grpc_sock):
            yield {"http": http, "grpc": grpc_sock}


@pytest.fixture
def gc(served):
    c = tg.InferenceServerClient(url="unix:" + served["grpc"])
    yield c
    c.close()


def _image(key: str) -> np.ndarray:
    return render_text_image(IMAGES[key], font_size=24)


def _as_bytes(arr: np.ndarray) -> list[bytes]:
    return [x if isinstance(x, bytes) else str(x).encode() for x in arr.reshape(-1)]


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == object or got.dtype == object:
        assert _as_bytes(got) == _as_bytes(want)
    else:
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_ocr_bit_exact_with_http(served, gc, key: str) -> None:
    img = _image(key)
    with Client(served["http"]) as h:
        want = h.infer("ocr", {"image": img}).outputs
    i = tg.InferInput("image", list(img.shape), "UINT8")
    i.set_data_from_numpy(img)
    r = gc.infer("ocr", [i])
    assert set(want) == {"texts", "scores", "boxes"}
    assert len(want["texts"]) == len(IMAGES[key])  # the lines were found
    for name, expected in want.items():
        _assert_same(r.as_numpy(name), expected)


class _Regions:
    """System shared memory regions made with tritonclient and registered over gRPC;
    unregistered and destroyed on exit."""

    def __init__(self, client: object) -> None:
        self.client = client
        self.handles: dict[str, object] = {}

    def make(self, name: str, size: int) -> object:
        key = f"/isc_gt_{name}_{uuid.uuid4().hex[:8]}"
        handle = tshm.create_shared_memory_region(name, key, size)
        self.handles[name] = handle
        self.client.register_system_shared_memory(name, key, size)
        return handle

    def __enter__(self) -> _Regions:
        return self

    def __exit__(self, *exc: object) -> None:
        for name, handle in self.handles.items():
            try:
                self.client.unregister_system_shared_memory(name)
            finally:
                tshm.destroy_shared_memory_region(handle)


def _infer_through_shm(gc, model: str, name: str, arr: np.ndarray, want: dict, in_band=()):
    """``arr`` as input ``name`` from a region, every output of ``want`` not in
    ``in_band`` into a region of its size; the outputs as numpy arrays."""
    with _Regions(gc) as regions:
        handle = regions.make("input", arr.nbytes)
        tshm.set_shared_memory_region(handle, [arr])
        i = tg.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
        i.set_shared_memory("input", arr.nbytes)
        outputs = []
        for out, expected in want.items():
            o = tg.InferRequestedOutput(out)
            if out not in in_band:
                regions.make(f"out_{out}", expected.nbytes)
                o.set_shared_memory(f"out_{out}", expected.nbytes)
            outputs.append(o)
        status = gc.get_system_shared_memory_status(as_json=True)
        assert {"input"} | {f"out_{o}" for o in want if o not in in_band} <= set(status["regions"])
        r = gc.infer(model, [i], outputs=outputs)
        resp = r.get_response()  # one raw entry per output (as Triton), empty when in shm
        raw = {o.name: c for o, c in zip(resp.outputs, resp.raw_output_contents, strict=True)}
        assert {o for o, c in raw.items() if c} == set(in_band)
        got = {}
        for out, expected in want.items():
            if out in in_band:
                got[out] = r.as_numpy(out)
                continue
            meta = r.get_output(out)
            params = meta.parameters
            assert params["shared_memory_region"].string_param == f"out_{out}"
            assert params["shared_memory_byte_size"].int64_param == expected.nbytes
            got[out] = tshm.get_contents_as_numpy(
                regions.handles[f"out_{out}"], expected.dtype, list(meta.shape)
            ).copy()
        return got


def test_ocr_through_system_shared_memory(served, gc) -> None:
    """The image from a region; scores and boxes into regions, texts (BYTES) in-band."""
    img = _image("two_lines")
    with Client(served["http"]) as h:
        want = h.infer("ocr", {"image": img}).outputs
    got = _infer_through_shm(gc, "ocr", "image", img, want, in_band=("texts",))
    for name, expected in want.items():
        _assert_same(got[name], expected)
    assert gc.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_small_model_through_system_shared_memory(served, gc) -> None:
    arr = np.random.default_rng(7).standard_normal((1, 4, 8, 8)).astype(np.float32)
    with Client(served["http"]) as h:
        want = h.infer("res", {"x": arr}).outputs
    got = _infer_through_shm(gc, "res", "x", arr, want)
    for name, expected in want.items():
        _assert_same(got[name], expected)
    assert not any(p.startswith("isc_gt_") for p in os.listdir("/dev/shm"))
