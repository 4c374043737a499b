"""Graph simplification after shape propagation.

* **Constant folding** happens during propagation (every node whose inputs are
  all constants runs its numpy reference once); here the folded nodes leave
  the graph and their outputs stay as constants.
* **Shape-subgraph folding**: after propagation, every value that holds a
  shape (Shape -> Gather -> Concat -> ...) carries its elements as SymPy
  expressions over the symbols, so the nodes computing it leave the compute
  graph too. Consumers such as Reshape read the expressions, evaluated at the
  run-time binding — shape arithmetic never runs as tensor code.
* **Identity/Dropout removal** (inference: Dropout is the identity).
* **Dead-node elimination**.

Compound operators: LayerNormalization, Softmax and Gelu are *kept* as
recognized compound ops rather than split into primitives. The fusion stage
treats each as one stitched reduction (or elementwise op), which is exactly
what splitting them would have to rediscover; their decomposed forms, which
the TorchScript exporter emits, are matched by the fusion stage instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from tscomp.graph.ir import Graph, Node

PASS_THROUGH_OPS = {"Identity", "Dropout"}


@dataclass
class SimplifyReport:
    folded: int = 0
    pass_through_removed: int = 0
    dead_removed: int = 0

    def __str__(self) -> str:
        return (f"folded {self.folded} constant/shape nodes, removed {self.pass_through_removed} "
                f"Identity/Dropout, {self.dead_removed} dead nodes")


def simplify(graph: Graph) -> SimplifyReport:
    report = SimplifyReport()
    report.folded = remove_folded_nodes(graph)
    report.pass_through_removed = remove_pass_through(graph)
    report.dead_removed = eliminate_dead_nodes(graph)
    release_unused_constants(graph)
    return report


def _compile_time(graph: Graph, name: str) -> bool:
    v = graph.values[name]
    return v.const is not None or v.symdata is not None


def remove_folded_nodes(graph: Graph) -> int:
    keep = [n for n in graph.nodes if not all(_compile_time(graph, o) for o in n.outputs if o)]
    removed = len(graph.nodes) - len(keep)
    graph.nodes = keep
    return removed


def remove_pass_through(graph: Graph) -> int:
    outputs = set(graph.outputs)
    rename: dict[str, str] = {}
    keep: list[Node] = []
    for n in graph.nodes:
        if n.op_type in PASS_THROUGH_OPS and n.outputs[0] not in outputs and not _uses_dropout_mask(n, graph):
            src = n.inputs[0]
            rename[n.outputs[0]] = rename.get(src, src)
        else:
            keep.append(n)
    for n in keep:
        n.inputs = [_resolve(rename, i) for i in n.inputs]
    graph.nodes = keep
    return len(rename)


def _resolve(rename: dict[str, str], name: str) -> str:
    while name in rename:
        name = rename[name]
    return name


def _uses_dropout_mask(node: Node, graph: Graph) -> bool:
    if len(node.outputs) < 2 or not node.outputs[1]:
        return False
    return node.outputs[1] in graph.outputs or any(node.outputs[1] in n.inputs for n in graph.nodes)


def eliminate_dead_nodes(graph: Graph) -> int:
    needed = set(graph.outputs)
    keep_rev: list[Node] = []
    for n in reversed(graph.toposorted()):
        if any(o in needed for o in n.outputs if o):
            keep_rev.append(n)
            needed.update(i for i in n.inputs if i)
    removed = len(graph.nodes) - len(keep_rev)
    kept = {id(n) for n in keep_rev}
    graph.nodes = [n for n in graph.nodes if id(n) in kept]
    return removed


def release_unused_constants(graph: Graph) -> None:
    """Drop the arrays of constants nothing reads any more (their shapes stay for reports)."""
    used = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs if i}
    for name, v in graph.values.items():
        if v.const is not None and name not in used and v.const.size > 1024:
            v.const = None
