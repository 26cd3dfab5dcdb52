"""Regenerate the protobuf code of Triton's protocol (:mod:`infscaler.proto`) from its ``.proto`` files.

Usage::

    .venv/bin/pip install grpcio-tools
    .venv/bin/python scripts/gen_grpc.py           # rewrite the two files
    .venv/bin/python scripts/gen_grpc.py --check   # exit 1 when they differ

More (details, why it is so, history, figures): docs/api.md, "`scripts/gen_grpc.py`".
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "infscaler" / "proto"
PROTOS = ("model_config.proto", "grpc_service.proto")
POOL_IMPORT = "from infscaler.proto import POOL as _POOL\n"


def generate() -> dict[str, str]:
    """``{file name: text}`` of the generated, rewritten modules."""
    from grpc_tools import protoc  # the test extra: only needed to regenerate

    with tempfile.TemporaryDirectory() as out:
        rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={out}", *PROTOS])
        if rc != 0:
            raise SystemExit(f"protoc failed ({rc})")
        texts = {}
        for proto in PROTOS:
            name = proto.replace(".proto", "_pb2.py")
            text = (Path(out) / name).read_text()
            text = text.replace(
                "import model_config_pb2 as model__config__pb2",
                "from infscaler.proto import model_config_pb2 as model__config__pb2",
            )
            text = text.replace(
                "_descriptor_pool.Default().AddSerializedFile(", "_POOL.AddSerializedFile("
            )
            text = text.replace(
                "# @@protoc_insertion_point(imports)\n",
                "# @@protoc_insertion_point(imports)\n" + POOL_IMPORT,
                1,
            )
            texts[name] = text
    return texts


def main(argv: list[str]) -> int:
    texts = generate()
    if "--check" in argv:
        stale = [n for n, t in texts.items() if (HERE / n).read_text() != t]
        for n in stale:
            print(f"{HERE / n} is stale: run scripts/gen_grpc.py")
        return 1 if stale else 0
    for n, t in texts.items():
        (HERE / n).write_text(t)
        print(f"wrote {HERE / n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
