"""The models and pipelines the benchmarks serve: one request's inputs, the unloaded
latency L0 (calibration), the pipeline dict a configuration deploys, and a synthetic
deep chain for the partitioner.

Model names are the bundled aliases (``infscaler.base.models.MODELS``: ``resnet50``,
``ppocrv4-det``, ``vgg19``, ...) plus the pipeline case ``ddddocr`` (the ddddocr
detector -> recogniser pipeline, ``infscaler/pipelines/dddd.yaml``). Latencies in ms.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

#: Tolerance used only when a plan fails verification at the API default rtol (1e-4);
#: every such retry is recorded in the results next to the original failure.
FALLBACK_RTOL = 1e-2

#: per model: K (Eq. 1 plan used for InfScaler), timing of a bisection step, requests for L0
MODEL_SETTINGS: dict[str, dict[str, Any]] = {
    "resnet50": {"k": 2, "warm_min_s": 8.0, "warm_max_s": 15.0, "measure_s": 12.0, "n_l0": 20},
    "ppocrv4-det": {"k": 3, "warm_min_s": 4.0, "warm_max_s": 15.0, "measure_s": 10.0, "n_l0": 15},
    "vgg19": {"k": 3, "warm_min_s": 6.0, "warm_max_s": 30.0, "measure_s": 20.0, "n_l0": 6},
    "ddddocr": {"k": 2, "warm_min_s": 4.0, "warm_max_s": 15.0, "measure_s": 10.0, "n_l0": 15},
}

#: pipeline cases (not one model): the staged pipeline for InfScaler, its whole-pipeline
#: function for the baselines (see the module docstring)
PIPELINE_CASES: dict[str, dict[str, str]] = {
    "ddddocr": {
        "yaml": "dddd.yaml",  # in infscaler/pipelines
        "partitioned_stage": "det",  # the stage partitioned into K
        "whole": "infscaler.pipelines.dddd:whole",
    },
}

#: the autoscaler's settings for every autoscaled configuration (faster than the defaults
#: so that it settles within a bisection step's warm-up)
#: cooldown >= window: the P99 behind a scale-out was measured entirely after the previous
#: change (with a cooldown shorter than the window the scaler reacts again to the P99 the
#: last change already fixed: see bench/HISTORY.md)
AUTOSCALE = {
    "interval_s": 0.5,
    "window_s": 5.0,
    "violation_ratio": 1.0,
    "cooldown_s": 6.0,
    "hold_s": 15.0,
    "rate_horizon_s": 30.0,
    "scale_in_utilisation": 0.6,
    "shed": True,
}


def model_inputs(model: str) -> dict[str, np.ndarray]:
    """One request's inputs: a real photo through the OCR pre-processing for PP-OCRv4 det
    (skimage ``astronaut``), the click-captcha test image for ``ddddocr``, seeded random
    values in [0, 1) for the light models."""
    if model == "ddddocr":
        from infscaler.pipelines.dddd import render_captcha_image

        return {"image": render_captcha_image()}
    if model == "ppocrv4-det":
        from skimage import data as skdata

        from infscaler.pipelines.ocr import det_preprocess

        return {
            "x": np.ascontiguousarray(det_preprocess({"image": skdata.astronaut()})["det_input"])
        }
    from infscaler.base.models import resolve_model
    from infscaler.engines.onnxrt.loader import load_session

    s = load_session(resolve_model(model), threads=None, spinning=None)
    rng = np.random.default_rng(0)
    feeds = {}
    for i in s.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        feeds[i.name] = rng.random(shape, dtype=np.float32)
    return feeds


class WholePipeline:
    """:func:`session`'s stand-in for a pipeline case: ``run(None, feeds)`` calls the
    whole-pipeline function in-process with ``threads`` intra-op threads (its sessions
    are cached per process and thread count)."""

    def __init__(self, model: str, threads: int) -> None:
        from infscaler.runtime.serving.pipeline import load_function

        self.fn = load_function(PIPELINE_CASES[model]["whole"])
        self.threads = threads

    def run(self, _outputs: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self.fn(feeds, threads=self.threads).values())


def session(model: str, threads: int) -> Any:
    if model in PIPELINE_CASES:
        return WholePipeline(model, threads)
    from infscaler.base.models import resolve_model
    from infscaler.engines.onnxrt.loader import load_session

    # the cpu engine's session options (sequential, no spinning), ``threads`` threads
    return load_session(resolve_model(model), threads=threads)


def median_ms(sess: Any, feeds: dict[str, np.ndarray], n: int, warmup: int = 3) -> float:
    """Median wall time of ``n`` sequential ``sess.run(None, feeds)`` after ``warmup``
    unmeasured ones, ms (``sess``: an onnxruntime session or anything with its ``run``)."""
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times))


def calibrate(model: str, feeds: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """L0 with 1 thread and with all cores (medians of ``n`` sequential runs, 2 warm-up
    runs each, interleaved so both see the same host), ideal = cores x 1000 / L0."""
    cores = len(os.sched_getaffinity(0))
    s1, sn = session(model, 1), session(model, cores)
    for s in (s1, sn):
        for _ in range(2):
            s.run(None, feeds)
    one, alln = [], []
    for _ in range(n):
        for s, out in ((s1, one), (sn, alln)):
            t = time.perf_counter()
            s.run(None, feeds)
            out.append((time.perf_counter() - t) * 1e3)
    l0 = float(np.median(one))
    return {
        "l0_ms": round(l0, 2),
        "l0_p90_ms": round(float(np.percentile(one, 90)), 2),
        "l0_all_cores_ms": round(float(np.median(alln)), 2),
        "single_thread_rps": round(1000.0 / l0, 3),
        "all_cores_session_rps_unloaded": round(1000.0 / float(np.median(alln)), 3),
        "cores": cores,
        "ideal_rps": round(cores * 1000.0 / l0, 3),
        "runs": n,
    }


def pipeline(
    model: str,
    name: str,
    k: int,
    threads: int = 1,
    slo_ms: float | None = None,
    autoscale: dict | None = None,
    max_instances: int | None = None,
    whole: bool | None = None,
) -> Any:
    """The pipeline a configuration deploys: the model partitioned into ``k`` (1: whole);
    for a pipeline case, the staged pipeline with its partitioned stage in ``k``, or with
    ``whole`` (default ``k == 1``) the whole pipeline as one function stage."""
    from infscaler.base.config import load_pipeline, pipeline_for_model
    from infscaler.base.models import MODELS

    if model in PIPELINE_CASES:
        raw = pipeline_case(model, k, threads, k == 1 if whole is None else whole)
        raw["name"] = name
        for st in raw["stages"]:
            # on model stages only: a function stage that names its own max_instances
            # is not fused into its model's unit (docs/pipelines.md, "Fused units")
            whole_fn = len(raw["stages"]) == 1
            if max_instances is not None and ("model" in st or whole_fn):
                st["max_instances"] = max_instances
    else:
        # partitions named even for K = 1: a hand configuration is deployed as written,
        # never replaced by the deploy-time planner (runtime.autoplan plans a stage that
        # leaves partitions / threads / instances open)
        cfg = pipeline_for_model(model, name=name, partitions=k, shapes=MODELS[model].shapes)
        raw = cfg.model_dump(exclude_none=True)
        raw["stages"][0]["threads"] = threads
        if max_instances is not None:
            raw["stages"][0]["max_instances"] = max_instances
    raw["request_timeout_s"] = 60.0
    if slo_ms is not None:
        raw["slo"] = f"{slo_ms:.1f}ms"
    if autoscale is not None:
        raw["autoscale"] = autoscale
    return load_pipeline(raw)


def auto_pipeline(model: str, name: str, slo_ms: float) -> Any:
    """The ``auto`` configuration: the model (a pipeline case: its YAML with nothing
    named on the model stages) with only ``slo`` and ``autoscale`` (:data:`AUTOSCALE`),
    so the runtime decides K, threads and instances at deploy.

    Raises:
        ConfigError: the runtime refused the config (its message).
    """
    from infscaler.base.config import load_pipeline
    from infscaler.base.models import MODELS

    if model in PIPELINE_CASES:
        raw = pipeline_case(model, 1, 1, whole=False)
        for st in raw["stages"]:
            if "model" in st:
                for key in ("partitions", "instances", "threads", "max_instances", "engine"):
                    st.pop(key, None)
    else:
        stage: dict[str, Any] = {"name": "model", "model": model}
        if MODELS[model].shapes:
            stage["shapes"] = MODELS[model].shapes
        raw = {"stages": [stage]}
    raw.update(name=name, request_timeout_s=60.0, slo=f"{slo_ms:.1f}ms", autoscale=dict(AUTOSCALE))
    return load_pipeline(raw)


def static_pipeline(
    model: str, name: str, threads: int, instances: int, slo_ms: float | None = None
) -> dict[str, Any]:
    """The whole model at ``instances`` fixed instances of ``threads`` threads, no
    autoscaler (``slo_ms``: the SLO, for admission only), as a pipeline dict."""
    raw = pipeline(model, name, 1, threads=threads, max_instances=instances, whole=True)
    raw = raw.model_dump(mode="json", exclude_none=True)
    raw["stages"][0]["instances"] = instances
    if slo_ms is not None:
        raw["slo"] = f"{slo_ms:.1f}ms"
    return raw


def hand_pipeline(model: str, name: str, threads: int, instances: int, slo_ms: float | None):
    """:func:`static_pipeline` as a loaded pipeline config (for ``Service.deploy``)."""
    from infscaler.base.config import load_pipeline

    return load_pipeline(static_pipeline(model, name, threads, instances, slo_ms))


def pipeline_case(model: str, k: int, threads: int, whole: bool) -> dict[str, Any]:
    """A pipeline case's raw config: the bundled YAML with its partitioned stage in ``k``
    and ``threads`` per model-stage instance, or (``whole``) one function stage running
    the whole pipeline with ``threads`` cores and intra-op threads."""
    from importlib import resources

    import yaml

    case = PIPELINE_CASES[model]
    raw = yaml.safe_load(resources.files("infscaler.pipelines").joinpath(case["yaml"]).read_text())
    if whole:
        raw["stages"] = [
            {
                "name": "whole",
                "function": case["whole"],
                "params": {"threads": threads},
                "inputs": [i["name"] for i in raw["inputs"]],
                "outputs": list(raw["outputs"]),
                "threads": threads,
            }
        ]
        return raw
    for st in raw["stages"]:
        if st["name"] == case["partitioned_stage"]:
            st["partitions"] = k
        if "model" in st:
            st["threads"] = threads
    return raw


def save_model(path: Path, nodes: list, inputs: dict[str, list], outputs: dict[str, list],
               inits: dict[str, np.ndarray] | None = None, name: str = "bench") -> Path:  # fmt: skip
    """An FP32 ONNX model of ``nodes`` (``onnx.helper.make_node``), its inputs and outputs
    (name -> shape) and initializers (name -> array), opset 17, IR 8, checked
    (``onnx.checker``) and saved at ``path``; returns ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def values(d: dict[str, list]) -> list:
        return [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in d.items()]

    weights = [numpy_helper.from_array(v, name=k) for k, v in (inits or {}).items()]
    graph = helper.make_graph(nodes, name, values(inputs), values(outputs), initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="infscaler-bench")  # fmt: skip
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return Path(path)


def synthetic_chain(path: Path, blocks: int = 250, channels: int = 16, size: int = 16) -> Path:
    """Write a synthetic deep residual chain with ``4 * blocks`` operators.

    Each block is ``y = Relu(BatchNormalization(Conv3x3(x))); x = Add(x, y)`` on a
    ``1 x channels x size x size`` float32 tensor, with seeded random weights (conv weights
    scaled down so 250 residual additions stay finite). Built with ``onnx.helper``;
    opset 17. Used to exercise the >= 800-operator target; it is not a real model.
    """
    from onnx import helper

    rng = np.random.default_rng(0)
    c = channels
    nodes = []
    inits: dict[str, np.ndarray] = {}
    x = "x"
    for b in range(blocks):
        w = rng.standard_normal((c, c, 3, 3)).astype(np.float32) * np.float32(0.1 / np.sqrt(c * 9))
        inits[f"b{b}_w"] = w
        for k, lo, hi in (("cb", -0.1, 0.1), ("s", 0.5, 1.5), ("bb", -0.1, 0.1), ("m", -0.1, 0.1),
                          ("v", 0.5, 1.5)):  # fmt: skip
            inits[f"b{b}_{k}"] = rng.uniform(lo, hi, c).astype(np.float32)
        bn_in = [f"b{b}_conv", f"b{b}_s", f"b{b}_bb", f"b{b}_m", f"b{b}_v"]
        nodes += [
            helper.make_node("Conv", [x, f"b{b}_w", f"b{b}_cb"], [f"b{b}_conv"], name=f"b{b}_conv",
                             pads=[1] * 4),
            helper.make_node("BatchNormalization", bn_in, [f"b{b}_bn"], name=f"b{b}_bn"),
            helper.make_node("Relu", [f"b{b}_bn"], [f"b{b}_relu"], name=f"b{b}_relu"),
            helper.make_node("Add", [x, f"b{b}_relu"], [f"b{b}_out"], name=f"b{b}_add"),
        ]  # fmt: skip
        x = f"b{b}_out"
    shape = [1, c, size, size]
    return save_model(path, nodes, {"x": shape}, {x: shape}, inits, f"synthetic_chain_{blocks}")


#: MB added to a measured memory cap (PSS drifts by a few MB under load)
CAP_MARGIN_MB = 32.0


def capped_device(cap_mb: float, path: Path) -> Path:
    """This host's ``cpu-host`` profile with ``memory_cap_mb`` = ``cap_mb`` as a device
    YAML at ``path`` (``infscaler serve --device``); returns ``path``.

    Raises:
        ValueError: a cap that is not positive or above the host's memory.
    """
    import yaml

    from infscaler.base.device import host_profile

    p = host_profile()
    if not 0 < cap_mb <= p.memory_mb:
        raise ValueError(f"memory cap {cap_mb} MB: must be in (0, {p.memory_mb}] (host memory)")
    p = p.model_copy(update={"name": "cpu-host-capped", "memory_cap_mb": int(cap_mb)})
    path.write_text(yaml.safe_dump(p.model_dump(mode="json", exclude_none=True)))
    return path


def cap_rule(whole_mb: float, parts_mb: list[float], bottleneck: int, pool_mb: float) -> dict:
    """The memory cap of the former scaling.py (bench/HISTORY.md, "The former
    scaling.py"): room for the plan once plus one more bottleneck instance, i.e.
    ``max(whole, sum(partitions)) + partitions[bottleneck] + pool + CAP_MARGIN_MB`` (MB,
    PSS of one 1-thread instance each), and whether two whole replicas would fit.

    >>> cap_rule(100.0, [40.0, 70.0], 1, 10.0)["cap_mb"]
    222.0
    """
    cap = max(whole_mb, sum(parts_mb)) + parts_mb[bottleneck] + pool_mb + CAP_MARGIN_MB
    return {"cap_mb": round(cap, 1), "whole_pss_mb": whole_mb, "partition_pss_mb": parts_mb,
            "bottleneck_unit": bottleneck, "pool_mb": pool_mb, "margin_mb": CAP_MARGIN_MB,
            "two_replicas_fit": 2 * whole_mb + pool_mb <= cap}  # fmt: skip
