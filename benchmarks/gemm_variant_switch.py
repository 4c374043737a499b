"""What a GEMM pays when the runtime switches variants between shapes (issue 10, acceptance 1), under
the task -> N block ownership of :c:func:`ts_task_blocks` (each thread the i-th contiguous 1/nth of
the N blocks) against the interleaved rule it replaced (``nb = t % n_nblocks``), one process.

    .venv/bin/python -m benchmarks.gemm_variant_switch [--k 256 --n 1024]

Two variants of one K x N GEMM read the same packed weight (their panels are ``nr`` columns
wide): a narrow-block one (``nc`` = N/4, what the dispatch picks at tens of rows) and a full-width
one (``nc`` = N, cut in two at run time at one row). Per trial: 20 calls of the narrow one at M =
64, then the first call of the wide one at M = 1 (*switch*) and 5 more (*steady*, the median).
Under the interleaved rule the narrow variant gives core 0 N blocks 0 and 2, the wide one at M = 1
columns 0..N/2: half of what core 0 reads after the switch is in the other core's L2. Both builds
are timed alternately, several rounds; then each variant's steady time at a few M, so a change in
the ownership rule that costs steady-state time shows too.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

from tscomp.codegen import cpu_gemm
from tscomp.codegen.build import build_library, host_isa, load_library, set_num_threads
from tscomp.codegen.tile_config import TileConfig

#: the task decode the GEMM emits now, and the interleaved one (N block innermost) it replaced
CONTIGUOUS = ("            int64_t mb, nb;\n"
              "            ts_task_blocks(t, nth, n_nblocks, &mb, &nb);\n")
INTERLEAVED = "            const int64_t mb = t / n_nblocks, nb = t % n_nblocks;\n"


def build(cfg: TileConfig, K: int, N: int, isa: str, rule: str):
    """The GEMM's C function under the ownership ``rule`` ("contiguous" or "interleaved")."""
    name = f"switch_{rule}_{K}x{N}_{cfg.slug()}"
    source = cpu_gemm.generate_gemm(cfg, K, N, isa, None, name=name)
    if CONTIGUOUS not in source:
        raise SystemExit("the GEMM's task decode changed: update benchmarks.gemm_variant_switch")
    if rule == "interleaved":
        source = source.replace(CONTIGUOUS, INTERLEAVED)
    fn = getattr(load_library(build_library(source, name)), name)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    return fn


def _time(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=256)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args()
    K, N, isa = args.k, args.n, host_isa()
    set_num_threads(2)
    # AVX-512 tiles (tiny BERT's FFN-up variants at L = 64 and L = 1); validate names what a host lacks
    narrow = TileConfig(mr=8, nr=32, mc=256, nc=N // 4, kc=32).validate(isa)
    wide = TileConfig(mr=12, nr=32, mc=96, nc=N, kc=128).validate(isa)
    rng = np.random.default_rng(0)
    W = rng.standard_normal((K, N)).astype(np.float32)
    Wp = cpu_gemm.prepack_weights(W, narrow)
    assert np.array_equal(Wp, cpu_gemm.prepack_weights(W, wide)), "the two variants must share one packed weight"
    X, Y = rng.standard_normal((64, K)).astype(np.float32), np.empty((64, N), np.float32)
    x, w, y = X.ctypes.data, Wp.ctypes.data, Y.ctypes.data
    rules = ("interleaved", "contiguous")
    kernels = {r: (build(narrow, K, N, isa, r), build(wide, K, N, isa, r)) for r in rules}
    print(f"{K} x {N} GEMM on {isa}, 2 threads; narrow {narrow.slug()}, wide {wide.slug()}")
    switch: dict = {r: [] for r in rules}
    for rnd in range(args.rounds):
        for r in rules if rnd % 2 == 0 else rules[::-1]:
            a, b = kernels[r]
            firsts, steadies = [], []
            for _ in range(args.trials):
                for _ in range(20):
                    a(x, w, y, 64)
                firsts.append(_time(b, x, w, y, 1))
                steadies.append(statistics.median(_time(b, x, w, y, 1) for _ in range(5)))
            switch[r].append((statistics.median(firsts), statistics.median(steadies)))
    print("wide variant at M = 1 right after the narrow one at M = 64 (us, per round: switch / steady)")
    for r in rules:
        excess = statistics.median(f - s for f, s in switch[r]) * 1e6
        print(f"  {r:>11}: " + "  ".join(f"{f * 1e6:.2f}/{s * 1e6:.2f}" for f, s in switch[r])
              + f"   median excess {excess:.2f} us")
    print("steady (us, median of 2000 back-to-back calls, best of 3 rounds)")
    for label, pick, M in (("narrow", 0, 64), ("narrow", 0, 5), ("wide", 1, 1), ("wide", 1, 2)):
        best = {r: min(statistics.median(_time(kernels[r][pick], x, w, y, M) for _ in range(2000))
                       for _ in range(3)) for r in rules}
        print(f"  {label} M = {M:>2}: " + "  ".join(f"{r} {best[r] * 1e6:.2f}" for r in rules)
              + f"   contiguous/interleaved {best['contiguous'] / best['interleaved']:.3f}")


if __name__ == "__main__":
    main()
