"""Malformed v2 requests as hypothesis strategies, one per kind (:data:`KINDS`), against
the target of :mod:`api_edge` (the integration test draws a CI-bounded run per kind).

Each strategy draws an :class:`api_edge.Case`: the raw bytes sent on one connection,
whether the client half-closes after sending (a truncated request), and what the answer
must be (``"4xx"``: 4xx v2 error JSON). Kinds: bad JSON, deep nesting, wrong types,
NaN / infinite / out-of-range parameters, bad datatypes, shape / data mismatches, huge
declared shapes, bad binary headers, unknown models and versions, non-UTF-8 bodies,
content the stage refuses, bad requested outputs, raw HTTP garbage, truncated requests.

Source: hypothesis's strategies (hypothesis.readthedocs.io, "What you can generate").
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from api_edge import MODEL, Case, http, infer_request
from hypothesis import strategies as st

__all__ = ["KINDS", "STRATEGIES", "cases", "valid_docs"]

_DROP = object()


def _inp(**kw: Any) -> dict[str, Any]:
    d = {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}
    d.update(kw)
    return {k: v for k, v in d.items() if v is not _DROP}


def _doc(**kw: Any) -> bytes:
    return json.dumps({"inputs": [_inp(**kw)]}).encode()


@st.composite
def valid_docs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request document: 1..3 rows of 4 values in [-2, 2]."""
    n = draw(st.integers(1, 3))
    values = st.floats(-2, 2).map(lambda v: round(v, 3))
    data = draw(st.lists(values, min_size=4 * n, max_size=4 * n))
    x = {"name": "x", "datatype": "FP32", "shape": [n, 4], "data": data}
    return {"id": f"r{draw(st.integers(0, 999))}", "inputs": [x]}


@st.composite
def bad_json(draw: st.DrawFn) -> Case:
    text = json.dumps(draw(valid_docs()))
    choice = draw(st.integers(0, 5))
    if choice == 0:
        body = text[: draw(st.integers(1, len(text) - 2))]
    elif choice == 1:
        i = draw(st.integers(0, len(text) - 1))
        body = text[:i] + draw(st.sampled_from("{}[],:\"'\\x")) + text[i + 1 :]
    elif choice == 2:
        body = text + draw(st.sampled_from(["}", "]", ",", " x", "{}"]))
    elif choice == 3:
        body = draw(st.sampled_from(["", "null", "[]", "42", '"s"', "true", "{", "}", "{'a': 1}"]))
    elif choice == 4:
        body = text.replace(":", "=", 1)
    else:
        body = draw(st.text(alphabet='{}[]:,"0a- ', min_size=1, max_size=200))
    try:  # a mutation that left valid JSON (a changed letter in a string): break it
        json.loads(body)
    except ValueError:
        pass
    else:
        body += " x"
    return Case("bad_json", infer_request(body.encode()), note=body[:60])


@st.composite
def deep_nesting(draw: st.DrawFn) -> Case:
    depth = draw(st.sampled_from([65, 100, 1000, 10_000, 100_000]) | st.integers(65, 5000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ("[{", "}]")]))
    where = draw(st.integers(0, 2))
    nest = opener * depth + "1" + closer * depth
    if where == 0:
        body = nest
    elif where == 1:
        body = json.dumps({"inputs": [_inp(data=None)]}).replace("null", nest)
    else:
        body = json.dumps({"parameters": {"p": None}, "inputs": [_inp()]}).replace("null", nest)
    if draw(st.booleans()):  # unbalanced
        body = body[: -draw(st.integers(1, min(depth, 50)))]
    return Case("deep_nesting", infer_request(body.encode()), note=f"depth {depth}")


_ODD_VALUES: list[Any] = [
    None, True, 0, -1, 1.5, "x", "", [], {}, [None], [[]], {"a": 1}, 10**30, "FP32",
]  # fmt: skip


@st.composite
def wrong_types(draw: st.DrawFn) -> Case:
    fields = ["inputs", "input", "name", "datatype", "shape", "data", "parameters", "id"]
    field = draw(st.sampled_from(fields))
    v = draw(st.sampled_from(_ODD_VALUES))
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
    return Case("wrong_types", infer_request(json.dumps(doc).encode()), note=f"{field}={v!r:.30}")


_BAD_TIMEOUTS: list[Any] = [
    "inf", "nan", "Infinity", "100", "", True, False, None, [], {}, 0, -1, -0.0,
    10**30, 2**63, 3_600_001, 1e12,
]  # fmt: skip


@st.composite
def bad_params(draw: st.DrawFn) -> Case:
    r = draw(st.integers(0, 3))
    if r == 0:  # non-finite numbers as JSON constants (Python's json writes them)
        const = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]))
        body = json.dumps({"parameters": {"timeout_ms": 0}, "inputs": [_inp()]}).replace(
            '"timeout_ms": 0', f'"timeout_ms": {const}'
        )
        return Case("bad_params", infer_request(body.encode()), note=f"timeout_ms={const}")
    if r == 1:
        v = draw(st.sampled_from(_BAD_TIMEOUTS))
        doc = {"parameters": {"timeout_ms": v}, "inputs": [_inp()]}
        return Case("bad_params", infer_request(json.dumps(doc).encode()), note=f"timeout_ms={v!r}")
    if r == 2:
        key = draw(st.sampled_from(["binary_data_output", "p", "latency_ms"]))
        if key == "binary_data_output":
            v = draw(st.sampled_from(['"yes"', "1", "null", "[]"]))
        else:
            v = draw(st.sampled_from(["NaN", "Infinity", str(10**25)]))
        body = json.dumps({"parameters": {key: 0}, "inputs": [_inp()]}).replace(
            f'"{key}": 0', f'"{key}": {v}'
        )
        return Case("bad_params", infer_request(body.encode()), note=f"{key}={v}")
    doc = {"parameters": {"p": {"nested": [1]}}, "inputs": [_inp()]}
    return Case("bad_params", infer_request(json.dumps(doc).encode()), note="object parameter")


@st.composite
def bad_datatype(draw: st.DrawFn) -> Case:
    dts = ["FP33", "fp32", "", "BF16", "FLOAT", "INT128", "BYTES", "INT32", "BOOL", "é"]
    dt = draw(st.sampled_from(dts))
    data: Any = [1, 2, 3, 4]
    if dt == "BYTES":
        data = ["a", "b", "c", "d"]
    elif dt == "BOOL":
        data = [True, False, True, True]
    return Case("bad_datatype", infer_request(_doc(datatype=dt, data=data)), note=dt)


@st.composite
def shape_mismatch(draw: st.DrawFn) -> Case:
    r = draw(st.integers(0, 5))
    if r == 0:
        body = _doc(shape=[1, 4], data=[1.0] * draw(st.sampled_from([0, 1, 3, 5, 8])))
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
    return Case("shape_mismatch", infer_request(body), note=body[:60].decode())


_HUGE_SHAPES = [
    [2**40, 4], [10**30, 4], [2**62, 4], [-1, 4], [-5, 4], [1, 4] * 20, [0, 4, 10**20], [2**31, 4],
]  # fmt: skip


@st.composite
def huge_shape(draw: st.DrawFn) -> Case:
    shape = draw(st.sampled_from(_HUGE_SHAPES))
    if draw(st.booleans()):
        body = json.dumps({"inputs": [_inp(shape=shape, data=[1.0] * 4)]}).encode()
        return Case("huge_shape", infer_request(body), note=str(shape)[:40])
    header = json.dumps(
        {"inputs": [_inp(shape=shape, data=_DROP, parameters={"binary_data_size": 16})]}
    ).encode()
    raw = infer_request(header + b"\0" * 16, {"Inference-Header-Content-Length": str(len(header))})
    return Case("huge_shape", raw, note=f"binary {shape}"[:40])


@st.composite
def bad_binary(draw: st.DrawFn) -> Case:
    size = draw(st.sampled_from([16, 15, 17, 0, -16, 10**12]))
    header = json.dumps({"inputs": [_inp(data=_DROP, parameters={"binary_data_size": size})]})
    header = header.encode()
    blob = bytes(range(16))[: draw(st.sampled_from([16, 8, 0]))]
    if size == 16 and len(blob) == 16:
        blob += b"\0" * draw(st.integers(1, 8))  # unclaimed bytes
    body = header + blob
    too_long = str(len(body) + draw(st.integers(1, 1000)))
    hl = draw(st.sampled_from([too_long, "-1", "-" + str(len(header)), "1.5", "abc", "",
                               " " + str(len(header)), str(10**30), "0x10", None]))  # fmt: skip
    headers = {} if hl is None else {"Inference-Header-Content-Length": hl}
    return Case("bad_binary", infer_request(body, headers), note=f"size {size} header {hl!r}")


@st.composite
def unknown_model(draw: st.DrawFn) -> Case:
    names = ["nope", "EDGE", "edge ", "edg", "%00", "..%2F..", "a" * 300, "модель"]
    name = draw(st.sampled_from(names))
    path = quote(name, safe="%")
    method = draw(st.sampled_from(["infer", "meta", "ready", "stats"]))
    if method == "infer":
        raw = infer_request(_doc(), model=path)
    else:
        suffix = {"meta": "", "ready": "/ready", "stats": "/stats"}[method]
        raw = http("GET", f"/v2/models/{path}{suffix}")
    return Case("unknown_model", raw, note=name[:30])


@st.composite
def unknown_version(draw: st.DrawFn) -> Case:
    v = draw(st.sampled_from(["2", "0", "01", "latest", "-1", "1.0", "%20", "9" * 40]))
    suffix = draw(st.sampled_from(["", "/ready", "/stats", "/infer"]))
    path = f"/v2/models/{MODEL}/versions/{v}{suffix}"
    raw = http("POST", path, _doc()) if suffix == "/infer" else http("GET", path)
    return Case("unknown_version", raw, note=f"{v}{suffix}")


@st.composite
def bad_encoding(draw: st.DrawFn) -> Case:
    text = json.dumps(draw(valid_docs()))
    r = draw(st.integers(0, 3))
    if r == 0:
        body = text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    elif r == 1:
        body = b"\xef\xbb\xbf" + text.encode()
    elif r == 2:
        raw = bytearray(text.encode())
        raw[draw(st.integers(0, len(raw) - 1))] = draw(st.sampled_from([0x80, 0xC3, 0xFF, 0xFE]))
        body = bytes(raw)
    else:
        body = text.encode("latin-1").replace(b'"x"', b'"x\xe9"')
    return Case("bad_encoding", infer_request(body), note=f"variant {r}")


@st.composite
def bad_content(draw: st.DrawFn) -> Case:
    r = draw(st.integers(0, 2))
    if r == 0:  # the stage's declared input error: no rows
        body = _doc(shape=[0, 4], data=[])
    elif r == 1:  # non-finite values: accepted by the protocol, refused by the stage
        body = _doc(data=[0, 0, 0, 0]).replace(b"[0, 0, 0, 0]", b"[0, NaN, 0, Infinity]")
    else:  # a second, unknown input / a missing one
        doc = {"inputs": [_inp(), _inp(name="q")]} if draw(st.booleans()) else {"inputs": []}
        body = json.dumps(doc).encode()
    return Case("bad_content", infer_request(body), note=f"variant {r}")


_BAD_OUTPUTS: list[Any] = [
    "y", [{"name": "nope"}], [{"name": "y"}, {"name": "y"}],
    [{"name": "y", "parameters": {"binary_data": "yes"}}],
    [{"name": "y", "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 16}}],
    [{"name": "y", "parameters": {"classification": 3}}], [5],
]  # fmt: skip


@st.composite
def bad_outputs(draw: st.DrawFn) -> Case:
    outputs = draw(st.sampled_from(_BAD_OUTPUTS))
    doc = {"inputs": [_inp()], "outputs": outputs}
    return Case("bad_outputs", infer_request(json.dumps(doc).encode()), note=str(outputs)[:40])


_GARBAGE = [
    b"GET /v2 HTTP/9.9\r\nHost: x\r\n\r\n",
    b"G\x00T /v2 HTTP/1.1\r\n\r\n",
    b"GET /v2 HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n",
    b"POST /v2/models/edge/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    b"POST /v2/models/edge/infer HTTP/1.1\r\nContent-Length: 4\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzzzz",
]

#: bytes that are no HTTP request, or a request line / header HTTP/1.1 refuses
raw_garbage = st.one_of(
    st.binary(min_size=1, max_size=300).map(lambda b: b + b"\r\n\r\n"),
    st.sampled_from(_GARBAGE),
).map(lambda raw: Case("raw_garbage", raw, note=repr(raw[:30])))


@st.composite
def truncated(draw: st.DrawFn) -> Case:
    full = infer_request(json.dumps(draw(valid_docs())).encode())
    head_end = full.index(b"\r\n\r\n") + 4
    if draw(st.booleans()):
        cut = draw(st.integers(1, head_end - 2))  # inside the request line / headers
    else:
        cut = draw(st.integers(head_end, len(full) - 1))  # inside the body
    return Case("truncated", full[:cut], shut_write=True, note=f"{cut} of {len(full)} bytes")


#: kind -> its strategy
STRATEGIES: dict[str, st.SearchStrategy[Case]] = {
    "bad_json": bad_json(),
    "deep_nesting": deep_nesting(),
    "wrong_types": wrong_types(),
    "bad_params": bad_params(),
    "bad_datatype": bad_datatype(),
    "shape_mismatch": shape_mismatch(),
    "huge_shape": huge_shape(),
    "bad_binary": bad_binary(),
    "unknown_model": unknown_model(),
    "unknown_version": unknown_version(),
    "bad_encoding": bad_encoding(),
    "bad_content": bad_content(),
    "bad_outputs": bad_outputs(),
    "raw_garbage": raw_garbage,
    "truncated": truncated(),
}
KINDS = tuple(STRATEGIES)

#: any kind
cases = st.one_of(*STRATEGIES.values())
