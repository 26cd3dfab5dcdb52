"""A small HTTP/1.1 client of the service's Unix socket, standard library only.

What the CLI's client commands (``status``, ``probe``, ``deploy``, ``undeploy``,
``infer``) use, so they start without httpx / anyio (about 0.1 s of imports on a
Jetson-class CPU). One connection per request (``Connection: close``); an answer's body by
``Content-Length``, ``Transfer-Encoding: chunked`` or to the end of the connection
(RFC 9112 section 6.3); its head bounded (64 KiB a line, 200 lines). Errors as :class:`~infscaler.api.client.Client`'s: a service that answers
400 and above raises :class:`InferenceServerError` (status and the ``error`` string of
its JSON); one that cannot be reached raises
:class:`~infscaler.base.errors.InfScalerError` saying how to start it.

``infer`` sends tensors as binary tensor data (``extension_binary_data.md``, as
:func:`~infscaler.api.codec.encode_infer_request` encodes them) and imports numpy and the
codec only when called.

Raw sockets rather than ``http.client``, whose imports (``email``, ``ssl``) cost another
15 ms. Sources: RFC 9112 (HTTP/1.1 message syntax, chunked transfer coding); the KServe
/ Triton v2 REST protocol.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from infscaler.base.errors import InfScalerError

__all__ = [
    "DEFAULT_SOCKET",
    "InferenceServerError",
    "UdsClient",
    "UdsResponse",
    "V2Calls",
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
_HEADER_LENGTH = "Inference-Header-Content-Length"


def default_socket_path() -> str:
    """``$INFSCALER_SOCKET``, else :data:`DEFAULT_SOCKET`."""
    return os.environ.get("INFSCALER_SOCKET") or DEFAULT_SOCKET


class InferenceServerError(InfScalerError):
    """The service answered with an error.

    Attributes:
        status: the HTTP status (400 bad request, 404 unknown model / region, 409, 413
            body too large, 500 a stage failed, 503 not ready / overloaded / stopping).
        message: the ``error`` string of the service's error JSON.
        code: a refusal's reason code (the error JSON's ``code``: ``slo``,
            ``queue_full``, ...; docs/api.md "Refusal codes"), or None.
    """

    def __init__(
        self, message: str, status: int, hint: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, hint)
        self.status = status
        self.code = code

    @classmethod
    def from_body(cls, status: int, reason: str, body: bytes) -> InferenceServerError:
        """From an answer's status, reason phrase and body: the body's ``{"error": ...}``,
        else its first 500 characters, else ``HTTP <status> <reason>``."""
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
    """The error for a service that cannot be reached at ``socket_path``: no socket there,
    a path that is not a socket, permission denied (with the group to join), or the
    connect error itself (``[Errno 111] Connection refused``: nothing listens)."""
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


class _BadAnswer(Exception):
    """An answer that is not HTTP/1.x as this client reads it."""


#: Bounds on an answer's head: the status line and each header line (bytes), the count
#: of header lines.
_MAX_LINE = 65536
_MAX_HEADERS = 200


def _line(f: Any) -> bytes:
    line = f.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise _BadAnswer("a header line over 64 KiB")
    if not line:
        raise _BadAnswer("the service closed the connection without an answer")
    return line


def _read_answer(f: Any) -> tuple[int, str, dict[str, str], bytes]:
    """Status, reason, headers (lower-case names) and body of one HTTP/1.x answer read
    from the binary file ``f``: the body by ``Transfer-Encoding: chunked``, else
    ``Content-Length``, else to the end of the connection (RFC 9112 section 6.3)."""
    version, _, rest = _line(f).decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise _BadAnswer(f"not an HTTP/1.x status line: {version} {rest}"[:200])
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS + 1):
        line = _line(f).decode("latin-1").rstrip("\r\n")
        if not line:
            break
        k, sep, v = line.partition(":")
        if not sep:
            raise _BadAnswer(f"a header line without a colon: {line[:100]!r}")
        headers[k.strip().lower()] = v.strip()
    else:
        raise _BadAnswer(f"more than {_MAX_HEADERS} header lines")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_text = _line(f).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _BadAnswer(f"a bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                while _line(f).strip():  # trailers up to the blank line
                    pass
                return int(code), reason, headers, bytes(body)
            chunk = f.read(size)
            if len(chunk) < size:
                raise _BadAnswer("the answer ended inside a chunk")
            body += chunk
            f.read(2)  # the CRLF after the chunk
    if "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise _BadAnswer(f"a bad Content-Length {headers['content-length']!r}") from None
        body_bytes = f.read(n)
        if len(body_bytes) < n:
            raise _BadAnswer(f"the answer ended after {len(body_bytes)} of {n} bytes")
        return int(code), reason, headers, body_bytes
    return int(code), reason, headers, f.read()


class UdsResponse:
    """An answer: ``status`` (int), ``reason``, ``headers`` (lower-case names -> values)
    and the whole ``body`` (bytes)."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status, self.reason, self.headers, self.body = status, reason, headers, body


def _q(name: str) -> str:
    return quote(str(name), safe="")


class V2Calls:
    """The v2 calls both clients (:class:`UdsClient` and
    :class:`~infscaler.api.client.Client`) make the same way, over two transport hooks
    each client defines: ``_v2_send(method, path)`` (raises as the client's requests
    do) and ``_v2_json(method, path, doc, timeout)`` (``doc`` as the JSON body when not
    None; the answer's JSON, ``{}`` for an empty body; ``timeout`` seconds, None: the
    client's). Sources: the KServe / Triton v2 REST protocol (health, metadata, model
    repository extension)."""

    def _v2_send(self, method: str, path: str) -> Any:
        raise NotImplementedError

    def _v2_json(
        self, method: str, path: str, doc: Any = None, timeout: float | None = None
    ) -> Any:
        raise NotImplementedError

    def is_live(self) -> bool:
        """``GET /v2/health/live``: True if the service answers 200; False if it answers
        otherwise or cannot be reached (so ``while not c.is_live()`` can wait for it)."""
        return self._probe("/v2/health/live")

    def is_ready(self) -> bool:
        """``GET /v2/health/ready``: True when every deployed pipeline is ready; False if
        not (503) or the service cannot be reached."""
        return self._probe("/v2/health/ready")

    def _probe(self, path: str) -> bool:
        try:
            self._v2_send("GET", path)
        except InfScalerError:
            return False
        return True

    def status(self) -> dict[str, Any]:
        """``GET /v2/infscaler/status``: the whole service: control path, tensor pool,
        pipelines with their stages and instances."""
        return self._v2_json("GET", "/v2/infscaler/status")

    def models(self) -> list[dict[str, Any]]:
        """``GET /v2/models``: the deployed pipelines (``name``, ``state``, ``ready``, ...)."""
        return self._v2_json("GET", "/v2/models").get("models", [])

    def model_metadata(self, name: str) -> dict[str, Any]:
        """``GET /v2/models/{name}``: ``name``, ``inputs`` / ``outputs`` (``name``,
        ``datatype``, ``shape``), ``parameters``.

        Raises:
            InferenceServerError: 404 for an unknown model.
        """
        return self._v2_json("GET", f"/v2/models/{_q(name)}")

    def _load_mapping(
        self, name: str, config: Mapping[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        """``POST /v2/repository/models/{name}/load`` with ``{"parameters": {"config":
        "<config as JSON>"}}``; the answer (``{"name", "loaded", "seconds"}``)."""
        body = {"parameters": {"config": json.dumps(dict(config), default=str)}}
        return self._v2_json("POST", f"/v2/repository/models/{_q(name)}/load", body, timeout)

    def unload(self, name: str, *, timeout: float | None = 900.0) -> None:
        """Drain and remove pipeline ``name``: ``POST /v2/repository/models/{name}/unload``.

        Raises:
            InferenceServerError: 404 for an unknown model.
        """
        self._v2_json("POST", f"/v2/repository/models/{_q(name)}/unload", {}, timeout)


class UdsClient(V2Calls):
    """A synchronous client of the service on its Unix socket, standard library only.

    Args:
        socket_path: the service's socket; default ``$INFSCALER_SOCKET``, else
            ``/run/infscaler/infscaler.sock``.
        timeout: seconds to wait for each answer (``load`` / ``unload`` wait longer).

    Raises (from every call):
        InfScalerError: the service cannot be reached, the connection was lost, or it
            did not answer in time.
        InferenceServerError: the service answered 400 or above.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *, timeout: float = 60.0):
        self.socket_path = str(socket_path) if socket_path is not None else default_socket_path()
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: bytes | Iterable[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> UdsResponse:
        """One request; ``body`` bytes, or parts (bytes / buffers) sent one after the other
        with their total as ``Content-Length``; ``timeout`` seconds (None: the client's).

        Raises:
            InfScalerError, InferenceServerError: as the class says.
        """
        wait = self.timeout if timeout is None else timeout
        parts = [body] if isinstance(body, bytes) else list(body or ())
        hdrs = {"Host": "infscaler", "Connection": "close", **(headers or {})}
        hdrs["Content-Length"] = str(sum(memoryview(p).nbytes for p in parts))
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(wait)
            try:
                sock.connect(self.socket_path)
            except OSError as exc:
                raise unreachable(self.socket_path, exc) from None
            sock.sendall((head + "\r\n").encode("latin-1"))
            for p in parts:
                sock.sendall(p)
            with sock.makefile("rb") as f:
                status, reason, headers_out, data = _read_answer(f)
        except TimeoutError:
            raise InfScalerError(
                f"the InfScaler service at {self.socket_path} did not answer {method} {path} "
                f"within {wait:g} s",
                hint="it may be overloaded; raise the client's timeout",
            ) from None
        except (OSError, _BadAnswer) as exc:
            raise InfScalerError(
                f"lost the connection to the InfScaler service at {self.socket_path} during "
                f"{method} {path}: {exc or type(exc).__name__}",
                hint="the service may have stopped; check `systemctl status infscaler` or its log",
            ) from None
        finally:
            sock.close()
        if status >= 400:
            raise InferenceServerError.from_body(status, reason, data)
        return UdsResponse(status, reason, headers_out, data)

    def json(self, method: str, path: str, doc: Any = None, **kw: Any) -> Any:
        """A request with ``doc`` as its JSON body (when given); the answer's JSON
        (``{}`` for an empty body).

        Raises:
            InfScalerError: an answer that is not JSON; and as :meth:`request`.
        """
        headers = None
        body = None
        if doc is not None:
            body = json.dumps(doc).encode()
            headers = {"Content-Type": "application/json"}
        resp = self.request(method, path, body, headers, **kw)
        if not resp.body:
            return {}
        try:
            return json.loads(resp.body)
        except ValueError:
            raise InfScalerError(
                f"the service answered {method} {path} with something that is not JSON: "
                f"{resp.body[:200]!r}"
            ) from None

    def _v2_send(self, method: str, path: str) -> UdsResponse:
        return self.request(method, path)

    def _v2_json(
        self, method: str, path: str, doc: Any = None, timeout: float | None = None
    ) -> Any:
        return self.json(method, path, doc, timeout=timeout)

    # -- the calls the CLI makes (as Client's; the shared ones: V2Calls) --------------

    def load(
        self, name: str, config: Mapping[str, Any], *, timeout: float | None = 900.0
    ) -> dict[str, Any]:
        """``POST /v2/repository/models/{name}/load`` with the pipeline ``config`` (a
        mapping, as JSON in ``parameters.config``); ``{"name", "loaded", "seconds"}``.
        Raises InferenceServerError 400 for an invalid pipeline."""
        return self._load_mapping(name, config, timeout)

    def infer(
        self,
        name: str,
        inputs: Mapping[str, Any],
        *,
        parameters: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """``POST /v2/models/{name}/infer`` with ``inputs`` (name -> numpy array) as binary
        tensor data, every output asked for in binary; BYTES outputs decoded as UTF-8
        ``str`` where valid (as :meth:`Client.infer`).

        Returns:
            :class:`~infscaler.api.codec.InferResult`.

        Raises:
            InferenceServerError: 400 a bad input, 404 unknown model, 413, 500, 503.
            InfScalerError: an input dtype the protocol cannot carry; a malformed answer.
        """
        from infscaler.api.codec import ProtocolError, decode_infer_response, encode_infer_request

        parts, headers = encode_infer_request(
            inputs, binary=True, binary_output=True, parameters=parameters, join=False
        )
        resp = self.request("POST", f"/v2/models/{_q(name)}/infer", parts, headers, timeout=timeout)
        h = resp.headers.get(_HEADER_LENGTH.lower())
        try:
            result = decode_infer_response(resp.body, header_length=int(h) if h else None)
        except (ProtocolError, ValueError) as exc:
            raise InfScalerError(f"malformed inference response from the service: {exc}") from None
        for k, v in result.outputs.items():
            if v.dtype == object:
                result.outputs[k] = _decode_utf8(v)
        return result

    def infer_task(
        self,
        task: str,
        inputs: Mapping[str, Any],
        *,
        latency_ms: float | None = None,
        min_accuracy: float | None = None,
        **kw: Any,
    ) -> Any:
        """A model-less query: :meth:`infer` on ``task`` with parameters ``latency_ms``
        and ``min_accuracy``; the service picks the variant."""
        params: dict[str, Any] = {}
        if latency_ms is not None:
            params["latency_ms"] = latency_ms
        if min_accuracy is not None:
            params["min_accuracy"] = min_accuracy
        return self.infer(task, inputs, parameters=params, **kw)

    def close(self) -> None:
        """Nothing to close (one connection per request); for ``with``."""

    def __enter__(self) -> UdsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"UdsClient({self.socket_path!r})"


def _decode_utf8(arr: Any) -> Any:
    """An object array with each ``bytes`` element that is valid UTF-8 as ``str``."""
    import numpy as np

    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        if isinstance(v, bytes):
            with contextlib.suppress(UnicodeDecodeError):
                v = v.decode("utf-8")
        flat_out[i] = v
    return out
