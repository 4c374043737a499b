"""The int8 GEMM macro-kernels (VPDPBUSD, and AMX's TDPBUSD where the CPU has int8 tiles) against
exact integer products at awkward M, K, N.

Its operands are integers held in float32 (a quantized model's GEMM after the graph stage's
rewrite): X spanning at most 256 values from ``x_offset``, W in [-128, 127]. The sums are exact in
int32 and converted to float32 once, so the kernel must equal the int64 product converted to
float32 bit for bit -- a kernel that dropped the column corrections, mis-packed a quad or lost a
partial sum between K blocks is off by whole integers.
"""
import numpy as np
import pytest

from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_gemm import (Epilogue, GemmError, GemmKernel, generate_gemm, packed_size,
                                     prepack_weights)
from tscomp.codegen.tile_config import TileConfig
from tscomp.schedule.target import TargetError, check_precision, host_cpu

HAS_VNNI = host_isa() == "avx512" and host_cpu().spec.vnni
needs_vnni = pytest.mark.skipif(not HAS_VNNI, reason="this CPU has no avx512_vnni")
needs_amx_int8 = pytest.mark.skipif(not host_cpu().spec.amx_int8,
                                    reason="this CPU has no AMX int8 tiles (or the OS does not grant them)")

AWKWARD_M = [1, 5, 13, 97]
#: K not a multiple of 4, K blocks that split (kc rounded up to a quad), N padded to nr
SHAPES_KN = [(1, 1), (3, 17), (13, 97), (97, 7), (64, 100), (770, 33)]
CONFIGS = [TileConfig(mr=8, nr=32, mc=16, nc=64, kc=16), TileConfig(mr=6, nr=48, mc=12, nc=96, kc=25),
           TileConfig(mr=4, nr=16, mc=8, nc=16, kc=768), TileConfig(mr=1, nr=64, mc=4, nc=64, kc=7)]
#: AMX register tiles: 2x2 accumulator tiles with K blocks of two tile steps, 1x4 over all of K, one tile
#: with one-step K blocks (kc rounded up to the 64-deep tile step)
AMX_CONFIGS = [TileConfig(mr=32, nr=32, mc=64, nc=64, kc=128), TileConfig(mr=16, nr=64, mc=32, nc=128, kc=768),
               TileConfig(mr=16, nr=16, mc=16, nc=16, kc=7)]


def operands(M, K, N, x_offset, seed):
    rng = np.random.default_rng(seed)
    X = rng.integers(x_offset, x_offset + 256, (M, K)).astype(np.float32)
    X[0, :] = x_offset + 255                      # the largest sums the range allows
    W = rng.integers(-128, 128, (K, N)).astype(np.float32)
    W[:, 0] = -128
    return X, W


def exact(X, W):
    return (X.astype(np.int64) @ W.astype(np.int64)).astype(np.float32)


@needs_vnni
@pytest.mark.parametrize("K,N", SHAPES_KN)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.slug())
def test_int8_gemm_equals_the_exact_integer_product_at_awkward_sizes(K, N, cfg):
    for x_offset in (-128, 0, -37):               # signed bytes, unsigned bytes, a zero point's shift
        X, W = operands(max(AWKWARD_M), K, N, x_offset, K * 1000 + N)
        kernel = GemmKernel(W, cfg, isa="avx512", precision="int8", x_offset=x_offset)
        for M in AWKWARD_M:
            np.testing.assert_array_equal(kernel.run(X[:M]), exact(X[:M], W), err_msg=f"M={M} x_offset={x_offset}")


@needs_amx_int8
@pytest.mark.parametrize("K,N", SHAPES_KN)
@pytest.mark.parametrize("cfg", AMX_CONFIGS, ids=lambda c: c.slug())
def test_amx_int8_gemm_equals_the_exact_integer_product_at_awkward_sizes(K, N, cfg):
    """TDPBUSD on the same panels: K padded to a 64-deep tile step, rows past M computed on zero bytes
    and never stored, the column corrections added when the int32 tile is converted."""
    for x_offset in (-128, 0, -37):
        X, W = operands(max(AWKWARD_M), K, N, x_offset, K * 1000 + N)
        kernel = GemmKernel(W, cfg, isa="amx", precision="int8", x_offset=x_offset)
        for M in AWKWARD_M:
            np.testing.assert_array_equal(kernel.run(X[:M]), exact(X[:M], W), err_msg=f"M={M} x_offset={x_offset}")


@pytest.mark.parametrize("isa,cfg", [pytest.param("avx512", TileConfig(mr=8, nr=32, mc=16, nc=64, kc=128), marks=needs_vnni),
                                     pytest.param("amx", TileConfig(mr=32, nr=32, mc=64, nc=64, kc=128),
                                                  marks=needs_amx_int8)])
def test_int8_gemm_runs_the_fp32_epilogue_on_the_converted_sums(isa, cfg):
    X, W = operands(29, 300, 70, -128, 1)
    bias = np.random.default_rng(2).standard_normal(70).astype(np.float32)
    kernel = GemmKernel(W, cfg, isa=isa, precision="int8", x_offset=-128, epilogue=Epilogue.bias())
    np.testing.assert_allclose(kernel.run(X, bias=bias), exact(X, W) + bias, rtol=1e-6)


def test_int8_packing_is_quads_along_k_then_the_column_corrections():
    """Per panel, per quad of K rows, ``nr`` int32 lanes holding W[4q .. 4q + 3, j] (lowest byte the
    first k; K zero-padded to a multiple of 64 -- one AMX int8 tile step, so VPDPBUSD and AMX kernels
    share the panels -- N to nr), then the NP corrections x_offset * colsum."""
    cfg = TileConfig(mr=4, nr=16, mc=8, nc=16, kc=768)
    K, N, x_offset = 7, 20, -128
    W = np.random.default_rng(3).integers(-128, 128, (K, N)).astype(np.float32)
    packed = prepack_weights(W, cfg, "int8", x_offset)
    kp, npad = 64, 32
    assert packed.dtype == np.int32 and packed.size == packed_size(cfg, K, N, "int8") == kp // 4 * npad + npad
    assert packed.ctypes.data % 64 == 0
    quads = packed[:kp // 4 * npad].view(np.int8).reshape(npad // 16, kp // 4, 16, 4)
    padded = np.zeros((kp, npad), np.int64)
    padded[:K, :N] = W
    for j in range(npad):
        for k in range(kp):
            assert quads[j // 16, k // 4, j % 16, k % 4] == padded[k, j]
    np.testing.assert_array_equal(packed[kp // 4 * npad:], x_offset * padded.sum(axis=0))


def test_int8_weights_outside_a_signed_byte_or_not_integers_are_refused():
    cfg = TileConfig(mr=4, nr=16, mc=8, nc=16, kc=768)
    for W in (np.full((4, 16), 128.0, np.float32), np.full((4, 16), 0.5, np.float32)):
        with pytest.raises(GemmError, match=r"\[-128, 127\]"):
            prepack_weights(W, cfg, "int8")


def test_int8_source_names_its_precision_and_uses_vpdpbusd():
    src = generate_gemm(TileConfig(mr=8, nr=32, mc=16, nc=64, kc=64), 100, 64, "avx512", precision="int8",
                        x_offset=-128)
    assert "int8 operands, int32 accumulation" in src and "#define XLO -128" in src
    assert "vpdpbusd" in src and "_mm512_cvtepi32_ps" in src


def test_amx_int8_source_names_the_int32_tiles_and_uses_tdpbusd():
    """Generating needs no AMX (only running does): the header names the tiles, the loop TDPBUSD."""
    src = generate_gemm(TileConfig(mr=32, nr=32, mc=64, nc=64, kc=128), 300, 64, "amx", precision="int8",
                        x_offset=-128)
    assert "int32 accumulator tiles of 16x16" in src and "16 rows x 64 u8" in src and "#define XLO -128" in src
    assert "_tile_dpbusd(" in src and "_tile_dpbf16ps(" not in src and "#define KCP 128" in src


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_int8_on_an_isa_without_vpdpbusd_is_a_clear_error(isa):
    with pytest.raises(GemmError, match="AVX512_VNNI"):
        generate_gemm(TileConfig(mr=4, nr=8 if isa == "avx2" else 4, mc=8, nc=16, kc=64), 16, 16, isa,
                      precision="int8")


def test_int8_is_not_a_model_precision_and_needs_vnni():
    """``--precision`` offers fp32 and bf16; int8 is chosen per GEMM, on a CPU with avx512_vnni."""
    from tscomp.schedule.target import PRECISIONS
    assert "int8" not in PRECISIONS
    spec = host_cpu().spec
    from dataclasses import replace
    with pytest.raises(TargetError, match="avx512_vnni"):
        check_precision("int8", replace(spec, isa="avx512", vnni=False))
    assert check_precision("int8", replace(spec, isa="avx512", vnni=True)) == "int8"
    from tscomp.schedule.target import cuda
    with pytest.raises(TargetError, match="cpu target only"):
        check_precision("int8", cuda("sm_80").spec)
