"""GEMM alone: tscomp's CPU macro-kernels vs onnxruntime's MatMul, side by side in one process.

    .venv/bin/python -m benchmarks.gemm_vs_onnxruntime
    .venv/bin/python -m benchmarks.gemm_vs_onnxruntime --threads 2 --ms 1,16,128,384,512 --shapes 768x768

BERT-base's GEMM shapes (K x N: 768x2304 fused QKV, 768x768 attention output, 768x3072 FFN
up, 3072x768 FFN down) at several M (= batch x sequence). onnxruntime runs a one-node MatMul
model with the weight as an initializer (so it prepacks it too) and ``intra_op_num_threads``;
tscomp runs every candidate tile configuration of :func:`candidate_configs` (weights
prepacked once, OpenMP with the same thread count). Timings are medians over repeated runs,
measured in alternating blocks (a warm-up call before each block) so that drifting machine
load hits both systems alike. Per (shape, M) it prints GFLOP/s of onnxruntime, of tscomp's
best candidate and of the default (first) candidate, the ratio best/onnxruntime, and the
best configuration, then the fraction of the FMA peak of tscomp's best candidate: its median
run ("med"), the run 10% of its runs beat ("p10") and its fastest run ("fast"), each over the best
peak seen so far (the summary: in the whole run). The peak is itself a fastest run, of a loop that
the host's other tenants hardly slow; they do slow a GEMM's loads, in phases of seconds (runs
clustered at ~0.80 of the peak among runs at ~0.90, the FMA loop unchanged), so on a shared host
the median measures the neighbours as much as the kernel and "p10" is the like-for-like figure. A register-only FMA loop measured before and after gives the compute
ceiling; measured again around every row it flags rows during which other processes shared
the cores (BUSY: their numbers, and ratios, mean little).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

BERT_SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
BERT_MS = [1, 16, 128, 384, 512]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ms", default=",".join(map(str, BERT_MS)), help="comma-separated M values")
    p.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in BERT_SHAPES), help="KxN,KxN,...")
    p.add_argument("--rounds", type=int, default=5, help="alternating measurement blocks per system")
    p.add_argument("--budget", type=float, default=0.05, help="seconds per block (at least 3 runs)")
    p.add_argument("--top", type=int, default=3, help="candidates re-measured in every round")
    return p.parse_args(argv)


def ort_session(W: np.ndarray, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    K, N = W.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "gemm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


PEAK_C = """
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>
/* Register-only FMA loop: 12 independent chains per thread (enough to cover latency x pipes). */
double fma_peak(int64_t iters, int threads)
{
    double t0 = omp_get_wtime(), sink = 0.0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        __m512 a[12], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-8f);
        for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps((float)i);
        for (int64_t it = 0; it < iters; ++it) {
            #pragma GCC unroll 12
            for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
        }
        for (int i = 0; i < 12; ++i) sink += _mm512_reduce_add_ps(a[i]);
    }
    double t = omp_get_wtime() - t0;
    return sink == 12345.0 ? 0.0 : (double)threads * iters * 12 * 32 / t / 1e9;
}
"""


def fma_peak_gflops(threads: int) -> float | None:
    """The host's float32 FMA throughput with ``threads`` threads (AVX-512 hosts only): the
    ceiling a GEMM can reach when it is compute bound."""
    import ctypes

    from tscomp.codegen.build import build_library, host_isa, load_library
    if host_isa() != "avx512":
        return None
    fn = load_library(build_library(PEAK_C, "fma_peak")).fma_peak
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int]
    return max(fn(5_000_000, threads) for _ in range(3))


def time_block(fn, budget: float) -> list[float]:
    fn()  # warm-up: caches, thread pools woken up
    samples, start = [], time.perf_counter()
    while len(samples) < 3 or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 200:
            break
    return samples


def bench_shape(K: int, N: int, ms: list[int], args) -> list[dict]:
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.cpu_gemm import GemmKernel
    from tscomp.codegen.tile_config import candidate_configs

    rng = np.random.default_rng(K * 7 + N)
    W = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    session = ort_session(W, args.threads)
    isa = host_isa()
    kernels = [GemmKernel(W, cfg, isa=isa, name="bench_gemm") for cfg in candidate_configs(isa, K, N)]
    kernels[0].set_num_threads(args.threads)
    rows = []
    for M in ms:
        peak_before = fma_peak_gflops(args.threads)
        X = rng.standard_normal((M, K)).astype(np.float32)
        Y = np.empty((M, N), np.float32)
        ref = session.run(None, {"X": X})[0]
        for k in kernels:
            np.testing.assert_allclose(k.run(X, out=Y), ref, rtol=1e-3, atol=1e-3)
        # screening: one block per candidate, then the best few compete in every round
        screen = {i: statistics.median(time_block(lambda k=k: k.run(X, out=Y), args.budget / 2))
                  for i, k in enumerate(kernels)}
        finalists = sorted(screen, key=screen.get)[:args.top]
        if 0 not in finalists:
            finalists.append(0)
        ort_t: list[float] = []
        ts: dict[int, list[float]] = {i: [] for i in finalists}
        for _ in range(args.rounds):
            ort_t += time_block(lambda: session.run(None, {"X": X}), args.budget)
            for i in finalists:
                ts[i] += time_block(lambda k=kernels[i]: k.run(X, out=Y), args.budget)
        med = {i: statistics.median(v) for i, v in ts.items()}
        best = min(med, key=med.get)
        flop = 2.0 * M * K * N
        peaks = [p for p in (peak_before, fma_peak_gflops(args.threads)) if p]
        rows.append(dict(K=K, N=N, M=M, ort=flop / statistics.median(ort_t) / 1e9,
                         best=flop / med[best] / 1e9, default=flop / med[0] / 1e9,
                         fastest_run=flop / min(ts[best]) / 1e9,
                         p10_run=flop / float(np.percentile(ts[best], 10)) / 1e9,
                         config=kernels[best].cfg.slug(), peak=min(peaks) if peaks else None))
        r = rows[-1]
        args.peak = max([args.peak, *peaks]) if args.peak else None  # the best ceiling seen so far
        busy = " BUSY" if r["peak"] and r["peak"] < 0.85 * args.peak else ""
        frac = (" ".join(f"{r[key] / args.peak:5.2f}" for key in ("best", "p10_run", "fastest_run")) if args.peak
                else " ".join(f"{'-':>5}" for _ in range(3)))
        print(f"{K:>5}x{N:<5} {M:>4} {r['ort']:8.1f} {r['best']:8.1f} {r['default']:8.1f} "
              f"{r['best'] / r['ort']:6.2f}x {frac}  {r['config']:<22}{busy}".rstrip(), flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    import onnxruntime as ort

    from tscomp.codegen.build import host_isa
    print(f"# GEMM Y[M,N] = X[M,K] W[K,N], float32, {args.threads} threads, ISA {host_isa()}, "
          f"onnxruntime {ort.__version__}; GFLOP/s (median)")
    peaks = [fma_peak_gflops(args.threads) for _ in range(5)]  # several tries: load comes and goes
    peak = args.peak = max(peaks) if peaks[0] else None
    if peak:
        print(f"# FMA peak (register-only loop, {args.threads} threads): {peak:.0f} GFLOP/s; rows marked BUSY "
              f"saw it below 85% of the best just before or after them: other processes shared the cores")
    print(f"{'K x N':>11} {'M':>4} {'ort':>8} {'tscomp':>8} {'default':>8} {'ratio':>7} {'med':>5} {'p10':>5} {'fast':>5}  best config")
    rows = []
    for K, N in shapes:
        rows += bench_shape(K, N, ms, args)
    if peak and args.peak > peak:
        print(f"# (the FMA peak reached {args.peak:.0f} GFLOP/s later in the run)")
    large = [r for r in rows if r["M"] >= 128 and not (r["peak"] and r["peak"] < 0.85 * args.peak)]
    if large:
        geo = float(np.exp(np.mean([np.log(r["best"] / r["ort"]) for r in large])))
        print(f"# geometric-mean ratio tscomp/ort at M >= 128 (rows not BUSY): {geo:.2f}x")
        if args.peak:
            med = [r["best"] / args.peak for r in large]
            fast = [r["fastest_run"] / args.peak for r in large]
            p10 = [r["p10_run"] / args.peak for r in large]
            print(f"# fraction of the FMA peak ({args.peak:.0f} GFLOP/s, the best seen) at M >= 128 (rows not BUSY): "
                  f"median run {min(med):.2f}-{max(med):.2f}, 10th-percentile run {min(p10):.2f}-{max(p10):.2f}, "
                  f"fastest run {min(fast):.2f}-{max(fast):.2f} (the peak is itself a fastest run; on a shared host "
                  f"the median pays for the neighbours)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
