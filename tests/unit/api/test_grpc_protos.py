"""Triton's protocol buffers (infscaler.proto): what scripts/gen_grpc.py writes, one
compiled copy of each .proto that config.pbtxt parsing and the gRPC service share, the
messages in a private descriptor pool."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pool

from infscaler.base.triton import parse_model_config
from infscaler.proto import grpc_service_pb2 as pb
from infscaler.proto import model_config_pb2 as mc

ROOT = Path(__file__).resolve().parents[3]


def test_generated_modules_are_what_the_script_writes() -> None:
    pytest.importorskip("grpc_tools")
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_grpc
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    texts = gen_grpc.generate()
    assert sorted(texts) == ["grpc_service_pb2.py", "model_config_pb2.py"]
    for name, text in texts.items():
        assert (gen_grpc.HERE / name).read_text() == text, name


def test_one_copy_of_each_proto_one_private_pool() -> None:
    protos = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.proto"))
    protos = [p for p in protos if not p.startswith((".venv/", "build/"))]
    assert protos == ["infscaler/proto/grpc_service.proto", "infscaler/proto/model_config.proto"]
    default = descriptor_pool.Default()
    assert mc.DESCRIPTOR.pool is pb.DESCRIPTOR.pool is not default


def test_a_parsed_config_pbtxt_converts_to_the_grpc_message(tmp_path: Path) -> None:
    """A config.pbtxt read by the base is the gRPC ModelConfig message itself (one
    compiled .proto)."""
    path = tmp_path / "config.pbtxt"
    path.write_text(
        'name: "m" platform: "onnxruntime_onnx" max_batch_size: 8\n'
        'input [ { name: "a" data_type: TYPE_FP16 dims: [ 3, -1 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    )
    parsed = parse_model_config(path)
    assert type(parsed) is mc.ModelConfig
    msg = parsed
    assert msg.name == "m" and msg.max_batch_size == 8
    assert msg.input[0].data_type == mc.TYPE_FP16 and list(msg.input[0].dims) == [3, -1]
    assert msg.dynamic_batching.max_queue_delay_microseconds == 500
    assert pb.ModelConfigResponse(config=msg).config == msg
