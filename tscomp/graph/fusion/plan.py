"""The Plan: the graph stage's output — fused groups in execution order, and the
tensors that cross between them (TSCompiler §4.2, Fig. 3).

A :class:`Group` is a backbone (GEMM/Conv), a reduction, or nothing (a pure
elementwise/injective group), with everything fused around it held in one
expression DAG (:mod:`tscomp.graph.fusion.expr`). Only group inputs and outputs
live in memory; everything inside a group stays in registers/caches.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import sympy

from tscomp.graph.fusion.expr import Expr, Op, split_prologue_epilogue, walk
from tscomp.graph.ir import Graph
from tscomp.graph.symbols import numel


@dataclass
class Group:
    name: str
    kind: str                      # "gemm" | "reduce" | "elementwise" | "opaque"
    nodes: list[str]               # ONNX nodes fused into it (compute ops and absorbed views)
    inputs: list[str]              # materialized tensors it reads
    outputs: dict[str, Expr]       # materialized tensors it writes, each an expression
    rules: list[str] = field(default_factory=list)  # fusion rules that grew it
    #: the finer groups a merged group was made of, in execution order (an ``attention`` group's
    #: QKᵀ, softmax and P·V groups): what runs when no kernel family accepts the merged group
    parts: list["Group"] = field(default_factory=list)
    #: a fused group's fallback split (its heavy op, then its epilogue): what runs when no kernel
    #: family accepts the fused group (:func:`tscomp.graph.fusion.partition.unfused_parts`)
    unfused: list["Group"] = field(default_factory=list)

    @property
    def splittable(self) -> bool:
        return bool(self.parts or self.unfused)

    @property
    def backbone(self) -> str | None:
        heavy = [e for e in self.ops() if e.heavy]
        backbones = [e for e in heavy if e.fusion.value == "backbone"]
        first = backbones or heavy
        return first[0].op_type if first else None

    def ops(self) -> list[Op]:
        return [e for e in walk(self.outputs.values()) if isinstance(e, Op)]

    def prologue_epilogue(self):
        return split_prologue_epilogue(self.outputs.values())

    def iteration_space(self) -> tuple[sympy.Expr, ...]:
        """The shape the group's main loop nest covers: its heavy op's input (GEMM: the output
        M×N with batch dims), else its largest output."""
        _, heavy, _ = self.prologue_epilogue()
        if heavy:
            h = heavy[0]
            return h.shape if h.fusion.value == "backbone" else h.args[0].shape
        return max((e.shape for e in self.outputs.values()), key=len)


@dataclass
class Plan:
    graph: Graph
    groups: list[Group]
    rewrites: list[str] = field(default_factory=list)  # graph rewrites done before partitioning

    def split(self, names) -> "Plan":
        """This plan with each group named in ``names`` replaced by its parts (a merged group) or
        its unfused split (a fused one)."""
        names = set(names)
        groups = []
        for g in self.groups:
            if g.name in names and not g.splittable:
                raise ValueError(f"group {g.name} was neither merged from parts nor fused: it cannot be split")
            groups.extend((g.parts or g.unfused) if g.name in names else [g])
        return Plan(self.graph, groups, self.rewrites)

    def crossing_values(self) -> list[str]:
        """Tensors that live in memory between groups (group outputs)."""
        return [name for g in self.groups for name in g.outputs]

    def describe(self) -> list[str]:
        lines = []
        for g in self.groups:
            pro, heavy, epi = g.prologue_epilogue()
            lines.append(f"{g.name} [{g.kind}] backbone={g.backbone or '-'} "
                         f"space=[{', '.join(str(d) for d in g.iteration_space())}]")
            lines.append(f"    prologue: {', '.join(o.op_type for o in pro) or '-'}")
            lines.append(f"    heavy:    {', '.join(o.op_type for o in heavy) or '-'}")
            lines.append(f"    epilogue: {', '.join(o.op_type for o in epi) or '-'}")
            lines.append(f"    reads {', '.join(g.inputs) or '-'}; writes {', '.join(g.outputs)}")
        return lines

    def to_json(self) -> list[dict]:
        return [{"name": g.name, "kind": g.kind, "backbone": g.backbone, "ops": list(g.nodes),
                 "inputs": list(g.inputs), "outputs": list(g.outputs), "rules": list(g.rules),
                 "iteration_space": [str(d) for d in g.iteration_space()]} for g in self.groups]


def tensor_bytes(graph: Graph, name: str) -> sympy.Expr:
    v = graph.values[name]
    return numel(v.shape) * np.dtype(v.dtype).itemsize


def _counts(graph: Graph, name: str, weights: bool) -> bool:
    v = graph.values[name]
    if v.symdata is not None or (v.const is not None and v.const.size <= 1):
        return False  # scalars and shape values are kernel arguments, not memory traffic
    return weights or v.const is None


def plan_traffic(plan: Plan, *, weights: bool = True) -> sympy.Expr:
    """Bytes read and written by all groups: each group reads its inputs and writes its
    outputs once (with ``weights``, constant tensors count as reads too)."""
    total = sympy.Integer(0)
    for g in plan.groups:
        for name in list(g.inputs) + list(g.outputs):
            if _counts(plan.graph, name, weights):
                total += tensor_bytes(plan.graph, name)
    return total


def unfused_traffic(graph: Graph, *, weights: bool = True) -> sympy.Expr:
    """The same count if every ONNX compute node ran as its own kernel (views included: an
    unfused Transpose reads and writes its tensor)."""
    total = sympy.Integer(0)
    for n in graph.nodes:
        for name in set(i for i in n.inputs if i) | {o for o in n.outputs if o}:
            if _counts(graph, name, weights):
                total += tensor_bytes(graph, name)
    return total


__all__ = ["Group", "Plan", "plan_traffic", "unfused_traffic"]
