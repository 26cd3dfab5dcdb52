"""Model-less serving (INFaaS): name a task and its requirements, not a model.

On top of the runtime (it deploys pipelines on a running service and reads their
state); nothing below it imports it. Start with :mod:`~infscaler.modelless.tasks`.

Its modules: docs/variants.md, "`infscaler/modelless/__init__.py`".
"""
