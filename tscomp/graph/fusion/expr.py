"""The fused-group expression IR: one small DAG per group, the single source of truth
that code generation consumes and the reference interpreter executes.

Nodes:

* :class:`Input` — a tensor materialized outside the group (graph input, weight, or
  another group's output), read whole;
* :class:`Const` — a small constant baked into the group (scalars, shape values;
  symbolic elements are evaluated at the run-time binding);
* :class:`View` — an index map (reshape / permute / expand / slice) of another
  expression, never materialized (:mod:`tscomp.graph.views`);
* :class:`Op` — one ONNX operator applied to argument expressions; its semantics
  are the registry entry's (elementwise ops broadcast numpy-style, the backbone
  or reduction op is the group's heavy op).

Every node carries its symbolic shape and dtype. The prologue of a group is what
feeds its heavy op, the epilogue what consumes it (:func:`split_prologue_epilogue`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import sympy

from tscomp.graph.ops.registry import FusionClass
from tscomp.graph.views import ViewOp

Shape = tuple[sympy.Expr, ...]


@dataclass(eq=False)
class Expr:
    shape: Shape
    dtype: np.dtype

    def children(self) -> tuple["Expr", ...]:
        return ()


@dataclass(eq=False)
class Input(Expr):
    name: str = ""

    def __repr__(self) -> str:
        return f"Input({self.name})"


@dataclass(eq=False)
class Const(Expr):
    #: a concrete array, or an object array of SymPy expressions over the symbols
    value: np.ndarray = field(default_factory=lambda: np.zeros(()))
    name: str = ""

    @property
    def symbolic(self) -> bool:
        return self.value.dtype == object

    def __repr__(self) -> str:
        return f"Const({self.name or self.value.tolist()})"


@dataclass(eq=False)
class View(Expr):
    src: Expr = None
    op: ViewOp = None

    def children(self):
        return (self.src,)

    def __repr__(self) -> str:
        return f"View({self.op.describe()}, {self.src!r})"


@dataclass(eq=False)
class Op(Expr):
    op_type: str = ""
    args: tuple[Expr | None, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    fusion: FusionClass = FusionClass.ELEMENTWISE
    node: str = ""           # the ONNX node it comes from
    opset: int = 0
    num_outputs: int = 1
    output_index: int = 0
    domain: str = ""         # the operator's domain ("tscomp" for the graph stage's internal ops)

    def children(self):
        return tuple(a for a in self.args if a is not None)

    @property
    def heavy(self) -> bool:
        return self.fusion in (FusionClass.BACKBONE, FusionClass.REDUCTION)

    def __repr__(self) -> str:
        return f"{self.op_type}[{self.node}]"


def walk(roots) -> Iterator[Expr]:
    """Every node reachable from ``roots`` once, children before parents."""
    seen: set[int] = set()
    order: list[Expr] = []

    def visit(e: Expr) -> None:
        stack = [(e, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children()))
    for r in roots:
        visit(r)
    return iter(order)


def split_prologue_epilogue(roots) -> tuple[list[Op], list[Op], list[Op]]:
    """(prologue ops, heavy ops, epilogue ops) of a group's expression DAG: the prologue is
    what the group's first heavy op (its backbone, else its first reduction) reads; the
    epilogue is every other light op (including those between stitched heavy ops)."""
    nodes = [e for e in walk(roots) if isinstance(e, Op)]
    heavy = [e for e in nodes if e.heavy]
    if not heavy:
        return [], [], nodes
    main = next((e for e in heavy if e.fusion is FusionClass.BACKBONE), heavy[0])
    feeds_main = {id(e) for e in walk(main.children())}
    prologue = [e for e in nodes if not e.heavy and id(e) in feeds_main]
    epilogue = [e for e in nodes if not e.heavy and id(e) not in feeds_main]
    return prologue, heavy, epilogue
