"""The one engine layer (issue 14): every onnxruntime session is built in
``runtime/engines/``, one availability probe, one ``EngineUnavailable``.

The source scans cover the installed package (its modules' own files) and the repo's
``bench/`` and ``scripts/``: benchmarks must time what serves. ``tests/`` is exempt: the
tests build independent onnxruntime sessions as oracles for the layer itself (a loader
bug checked against the same loader would be invisible).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def test_importing_the_layer_starts_no_threads() -> None:
    """A fork server forks from a process that imported the engine layer: importing it
    and probing availability must start nothing beyond what onnxruntime's own import
    starts; the first session does (so the check can fail)."""
    code = textwrap.dedent(
        """
        import os
        def threads():
            return len(os.listdir("/proc/self/task"))
        import numpy, onnx, onnxruntime
        base = threads()
        import infscaler.engines as e
        import infscaler.engines.cpu, infscaler.engines.gpu
        from infscaler.engines.onnxrt.loader import load_session
        e.engine_availability()
        after = threads()
        m = onnx.helper.make_model(onnx.helper.make_graph(
            [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", 1, [2])],
            [onnx.helper.make_tensor_value_info("y", 1, [2])]),
            opset_imports=[onnx.helper.make_opsetid("", 13)])
        m.ir_version = 8
        s = load_session(m, threads=3)
        print(base, after, threads())
        """
    )
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc/self/task on this platform")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    base, after, with_session = map(int, out.stdout.split())
    assert after == base
    assert with_session > after  # the intra-op pool: started by a session, not an import
