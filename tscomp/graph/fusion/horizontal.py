"""Horizontal fusion by graph rewriting (TSCompiler §4.2, last step of Fig. 3).

GEMMs that read the same activation with the same reduction size and constant
weights — BERT's Q, K and V projections — become one MatMul on the weights
concatenated along N. A Split (an index map, never materialized) hands each
original consumer its part, so the three bias adds and head transposes then
fuse into the one GEMM's epilogue.
"""
from __future__ import annotations

import numpy as np
import sympy

from tscomp.graph.ir import Graph, Node


def _const_weight(graph: Graph, node: Node) -> np.ndarray | None:
    if node.op_type != "MatMul" or len(node.inputs) != 2:
        return None
    w = graph.values[node.inputs[1]].const
    return w if w is not None and w.ndim == 2 else None


def horizontal_fusion(graph: Graph) -> list[str]:
    """Rewrite sibling MatMuls in place; return a description of each rewrite."""
    by_input: dict[tuple[str, int, str], list[Node]] = {}
    for node in graph.nodes:
        w = _const_weight(graph, node)
        if w is not None:
            by_input.setdefault((node.inputs[0], w.shape[0], str(w.dtype)), []).append(node)
    rewrites = []
    for (activation, _, _), siblings in by_input.items():
        if len(siblings) >= 2:
            rewrites.append(_fuse(graph, activation, siblings))
    return rewrites


def _bias_adds(graph: Graph, siblings: list[Node]) -> list[tuple[Node, np.ndarray]] | None:
    """The ``Add(matmul, bias)`` right after every sibling, if each has one (biases concatenate too,
    so the bias lands in the fused GEMM's epilogue)."""
    consumers = graph.consumers()
    found = []
    for n in siblings:
        users = consumers.get(n.outputs[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or n.outputs[0] in graph.outputs:
            return None
        add = users[0]
        other = add.inputs[1] if add.inputs[0] == n.outputs[0] else add.inputs[0]
        bias = graph.values[other].const
        if bias is None or bias.ndim != 1 or bias.shape[0] != graph.values[n.inputs[1]].const.shape[1]:
            return None
        found.append((add, bias))
    return found


def _fuse(graph: Graph, activation: str, siblings: list[Node]) -> str:
    weights = [graph.values[n.inputs[1]].const for n in siblings]
    sizes = [w.shape[1] for w in weights]
    base = siblings[0].name
    dtype = graph.values[siblings[0].outputs[0]].dtype
    out_shape = graph.values[activation].shape[:-1] + (sympy.Integer(sum(sizes)),)
    fused_w = np.concatenate(weights, axis=1)
    w_name = graph.add_value(f"{base}/hfused_weight", fused_w.dtype, fused_w.shape, fused_w)
    y_name = graph.add_value(f"{base}/hfused_out", dtype, out_shape)
    new_nodes = [Node(f"{base}/hfused", "MatMul", [activation, w_name], [y_name])]
    removed = list(siblings)
    parts = [n.outputs[0] for n in siblings]
    adds = _bias_adds(graph, siblings)
    if adds is not None:
        fused_b = np.concatenate([b for _, b in adds])
        b_name = graph.add_value(f"{base}/hfused_bias", fused_b.dtype, fused_b.shape, fused_b)
        yb_name = graph.add_value(f"{base}/hfused_biased", dtype, out_shape)
        new_nodes.append(Node(f"{base}/hfused_add", "Add", [y_name, b_name], [yb_name]))
        removed += [a for a, _ in adds]
        parts, y_name = [a.outputs[0] for a, _ in adds], yb_name
    new_nodes.append(_split_node(graph, f"{base}/hfused_split", y_name, sizes, parts))
    first = graph.nodes.index(siblings[0])
    drop = {id(n) for n in removed}
    kept = [n for n in graph.nodes[:first] if id(n) not in drop] + new_nodes + \
        [n for n in graph.nodes[first:] if id(n) not in drop]
    graph.nodes = kept
    return (f"horizontal: {', '.join(n.name for n in siblings)} -> {new_nodes[0].name} "
            f"(N = {' + '.join(map(str, sizes))}{', biases merged' if adds else ''})")


def _split_node(graph: Graph, name: str, src: str, sizes: list[int], outputs: list[str]) -> Node:
    if graph.opset.get("", 0) >= 13:
        sizes_name = f"{name}/sizes"
        arr = np.array(sizes, dtype=np.int64)
        graph.add_value(sizes_name, arr.dtype, arr.shape, arr)
        return Node(name, "Split", [src, sizes_name], outputs, {"axis": -1})
    return Node(name, "Split", [src], outputs, {"axis": -1, "split": sizes})
