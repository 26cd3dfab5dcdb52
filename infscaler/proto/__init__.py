"""Triton's protocol buffers, compiled once: a leaf package that imports nothing of ours.

- ``model_config.proto`` (``inference.ModelConfig``: ``config.pbtxt`` parsing in
  :mod:`infscaler.base.triton`, the gRPC ``ModelConfig`` and HTTP ``/config`` answers in
  :mod:`infscaler.api.modelconfig`) and ``grpc_service.proto`` (the KServe v2 / Triton
  gRPC messages): verbatim copies, licence header kept, of ``protobuf/`` in
  github.com/triton-inference-server/common (commit 83adf7cf88a2f343005974dff3728be746de2d66).
- ``model_config_pb2`` / ``grpc_service_pb2``: generated from them by
  ``scripts/gen_grpc.py`` (grpcio-tools' protoc); do not edit, regenerate.

The generated modules add their files to :data:`POOL`, a private descriptor pool, not
protobuf's default one, where tritonclient (or any other copy of Triton's ``.proto``
files) adds the same file and message names. The import contract ``.importlinter``
(``proto`` is the lowest layer) keeps this package a leaf.
"""

from google.protobuf import descriptor_pool

#: the pool holding ``model_config.proto`` and ``grpc_service.proto``
POOL = descriptor_pool.DescriptorPool()
