"""Bundled pipelines: function stages (pre- / post-processing) and their ``*.yaml`` files.

Both are served by name: ``infscaler serve ocr`` / ``infscaler serve dddd``.

Function stages follow the contract in :mod:`infscaler.base.config`: ``fn(tensors, **params)``
returns a dict of plain-dtype numpy arrays (a list of them for a ``fan_out`` stage), and a
``fan_in`` stage is called as ``fn(items, **params)``.
"""
