"""Function stages for tests/{unit,integration}/test_fused.py (imported by instance processes: the tests put
this directory on PYTHONPATH). Around a small ONNX model ``y = x @ W + b`` (FP32 [N, 4])."""

from __future__ import annotations

import os
import time

import numpy as np


def prep(tensors, factor=2.0):
    """inp = x * factor (FP32 [N, 4]); an empty x is the client's fault (400), a NaN the
    service's (500)."""
    from infscaler.runtime.serving.instance import StageInputError

    x = np.asarray(tensors["x"], dtype=np.float32)
    if x.size == 0:
        raise StageInputError("x is empty; send at least one row")
    if np.isnan(x).any():
        raise ValueError("x holds NaN")
    return {"inp": x.reshape(-1, 4) * np.float32(factor)}


def post(tensors, ms=0.0):
    """z = out + 1 (after ``ms`` ms of sleep), and this process's pid."""
    if ms:
        time.sleep(ms / 1e3)
    return {
        "z": np.asarray(tensors["out"]) + np.float32(1.0),
        "pid": np.array([os.getpid()], np.int64),
    }


def rows(tensors, min_sum=None):
    """Fan-out: one item per row of z (with ``min_sum``: the rows summing to more)."""
    z = np.asarray(tensors["z"])
    keep = [i for i in range(z.shape[0]) if min_sum is None or z[i].sum() > min_sum]
    return [{"row": np.array(z[i : i + 1])} for i in keep]


def row_prep(tensors):
    """r = row / 2 (FP32 [1, 4])."""
    return {"r": np.asarray(tensors["row"], dtype=np.float32) * np.float32(0.5)}


def row_post(tensors, limit=1e6):
    """s = sum of the row's model output ([1] FP32); fails (500) above ``limit``."""
    s = float(np.asarray(tensors["o2"]).sum())
    if s > limit:
        raise RuntimeError(f"row sum {s:.1f} above {limit}")
    return {"s": np.array([s], np.float32)}


def gather(items):
    """Fan-in: the per-row sums, in row order."""
    if not items:
        return {"sums": np.zeros((0,), np.float32)}
    return {"sums": np.concatenate([np.asarray(it["s"]) for it in items])}
