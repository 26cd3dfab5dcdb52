"""The TensorRT engine cache: serialised engines under ``cache_dir``, keyed by model SHA-256,
GPU, TensorRT version and :class:`~infscaler.engines.tensorrt.loader.BuildSpec`; a file
lock makes instances started together build once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["EngineCache", "default_cache_dir", "model_sha256"]

log = logging.getLogger("infscaler.engines.tensorrt")


def model_sha256(path: Path, data_files: Sequence[Path] = ()) -> str:
    """SHA-256 of the model file and, in order, its external-data files (hex)."""
    h = hashlib.sha256()
    for p in (path, *data_files):
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """``$INFSCALER_CACHE_DIR/engines``, or ``~/.cache/infscaler/engines`` (the root of
    :func:`infscaler.base.models.cache_dir`, read here from the environment: the engine layer
    imports no module above the base layer)."""
    root = os.environ.get("INFSCALER_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "infscaler") / "engines"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


@dataclass
class EngineCache:
    """``<dir>/<model>-<sha>-<gpu>-trt<ver>-<prec>[-dlaN]-<key>.engine`` plus a ``.json`` (key,
    build time, DLA fallback layers) in ``directory``.
    """

    directory: Path
    key: dict[str, Any]
    stem: str
    _digest: str = field(init=False)

    def __post_init__(self) -> None:
        blob = json.dumps(self.key, sort_keys=True).encode()
        self._digest = hashlib.sha256(blob).hexdigest()[:12]

    @property
    def engine_path(self) -> Path:
        k = self.key
        dla = f"-dla{k['build']['dla_core']}" if k["build"]["dla_core"] is not None else ""
        name = (
            f"{_slug(self.stem)}-{k['model_sha256'][:12]}-{_slug(k['gpu'])}"
            f"-trt{k['tensorrt']}-{k['build']['precision']}{dla}-{self._digest}.engine"
        )
        return self.directory / name

    @property
    def meta_path(self) -> Path:
        return self.engine_path.with_suffix(".json")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``<engine>.lock``, so that instances started together
        build the engine once; the others wait and then find it cached."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.engine_path.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            log.warning("engine cache %s unusable (%s); building without it", self.directory, exc)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> tuple[bytes, dict[str, Any]] | None:
        try:
            plan = self.engine_path.read_bytes()
        except OSError:
            return None
        meta: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads(self.meta_path.read_text())
        return plan, meta

    def write(self, plan: bytes, meta: dict[str, Any]) -> bool:
        """Store atomically (temp file + rename); False (and a warning) when it cannot."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for path, data in ((self.engine_path, plan), (self.meta_path, None)):
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                if data is None:
                    tmp.write_text(json.dumps({**meta, "key": self.key}, indent=1, sort_keys=True))
                else:
                    tmp.write_bytes(data)
                os.replace(tmp, path)
            return True
        except OSError as exc:
            log.warning("cannot write engine cache %s: %s", self.engine_path, exc)
            return False

    def drop(self) -> None:
        for p in (self.engine_path, self.meta_path):
            with contextlib.suppress(OSError):
                p.unlink()
