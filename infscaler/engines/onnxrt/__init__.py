"""The onnxruntime backend of the engine layer, laid out like Polygraphy's
``polygraphy/backend/onnxrt/``: :mod:`.loader` builds every ``onnxruntime.InferenceSession``
of InfScaler (:func:`~.loader.load_session`), :mod:`.runner` reads a session's tensors and
runs it. Importing this package neither imports onnxruntime nor starts a thread pool.
More: docs/engines.md, "`infscaler/engines/onnxrt/__init__.py`".
"""
