"""Backbone-prioritized fusion (TSCompiler §4.2, Fig. 3): partition the compute
nodes of a simplified Graph into groups, in prioritized passes that each scan
the whole graph.

The graph is a NetworkX DiGraph over *compute* nodes; view operators
(Reshape, Transpose, Squeeze/Unsqueeze, Flatten, Expand, constant Slice/Split)
are not nodes but the edges' index maps, so they are absorbed by whichever
group reads through them and are never materialized.

Passes, in priority order: GEMM-level (backbones MatMul/Gemm/Conv grow
prologues and epilogues), reduce-level (Softmax/LayerNorm/Reduce* with their
prologue/epilogue, and stitching reductions over the same rows), then
elementwise/injective groups, then opaque operators alone.

The rules (:data:`RULES`) are data: which group kind absorbs which operator
class in which direction, and under which condition:

* ``gemm-epilogue`` — elementwise/injective consumers of a GEMM (bias, scale,
  mask, activation chains such as GELU's Erf or Tanh form, residual add) run on
  the accumulator before the single store, if they keep the GEMM's element
  count (no broadcast into a larger space);
* ``gemm-prologue`` — an elementwise producer used only by the GEMM that feeds
  one of its operands (directly or through the prologue), of that operand's
  size, runs while the operand is packed;
* ``gemm-row-reduction`` — a reduction over exactly the last axis of the GEMM's
  output space, when that axis is the GEMM's static N (the LayerNorm after an
  output projection), finishes in the epilogue: one tile can span the whole row
  (N ≤ 4096);
* ``reduce-prologue`` / ``reduce-epilogue`` — single-use elementwise/injective
  producers feeding the reduction (embedding Gathers and adds before a
  LayerNorm) and consumers (the IsNaN/Where guard after a Softmax) of the size
  of the reduction's input or of its rows;
* ``reduce-stitch`` — further reductions over the same rows (same input shape,
  same reduced axes, as each op's registry entry declares them) join the group
  (LayerNorm's mean and variance in its decomposed form);
* ``elementwise-consumer`` / ``elementwise-producer`` — what remains merges
  into groups of equal element count (mask computation chains).

Every absorption keeps the group DAG acyclic, and a producer is only absorbed
when no other group needs its value (recomputation would be wasteful).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import networkx as nx
import sympy

from tscomp.graph.ir import Graph, Node
from tscomp.graph.ops import registry
from tscomp.graph.ops.registry import FusionClass
from tscomp.graph.shape_propagation import node_context, reduced_axes, trailing_row_axes
from tscomp.graph.symbols import numel, same

E, I, R, B, O = (FusionClass.ELEMENTWISE, FusionClass.INJECTIVE, FusionClass.REDUCTION,
                 FusionClass.BACKBONE, FusionClass.OPAQUE)

#: the widest row a GEMM epilogue may normalize (one tile spans it)
MAX_ROW_REDUCTION_N = 4096


# ----------------------------------------------------------------------------- compute graph
class ComputeGraph:
    """The simplified Graph with views folded into edges, as a NetworkX DiGraph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producer = graph.producers()
        self.order = graph.toposorted()
        self.index = {n.name: k for k, n in enumerate(self.order)}
        self.nodes = {n.name: n for n in self.order}
        self.views = {n.name: chains for n in self.order if (chains := self._view_chains(n)) is not None}
        self.dg = nx.DiGraph()
        for n in self.order:
            if n.name not in self.views:
                self.dg.add_node(n.name)
        for n in self.order:
            if n.name in self.views:
                continue
            for value in n.inputs:
                src = self.source_node(value) if value else None
                if src is not None:
                    self.dg.add_edge(src, n.name)
        self.readers: dict[str, set[str]] = {}
        for n in self.order:
            if n.name not in self.views:
                for value in n.inputs:
                    if value:
                        self.readers.setdefault(self.source_value(value), set()).add(n.name)

    def _view_chains(self, node: Node):
        opdef = registry.lookup(node.op_type, node.domain, self.graph.opset_of(node), node.name)
        if opdef.view_rule is None:
            return None
        ctx = node_context(self.graph, node)  # the same facts the shape rules saw
        outs = [self.graph.values[o].shape for o in node.outputs]
        return opdef.view_rule(ctx, outs)

    def fusion_class(self, name: str) -> FusionClass:
        n = self.nodes[name]
        return registry.lookup(n.op_type, n.domain, self.graph.opset_of(n), n.name).fusion

    def source_value(self, value: str) -> str:
        """The materialized tensor a value is a view of (itself if it is not a view)."""
        while value in self.producer and self.producer[value].name in self.views:
            value = self.producer[value].inputs[0]
        return value

    def is_activation(self, value: str) -> bool:
        """Whether ``value`` (read through any views) is computed at run time, not a weight."""
        v = self.graph.values[self.source_value(value)]
        return v.const is None and v.symdata is None

    def source_node(self, value: str) -> str | None:
        src = self.source_value(value)
        node = self.producer.get(src)
        return node.name if node is not None else None

    def value_readers(self, node_name: str) -> set[str]:
        """Compute nodes reading any output of ``node_name`` (through views)."""
        out = set()
        for o in self.nodes[node_name].outputs:
            out |= self.readers.get(o, set())
        return out

    def is_graph_output(self, node_name: str) -> bool:
        outs = set(self.graph.outputs)
        return any(self.source_value(o) == v for o in outs for v in self.nodes[node_name].outputs if v)


# ----------------------------------------------------------------------------- group state
@dataclass
class GroupState:
    gid: int
    kind: str
    members: list[str]
    space: sympy.Expr                 # element count of the main iteration space
    row_space: sympy.Expr | None = None
    operand_spaces: list[sympy.Expr] = field(default_factory=list)
    row_n: int | None = None          # static N of a GEMM (for row reductions)
    #: the rows its reductions run over: the reduced input's shape and its reduced axes
    row_shape: tuple | None = None
    row_axes: tuple[int, ...] | None = None
    #: the heavy op and the prologue nodes feeding it (what a new prologue node must feed)
    feeders: set[str] = field(default_factory=set)
    rules: list[str] = field(default_factory=list)
    #: the groups a merged group was made of (:mod:`tscomp.graph.fusion.attention`)
    parts: list["GroupState"] = field(default_factory=list)
    #: what runs instead when no kernel family accepts the group (:func:`unfused_parts`)
    unfused: list["GroupState"] = field(default_factory=list)


class Partitioner:
    def __init__(self, cg: ComputeGraph):
        self.cg = cg
        self.graph = cg.graph
        self.group_of: dict[str, int] = {}
        self.groups: dict[int, GroupState] = {}

    # --- facts about nodes -----------------------------------------------------------
    def out_numel(self, name: str, k: int = 0) -> sympy.Expr:
        return numel(self.graph.values[self.cg.nodes[name].outputs[k]].shape)

    def in_numel(self, name: str, k: int = 0) -> sympy.Expr:
        return numel(self.graph.values[self.cg.nodes[name].inputs[k]].shape)

    def reduction_rows(self, name: str) -> tuple[tuple, tuple[int, ...]] | None:
        """(input shape, reduced axes) of a reduction, or None when run time decides the axes."""
        node = self.cg.nodes[name]
        axes = reduced_axes(self.graph, node)
        if axes is None:
            return None
        return tuple(self.graph.values[node.inputs[0]].shape), tuple(sorted(axes))

    def set_rows(self, g: GroupState, name: str) -> None:
        g.row_shape, g.row_axes = self.reduction_rows(name)
        g.row_space = numel([d for k, d in enumerate(g.row_shape) if k not in g.row_axes])

    def single_use(self, g: GroupState, name: str) -> bool:
        members = set(g.members) | {name}
        return self.cg.value_readers(name) <= members and not self.cg.is_graph_output(name)

    # --- the acyclicity check ----------------------------------------------------------
    def creates_cycle(self, g: GroupState, cand: str) -> bool:
        """Would the group DAG get a cycle if ``cand`` joined ``g``? (a path leaving the new
        group and coming back through other nodes or groups)"""
        inside = set(g.members) | {cand}
        frontier = [s for m in inside for s in self.cg.dg.successors(m) if s not in inside]
        seen: set[str] = set()
        while frontier:
            x = frontier.pop()
            if x in seen:
                continue
            seen.add(x)
            gid = self.group_of.get(x)
            block = self.groups[gid].members if gid is not None else [x]
            for m in block:
                seen.add(m)
                for s in self.cg.dg.successors(m):
                    if s in inside:
                        return True
                    if s not in seen:
                        frontier.append(s)
        return False

    # --- growing -----------------------------------------------------------------------
    def new_group(self, kind: str, seed: str) -> GroupState:
        gid = len(self.groups)
        node = self.cg.nodes[seed]
        g = GroupState(gid, kind, [seed], self.out_numel(seed))
        if kind == "gemm":
            g.operand_spaces = [self.in_numel(seed, k) for k, i in enumerate(node.inputs) if i]
            n_dim = self.graph.values[node.outputs[0]].shape[-1]
            # a row reduction joins the GEMM's row pass only when B is a weight: the batched kernel
            # (two activations: Swin's window attention has a static 49-key row) has no row pass,
            # and the Softmax left separate lets the attention pass merge QK^T, Softmax and PV
            if node.op_type in ("MatMul", "Gemm") and n_dim.is_Integer and not self.cg.is_activation(node.inputs[1]):
                g.row_n = int(n_dim)
        elif kind == "reduce":
            g.space = self.in_numel(seed)
            if self.reduction_rows(seed) is not None:
                self.set_rows(g, seed)
        g.feeders = {seed}
        self.groups[gid] = g
        self.group_of[seed] = gid
        return g

    def absorb(self, g: GroupState, name: str, rule: str) -> None:
        g.members.append(name)
        self.group_of[name] = g.gid
        if rule not in g.rules:
            g.rules.append(rule)

    def candidates(self, g: GroupState, direction: str) -> list[str]:
        nbrs = set()
        for m in g.members:
            nbrs |= set(self.cg.dg.successors(m) if direction == "consumer" else self.cg.dg.predecessors(m))
        return sorted((n for n in nbrs if n not in self.group_of), key=self.cg.index.get)

    def grow(self, g: GroupState) -> None:
        rules = [r for r in RULES if r.group_kind == g.kind]
        changed = True
        while changed:
            changed = False
            for rule in rules:
                for cand in self.candidates(g, rule.direction):
                    if (self.cg.fusion_class(cand) in rule.absorbs and rule.condition(self, g, cand)
                            and not self.creates_cycle(g, cand)):
                        self.absorb(g, cand, rule.name)
                        if rule.on_absorb is not None:
                            rule.on_absorb(self, g, cand)
                        changed = True

    def run(self) -> list[GroupState]:
        for kind, classes in PASSES:
            for name in self.cg.dg.nodes:
                if name not in self.group_of and self.cg.fusion_class(name) in classes:
                    g = self.new_group(kind, name)
                    if kind != "opaque":
                        self.grow(g)
        return self.ordered_groups()

    def ordered_groups(self) -> list[GroupState]:
        q = nx.DiGraph()
        q.add_nodes_from(self.groups)
        for u, v in self.cg.dg.edges:
            gu, gv = self.group_of[u], self.group_of[v]
            if gu != gv:
                q.add_edge(gu, gv)
        first = {gid: min(self.cg.index[m] for m in g.members) for gid, g in self.groups.items()}
        order = nx.lexicographical_topological_sort(q, key=first.get)
        out = []
        for gid in order:
            g = self.groups[gid]
            g.members.sort(key=self.cg.index.get)
            out.append(g)
        return out


# ----------------------------------------------------------------------------- the rules
def _keeps_space(p: Partitioner, g: GroupState, cand: str) -> bool:
    n = p.out_numel(cand)
    return same(n, g.space) or same(n, g.row_space)


def _operand_producer(p: Partitioner, g: GroupState, cand: str) -> bool:
    """A single-use producer of the heavy op's operands (directly or through the prologue)."""
    n = p.out_numel(cand)
    spaces = g.operand_spaces if g.kind == "gemm" else [g.space, g.row_space]
    return (p.single_use(g, cand) and bool(p.cg.value_readers(cand) & g.feeders)
            and any(same(n, s) for s in spaces))


def _add_feeder(p: Partitioner, g: GroupState, cand: str) -> None:
    g.feeders.add(cand)


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def _row_reduction_of_gemm(p: Partitioner, g: GroupState, cand: str) -> bool:
    """A reduction over exactly the last axis of a tensor of the GEMM's output space whose
    last axis is the GEMM's static N."""
    rows = p.reduction_rows(cand)
    if g.row_n is None or g.row_n > MAX_ROW_REDUCTION_N or rows is None:
        return False
    shape, axes = rows
    if axes != (len(shape) - 1,) or not same(shape[-1], g.row_n) or not same(numel(shape), g.space):
        return False
    return g.row_shape is None or (_same_shape(shape, g.row_shape) and axes == g.row_axes)


def _rows_are_trailing(g: GroupState) -> bool:
    """Whether the reduce group's rows are its input's trailing axes (unit axes after them
    allowed): what the row kernel reduces. A reduction over leading axes (SwiftFormer sums tokens
    over axis 1) stays a group of its own, which the index family's any-axes kernel compiles; fused
    with its neighbours it was a group no family takes, run on the numpy fallback."""
    return g.row_shape is not None and trailing_row_axes(g.row_shape, g.row_axes) is not None


def _row_kernel_group(condition):
    """``condition``, for a reduce group whose rows the row kernel can reduce."""
    return lambda p, g, cand: _rows_are_trailing(g) and condition(p, g, cand)


def _set_rows(p: Partitioner, g: GroupState, cand: str) -> None:
    p.set_rows(g, cand)


def _same_rows(p: Partitioner, g: GroupState, cand: str) -> bool:
    rows = p.reduction_rows(cand)
    return (rows is not None and g.row_shape is not None and rows[1] == g.row_axes
            and _same_shape(rows[0], g.row_shape))


@dataclass(frozen=True)
class FusionRule:
    name: str
    group_kind: str
    absorbs: frozenset
    direction: str                                   # "consumer" | "producer"
    condition: Callable[[Partitioner, GroupState, str], bool]
    on_absorb: Callable[[Partitioner, GroupState, str], None] | None = None


RULES: tuple[FusionRule, ...] = (
    FusionRule("gemm-epilogue", "gemm", frozenset({E, I}), "consumer", _keeps_space),
    FusionRule("gemm-row-reduction", "gemm", frozenset({R}), "consumer", _row_reduction_of_gemm,
               on_absorb=_set_rows),
    FusionRule("gemm-prologue", "gemm", frozenset({E}), "producer", _operand_producer, on_absorb=_add_feeder),
    FusionRule("reduce-epilogue", "reduce", frozenset({E, I}), "consumer", _row_kernel_group(_keeps_space)),
    FusionRule("reduce-stitch", "reduce", frozenset({R}), "consumer", _row_kernel_group(_same_rows)),
    FusionRule("reduce-prologue", "reduce", frozenset({E, I}), "producer", _row_kernel_group(_operand_producer),
               on_absorb=_add_feeder),
    FusionRule("elementwise-consumer", "elementwise", frozenset({E, I}), "consumer", _keeps_space),
    FusionRule("elementwise-producer", "elementwise", frozenset({E, I}), "producer",
               lambda p, g, c: p.single_use(g, c) and _keeps_space(p, g, c)),
)

#: pass order and the operator classes that seed each pass's groups
PASSES: tuple[tuple[str, frozenset], ...] = (
    ("gemm", frozenset({B})),
    ("reduce", frozenset({R})),
    ("elementwise", frozenset({E, I})),
    ("opaque", frozenset({O, FusionClass.SHAPE})),
)


def unfused_parts(cg: ComputeGraph, g: GroupState) -> list[GroupState]:
    """A GEMM or reduce group's fallback split: its heavy op (the GEMM, the first reduction) with
    the prologue feeding it, then its epilogue as a group of its own (a reduce group when it holds
    a reduction). The rules fuse by shape, not by what a family can generate: an epilogue read
    through a head-merging transpose (BitNet normalizes the attention output right after P·V)
    made a group the batched GEMM family refuses, and BiT's last GroupNorm, whose affine epilogue
    writes [N, C, H, W] back from rows [N, G, C/G, H*W] with H and W nested ceilings, one the row
    family refuses; each then ran whole on the numpy fallback. Split, the heavy part compiles and
    the epilogue goes to the row or elementwise family. An epilogue holding a reduction keeps a split
    of its own (the reduction with what feeds it, then the rest): GPT-2's QDQ export requantizes a
    LayerNorm's output through the [B*L, H] view its Gemm reads, an output index the row family
    cannot store through. Empty when there is nothing to split."""
    if g.kind not in ("gemm", "reduce") or g.parts:
        return []
    epilogue = [m for m in g.members if m not in g.feeders]
    if not epilogue:
        return []
    kind = "reduce" if any(cg.fusion_class(m) is R for m in epilogue) else "elementwise"
    core = GroupState(g.gid, g.kind, [m for m in g.members if m in g.feeders], g.space,
                      operand_spaces=list(g.operand_spaces), feeders=set(g.feeders),
                      rules=[r for r in g.rules if r == "gemm-prologue"])
    rest = GroupState(g.gid, kind, epilogue, g.space, rules=["split-epilogue"])
    if kind == "reduce":
        rest.feeders = _first_reduction_and_feeders(cg, epilogue)
        rest.unfused = unfused_parts(cg, rest)
    return [core, rest]


def _first_reduction_and_feeders(cg: ComputeGraph, members: list[str]) -> set[str]:
    """The first reduction among ``members`` (in graph order) and the members it depends on."""
    first = min((m for m in members if cg.fusion_class(m) is R), key=cg.index.__getitem__)
    return {first} | (nx.ancestors(cg.dg, first) & set(members))


def partition(graph: Graph) -> tuple[ComputeGraph, list[GroupState]]:
    cg = ComputeGraph(graph)
    return cg, Partitioner(cg).run()


__all__ = ["ComputeGraph", "FusionRule", "GroupState", "PASSES", "RULES", "partition", "unfused_parts"]
