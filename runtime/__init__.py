"""On-device runtime: the request path, the instance processes, the SLO monitor and the
asymmetric auto-scaler (InfScaler Algorithm 1), and the planner.

- :mod:`.serving`: the request path (front end, admission, queues, request and instance
  states, the instance process, runners, the pipeline compiler, batching, stats);
- :mod:`.processes`: supervisor, instance handles, the zygote fork server;
- :mod:`.scaling`: monitor -> scaler (pure) -> autoscaler, placement, telemetry, CPU wake;
- :mod:`.planning`: the planner and its simulator, arrivals, deploy-time planning,
  profiles, fleet placement, the live check;
- :mod:`.queueing`: the one capacity and latency model every policy uses (M/D/c, M/G/c).

Imports: ``{scaling, planning} -> processes -> serving -> queueing`` (``.importlinter``). The layer
map and the request path step by step (each step's ``file:function``):
docs/architecture.md, "Layout" and "The request path".
"""
