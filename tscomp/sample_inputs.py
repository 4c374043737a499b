"""Random inputs for a model at a concrete shape, for ``tscomp run`` and ``tscomp bench``.

Floats are standard normal. Integer inputs are made valid for what the model does with them:
an input used as the indices of a Gather on a constant table (token ids into an embedding)
draws from ``[0, rows)``; an input whose name says it is a mask is all ones (attend everywhere);
other integers draw from {0, 1}. Booleans are all true.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tscomp.errors import ExecutionError
from tscomp.graph.ir import Graph


def shape_binding(graph: Graph, given: Mapping[str, int]) -> dict[str, int]:
    """Complete ``given`` (symbol -> value) with each remaining live symbol's minimum; unknown
    names and out-of-range values are errors naming the symbol."""
    infos = {i.name: i for i in graph.symbols.live_symbols()}
    for name, v in given.items():
        if name not in infos:
            raise ExecutionError(f"--shape {name}={v}: the model has no dimension {name!r} "
                                 f"(its dimensions: {', '.join(sorted(infos)) or 'none'})")
    return {name: int(given.get(name, info.min)) for name, info in infos.items()}


def _index_bound(graph: Graph, name: str) -> int | None:
    bounds = []
    for node in graph.consumers().get(name, []):
        if node.op_type == "Gather" and len(node.inputs) > 1 and node.inputs[1] == name:
            table = graph.values[node.inputs[0]].const
            if table is not None:
                axis = int(node.attrs.get("axis", 0))
                bounds.append(int(table.shape[axis]))
    return min(bounds) if bounds else None


def random_inputs(graph: Graph, binding: Mapping[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name in graph.inputs:
        v = graph.values[name]
        shape = tuple(int(graph.symbols.evaluate(d, dict(binding))) for d in v.shape)
        dt = np.dtype(v.dtype)
        if dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            out[name] = np.ones(shape, dt)
        elif "mask" in name.lower():
            out[name] = np.ones(shape, dt)
        else:
            hi = _index_bound(graph, name) or 2
            out[name] = rng.integers(0, hi, size=shape).astype(dt)
    return out


__all__ = ["random_inputs", "shape_binding"]
