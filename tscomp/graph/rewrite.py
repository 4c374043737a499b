"""Emitting the replacement of one node: the value and node helpers graph rewrites share.

A rewrite (an Einsum as views around a MatMul, a 3-D convolution as a 2-D one) replaces a node by
several whose values it must register with their symbolic shapes -- simplification runs after shape
propagation, so nothing infers them later. Every value and node is named after the replaced node
and the rewrite (``<node>/<kind>_<tag>``), which keeps generated kernels' headers readable.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import sympy

from tscomp.graph.ir import Graph, Node


def replace_nodes(graph: Graph, replacement: Callable[[Graph, Node], list[Node] | None]) -> int:
    """Every node for which ``replacement`` returns nodes replaced by them, in place and in order
    (None keeps the node); returns how many were replaced."""
    replaced = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        new = replacement(graph, node)
        if new is None:
            nodes.append(node)
        else:
            nodes += new
            replaced += 1
    graph.nodes = nodes
    return replaced


class NodeRewrite:
    """Emits the replacement nodes of ``node`` (in order, into :attr:`nodes`)."""

    #: the rewrite's name in every value and node it creates (``<node>/<kind>_<tag>``)
    kind = "rewrite"

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node = graph, node
        self.nodes: list[Node] = []
        self.dtype = graph.values[node.outputs[0]].dtype
        self.opset = graph.opset_of(node)

    def _value(self, tag: str, shape, const=None, dtype=None) -> str:
        return self.graph.add_value(f"{self.node.name}/{self.kind}_{tag}", dtype or self.dtype, shape, const)

    def _ints(self, tag: str, ints) -> str:
        arr = np.asarray(list(ints), dtype=np.int64)
        return self._value(tag, arr.shape, arr, np.int64)

    def _shape_value(self, tag: str, dims) -> str:
        """An int64 shape whose elements may be expressions of the symbols (a Reshape target merging
        symbolic extents), evaluated at the run-time binding like a folded shape subgraph's."""
        dims = [sympy.sympify(d) for d in dims]
        if all(d.is_Integer for d in dims):
            return self._ints(tag, [int(d) for d in dims])
        name = self._value(tag, (len(dims),), dtype=np.int64)
        self.graph.values[name].symdata = np.array(dims, dtype=object)
        return name

    def _emit(self, op: str, inputs: list[str], tag: str, shape, attrs=None, out: str | None = None) -> str:
        y = out or self._value(tag, shape)
        self.nodes.append(Node(f"{self.node.name}/{self.kind}_{tag}", op, inputs, [y], dict(attrs or {})))
        return y

    def transpose_to(self, x: str, perm: list[int], shape, tag: str, out: str | None = None) -> str:
        return self._emit("Transpose", [x], tag, [shape[p] for p in perm], {"perm": list(perm)}, out=out)

    def reshape(self, x: str, shape, tag: str, out: str | None = None) -> str:
        return self._emit("Reshape", [x, self._shape_value(f"{tag}_shape", shape)], tag, list(shape), out=out)

    def unsqueeze(self, x: str, shape: list, axes: list[int], tag: str) -> tuple[str, list]:
        if not axes:
            return x, shape
        out = list(shape)
        for ax in sorted(axes):
            out.insert(ax, sympy.Integer(1))
        if self.opset >= 13:
            return self._emit("Unsqueeze", [x, self._ints(f"{tag}_axes", axes)], tag, out), out
        return self._emit("Unsqueeze", [x], tag, out, {"axes": list(axes)}), out

    def squeeze(self, x: str, shape: list, axes: list[int], tag: str) -> tuple[str, list]:
        if not axes:
            return x, shape
        out = [d for i, d in enumerate(shape) if i not in axes]
        if self.opset >= 13:
            return self._emit("Squeeze", [x, self._ints(f"{tag}_axes", axes)], tag, out), out
        return self._emit("Squeeze", [x], tag, out, {"axes": list(axes)}), out


__all__ = ["NodeRewrite", "replace_nodes"]
