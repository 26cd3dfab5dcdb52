"""The KServe v2 / Triton gRPC protocol (``inference.GRPCInferenceService``) on a Unix
socket beside the HTTP one: ``tritonclient.grpc.InferenceServerClient(url="unix:PATH")``
connects to it directly.

- :mod:`~infscaler.api.grpc.server`: :class:`~infscaler.api.grpc.server.GrpcServer`,
  grpcio's server and its limits (imports grpcio: load it only to serve);
- :mod:`~infscaler.api.grpc.gate`: the public socket; who the client is (the kernel's
  peer credentials) and the connection quotas, in front of grpcio's server on a
  private socket; :mod:`~infscaler.api.grpc.relay` and
  :mod:`~infscaler.api.grpc.h2frames`: what it does with the HTTP/2 frames (pure);
- :mod:`~infscaler.api.grpc.handlers`: the methods, over the HTTP app's service and
  shared memory registry;
- :mod:`~infscaler.api.grpc.mapping`: the messages <-> the v2 codec (pure);
- the messages: :mod:`infscaler.proto` (Triton's ``.proto`` files compiled once).

This package's ``__init__`` imports nothing (the CLI reads :func:`default_grpc_socket`
without loading grpcio).

Source: Triton ``grpc_service.proto``.
"""

from __future__ import annotations

import os

__all__ = ["default_grpc_socket"]


def default_grpc_socket(http_socket: str) -> str:
    """The gRPC socket beside ``http_socket``: ``/run/infscaler/infscaler.sock`` ->
    ``/run/infscaler/infscaler-grpc.sock``."""
    root, ext = os.path.splitext(http_socket)
    return f"{root}-grpc{ext or '.sock'}"
