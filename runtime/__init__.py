"""On-device runtime: engines (CPU / GPU / DLA), partition instances, pipeline routing,
admission, the SLO monitor and the asymmetric auto-scaler (InfScaler Algorithm 1).

The request path
----------------

One inference request, from the client's HTTP request on the Unix socket to its answer.
Each step names the function that does it (``file:function``, paths from the repository
root; ``tests/unit/test_request_path_map.py`` checks that every anchor exists). Reading these
nine files in this order is reading the path: ``infscaler/client.py``,
``infscaler/server.py``, ``infscaler/server_routes.py``, ``infscaler/protocol.py``,
``infscaler/service.py``, ``runtime/frontend.py``, ``runtime/admission.py``,
``runtime/instance.py``, and the transport below them, ``shm/client.py`` and
``shm/manager.py`` (slots and tokens) with ``ebpf/channel.py`` (token hand-over).

1. ``infscaler/client.py:Client.infer``: the client encodes the inputs
   (``infscaler/protocol.py:encode_infer_request``: JSON, binary tensor data, or system
   shared memory) and sends ``POST /v2/models/{name}/infer`` on the Unix socket.
2. ``infscaler/server.py:start_unix_server``: the service listens on the socket
   (``infscaler/server.py:bind_unix_socket``: mode and group final before it appears);
   each connection is an ``infscaler/server_http.py:EdgeRequestHandler`` (read
   deadlines, the connection cap, 400 / 408 JSON for broken HTTP).
3. ``infscaler/server.py:_errors``: the outer middleware; whatever a later step raises
   becomes v2 error JSON with its status and ``Retry-After``.
4. ``infscaler/server.py:_admission``: twice the declared body size is reserved from the
   bytes-in-flight budget before the body is read
   (``infscaler/service.py:Service.reserve_bytes`` ->
   ``runtime/admission.py:ByteBudget.reserve``); over it, 503.
5. ``infscaler/server_routes.py:infer``: the handler reads the body once
   (``infscaler/server_routes.py:read_body``) and decodes it against the pipeline's
   inputs (``infscaler/protocol.py:decode_infer_request``; 400 for a bad request).
6. ``infscaler/service.py:Service.submit`` -> ``runtime/frontend.py:FrontEnd.submit``:
   admission at arrival (``runtime/admission.py:admit_request``: admit, or 503 with a
   reason and ``retry_after_s``); the deadline goes into the deadline table; the
   request is queued (phase ``queued``, ``runtime/states.py:RequestPhase``) and the
   handler awaits its future.
7. ``runtime/frontend.py:FrontEnd._start_backlog``: when its pipeline's window and the
   pool have room, the inputs are written once into a pool slot and a DATA token goes to
   the first unit's hop (``shm/client.py:InstanceClient.send_tensors``; phase
   ``running``).
8. ``ebpf/channel.py:Endpoint.send``: the token crosses the control channel; the
   channel (the SK_MSG program ``ebpf/tokenbus.bpf.c``, or the userspace router)
   delivers it to one live instance of that hop. DATA it cannot deliver goes to the
   manager (``shm/manager.py:TensorSharingManager._on_data``), which holds or fails it.
9. ``runtime/instance.py:Instance.serve_one``: an instance (its own process, spawned by
   ``runtime/supervisor.py:Supervisor.start``) reads the token and maps the slot
   (``shm/client.py:InstanceClient.recv_input``), drops a request already dead
   (``runtime/instance.py:Instance._drop_dead``), runs its unit
   (``runtime/instance.py:Instance._process``) and hands the outputs on to the next
   hop (``runtime/instance.py:Instance._hand_over``); steps 8-9 repeat per unit, and
   the last unit's outputs go back to the front end's hop (0).
10. ``runtime/frontend.py:FrontEnd._receive``: the front end takes results and errors
    (``runtime/frontend.py:FrontEnd._on_token``), gathers fan-out items and runs the
    fan-in (``runtime/frontend.py:FrontEnd._on_item``), and completes the request's
    future (``runtime/frontend.py:FrontEnd._complete``; phase ``done``). A request past
    its deadline is failed with 503 by ``runtime/frontend.py:FrontEnd._expire``.
11. ``infscaler/server_routes.py:_infer_response``: the handler encodes the outputs
    (``infscaler/protocol.py:encode_infer_response``) and answers; step 4's
    reservation is released.
12. ``infscaler/client.py:Client.infer`` decodes the answer
    (``infscaler/protocol.py:decode_infer_response``) into an ``InferResult``.

The modules
-----------

- Request path: :mod:`.frontend` (hop 0: requests in and out of the token pipeline),
  :mod:`.route` (a deployed pipeline as routed, its service-time estimates; a result),
  :mod:`.admission` (what is accepted at arrival; pure), :mod:`.states` (request phases
  and instance states, one transition table each), :mod:`.instance` (one process per
  unit instance: the serving loop), :mod:`.runners` (what it runs: a model, a function,
  a fused chain), :mod:`.pipeline` (a configuration compiled into units),
  :mod:`.engines` (CPU / GPU / DLA behind one interface), :mod:`.batching` (dynamic
  batching; pure).
- Processes: :mod:`.supervisor` (start, watch, restart, stop instances),
  :mod:`.handles` (what it knows of each instance and pending restart), :mod:`.zygote`
  (the fork server instances start from).
- Scaling: :mod:`.monitor` (SLO metrics) -> :mod:`.scaler` (the pure decision) ->
  :mod:`.autoscaler` (the loop applying it); :mod:`.stats` (latency windows),
  :mod:`.telemetry` (host CPU, memory, Jetson sensors).
- Planning: :mod:`.planner`, :mod:`.simulator`, :mod:`.arrivals`, :mod:`.autoplan`,
  :mod:`.stageprofile`, :mod:`.unitprofile`, :mod:`.fleet`; :mod:`.reference` (a pipeline
  run in-process, the check of served outputs).
"""
