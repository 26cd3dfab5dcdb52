"""InfScaler-Edge: an edge inference runtime for multi-accelerator SoCs.

Module map. Imports point one way, down this list (a module may use its own layer and
the layers below it); ``.importlinter`` is the contract and
``tests/integration/test_layers.py`` checks it on every test run. The request path, step
by step: :mod:`infscaler.runtime`.

**Facade** (what users run and import; ``infscaler/``): ``cli -> {api, service}``

- :mod:`infscaler.cli` -- the ``infscaler`` command: the app and :func:`main`; each
  command's module is loaded when it runs: :mod:`~infscaler.cli.models` (models, devices,
  inspect, partition), :mod:`~infscaler.cli.service` (serve, demo),
  :mod:`~infscaler.cli.client` (deploy, undeploy, infer, status), :mod:`~infscaler.cli.plan`
  (plan, plan --fleet), :mod:`~infscaler.cli.fleet` (watch-pipelines, probe),
  :mod:`~infscaler.cli.variants` (variants); :mod:`~infscaler.cli.watcher` (the
  pipeline-directory watcher) and :mod:`~infscaler.cli.fleetfile` (fleet files)
- :mod:`infscaler.api` -- the KServe v2 / Triton HTTP API on the Unix socket:
  :mod:`~infscaler.api.server` (app, middlewares, socket; routes in
  :mod:`~infscaler.api.routes` and :mod:`~infscaler.api.repo`, HTTP limits in
  :mod:`~infscaler.api.http`, shared keys in :mod:`~infscaler.api.common`), the codec
  :mod:`~infscaler.api.codec` (with :mod:`~infscaler.api.codec_json` and
  :mod:`~infscaler.api.codec_tensors`), the Python client :mod:`~infscaler.api.client`,
  Triton system shared memory :mod:`~infscaler.api.sysshm`, Prometheus metrics
  :mod:`~infscaler.api.metrics`
- :mod:`infscaler.service` -- :class:`~infscaler.service.service.Service`: deploys
  pipelines and wires the runtime (tensor pool, channel, sharing manager, front end,
  supervisor, auto-scaler); :mod:`~infscaler.service.status` (what
  ``/v2/infscaler/status`` and ``infscaler status`` show); :mod:`~infscaler.service.systemd`
  (sd_notify)
- :mod:`infscaler.pipelines` -- the bundled sample pipelines (``ocr``, ``dddd``): YAML
  and the function stages they name

**Model-less serving** (:mod:`infscaler.modelless`, INFaaS): a task query -> a variant
(task router, selector, variant registry and its registration).

**Runtime** (:mod:`infscaler.runtime`, ``runtime/``): ``serving/`` (the request path),
``processes/`` (supervisor, zygote), ``scaling/`` (monitor, scaler -- Algorithm 1 --,
auto-scaler), ``planning/`` (planner, simulator, deploy-time planning, profiles).

**Below the runtime**

- :mod:`infscaler.shm` (``shm/``) -- token-based zero-copy tensor sharing (§IV-B): the
  pool (``pool``: the manager's allocator; ``slabmap``: the instances' mappings;
  ``slab``: the format both share; ``cleanup``: what a killed run left), leases, the
  service-side manager and the instance-side client; above ebpf
- :mod:`infscaler.partitioner` (``partitioner/``) -- offline bottleneck-aware
  partitioning (InfScaler §IV-A, Eq. 1); uses neither shm nor ebpf
- :mod:`infscaler.ebpf` (``ebpf/``) -- the control channel (eBPF sockmap or user space)
  and its wire format, the 32-byte token
- :mod:`infscaler.engines` -- the engine layer (CPU / GPU / DLA behind one interface):
  every onnxruntime / TensorRT session is built there

**Base** (:mod:`infscaler.base`): errors, pipeline config schemas (and Triton
``config.pbtxt`` mapped onto them, :mod:`~infscaler.base.triton`), device profiles, model
resolution, SLOs, the socket's security checks, sample images. Every layer may use
it; it uses none of them.

Where to start reading: ``README.md``; then :class:`~infscaler.service.service.Service`
(``deploy``), :mod:`infscaler.runtime.serving.pipeline` (what a pipeline compiles to) and
the request path map in :mod:`infscaler.runtime`.

Importing :mod:`infscaler` (and :mod:`infscaler.cli`) is cheap: heavy dependencies
(onnxruntime, onnx, matplotlib, TensorRT, aiohttp, httpx) are imported by the modules
that need them, and the CLI loads a command's module only when it runs.
"""

from infscaler.base import __version__
from infscaler.base.errors import InfScalerError

__all__ = ["InfScalerError", "__version__"]
