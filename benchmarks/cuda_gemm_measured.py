"""BERT-base's GEMM groups on a real GPU: the analytic ranking of the schedule stage (TSCompiler
§5.1 tiles, ranked without a GPU by ``GpuGemmSpace``) against the measured time of the same SIMT
kernels, and cuBLAS fp32 (through PyTorch, TF32 off) beside them.

Per group and M: the analytic top configuration's time, the fastest measured configuration (and
its analytic rank), the Spearman correlation of predicted cost and measured time over the ranked
configurations, and GFLOP/s and the ratio to cuBLAS. Kernel times are CUDA events around each
launch alone (``CudaDevice.profile``), median of ``--reps`` launches after 2 warm-ups; cuBLAS gets
the plain product (no fused epilogue), which favours it slightly.

    python -m benchmarks.cuda_gemm_measured [--top 12] [--sample 0] [--ms 128,2048,16384] [--json out.json]
    python -m benchmarks.cuda_gemm_measured --precompile sm_90 [--top/--sample]   # fill the nvcc cache, no GPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from tscomp.codegen.nvcc import compile_cubin
from tscomp.codegen.simt.gemm import SimtEpilogue, gemm_body
from tscomp.codegen.simt.launch import Launch, ceil_div, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SimtProgram
from tscomp.schedule.gpu_measure import time_launches
from tscomp.schedule.gpu_space import GpuGemmSpace
from tscomp.schedule.target import cuda

from benchmarks.cuda_analytic_ranking import GROUPS, M_RANGE


def _program(t, K, N, epi) -> SimtProgram:
    return SimtProgram(f"/* {t.slug()} */\n", gemm_body("k", t, K, N, SimtEpilogue.from_cpu(epi)),
                       {"TS_WANT_ASYNC": 1} if t.async_copy else {})


def _candidates(space: GpuGemmSpace, top: int, sample: int) -> list:
    """The analytic ranking's ``top`` configurations, then ``sample`` more drawn at random (seeded)
    from the rest of the feasible space: the ranked ones answer "is the top pick good", the random
    ones show where the model is wrong (calibration data)."""
    ranked = [r.tile for r in space.rank()]
    rest = ranked[top:]
    picks = np.random.default_rng(1).choice(len(rest), size=min(sample, len(rest)), replace=False) if sample else []
    return ranked[:top] + [rest[i] for i in sorted(picks)]


def _extra_args(epi, M, N, rng) -> list:
    """The epilogue's operands in the kernel's order, shaped as its arguments declare."""
    sizes = {"M": M, "N": N}
    return [input_buffer(rng.standard_normal([sizes[d] for d in a.shape]).astype(np.float32), np.float32)
            for a in epi.args]


def _reference(epi, A, W, extra):
    """fp64 result of the group on A's first rows (bias, residual and the erf GELU by label)."""
    from scipy.special import erf
    m = A.shape[0]
    y = A.astype(np.float64) @ W + extra[0].array
    if "residual" in epi.label:
        y = y + extra[1].array[:m]
    if "GELU" in epi.label:
        y = 0.5 * y * (1 + erf(y / np.sqrt(2)))
    return y


def _time_kernel(dev, cubin, t, A, W, M, N, extra, reps) -> tuple[float, np.ndarray]:
    """(median ms of ``reps`` launches after 2 warm-ups, the output) of one configuration."""
    Y = output_buffer((M, N), np.float32)
    launch = Launch("k", (ceil_div(M, t.bm), ceil_div(N, t.bn), 1), (t.threads, 1, 1),
                    [input_buffer(A, np.float32), input_buffer(W, np.float32), Y, scalar(M), *extra])
    return time_launches(dev, cubin, [launch], reps), Y.array


def _cublas_ms(A, W, reps) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a, w = torch.from_numpy(A).cuda(), torch.from_numpy(W).cuda()
    for _ in range(2):
        a @ w
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ w
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def _spearman(xs, ys) -> float:
    rx, ry = np.argsort(np.argsort(xs)), np.argsort(np.argsort(ys))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(xs) > 2 else float("nan")


def precompile(arch: str, top: int, sample: int) -> None:
    from concurrent.futures import ThreadPoolExecutor
    t0 = time.time()
    n = 0
    for name, K, N, epi in GROUPS:
        tiles = _candidates(GpuGemmSpace(K, N, cuda(arch), M_RANGE), top, sample)
        with ThreadPoolExecutor(4) as pool:     # nvcc is a subprocess: threads build in parallel
            list(pool.map(lambda t: compile_cubin(_program(t, K, N, epi).cuda, arch), tiles))
        n += len(tiles)
        print(f"{name}: {len(tiles)} configurations built for {arch} ({time.time() - t0:.0f} s)", flush=True)
    print(f"{n} cubins in the nvcc cache")


def measure(top: int, sample: int, ms: list[int], reps: int) -> list[dict]:
    from tscomp.runtime.device_opencl import device
    dev = device("cuda")
    spec = cuda(dev.arch).spec
    print(f"{dev.device_name} ({dev.arch}); analytic model: {spec.model}, {spec.sms} SMs", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for name, K, N, epi in GROUPS:
        space = GpuGemmSpace(K, N, cuda(dev.arch), M_RANGE)
        tiles = _candidates(space, top, sample)
        builds = {t: compile_cubin(_program(t, K, N, epi).cuda, dev.arch) for t in tiles}
        # with ptxas's registers one block may not fit an SM (the ranking estimated them): no launch
        unfit = [t for t in tiles if not spec.fits(t.threads, builds[t].resources["k"].registers,
                                                   builds[t].resources["k"].shared_bytes)]
        if unfit:
            print(f"{name}: {len(unfit)} configurations do not fit an SM with ptxas's registers: "
                  f"{', '.join(t.slug() for t in unfit[:4])}{' ...' if len(unfit) > 4 else ''}", flush=True)
        top_fit = top - sum(1 for t in tiles[:top] if t in unfit)
        tiles = [t for t in tiles if t not in unfit]
        W = rng.standard_normal((K, N)).astype(np.float32)
        for M in ms:
            A = rng.standard_normal((M, K)).astype(np.float32)
            extra = _extra_args(epi, M, N, rng)
            measured = []
            for t in tiles:   # every configuration runs the same data; only the last one's Y is kept
                t_ms, Y = _time_kernel(dev, builds[t].cubin, t, A, W, M, N, extra, reps)
                measured.append(t_ms)
            want = _reference(epi, A[:64], W, extra)                 # the last configuration's first rows
            err = float(np.abs(Y[:64] - want).max() / max(np.abs(want).max(), 1e-30))
            predicted = [space.cost(t, M) for t in tiles]
            ranked_ms = measured[:top_fit]
            best = int(np.argmin(ranked_ms))
            blas = _cublas_ms(A, W, reps)
            gflop = 2.0 * M * K * N / 1e9
            overall = int(np.argmin(measured))
            row = {"group": name, "M": M, "K": K, "N": N, "analytic_top": tiles[0].slug(),
                   "analytic_top_ms": measured[0], "best_measured": tiles[best].slug(),
                   "best_measured_ms": measured[best], "best_measured_analytic_rank": best + 1,
                   "best_of_all_sampled": tiles[overall].slug(), "best_of_all_sampled_ms": measured[overall],
                   "spearman_predicted_vs_measured": round(_spearman(predicted, measured), 3),
                   "top_gflops": round(gflop / measured[0] * 1e3, 1),
                   "cublas_fp32_ms": blas, "top_over_cublas": round(measured[0] / blas, 3) if blas else None,
                   "best_over_cublas": round(measured[best] / blas, 3) if blas else None,
                   "max_error_vs_fp64_relative_to_max": err, "top": top_fit,
                   "unfit": [t.to_json() for t in unfit],
                   "configs": [t.to_json() for t in tiles],
                   "registers": [builds[t].resources["k"].registers for t in tiles],
                   "measured_ms": [round(x, 5) for x in measured], "predicted_cycles": predicted}
            rows.append(row)
            print(f"{name:32s} M={M:6d} top {measured[0]:8.3f} ms ({row['top_gflops']:7.0f} GFLOP/s)  best #{best + 1} "
                  f"{measured[best]:8.3f} ms  all {measured[overall]:8.3f} ms  spearman {row['spearman_predicted_vs_measured']:+.2f}  "
                  f"cuBLAS {blas if blas is None else round(blas, 3)} ms  top/cuBLAS {row['top_over_cublas']}  "
                  f"max rel err {err:.1e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=12, help="how many analytic-ranked configurations to time")
    ap.add_argument("--sample", type=int, default=0, help="how many more, drawn at random from the feasible rest")
    ap.add_argument("--ms", default="128,2048,16384")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default=None)
    ap.add_argument("--precompile", metavar="ARCH", default=None)
    args = ap.parse_args()
    if args.precompile:
        precompile(args.precompile, args.top, args.sample)
        return
    rows = measure(args.top, args.sample, [int(m) for m in args.ms.split(",")], args.reps)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
