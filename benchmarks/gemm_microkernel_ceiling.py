"""Where a GEMM's time goes against the FMA peak, below the macro-kernel (issue 13, acceptance 3).

    .venv/bin/python -m benchmarks.gemm_microkernel_ceiling
    .venv/bin/python -m benchmarks.gemm_microkernel_ceiling --tiles 8x48,6x64 --kl 192

One thread, no memory traffic beyond L1: per AVX-512 register tile (``mr x nr``) it times

* ``generated``: tscomp's own micro-kernel, taken from :func:`tscomp.codegen.cpu_gemm.generate_gemm`'s
  source, called over and over on one packed X panel and one weight panel of ``kl`` k-steps
  (L1-resident: 6-36 KiB), with the software prefetches it emits;
* ``probe, 512-bit loads``: a plain C loop of the same shape -- per k-step ``nr/16`` 512-bit weight
  loads, ``mr`` broadcast loads of X and ``mr x nr/16`` FMAs -- over a 64-step ring;
* ``probe, 4-byte loads``: the same loop with each weight vector broadcast from one float instead
  of loaded: the same number of load instructions and FMAs, no 512-bit load;

and the register-only FMA loop of :mod:`benchmarks.gemm_vs_onnxruntime` (the peak every fraction
is of). What it shows on a host: how much of the gap between the macro-kernel (the GEMM alone,
``gemm_vs_onnxruntime``) and the peak is in the micro-kernel itself, and whether the 512-bit weight
loads that any register-tiled GEMM issues (one per ``mr`` FMAs) cost anything there. Measured on the
Xeon (AVX-512, AMX) of the 2026-11-25 sessions, FMA loop 240-246 GFLOP/s: generated 8x48 0.98,
14x32 1.00, 12x32 0.99, 6x64 0.97, 4x48 0.86 (probes 0.95-1.00; the 4-byte probe 1.00 but 0.98 at
4x48): the micro-kernel is at the FMA limit. Minutes earlier, on the same host, every row read
0.85-0.90 while the FMA loop itself measured the same 236-238: the host's other tenants slow
load-heavy code more than a register-only loop, so a fraction of "the peak" measured minutes apart
means little.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

from benchmarks.gemm_vs_onnxruntime import fma_peak_gflops

RING = 64  # k-steps the probes cycle over (the weight ring is RING * nr floats: at most 16 KiB)

HARNESS = r"""
#include <time.h>
static double tscomp_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
/* GFLOP/s of micro_kernel over kl k-steps, reps calls, operands in L1 */
double bench_generated(int64_t kl, int64_t reps)
{
    static float xp[MR * 1024] __attribute__((aligned(64)));
    static float wp[NR * 1024 * 2] __attribute__((aligned(64)));
    static float ct[MR * NR] __attribute__((aligned(64)));
    for (int i = 0; i < MR * 1024; ++i) xp[i] = 1e-3f * (i % 7);
    for (int i = 0; i < NR * 1024 * 2; ++i) wp[i] = 1e-3f * (i % 5);
    double t = tscomp_now();
    for (int64_t r = 0; r < reps; ++r)
        micro_kernel(kl, xp, wp, wp + kl * NR, 1, 0, ct, 1, 0, NULL, 0, 0, MR, NR);   /* pull the panel, stream wn every k step */
    t = tscomp_now() - t;
    return 2.0 * MR * NR * kl * reps / t / 1e9 + 0.0f * ct[3];
}
"""


def probe_source(mr: int, nr: int) -> str:
    """Two C loops of the register tile's shape: weight vectors loaded (512-bit) or broadcast (4-byte)."""
    nv = nr // 16
    acc = [f"c{i}_{j}" for i in range(mr) for j in range(nv)]
    fmas = "\n".join(
        f"        {{ const __m512 x = _mm512_set1_ps(xk[{i}]); "
        + " ".join(f"c{i}_{j} = _mm512_fmadd_ps(x, w{j}, c{i}_{j});" for j in range(nv)) + " }"
        for i in range(mr))
    out = ["#include <immintrin.h>", "#include <stdint.h>", "#include <time.h>",
           f"static float pw[{RING * nr}] __attribute__((aligned(64)));",
           f"static float px[{RING * mr}] __attribute__((aligned(64)));"]
    for name, load in (("probe_vector", "_mm512_load_ps(wk + {o})"), ("probe_scalar", "_mm512_set1_ps(wk[{o}])")):
        loads = "\n".join(f"        const __m512 w{j} = {load.format(o=16 * j)};" for j in range(nv))
        out.append(f"""
double {name}(int64_t steps)
{{
    for (int i = 0; i < {RING * nr}; ++i) pw[i] = 1e-3f * (i % 5);
    for (int i = 0; i < {RING * mr}; ++i) px[i] = 1e-3f * (i % 7);
    __m512 {", ".join(f"{a} = _mm512_setzero_ps()" for a in acc)};
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t k = 0; k < steps; ++k) {{
        const float* wk = pw + (k & {RING - 1}) * {nr}; const float* xk = px + (k & {RING - 1}) * {mr};
{loads}
{fmas}
    }}
    clock_gettime(CLOCK_MONOTONIC, &t1);
    __m512 s = {" ".join(f"_mm512_add_ps({a}," for a in acc[1:])} {acc[0]}{")" * (len(acc) - 1)};
    double t = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
    return 2.0 * {mr * nr} * steps / t / 1e9 + 0.0f * _mm512_reduce_add_ps(s);
}}""")
    return "\n".join(out)


def measure_tile(mr: int, nr: int, kl: int, tries: int) -> dict:
    from tscomp.codegen.build import build_library, load_library
    from tscomp.codegen.cpu_gemm import generate_gemm
    from tscomp.codegen.tile_config import TileConfig

    cfg = TileConfig(mr=mr, nr=nr, mc=mr * 4, nc=nr * 4, kc=kl)
    gen = load_library(build_library(generate_gemm(cfg, 4 * kl, nr * 8, "avx512", name="ceiling") + HARNESS,
                                     f"ceiling_{mr}x{nr}_{kl}"))
    probe = load_library(build_library(probe_source(mr, nr), f"ceiling_probe_{mr}x{nr}"))
    fns = {"generated": (gen.bench_generated, (kl, max(1, 40_000_000 // kl))),
           "probe_vector": (probe.probe_vector, (40_000_000,)),
           "probe_scalar": (probe.probe_scalar, (40_000_000,))}
    out = {}
    for key, (fn, args) in fns.items():
        fn.restype = ctypes.c_double
        fn.argtypes = [ctypes.c_int64] * len(args)
        out[key] = max(fn(*args) for _ in range(tries))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiles", default="8x48,14x32,12x32,6x64,4x48",
                   help="register tiles mr x nr (nr a multiple of 16; mr*nr/16 + nr/16 + 1 <= 32 registers)")
    p.add_argument("--kl", type=int, default=192, help="k-steps per micro-kernel call (the K block)")
    p.add_argument("--tries", type=int, default=3, help="best of this many timings per row")
    args = p.parse_args(argv)
    from tscomp.codegen.build import host_isa
    if host_isa() != "avx512":
        print(f"this probe is written for AVX-512 hosts; this one is {host_isa()}", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    peak = max(fma_peak_gflops(1) for _ in range(3))
    print(f"# FMA peak (register-only loop, 1 thread): {peak:.0f} GFLOP/s; operands L1-resident, K block {args.kl}")
    print(f"{'tile':>6} {'generated':>16} {'probe 512-bit':>16} {'probe 4-byte':>16}")
    for tile in args.tiles.split(","):
        mr, nr = (int(v) for v in tile.split("x"))
        r = measure_tile(mr, nr, args.kl, args.tries)
        print(f"{tile:>6} " + " ".join(f"{r[k]:8.1f} ({r[k] / peak:4.2f})" for k in
                                         ("generated", "probe_vector", "probe_scalar")), flush=True)
    peak_after = max(fma_peak_gflops(1) for _ in range(3))
    print(f"# FMA peak again: {peak_after:.0f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
