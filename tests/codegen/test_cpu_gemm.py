"""CPU GEMM macro-kernels against numpy (float64) at awkward M, N, K, per ISA and tile config."""
import math

import numpy as np
import pytest
from scipy.special import erf

from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_gemm import (L2_STREAM_K_STRIDE, PREFETCH_K_STEPS, Epilogue, EpilogueArg, GemmError, GemmKernel, generate_gemm,
                                     packed_size, prepack_weights)
from tscomp.codegen.tile_config import (REGISTER_TILES, VECTOR_WIDTH, CacheSizes, TileConfig,
                                        TileConfigError, candidate_configs)

AWKWARD_M = [1, 7, 13, 97, 511, 512, 513]
RANK = {"scalar": 0, "avx2": 1, "avx512": 2}

# Small block tiles on purpose: several N blocks, several (and a partial last) K block and
# several M blocks appear even at small K/N, so every path of the macro-kernel runs.
CONFIGS = {
    "avx512": [TileConfig(mr=14, nr=32, mc=28, nc=64, kc=16), TileConfig(mr=8, nr=48, mc=16, nc=96, kc=24),
               TileConfig(mr=4, nr=16, mc=8, nc=16, kc=768)],
    "avx2": [TileConfig(mr=6, nr=16, mc=12, nc=32, kc=16), TileConfig(mr=3, nr=32, mc=6, nc=64, kc=9)],
    "scalar": [TileConfig(mr=4, nr=8, mc=8, nc=16, kc=16), TileConfig(mr=1, nr=3, mc=2, nc=6, kc=5)],
}
SHAPES_KN = [(1, 1), (5, 7), (37, 17), (64, 100)]


def needs(isa):
    return pytest.mark.skipif(RANK[host_isa()] < RANK[isa], reason=f"host ISA {host_isa()} lacks {isa}")


def isa_params():
    return [pytest.param(isa, marks=needs(isa)) for isa in ("avx512", "avx2", "scalar")]


def reference(X, W, epilogue=None, **arrays):
    acc = X.astype(np.float64) @ W.astype(np.float64)
    if epilogue is None:
        return acc
    bias = arrays["bias"].astype(np.float64)
    if epilogue.label == "bias":
        return acc + bias
    if epilogue.label == "bias + residual":
        return acc + bias + arrays["residual"]
    if epilogue.label == "bias + GELU(erf)":
        v = acc + bias
        return 0.5 * v * (1.0 + erf(v / math.sqrt(2.0)))
    raise AssertionError(epilogue.label)


def assert_matches(Y, ref, K):
    # float32 accumulation of K products of O(1) values: error grows ~ sqrt(K) with |Y|.
    np.testing.assert_allclose(Y, ref, rtol=1e-4, atol=1e-4 * math.sqrt(K))


def epilogue_arrays(epilogue, M, N, rng):
    if epilogue is None:
        return {}
    arrays = {"bias": rng.standard_normal(N).astype(np.float32)}
    if "residual" in epilogue.label:
        arrays["residual"] = rng.standard_normal((M, N)).astype(np.float32)
    return arrays


def check_all_m(kernel, W, rng, ms=AWKWARD_M, epilogue=None):
    K, N = W.shape
    for M in ms:
        X = rng.standard_normal((M, K)).astype(np.float32)
        arrays = epilogue_arrays(epilogue, M, N, rng)
        Y = kernel.run(X, **arrays)
        assert Y.shape == (M, N) and Y.dtype == np.float32
        assert_matches(Y, reference(X, W, epilogue, **arrays), K)


# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("K,N", SHAPES_KN)
def test_gemm_matches_numpy_at_awkward_m_n_k_for_every_config(isa, K, N):
    rng = np.random.default_rng(K * 1000 + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    for cfg in CONFIGS[isa]:
        check_all_m(GemmKernel(W, cfg, isa=isa), W, rng)


@needs("avx512")
@pytest.mark.parametrize("K,N", [(768, 768), (5, 768), (768, 7)])
def test_bert_sized_gemm_matches_numpy_with_candidate_configs(K, N):
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    cands = candidate_configs("avx512", K, N)
    for cfg in {cands[0], cands[-1]}:
        check_all_m(GemmKernel(W, cfg, isa="avx512"), W, rng, ms=[1, 13, 97, 513])


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("epilogue", [Epilogue.bias(), Epilogue.bias_gelu(), Epilogue.bias_residual()],
                         ids=["bias", "bias_gelu", "bias_residual"])
def test_fused_epilogue_matches_numpy_on_edge_and_interior_tiles(isa, epilogue):
    rng = np.random.default_rng(7)
    K, N = 37, 41
    W = rng.standard_normal((K, N)).astype(np.float32)
    kernel = GemmKernel(W, CONFIGS[isa][0], isa=isa, epilogue=epilogue)
    check_all_m(kernel, W, rng, ms=[1, 13, 97, 512, 513], epilogue=epilogue)


@pytest.mark.parametrize("isa", [pytest.param(i, marks=needs(i)) for i in ("avx512", "avx2")])
@pytest.mark.parametrize("epilogue", [None, Epilogue.bias_residual()], ids=["plain", "bias_residual"])
def test_every_row_tail_height_matches_numpy_with_and_without_partial_sums(isa, epilogue):
    # M = 1 .. 2*MR + 1 gives every tail height 1 .. MR-1 of the last row panel (its own
    # micro-kernel), alone and after full panels, across several K blocks (partial sums) and one
    rng = np.random.default_rng(11)
    K, N = 37, 41
    W = rng.standard_normal((K, N)).astype(np.float32)
    mr = 6 if isa == "avx512" else 5
    for kc in (8, K):
        cfg = TileConfig(mr=mr, nr=2 * VECTOR_WIDTH[isa], mc=2 * mr, nc=4 * VECTOR_WIDTH[isa], kc=kc)
        source = generate_gemm(cfg, K, N, isa)
        assert all(f"micro_kernel_{r}(" in source for r in range(1, mr))
        check_all_m(GemmKernel(W, cfg, isa=isa, epilogue=epilogue), W, rng, ms=range(1, 2 * mr + 2),
                    epilogue=epilogue)


@needs("avx512")
def test_fused_epilogue_on_bert_sized_gemm_with_single_k_block():
    rng = np.random.default_rng(3)
    W = rng.standard_normal((768, 768)).astype(np.float32)
    kernel = GemmKernel(W, TileConfig(mr=14, nr=32, mc=28, nc=384, kc=768), epilogue=Epilogue.bias_gelu())
    check_all_m(kernel, W, rng, ms=[1, 97], epilogue=Epilogue.bias_gelu())


@pytest.mark.parametrize("erf_name", ["tscomp_erff", "erff"])
def test_erf_in_epilogue_matches_scipy_over_its_whole_range(erf_name):
    x = np.linspace(-7, 7, 20001, dtype=np.float32).reshape(-1, 1)
    kernel = GemmKernel(np.ones((1, 1), np.float32), CONFIGS[host_isa()][0],
                        epilogue=Epilogue(f"{erf_name}(acc)", label="erf"))
    np.testing.assert_allclose(kernel.run(x), erf(x.astype(np.float64)), rtol=0, atol=5e-7)


def test_bias_gelu_with_libm_erff_matches_numpy():
    rng = np.random.default_rng(11)
    W = rng.standard_normal((16, 20)).astype(np.float32)
    epi = Epilogue.bias_gelu(erf="erff")
    assert "erff(" in epi.expr and "tscomp_erff" not in epi.expr
    check_all_m(GemmKernel(W, CONFIGS[host_isa()][0], epilogue=epi), W, rng, ms=[1, 13], epilogue=epi)


def test_custom_epilogue_with_scalar_argument_and_indices():
    rng = np.random.default_rng(5)
    W = rng.standard_normal((9, 19)).astype(np.float32)
    epi = Epilogue("acc * scale + (float)(i * 100 + j)", (EpilogueArg("scale", "float"),), "scale + index")
    kernel = GemmKernel(W, CONFIGS[host_isa()][0], epilogue=epi)
    X = rng.standard_normal((15, 9)).astype(np.float32)
    i, j = np.indices((15, 19))
    assert_matches(kernel.run(X, scale=2.0), 2.0 * (X.astype(np.float64) @ W) + i * 100 + j, 9)


def test_m_zero_returns_empty_and_out_is_filled_in_place():
    W = np.ones((4, 5), np.float32)
    kernel = GemmKernel(W, CONFIGS[host_isa()][0])
    assert kernel.run(np.zeros((0, 4), np.float32)).shape == (0, 5)
    out = np.full((3, 5), np.nan, np.float32)
    assert kernel.run(np.ones((3, 4), np.float32), out=out) is out
    np.testing.assert_array_equal(out, 4.0)


# ---------------------------------------------------------------- packing and generated source


def test_prepacked_weights_follow_the_documented_panel_layout_with_zero_padding():
    K, N = 5, 7
    cfg = TileConfig(mr=1, nr=3, mc=1, nc=6, kc=2)  # Np = 9: panels [0,3) [3,6) [6,9), each all of K
    W = np.arange(K * N, dtype=np.float32).reshape(K, N) + 1
    packed = prepack_weights(W, cfg)
    assert packed.size == packed_size(cfg, K, N) == K * 9 and packed.ctypes.data % 64 == 0
    Wp = np.zeros((K, 9), np.float32)
    Wp[:, :N] = W
    expected = []
    for p in range(3):
        expected.extend(Wp[:, 3 * p:3 * p + 3].reshape(-1))
    np.testing.assert_array_equal(packed, expected)
    assert (packed.reshape(-1)[-3:] == [W[4, 6], 0, 0]).all()  # padded columns are zero


def test_the_panel_layout_depends_on_the_register_tile_width_alone():
    """Variants of one weight with the same nr share one packed copy at run time."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((300, 200)).astype(np.float32)
    a = TileConfig(mr=8, nr=48, mc=64, nc=96, kc=128)
    b = TileConfig(mr=4, nr=48, mc=256, nc=192, kc=300)
    for precision in ("fp32", "bf16"):
        np.testing.assert_array_equal(prepack_weights(W, a, precision), prepack_weights(W, b, precision))
    W = W[:, :192]     # a multiple of 16 and 48: no padded columns either way, so only the order differs
    narrow, wide = (prepack_weights(W, TileConfig(mr=8, nr=nr, mc=64, nc=96, kc=128)) for nr in (16, 48))
    assert narrow.size == wide.size and not np.array_equal(narrow, wide)


@pytest.mark.parametrize("isa,intrinsic", [("avx512", "_mm512_fmadd_ps"), ("avx2", "_mm256_fmadd_ps"),
                                           ("scalar", "fmaf")])
def test_generated_source_names_config_isa_epilogue_and_uses_the_isa_fma(isa, intrinsic):
    cfg = CONFIGS[isa][0]
    src = generate_gemm(cfg, 768, 2304, isa, Epilogue.bias_gelu(), name="k1")
    assert cfg.describe() in src and f"ISA:        {isa}" in src and "bias + GELU(erf)" in src
    assert intrinsic in src and "#pragma omp parallel" in src
    assert "void k1(const float* restrict X, const float* restrict Wp, float* restrict Y, int64_t M, " \
           "const float* restrict bias)" in src
    other = {"avx512": "_mm256_", "avx2": "_mm512_", "scalar": "_mm"}[isa]
    assert other not in src
    # local padding: the FMA loop of the micro-kernel has no bounds tests (its one test picks the
    # k steps that stream the next weight panel into L2, every L2_STREAM_K_STRIDE-th)
    body = _fma_loops(src)[0]
    assert "fma" in body
    stream_test = "if (!((k) & ((1 << stream_log2) - 1))) {  /* the weight stream into L2 */"
    assert (stream_test in body) == (isa != "scalar")
    assert "if" not in body.replace(stream_test, "") and "?" not in body
    # the weight panel is prefetched PREFETCH_K_STEPS ahead, one prefetch per cache line of a k step
    if isa == "scalar":
        assert "_mm_prefetch" not in src and "Prefetch:   none" in src
    else:
        lines = -(-cfg.nr * 4 // 64)
        assert body.count(f"_mm_prefetch((const char*)(wk + {PREFETCH_K_STEPS} * NR)") == lines
        assert f"Prefetch:   the weight panel {PREFETCH_K_STEPS} k steps ahead" in src


@pytest.mark.parametrize("isa,precision,packs", [("avx512", "fp32", False), ("avx2", "fp32", False),
                                                  ("scalar", "fp32", True), ("avx512", "bf16", True)])
def test_fp32_simd_kernels_read_x_in_place_and_the_others_pack_it(isa, precision, packs):
    # packing copied X once per task and K block (N / nc copies per call); the fp32 SIMD kernels
    # broadcast X's elements from its rows (K floats apart) instead; bf16 converts X while packing
    cfg = {"avx2": TileConfig(mr=8, nr=8, mc=64, nc=64, kc=64), "scalar": CONFIGS["scalar"][0]}.get(
        isa, TileConfig(mr=8, nr=32, mc=64, nc=64, kc=64))
    src = generate_gemm(cfg, 160, 96, isa, name="xk", precision=precision)
    assert ("pack_x(X, m0, mv, k0, kl, xpack);" in src) == packs
    assert ("X + (m0 + ip * MR) * (int64_t)K + k0" in src) == (not packs)
    if not packs:
        assert "xk[7 * K]" in _fma_loops(src)[0] and "X read in place" in src


def _fma_loops(src: str) -> list[str]:
    """The bodies of the generated FMA loops, in source order (the full-height micro-kernel's first)."""
    def body(after_marker: str) -> str:   # up to the loop's closing brace (inside a branch or not)
        ends = [i for i in (after_marker.find(f"\n{' ' * n}}}\n") for n in (4, 8)) if i >= 0]
        return after_marker[:min(ends)]
    return [body(part) for part in src.split("/* FMA loop: no bounds tests (local padding) */")[1:]]


@needs("avx512")
@pytest.mark.parametrize("l1_kib,pulls_on_every_pass", [(48, False), (4, True)])
def test_later_row_passes_skip_the_l1_prefetch_only_when_the_panel_fits_l1(l1_kib, pulls_on_every_pass):
    # 8x48 tile, kc = 24: the weight panel's K block and the X panel take 5.3 KiB, within 3/4 of a
    # 48 KiB L1 but not of a 4 KiB one. The full-height kernel has one loop per prefetch need: the
    # first row pass (L1 + the L2 stream), later ones while the stream lasts, and (fitting) none.
    cfg = TileConfig(mr=8, nr=48, mc=64, nc=96, kc=24)
    src = generate_gemm(cfg, 37, 100, "avx512", l1=l1_kib * 1024)
    l1_prefetch = f"_mm_prefetch((const char*)(wk + {PREFETCH_K_STEPS} * NR)"
    stream = "/* the weight stream into L2 */"
    first, later, last = _fma_loops(src)[:3]
    assert l1_prefetch in first and stream in first
    # the stream: the 48-wide panel's K block (3 lines per k step) over 3 row passes at a line per k
    # step, or over 3 x L2_STREAM_K_STRIDE passes at a line per L2_STREAM_K_STRIDE k steps in a task
    # that has that many passes
    every = L2_STREAM_K_STRIDE
    assert f"const int stream_log2 = (mv + MR - 1) / MR >= {3 * every} ? {every.bit_length() - 1} : 0;" in src
    assert "ip < (3 << stream_log2) ? wnext + ip * (((kl) + (1 << stream_log2) - 1) >> stream_log2) * 16 : NULL" in src
    if pulls_on_every_pass:
        assert "const int pull = 1;" in src
        assert l1_prefetch in later and stream not in later
    else:
        assert "const int pull = ip == 0;" in src
        assert l1_prefetch not in later and stream in later
        assert l1_prefetch not in last and stream not in last
    # every branch computes the same product: 8 row passes cover the pull, stream-only and bare loops
    rng = np.random.default_rng(5)
    W = rng.standard_normal((37, 100)).astype(np.float32)
    kernel = GemmKernel(W, cfg, isa="avx512", name=f"pull_l1_{l1_kib}")
    if not pulls_on_every_pass:   # (any host's L1 holds these 5.3 KiB: the run covers the bare loop)
        assert "const int pull = ip == 0;" in kernel.source
    check_all_m(kernel, W, rng, ms=(1, 9, 23, 64, 71, 130))


# ---------------------------------------------------------------- tile configurations


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
@pytest.mark.parametrize("K,N", [(1, 1), (5, 7), (768, 2304), (768, 768), (3072, 768), (768, 3072)])
def test_candidate_configs_are_valid_and_cache_sized(isa, K, N):
    caches = CacheSizes(l1=48 * 1024, l2=1024 * 1024, l3=32 * 1024 * 1024)
    cands = candidate_configs(isa, K, N, caches=caches)
    assert 2 <= len(cands) == len(set(cands))
    for cfg in cands:
        cfg.validate(isa)
        small = (cfg.mr, cfg.nr) in REGISTER_TILES[isa]["small"]
        assert cfg.nr % VECTOR_WIDTH[isa] == 0
        assert small or (cfg.mr, cfg.nr) in REGISTER_TILES[isa]["large"]
        assert cfg.kc <= K and cfg.nc % cfg.nr == 0 and cfg.nc <= -(-N // cfg.nr) * cfg.nr
        # the L1-resident panels: W's kc x nr (large-M tiles) or X's mr x kc (small-M tiles)
        assert 4 * cfg.kc * (cfg.mr if small else cfg.mr + cfg.nr) <= caches.l1 or cfg.kc <= 8


@pytest.mark.parametrize("cfg,isa,match", [
    (TileConfig(14, 24, 14, 24, 8), "avx512", "not a multiple of the avx512 vector width"),
    (TileConfig(16, 32, 16, 32, 8), "avx512", "needs 32 accumulators"),
    (TileConfig(8, 16, 8, 16, 8), "avx2", "needs 16 accumulators"),
])
def test_tile_config_rejects_violated_hard_constraints(cfg, isa, match):
    with pytest.raises(TileConfigError, match=match):
        cfg.validate(isa)


def test_tile_config_rejects_blocks_that_are_not_whole_register_tiles():
    with pytest.raises(TileConfigError, match="mc=10 is not a multiple of mr=4"):
        TileConfig(4, 16, 10, 16, 8)
    with pytest.raises(TileConfigError, match="positive int"):
        TileConfig(0, 16, 8, 16, 8)
    assert "14x32" in TileConfig(14, 32, 28, 64, 16).describe()


# ---------------------------------------------------------------- argument validation


@pytest.fixture(scope="module")
def bias_kernel():
    W = np.ones((6, 10), np.float32)
    return GemmKernel(W, CONFIGS[host_isa()][0], epilogue=Epilogue.bias_residual())


@pytest.mark.parametrize("X,kwargs,match", [
    (np.ones((3, 5), np.float32), {}, "X has 5 columns but the kernel was compiled for K=6"),
    (np.ones((3, 6), np.float64), {}, "X must be float32, got float64"),
    (np.ones((6, 3), np.float32).T, {}, "X must be C-contiguous"),
    (np.ones(6, np.float32), {}, "X must be 2-D"),
    (np.ones((3, 6), np.float32), {"residual": np.ones((3, 10), np.float32)}, "missing epilogue argument 'bias'"),
    (np.ones((3, 6), np.float32), {"bias": np.ones(9, np.float32), "residual": np.ones((3, 10), np.float32)},
     r"'bias' has shape \(9,\), expected \(10,\)"),
    (np.ones((3, 6), np.float32), {"bias": np.ones(10, np.float32), "residual": np.ones((4, 10), np.float32)},
     r"'residual' has shape \(4, 10\), expected \(3, 10\)"),
    (np.ones((3, 6), np.float32), {"bias": np.ones(10, np.float32), "residual": np.ones((3, 10), np.float32),
                                   "gamma": np.ones(10, np.float32)}, "unexpected epilogue argument"),
])
def test_run_rejects_bad_inputs_with_clear_errors(bias_kernel, X, kwargs, match):
    with pytest.raises(GemmError, match=match):
        bias_kernel.run(X, **kwargs)


def test_bad_weights_and_epilogue_definitions_are_rejected():
    with pytest.raises(GemmError, match="2-D float32"):
        GemmKernel(np.ones((3, 4), np.float64))
    for clash in ("N", "kl", "c0_1", "w2", "float", "bias[0]"):
        with pytest.raises(GemmError, match="not a free C identifier"):
            EpilogueArg(clash)
    with pytest.raises(GemmError, match="C type"):
        EpilogueArg("bias", "double*")
    with pytest.raises(GemmError, match="duplicate"):
        Epilogue("acc", (EpilogueArg("b"), EpilogueArg("b")))


def test_row_pass_hook_runs_over_whole_rows_per_task_or_after_split_n_tiles():
    """Epilogue.row_pass: a hand-written row pass (scale each row by its max) after the last K step
    of a whole-row task, or after the task loop when N is split over tasks -- by the configuration,
    or at run time when M leaves fewer row blocks than threads (M = 1 and 17 with nc = NP)."""
    from tscomp.codegen.cpu_gemm import Epilogue, GemmKernel, generate_gemm
    from tscomp.codegen.tile_config import TileConfig
    from tscomp.codegen.build import host_isa
    isa = host_isa()
    nr = {"avx512": 48, "avx2": 16, "scalar": 8}[isa]
    mr = 4
    K, N = 300, 70
    NP = -(-N // nr) * nr
    row = """    for (int64_t i = m0; i < m0 + mv; ++i) {
        float mx = -INFINITY;
        for (int64_t j = 0; j < N; ++j) mx = Y[i * N + j] > mx ? Y[i * N + j] : mx;
        for (int64_t j = 0; j < N; ++j) Y[i * N + j] /= mx;
    }"""
    epi = Epilogue("acc + bias[j]", (EpilogueArg("bias", shape=("N",)),), "bias", row_pass=row, row_label="max-scale")
    split = generate_gemm(TileConfig(mr=mr, nr=nr, mc=4 * mr, nc=nr, kc=64), K, N + nr, isa, epi)
    assert "if (n_nblocks > 1)" in split and "if (n_nblocks == 1) row_pass(Y, m0, mv" in split
    rng = np.random.default_rng(5)
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = np.abs(rng.standard_normal(N)).astype(np.float32) + 50
    kern = GemmKernel(W, TileConfig(mr=mr, nr=nr, mc=4 * mr, nc=NP, kc=64), isa=isa, epilogue=epi)
    kern_split = GemmKernel(W, TileConfig(mr=mr, nr=nr, mc=4 * mr, nc=nr, kc=64), isa=isa, epilogue=epi)
    for M in (1, 17, 61):
        X = rng.standard_normal((M, K)).astype(np.float32)
        y = X.astype(np.float64) @ W + bias
        for k in (kern, kern_split):
            np.testing.assert_allclose(k.run(X, bias=bias), y / y.max(axis=1, keepdims=True), rtol=1e-4, atol=1e-4)


def test_row_blocks_that_do_not_divide_among_the_threads_are_evened_out():
    """M = 139 under 64-row blocks is 3 blocks: on 2 threads the third would run alone in a second
    wave. The kernel makes 4 (the register tiles dealt 5, 5, 4, 4), the task count says so, and
    every row is still computed once (numerics on 2 and 3 threads at M that are evened and not)."""
    from tscomp.codegen.build import get_num_threads, set_num_threads
    from tscomp.codegen.cpu_gemm import _Geometry, row_block_classes, row_blocks
    assert row_blocks(139, 64, 8, 1, 2) == 4 and row_blocks(139, 64, 8, 2, 2) == 3   # 6 tasks divide already
    assert row_block_classes(139, 64, 8, 1, 2, granule=1) == [(2, 40), (1, 32), (1, 27)]
    assert row_blocks(139, 64, 8, 1, 3) == 3 and row_blocks(300, 64, 8, 1, 2) == 6
    assert row_blocks(9, 8, 8, 1, 2) == 2 and row_blocks(17, 8, 8, 1, 2) == 3   # never past one block per tile
    assert row_blocks(9 * 64 + 1, 64, 8, 1, 2) == 10                          # 10 tasks: 5 per thread
    rng = np.random.default_rng(5)
    K, N = 40, 48
    W = rng.standard_normal((K, N)).astype(np.float32)
    cfg = TileConfig(mr=8, nr=VECTOR_WIDTH[host_isa()], mc=64, nc=48, kc=16)   # 8 accumulators on any ISA
    g = _Geometry.of(cfg, K, N, "fp32")
    assert g.n_nblocks == 1 and g.tasks(139, 2) == 4 and g.tasks(139, 3) == 3
    kernel = GemmKernel(W, cfg, epilogue=Epilogue.bias_residual())
    before = get_num_threads()
    try:
        for threads in (2, 3):
            set_num_threads(threads)
            check_all_m(kernel, W, rng, ms=[65, 129, 139, 200, 257, 330], epilogue=Epilogue.bias_residual())
    finally:
        set_num_threads(before)


def test_row_block_classes_cover_m_once_in_balanced_whole_tiles():
    """For every M, thread count and N-block count: the classes' rows add up to M in as many blocks
    as row_blocks says, at most MC rows each, one register tile apart at most (the last block its
    partial tile); a few tasks are a multiple of the threads wherever the tiles allow."""
    from tscomp.codegen.cpu_gemm import row_block_classes, row_blocks
    from tscomp.codegen.tile_config import BALANCE_TASKS_PER_THREAD
    MC, MR = 48, 8
    for threads in (1, 2, 3, 4):
        for nnb in (1, 2, 3):
            for M in range(1, 400):
                classes = row_block_classes(M, MC, MR, nnb, threads, granule=1)
                rows = [w for c, w in classes for _ in range(int(c))]
                n = row_blocks(M, MC, MR, nnb, threads)
                assert sum(rows) == M and len(rows) == n, (threads, nnb, M)
                assert max(rows) <= MC and max(rows) - min(rows) < 2 * MR, (threads, nnb, M)
                base = -(-M // MC) * nnb
                if threads <= base < BALANCE_TASKS_PER_THREAD * threads and n < -(-M // MR):
                    assert (n * nnb) % threads == 0, (threads, nnb, M)


def test_small_m_cuts_n_finer_so_every_thread_has_a_task():
    """A configuration whose one N block covers all of N (nc = NP) gives one task per row block; when
    that is fewer than the threads, the kernel cuts N into whole panels at run time and the task
    count the runtime's wave model reads says so."""
    from tscomp.codegen.cpu_gemm import _Geometry
    from tscomp.codegen.tile_config import TileConfig
    g = _Geometry.of(TileConfig(mr=8, nr=32, mc=64, nc=3072, kc=256), 768, 3072, "fp32")
    assert g.n_nblocks == 1
    assert g.tasks(49, 1) == 1
    assert g.tasks(49, 2) == 2 and g.tasks(49, 8) == 8
    assert g.tasks(100, 2) == 2          # two row blocks already
    assert g.tasks(100, 5) == 2 * 3      # ceil(5 / 2) N blocks per row block
    assert _Geometry.of(TileConfig(mr=8, nr=32, mc=64, nc=32, kc=256), 768, 64, "fp32").tasks(1, 16) == 2


def test_a_weight_larger_than_the_l3_runs_short_m_as_one_tall_block_and_stays_exact(monkeypatch):
    """Where the weight exceeds half the L3 (here a 16 KiB L3 stands in for an LLM's 65 MB vocabulary
    head), rows up to what the L2 holds as partial sums run as one block -- no second stream of the
    weight from memory -- and the task count the wave model reads says so; above that bound, and for
    a weight that fits, MC-row blocks as before. Numerics at M across the bound, partial sums on
    (several K blocks), on 1 and 2 threads."""
    from tscomp.codegen import cpu_gemm
    from tscomp.codegen.build import get_num_threads, set_num_threads
    from tscomp.codegen.cpu_gemm import _Geometry, row_block_classes
    small = CacheSizes(l1=32 * 1024, l2=64 * 1024, l3=16 * 1024)
    monkeypatch.setattr(cpu_gemm, "host_caches", lambda: small)
    nr = VECTOR_WIDTH[host_isa()]
    K, N = 40, 8 * nr
    cfg = TileConfig(mr=4, nr=nr, mc=8, nc=4 * nr, kc=16)          # 2 N blocks, 3 K blocks
    g = _Geometry.of(cfg, K, N, "fp32")
    assert g.tall_rows == 64 * 1024 // (4 * 4 * nr) // 4 * 4 and g.tall_rows > cfg.mc
    assert g.tasks(g.tall_rows, 2) == 2 and g.tasks(g.tall_rows + 1, 2) > 2
    assert [(c, w) for c, w in row_block_classes(17, 8, 4, 2, 2, granule=1, tall_rows=g.tall_rows) if c] == [(1, 17)]
    assert f"#define TALL_ROWS {g.tall_rows}" in generate_gemm(cfg, K, N, host_isa())
    assert _Geometry.of(TileConfig(mr=4, nr=nr, mc=8, nc=nr, kc=4), 4, nr, "fp32").tall_rows == 0   # fits the L3
    rng = np.random.default_rng(11)
    W = rng.standard_normal((K, N)).astype(np.float32)
    kernel = GemmKernel(W, cfg, epilogue=Epilogue.bias_residual())
    before = get_num_threads()
    try:
        for threads in (1, 2):
            set_num_threads(threads)
            check_all_m(kernel, W, rng, ms=[1, 5, 8, 9, 17, g.tall_rows - 1, g.tall_rows, g.tall_rows + 1, 3 * g.tall_rows],
                        epilogue=Epilogue.bias_residual())
    finally:
        set_num_threads(before)
