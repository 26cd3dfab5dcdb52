"""Python client of a running InfScaler service: the Open Inference Protocol (KServe v2)
over HTTP on the service's Unix socket.

.. code-block:: python

    from infscaler.api.client import Client

    with Client() as c:                       # $INFSCALER_SOCKET or /run/infscaler/infscaler.sock
        res = c.infer("ocr", {"image": rgb})  # rgb: HxWx3 uint8
        print(res.outputs["texts"], res.parameters["latency_ms"])

Sources: the KServe / Triton ``protocol/`` docs; httpx's ``HTTPTransport(uds=...)``.
More: docs/api.md, "`infscaler/api/client.py`".
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from infscaler.api.codec import (
    HEADER_LENGTH,
    InferResult,
    ProtocolError,
    RequestedOutput,
    ShmOutput,
    ShmTensor,
    decode_infer_response,
    encode_infer_request,
)
from infscaler.base.errors import InfScalerError

__all__ = [
    "DEFAULT_SOCKET",
    "Client",
    "InferResult",
    "InferenceServerError",
    "ShmOutput",
    "ShmTensor",
    "default_socket_path",
    "unreachable",
]

#: The service's socket under systemd (``RuntimeDirectory=infscaler``).
DEFAULT_SOCKET = "/run/infscaler/infscaler.sock"
START_HINT = "start it with `infscaler serve` (or systemctl start infscaler), or pass --socket"
STATUS_HINTS = {
    413: "pass large tensors through system shared memory (ShmTensor / ShmOutput)",
    503: "the service or model is not ready, overloaded or stopping; retry later",
}
_BASE_URL = "http://infscaler"


def default_socket_path() -> str:
    """``$INFSCALER_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return os.environ.get("INFSCALER_SOCKET") or DEFAULT_SOCKET


class InferenceServerError(InfScalerError):
    """The service answered with an error: ``status`` (HTTP), ``message`` (the error
    JSON's ``error``) and ``code`` (a refusal's reason code, docs/api.md "Refusal codes"; or None)."""

    def __init__(
        self, message: str, status: int, hint: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, hint)
        self.status = status
        self.code = code

    @classmethod
    def from_body(cls, status: int, reason: str, body: bytes) -> InferenceServerError:
        """From an answer's status, reason and body: the body's ``{"error": ...}``, else its
        first 500 characters, else ``HTTP <status> <reason>``."""
        message = code = None
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and isinstance(doc.get("error"), str):
                message = doc["error"]
                c = doc.get("code")
                code = c if isinstance(c, str) and 0 < len(c) <= 32 else None
        except ValueError:
            pass
        if message is None:
            text = body.decode("utf-8", "replace").strip()
            message = text[:500] or f"HTTP {status} {reason}"
        return cls(message, status, STATUS_HINTS.get(status), code)

    @classmethod
    def from_response(cls, resp: Any) -> InferenceServerError:
        """From an ``httpx.Response`` (or anything with ``status_code``,
        ``reason_phrase`` and ``content``)."""
        return cls.from_body(resp.status_code, resp.reason_phrase, resp.content)


def unreachable(socket_path: str, exc: BaseException) -> InfScalerError:
    """The error for a service that cannot be reached at ``socket_path``, saying why (no
    socket, not a socket, permission denied: with the group to join, or the connect error)."""
    hint = START_HINT
    try:
        mode: int | None = os.stat(socket_path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError:
        mode = -1  # cannot look: let the connect error speak
    if mode is None:
        reason = "no socket there"
    elif mode != -1 and not stat.S_ISSOCK(mode):
        reason = "the path exists but is not a socket"
        hint = "pass the service's socket with --socket (or $INFSCALER_SOCKET)"
    elif isinstance(exc, PermissionError) or "ermission denied" in str(exc):
        reason = "permission denied"
        hint = (
            "add your user to the service's group (e.g. `sudo usermod -aG infscaler $USER`, "
            "then log in again), or run as that user"
        )
    else:
        reason = str(exc) or type(exc).__name__
    return InfScalerError(
        f"cannot connect to the InfScaler service at {socket_path}: {reason}", hint=hint
    )


def _q(name: str) -> str:
    """``name`` as one URL path segment (every reserved character escaped)."""
    return quote(str(name), safe="")


def _resolve_stage_paths(data: Any, base: Path) -> Any:
    """Relative ``model`` / ``plan`` paths of a pipeline file's stages made absolute
    against the file's directory (the service has its own working directory). Bundled
    aliases and paths that do not exist there are left alone."""
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        return data
    for stage in data["stages"]:
        if not isinstance(stage, dict):
            continue
        for key in ("model", "plan"):
            v = stage.get(key)
            if isinstance(v, str) and not os.path.isabs(v) and (base / v).exists():
                stage[key] = str((base / v).resolve())
    return data


class Client:
    """A synchronous client of the InfScaler service on its Unix socket.

    Args:
        socket_path: default ``$INFSCALER_SOCKET``, else ``/run/infscaler/infscaler.sock``.
        timeout: seconds to wait for each answer (``load`` / ``unload`` wait longer).
        transport: an httpx transport instead of the Unix socket (tests).

    Raises (from every call):
        InfScalerError: the service cannot be reached, or did not answer in time.
        InferenceServerError: the service answered with an error.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.socket_path = str(socket_path) if socket_path is not None else default_socket_path()
        self.timeout = timeout
        self._http = httpx.Client(
            transport=transport or httpx.HTTPTransport(uds=self.socket_path),
            base_url=_BASE_URL,
            timeout=timeout,
        )

    # -- plumbing ---------------------------------------------------------------------

    def _unreachable(self, exc: Exception) -> InfScalerError:
        return unreachable(self.socket_path, exc)

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        content: bytes | Iterator[memoryview] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request on the kept-alive connection pool: ``json_body`` as JSON, or ``content``
        bytes / an iterator of buffers; ``timeout`` seconds (None: the client's).

        Raises:
            InfScalerError: unreachable, the connection lost, or no answer in time.
            InferenceServerError: the service answered 400 or above.
        """
        if json_body is not None:
            content = json.dumps(json_body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        try:
            resp = self._send(method, path, content, headers, timeout)
        except httpx.ConnectError as exc:
            raise self._unreachable(exc) from None
        except httpx.TimeoutException:
            raise InfScalerError(
                f"the InfScaler service at {self.socket_path} did not answer {method} {path} "
                f"within {timeout or self.timeout:g} s",
                hint="it may be overloaded; raise the client's timeout",
            ) from None
        except httpx.TransportError as exc:
            raise InfScalerError(
                f"lost the connection to the InfScaler service at {self.socket_path} during "
                f"{method} {path}: {exc or type(exc).__name__}",
                hint="the service may have stopped; check `systemctl status infscaler` or its log",
            ) from None
        if resp.status_code >= 400:
            raise InferenceServerError.from_response(resp)
        return resp

    def _send(
        self,
        method: str,
        path: str,
        content: bytes | Iterator[memoryview] | None,
        headers: Mapping[str, str] | None,
        timeout: float | None,
    ) -> httpx.Response:
        """Send once; an idempotent request (GET / HEAD) whose kept-alive connection was closed
        as it was reused is sent once more (RFC 9110 section 9.2.2)."""
        t = timeout if timeout is not None else self.timeout
        try:
            return self._http.request(method, path, content=content, headers=headers, timeout=t)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            if method not in ("GET", "HEAD"):
                raise
        return self._http.request(method, path, content=content, headers=headers, timeout=t)

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = self.request(method, path, **kw)
        if not resp.content:
            return {}
        try:
            return resp.json()
        except ValueError:
            raise InfScalerError(
                f"the service answered {method} {path} with something that is not JSON: "
                f"{resp.text[:200]!r}"
            ) from None

    # -- health and metadata ----------------------------------------------------------

    def is_live(self) -> bool:
        """``GET /v2/health/live``: True if the service answers 200; False otherwise or unreachable."""
        return self._probe("/v2/health/live")

    def is_ready(self) -> bool:
        """``GET /v2/health/ready``: True when every deployed pipeline is ready."""
        return self._probe("/v2/health/ready")

    def _probe(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except InfScalerError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        """``GET /v2/infscaler/status``: the whole service."""
        return self._json("GET", "/v2/infscaler/status")

    def models(self) -> list[dict[str, Any]]:
        """``GET /v2/models``: the deployed pipelines (``name``, ``state``, ``ready``, ...)."""
        return self._json("GET", "/v2/models").get("models", [])

    def model_metadata(self, name: str) -> dict[str, Any]:
        """``GET /v2/models/{name}``: ``name``, ``inputs`` / ``outputs``, ``parameters``.

        Raises:
            InferenceServerError: 404 for an unknown model.
        """
        return self._json("GET", f"/v2/models/{_q(name)}")

    def _load_mapping(
        self, name: str, config: Mapping[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        """``POST /v2/repository/models/{name}/load`` with the config as JSON; the answer."""
        body = {"parameters": {"config": json.dumps(dict(config), default=str)}}
        return self._json(
            "POST", f"/v2/repository/models/{_q(name)}/load", json_body=body, timeout=timeout
        )

    def unload(self, name: str, *, timeout: float | None = 900.0) -> None:
        """Drain and remove pipeline ``name`` (``POST /v2/repository/models/{name}/unload``).

        Raises:
            InferenceServerError: 404 for an unknown model.
        """
        self._json(
            "POST", f"/v2/repository/models/{_q(name)}/unload", json_body={}, timeout=timeout
        )

    def server_metadata(self) -> dict[str, Any]:
        """``GET /v2``: ``{"name", "version", "extensions"}``."""
        return self._json("GET", "/v2")

    def model_ready(self, name: str) -> bool:
        """``GET /v2/models/{name}/ready``: True (200) or False (503).

        Raises:
            InferenceServerError: 404 for an unknown model.
        """
        try:
            self.request("GET", f"/v2/models/{_q(name)}/ready")
        except InferenceServerError as exc:
            if exc.status == 503:
                return False
            raise
        return True

    # -- inference --------------------------------------------------------------------

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray | ShmTensor],
        *,
        outputs: Sequence[str] | Mapping[str, ShmOutput | None] | None = None,
        binary: bool = True,
        parameters: Mapping[str, Any] | None = None,
        request_id: str | None = None,
        decode_bytes: bool = True,
        timeout: float | None = None,
    ) -> InferResult:
        """``POST /v2/models/{name}/infer``: run one request.

        Args:
            inputs: name -> numpy array (BYTES from ``U`` / ``S`` / ``object``), or
                :class:`ShmTensor` for data in a registered shared memory region.
            outputs: which outputs to return (default: all): names, or name ->
                :class:`ShmOutput` (written to shared memory) / None (in the body).
            binary: tensors as binary data (default) or JSON.
            parameters: request parameters, e.g. ``{"timeout_ms": 200}``.
            request_id: echoed back as ``InferResult.id``.
            decode_bytes: BYTES outputs as ``str`` where valid UTF-8; False: all ``bytes``.
            timeout: seconds to wait (default: the client's).

        Returns:
            :class:`InferResult`: ``outputs``, ``parameters`` (``latency_ms``, per unit
            ``unit_ms``), ``shm_outputs``.

        Raises:
            InferenceServerError: 400, 404, 413, 500, 503 (the server's message).
            InfScalerError: an input dtype the protocol cannot carry; unreachable service.
        """
        requested: list[RequestedOutput] | None = None
        if outputs is not None:
            if isinstance(outputs, str):
                outputs = [outputs]
            items = (
                outputs.items() if isinstance(outputs, Mapping) else ((n, None) for n in outputs)
            )
            requested = []
            for out_name, dest in items:
                if isinstance(dest, ShmOutput):
                    shm = (dest.region, int(dest.offset), int(dest.byte_size))
                    requested.append(RequestedOutput(out_name, False, shm))
                elif dest is None:
                    requested.append(RequestedOutput(out_name, binary, None))
                else:
                    raise InfScalerError(
                        f"outputs[{out_name!r}] must be a ShmOutput or None, got {type(dest).__name__}"
                    )
        parts, headers = encode_infer_request(
            inputs,
            outputs=requested,
            binary=binary,
            binary_output=binary,
            request_id=request_id,
            parameters=parameters,
            join=False,
        )
        body, headers = _streamed(parts, headers)
        resp = self.request(
            "POST", f"/v2/models/{_q(name)}/infer", content=body, headers=headers, timeout=timeout
        )
        h = resp.headers.get(HEADER_LENGTH)
        try:
            result = decode_infer_response(
                resp.content, header_length=int(h) if h is not None else None
            )
        except (ProtocolError, ValueError) as exc:
            raise InfScalerError(f"malformed inference response from the service: {exc}") from None
        if decode_bytes:
            for k, v in result.outputs.items():
                if v.dtype == object:
                    result.outputs[k] = _decode_utf8(v)
        return result

    def infer_task(
        self,
        task: str,
        inputs: Mapping[str, np.ndarray | ShmTensor],
        *,
        latency_ms: float | None = None,
        min_accuracy: float | None = None,
        parameters: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> InferResult:
        """A model-less query (INFaaS): :meth:`infer` with parameters ``latency_ms`` and
        ``min_accuracy``; the result's parameters name the chosen ``variant``, whether it
        ``meets_requirements``, the ``selection`` branch and ``selection_reason``.

        Raises:
            InferenceServerError: 404 unknown task, 400 bad requirements, and as :meth:`infer`.
        """
        params = dict(parameters or {})
        if latency_ms is not None:
            params["latency_ms"] = latency_ms
        if min_accuracy is not None:
            params["min_accuracy"] = min_accuracy
        return self.infer(task, inputs, parameters=params, **kw)

    # -- statistics and status --------------------------------------------------------

    def stats(self, name: str | None = None) -> dict[str, Any]:
        """``GET /v2/models/{name}/stats`` (all: ``/v2/models/stats``): ``{"model_stats": [...]}``."""
        path = "/v2/models/stats" if name is None else f"/v2/models/{_q(name)}/stats"
        return self._json("GET", path)

    # -- model repository -------------------------------------------------------------

    def repository_index(self) -> list[dict[str, Any]]:
        """``POST /v2/repository/index``: ``[{"name", "version", "state", "reason"}]``."""
        return self._json("POST", "/v2/repository/index", json_body={})

    def load(
        self,
        name: str,
        config: Mapping[str, Any] | str | os.PathLike[str],
        *,
        timeout: float | None = 900.0,
    ) -> dict[str, Any]:
        """Deploy (or replace) pipeline ``name``: ``POST /v2/repository/models/{name}/load``.

        Args:
            config: a mapping; a YAML / JSON file path (its stages' relative ``model`` /
                ``plan`` paths made absolute against its directory); or YAML / JSON text
                (a string with a newline or starting with ``{``).
            timeout: seconds to wait (partitioning can take minutes); None: forever.

        Returns:
            The service's answer, e.g. ``{"name", "loaded": true, "seconds"}``.

        Raises:
            InfScalerError: an unreadable or invalid file.
            InferenceServerError: 400 an invalid pipeline (the message names the fault).
        """
        import yaml

        if isinstance(config, Mapping):
            data: Any = dict(config)
        elif isinstance(config, str) and ("\n" in config or config.lstrip().startswith("{")):
            try:
                data = yaml.safe_load(config)
            except yaml.YAMLError as exc:
                raise InfScalerError(f"the pipeline text is not valid YAML / JSON: {exc}") from None
        else:
            path = Path(config)
            if not path.is_file():
                raise InfScalerError(
                    f"pipeline file not found: {path}", hint="pass a pipeline.yaml"
                )
            try:
                data = yaml.safe_load(path.read_text())
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
                raise InfScalerError(f"cannot read pipeline file {path}: {exc}") from None
            data = _resolve_stage_paths(data, path.resolve().parent)
        if not isinstance(data, dict):
            raise InfScalerError(f"a pipeline must be a mapping, got {type(data).__name__}")
        return self._load_mapping(name, data, timeout)

    # -- system shared memory ---------------------------------------------------------

    def register_system_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """``POST /v2/systemsharedmemory/region/{name}/register``: ``byte_size`` bytes at
        ``offset`` of shm object ``key`` as region ``name``.

        Raises:
            InferenceServerError: 400: a missing object, a range beyond it, a taken name.
        """
        body = {"key": key, "offset": int(offset), "byte_size": int(byte_size)}
        self._json("POST", f"/v2/systemsharedmemory/region/{_q(name)}/register", json_body=body)

    def unregister_system_shm(self, name: str | None = None) -> None:
        """``POST /v2/systemsharedmemory[/region/{name}]/unregister`` (None: all)."""
        path = (
            "/v2/systemsharedmemory/unregister"
            if name is None
            else f"/v2/systemsharedmemory/region/{_q(name)}/unregister"
        )
        self._json("POST", path)

    def system_shm_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """``GET /v2/systemsharedmemory[/region/{name}]/status``.

        Raises:
            InferenceServerError: 404 for an unregistered name.
        """
        path = (
            "/v2/systemsharedmemory/status"
            if name is None
            else f"/v2/systemsharedmemory/region/{_q(name)}/status"
        )
        return self._json("GET", path)

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.socket_path!r})"


#: bytes per socket write of a large body: httpcore's sync ``write`` re-slices (copies)
#: what is left of a ``bytes`` body after every partial ``send``, which is quadratic in
#: the body size; pieces this big keep every copy small.
_SEND_CHUNK = 256 << 10


def _streamed(parts: list[Any], headers: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """The body for httpx: one small part as is, else zero-copy slices of ``_SEND_CHUNK``
    bytes with an explicit ``Content-Length``."""
    total = sum(len(p) for p in parts)
    if total <= _SEND_CHUNK:
        return b"".join(parts), headers

    def pieces() -> Iterator[memoryview]:
        for p in parts:
            mv = memoryview(p).cast("B")
            for i in range(0, len(mv), _SEND_CHUNK):
                yield mv[i : i + _SEND_CHUNK]

    return pieces(), {**headers, "Content-Length": str(total)}


def _decode_utf8(arr: Any) -> Any:
    """An object array with each ``bytes`` element that is valid UTF-8 as ``str``."""
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        if isinstance(v, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                v = v.decode("utf-8")
        flat_out[i] = v
    return out
