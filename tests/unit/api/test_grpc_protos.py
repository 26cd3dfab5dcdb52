"""The gRPC service's generated protobuf code: what scripts/gen_grpc.py writes, with
Triton's model_config.proto from its one copy (infscaler/base/proto/, which config.pbtxt
parsing compiles too), the messages in a private descriptor pool."""

from __future__ import annotations

import base64
import sys
import zlib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from infscaler.api.grpc import grpc_service_pb2 as pb
from infscaler.api.grpc import model_config_pb2 as mc
from infscaler.base.triton import parse_model_config
from infscaler.base.triton_descriptor import DESCRIPTOR_SET_B64

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


def _without_json_names(
    f: descriptor_pb2.FileDescriptorProto,
) -> descriptor_pb2.FileDescriptorProto:
    """``f`` without ``json_name`` (protoc's descriptor sets carry it, ``_pb2`` modules
    do not): the messages, fields, numbers and types."""

    def strip(messages) -> None:
        for m in messages:
            for field in m.field:
                field.ClearField("json_name")
            strip(m.nested_type)

    out = descriptor_pb2.FileDescriptorProto()
    out.CopyFrom(f)
    strip(out.message_type)
    return out


def test_one_model_config_proto_both_pools_private() -> None:
    assert not (ROOT / "infscaler" / "api" / "grpc" / "model_config.proto").exists()
    assert (ROOT / "infscaler" / "base" / "proto" / "model_config.proto").is_file()
    files = descriptor_pb2.FileDescriptorSet.FromString(
        zlib.decompress(base64.b64decode("".join(DESCRIPTOR_SET_B64)))
    )
    (base_file,) = [f for f in files.file if f.name == "model_config.proto"]
    api_file = descriptor_pb2.FileDescriptorProto()
    mc.DESCRIPTOR.CopyToProto(api_file)
    assert _without_json_names(api_file) == _without_json_names(base_file)
    default = descriptor_pool.Default()
    assert mc.DESCRIPTOR.pool is pb.DESCRIPTOR.pool is not default


def test_a_parsed_config_pbtxt_converts_to_the_grpc_message(tmp_path: Path) -> None:
    """A config.pbtxt read by the base's pool serialises into the gRPC ModelConfig
    unchanged (same wire format: one .proto)."""
    path = tmp_path / "config.pbtxt"
    path.write_text(
        'name: "m" platform: "onnxruntime_onnx" max_batch_size: 8\n'
        'input [ { name: "a" data_type: TYPE_FP16 dims: [ 3, -1 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
    )
    parsed = parse_model_config(path)
    msg = mc.ModelConfig.FromString(parsed.SerializeToString())
    assert msg.name == "m" and msg.max_batch_size == 8
    assert msg.input[0].data_type == mc.TYPE_FP16 and list(msg.input[0].dims) == [3, -1]
    assert msg.dynamic_batching.max_queue_delay_microseconds == 500
    assert pb.ModelConfigResponse(config=msg).config == msg
