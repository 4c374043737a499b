"""Fusion: Graph -> Plan (TSCompiler §4.2).

``fuse(graph)`` runs horizontal fusion (graph rewriting), the prioritized
partition passes, and lowers every group to the expression IR.
"""
from __future__ import annotations

import dataclasses

from tscomp.graph.fusion.attention import merge_attention
from tscomp.graph.fusion.horizontal import horizontal_fusion
from tscomp.graph.fusion.interpret import run_plan
from tscomp.graph.fusion.lowering import lower_groups
from tscomp.graph.fusion.partition import PASSES, RULES, partition, unfused_parts
from tscomp.graph.fusion.plan import Group, Plan, plan_traffic, unfused_traffic
from tscomp.graph.ir import Graph


def fuse(graph: Graph, *, horizontal: bool = True, attention: bool = True) -> Plan:
    """Partition a propagated, simplified graph into fused groups. With ``horizontal``, sibling
    GEMMs are first merged by rewriting a copy of the graph (``Plan.graph``); ``graph`` itself
    is left as it was. With ``attention``, closed QKᵀ → softmax → P·V chains become one
    ``attention`` group that keeps its three parts (:mod:`tscomp.graph.fusion.attention`). Every
    GEMM or reduce group with an epilogue keeps its unfused split, for when no family accepts it whole."""
    graph = dataclasses.replace(graph, nodes=list(graph.nodes), values=dict(graph.values))
    rewrites = horizontal_fusion(graph) if horizontal else []
    cg, states = partition(graph)
    if attention:
        states = merge_attention(cg, states)
    for s in states:
        for part in [s, *s.parts]:
            part.unfused = unfused_parts(cg, part)
    return Plan(graph, lower_groups(cg, states), rewrites)


__all__ = ["Group", "PASSES", "Plan", "RULES", "fuse", "plan_traffic", "run_plan", "unfused_traffic"]
