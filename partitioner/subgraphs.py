"""Names read by nodes with subgraphs from the enclosing graph ("outer-scope" names; ONNX IR
spec, "Names Within a Graph").
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graph-valued attributes of ``node`` (If branches, Loop / Scan bodies, ...)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def free_names(graph: onnx.GraphProto) -> list[str]:
    """Names a subgraph reads from enclosing scopes (recursively), in first-use order."""
    defined = {v.name for v in graph.input}
    defined.update(t.name for t in graph.initializer)
    defined.update(s.values.name for s in graph.sparse_initializer)
    free: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                free.setdefault(name)
        for sub in subgraphs(node):
            for name in free_names(sub):
                if name not in defined:
                    free.setdefault(name)
        defined.update(o for o in node.output if o)
    for out in graph.output:
        if out.name not in defined:
            free.setdefault(out.name)
    return list(free)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """All tensors a node reads: its non-empty inputs, then its subgraphs' outer-scope
    names (each once, in first-use order)."""
    names = dict.fromkeys(i for i in node.input if i)
    for sub in subgraphs(node):
        for name in free_names(sub):
            names.setdefault(name)
    return list(names)
