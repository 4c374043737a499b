"""Graph stage: ONNX import, symbolic shape propagation, simplification, reference execution."""
from __future__ import annotations

import os
from typing import Sequence

from tscomp.graph.dims import DimSpec
from tscomp.graph.ir import Graph, Node, Value
from tscomp.graph import ops  # noqa: F401  (registers operators)
from tscomp.graph.onnx_import import import_model, read_model
from tscomp.graph.shape_propagation import propagate_shapes, unresolved_values
from tscomp.graph.resolution import UnresolvedShapeError, require_resolved_shapes
from tscomp.graph.simplify import simplify


def load_model(path: str | os.PathLike, dims: Sequence[DimSpec | str] = (), *,
               simplify_graph: bool = True) -> Graph:
    """Read an ONNX file, propagate symbolic shapes, and (by default) simplify."""
    specs = [d if isinstance(d, DimSpec) else DimSpec.parse(d) for d in dims]
    graph = import_model(read_model(path), specs, source=str(path))
    propagate_shapes(graph)
    if simplify_graph:
        simplify(graph)
    return graph


__all__ = ["DimSpec", "Graph", "Node", "Value", "load_model", "import_model", "read_model",
           "propagate_shapes", "simplify", "unresolved_values", "require_resolved_shapes",
           "UnresolvedShapeError"]
