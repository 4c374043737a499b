"""Kernel counts and memory traffic of tscomp's fused Plan against onnxruntime.

    .venv/bin/python -m benchmarks.fusion_report --size tiny
    .venv/bin/python -m benchmarks.fusion_report --size base --family bert --traffic batch=1,sequence=128

Per model: (a) ONNX node count, (b) node count of onnxruntime's own optimized
graph (ORT_ENABLE_ALL, CPU, written with ``optimized_model_filepath``), (c)
tscomp's group count, and groups per encoder layer (groups touching the nodes
of one middle layer, TorchScript node names; for dynamo exports: the groups
that repeat, i.e. (total - groups outside the layers) / layers, estimated from
the TorchScript export of the same family). With ``--traffic``, the bytes
written to and read from memory between groups (weights included) at the given
binding, against the unfused graph (every ONNX compute node a kernel), both as
symbolic formulas and evaluated.
"""
from __future__ import annotations

import argparse
import onnx

from models.export import export_model
from models.families import make_config, symbol_ranges
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse, plan_traffic, unfused_traffic
from tests.model_checks import groups_per_layer, ort_optimized_node_count

FAMILIES = ["bert", "albert", "roberta", "distilbert", "gpt2", "vit"]
EXPORTERS = ["dynamo", "torchscript"]


def measure(family: str, size: str, exporter: str, cache: str, traffic: dict | None) -> dict:
    path = export_model(family, size, exporter, cache)
    ranges = symbol_ranges(family, size)
    graph = load_model(path, [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()])
    compute_nodes = len(graph.nodes)
    plan = fuse(graph)
    layers = make_config(family, size).num_hidden_layers
    row = dict(model=f"{family}-{size}-{exporter}", onnx_nodes=len(onnx.load(str(path), load_external_data=False)
                                                                    .graph.node),
               compute_nodes=compute_nodes, ort_nodes=ort_optimized_node_count(path), groups=len(plan.groups),
               per_layer=groups_per_layer(plan, layers // 2), layers=layers)
    if traffic and all(s in traffic for s in ranges):
        at = {s: v for s, v in traffic.items() if s in graph.symbols.infos}
        for tag, weights in (("", True), ("act_", False)):
            fused, unfused = plan_traffic(plan, weights=weights), unfused_traffic(graph, weights=weights)
            row.update({f"{tag}fused": fused, f"{tag}unfused": unfused,
                        f"{tag}fused_at": graph.symbols.evaluate(fused, at),
                        f"{tag}unfused_at": graph.symbols.evaluate(unfused, at)})
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=["tiny", "base"], default="tiny")
    p.add_argument("--family", action="append", choices=FAMILIES)
    p.add_argument("--exporter", action="append", choices=EXPORTERS)
    p.add_argument("--traffic", help="binding for the memory-traffic count, e.g. batch=1,sequence=128")
    p.add_argument("--cache", default=".cache/models")
    args = p.parse_args(argv)
    traffic = dict((k, int(v)) for k, v in (kv.split("=") for kv in args.traffic.split(","))) \
        if args.traffic else None
    print("| model | ONNX nodes | after folding | onnxruntime optimized nodes | tscomp groups | groups/layer |")
    print("|---|---|---|---|---|---|")
    rows = []
    for family in args.family or FAMILIES:
        for exporter in args.exporter or EXPORTERS:
            r = measure(family, args.size, exporter, args.cache, traffic)
            rows.append(r)
            print(f"| {r['model']} | {r['onnx_nodes']} | {r['compute_nodes']} | {r['ort_nodes']} | {r['groups']} "
                  f"| {r['per_layer'] if r['per_layer'] else '-'} |", flush=True)
    if traffic:
        print(f"\nMemory traffic between kernels at {traffic} (bytes, weights included):")
        for r in (r for r in rows if "fused" in r):
            for tag, what in (("", "all tensors"), ("act_", "activations only")):
                print(f"  {r['model']} ({what}): fused {r[tag + 'fused_at']:,} vs unfused "
                      f"{r[tag + 'unfused_at']:,} ({r[tag + 'fused_at'] / r[tag + 'unfused_at']:.2f}x)")
                print(f"      fused   = {r[tag + 'fused']}\n      unfused = {r[tag + 'unfused']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
