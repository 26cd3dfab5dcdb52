"""What really runs the ``gpu`` and ``dla`` engines on this host, found in a short subprocess
(the asking process never initialises CUDA). Source: onnxruntime.ai/docs/execution-providers/.

More: docs/engines.md, "`infscaler/engines/gpu/probe.py`".
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.engines.onnxrt.loader import CPU_PROVIDER, CUDA_PROVIDER, TRT_PROVIDER

__all__ = [
    "PROBE_VERSION",
    "TRT_PROVIDER",
    "ProviderReport",
    "dla_cores_on_host",
    "libnvinfer_loads",
    "parse_probe",
    "probe_key",
    "probe_providers",
    "run_probe",
]

PROBE_VERSION = 1
"""Format of the child's JSON (``"probe": 1``); a cache of another version is re-probed."""

_TIMEOUT_S = 120.0  # a TensorRT EP session builds an engine: seconds, not minutes
_ENV_NO_CACHE = "INFSCALER_PROBE_NO_CACHE"
# the child: main() of this module, the working directory off sys.path (as
# infscaler.base.procutil.module_command does; not ``-m``, which would import this module
# twice: the package imports it first)
_CHILD = (
    "import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "from infscaler.engines.gpu.probe import main; sys.exit(main())"
)

_LIBNVINFER = ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so")


def libnvinfer_loads() -> tuple[bool, str]:
    """Whether TensorRT's runtime library loads (``ctypes.CDLL``), which the TensorRT EP
    needs; ``(True, soname)`` or ``(False, why)``. Loads no CUDA context (run it in the
    probe's child all the same: it maps libcudart)."""
    errors = []
    for name in _LIBNVINFER:
        try:
            ctypes.CDLL(name)
            return True, name
        except OSError as exc:
            errors.append(str(exc))
    return False, (
        "TensorRT's libnvinfer is not loadable (" + "; ".join(errors[:1]) + "): install "
        "TensorRT (JetPack's libnvinfer on a Jetson, pip install tensorrt on x86) and put "
        "its lib folder on LD_LIBRARY_PATH"
    )


def dla_cores_on_host() -> int:
    """DLA cores this host exposes, from the Tegra device nodes (``/dev/nvhost-nvdla*``,
    JetPack 5) or platform devices (``/sys/devices/platform/**/*nvdla*``, JetPack 6);
    0 on every other host. Reads files only."""
    nodes = {p.rsplit("nvdla", 1)[-1] for p in glob.glob("/dev/nvhost-nvdla*")}
    if nodes:
        return len(nodes)
    plat = set()
    for pattern in ("/sys/devices/platform/*nvdla*", "/sys/devices/platform/*/*nvdla*"):
        plat.update(os.path.basename(p) for p in glob.glob(pattern))
    return len(plat)


# --------------------------------------------------------------------------- the child


def _tiny_model() -> bytes:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Add", ["X", "X"], ["Y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _try_session(ort: Any, model: bytes, providers: list[Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        # the one loader's opening (a provider list of our own, not an engine's)
        from infscaler.engines.onnxrt.loader import open_ort_session, session_options

        sess = open_ort_session(model, session_options(1), providers, "the probe's one-node model")
        import numpy as np

        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        y = sess.run(None, {"X": x})[0]
        ok = bool(np.array_equal(y, x + x))
        return {
            "providers": list(sess.get_providers()),
            "result_ok": ok,
            "ms": round((time.perf_counter() - t0) * 1e3, 1),
        }
    except Exception as exc:  # noqa: BLE001 - reported to the parent as text
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:800]}"}


def _native() -> dict[str, Any]:
    try:
        from infscaler.engines.tensorrt.loader import probe_tensorrt_host

        host = probe_tensorrt_host()
    except Exception as exc:  # noqa: BLE001
        return {"missing": [f"probing TensorRT failed: {type(exc).__name__}: {exc}"]}
    keys = ("devices", "missing", "version", "fast_fp16", "fast_int8", "dla_cores")
    return {k: host[k] for k in keys if k in host}


def child_report() -> dict[str, Any]:
    """The probe, as the child runs it (see the module doc); JSON-serialisable."""
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort

    from infscaler.engines.tensorrt.cuda import cuda_devices

    listed = list(ort.get_available_providers())
    devices, dev_why = cuda_devices()
    nvinfer_ok, nvinfer_text = libnvinfer_loads()
    report: dict[str, Any] = {
        "probe": PROBE_VERSION,
        "onnxruntime": ort.__version__,
        "onnxruntime_file": getattr(ort, "__file__", ""),
        "listed": listed,
        "devices": devices,
        "devices_why": dev_why,
        "libnvinfer": [nvinfer_ok, nvinfer_text],
        "dla_cores": dla_cores_on_host(),
        "sessions": {},
        "native": _native(),
    }
    model = _tiny_model()
    sessions: dict[str, Any] = report["sessions"]
    if CUDA_PROVIDER in listed and devices:
        sessions["cuda"] = _try_session(
            ort, model, [(CUDA_PROVIDER, {"device_id": "0"}), CPU_PROVIDER]
        )
    if TRT_PROVIDER in listed and devices and nvinfer_ok:
        with tempfile.TemporaryDirectory(prefix="isc-trt-probe-") as tmp:
            trt = {"device_id": "0", "trt_engine_cache_enable": "1", "trt_engine_cache_path": tmp}
            sessions["tensorrt"] = _try_session(ort, model, [(TRT_PROVIDER, trt), CPU_PROVIDER])
            if report["dla_cores"] > 0:
                dla = {**trt, "trt_dla_enable": "1", "trt_dla_core": "0", "trt_fp16_enable": "1"}
                sessions["tensorrt-dla"] = _try_session(
                    ort, model, [(TRT_PROVIDER, dla), CPU_PROVIDER]
                )
    return report


def main() -> int:
    """``python -m infscaler.engines.gpu.probe``: print :func:`child_report` as JSON."""
    print(json.dumps(child_report()))
    return 0


# --------------------------------------------------------------------------- the parent


@dataclass
class ProviderReport:
    """What the probe's child found: ``ok``, ``error`` (why not, else ""), ``data`` (its JSON),
    ``probed_s`` (``time.time()``).
    """

    ok: bool
    error: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    probed_s: float = 0.0

    # -- what started --------------------------------------------------------------
    def session_started(self, key: str, provider: str) -> tuple[bool, str]:
        """Whether the child's ``key`` session (``cuda``, ``tensorrt``, ``tensorrt-dla``)
        ran on ``provider`` first (``session.get_providers()[0]``), and why not."""
        if not self.ok:
            return False, self.error
        s = self.data.get("sessions", {}).get(key)
        if s is None:
            return False, self._why_not_tried(key)
        if "error" in s:
            return False, f"onnxruntime could not create a {provider} session: {s['error']}"
        got = list(s.get("providers", []))
        if got[:1] != [provider]:
            return False, (
                f"onnxruntime {self.data.get('onnxruntime')} lists {provider} but a session "
                f"asked for it runs on {got} (its library or CUDA / cuDNN / TensorRT "
                "libraries did not load; onnxruntime's log says which)"
            )
        if not s.get("result_ok", False):
            return False, f"a {provider} session ran but computed a wrong result"
        return True, f"{provider} session started ({s.get('ms', '?')} ms)"

    def _why_not_tried(self, key: str) -> str:
        d = self.data
        version = d.get("onnxruntime", "?")
        listed = d.get("listed", [])
        want = CUDA_PROVIDER if key == "cuda" else TRT_PROVIDER
        if want not in listed:
            pkg = "onnxruntime-gpu" if key == "cuda" else "onnxruntime-gpu with TensorRT"
            return f"onnxruntime {version} has no {want} (pip install {pkg})"
        if not d.get("devices"):
            return d.get("devices_why") or "no CUDA device"
        nv = d.get("libnvinfer") or [False, "libnvinfer not probed"]
        if key != "cuda" and not nv[0]:
            return str(nv[1])
        if key == "tensorrt-dla" and int(d.get("dla_cores", 0)) <= 0:
            return "no DLA cores: DLA exists only on Jetson Xavier / Orin"
        return f"the probe did not try the {key} session"

    def device(self) -> str:
        devs = self.data.get("devices") or []
        return str(devs[0]) if devs else "?"

    def native(self) -> dict[str, Any]:
        """The native TensorRT path's facts (``missing``, ``version``, ``fast_fp16``, ...)."""
        if not self.ok:
            return {"missing": [self.error]}
        return dict(self.data.get("native") or {"missing": ["not probed"]})

    # -- the engines' answers -------------------------------------------------------
    def gpu_backend(self) -> tuple[str | None, str]:
        """``("onnxruntime-trt" | "tensorrt" | "onnxruntime-cuda", what runs it)`` or
        ``(None, every reason)``, in that order of preference (see
        :mod:`infscaler.engines.gpu`)."""
        if not self.ok:
            return None, self.error
        version = self.data.get("onnxruntime", "?")
        trt_ok, trt_why = self.session_started("tensorrt", TRT_PROVIDER)
        if trt_ok:
            return "onnxruntime-trt", (
                f"onnxruntime {version} TensorrtExecutionProvider on {self.device()} "
                f"({self.data['libnvinfer'][1]}; CUDA EP and CPU EP take the nodes it cannot)"
            )
        native = self.native()
        if not native.get("missing"):
            devs = native.get("devices") or ["?"]
            return "tensorrt", (
                f"TensorRT {native.get('version')} on {devs[0]} "
                f"({len(devs)} CUDA device(s), pycuda buffers)"
            )
        cuda_ok, cuda_why = self.session_started("cuda", CUDA_PROVIDER)
        if cuda_ok:
            return "onnxruntime-cuda", (
                f"onnxruntime {version} CUDAExecutionProvider on {self.device()} "
                f"(TensorRT EP unavailable: {trt_why})"
            )
        reasons = [cuda_why, f"TensorRT EP: {trt_why}"]
        reasons += [f"native TensorRT: {m}" for m in native.get("missing", [])]
        return None, "; ".join(dict.fromkeys(reasons))

    def dla_backend(self) -> tuple[str | None, str]:
        """``("onnxruntime-trt-dla" | "tensorrt-dla", what runs it)`` or ``(None, why)``."""
        if not self.ok:
            return None, self.error
        ok, why = self.session_started("tensorrt-dla", TRT_PROVIDER)
        if ok:
            return "onnxruntime-trt-dla", (
                f"onnxruntime {self.data.get('onnxruntime')} TensorrtExecutionProvider with "
                f"trt_dla_enable, {self.data.get('dla_cores')} DLA core(s) beside "
                f"{self.device()} (GPU fallback per layer; CUDA / CPU EP per node)"
            )
        native = self.native()
        n = int(native.get("dla_cores", 0) or 0)
        if not native.get("missing") and n > 0:
            devs = native.get("devices") or ["?"]
            return (
                "tensorrt-dla",
                f"TensorRT {native.get('version')}, {n} DLA core(s) beside {devs[0]}",
            )
        reasons = [f"TensorRT EP with DLA: {why}"]
        if native.get("missing"):
            reasons += [f"native TensorRT: {m}" for m in native["missing"]]
        elif n <= 0:
            reasons.append("native TensorRT: builder.num_DLA_cores == 0")
        return None, "; ".join(dict.fromkeys(reasons))

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "error": self.error, "data": self.data, "probed_s": self.probed_s}


def parse_probe(stdout: str, returncode: int | None, stderr: str = "") -> ProviderReport:
    """The child's ``stdout`` (JSON on its last non-empty line), ``returncode`` (None: killed)
    and ``stderr`` as a :class:`ProviderReport`.
    """
    now = time.time()
    tail = " | ".join(line.strip() for line in stderr.strip().splitlines()[-3:] if line.strip())
    if returncode is None:
        return ProviderReport(
            False, f"the provider probe did not finish in {_TIMEOUT_S:.0f} s", probed_s=now
        )
    lines = [ln for ln in stdout.strip().splitlines() if ln.strip()]
    if returncode != 0 or not lines:
        return ProviderReport(
            False,
            f"the provider probe failed (exit {returncode}): {tail or 'no output'}",
            probed_s=now,
        )
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError:
        return ProviderReport(
            False, f"the provider probe printed no JSON: {lines[-1][:200]!r}", probed_s=now
        )
    if not isinstance(data, dict) or data.get("probe") != PROBE_VERSION:
        return ProviderReport(
            False,
            f"the provider probe printed an unknown report (probe {data.get('probe') if isinstance(data, dict) else '?'})",
            probed_s=now,
        )
    return ProviderReport(True, "", data, now)


def run_probe(timeout_s: float = _TIMEOUT_S) -> ProviderReport:
    """Run the child now (no cache) and parse what it printed."""
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1"}
    try:
        proc = subprocess.run(  # noqa: S603 - our own module, argv list
            [sys.executable, "-c", _CHILD],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return parse_probe("", None, err or "")
    except OSError as exc:
        return ProviderReport(
            False, f"the provider probe could not start: {exc}", probed_s=time.time()
        )
    return parse_probe(proc.stdout, proc.returncode, proc.stderr)


def _static_report() -> ProviderReport | None:
    """The report without a child, where nothing installed could start a CUDA session:
    onnxruntime lists neither the CUDA nor the TensorRT EP and ``tensorrt`` is not
    installed (a CPU-only host, CI). None otherwise (then only a session tells)."""
    import importlib.util

    import onnxruntime as ort

    listed = list(ort.get_available_providers())
    if CUDA_PROVIDER in listed or TRT_PROVIDER in listed:
        return None
    if importlib.util.find_spec("tensorrt") is not None:
        return None
    missing = [
        "tensorrt is not installed (pip install tensorrt, or JetPack's python3-libnvinfer on a Jetson)"
    ]
    if importlib.util.find_spec("pycuda") is None:
        missing.append("pycuda is not installed (pip install pycuda; it needs the CUDA toolkit)")
    data = {
        "probe": PROBE_VERSION,
        "static": True,
        "onnxruntime": ort.__version__,
        "onnxruntime_file": getattr(ort, "__file__", ""),
        "listed": listed,
        "devices": [],
        "devices_why": "not probed: nothing installed here can use a CUDA device",
        "libnvinfer": [False, "not probed: onnxruntime has no TensorRT EP"],
        "dla_cores": dla_cores_on_host(),
        "sessions": {},
        "native": {"devices": [], "missing": missing},
    }
    return ProviderReport(True, "", data, time.time())


def _onnxruntime_dist() -> tuple[str, str]:
    """(version, location) of the onnxruntime that would be imported, without importing
    it (importlib.metadata)."""
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    where = str(spec.origin) if spec and spec.origin else ""
    for dist in ("onnxruntime-gpu", "onnxruntime", "onnxruntime-directml"):
        with contextlib.suppress(md.PackageNotFoundError):
            return f"{dist} {md.version(dist)}", where
    return "?", where


def probe_key() -> str:
    """Short hash (16 hex chars) of what the probe's answer depends on: host name and
    machine, the onnxruntime distribution and its location, ``LD_LIBRARY_PATH``, the NVIDIA
    driver version (``/proc/driver/nvidia/version``) and the Python executable."""
    version, where = _onnxruntime_dist()
    driver = ""
    with contextlib.suppress(OSError):
        driver = Path("/proc/driver/nvidia/version").read_text()[:300]
    parts = [
        platform.node(), platform.machine(), version, where,
        os.environ.get("LD_LIBRARY_PATH", ""), driver, sys.executable, str(PROBE_VERSION),
    ]  # fmt: skip
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _cache_file() -> Path:
    base = os.environ.get("INFSCALER_CACHE_DIR") or str(Path.home() / ".cache" / "infscaler")
    return Path(base) / "probes" / f"providers-{probe_key()}.json"


_MEMO: ProviderReport | None = None
_MEMO_LOCK = threading.Lock()


def probe_providers(*, refresh: bool = False) -> ProviderReport:
    """The host's :class:`ProviderReport`: memoised, cached on disk per :func:`probe_key` (not
    failures; ``INFSCALER_PROBE_NO_CACHE=1`` skips), else :func:`run_probe`; no child where
    nothing installed could use CUDA.
    """
    global _MEMO
    with _MEMO_LOCK:
        if _MEMO is not None and not refresh:
            return _MEMO
        static = _static_report()
        if static is not None:
            _MEMO = static
            return _MEMO
        use_disk = os.environ.get(_ENV_NO_CACHE, "").strip() not in ("1", "true", "yes")
        path = _cache_file() if use_disk else None
        if path is not None and not refresh:
            with contextlib.suppress(OSError, ValueError, TypeError):
                d = json.loads(path.read_text())
                if d.get("ok") and d.get("data", {}).get("probe") == PROBE_VERSION:
                    _MEMO = ProviderReport(True, "", d["data"], float(d.get("probed_s", 0)))
                    return _MEMO
        report = run_probe()
        if path is not None and report.ok:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                tmp.write_text(json.dumps(report.to_dict()))
                os.replace(tmp, path)
        _MEMO = report
        return _MEMO


if __name__ == "__main__":
    sys.exit(main())
