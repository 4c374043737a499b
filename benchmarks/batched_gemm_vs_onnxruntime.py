"""Attention's batched GEMMs: tscomp's batched macro-kernel vs onnxruntime's MatMul, side by side.

    .venv/bin/python -m benchmarks.batched_gemm_vs_onnxruntime
    .venv/bin/python -m benchmarks.batched_gemm_vs_onnxruntime --threads 2 --ls 16,128,384,512 --cases qk,pv,qkt

BERT-base attention at batch 1: 12 heads, head dim 64, sequence L. Cases:

* ``qk``  — QKᵀ: [12, L, 64] x [12, 64, L] (both operands model inputs, row-major as given);
* ``pv``  — PV:  [12, L, L] x [12, L, 64];
* ``qkt`` — QKᵀ with K given as [12, L, 64] and a Transpose node before the MatMul: tscomp reads
  it through the view while packing (onnxruntime fuses it into its MatMul as transB).

Both systems run the same one-MatMul ONNX model with dynamic L: onnxruntime with
``intra_op_num_threads`` (CPU provider, all graph optimizations), tscomp the model's single fused
gemm group compiled by :class:`tscomp.codegen.cpu_batched_gemm.CompiledBatchedGemmGroup` for every
candidate tile configuration, OpenMP with the same thread count. Timings are medians over
alternating blocks (a warm-up call before each) so drifting load hits both alike. Per (case, L) it
prints GFLOP/s of onnxruntime, of tscomp's best candidate and of its default, the ratio best/ort and
the best configuration.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.gemm_vs_onnxruntime import time_block

HEADS, DHEAD = 12, 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ls", default="16,128,384,512", help="comma-separated sequence lengths")
    p.add_argument("--cases", default="qk,pv,qkt")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=0.05, help="seconds per block (at least 3 runs)")
    return p.parse_args(argv)


def build_model(case: str, folder: Path) -> Path:
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper

    if case == "qk":
        ins = [("a", [HEADS, "L", DHEAD]), ("b", [HEADS, DHEAD, "L"])]
        nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
        out = [HEADS, "L", "L"]
    elif case == "pv":
        ins = [("a", [HEADS, "L", "L"]), ("b", [HEADS, "L", DHEAD])]
        nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
        out = [HEADS, "L", DHEAD]
    elif case == "qkt":
        ins = [("a", [HEADS, "L", DHEAD]), ("b", [HEADS, "L", DHEAD])]
        nodes = [helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 2, 1]),
                 helper.make_node("MatMul", ["a", "bt"], ["y"])]
        out = [HEADS, "L", "L"]
    else:
        raise SystemExit(f"unknown case {case!r}")
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in ins],
                              [helper.make_tensor_value_info("y", TP.FLOAT, out)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path = folder / f"{case}.onnx"
    onnx.save(model, path)
    return path


def bench_case(case: str, ls: list[int], args, folder: Path) -> list[dict]:
    import onnxruntime as ort

    import tscomp.graph as G
    from tscomp.codegen.cpu_batched_gemm import CompiledBatchedGemmGroup
    from tscomp.graph.fusion import fuse

    path = build_model(case, folder)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    plan = fuse(G.load_model(path, [f"L=1:{max(ls)}"]))
    (group,) = [g for g in plan.groups if g.kind == "gemm"]
    kernels = [CompiledBatchedGemmGroup(plan, group, cfg)
               for cfg in CompiledBatchedGemmGroup.candidate_configs(plan, group)]
    rng = np.random.default_rng(0)
    rows = []
    for L in ls:
        feeds = {}
        for inp in session.get_inputs():
            dims = [L if isinstance(d, str) else d for d in inp.shape]
            feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
        binding = {"L": L}
        ref = session.run(None, feeds)[0]
        for k in kernels:
            np.testing.assert_allclose(k.run(feeds, binding)["y"], ref, rtol=1e-3, atol=1e-3)
        screen = {i: statistics.median(time_block(lambda k=k: k.run(feeds, binding), args.budget / 2))
                  for i, k in enumerate(kernels)}
        finalists = sorted(screen, key=screen.get)[:2]
        if 0 not in finalists:
            finalists.append(0)
        ort_t: list[float] = []
        ts: dict[int, list[float]] = {i: [] for i in finalists}
        for _ in range(args.rounds):
            ort_t += time_block(lambda: session.run(None, feeds), args.budget)
            for i in finalists:
                ts[i] += time_block(lambda k=kernels[i]: k.run(feeds, binding), args.budget)
        med = {i: statistics.median(v) for i, v in ts.items()}
        best = min(med, key=med.get)
        M, N = L, (L if case in ("qk", "qkt") else DHEAD)
        K = DHEAD if case in ("qk", "qkt") else L
        flop = 2.0 * HEADS * M * N * K
        r = dict(case=case, L=L, ort=flop / statistics.median(ort_t) / 1e9, best=flop / med[best] / 1e9,
                 default=flop / med[0] / 1e9, config=kernels[best].cfg.slug(), tasks=kernels[best].tasks(binding))
        rows.append(r)
        print(f"{case:>4} {L:>4} {r['ort']:8.1f} {r['best']:8.1f} {r['default']:8.1f} {r['best'] / r['ort']:6.2f}x  "
              f"{r['config']:<22} {r['tasks']:>5}", flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import onnxruntime as ort

    from benchmarks.gemm_vs_onnxruntime import fma_peak_gflops
    from tscomp.codegen.build import host_isa
    ls = [int(x) for x in args.ls.split(",")]
    print(f"# attention batched GEMMs ({HEADS} heads, head dim {DHEAD}, batch 1), float32, {args.threads} threads, "
          f"ISA {host_isa()}, onnxruntime {ort.__version__}; GFLOP/s (median)")
    peak = fma_peak_gflops(args.threads)
    if peak:
        print(f"# FMA peak (register-only loop, {args.threads} threads): {peak:.0f} GFLOP/s")
    print(f"{'case':>4} {'L':>4} {'ort':>8} {'tscomp':>8} {'default':>8} {'ratio':>7}  {'best config':<22} tasks")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            rows += bench_case(case, ls, args, Path(tmp))
    large = [r for r in rows if r["L"] >= 128]
    if large:
        geo = float(np.exp(np.mean([np.log(r["best"] / r["ort"]) for r in large])))
        print(f"# geometric-mean ratio tscomp/ort at L >= 128: {geo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
