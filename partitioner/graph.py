"""Operators, valid cut points and crossing tensors of a DAG model (InfScaler §IV-A).

More (details, why it is so, history, figures): docs/architecture.md, "`partitioner/graph.py`".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import onnx

from infscaler.base.errors import PartitionError
from infscaler.partitioner.cost import constant_tensors
from infscaler.partitioner.extract import PartitionSpec
from infscaler.partitioner.loader import LoadedModel
from infscaler.partitioner.subgraphs import node_reads


@dataclass(frozen=True)
class Operator:
    """One operator of Eq. 1's order: ``index`` n, canonical ``node`` name, ``op_type``, ``node_index``."""

    index: int
    node: str
    op_type: str
    node_index: int


@dataclass
class OperatorGraph:
    """The operator order, constant-node grouping and cut geometry of a loaded model (bytes).

    Attributes:
        operators: in topological order (``operators[n].index == n``).
        constant_nodes / constants: constant node names / constant tensor names.
        producer: tensor -> producing operator (-1 for model inputs).
        last_use: tensor -> last reading operator (N for model outputs).
    """

    loaded: LoadedModel
    operators: list[Operator]
    constant_nodes: set[str]
    constants: set[str]
    producer: dict[str, int]
    last_use: dict[str, int]
    _nodes: dict[str, onnx.NodeProto] = field(repr=False, default_factory=dict)
    _node_index: dict[str, int] = field(repr=False, default_factory=dict)
    _const_deps: dict[str, set[str]] = field(repr=False, default_factory=dict)
    _crossing: list[list[str]] = field(repr=False, default_factory=list)

    @classmethod
    def from_loaded(cls, loaded: LoadedModel) -> OperatorGraph:
        """Group constant nodes, order operators and index producers / last uses.

        Raises:
            PartitionError: the model has no operator (only constants).
        """
        graph = loaded.model.graph
        consts = constant_tensors(loaded.model)
        outputs = {o.name for o in graph.output}
        nodes: dict[str, onnx.NodeProto] = {}
        node_index: dict[str, int] = {}
        const_nodes: set[str] = set()
        operators: list[Operator] = []
        producer_node: dict[str, str] = {}
        for i, node in enumerate(graph.node):
            nodes[node.name] = node
            node_index[node.name] = i
            outs = [o for o in node.output if o]
            for o in outs:
                producer_node[o] = node.name
            is_const = bool(outs) and all(o in consts for o in outs) and not (set(outs) & outputs)
            if is_const:
                const_nodes.add(node.name)
            else:
                operators.append(Operator(len(operators), node.name, node.op_type, i))
        if not operators:
            raise PartitionError(
                f"{loaded.path.name} has no operator that depends on its inputs: "
                "every node computes a constant",
                hint="there is nothing to partition; run the model as is",
            )
        # Constant tensors consumed by a graph output would need to be produced somewhere:
        # treat them as operators' business (rare); they are not crossing tensors.

        # Constant-node closure per node: the constant nodes a node needs, transitively.
        const_deps: dict[str, set[str]] = {}

        def deps_of(tensor: str) -> set[str]:
            name = producer_node.get(tensor)
            if name is None or name not in const_nodes:
                return set()
            if name not in const_deps:
                acc = {name}
                for t in node_reads(nodes[name]):
                    acc |= deps_of(t)
                const_deps[name] = acc
            return const_deps[name]

        op_const_deps: dict[str, set[str]] = {}
        for op in operators:
            acc: set[str] = set()
            for t in node_reads(nodes[op.node]):
                acc |= deps_of(t)
            op_const_deps[op.node] = acc

        n_ops = len(operators)
        producer: dict[str, int] = {}
        for name in loaded.graph_inputs:
            producer[name] = -1
        last_use: dict[str, int] = {}
        for op in operators:
            node = nodes[op.node]
            for t in node_reads(node):
                if t in consts or t not in producer:
                    continue
                last_use[t] = max(last_use.get(t, -1), op.index)
            for o in node.output:
                if o:
                    producer[o] = op.index
        for o in outputs:
            if o in producer:
                last_use[o] = n_ops
        obj = cls(
            loaded=loaded,
            operators=operators,
            constant_nodes=const_nodes,
            constants=consts,
            producer=producer,
            last_use=last_use,
            _nodes=nodes,
            _node_index=node_index,
            _const_deps=op_const_deps,
        )
        obj._crossing = obj._sweep_crossing()
        return obj

    # -- cut geometry -------------------------------------------------------------------

    @property
    def num_operators(self) -> int:
        return len(self.operators)

    def _sweep_crossing(self) -> list[list[str]]:
        """crossing[c] for c in 0..N-2, ordered by producer then name (stable)."""
        n = self.num_operators
        crossing: list[list[str]] = [[] for _ in range(max(n - 1, 0))]
        input_rank = {name: i for i, name in enumerate(self.loaded.graph_inputs)}
        order = sorted(self.last_use, key=lambda t: (self.producer[t], input_rank.get(t, 0), t))
        for t in order:
            start = max(self.producer[t], 0)
            end = min(self.last_use[t], n - 1)  # crosses cuts start .. end-1
            for c in range(start, end):
                crossing[c].append(t)
        return crossing

    def crossing(self, cut: int) -> list[str]:
        """Tensors crossing cut ``cut`` (between operator ``cut`` and ``cut + 1``).

        Raises:
            IndexError: ``cut`` outside 0..N-2.
        """
        if not 0 <= cut < self.num_operators - 1:
            raise IndexError(f"cut {cut} outside 0..{self.num_operators - 2}")
        return list(self._crossing[cut])

    def crossing_bytes(self, cut: int) -> int:
        """Total bytes of the tensors crossing ``cut``."""
        tensors = self.loaded.tensors
        return sum(tensors[t].nbytes for t in self._crossing[cut] if t in tensors)

    def invalid_reason(self, cut: int, max_crossing_bytes: int | None = None) -> str | None:
        """Why ``cut`` is not a valid cut point, or None when it is valid."""
        tensors = self.loaded.tensors
        for t in self._crossing[cut]:
            if t not in tensors:
                return f"crossing tensor '{t}' has no static tensor shape / dtype"
        if max_crossing_bytes is not None:
            nbytes = self.crossing_bytes(cut)
            if nbytes > max_crossing_bytes:
                return f"crossing tensors take {nbytes} bytes > limit {max_crossing_bytes}"
        return None

    def valid_cuts(self, max_crossing_bytes: int | None = None) -> list[int]:
        """Cut indices c in 0..N-2 for which :meth:`invalid_reason` is None."""
        return [
            c
            for c in range(self.num_operators - 1)
            if self.invalid_reason(c, max_crossing_bytes) is None
        ]

    # -- partitions ---------------------------------------------------------------------

    def bounds(self, cuts: Sequence[int]) -> list[tuple[int, int]]:
        """(first, last) operator index of each partition for sorted ``cuts``.

        Raises:
            PartitionError: cuts unsorted, repeated or out of range.
        """
        cuts = list(cuts)
        n = self.num_operators
        if cuts != sorted(set(cuts)) or any(not 0 <= c < n - 1 for c in cuts):
            raise PartitionError(
                f"cuts {cuts} must be strictly increasing operator indices in 0..{n - 2}"
            )
        starts = [0] + [c + 1 for c in cuts]
        ends = cuts + [n - 1]
        return list(zip(starts, ends, strict=True))

    def partition_nodes(self, first: int, last: int) -> list[str]:
        """Node names of operators first..last plus the constant nodes they need,
        in the model's node order (a valid topological order)."""
        names: set[str] = set()
        for op in self.operators[first : last + 1]:
            names.add(op.node)
            names |= self._const_deps[op.node]
        return sorted(names, key=self._node_index.__getitem__)

    def specs(self, cuts: Sequence[int]) -> list[PartitionSpec]:
        """:class:`PartitionSpec` of every partition of a plan with these cuts."""
        bounds = self.bounds(cuts)
        specs: list[PartitionSpec] = []
        for k, (first, last) in enumerate(bounds):
            inputs = self.loaded.graph_inputs if k == 0 else self.crossing(bounds[k - 1][1])
            outputs = self.loaded.graph_outputs if k == len(bounds) - 1 else self.crossing(last)
            specs.append(
                PartitionSpec(
                    index=k,
                    nodes=self.partition_nodes(first, last),
                    inputs=list(inputs),
                    outputs=list(outputs),
                )
            )
        return specs

    def weight_bytes(self, first: int, last: int) -> int:
        """Bytes of the distinct constant tensors read by operators first..last, as held after
        constant folding (an initializer, a ``Constant``'s value, a ``Cast`` / ``Reshape`` of one).
        """
        tensors = self.loaded.tensors
        seen: set[str] = set()
        for op in self.operators[first : last + 1]:
            seen.update(t for t in node_reads(self._nodes[op.node]) if t in self.constants)
        return sum(tensors[t].nbytes for t in seen if t in tensors)

    def peak_activation_bytes(self, first: int, last: int) -> int:
        """Peak bytes of live activations while operators first..last run in order (inputs plus
        outputs until their last reader inside; no buffer sharing).
        """
        tensors = self.loaded.tensors
        inputs = self.loaded.graph_inputs if first == 0 else self._crossing[first - 1]
        live: dict[str, int] = {t: tensors[t].nbytes for t in inputs if t in tensors}
        current = sum(live.values())
        peak = current
        for op in self.operators[first : last + 1]:
            node = self._nodes[op.node]
            for o in node.output:
                if o and o in tensors and o not in self.constants:
                    live[o] = tensors[o].nbytes
                    current += live[o]
            peak = max(peak, current)
            for t in node_reads(node):
                if t in live and self.last_use.get(t, -1) == op.index:
                    current -= live.pop(t)
        return peak
