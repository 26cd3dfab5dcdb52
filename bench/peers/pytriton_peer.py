"""Serve one ONNX model with NVIDIA Triton (PyTriton), as a Triton user on a CPU host would.

Runs in the peer's own virtualenv (``bench/vs_triton.py --peer-venv``), never in the
project's: ``nvidia-pytriton`` bundles the ``tritonserver`` binary and its python
backend; the model runs in onnxruntime sessions inside the bound callables (PyTriton's
documented way to serve a framework model: https://triton-inference-server.github.io/pytriton/).

Configuration (the knobs a Triton user writes in ``config.pbtxt``):

- ``--instances N --threads T``: N model instances (N callables, each its own
  onnxruntime session with ``intra_op_num_threads = T``, spinning off);
- ``--max-batch B --delay-us D``: dynamic batching with ``max_batch_size = B`` and
  ``max_queue_delay_microseconds = D`` (the model must take a batch dim); ``--max-batch 0``
  binds without ``@batch`` (PyTriton does not start ``@batch`` with ``max_batch_size=0``).

Prints ``READY`` on stdout once both endpoints answer, and serves until
SIGTERM / SIGINT. gRPC and HTTP listen on localhost TCP (Triton has no Unix socket).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

_NP = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(uint8)": np.uint8,
}


def _session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _callable(sess: ort.InferenceSession, batched: bool):
    names = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]

    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        res = sess.run(outs, {n: inputs[n] for n in names})
        return dict(zip(outs, res, strict=True))

    if batched:
        return batch(infer)

    def infer_requests(requests):
        return [infer(**r) for r in requests]

    return infer_requests


def _tensors(args_, sess: ort.InferenceSession, batched: bool):
    def spec(meta) -> Tensor:
        dims = [d if isinstance(d, int) and d > 0 else -1 for d in meta.shape]
        shape = tuple(dims[1:]) if batched else tuple(dims)
        return Tensor(name=meta.name, dtype=_NP[meta.type], shape=shape)

    return [spec(i) for i in sess.get_inputs()], [spec(o) for o in sess.get_outputs()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="ONNX file")
    ap.add_argument("--name", default="model")
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=0)
    ap.add_argument("--delay-us", type=int, default=0)
    ap.add_argument("--grpc-port", type=int, default=18001)
    ap.add_argument("--http-port", type=int, default=18000)
    ap.add_argument("--metrics-port", type=int, default=18002)
    a = ap.parse_args()
    batched = a.max_batch > 0
    sessions = [_session(a.model, a.threads) for _ in range(a.instances)]
    inputs, outputs = _tensors(a, sessions[0], batched)
    config = (
        ModelConfig(
            max_batch_size=a.max_batch,
            batcher=DynamicBatcher(max_queue_delay_microseconds=a.delay_us),
        )
        if batched
        else ModelConfig(max_batch_size=0, batching=False)
    )
    tconf = TritonConfig(
        grpc_address="127.0.0.1",
        grpc_port=a.grpc_port,
        http_address="127.0.0.1",
        http_port=a.http_port,
        metrics_port=a.metrics_port,
        log_verbose=0,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Triton(config=tconf) as triton:
        triton.bind(
            model_name=a.name,
            infer_func=[_callable(s, batched) for s in sessions],
            inputs=inputs,
            outputs=outputs,
            config=config,
            strict=False,
        )
        triton.run()
        print("READY", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
