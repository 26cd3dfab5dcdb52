"""The variant registry (INFaaS §3.2, the Metadata Store) in SQLite
(``<state dir>/variants.sqlite``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.base.device import INSTANCE_OVERHEAD_MB
from infscaler.base.errors import InfScalerError
from infscaler.modelless.selector import Catalog, VariantProfile
from infscaler.runtime.serving.pipeline import default_state_dir

__all__ = [
    "DB_NAME",
    "KNOWN_TASKS",
    "NAME_RE",
    "RegistrationError",
    "TASK_RE",
    "Variant",
    "VariantRegistry",
    "describe",
    "file_sha256",
]


DB_NAME = "variants.sqlite"
#: Tasks with an interface, a pipeline and (rec, embedding) an accuracy measure.
KNOWN_TASKS = ("text-recognition", "text-embedding", "text-detection")
TASK_RE = re.compile(r"^[a-z0-9][a-z0-9\-]{0,47}$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,39}$")


class RegistrationError(InfScalerError):
    """A registration was refused (bad task or name, a model that does not fit the task,
    no accuracy source, an unreadable validation set)."""


# -- metadata ------------------------------------------------------------------------------


@dataclass
class Variant:
    """One variant's metadata (a row of the registry).

    Attributes:
        name: ``<model>.<engine>.<precision>.b<batch>[.k<K>]``.
        task / model / source / path: what it serves, comes from and runs.
        engine / precision / batch / partitions / plan: how it runs.
        generated / reason: False with why for a variant this host cannot make.
        load_ms: model load time, ms.
        latency_ms: ``{batch: {"p50": ms, "p99": ms}}``.
        peak_mb / weights_mb: peak USS growth of an instance / model file size, MB.
        accuracy / accuracy_source: 0-1 or None, and ``measured: ...`` or ``declared``.
        io: task specifics; shapes: profiled shapes; host, created: where and when.
    """

    name: str
    task: str
    model: str
    source: str
    path: str
    engine: str = "cpu"
    precision: str = "fp32"
    batch: int = 1
    partitions: int = 1
    plan: str | None = None
    generated: bool = True
    reason: str = ""
    load_ms: float = 0.0
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    peak_mb: float = 0.0
    weights_mb: float = 0.0
    accuracy: float | None = None
    accuracy_source: str = ""
    io: dict[str, Any] = field(default_factory=dict)
    shapes: str | None = None
    host: str = ""
    created: float = 0.0

    def latency(self, batch: int | None = None, stat: str = "p99") -> float:
        """Profiled latency at ``batch`` (default: its own), ms; inf when not profiled."""
        entry = self.latency_ms.get(str(batch or self.batch))
        return float(entry[stat]) if entry and stat in entry else math.inf

    def profile(self) -> Any:
        """The selector's :class:`~infscaler.modelless.selector.VariantProfile`: P99 at its batch,
        batch x 1000 / P50 (a plan: its slowest partition's), peak MB plus the instance overhead
        per partition.
        """

        p50 = self.latency(stat="p50")
        bottleneck = float(self.io.get("bottleneck_p50_ms") or p50)
        return VariantProfile(
            name=self.name,
            task=self.task,
            model=self.model,
            latency_ms=self.latency(),
            accuracy=float(self.accuracy if self.accuracy is not None else 0.0),
            load_ms=self.load_ms,
            memory_mb=self.peak_mb + INSTANCE_OVERHEAD_MB * self.partitions,
            throughput_qps=self.batch * 1000.0 / bottleneck if bottleneck > 0 else 0.0,
            engine=self.engine,
            precision=self.precision,
            batch=self.batch,
            partitions=self.partitions,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Variant:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class VariantRegistry:
    """The Metadata Store at ``<root>/variants.sqlite`` (default: the service's state dir)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:

        self.root = Path(root) if root is not None else default_state_dir()
        self.path = self.root / DB_NAME

    @property
    def files_dir(self) -> Path:
        """Where generated files (dequantised models, character lists, plans) go."""
        return self.root / "variants"

    @contextlib.contextmanager
    def _db(self, write: bool = False):
        if not write and not self.path.is_file():
            yield None
            return
        self.root.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(self.path), timeout=30)
        try:
            con.execute(
                "CREATE TABLE IF NOT EXISTS variants (name TEXT PRIMARY KEY, task TEXT NOT NULL,"
                " model TEXT NOT NULL, generated INTEGER NOT NULL, data TEXT NOT NULL)"
            )
            con.execute(
                "CREATE TABLE IF NOT EXISTS tasks (task TEXT PRIMARY KEY, data TEXT NOT NULL)"
            )
            yield con
            con.commit()
        finally:
            con.close()

    def stamp(self) -> tuple[float, int] | None:
        """Changes whenever the store is written (for caches)."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def replace_model(self, model: str, variants: Iterable[Variant]) -> None:
        """Store ``variants`` in place of every earlier variant of ``model``."""
        rows = [(v.name, v.task, v.model, int(v.generated), v.to_json()) for v in variants]
        with self._db(write=True) as con:
            con.execute("DELETE FROM variants WHERE model = ?", (model,))
            con.executemany("INSERT OR REPLACE INTO variants VALUES (?, ?, ?, ?, ?)", rows)

    def variants(
        self, task: str | None = None, *, generated_only: bool = False, model: str | None = None
    ) -> list[Variant]:
        """Stored variants (optionally of one task / model), by task, model, name."""
        query = "SELECT data FROM variants WHERE 1=1"
        args: list[Any] = []
        if task is not None:
            query += " AND task = ?"
            args.append(task)
        if model is not None:
            query += " AND model = ?"
            args.append(model)
        if generated_only:
            query += " AND generated = 1"
        query += " ORDER BY task, model, name"
        with self._db() as con:
            if con is None:
                return []
            return [Variant.from_json(r[0]) for r in con.execute(query, args)]

    def get(self, name: str) -> Variant:
        """Raises: RegistrationError for an unknown name."""
        with self._db() as con:
            row = (
                None
                if con is None
                else con.execute("SELECT data FROM variants WHERE name = ?", (name,)).fetchone()
            )
        if row is None:
            raise RegistrationError(f"no variant named {name!r} is registered")
        return Variant.from_json(row[0])

    def tasks(self) -> list[str]:
        """Tasks with at least one generated variant."""
        with self._db() as con:
            if con is None:
                return []
            rows = con.execute("SELECT DISTINCT task FROM variants WHERE generated = 1")
            return sorted(r[0] for r in rows)

    def task_meta(self, task: str) -> dict[str, Any]:
        with self._db() as con:
            row = (
                None
                if con is None
                else con.execute("SELECT data FROM tasks WHERE task = ?", (task,)).fetchone()
            )
        return json.loads(row[0]) if row else {}

    def set_task_meta(self, task: str, meta: dict[str, Any]) -> None:
        with self._db(write=True) as con:
            con.execute("INSERT OR REPLACE INTO tasks VALUES (?, ?)", (task, json.dumps(meta)))

    def catalog(self) -> Any:
        """The generated variants as a :class:`~infscaler.modelless.selector.Catalog`."""

        return Catalog([v.profile() for v in self.variants(generated_only=True)])


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def describe(variants: Iterable[Variant]) -> list[dict[str, Any]]:
    """Rows for ``infscaler variants list``."""
    rows = []
    for v in variants:
        rows.append(
            {
                "task": v.task,
                "variant": v.name,
                "model": v.model,
                "engine": v.engine,
                "precision": v.precision,
                "batch": v.batch,
                "K": v.partitions,
                "generated": v.generated,
                "load_ms": round(v.load_ms, 1),
                "p50_ms": None if not v.generated else round(v.latency(stat="p50"), 2),
                "p99_ms": None if not v.generated else round(v.latency(), 2),
                "latency_ms": v.latency_ms,
                "throughput_qps": round(v.profile().capacity_qps, 1) if v.generated else None,
                "peak_mb": v.peak_mb,
                "weights_mb": v.weights_mb,
                "accuracy": v.accuracy,
                "accuracy_source": v.accuracy_source,
                "reason": v.reason,
            }
        )
    return rows
