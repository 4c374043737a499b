"""The Graph IR: values with a dtype and a symbolic shape, nodes, and the graph.

A :class:`Value` carries what shape propagation learned about a tensor:

* ``dtype`` — a numpy dtype;
* ``shape`` — a tuple of SymPy integer expressions over the graph's symbols
  (``None`` until propagation reaches it);
* ``const`` — the concrete numpy array when the value is a constant
  (initializer, Constant node, or folded);
* ``symdata`` — for small integer tensors that *hold shapes* (outputs of Shape
  and everything computed from them), the element values as a numpy object
  array of SymPy expressions. This is what lets
  ``Reshape(x, Concat(Shape(x)[0], 12, 64))`` get a symbolic output shape;
* ``integer_range`` — for a float tensor a rewrite built to hold only integers (a quantized
  tensor's zero-point-shifted float form: :mod:`tscomp.graph.quantized_arithmetic`), the
  inclusive ``(lo, hi)`` every element lies in; a kernel family may compute with it in a narrower
  type that holds those integers exactly.

Nodes keep ONNX's operator vocabulary and attributes (already converted to
Python/numpy values). The graph owns the :class:`SymbolTable`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy

from tscomp.graph.symbols import SymbolTable, shape_str


@dataclass
class Value:
    name: str
    dtype: np.dtype | None = None
    shape: tuple[sympy.Expr, ...] | None = None
    const: np.ndarray | None = None
    symdata: np.ndarray | None = None
    integer_range: tuple[int, int] | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def known_at_compile_time(self) -> bool:
        """A constant, or a shape-valued tensor whose elements are expressions of the symbols."""
        return self.const is not None or self.symdata is not None

    def describe(self) -> str:
        dt = "?" if self.dtype is None else np.dtype(self.dtype).name
        sh = "?" if self.shape is None else shape_str(self.shape)
        return f"{self.name}: {dt}{sh}"


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""

    def describe(self) -> str:
        return f"{self.op_type} node {self.name!r}"


@dataclass
class Graph:
    name: str
    nodes: list[Node]
    values: dict[str, Value]
    inputs: list[str]  # runtime inputs (not initializers)
    outputs: list[str]
    symbols: SymbolTable
    opset: dict[str, int]
    source: str = "<memory>"

    def value(self, name: str) -> Value:
        return self.values[name]

    def add_value(self, name: str, dtype, shape, const: np.ndarray | None = None) -> str:
        """Register a value a rewrite creates (int extents become SymPy integers); returns ``name``."""
        self.values[name] = Value(name, np.dtype(dtype), tuple(sympy.Integer(d) if isinstance(d, int) else d
                                                              for d in shape), const=const)
        return name

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def folded(self, node: Node) -> bool:
        """Whether constant / shape folding computed every output of ``node`` (it leaves the compute
        graph with :func:`tscomp.graph.simplify.remove_folded_nodes`)."""
        return all(self.values[o].known_at_compile_time for o in node.outputs if o)

    def opset_of(self, node: Node) -> int:
        return self.opset.get(node.domain or "", self.opset.get("", 0))

    def toposorted(self) -> list[Node]:
        """Nodes in an order where producers precede consumers (ONNX already requires it,
        but rewrites may append nodes)."""
        prod = self.producers()
        seen: set[str] = set()
        order: list[Node] = []
        ready = {name for name, v in self.values.items() if name not in prod}
        pending = list(self.nodes)
        while pending:
            progressed = False
            rest = []
            for n in pending:
                if all((not i) or i in ready for i in n.inputs):
                    order.append(n)
                    seen.add(n.name)
                    ready.update(o for o in n.outputs if o)
                    progressed = True
                else:
                    rest.append(n)
            if not progressed:
                names = ", ".join(n.name for n in rest[:5])
                raise ValueError(f"graph has a cycle or a missing input near: {names}")
            pending = rest
        return order
