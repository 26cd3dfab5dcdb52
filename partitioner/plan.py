"""The plan directory: ``plan.yaml`` + ``part_<k>.onnx`` (output of ``infscaler partition``).

``plan.yaml`` holds the model's hash and shapes, the SLO, the cuts and their crossing
tensors, and per partition B_k (InfScaler §IV-A), FLOPs, memory (MB), latency per engine
(A_k^m; missing engines with the reason) and the verification error.
:func:`write_plan` writes it atomically; :func:`read_plan` loads and checks it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import yaml

from infscaler.base.errors import InfScalerError, PartitionError

PLAN_FILE = "plan.yaml"
PLAN_FORMAT = 1


@dataclass
class Plan:
    """A partition plan: ``summary`` (``plan.yaml``'s content) and ``parts`` in chain order."""

    summary: dict[str, Any]
    parts: list[onnx.ModelProto] = field(default_factory=list)

    @property
    def num_partitions(self) -> int:
        return len(self.summary["partitions"])

    @property
    def cuts(self) -> list[int]:
        return [c["after_operator"] for c in self.summary["cuts"]]


def check_output_dir(out_dir: Path, *, force: bool = False) -> None:
    """Refuse an output directory :func:`write_plan` must not touch (checked first and last).

    Raises:
        PartitionError: ``out_dir`` is a file, holds non-plan files, or a plan without ``force``.
    """
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise PartitionError(f"output path {out_dir} exists and is not a directory")
    if not any(out_dir.iterdir()):
        return
    if not (out_dir / PLAN_FILE).is_file():
        raise PartitionError(
            f"output directory {out_dir} is not empty and holds no plan; refusing to write into it",
            hint="choose a new directory with -o",
        )
    if not force:
        raise PartitionError(
            f"output directory {out_dir} already holds a plan",
            hint="pass --force to replace it, or choose another directory with -o",
        )


def write_plan(
    plan: Plan,
    out_dir: Path,
    *,
    force: bool = False,
    save: Callable[[onnx.ModelProto, Path], None] | None = None,
    staged: Path | None = None,
) -> Path:
    """Write ``plan`` to ``out_dir`` atomically (temp dir + rename); returns ``out_dir``.

    Args:
        save: writes one part (default ``onnx.save``).
        staged: a directory beside ``out_dir`` already holding the parts (consumed).

    Raises:
        PartitionError: as :func:`check_output_dir`.
    """
    out_dir = Path(out_dir)
    check_output_dir(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if staged is not None:
        tmp = Path(staged)
        missing = [m["file"] for m in plan.summary["partitions"] if not (tmp / m["file"]).is_file()]
        if missing:
            raise PartitionError(f"staged plan directory {tmp} lacks {', '.join(missing)}")
    else:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if staged is None:
            saver = save or (lambda m, p: onnx.save(m, str(p)))
            for part, meta in zip(plan.parts, plan.summary["partitions"], strict=True):
                saver(part, tmp / meta["file"])
        with open(tmp / PLAN_FILE, "w") as f:
            yaml.safe_dump(plan.summary, f, sort_keys=False, width=100)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_plan(plan_dir: Path, load_parts: bool = True) -> Plan:
    """Load a plan directory written by :func:`write_plan`.

    Raises:
        InfScalerError: no ``plan.yaml``, unreadable YAML, unknown format, or a missing
            part file.
    """
    plan_dir = Path(plan_dir)
    path = plan_dir / PLAN_FILE
    if not path.is_file():
        raise InfScalerError(
            f"{plan_dir} is not a plan directory (no {PLAN_FILE})",
            hint="create one with: infscaler partition MODEL -o DIR",
        )
    try:
        summary = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InfScalerError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(summary, dict) or summary.get("format") != PLAN_FORMAT:
        raise InfScalerError(
            f"{path} is not a plan of format {PLAN_FORMAT}",
            hint="re-create it with this version: infscaler partition MODEL -o DIR",
        )
    parts: list[onnx.ModelProto] = []
    for meta in summary["partitions"]:
        f = plan_dir / meta["file"]
        if not f.is_file():
            raise InfScalerError(f"plan {plan_dir} lacks its partition file {meta['file']}")
        if load_parts:
            parts.append(onnx.load(str(f)))
    return Plan(summary=summary, parts=parts)


def tensor_list(names: Sequence[str], tensors: dict) -> list[dict[str, Any]]:
    """[{name, shape, dtype, bytes}] for plan files."""
    return [{"name": n, **tensors[n].to_dict()} for n in names if n in tensors]
