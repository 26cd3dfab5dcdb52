"""Model-less serving (INFaaS): name a task and its requirements, not a model.

On top of the runtime (it deploys pipelines on a running service and reads their
state); nothing below it imports it. Start with :mod:`~infscaler.modelless.tasks`.

- :mod:`~infscaler.modelless.tasks` -- :class:`TaskRouter`: a task query -> a variant
  (deployed on demand), vertical scaling; each task's interface and pipeline
- :mod:`~infscaler.modelless.selector` -- INFaaS Algorithm 1: the variant state machine,
  selection, vertical-scaling decisions (pure)
- :mod:`~infscaler.modelless.variants` -- the variant registry (SQLite metadata store)
- :mod:`~infscaler.modelless.register` -- ``infscaler variants register``: generate and
  profile the variants of a model (Variant-Generator, Variant-Profiler)
- :mod:`~infscaler.modelless.modelinfo` -- model inspection, int8 dequantisation
- :mod:`~infscaler.modelless.accuracy` -- CER on a text-line set, embedding agreement
- :mod:`~infscaler.modelless.stages` -- the variants' pipeline function stages
"""
