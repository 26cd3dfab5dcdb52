"""Priority levels, as Triton numbers them (``model_config.proto``'s
``ModelDynamicBatching.priority_levels``): 1 is the highest, a larger number lower. A
module of its own so that the request path and the CLI's fast client read the bound
without the pipeline schemas (pydantic)."""

#: The largest priority level a pipeline or a request may name.
MAX_PRIORITY_LEVEL = 1_000_000

__all__ = ["MAX_PRIORITY_LEVEL"]
