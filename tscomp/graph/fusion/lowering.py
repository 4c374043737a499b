"""Partitioned node sets -> fused groups in the expression IR.

For each group, its compute nodes become :class:`Op` expressions in topological
order; an input read through view operators becomes a :class:`View` chain over
the materialized source (inside the group: over the producing expression;
outside: over an :class:`Input`). Small constants and shape values become
:class:`Const`; weights stay :class:`Input` (they live in memory). A group's
outputs are the values some other group (or the graph's output) needs.
"""
from __future__ import annotations

from tscomp.graph.fusion.expr import Const, Expr, Input, Op, View
from tscomp.graph.fusion.partition import ComputeGraph, GroupState
from tscomp.graph.fusion.plan import Group
from tscomp.graph.ops import registry
from tscomp.graph.views import reshape

#: constants up to this many elements are baked into the group's expression
MAX_INLINE_CONST = 64


class GroupLowering:
    def __init__(self, cg: ComputeGraph, state: GroupState):
        self.cg = cg
        self.graph = cg.graph
        self.state = state
        self.members = set(state.members)
        self.exprs: dict[str, Expr] = {}   # value name -> expression inside the group
        self.inputs: list[str] = []
        self.view_nodes: list[str] = []

    def value(self, name: str) -> Expr:
        if name in self.exprs:
            return self.exprs[name]
        v = self.graph.values[name]
        node = self.cg.producer.get(name)
        if node is not None and node.name in self.cg.views:
            k = node.outputs.index(name)
            expr = self.value(node.inputs[0])
            for op in self.cg.views[node.name][k]:
                expr = View(op.shape, v.dtype, src=expr, op=op)
            if node.name not in self.view_nodes:
                self.view_nodes.append(node.name)
        elif v.symdata is not None or (v.const is not None and v.const.size <= MAX_INLINE_CONST):
            expr = Const(v.shape, v.dtype, value=v.symdata if v.symdata is not None else v.const, name=name)
        else:
            if node is not None and node.name in self.members:
                raise AssertionError(f"{name} used before its producer was lowered")
            expr = Input(v.shape, v.dtype, name=name)
            if name not in self.inputs:
                self.inputs.append(name)
        self.exprs[name] = expr
        return expr

    def lower_node(self, node_name: str) -> None:
        node = self.cg.nodes[node_name]
        opset = self.graph.opset_of(node)
        opdef = registry.lookup(node.op_type, node.domain, opset, node.name)
        args = tuple(self.value(i) if i else None for i in node.inputs)
        for k, out in enumerate(node.outputs):
            if not out:
                continue
            v = self.graph.values[out]
            self.exprs[out] = Op(v.shape, v.dtype, op_type=node.op_type, args=args, attrs=node.attrs,
                                 fusion=opdef.fusion, node=node.name, opset=opset,
                                 num_outputs=len(node.outputs), output_index=k, domain=node.domain)

    def outputs(self) -> dict[str, Expr]:
        graph_outputs = {self.cg.source_value(o) for o in self.graph.outputs}
        outs = {}
        for m in self.state.members:
            for o in self.cg.nodes[m].outputs:
                if not o:
                    continue
                readers = self.cg.readers.get(o, set())
                if (readers - self.members) or o in graph_outputs:
                    outs[o] = self.exprs[o]
        return outs

    def lower(self) -> Group:
        for m in self.state.members:
            self.lower_node(m)
        outputs = self.outputs()
        return Group(name=f"g{self.state.gid}_{self.state.kind}", kind=self.state.kind,
                     nodes=list(self.state.members) + self.view_nodes, inputs=list(self.inputs),
                     outputs=outputs, rules=list(self.state.rules),
                     parts=[GroupLowering(self.cg, s).lower() for s in self.state.parts],
                     unfused=[GroupLowering(self.cg, s).lower() for s in self.state.unfused])


def output_copy_groups(cg: ComputeGraph, start: int) -> list[Group]:
    """Graph outputs that are views, inputs or constants still need a kernel that writes them."""
    groups = []
    for k, name in enumerate(cg.graph.outputs):
        node = cg.producer.get(name)
        if node is not None and node.name not in cg.views:
            continue
        v = cg.graph.values[name]
        state = GroupState(start + k, "elementwise", [], None)
        low = GroupLowering(cg, state)
        expr = low.value(name)
        if isinstance(expr, (Const, Input)) and expr.name == name:
            expr = View(v.shape, v.dtype, src=expr, op=reshape(v.shape))
        groups.append(Group(name=f"g{start + k}_copy", kind="elementwise", nodes=low.view_nodes,
                            inputs=low.inputs, outputs={name: expr}, rules=["output-copy"]))
    return groups


def lower_groups(cg: ComputeGraph, states: list[GroupState]) -> list[Group]:
    groups = [GroupLowering(cg, s).lower() for s in states]
    return groups + output_copy_groups(cg, len(states))


__all__ = ["lower_groups"]
