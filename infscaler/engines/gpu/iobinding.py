"""An onnxruntime GPU session run through IOBinding, outputs into pre-allocated host arrays.

More: docs/engines.md, "`infscaler/engines/gpu/iobinding.py`".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from infscaler.engines.base import InferenceError
from infscaler.engines.onnxrt.runner import run_session

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["BoundSession", "HostMemory"]


class HostMemory(Protocol):
    """Host memory registered with CUDA (page-locked and mapped), as an instance's pool
    slabs are (:class:`~infscaler.shm.unified.UnifiedSlabMap`)."""

    integrated: bool
    """True on an integrated GPU (the device reads host DRAM at full speed)."""

    def pointer_of(self, array: np.ndarray) -> int | None:
        """The device pointer of ``array`` when it lies in registered memory (registering
        its slab on first use), else None."""


class BoundSession:
    """``session`` run through IOBinding on CUDA device ``device_index``; inputs may lie in
    ``host_memory`` (registered). Not thread-safe (one binding reused per call).

    Attributes:
        counts: inputs bound ``device`` / ``pinned`` / ``host`` and outputs returned
            ``preallocated`` / ``ort``, since creation.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        *,
        device_index: int = 0,
        host_memory: HostMemory | None = None,
    ) -> None:
        self.session = session
        self.device_index = int(device_index)
        self.host_memory = host_memory
        self.binding = session.io_binding()
        self.counts = {"device": 0, "pinned": 0, "host": 0, "preallocated": 0, "ort": 0}
        from infscaler.engines.onnxrt.runner import session_tensor_infos

        self._outputs = {t.name: t for t in session_tensor_infos(session.get_outputs(), "session")}

    def _bind_input(self, name: str, arr: np.ndarray) -> None:
        where, ptr = "cpu", int(arr.ctypes.data)
        kind = "host"
        if self.host_memory is not None:
            dptr = self.host_memory.pointer_of(arr)
            if dptr is not None:
                kind = "pinned"
                if self.host_memory.integrated:
                    where, ptr, kind = "cuda", int(dptr), "device"
        self.binding.bind_input(
            name,
            where,
            self.device_index if where == "cuda" else 0,
            arr.dtype,
            list(arr.shape),
            ptr,
        )
        self.counts[kind] += 1

    def run(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: list[str],
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Run once on checked ``feeds``; outputs into ``out``'s arrays (exact dtype and shape,
        C-contiguous) where given, else allocated.

        Returns:
            ``{output name: array}`` the caller owns.

        Raises:
            InferenceError: onnxruntime failed, or an ``out`` array does not fit.
        """
        if any(a.dtype == object for a in feeds.values()) or any(
            self._outputs[n].dtype == object for n in outputs
        ):
            return run_session(self.session, dict(feeds), outputs)
        b = self.binding
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        keep = []  # contiguous copies must live until the run ends
        for name, value in feeds.items():
            arr = value if value.flags.c_contiguous else np.ascontiguousarray(value)
            keep.append(arr)
            self._bind_input(name, arr)
        result: dict[str, np.ndarray] = {}
        late: list[str] = []
        for name in outputs:
            info = self._outputs[name]
            dst = None if out is None else out.get(name)
            if dst is not None:
                if dst.dtype != info.dtype or not dst.flags.c_contiguous or not dst.flags.writeable:
                    raise InferenceError(
                        f"output '{name}': the array to write into must be a writable, "
                        f"C-contiguous {info.dtype.name} array, got {dst.dtype.name}"
                    )
            elif not info.is_dynamic:
                dst = np.empty(info.shape, info.dtype)
            if dst is None:
                b.bind_output(name, "cpu")
                late.append(name)
                continue
            b.bind_output(name, "cpu", 0, dst.dtype, list(dst.shape), int(dst.ctypes.data))
            result[name] = dst
            self.counts["preallocated"] += 1
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:  # onnxruntime's pybind exception types
            raise InferenceError(f"onnxruntime failed: {str(exc).strip()}") from exc
        finally:
            del keep
        if late:  # copy_outputs_to_cpu: every bound output, in the order bound
            for name, value in zip(outputs, b.copy_outputs_to_cpu(), strict=True):
                if name in late:
                    result[name] = np.array(value, copy=True)
                    self.counts["ort"] += 1
        return {n: result[n] for n in outputs}

    def describe(self) -> dict[str, Any]:
        return {"io_binding": True, "bound": dict(self.counts)}
