"""Bounds shared by the pipeline schemas, the request path and the planners, in a module
of its own so that the request path and the CLI's fast client read them without the
pipeline schemas (pydantic).

Priority levels are numbered as Triton numbers them (``model_config.proto``'s
``ModelDynamicBatching.priority_levels``): 1 is the highest, a larger number lower.
"""

#: The largest priority level a pipeline or a request may name.
MAX_PRIORITY_LEVEL = 1_000_000

#: The most instances one unit (partition or stage) may run: the bound of a stage's
#: ``max_instances``, and what the planner and the scaler assume when none is set.
MAX_INSTANCES_PER_UNIT = 16

__all__ = ["MAX_INSTANCES_PER_UNIT", "MAX_PRIORITY_LEVEL"]
