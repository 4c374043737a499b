"""The numpy reference executor: runs a Graph at concrete inputs.

It is the oracle for every later stage (fusion, code generation), so it is
deliberately simple: bind the shape symbols from the inputs, materialize
compile-time values (constants, and shape-holding values whose elements are
SymPy expressions), then run each remaining node's registry reference in
topological order. With ``check_shapes=True`` (the default) every computed
tensor is also checked against its propagated symbolic shape, so a wrong shape
rule surfaces at the node that has it.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import sympy

from tscomp.errors import ExecutionError, ShapeError, TscompError
from tscomp.graph.ir import Graph, Value
from tscomp.graph.ops import registry
from tscomp.graph.ops.registry import OpCall
from tscomp.graph.symbols import shape_str


def bind_symbols(graph: Graph, inputs: Mapping[str, np.ndarray], *, check_ranges: bool = True) -> dict[str, int]:
    """Symbol values implied by the concrete input shapes; errors name the input and axis."""
    binding: dict[str, int] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise ExecutionError(f"missing input {name!r} (expected: {', '.join(graph.inputs)})")
    for name in inputs:
        if name not in graph.inputs:
            raise ExecutionError(f"unknown input {name!r} (expected: {', '.join(graph.inputs)})")
    deferred = []
    for name in graph.inputs:
        v = graph.values[name]
        arr = np.asarray(inputs[name])
        if arr.ndim != len(v.shape):
            raise ExecutionError(f"input {name!r} has rank {arr.ndim}, expected rank {len(v.shape)} "
                                 f"{shape_str(v.shape)}")
        if arr.dtype != v.dtype:
            raise ExecutionError(f"input {name!r} has dtype {arr.dtype}, expected {np.dtype(v.dtype)}")
        for axis, (expr, size) in enumerate(zip(v.shape, arr.shape)):
            if isinstance(expr, sympy.Symbol):
                prev = binding.setdefault(expr.name, size)
                if prev != size:
                    raise ExecutionError(f"input {name!r} axis {axis} is {size}, but symbol {expr.name} "
                                         f"is already {prev} from another input")
            else:
                deferred.append((name, axis, expr, size))
    for name, axis, expr, size in deferred:
        got = graph.symbols.evaluate(expr, binding)
        if got != size:
            raise ExecutionError(f"input {name!r} axis {axis} is {size}, expected {expr} = {got}")
    if check_ranges:
        for sym, val in binding.items():
            info = graph.symbols.get(sym)
            if not info.min <= val <= info.max:
                raise ExecutionError(f"symbol {sym} = {val} is outside its range [{info.min}, {info.max}]")
    return binding


def materialize(graph: Graph, v: Value, binding: Mapping[str, int]) -> np.ndarray:
    """A compile-time value (const or symbolic elements) at a concrete binding."""
    if v.const is not None:
        return v.const
    flat = [graph.symbols.evaluate(e, binding) for e in v.symdata.reshape(-1)]
    return np.array(flat, dtype=v.dtype).reshape(v.symdata.shape)


class ReferenceExecutor:
    def __init__(self, graph: Graph, *, check_shapes: bool = True):
        self.graph = graph
        self.check_shapes = check_shapes
        self.order = graph.toposorted()
        self.opdefs = [registry.lookup(n.op_type, n.domain, graph.opset_of(n), n.name) for n in self.order]
        self.last_use = self._last_uses()

    def _last_uses(self) -> dict[str, int]:
        """Index of the last node reading each value: the executor frees it afterwards, so a
        base-size model at its largest shapes holds only the live tensors."""
        last = {}
        for idx, node in enumerate(self.order):
            for i in node.inputs:
                if i:
                    last[i] = idx
        for o in self.graph.outputs:
            last[o] = len(self.order)
        return last

    def run(self, inputs: Mapping[str, np.ndarray], *, keep_all: bool = False,
            check_ranges: bool = True) -> dict[str, np.ndarray]:
        graph = self.graph
        binding = bind_symbols(graph, inputs, check_ranges=check_ranges)
        env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in inputs.items()}
        produced = {o for n in self.order for o in n.outputs if o}
        for name, v in graph.values.items():
            if name not in produced and name not in env and v.known_at_compile_time:
                env[name] = materialize(graph, v, binding)
        for idx, (node, opdef) in enumerate(zip(self.order, self.opdefs)):
            args = [env[i] if i else None for i in node.inputs]
            call = OpCall(node.name, node.op_type, node.attrs, graph.opset_of(node), len(node.outputs))
            try:
                outs = registry.run_reference(opdef, call, args)
            except TscompError:
                raise
            except Exception as e:
                raise ExecutionError(f"{node.describe()}: reference implementation failed: "
                                     f"{type(e).__name__}: {e}") from e
            for i, out in enumerate(node.outputs):
                if not out:
                    continue
                v = graph.values[out]
                arr = outs[i]
                if v.dtype is not None and arr.dtype != v.dtype:
                    arr = arr.astype(v.dtype)
                if self.check_shapes:
                    self._check_shape(node, v, arr, binding)
                env[out] = arr
            if not keep_all:
                for i in node.inputs:
                    if i and self.last_use.get(i) == idx:
                        env.pop(i, None)
        if keep_all:
            return env
        return {o: env[o] for o in graph.outputs}

    def _check_shape(self, node, v: Value, arr: np.ndarray, binding: dict[str, int]) -> None:
        if v.shape is None:
            return
        if len(v.shape) != arr.ndim:
            raise ShapeError(f"{node.describe()}: output {v.name!r} has rank {arr.ndim} at run time, "
                             f"propagated shape is {shape_str(v.shape)}")
        for axis, (expr, size) in enumerate(zip(v.shape, arr.shape)):
            free = {s.name for s in expr.free_symbols} - set(binding)
            if free:
                # data-dependent symbols get their value from the first tensor that has them alone
                if isinstance(expr, sympy.Symbol):
                    binding[expr.name] = size
                    continue
                raise ShapeError(f"{node.describe()}: cannot evaluate {expr} (unbound {', '.join(free)})")
            want = self.graph.symbols.evaluate(expr, binding)
            if want != size:
                raise ShapeError(f"{node.describe()}: output {v.name!r} axis {axis} is {size} at run time, "
                                 f"but its propagated shape {shape_str(v.shape)} gives {want} at {binding}")


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray], **kw) -> dict[str, np.ndarray]:
    return ReferenceExecutor(graph).run(inputs, **kw)
