"""A model's ``inference.ModelConfig`` (Triton ``model_config.proto``), for gRPC
``ModelConfig`` and HTTP ``GET /v2/models/{name}/config``: a model served from a Triton
repository answers with its ``config.pbtxt`` as served; any other pipeline with its own
view (platform ``infscaler_pipeline``, inputs and outputs, dims -1: any size). Over HTTP:
protobuf's JSON mapping with the proto's field names and int64 values as numbers, as
Triton writes it.

Sources: Triton ``model_config.proto``, ``model_configuration.md``,
``extension_model_configuration.md``.
"""

from __future__ import annotations

from typing import Any

from infscaler.base.config import DATATYPES
from infscaler.proto import model_config_pb2 as mc

__all__ = ["config_json", "model_config"]

#: v2 datatype -> ``model_config.proto``'s ``DataType``
_CONFIG_TYPES = {
    t: mc.DataType.Value("TYPE_STRING" if t == "BYTES" else f"TYPE_{t}") for t in DATATYPES
}


def model_config(dep: Any) -> Any:
    """The ``inference.ModelConfig`` of the deployment ``dep`` (see the module)."""
    text = getattr(dep.pipeline.config, "triton_config", None)
    if text:
        from google.protobuf import text_format

        try:
            return text_format.Parse(text, mc.ModelConfig())
        except text_format.ParseError:  # not what served_config wrote: the pipeline's view
            pass
    p = dep.pipeline

    def kind(datatype: str | None) -> int:
        return _CONFIG_TYPES.get(datatype or "", mc.TYPE_INVALID)

    return mc.ModelConfig(
        name=dep.name,
        platform="infscaler_pipeline",
        input=[
            mc.ModelInput(name=i.name, data_type=kind(i.datatype), dims=list(i.shape))
            for i in p.inputs
        ],
        output=[
            mc.ModelOutput(
                name=o["name"], data_type=kind(o["datatype"]), dims=list(o["shape"] or [])
            )
            for o in p.outputs
        ],
    )


def _int64_as_numbers(msg: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (``MessageToDict`` of ``msg``) with int64 / uint64 fields as numbers."""
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = (F.CPPTYPE_INT64, F.CPPTYPE_UINT64)
    for field, value in msg.ListFields():
        key = field.name
        if key not in doc:
            continue
        if field.cpp_type in wide:
            doc[key] = [int(v) for v in doc[key]] if isinstance(doc[key], list) else int(doc[key])
        elif field.cpp_type == F.CPPTYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue  # maps of strings / messages: left as protobuf writes them
            if isinstance(doc[key], list):
                doc[key] = [_int64_as_numbers(m, d) for m, d in zip(value, doc[key], strict=True)]
            else:
                doc[key] = _int64_as_numbers(value, doc[key])
    return doc


def config_json(msg: Any) -> dict[str, Any]:
    """A ``ModelConfig`` as Triton's HTTP API writes it (see the module)."""
    from google.protobuf import json_format

    doc = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return _int64_as_numbers(msg, doc)
