"""Execute a Plan with numpy by interpreting each group's expression IR.

This is the reference semantics of fused groups: an :class:`Op` runs its registry
reference on its evaluated arguments, a :class:`View` applies its index map, a
:class:`Const` with symbolic elements is evaluated at the binding. Only group
outputs are kept between groups — exactly the tensors the Plan says cross memory.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from tscomp.errors import ExecutionError, TscompError
from tscomp.graph.fusion.expr import Const, Expr, Input, Op, View, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops import registry
from tscomp.graph.ops.registry import OpCall
from tscomp.graph.reference import bind_symbols, materialize
from tscomp.graph.views import apply_view


def evaluate_group(plan: Plan, group: Group, env: Mapping[str, np.ndarray],
                   binding: dict[str, int]) -> dict[str, np.ndarray]:
    symbols = plan.graph.symbols

    def ev(expr) -> int:
        return symbols.evaluate(expr, binding)

    memo: dict[int, np.ndarray] = {}
    for e in walk(group.outputs.values()):
        memo[id(e)] = _evaluate(e, memo, env, ev, plan, binding)
    return {name: memo[id(e)] for name, e in group.outputs.items()}


def _evaluate(e: Expr, memo, env, ev, plan: Plan, binding) -> np.ndarray:
    if isinstance(e, Input):
        return env[e.name]
    if isinstance(e, Const):
        if e.symbolic:
            flat = [ev(x) for x in e.value.reshape(-1)]
            return np.array(flat, dtype=e.dtype).reshape(e.value.shape)
        return e.value
    if isinstance(e, View):
        return apply_view(memo[id(e.src)], e.op, ev)
    if isinstance(e, Op):
        opdef = registry.lookup(e.op_type, e.domain, e.opset, e.node)
        args = [memo[id(a)] if a is not None else None for a in e.args]
        call = OpCall(e.node, e.op_type, e.attrs, e.opset, e.num_outputs)
        try:
            out = registry.run_reference(opdef, call, args)[e.output_index]
        except TscompError:
            raise
        except Exception as exc:
            raise ExecutionError(f"{e.op_type} node {e.node!r} (fused): {type(exc).__name__}: {exc}") from exc
        return out.astype(e.dtype, copy=False)
    raise TypeError(f"unknown expression node {type(e).__name__}")


def run_plan(plan: Plan, inputs: Mapping[str, np.ndarray], *, check_ranges: bool = True) -> dict[str, np.ndarray]:
    graph = plan.graph
    binding = bind_symbols(graph, inputs, check_ranges=check_ranges)
    env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in inputs.items()}
    produced = set(plan.crossing_values())
    for g in plan.groups:
        for name in g.inputs:
            if name not in env and name not in produced:
                env[name] = materialize(graph, graph.values[name], binding)
    last_read = {}
    for k, g in enumerate(plan.groups):
        for name in g.inputs:
            last_read[name] = k
    for k, g in enumerate(plan.groups):
        env.update(evaluate_group(plan, g, env, binding))
        for name in g.inputs:  # free what no later group reads
            if last_read.get(name) == k and name not in graph.outputs and name not in inputs:
                env.pop(name, None)
    return {o: env[o] for o in graph.outputs}
