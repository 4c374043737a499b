"""Symbolic shape coverage of tscomp vs onnxruntime's SymbolicShapeInference,
and agreement with onnxruntime at run time, on the exported models.

    .venv/bin/python -m benchmarks.shape_coverage --size tiny --bindings 20
    .venv/bin/python -m benchmarks.shape_coverage --size base --bindings 3

Per model it prints: node outputs, how many tscomp resolves (a number or an
expression over the input symbols), how many onnxruntime resolves with and
without ``auto_merge`` ("fail" when it gives up), the propagation time, and —
with ``--bindings N`` — the number of (value, binding) shapes checked against
onnxruntime, mismatches, and the reference executor's max abs error.
"""
from __future__ import annotations

import argparse
import time
import zlib

import numpy as np

from models.export import export_model
from models.families import make_inputs, symbol_ranges
from tests import model_checks

FAMILIES = ["bert", "albert", "roberta", "distilbert", "gpt2", "vit"]
EXPORTERS = ["dynamo", "torchscript"]


def measure(family: str, size: str, exporter: str, cache: str, n_bindings: int) -> dict:
    path = export_model(family, size, exporter, cache)
    ranges = symbol_ranges(family, size)
    t0 = time.perf_counter()
    loaded = model_checks.load_for_checks(path, ranges)
    t_load = time.perf_counter() - t0
    resolved, total = model_checks.tscomp_coverage(loaded)
    ort_merge, _ = model_checks.ort_symbolic_coverage(path, auto_merge=True)
    ort_plain, _ = model_checks.ort_symbolic_coverage(path, auto_merge=False)
    row = dict(model=f"{family}-{size}-{exporter}", nodes=len(loaded.imported_nodes),
               after=len(loaded.graph.nodes), outputs=total, tscomp=resolved, ort_auto_merge=ort_merge,
               ort_plain=ort_plain, seconds=t_load, checked=0, mismatches=0, max_err=0.0, close=True)
    if n_bindings:
        names = [o for node in loaded.imported_nodes for o in node.outputs if o]
        session = model_checks.ort_session_with_intermediates(path, loaded.graph, names)
        rng = np.random.default_rng(0)
        caps = {"batch": 2} if size == "base" else None
        for binding in model_checks.binding_samples(ranges, n=n_bindings, seed=zlib.crc32(family.encode()),
                                                    caps=caps):
            row.setdefault("bindings", []).append(binding)
            result = model_checks.compare_with_onnxruntime(
                loaded, session, make_inputs(family, binding, rng, size=size), binding)
            row["checked"] += result.shapes_checked
            row["mismatches"] += len(result.shape_mismatches)
            row["max_err"] = max(row["max_err"], result.max_abs_err, result.plan_max_abs_err)
            row["close"] &= result.outputs_close and result.plan_close
    return row


def fmt(v) -> str:
    return "fail" if v is None else str(v)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=["tiny", "base"], default="tiny")
    p.add_argument("--family", action="append", choices=FAMILIES)
    p.add_argument("--exporter", action="append", choices=EXPORTERS)
    p.add_argument("--bindings", type=int, default=0, help="also compare with onnxruntime at N bindings")
    p.add_argument("--cache", default=".cache/models")
    args = p.parse_args(argv)
    header = ("| model | nodes | after folding | values | tscomp resolved | ORT auto_merge | ORT plain "
              "| propagate s | shapes checked | mismatches | ref & plan max abs err |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for family in args.family or FAMILIES:
        for exporter in args.exporter or EXPORTERS:
            r = measure(family, args.size, exporter, args.cache, args.bindings)
            err = f"{r['max_err']:.2e}" + ("" if r["close"] else " (NOT close)") if args.bindings else "-"
            print(f"| {r['model']} | {r['nodes']} | {r['after']} | {r['outputs']} | {r['tscomp']} "
                  f"| {fmt(r['ort_auto_merge'])} | {fmt(r['ort_plain'])} | {r['seconds']:.1f} "
                  f"| {r['checked'] or '-'} | {r['mismatches'] if args.bindings else '-'} | {err} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
