"""One result schema for every benchmark, and its JSON file.

A result file (``<out>/<name>.json``, ``<name>_quick.json`` for ``--quick``) holds::

    {"schema": "infscaler-bench/1", "name": str,
     "environment": {host (host_description), usable_cores, memory_mb, versions, argv, date_utc,
                     load_average_at_start / _at_end, quiet_before, other_processes_cores,
                     cpu_steal_s, loaded_host},
     "settings": {...},   # the script's arguments
     "points": [{...}],   # one dict per measurement (a load point, a bisection step)
     "summary": {...}}    # what the script concludes from the points

``other_processes_cores`` is the CPU other processes used over the whole run (cores);
``loaded_host`` is true when it or the quiet-before check says the host was not quiet,
and such a run is not a result (bench/README.md, "How the figures are made").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .host import ForeignLoad, cpu_steal_seconds, environment, own_cpu_seconds

SCHEMA = "infscaler-bench/1"
#: other processes' CPU above which a run is labelled ``loaded_host`` (cores)
LOADED_CORES = 0.15


@dataclass
class Result:
    """A benchmark's result while it runs; :meth:`save` writes it.

    Attributes:
        name: the file's stem (``scaling``, ``scaling_quick``).
        settings: the script's settings (argparse's namespace as a dict).
        quiet_before: :func:`~harness.host.wait_for_quiet`'s answer, or None.
    """

    name: str
    settings: dict[str, Any]
    quiet_before: dict[str, Any] | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=environment)
    #: pids whose CPU counts as ours (the services under test), besides this process
    own_pids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._foreign = ForeignLoad(lambda: own_cpu_seconds(self.own_pids))
        self._steal = cpu_steal_seconds()

    def add(self, **point: Any) -> dict[str, Any]:
        """Append one point (keyword arguments, JSON-ready values) and return it."""
        self.points.append(point)
        return point

    def to_dict(self) -> dict[str, Any]:
        """The schema above, with the end-of-run figures filled in."""
        env = dict(self.environment)
        other = self._foreign.cores()
        env.update(
            load_average_at_end=list(os.getloadavg()),
            quiet_before=self.quiet_before,
            other_processes_cores=other,
            cpu_steal_s=round(cpu_steal_seconds() - self._steal, 2),
            loaded_host=bool(
                other >= LOADED_CORES or (self.quiet_before and not self.quiet_before["quiet"])
            ),
        )
        return {
            "schema": SCHEMA,
            "name": self.name,
            "environment": env,
            "settings": self.settings,
            "points": self.points,
            "summary": self.summary,
        }

    def save(self, out_dir: Path) -> Path:
        """Write ``<out_dir>/<name>.json`` (atomically) and return its path."""
        path = Path(out_dir) / f"{self.name}.json"
        write_json(path, self.to_dict())
        return path


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as indented JSON at ``path`` (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    tmp.replace(path)


def _jsonable(v: Any) -> Any:
    if isinstance(v, Path):
        return str(v)
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    if hasattr(v, "tolist"):
        return v.tolist()
    raise TypeError(f"{type(v).__name__} is not JSON-serialisable")


def load(path: Path) -> dict[str, Any]:
    """A result file back as a dict.

    Raises:
        ValueError: the file is not of :data:`SCHEMA`.
    """
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} result (schema {data.get('schema')!r})")
    return data


def percentiles(
    values: Any,
    unit: str | None = "ms",
    qs: tuple = (50, 99),
    digits: int | None = None,
    extra: tuple = (),
) -> dict[str, float]:
    """``p{q}_{unit}`` of ``values`` for each of ``qs`` (numpy's linear percentiles;
    ``p{q}`` with no unit), then ``{s}_{unit}`` for each numpy reduction named in ``extra``
    (``mean``, ``max``, ``min``), rounded to ``digits`` (None: not rounded).

    Raises:
        IndexError: ``values`` is empty (numpy's).

    >>> percentiles([1.0, 2.0, 3.0, 4.0], digits=2, extra=("mean",))
    {'p50_ms': 2.5, 'p99_ms': 3.97, 'mean_ms': 2.5}
    """
    a = np.asarray(values, dtype=np.float64)
    sfx = f"_{unit}" if unit else ""
    out = {f"p{q}{sfx}": float(np.percentile(a, q)) for q in qs}
    out |= {f"{s}{sfx}": float(getattr(a, s)()) for s in extra}
    return out if digits is None else {k: round(v, digits) for k, v in out.items()}


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    """A fixed-width table on stdout (first column left-aligned, the rest right)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if j == 0:
            print("  ".join("-" * w for w in widths))
