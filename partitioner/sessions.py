"""A model run the way a serving instance runs it, for the profiler's timed runs (T_o, T_p,
A_k^m of InfScaler §IV-A), built from the engine layer.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from infscaler.base.errors import ConfigError, ModelLoadError
from infscaler.engines import create_engine
from infscaler.engines.onnxrt.loader import load_session, session_options
from infscaler.partitioner.weights import StubModel

if TYPE_CHECKING:
    import onnxruntime as ort

#: the precision each engine is profiled in (the DLA computes in fp16 or int8 only)
_PRECISION = {"cpu": "fp32", "gpu": "fp32", "dla": "fp16"}


ModelSource = onnx.ModelProto | str | os.PathLike[str] | StubModel
"""What a session can be built from: a ModelProto, an ``.onnx`` path, or a
:class:`~.weights.StubModel` (weights read from the model's file; see :mod:`.weights`)."""


def model_source(
    model: ModelSource, *, node_names: bool = True
) -> tuple[bytes | str | StubModel, list[str]]:
    """(source for InferenceSession, top-level node names; [] unless asked)."""
    if isinstance(model, StubModel):
        if not node_names:
            return model, []
        return model, [n.name for n in onnx.load_model_from_string(model.data).graph.node]
    if isinstance(model, onnx.ModelProto):
        try:
            data = model.SerializeToString()
        except ValueError as exc:  # protobuf refuses > 2 GB
            raise ModelLoadError(
                f"the model is too large to serialise in memory ({exc})",
                hint="pass the model's file path to profile_model instead of a ModelProto",
            ) from None
        return data, [n.name for n in model.graph.node]
    path = Path(model)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {path}", hint="check the path")
    if not node_names:
        return str(path), []
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a valid ONNX model: {exc}") from None
    return str(path), [n.name for n in proto.graph.node]


def ort_session(
    source: bytes | str | StubModel, engine: str, options: ort.SessionOptions
) -> ort.InferenceSession:
    """An onnxruntime session of ``source`` on ``engine`` from the engine layer's loader."""
    if isinstance(source, StubModel):
        return load_session(
            source.data, engine=engine, options=options, external_data_folder=source.folder
        )
    return load_session(source, engine=engine, options=options)


@contextlib.contextmanager
def model_file(source: bytes | str | StubModel | onnx.ModelProto) -> Iterator[str]:
    """A file path of ``source`` (itself, else a temporary file deleted on exit).

    Raises:
        ConfigError: a :class:`~.weights.StubModel`: pass the model's or the part's file.
    """
    if isinstance(source, StubModel):
        raise ConfigError(
            "a weight-referencing stub runs on the cpu engine only",
            hint="give engines other than cpu the model's or the saved part's file",
        )
    if isinstance(source, str | os.PathLike):
        yield str(source)
        return
    proto = onnx.load_model_from_string(source) if isinstance(source, bytes) else source
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)  # save_model with external data rewrites the tensors it is given
    with tempfile.TemporaryDirectory(prefix="infscaler-prof-") as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save_model(
            copy,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location="model.onnx.data",
            size_threshold=1024,
        )
        yield path


@contextlib.contextmanager
def served(
    source: bytes | str | StubModel, engine: str, threads: int
) -> Iterator[Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]]:
    """A function ``feeds -> {output name: array}`` running ``source`` on ``engine`` as served:
    on cpu an onnxruntime session with the cpu engine's options, else
    :func:`~infscaler.engines.create_engine` (``fp16`` on the DLA) on :func:`model_file`.
    """
    if engine == "cpu":
        sess = ort_session(source, engine, session_options(threads))
        names = [o.name for o in sess.get_outputs()]
        yield lambda feeds: dict(zip(names, run_session(sess, feeds, engine), strict=True))
        return
    with model_file(source) as path:
        eng = create_engine(engine, path, threads=threads, precision=_PRECISION[engine])
        with eng:
            yield eng.infer


def run_session(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], engine: str) -> list:
    """``sess.run`` of every output; ModelLoadError when onnxruntime cannot run ``feeds``."""
    try:
        return sess.run(None, feeds)
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"onnxruntime could not run the model on engine '{engine}' with the given "
            f"inputs: {msg}",
            hint="the feeds must match the model's inputs (names, shapes, dtypes); "
            "see random_feeds()",
        ) from None


def time_served(
    source: bytes | str | StubModel,
    feeds: dict[str, np.ndarray],
    engine: str,
    threads: int,
    warmup: int,
    repeats: int,
) -> tuple[float, dict[str, np.ndarray]]:
    """Median ms of ``repeats`` timed runs (after ``warmup``) as served (:func:`served`),
    and the last run's outputs by name."""
    times, outputs = times_served(source, feeds, engine, threads, warmup, repeats)
    return float(statistics.median(times)), outputs


def times_served(
    source: bytes | str | StubModel,
    feeds: dict[str, np.ndarray],
    engine: str,
    threads: int,
    warmup: int,
    repeats: int,
    budget_s: float = 0.0,
    max_repeats: int = 0,
) -> tuple[list[float], dict[str, np.ndarray]]:
    """Every timed run's ms (``repeats`` at least; then more while the timed runs took
    less than ``budget_s`` in all, up to ``max_repeats``), and the last run's outputs."""
    with served(source, engine, threads) as run:
        for _ in range(warmup):
            run(feeds)
        times: list[float] = []
        outputs: dict[str, np.ndarray] = {}
        while len(times) < max(repeats, 1) or (
            len(times) < max_repeats and sum(times) < budget_s * 1000.0
        ):
            t0 = time.perf_counter()
            outputs = run(feeds)
            times.append((time.perf_counter() - t0) * 1000.0)
    return times, outputs
