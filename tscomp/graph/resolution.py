"""Refusing models whose shapes stay unresolved after propagation (TSCompiler §4.1).

Symbolic shape propagation (Alg. 1) gives every value a shape over the *named* symbols the inputs
bind (``batch``, ``height``). Where a rule cannot say what a dimension is -- a Reshape to a target
computed from tensor data, a Pad by amounts only known at run time -- it introduces a *fresh*
symbol (``reshape_3``) that no input binds. The runtime could not size such a value, and later stages
would meet it as an unbindable symbol (timing kernel variants at sample shapes used to fail deep
inside numpy). :func:`require_resolved_shapes` refuses the model right after propagation instead, in
one line naming the first unresolved value, the node and the operator that produced it.
"""
from __future__ import annotations

from tscomp.errors import ShapeError
from tscomp.graph.ir import Graph
from tscomp.graph.shape_propagation import unresolved_values
from tscomp.graph.symbols import shape_str


class UnresolvedShapeError(ShapeError):
    """A value's shape depends on a symbol that no model input binds."""


def require_resolved_shapes(graph: Graph) -> None:
    """Raise :class:`UnresolvedShapeError` naming the first value (in node order) whose shape is
    unknown or uses a fresh symbol, with its producing node and op; return quietly otherwise. Values no
    remaining node produces (folded or dead after simplification) do not count."""
    unresolved = set(unresolved_values(graph))
    if not unresolved:
        return
    for node in graph.toposorted():
        for out in node.outputs:
            if out in unresolved:
                v = graph.values[out]
                shape = "unknown" if v.shape is None else shape_str(v.shape)
                fresh = _fresh_symbols_of(graph, v.shape)
                why = (f"{', '.join(fresh)} {'is' if len(fresh) == 1 else 'are'} bound by no input"
                       if fresh else "no shape")
                raise UnresolvedShapeError(
                    f"{graph.source or 'model'}: value {out!r} (output of {node.op_type} node {node.name!r}) "
                    f"has the unresolved shape {shape}: {why}; tscomp cannot compile a model whose shapes "
                    f"the inputs do not determine ({len(unresolved)} unresolved values; "
                    f"see `tscomp inspect --json`)")


def _fresh_symbols_of(graph: Graph, shape) -> list[str]:
    if shape is None:
        return []
    fresh = {i.symbol for i in graph.symbols.infos.values() if i.origin == "fresh"}
    names = {s.name for d in shape for s in d.free_symbols & fresh}
    return sorted(names)
