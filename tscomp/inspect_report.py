"""``tscomp inspect``: what tscomp recovered from a model, as text or JSON.

The JSON form is a stable interface (tests and other tools read it)::

    {"symbols":    {name: {"min": int, "max": int, "origin": str}},
     "constraints": [str, ...],
     "data_dependent": [symbol names bound only at run time],
     "inputs": [...], "outputs": [...],
     "values":     {value_name: {"dtype": str, "shape": [int | "expr"]}},
     "unresolved": [value names without a fully known shape],
     "nodes": {"imported": int, "after_simplification": int}}
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


def inspect_json(graph: Graph, imported_nodes) -> dict:
    syms = graph.symbols
    values = {}
    for name in reported_values(graph, imported_nodes):
        v = graph.values[name]
        values[name] = {
            "dtype": None if v.dtype is None else np.dtype(v.dtype).name,
            "shape": None if v.shape is None else [int(d) if d.is_Integer else str(d) for d in v.shape],
        }
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
