"""End-to-end benchmark of issue 4: a model compiled by tscomp against onnxruntime, side by side
in one process, same inputs, same thread count; then where the time goes.

    .venv/bin/python -m benchmarks.bert_vs_onnxruntime                       # BERT-base, batch 1
    .venv/bin/python -m benchmarks.bert_vs_onnxruntime --family gpt2 --size tiny --samples 10

Prints the latency table of ``tscomp bench`` (25 random sequence lengths in [1, 512], seed 0,
range ends not forced), the geomean and worst ratio, first-call vs steady-state latency, and a
per-group-kind breakdown for tscomp (``Runtime.profile``) next to onnxruntime's per-operator
profile at a few lengths. Writes the plot to ``.cache/bench/<model>.png``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

import numpy as np

from models.export import export_model
from models.families import symbol_ranges
from tscomp.cli_commands import Progress
from tscomp.bench import bench, ort_session, plot, sample_bindings, table
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact
from tscomp.sample_inputs import random_inputs

CACHE = Path(".cache")


def group_kind(rt: Runtime, name: str, family: str) -> str:
    g = next(x for x in rt.plan.groups if x.name == name)
    if family == "numpy":
        return f"numpy fallback ({g.backbone or g.kind})"
    if g.kind == "gemm":
        return "batched GEMM (attention)" if family == "batched-gemm" else "GEMM (+epilogue)"
    if g.kind == "reduce":
        return f"row reduction ({g.backbone})"
    return "elementwise/injective"


def tscomp_breakdown(rt: Runtime, inputs, repeats: int = 5) -> dict[str, float]:
    time.sleep(0.1)   # let onnxruntime's worker threads stop spinning (see tscomp.bench)
    rt.run(inputs)
    totals = collections.Counter()
    for _ in range(repeats):
        for name, family, dt in rt.profile(inputs):
            totals[group_kind(rt, name, family)] += dt / repeats
    return dict(totals)


def ort_breakdown(model_path: str, inputs, threads: int, repeats: int = 5) -> dict[str, float]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_profiling = True
    so.profile_file_prefix = str(CACHE / "bench" / "ort_profile")
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    time.sleep(0.1)
    sess.run(None, inputs)
    for _ in range(repeats):
        sess.run(None, inputs)
    prof = sess.end_profiling()
    events = json.loads(Path(prof).read_text())
    os.unlink(prof)
    totals = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            totals[e["args"].get("op_name", "?")] += e["dur"] * 1e-6 / (repeats + 1)
    return dict(totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="bert")
    ap.add_argument("--size", default="base")
    ap.add_argument("--exporter", default="dynamo")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--breakdown", default="1,128,512", help="sequence lengths for the per-group breakdown")
    args = ap.parse_args()

    (CACHE / "bench").mkdir(parents=True, exist_ok=True)
    onnx_path = str(export_model(args.family, args.size, args.exporter, CACHE / "models"))
    ranges = symbol_ranges(args.family, args.size)
    dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]
    artifact = CACHE / "bench" / f"{args.family}-{args.size}-{args.exporter}.tsc"
    print(f"compiling {onnx_path} {' '.join(dims)} -> {artifact}", flush=True)
    model = compile_model(onnx_path, dims, threads=args.threads, progress=Progress("compiling groups"))
    write_artifact(model, artifact)
    print(f"compiled in {model.compile_seconds:.1f}s; numpy-fallback groups: {model.fallback_groups() or 'none'}")
    rt = Runtime(artifact, num_threads=args.threads)
    fixed = {"batch": args.batch} if "batch" in ranges else {}
    bindings = sample_bindings(rt, args.samples, args.seed, fixed)
    result = bench(rt, onnx_path, bindings, threads=args.threads, seed=args.seed,
                   progress=lambda d, t, r: print(f"  [{d}/{t}] {r.binding} ratio {r.ratio:.3f}", flush=True))
    print("\n".join(table(result)))
    png = plot(result, CACHE / "bench" / f"{artifact.stem}.png")
    print(f"plot: {png}")

    if "sequence" not in ranges:
        return
    rng = np.random.default_rng(args.seed)
    ort_session(onnx_path, args.threads)  # fail early with a clear error if onnxruntime cannot load it
    for L in (int(x) for x in args.breakdown.split(",")):
        binding = {**fixed, "sequence": L}
        inputs = random_inputs(rt.graph, {**{i.name: i.min for i in rt.graph.symbols.live_symbols()}, **binding}, rng)
        ts = tscomp_breakdown(rt, inputs)
        overhead = rt.last_call_overhead
        ortb = ort_breakdown(onnx_path, inputs, args.threads)
        print(f"\nwhere the time goes at {binding} (ms per call):")
        print(f"  tscomp total {sum(ts.values()) * 1e3:.3f} (+ runtime overhead per call {overhead * 1e3:.3f})")
        for k, v in sorted(ts.items(), key=lambda kv: -kv[1]):
            print(f"    {k:<40} {v * 1e3:9.3f}")
        print(f"  onnxruntime total {sum(ortb.values()) * 1e3:.3f}")
        for k, v in sorted(ortb.items(), key=lambda kv: -kv[1])[:10]:
            print(f"    {k:<40} {v * 1e3:9.3f}")


if __name__ == "__main__":
    main()
