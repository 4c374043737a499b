"""``tscomp inspect``: what tscomp recovered from a model, as text or JSON.

The JSON form is a stable interface (tests and other tools read it)::

    {"symbols":    {name: {"min": int, "max": int, "origin": str}},
     "constraints": [str, ...],
     "data_dependent": [symbol names bound only at run time],
     "inputs": [...], "outputs": [...],
     "values":     {value_name: {"dtype": str, "shape": [int | "expr"]}},
     "unresolved": [value names without a fully known shape],
     "nodes": {"imported": int, "after_simplification": int}}

With ``--groups`` (the fusion plan, :func:`groups_json`) it gains::

     "groups":   [{"name": str, "kind": str, "backbone": op type | None,
                   "ops": [ONNX node names fused into it], "inputs": [value names it reads],
                   "outputs": [value names it writes], "rules": [fusion rules that grew it],
                   "iteration_space": [str], "stages": {"prologue"|"heavy"|"epilogue": [op type]},
                   "shapes": {value name: {"dtype": str, "shape": [int | "expr"]}}}],
     "rewrites": [str, ...],
     "fusion":   {"groups": int, "compute_nodes": int, "views_absorbed": int},
     "picture":  PATH (only with --picture)
"""
from __future__ import annotations

import numpy as np

from tscomp.graph.ir import Graph
from tscomp.graph.shape_propagation import unresolved_values
from tscomp.graph.symbols import shape_str


def reported_values(graph: Graph, imported_nodes) -> list[str]:
    """Graph inputs and every node output of the imported graph (initializers are static)."""
    names = list(graph.inputs)
    for n in imported_nodes:
        names.extend(o for o in n.outputs if o)
    return names


def value_json(graph: Graph, name: str) -> dict:
    v = graph.values[name]
    return {
        "dtype": None if v.dtype is None else np.dtype(v.dtype).name,
        "shape": None if v.shape is None else [int(d) if d.is_Integer else str(d) for d in v.shape],
    }


def inspect_json(graph: Graph, imported_nodes) -> dict:
    syms = graph.symbols
    values = {name: value_json(graph, name) for name in reported_values(graph, imported_nodes)}
    unresolved = set(unresolved_values(graph))
    return {
        "symbols": {i.name: {"min": i.min, "max": i.max, "origin": i.origin}
                    for i in syms.live_symbols() if i.origin != "data-dependent"},
        "constraints": [str(c) for c in syms.constraints],
        "data_dependent": [i.name for i in syms.live_symbols() if i.origin == "data-dependent"],
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "values": values,
        "unresolved": [n for n in values if n in unresolved],
        "nodes": {"imported": len(imported_nodes), "after_simplification": len(graph.nodes)},
    }


def inspect_text(graph: Graph, imported_nodes) -> str:
    report = inspect_json(graph, imported_nodes)
    lines = [f"model: {graph.source}  (opset {graph.opset.get('', '?')}; "
             f"{report['nodes']['imported']} nodes, {report['nodes']['after_simplification']} after "
             "constant/shape folding)", "symbols:"]
    lines += [f"  {line}" for line in graph.symbols.describe() if "data-dependent" not in line]
    if report["data_dependent"]:
        lines.append("data-dependent symbols (bound at run time): " + ", ".join(report["data_dependent"]))
    if report["constraints"]:
        lines.append("constraints:")
        lines += [f"  {c}" for c in report["constraints"]]
    for kind in ("inputs", "outputs"):
        lines.append(f"{kind}:")
        lines += [f"  {graph.values[n].describe()}" for n in report[kind]]
    lines.append("values:")
    for name in report["values"]:
        v = graph.values[name]
        tag = "  (shape value: " + shape_str(v.symdata.reshape(-1)) + ")" if v.symdata is not None else ""
        lines.append(f"  {v.describe()}{tag}")
    lines.append("unresolved: " + (", ".join(report["unresolved"]) or "none"))
    return "\n".join(lines)



# ----------------------------------------------------------------------------- --groups
def fusion_counts(plan, simplified_nodes) -> dict:
    """How many ONNX nodes of the simplified graph (before horizontal fusion rewrote it) the
    groups cover: compute nodes (an Op of some group, or merged away by a rewrite) and view
    nodes absorbed as index maps."""
    op_nodes = {op.node for g in plan.groups for op in g.ops()}
    in_groups = {name for g in plan.groups for name in g.nodes}
    remaining = {id(n) for n in plan.graph.nodes}
    compute = [n for n in simplified_nodes if n.name in op_nodes or id(n) not in remaining]
    views = [n for n in simplified_nodes if n.name in in_groups and n.name not in op_nodes]
    return {"groups": len(plan.groups), "compute_nodes": len(compute), "views_absorbed": len(views)}


def groups_json(plan, simplified_nodes) -> dict:
    """The ``groups``, ``rewrites`` and ``fusion`` keys of ``inspect --groups --json``."""
    groups = []
    for entry, g in zip(plan.to_json(), plan.groups):
        pro, heavy, epi = g.prologue_epilogue()
        entry["stages"] = {"prologue": [o.op_type for o in pro], "heavy": [o.op_type for o in heavy],
                           "epilogue": [o.op_type for o in epi]}
        entry["shapes"] = {name: value_json(plan.graph, name) for name in [*g.inputs, *g.outputs]}
        groups.append(entry)
    return {"groups": groups, "rewrites": list(plan.rewrites),
            "fusion": fusion_counts(plan, simplified_nodes)}


def groups_text(plan, simplified_nodes) -> str:
    """The ``inspect --groups`` section: every group, the rewrites, a summary line."""
    lines = ["fusion groups (in execution order):"]
    for g in plan.groups:
        pro, heavy, epi = g.prologue_epilogue()
        lines.append(f"  {g.name} [{g.kind}] backbone={g.backbone or '-'} "
                     f"space={shape_str(g.iteration_space())}"
                     + (f"  rules: {', '.join(g.rules)}" if g.rules else ""))
        lines.append(f"    ops:      {', '.join(g.nodes) or '-'}")
        lines.append(f"    prologue: {', '.join(o.op_type for o in pro) or '-'}")
        lines.append(f"    heavy:    {', '.join(o.op_type for o in heavy) or '-'}")
        lines.append(f"    epilogue: {', '.join(o.op_type for o in epi) or '-'}")
        for verb, names in (("reads ", g.inputs), ("writes", list(g.outputs))):
            if not names:
                lines.append(f"    {verb}    -")
            for name in names:
                lines.append(f"    {verb}    {plan.graph.values[name].describe()}")
    lines.append("rewrites:")
    lines += [f"  {r}" for r in plan.rewrites] or ["  none"]
    c = fusion_counts(plan, simplified_nodes)
    lines.append(f"fusion: {c['groups']} groups from {c['compute_nodes']} ONNX compute nodes "
                 f"({c['views_absorbed']} view nodes absorbed as index maps)")
    return "\n".join(lines)
