"""Malformed-request generator for the v2 API's edge (issue 13), shared by
``tests/{unit,integration}/test_reliability_edge.py`` (a CI-bounded run) and ``bench/fuzz_api.py`` (>= 10,000).

Each case is raw bytes sent on a fresh Unix-socket connection (``Connection: close``),
so HTTP-level garbage and truncated requests travel exactly as a hostile client would
send them. A seeded :class:`random.Random` makes every run reproducible.

The target is :func:`fuzz_pipeline`: ``x`` FP32 [-1, 4] -> function stage ``check``
(:func:`check_rows`: the declared :class:`StageInputError` for an empty or non-finite
``x``) -> a small ONNX model (:func:`small_model`: ``y = relu(x W)``, W 4x4) -> ``y``.

What a case expects (:attr:`Case.expect`):

- ``"4xx"``: a 4xx answer with v2 error JSON (``{"error": str}``,
  ``Content-Type: application/json``).
- ``"4xx_or_closed"``: the same, or the server closes the connection without an answer
  (for cases where nobody could be answered; the built-in kinds all expect ``"4xx"``:
  a truncated request, half-closed by the client, gets 400 JSON too).

Nothing here is a measurement; :func:`send` returns what came back.
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "edge"
KINDS = (
    "bad_json",
    "deep_nesting",
    "wrong_types",
    "bad_params",
    "bad_datatype",
    "shape_mismatch",
    "huge_shape",
    "bad_binary",
    "unknown_model",
    "unknown_version",
    "bad_encoding",
    "bad_content",
    "bad_outputs",
    "raw_garbage",
    "truncated",
)


# -- the target ---------------------------------------------------------------------------


def check_rows(tensors: Any) -> dict[str, np.ndarray]:
    """Function stage ``check``: ``x2 = x`` (FP32 [N, 4]).

    Raises:
        StageInputError: (400) ``x`` has no rows or holds NaN / infinity.
    """
    from infscaler.runtime.serving.instance import StageInputError

    x = np.asarray(tensors["x"], dtype=np.float32)
    if x.shape[0] == 0:
        raise StageInputError("x has no rows; send at least one row of 4 values")
    if not np.isfinite(x).all():
        raise StageInputError("x holds NaN or infinity; send finite values")
    return {"x2": np.array(x)}


check_rows.outputs_spec = {"x2": {"datatype": "FP32", "shape": [-1, 4]}}  # type: ignore[attr-defined]


def small_model(path: str | Path) -> Path:
    """Write the ONNX model ``y = relu(x W)`` (x FP32 [N, 4], W 4x4 fixed) to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16.0
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
        ],
        "fuzz",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        initializer=[numpy_helper.from_array(w, name="w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def expected_y(x: np.ndarray) -> np.ndarray:
    """What the pipeline answers for ``x`` (numpy reference of :func:`small_model`)."""
    w = np.arange(16, dtype=np.float32).reshape(4, 4) / 16.0
    return np.maximum(np.asarray(x, np.float32) @ w, 0)


def fuzz_pipeline(model_path: str | Path) -> dict[str, Any]:
    """The pipeline config (for ``load_pipeline``); ``_fuzz`` must be importable by the
    instance processes (this directory on their ``PYTHONPATH``)."""
    return {
        "name": MODEL,
        "description": "fuzz target: check rows, then y = relu(x W)",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": ["y"],
        "stages": [
            {"name": "check", "function": "_fuzz:check_rows", "inputs": ["x"], "outputs": ["x2"]},
            {
                "name": "model",
                "model": str(model_path),
                "inputs": {"x": "x2"},
                "outputs": {"y": "y"},
                "engine": "cpu",
                "instances": 1,
            },
        ],
    }


# -- cases --------------------------------------------------------------------------------


@dataclass
class Case:
    """One malformed request: ``raw`` is the bytes sent; ``shut_write`` half-closes the
    connection after sending (the request is cut off)."""

    kind: str
    raw: bytes
    expect: str = "4xx"
    shut_write: bool = False
    note: str = ""


def http(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    content_length: int | None = None,
) -> bytes:
    """An HTTP/1.1 request's bytes (``Connection: close``; ``Content-Length`` of the body
    unless ``content_length`` overrides it)."""
    h = {"Host": "infscaler", "Connection": "close", **(headers or {})}
    if body or content_length is not None or method == "POST":
        h["Content-Length"] = str(len(body) if content_length is None else content_length)
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return head.encode("latin-1") + b"\r\n" + body


def _infer(body: bytes, headers: dict[str, str] | None = None, model: str = MODEL) -> bytes:
    return http("POST", f"/v2/models/{model}/infer", body, headers)


def _inp(**kw: Any) -> dict[str, Any]:
    d = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}
    d.update(kw)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()


def _doc(**kw: Any) -> bytes:
    return json.dumps({"inputs": [_inp(**kw)]}).encode()


def _valid_doc(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 3)
    return {
        "id": f"r{rng.randint(0, 999)}",
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [n, 4],
                "data": [round(rng.uniform(-2, 2), 3) for _ in range(4 * n)],
            }
        ],
    }


def _bad_json(rng: random.Random) -> Case:
    text = json.dumps(_valid_doc(rng))
    choice = rng.randrange(6)
    if choice == 0:
        body = text[: rng.randrange(1, len(text) - 1)]
    elif choice == 1:
        i = rng.randrange(len(text))
        body = text[:i] + rng.choice("{}[],:\"'\\x") + text[i + 1 :]
    elif choice == 2:
        body = text + rng.choice(["}", "]", ",", " x", "{}"])
    elif choice == 3:
        body = rng.choice(["", "null", "[]", "42", '"s"', "true", "{", "}", "{'a': 1}"])
    elif choice == 4:
        body = text.replace(":", "=", 1)
    else:
        body = "".join(rng.choice('{}[]:,"0a- ') for _ in range(rng.randint(1, 200)))
    try:  # a mutation that left valid JSON (a changed letter in a string): break it
        json.loads(body)
    except ValueError:
        pass
    else:
        body += " x"
    return Case("bad_json", _infer(body.encode()), note=body[:60])


def _deep_nesting(rng: random.Random) -> Case:
    depth = rng.choice([65, 100, 1000, 10_000, 100_000, rng.randint(65, 5000)])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}"), ("[{", "}]")])
    where = rng.randrange(3)
    nest = opener * depth + "1" + closer * depth
    if where == 0:
        body = nest
    elif where == 1:
        body = json.dumps({"inputs": [_inp(data=None)]}).replace("null", nest)
    else:
        body = json.dumps({"parameters": {"p": None}, "inputs": [_inp()]}).replace("null", nest)
    if rng.random() < 0.3:  # unbalanced
        body = body[: -rng.randint(1, min(depth, 50))]
    return Case("deep_nesting", _infer(body.encode()), note=f"depth {depth}")


_ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    "x",
    "",
    [],
    {},
    [None],
    [[]],
    {"a": 1},
    10**30,
    "FP32",
]


def _wrong_types(rng: random.Random) -> Case:
    field = rng.choice(["inputs", "input", "name", "datatype", "shape", "data", "parameters", "id"])
    v = rng.choice(_ODD_VALUES)
    if field == "inputs":
        doc: Any = {"inputs": v}
    elif field == "input":
        doc = {"inputs": [v]}
    elif field == "id":
        doc = {"id": 5 if v is None or isinstance(v, str) else v, "inputs": [_inp()]}
    elif field == "parameters":
        doc = {"parameters": v if not isinstance(v, dict) or v == {} else [v], "inputs": [_inp()]}
        if doc["parameters"] == {} or doc["parameters"] is None:
            doc["parameters"] = "p"
    else:
        if field == "name" and isinstance(v, str):
            v = 3 if v in ("", "x") else v  # "x" is the real input; others are unknown
        if field == "datatype" and v == "FP32":
            v = 32
        if field == "data" and v in (0, -1, 1.5):
            v = "x"
        doc = {"inputs": [_inp(**{field: v})]}
    return Case("wrong_types", _infer(json.dumps(doc).encode()), note=f"{field}={v!r:.30}")


_BAD_TIMEOUTS = [
    "inf",
    "nan",
    "Infinity",
    "100",
    "",
    True,
    False,
    None,
    [],
    {},
    0,
    -1,
    -0.0,
    10**30,
    2**63,
    3_600_001,
    1e12,
]


def _bad_params(rng: random.Random) -> Case:
    r = rng.randrange(4)
    if r == 0:  # non-finite numbers as JSON constants (Python's json writes them)
        const = rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
        body = json.dumps({"parameters": {"timeout_ms": 0}, "inputs": [_inp()]}).replace(
            '"timeout_ms": 0', f'"timeout_ms": {const}'
        )
        return Case("bad_params", _infer(body.encode()), note=f"timeout_ms={const}")
    if r == 1:
        v = rng.choice(_BAD_TIMEOUTS)
        doc = {"parameters": {"timeout_ms": v}, "inputs": [_inp()]}
        return Case("bad_params", _infer(json.dumps(doc).encode()), note=f"timeout_ms={v!r}")
    if r == 2:
        key = rng.choice(["binary_data_output", "p", "latency_ms"])
        v = rng.choice(["NaN", "Infinity", str(10**25)])
        if key == "binary_data_output":
            v = rng.choice(['"yes"', "1", "null", "[]"])
        body = json.dumps({"parameters": {key: 0}, "inputs": [_inp()]}).replace(
            f'"{key}": 0', f'"{key}": {v}'
        )
        return Case("bad_params", _infer(body.encode()), note=f"{key}={v}")
    doc = {"parameters": {"p": {"nested": [1]}}, "inputs": [_inp()]}
    return Case("bad_params", _infer(json.dumps(doc).encode()), note="object parameter")


def _bad_datatype(rng: random.Random) -> Case:
    dt = rng.choice(["FP33", "fp32", "", "BF16", "FLOAT", "INT128", "BYTES", "INT32", "BOOL", "é"])
    data: Any = [1, 2, 3, 4]
    if dt == "BYTES":
        data = ["a", "b", "c", "d"]
    elif dt == "BOOL":
        data = [True, False, True, True]
    return Case("bad_datatype", _infer(_doc(datatype=dt, data=data)), note=dt)


def _shape_mismatch(rng: random.Random) -> Case:
    r = rng.randrange(6)
    if r == 0:
        body = _doc(shape=[1, 4], data=[1.0] * rng.choice([0, 1, 3, 5, 8]))
    elif r == 1:  # ragged
        body = _doc(shape=[2, 4], data=[[1, 2, 3, 4], [5, 6, 7]])
    elif r == 2:  # re-shaped nesting
        body = _doc(shape=[2, 4], data=[[1, 2], [3, 4], [5, 6], [7, 8]])
    elif r == 3:
        body = _doc(shape=[4], data=[1, 2, 3, 4])
    elif r == 4:
        body = _doc(shape=[1, 4], data=[[1, 2, 3, [4]]])
    else:
        body = _doc(shape=[1, 4], data=[1, "2", 3, 4])
    return Case("shape_mismatch", _infer(body), note=body[:60].decode())


def _huge_shape(rng: random.Random) -> Case:
    shape = rng.choice(
        [
            [2**40, 4],
            [10**30, 4],
            [2**62, 4],
            [-1, 4],
            [-5, 4],
            [1, 4] * 20,
            [0, 4, 10**20],
            [2**31, 4],
        ]
    )
    if rng.random() < 0.5:
        body = json.dumps({"inputs": [_inp(shape=shape, data=[1.0] * 4)]}).encode()
        return Case("huge_shape", _infer(body), note=str(shape)[:40])
    header = json.dumps(
        {"inputs": [_inp(shape=shape, data=_DROP, parameters={"binary_data_size": 16})]}
    ).encode()
    raw = header + b"\0" * 16
    return Case(
        "huge_shape",
        _infer(raw, {"Inference-Header-Content-Length": str(len(header))}),
        note=f"binary {shape}"[:40],
    )


def _bad_binary(rng: random.Random) -> Case:
    size = rng.choice([16, 15, 17, 0, -16, 10**12])
    header = json.dumps(
        {"inputs": [_inp(data=_DROP, parameters={"binary_data_size": size})]}
    ).encode()
    blob = np.arange(4, dtype=np.float32).tobytes()[: rng.choice([16, 8, 0])]
    if size == 16 and len(blob) == 16:
        blob += b"\0" * rng.randint(1, 8)  # unclaimed bytes
    body = header + blob
    hl = rng.choice(
        [
            str(len(body) + rng.randint(1, 1000)),
            "-1",
            "-" + str(len(header)),
            "1.5",
            "abc",
            "",
            " " + str(len(header)),
            str(10**30),
            "0x10",
            None,
        ]
    )
    headers = {} if hl is None else {"Inference-Header-Content-Length": hl}
    return Case("bad_binary", _infer(body, headers), note=f"size {size} header {hl!r}")


def _unknown_model(rng: random.Random) -> Case:
    name = rng.choice(["nope", "EDGE", "edge ", "edg", "%00", "..%2F..", "a" * 300, "модель"])
    from urllib.parse import quote

    path = quote(name, safe="%")
    method = rng.choice(["infer", "meta", "ready", "stats"])
    if method == "infer":
        raw = _infer(_doc(), model=path)
    else:
        suffix = {"meta": "", "ready": "/ready", "stats": "/stats"}[method]
        raw = http("GET", f"/v2/models/{path}{suffix}")
    return Case("unknown_model", raw, note=name[:30])


def _unknown_version(rng: random.Random) -> Case:
    v = rng.choice(["2", "0", "01", "latest", "-1", "1.0", "%20", "9" * 40])
    suffix = rng.choice(["", "/ready", "/stats", "/infer"])
    path = f"/v2/models/{MODEL}/versions/{v}{suffix}"
    raw = http("POST", path, _doc()) if suffix == "/infer" else http("GET", path)
    return Case("unknown_version", raw, note=f"{v}{suffix}")


def _bad_encoding(rng: random.Random) -> Case:
    text = json.dumps(_valid_doc(rng))
    r = rng.randrange(4)
    if r == 0:
        body = text.encode(rng.choice(["utf-16", "utf-16-le", "utf-32"]))
    elif r == 1:
        body = b"\xef\xbb\xbf" + text.encode()
    elif r == 2:
        raw = bytearray(text.encode())
        raw[rng.randrange(len(raw))] = rng.choice([0x80, 0xC3, 0xFF, 0xFE])
        body = bytes(raw)
    else:
        body = text.encode("latin-1").replace(b'"x"', b'"x\xe9"')
    return Case("bad_encoding", _infer(body), note=f"variant {r}")


def _bad_content(rng: random.Random) -> Case:
    r = rng.randrange(3)
    if r == 0:  # the stage's declared input error: no rows
        body = _doc(shape=[0, 4], data=[])
    elif r == 1:  # non-finite values: accepted by the protocol, refused by the stage
        body = _doc(data=[0, 0, 0, 0]).replace(b"[0, 0, 0, 0]", b"[0, NaN, 0, Infinity]")
    else:  # a second, unknown input / a missing one
        doc = {"inputs": [_inp(), _inp(name="q")]} if rng.random() < 0.5 else {"inputs": []}
        body = json.dumps(doc).encode()
    return Case("bad_content", _infer(body), note=f"variant {r}")


def _bad_outputs(rng: random.Random) -> Case:
    outputs = rng.choice(
        [
            "y",
            [{"name": "nope"}],
            [{"name": "y"}, {"name": "y"}],
            [{"name": "y", "parameters": {"binary_data": "yes"}}],
            [
                {
                    "name": "y",
                    "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 16},
                }
            ],
            [{"name": "y", "parameters": {"classification": 3}}],
            [5],
        ]
    )
    doc = {"inputs": [_inp()], "outputs": outputs}
    return Case("bad_outputs", _infer(json.dumps(doc).encode()), note=str(outputs)[:40])


def _raw_garbage(rng: random.Random) -> Case:
    r = rng.randrange(7)
    if r == 0:
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n"
    elif r == 1:
        raw = b"GET /v2 HTTP/9.9\r\nHost: x\r\n\r\n"
    elif r == 2:
        raw = b"G\x00T /v2 HTTP/1.1\r\n\r\n"
    elif r == 3:
        raw = b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"
    elif r == 4:
        raw = b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n"
    elif r == 5:
        raw = b"POST /v2/models/edge/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n"
    else:
        raw = (
            b"POST /v2/models/edge/infer HTTP/1.1\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzzzz"
        )
    return Case("raw_garbage", raw, note=f"variant {r}")


def _truncated(rng: random.Random) -> Case:
    full = _infer(json.dumps(_valid_doc(rng)).encode())
    head_end = full.index(b"\r\n\r\n") + 4
    if rng.random() < 0.5:
        cut = rng.randrange(1, head_end - 1)  # inside the request line / headers
    else:
        cut = rng.randrange(head_end, len(full))  # inside the body
    return Case("truncated", full[:cut], shut_write=True, note=f"{cut} of {len(full)} bytes")


_MAKERS = {
    "bad_json": _bad_json,
    "deep_nesting": _deep_nesting,
    "wrong_types": _wrong_types,
    "bad_params": _bad_params,
    "bad_datatype": _bad_datatype,
    "shape_mismatch": _shape_mismatch,
    "huge_shape": _huge_shape,
    "bad_binary": _bad_binary,
    "unknown_model": _unknown_model,
    "unknown_version": _unknown_version,
    "bad_encoding": _bad_encoding,
    "bad_content": _bad_content,
    "bad_outputs": _bad_outputs,
    "raw_garbage": _raw_garbage,
    "truncated": _truncated,
}
assert tuple(_MAKERS) == KINDS


def cases(count: int, seed: int = 0) -> Iterator[Case]:
    """``count`` cases, every kind in turn (round-robin), variants drawn from ``seed``."""
    rng = random.Random(seed)
    for i in range(count):
        yield _MAKERS[KINDS[i % len(KINDS)]](rng)


# -- sending ------------------------------------------------------------------------------


@dataclass
class Answer:
    """What came back: ``status`` (None: the connection closed without an answer),
    the headers (lower-case names) and the body."""

    status: int | None
    headers: dict[str, str]
    body: bytes
    seconds: float


def send(
    socket_path: str, raw: bytes, *, shut_write: bool = False, timeout: float = 30.0
) -> Answer:
    """Send ``raw`` on a new connection to ``socket_path`` and read until the server
    closes it (the requests say ``Connection: close``)."""
    t0 = time.perf_counter()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    chunks: list[bytes] = []
    try:
        s.connect(socket_path)
        try:
            s.sendall(raw)
            if shut_write:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
    finally:
        s.close()
    return parse_answer(b"".join(chunks), time.perf_counter() - t0)


def parse_answer(data: bytes, seconds: float = 0.0) -> Answer:
    """An :class:`Answer` from a raw HTTP/1.1 response (status None when empty)."""
    if not data:
        return Answer(None, {}, b"", seconds)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return Answer(status, headers, body, seconds)


def judge(case: Case, answer: Answer) -> str | None:
    """None when ``answer`` is what ``case`` expects, else what is wrong."""
    if answer.status is None:
        return None if case.expect == "4xx_or_closed" else "closed without an answer"
    if not 400 <= answer.status <= 499:
        return f"status {answer.status}: {answer.body[:200]!r}"
    if not answer.headers.get("content-type", "").startswith("application/json"):
        return f"content-type {answer.headers.get('content-type')!r}: {answer.body[:100]!r}"
    try:
        doc = json.loads(answer.body)
    except ValueError:
        return f"body is not JSON: {answer.body[:100]!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), str) or not doc["error"]:
        return f"body is not v2 error JSON: {answer.body[:100]!r}"
    return None


def valid_request(rng: random.Random | None = None) -> tuple[bytes, np.ndarray]:
    """A valid infer request and the ``x`` it sends."""
    rng = rng or random.Random(0)
    doc = _valid_doc(rng)
    x = np.array(doc["inputs"][0]["data"], np.float32).reshape(doc["inputs"][0]["shape"])
    return _infer(json.dumps(doc).encode()), x


def check_valid(socket_path: str, rng: random.Random | None = None) -> str | None:
    """Send a valid request; None when the answer is 200 with the right ``y``."""
    raw, x = valid_request(rng)
    a = send(socket_path, raw)
    if a.status != 200:
        return f"valid request got {a.status}: {a.body[:200]!r}"
    doc = json.loads(a.body)
    y = np.array(doc["outputs"][0]["data"], np.float32).reshape(x.shape)
    if not np.allclose(y, expected_y(x), rtol=1e-5, atol=1e-5):
        return "valid request got a wrong y"
    return None


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (psutil)."""
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20
