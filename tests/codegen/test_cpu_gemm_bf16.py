"""The bf16 GEMM macro-kernel (issue 13) against numpy at awkward M, K, N.

The reference rounds X and W to bfloat16 (nearest even) and multiplies in float64: every product of
two bf16 values is exact in fp32, so the kernel differs from it only by fp32 accumulation rounding,
and the tolerance is tight (a few fp32 ulps of sum |x||w| per output). A test that used the fp32
inputs unrounded, or rounded them by truncation, would miss by ~1e-3 and fail.
"""
import numpy as np
import pytest

from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_gemm import (Epilogue, GemmError, GemmKernel, bf16_round, generate_gemm, packed_size,
                                     prepack_weights, to_bf16_bits)
from tscomp.codegen.tile_config import TileConfig, candidate_configs
from tscomp.schedule.target import host_cpu

HAS_BF16 = host_isa() == "avx512" and host_cpu().spec.bf16
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16")
HAS_AMX = HAS_BF16 and host_cpu().spec.amx
needs_amx = pytest.mark.skipif(not HAS_AMX, reason="this CPU has no AMX bf16 tiles")
#: AMX register tiles: 2x2 and 1x4 accumulator tiles, 1x1 and 2x1; split and whole K
AMX_CONFIGS = [TileConfig(mr=32, nr=32, mc=64, nc=64, kc=40), TileConfig(mr=16, nr=64, mc=32, nc=128, kc=768),
               TileConfig(mr=16, nr=16, mc=16, nc=32, kc=32), TileConfig(mr=32, nr=16, mc=32, nc=16, kc=7)]

AWKWARD_M = [1, 7, 13, 97]
#: odd and even K, K blocks that split (kc < K, odd kc rounded up to even), N padded to nr
SHAPES_KN = [(1, 1), (7, 13), (13, 97), (97, 7), (64, 100), (129, 33)]
CONFIGS = [TileConfig(mr=14, nr=32, mc=28, nc=64, kc=16), TileConfig(mr=8, nr=48, mc=16, nc=96, kc=25),
           TileConfig(mr=4, nr=16, mc=8, nc=16, kc=768), TileConfig(mr=1, nr=48, mc=4, nc=48, kc=7)]


def bf16_reference(X, W):
    """(bf16(X) . bf16(W) in float64, sum |bf16(X)| . |bf16(W)| for the error scale)."""
    Xb, Wb = bf16_round(X).astype(np.float64), bf16_round(W).astype(np.float64)
    return Xb @ Wb, np.abs(Xb) @ np.abs(Wb)


def test_bf16_rounding_is_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)                      # bf16 spacing at 1.0
    x = np.array([one, one + ulp / 2, one + ulp * 1.5, one + ulp * 0.49, -one - ulp * 0.51, np.nan, np.inf],
                 np.float32)
    got = bf16_round(x)
    assert got[0] == 1.0
    assert got[1] == 1.0                             # tie: to the even (1.0), not up
    assert got[2] == one + 2 * ulp                   # tie: to the even (1 + 2 ulp), up
    assert got[3] == 1.0 and got[4] == -one - ulp
    assert np.isnan(got[5]) and got[6] == np.inf
    assert to_bf16_bits(np.array([1.0], np.float32))[0] == 0x3F80


@pytest.mark.parametrize("K,N", SHAPES_KN)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.slug())
def test_bf16_packing_is_pairs_along_k_in_panels_padded_to_32_deep(K, N, cfg):
    W = np.random.default_rng(K * 1000 + N).standard_normal((K, N)).astype(np.float32)
    packed = prepack_weights(W, cfg, "bf16")
    assert packed.dtype == np.uint16 and packed.size == packed_size(cfg, K, N, "bf16")
    assert packed.size == -(-K // 32) * 32 * (-(-N // cfg.nr) * cfg.nr)     # K blocks padded to 32 deep
    assert packed.ctypes.data % 64 == 0
    kp, npad = -(-K // 32) * 32, -(-N // cfg.nr) * cfg.nr       # the whole pair layout, [panel, pair-row, nr, 2]
    bits_padded = np.zeros((kp, npad), np.uint16)
    bits_padded[:K, :N] = to_bf16_bits(W)
    assert np.array_equal(packed, bits_padded.reshape(kp // 2, 2, npad // cfg.nr, cfg.nr).transpose(2, 0, 3, 1).reshape(-1))
    # the first panel's first pair-row: lane c holds (W[0, c], W[1, c]) (low half the even k)
    bits = to_bf16_bits(W)
    lanes = min(cfg.nr, N)
    assert np.array_equal(packed[0:2 * lanes:2], bits[0, :lanes])
    if K > 1:
        assert np.array_equal(packed[1:2 * lanes:2], bits[1, :lanes])
    else:
        assert not packed[1:2 * lanes:2].any()      # odd K: the pad row is zero


def test_bf16_source_names_precision_and_uses_the_dot_product_instruction():
    cfg = TileConfig(mr=8, nr=48, mc=16, nc=96, kc=25)
    src = generate_gemm(cfg, 97, 33, "avx512", Epilogue.bias(), precision="bf16")
    assert "Precision:  bf16" in src and cfg.describe() in src
    assert "_mm512_dpbf16_ps" in src and "_mm512_cvtne2ps_pbh" in src and "_mm512_fmadd_ps" not in src
    assert "#define KC  32" in src            # a split K's blocks rounded up to whole 32-deep AMX tile steps
    fp32 = generate_gemm(cfg, 97, 33, "avx512", Epilogue.bias())
    assert "Precision:  fp32" in fp32 and "_mm512_dpbf16_ps" not in fp32


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_bf16_on_an_isa_without_vdpbf16ps_is_a_clear_error(isa):
    with pytest.raises(GemmError, match="bf16 GEMM kernels need AVX-512"):
        generate_gemm(TileConfig(mr=2, nr=16, mc=4, nc=16, kc=8), 8, 16, isa, precision="bf16")
    with pytest.raises(GemmError, match="unknown GEMM precision"):
        generate_gemm(TileConfig(mr=2, nr=16, mc=4, nc=16, kc=8), 8, 16, isa, precision="fp16")


#: (isa, config): the VDPBF16PS kernels and the AMX ones, each where the CPU has them
ISA_CONFIGS = [pytest.param("avx512", c, marks=needs_bf16, id=f"avx512-{c.slug()}") for c in CONFIGS] + \
    [pytest.param("amx", c, marks=needs_amx, id=f"amx-{c.slug()}") for c in AMX_CONFIGS]


@pytest.mark.parametrize("K,N", SHAPES_KN)
@pytest.mark.parametrize("isa,cfg", ISA_CONFIGS)
def test_bf16_gemm_matches_the_bf16_rounded_reference_at_awkward_sizes(K, N, isa, cfg):
    rng = np.random.default_rng(K * 7 + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    kernel = GemmKernel(W, cfg, isa=isa, precision="bf16")
    assert kernel.name.endswith("_bf16") and f"_{isa}_" in kernel.name
    assert ("_tile_dpbf16ps" if isa == "amx" else "_mm512_dpbf16_ps") in kernel.source
    for M in AWKWARD_M + [16, 33]:
        X = rng.standard_normal((M, K)).astype(np.float32)
        want, scale = bf16_reference(X, W)
        got = kernel.run(X)
        # fp32 accumulation of exact products: |error| <= ~K * 2^-24 * sum|x||w|; allow 4x that
        bound = 4 * K * 2.0 ** -24 * scale + 1e-30
        assert np.all(np.abs(got - want) <= bound), f"M={M}: worst {np.max(np.abs(got - want) / bound):.2f}x bound"
        # and it is really bf16: the fp32 product differs by far more than the accumulation bound
        if K >= 13:
            exact = X.astype(np.float64) @ W.astype(np.float64)
            assert np.max(np.abs(got - exact) / (scale + 1e-30)) > 1e-5


@pytest.mark.parametrize("isa", [pytest.param("avx512", marks=needs_bf16), pytest.param("amx", marks=needs_amx)])
@pytest.mark.parametrize("K,N", [(768, 768), (3072, 96), (97, 100)])
def test_bf16_gemm_with_fused_epilogue_over_the_heuristic_configs(K, N, isa):
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    for cfg in candidate_configs(isa, K, N)[::2 if isa == "avx512" else 1]:
        kernel = GemmKernel(W, cfg, isa=isa, epilogue=Epilogue.bias_residual(), precision="bf16")
        for M in (1, 13, 97):
            X = rng.standard_normal((M, K)).astype(np.float32)
            res = rng.standard_normal((M, N)).astype(np.float32)
            want, scale = bf16_reference(X, W)
            got = kernel.run(X, bias=bias, residual=res)
            bound = 4 * K * 2.0 ** -24 * scale + 1e-6 * (np.abs(bias) + np.abs(res) + 1)
            assert np.all(np.abs(got - (want + bias + res)) <= bound), (cfg, M)


def test_bf16_kernel_is_refused_on_a_cpu_without_avx512_bf16(monkeypatch):
    import dataclasses

    import tscomp.schedule.target as target_mod
    from tscomp.schedule.target import TargetError

    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, bf16=False))
    # the target's check, or on a host without AVX-512 at all the GEMM generator's (both name the instructions)
    with pytest.raises((TargetError, GemmError), match="(?i)avx512_bf16"):
        GemmKernel(np.ones((8, 16), np.float32), TileConfig(mr=2, nr=16, mc=4, nc=16, kc=8), isa=host_isa(),
                   precision="bf16")


def test_amx_source_names_its_tiles_and_requests_the_tile_state():
    cfg = TileConfig(mr=32, nr=32, mc=64, nc=64, kc=40)
    src = generate_gemm(cfg, 97, 33, "amx", Epilogue.bias(), precision="bf16")
    assert "ISA:        amx (AMX tile unit: 4 fp32 accumulator tiles" in src and cfg.describe() in src
    assert src.count("_tile_dpbf16ps(") == 4 and "_tile_loadconfig" in src and "_tile_release" in src
    assert "ARCH_REQ_XCOMP_PERM" in src and "#define KCP 64" in src
    assert "_mm512_dpbf16_ps" not in src and "_mm512_fmadd_ps" not in src


def test_an_fp32_gemm_is_refused_on_amx_tiles():
    with pytest.raises(GemmError, match=r"AMX GEMM kernels are bf16 \(TDPBF16PS\) or int8 \(TDPBUSD\)"):
        generate_gemm(TileConfig(mr=16, nr=16, mc=16, nc=16, kc=32), 32, 16, "amx", precision="fp32")


def test_an_amx_tile_config_is_whole_16_row_tiles():
    from tscomp.codegen.tile_config import TileConfigError
    with pytest.raises(TileConfigError, match="whole 16-row tiles"):
        TileConfig(mr=8, nr=32, mc=16, nc=32, kc=32).validate("amx")
    with pytest.raises(TileConfigError, match="accumulators"):
        TileConfig(mr=32, nr=48, mc=32, nc=48, kc=32).validate("amx")     # 6 accumulator tiles + 2 A: no B
