"""Binding a request's inputs to the shape symbols, fast (issue 10: the request path is one native
call, so the Python in front of it is most of the per-call overhead).

:class:`InputBinder` compiles, once per model, what :func:`tscomp.graph.reference.bind_symbols`
decides per call: for each graph input its dtype, rank, which axes bind which symbol, and which
axes must equal an expression of the symbols (compiled to a Python function). A call that passes
every check gets its binding from a tight loop over the shapes (about 1 µs for BERT's three
inputs); anything unusual -- a missing or unknown input, a non-array, a wrong dtype, rank or size
-- goes to ``bind_symbols``, whose errors name the input, the axis and the values.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import sympy

from tscomp.graph.reference import bind_symbols
from tscomp.graph.symbols import compile_int_expr


class InputBinder:
    def __init__(self, graph):
        self.graph = graph
        self.names = tuple(graph.inputs)
        self.specs = []            # (name, dtype, rank, ((axis, symbol), ...), ((axis, fn), ...))
        for name in self.names:
            v = graph.values[name]
            symbols, derived = [], []
            for axis, d in enumerate(v.shape):
                if isinstance(d, sympy.Symbol):
                    symbols.append((axis, d.name))
                else:
                    derived.append((axis, compile_int_expr(graph.symbols.canon(d))))
            self.specs.append((name, np.dtype(v.dtype), len(v.shape), tuple(symbols), tuple(derived)))

    def bind(self, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Symbol name -> value implied by the inputs' shapes (ranges not checked here)."""
        if len(inputs) != len(self.names):
            return bind_symbols(self.graph, inputs, check_ranges=False)
        binding: dict[str, int] = {}
        try:
            for name, dtype, rank, symbols, _ in self.specs:
                arr = inputs[name]
                if type(arr) is not np.ndarray or (arr.dtype is not dtype and arr.dtype != dtype) or arr.ndim != rank:
                    raise LookupError
                shape = arr.shape
                for axis, sym in symbols:
                    if binding.setdefault(sym, shape[axis]) != shape[axis]:
                        raise LookupError
            for name, _, _, _, derived in self.specs:
                shape = inputs[name].shape
                for axis, fn in derived:
                    if fn(binding) != shape[axis]:
                        raise LookupError
        except LookupError:            # KeyError included: let bind_symbols say what is wrong
            return bind_symbols(self.graph, inputs, check_ranges=False)
        return binding


def checkable_relations(graph) -> list:
    """The recorded relations between symbols that the inputs' shapes decide (every symbol in them
    bound by an input axis): the runtime checks them per binding, the host program in C."""
    bound = {d.name for name in graph.inputs for d in graph.values[name].shape if isinstance(d, sympy.Symbol)}
    return graph.symbols.decidable_relations(bound)


__all__ = ["InputBinder", "checkable_relations"]
