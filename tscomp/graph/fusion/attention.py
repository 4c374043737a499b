"""Attention fusion: one group for ``MatMul → row reduction → MatMul`` chains of activations
(issue 13; FlashAttention's online softmax, done on the CPU; no paper system fuses across two
backbones).

The backbone-prioritized passes (:mod:`tscomp.graph.fusion.partition`, TSCompiler §4.2) stop at a
second backbone, so self-attention becomes three groups: QKᵀ (scale and mask in its epilogue), the
row Softmax, and P·V -- and the L×L score matrix is written and read twice. This pass runs after
them and merges such a chain into one ``attention`` group when the chain is closed:

* the first group's backbone multiplies two activations (no constant weight: a batched GEMM);
* the middle group is a reduction over exactly the last axis of the first group's result;
* the last group's backbone reads the middle group's result as its left operand and another
  activation as its right one;
* nothing outside the chain reads the first or the middle group's values (so the scores need
  never be materialized) and neither is a graph output.

The rule is structural; whether a merged group can be *compiled* fused is the attention family's
question (it accepts a Softmax over the key axis and refuses anything else). The merged group keeps
its ``parts``, the three groups it was made of, so a compiler whose families refuse it runs the
parts instead (:meth:`tscomp.graph.fusion.plan.Plan.split`).
"""
from __future__ import annotations

from tscomp.graph.fusion.partition import ComputeGraph, GroupState
from tscomp.graph.ops.registry import FusionClass
from tscomp.graph.symbols import same


def _seed(cg: ComputeGraph, g: GroupState):
    """The node a gemm or reduce group grew from: its backbone or its first reduction (None for
    other kinds)."""
    want = {"gemm": FusionClass.BACKBONE, "reduce": FusionClass.REDUCTION}.get(g.kind)
    return next((cg.nodes[m] for m in g.members if cg.fusion_class(m) is want), None)


def _batched_backbone(cg: ComputeGraph, g: GroupState) -> bool:
    """A gemm group whose backbone is a MatMul of two activations."""
    node = _seed(cg, g)
    return (node is not None and g.kind == "gemm" and node.op_type == "MatMul" and len(node.inputs) == 2
            and all(cg.is_activation(v) for v in node.inputs))


def _readers_outside(cg: ComputeGraph, g: GroupState) -> set[str]:
    members = set(g.members)
    return {r for m in g.members for r in cg.value_readers(m)} - members


def _feeds_only(cg: ComputeGraph, g: GroupState, other: GroupState) -> bool:
    """Every reader of ``g``'s values outside ``g`` is in ``other``; none is a graph output."""
    return (_readers_outside(cg, g) <= set(other.members)
            and not any(cg.is_graph_output(m) for m in g.members))


def _last_axis_reduction_of(cg: ComputeGraph, first: GroupState, mid: GroupState) -> bool:
    """``mid`` reduces the rows of ``first``'s backbone result over exactly its last axis."""
    if mid.kind != "reduce" or mid.row_shape is None or mid.row_axes != (len(mid.row_shape) - 1,):
        return False
    node = _seed(cg, mid)
    src = cg.source_node(node.inputs[0])
    out_shape = cg.graph.values[_seed(cg, first).outputs[0]].shape
    return (src in first.members and len(out_shape) == len(mid.row_shape)
            and all(same(a, b) for a, b in zip(out_shape, mid.row_shape)))


def _reads_as_left_operand(cg: ComputeGraph, mid: GroupState, last: GroupState) -> bool:
    node = _seed(cg, last)
    src = cg.source_node(node.inputs[0])
    return src in mid.members or (src in last.members and src != node.name)


def attention_chains(cg: ComputeGraph, states: list[GroupState]) -> list[tuple[GroupState, GroupState, GroupState]]:
    """The closed ``(QKᵀ, row reduction, P·V)`` chains among ``states`` (see the module docstring)."""
    owner = {m: g for g in states for m in g.members}
    chains = []
    for first in states:
        if not _batched_backbone(cg, first):
            continue
        mids = {owner[r].gid: owner[r] for r in _readers_outside(cg, first) if r in owner}
        if len(mids) != 1:
            continue
        mid = next(iter(mids.values()))
        if not (_last_axis_reduction_of(cg, first, mid) and _feeds_only(cg, first, mid)):
            continue
        lasts = {owner[r].gid: owner[r] for r in _readers_outside(cg, mid) if r in owner}
        if len(lasts) != 1:
            continue
        last = next(iter(lasts.values()))
        if _batched_backbone(cg, last) and _feeds_only(cg, mid, last) and _reads_as_left_operand(cg, mid, last):
            chains.append((first, mid, last))
    return chains


def merge_attention(cg: ComputeGraph, states: list[GroupState]) -> list[GroupState]:
    """``states`` (in execution order) with every closed attention chain merged into one
    ``attention`` group at the place of its last part (all its inputs are ready there)."""
    chains = attention_chains(cg, states)
    if not chains:
        return states
    merged_at = {}
    dropped = set()
    for first, mid, last in chains:
        members = first.members + mid.members + last.members
        g = GroupState(first.gid, "attention", members, last.space, operand_spaces=list(last.operand_spaces),
                       rules=list(dict.fromkeys(first.rules + mid.rules + last.rules + ["attention"])),
                       parts=[first, mid, last])
        merged_at[last.gid] = g
        dropped |= {first.gid, mid.gid}
    return [merged_at.get(g.gid, g) for g in states if g.gid not in dropped]


__all__ = ["attention_chains", "merge_attention"]
