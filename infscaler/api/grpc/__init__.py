"""The KServe v2 / Triton gRPC protocol (``inference.GRPCInferenceService``, Triton
``grpc_service.proto``) on a Unix socket beside the HTTP one
(``tritonclient.grpc.InferenceServerClient(url="unix:PATH")``): :mod:`.server` (grpcio),
:mod:`.gate` (the public socket: peer credentials and quotas; :mod:`.relay`,
:mod:`.h2frames`), :mod:`.handlers` (the methods), :mod:`.mapping` (messages <-> codec).

This ``__init__`` imports nothing, so the CLI reads :func:`default_grpc_socket` without grpcio.
"""

from __future__ import annotations

import os

__all__ = ["default_grpc_socket"]


def default_grpc_socket(http_socket: str) -> str:
    """The gRPC socket beside ``http_socket``: ``/run/infscaler/infscaler.sock`` ->
    ``/run/infscaler/infscaler-grpc.sock``."""
    root, ext = os.path.splitext(http_socket)
    return f"{root}-grpc{ext or '.sock'}"
