"""Function stages for the runtime tests (imported by instance processes: the tests put
this directory on PYTHONPATH)."""

from __future__ import annotations

import os
import time

import numpy as np


def scale(tensors, factor=2.0):
    """y = x * factor."""
    return {"y": np.asarray(tensors["x"], dtype=np.float32) * np.float32(factor)}


def add_one(tensors):
    return {"z": tensors["y"] + np.float32(1.0)}


def split_rows(tensors):
    """Fan-out: one item per row of y (an [N, D] tensor)."""
    x = tensors["y"]
    return [{"row": np.array(x[i])} for i in range(x.shape[0])]


def row_sum(tensors):
    return {"s": np.array([tensors["row"].sum()], dtype=np.float32)}


def gather_sums(items):
    """Fan-in: the per-row sums, in row order."""
    if not items:
        return {"sums": np.zeros((0,), np.float32)}
    return {"sums": np.concatenate([it["s"] for it in items])}


def fail_on_negative(tensors):
    x = tensors["x"]
    if (np.asarray(x) < 0).any():
        raise ValueError("negative input")
    return {"y": np.array(x)}


def slow(tensors, ms=5.0):
    """y unchanged, after ``ms`` milliseconds of sleep."""
    time.sleep(ms / 1e3)
    return {"y": np.array(tensors["y"])}


def wrong_keys(tensors):
    return {"nope": np.zeros(1)}


def pid(tensors):
    return {"y": np.array(tensors["x"]), "pid": np.array([os.getpid()], np.int64)}


def capabilities(tensors):
    """This process's effective capability mask (/proc/self/status CapEff)."""
    with open("/proc/self/status") as f:
        cap = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return {"y": np.array(tensors["x"]), "capeff": np.array([cap], np.uint64)}


def rows_times_two(tensors):
    """y = x * 2 as FP32 rows of 4 (declares its output for the v2 metadata)."""
    return {"y": np.asarray(tensors["x"], dtype=np.float32).reshape(-1, 4) * np.float32(2)}


rows_times_two.outputs_spec = {"y": {"datatype": "FP32", "shape": [-1, 4]}}


def bad_input_check(tensors):
    """Raises the declared input error (400) for an empty x, a ValueError (500) for a
    negative one; else y = x."""
    from infscaler.runtime.serving.instance import StageInputError

    x = np.asarray(tensors["x"])
    if x.size == 0:
        raise StageInputError("x is empty; send at least one row")
    if (x < 0).any():
        raise ValueError("negative input")
    return {"y": np.array(x, dtype=np.float32)}


def gather_strict(items):
    """Fan-in that refuses zero items with the declared input error."""
    from infscaler.runtime.serving.instance import StageInputError

    if not items:
        raise StageInputError("no rows to gather")
    return {"sums": np.concatenate([it["s"] for it in items])}


def slow_row(tensors, ms=5.0):
    """Per-item stage: the row's sum, after ``ms`` milliseconds of sleep."""
    time.sleep(ms / 1e3)
    return {"s": np.array([np.asarray(tensors["row"]).sum()], dtype=np.float32)}


def hold(tensors, path="", max_s=60.0):
    """y unchanged, once the file ``path`` exists (at most ``max_s`` seconds): a test
    holds requests in the pipeline until it releases them."""
    deadline = time.monotonic() + max_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"y": np.array(tensors["y"])}


def spin(tensors, ms=5.0):
    """y unchanged, after ``ms`` milliseconds of CPU work (a busy loop on the thread's
    CPU clock, so a contended core stretches it as it would a model's compute)."""
    end = time.thread_time() + ms / 1e3
    while time.thread_time() < end:
        pass
    return {"y": np.array(tensors["y"])}
