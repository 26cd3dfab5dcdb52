"""Run a pipeline in-process, unpartitioned: the reference the served pipeline is checked
against (tests) and the single-process baseline of the benchmarks.

Every model stage runs its WHOLE model in one onnxruntime CPU session (a plan stage runs
the model its plan was made from); function stages are called in order; a fan-out's
items run the per-item stages one by one and the fan-in gets them in item order. No
processes, no shared memory, no tokens: the semantics of :mod:`infscaler.config`
implemented the obvious way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from infscaler.config import PipelineConfig, StageConfig
from infscaler.runtime.pipeline import load_function


class ReferencePipeline:
    """An in-process runner of ``cfg``.

    Args:
        cfg: the pipeline. threads: onnxruntime intra-op threads per session (default:
            all usable cores, as one session with every core, the benchmarks' baseline).
    """

    def __init__(self, cfg: PipelineConfig, threads: int | None = None) -> None:
        import onnxruntime as ort

        from infscaler.models import resolve_model
        from infscaler.partitioner.plan import read_plan

        self.cfg = cfg
        threads = threads or len(os.sched_getaffinity(0))
        self._runs: list[Any] = []
        for st in cfg.stages:
            if st.kind == "function":
                self._runs.append(load_function(st.function or ""))
                continue
            if st.plan is not None:
                path = Path(read_plan(Path(st.plan), load_parts=False).summary["model"]["path"])
            else:
                path = resolve_model(st.model or "")
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self._runs.append(
                ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            )

    def _stage(self, i: int, st: StageConfig, env: dict[str, np.ndarray]) -> Any:
        run = self._runs[i]
        if st.kind == "function":
            return run({k: env[k] for k in st.inputs or []}, **st.params)
        in_map = dict(st.inputs or {}) or {n.name: n.name for n in run.get_inputs()}
        out_map = dict(st.outputs or {}) or {n.name: n.name for n in run.get_outputs()}
        feeds = {m: env[p] for m, p in in_map.items()}
        names = [o.name for o in run.get_outputs()]
        res = run.run(names, feeds)
        return {out_map.get(n, n): v for n, v in zip(names, res, strict=True)}

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one request; returns the pipeline's outputs (for single-model pipelines:
        every model output)."""
        stages = self.cfg.stages
        env = dict(inputs)
        i = 0
        while i < len(stages):
            st = stages[i]
            if st.fan_out:
                items = self._stage(i, st, env)
                j = next(k for k in range(i + 1, len(stages)) if stages[k].fan_in)
                done = []
                for item in items:
                    ienv = {**env, **item}
                    for k in range(i + 1, j):
                        ienv.update(self._stage(k, stages[k], ienv))
                    done.append({n: ienv[n] for n in stages[j].inputs or []})
                env.update(self._runs[j](done, **stages[j].params))
                i = j + 1
                continue
            env.update(self._stage(i, st, env))
            i += 1
        names = self.cfg.outputs
        if names is None:
            last = stages[-1]
            names = list((last.outputs or {}).values()) if isinstance(last.outputs, dict) else None
            if not names:
                sess = self._runs[-1]
                names = [o.name for o in sess.get_outputs()]
        return {n: env[n] for n in names}
