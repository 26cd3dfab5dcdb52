"""InfScaler-Edge: an edge inference runtime for multi-accelerator SoCs.

Module map. Imports point one way, down this list (a module may use its own layer and
the layers below it); ``.importlinter`` is the contract and ``tests/integration/test_layers.py``
checks it on every test run. Design notes: ``shared/DESIGN.md``; the request path, step
by step: :mod:`infscaler.runtime`.

**Facade** (what users run and import; ``infscaler/``)

- :mod:`~infscaler.cli` -- the ``infscaler`` command: the app and :func:`main`; each
  command's module is loaded when it runs: :mod:`~infscaler.cli_models` (models, devices,
  inspect, partition), :mod:`~infscaler.cli_service` (serve, demo),
  :mod:`~infscaler.cli_client` (deploy, undeploy, infer, status), :mod:`~infscaler.cli_plan`
  (plan, plan --fleet), :mod:`~infscaler.cli_fleet` (watch-pipelines, probe),
  :mod:`~infscaler.cli_variants` (variants)
- :mod:`~infscaler.service` -- :class:`~infscaler.service.Service`: deploys pipelines
  and wires the runtime (tensor pool, channel, sharing manager, front end, supervisor,
  auto-scaler); :mod:`~infscaler.service_status` -- its status and statistics (what
  ``/v2/infscaler/status`` and ``infscaler status`` show)
- :mod:`~infscaler.server` (app, middlewares, socket; routes in ``server_routes``,
  ``server_repo``, HTTP limits in ``server_http``, shared keys in ``server_common``) /
  :mod:`~infscaler.protocol` (codec; ``protocol_json``, ``protocol_tensors``) -- the KServe
  v2 / Triton HTTP API on the Unix socket; :mod:`~infscaler.client` -- its Python client;
  :mod:`~infscaler.sysshm` -- Triton system shared memory; :mod:`~infscaler.metrics` --
  Prometheus metrics
- :mod:`~infscaler.systemd`, :mod:`~infscaler.watcher`, :mod:`~infscaler.fleetfile` --
  sd_notify, the pipeline-directory watcher, fleet files (Kubernetes)
- :mod:`infscaler.pipelines` -- the bundled sample pipelines (``ocr``, ``dddd``): YAML
  and the function stages they name

**Model-less serving** (:mod:`infscaler.modelless`, INFaaS): a task query -> a variant
(task router, selector, variant registry and its registration).

**Runtime** (:mod:`infscaler.runtime`, ``runtime/``): pipeline compiler, instance
processes and their zygote, supervisor, front end and admission, scaler (Algorithm 1),
monitor, auto-scaler, planner and simulator, unit profiles.

**Below the runtime**

- :mod:`infscaler.shm` (``shm/``) -- token-based zero-copy tensor sharing (§IV-B): the
  pool (``pool``: the manager's allocator; ``slabmap``: the instances' mappings;
  ``slab``: the format both share; ``cleanup``: what a killed run left), leases, the
  service-side manager and the instance-side client; above ebpf
- :mod:`infscaler.partitioner` (``partitioner/``) -- offline bottleneck-aware
  partitioning (InfScaler §IV-A, Eq. 1); uses neither shm nor ebpf
- :mod:`infscaler.ebpf` (``ebpf/``) -- the control channel (eBPF sockmap or user space)
  and its wire format, the 32-byte token

**Base** (:mod:`infscaler.base`): errors, pipeline config schemas, device profiles,
model resolution, SLOs, the socket's security checks, sample images, and the engine
layer (:mod:`infscaler.base.engines`: every onnxruntime / TensorRT session is built
there). Every layer may use it; it uses none of them.

Where to start reading: ``README.md``; then :class:`~infscaler.service.Service`
(``deploy``), :mod:`infscaler.runtime.pipeline` (what a pipeline compiles to) and the
request path map in :mod:`infscaler.runtime`.

Importing :mod:`infscaler` (and :mod:`infscaler.cli`) is cheap: heavy dependencies
(onnxruntime, onnx, matplotlib, TensorRT, aiohttp, httpx) are imported by the modules
that need them, and the CLI loads a command's module only when it runs.
"""

from infscaler.base import __version__
from infscaler.base.errors import InfScalerError

__all__ = ["InfScalerError", "__version__"]
