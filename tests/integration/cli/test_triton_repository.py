"""A Triton model repository served as it is: ``infscaler serve REPO`` and ``serve
--model-repository REPO`` serve every model of ``<repo>/<model>/config.pbtxt`` +
``<model>/<version>/model.onnx``; their outputs equal onnxruntime's on the same model
file; ``infscaler deploy REPO/MODEL`` deploys one; a config.pbtxt that cannot be served
is refused before the service starts, naming the file and the field."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import helper

from infscaler.api.client import Client
from tests.helpers import f32, make_model, rand, save, wait_for

INFSCALER = [sys.executable, "-m", "infscaler"]

ADD = """
name: "add"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "a" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
optimization { graph { level: 1 } }
"""
MM = """
backend: "onnxruntime"
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]
output [ { name: "z" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
"""


def _repository(root: Path) -> Path:
    """``add`` (y = a + b, batched, version 1) and ``mm`` (z = tanh(x W), versions 1
    and 2 with different weights: 2 is served)."""
    repo = root / "repo"
    (repo / "add" / "1").mkdir(parents=True)
    save(
        make_model(
            [helper.make_node("Add", ["a", "b"], ["y"])],
            [f32("a", ["N", 4]), f32("b", ["N", 4])],
            [f32("y", ["N", 4])],
        ),
        repo / "add" / "1" / "model.onnx",
    )
    (repo / "add" / "config.pbtxt").write_text(ADD)
    for v in (1, 2):
        (repo / "mm" / str(v)).mkdir(parents=True)
        save(
            make_model(
                [
                    helper.make_node("MatMul", ["x", "w"], ["m"]),
                    helper.make_node("Tanh", ["m"], ["z"]),
                ],
                [f32("x", ["R", 3])],
                [f32("z", ["R", 2])],
                {"w": rand(3, 2, seed=v, scale=1.0)},
            ),
            repo / "mm" / str(v) / "model.onnx",
        )
    (repo / "mm" / "config.pbtxt").write_text(MM)
    return repo


def _ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


class _Serve:
    """``infscaler serve ARGS`` in the background, its output collected."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.sock = tmp_path / "svc.sock"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [*INFSCALER, "serve", "--socket", str(self.sock), "--control-path", "userspace", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_ready(self) -> None:
        wait_for(
            lambda: (
                any("infscaler: ready" in ln for ln in self.lines) or self.proc.poll() is not None
            ),
            180,
            "the service to deploy the repository",
        )
        assert self.proc.poll() is None, "".join(self.lines)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def test_serve_a_triton_repository_answers_as_onnxruntime(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    serve = _Serve(tmp_path, str(repo))
    try:
        serve.wait_ready()
        out = "".join(serve.lines)
        assert f"warning: {repo / 'add' / 'config.pbtxt'}: optimization is ignored" in out
        with Client(serve.sock) as c:
            assert sorted(m["name"] for m in c.models()) == ["add", "mm"]
            md = c.model_metadata("add")
            assert [(i["name"], i["datatype"], i["shape"]) for i in md["inputs"]] == [
                ("a", "FP32", [-1, 4]),
                ("b", "FP32", [-1, 4]),
            ]
            a, b = rand(3, 4, seed=7), rand(3, 4, seed=8)
            got = c.infer("add", {"a": a, "b": b}).outputs["y"]
            (want,) = _ort(repo / "add" / "1" / "model.onnx", {"a": a, "b": b})
            np.testing.assert_array_equal(got, want)
            x = rand(5, 3, seed=9, scale=1.0)
            got = c.infer("mm", {"x": x}).outputs["z"]
            (want,) = _ort(repo / "mm" / "2" / "model.onnx", {"x": x})  # the latest version
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
            (old,) = _ort(repo / "mm" / "1" / "model.onnx", {"x": x})
            assert not np.allclose(got, old)
    finally:
        serve.stop()


def test_serve_model_repository_flag_and_deploy_one(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    serve = _Serve(tmp_path, "--model-repository", str(repo))
    try:
        serve.wait_ready()
        with Client(serve.sock) as c:
            assert sorted(m["name"] for m in c.models()) == ["add", "mm"]
        r = subprocess.run(
            [
                *INFSCALER,
                "deploy",
                str(repo / "add"),
                "--name",
                "add2",
                "--socket",
                str(serve.sock),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert "optimization is ignored" in r.stderr
        with Client(serve.sock) as c:
            a = rand(2, 4, seed=3)
            got = c.infer("add2", {"a": a, "b": a}).outputs["y"]
            np.testing.assert_array_equal(got, a + a)
    finally:
        serve.stop()


def test_serve_refuses_a_config_it_cannot_serve(tmp_path: Path) -> None:
    env = dict(os.environ, COLUMNS="1000")  # the error on one line: paths are long
    repo = _repository(tmp_path)
    (repo / "mm" / "config.pbtxt").write_text(MM.replace("TYPE_FP32", "TYPE_STRING", 1))
    r = subprocess.run(
        [*INFSCALER, "serve", "--socket", str(tmp_path / "s.sock"), str(repo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2, r.stderr
    assert f"{repo / 'mm' / 'config.pbtxt'}: input[0].data_type TYPE_STRING is not" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "s.sock").exists()
    (repo / "mm" / "config.pbtxt").write_text('platform: "tensorrt_plan"\n')
    r = subprocess.run(
        [*INFSCALER, "serve", "--socket", str(tmp_path / "s.sock"), str(repo / "mm")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 2 and "platform 'tensorrt_plan' is not supported" in r.stderr
