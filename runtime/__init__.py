"""On-device runtime: engines (CPU / GPU / DLA), partition instances, pipeline routing,
admission, the SLO monitor and the asymmetric auto-scaler (InfScaler Algorithm 1).

The request path
----------------

One inference request, from the client's HTTP request on the Unix socket to its answer.
Each step names the function that does it (``file:function``, paths from the repository
root; ``tests/unit/runtime/test_request_path_map.py`` checks that every anchor exists). Reading these
nine files in this order is reading the path: ``infscaler/api/client.py``,
``infscaler/api/server.py``, ``infscaler/api/routes.py``, ``infscaler/api/codec.py``,
``infscaler/service/service.py``, ``runtime/serving/frontend.py``, ``runtime/serving/admission.py``,
``runtime/serving/instance.py``, and the transport below them, ``shm/client.py`` and
``shm/manager.py`` (slots and tokens) with ``ebpf/channel.py`` (token hand-over).

1. ``infscaler/api/client.py:Client.infer``: the client encodes the inputs
   (``infscaler/api/codec.py:encode_infer_request``: JSON, binary tensor data, or system
   shared memory) and sends ``POST /v2/models/{name}/infer`` on the Unix socket.
2. ``infscaler/api/server.py:start_unix_server``: the service listens on the socket
   (``infscaler/api/sockets.py:bind_unix_socket``: mode and group final before it appears);
   each connection is an ``infscaler/api/http.py:EdgeRequestHandler`` (read
   deadlines, the connection cap, 400 / 408 JSON for broken HTTP).
3. ``infscaler/api/server.py:_errors``: the outer middleware; whatever a later step raises
   becomes v2 error JSON with its status and ``Retry-After``.
4. ``infscaler/api/server.py:_admission``: twice the declared body size is reserved from the
   bytes-in-flight budget before the body is read
   (``infscaler/service/service.py:Service.reserve_bytes`` ->
   ``runtime/serving/admission.py:ByteBudget.reserve``); over it, 503.
5. ``infscaler/api/routes.py:infer``: the handler reads the body once
   (``infscaler/api/routes.py:read_body``) and decodes it against the pipeline's
   inputs (``infscaler/api/codec.py:decode_infer_request``; 400 for a bad request).
6. ``infscaler/service/service.py:Service.submit`` -> ``runtime/serving/frontend.py:FrontEnd.submit``:
   admission at arrival (``runtime/serving/admission.py:admit_request``: admit, or 503 with a
   reason and ``retry_after_s``); the deadline goes into the deadline table; the
   request is queued (phase ``queued``, ``runtime/serving/states.py:RequestPhase``) and the
   handler awaits its future.
7. ``runtime/serving/frontend.py:FrontEnd._start_backlog``: in priority order (level, then
   arrival: ``runtime/serving/queues.py``), when its pipeline's window and the
   pool have room, the inputs are written once into a pool slot and a DATA token goes to
   the first unit's hop (``shm/client.py:InstanceClient.send_tensors``; phase
   ``running``).
8. ``ebpf/channel.py:Endpoint.send``: the token crosses the control channel; the
   channel (the SK_MSG program ``ebpf/tokenbus.bpf.c``, or the userspace router)
   delivers it to one live instance of that hop. DATA it cannot deliver goes to the
   manager (``shm/manager.py:TensorSharingManager._on_data``), which holds or fails it.
9. ``runtime/serving/instance.py:Instance.serve_one``: an instance (its own process, spawned by
   ``runtime/processes/supervisor.py:Supervisor.start``) reads the token and maps the slot
   (``shm/client.py:InstanceClient.recv_input``), drops a request already dead
   (``runtime/serving/instance.py:Instance._drop_dead``), runs its unit
   (``runtime/serving/instance.py:Instance._process``) and hands the outputs on to the next
   hop (``runtime/serving/instance.py:Instance._hand_over``); steps 8-9 repeat per unit, and
   the last unit's outputs go back to the front end's hop (0).
10. ``runtime/serving/frontend.py:FrontEnd._receive``: the front end takes results and errors
    (``runtime/serving/frontend.py:FrontEnd._on_token``), gathers fan-out items and runs the
    fan-in (``runtime/serving/frontend.py:FrontEnd._on_item``), and completes the request's
    future (``runtime/serving/frontend.py:FrontEnd._complete``; phase ``done``). A request past
    its deadline is failed with 503 by ``runtime/serving/frontend.py:FrontEnd._expire``.
11. ``infscaler/api/routes.py:_infer_response``: the handler encodes the outputs
    (``infscaler/api/codec.py:encode_infer_response``) and answers; step 4's
    reservation is released.
12. ``infscaler/api/client.py:Client.infer`` decodes the answer
    (``infscaler/api/codec.py:decode_infer_response``) into an ``InferResult``.

The packages
------------

Four sub-packages, one role each; the arrows are import-linter contracts (``.importlinter``,
checked on every test run): ``{scaling, planning} -> processes -> serving`` (scaling and planning use each other: the
planner simulates the scaler, the autoscaler re-plans), and the pure
policies import neither processes nor I/O.

- :mod:`.serving`, the request path: :mod:`~.serving.frontend` (hop 0: requests in and
  out of the token pipeline), :mod:`~.serving.route` (a deployed pipeline as routed, its
  service-time estimates; a result), :mod:`~.serving.admission` (what is accepted at
  arrival; pure), :mod:`~.serving.states` (request phases and instance states, one
  transition table each), :mod:`~.serving.instance` (one process per unit instance: the
  serving loop), :mod:`~.serving.runners` (what it runs: a model, a function, a fused
  chain), :mod:`~.serving.pipeline` (a configuration compiled into units),
  :mod:`~.serving.batching` (dynamic batching; pure), :mod:`~.serving.stats` (latency
  windows, what the route and the monitor read). The engines (CPU / GPU / DLA behind one
  interface) are :mod:`infscaler.engines`, below the runtime.
- :mod:`.processes`: :mod:`~.processes.supervisor` (start, watch, restart, stop
  instances), :mod:`~.processes.handles` (what it knows of each instance and pending
  restart), :mod:`~.processes.zygote` (the fork server instances start from).
- :mod:`.scaling`: :mod:`~.scaling.monitor` (SLO metrics) -> :mod:`~.scaling.scaler` (the
  pure decision, InfScaler Algorithm 1; its types in :mod:`~.scaling.types`, with the one
  resource-cap builder, its queueing model in :mod:`~.queueing` (on a snapshot:
  :mod:`~.scaling.unitmodel`), its cores rules in :mod:`~.scaling.cores`) ->
  :mod:`~.scaling.autoscaler` (the loop applying it, through :mod:`~.scaling.control`,
  what it needs of the service); :mod:`~.scaling.placement`
  (which cores an instance is pinned to; pure), :mod:`~.scaling.wakesetting` (the CPU-wake
  setting; pure),
  :mod:`~.scaling.telemetry` (host CPU, memory, Jetson sensors), :mod:`~.scaling.wakepolicy` and :mod:`~.scaling.pmqos` (CPU wake
  latency), :mod:`~.scaling.idlecurve` (service time after idle).
- :mod:`.planning`: :mod:`~.planning.planner` (the configuration search: its candidates
  in :mod:`~.planning.candidates`, scored by :mod:`~.planning.scoring`, ranked with ties by
  :mod:`~.planning.ranking`, explained by :mod:`~.planning.explain`; the greedy
  :func:`~.planning.planner.plan` in :mod:`~.planning.greedy`; load and cap arithmetic in
  :mod:`~.planning.resources`),
  :mod:`~.planning.simulator` (what scores a candidate: the scaler run on a trace; its
  event loop in :mod:`~.planning.simloop`),
  :mod:`~.planning.arrivals` (arrival processes and the shipped traces),
  :mod:`~.planning.autoplan` (planning at deploy time; one entry, ``plan_measured``,
  for it and ``infscaler plan``; its inputs gathered in :mod:`~.planning.inputs`, its kept
  decisions in :mod:`~.planning.decisions`), :mod:`~.planning.stageprofile`,
  :mod:`~.planning.unitprofile`, :mod:`~.planning.fleet`, :mod:`~.planning.livecheck` (a
  plan checked live), :mod:`~.planning.reference` (a pipeline run in-process, the check of
  served outputs).
"""
