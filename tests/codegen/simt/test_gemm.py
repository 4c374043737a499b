"""The SIMT GEMM macro-kernel (constant weight, fused epilogue, local padding, plain and cp.async
staging in one source): the OpenCL build against numpy at awkward sizes; nvcc builds for sm_80 and
sm_90 without spills, resources parsed from ptxas."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf

from tscomp.codegen.cpu_gemm import Epilogue
from tscomp.codegen.simt.config import SimtTile
from tscomp.codegen.simt.gemm import SimtEpilogue, gemm_body
from tscomp.codegen.simt.launch import Launch, ceil_div, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SimtProgram
from tscomp.errors import UnsupportedOperatorError

LARGE = SimtTile(64, 64, 16, 32, 32, 4, 8, async_copy=True)
SMALL = SimtTile(32, 64, 8, 16, 32, 2, 8)
M_SIZES = (1, 7, 13, 97, 511, 513)


def _program(t, K, N, epi):
    return SimtProgram("/* test */\n", gemm_body("k", t, K, N, SimtEpilogue.from_cpu(epi)),
                       {"TS_WANT_ASYNC": 1} if t.async_copy else {})


def _run(simt_device, t, A, W, epi, extra):
    M, K = A.shape
    N = W.shape[1]
    Y = output_buffer((M, N), np.float32)
    launch = Launch("k", (ceil_div(M, t.bm), ceil_div(N, t.bn), 1), (t.threads, 1, 1),
                    [input_buffer(A, np.float32), input_buffer(W, np.float32), Y, scalar(M), *extra])
    _program(t, K, N, epi).run([launch])
    return Y.array


def _gelu(v):
    return 0.5 * v * (1 + erf(v / np.sqrt(2)))


@pytest.mark.parametrize("t", [LARGE, SMALL], ids=["large-async-cfg", "small-plain"])
@pytest.mark.parametrize("K,N", [(13, 97), (97, 7), (1, 513)])
def test_gemm_bias_gelu_matches_numpy_at_awkward_m(simt_device, t, K, N):
    rng = np.random.default_rng(K * 1000 + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    for M in M_SIZES:
        A = rng.standard_normal((M, K)).astype(np.float32)
        got = _run(simt_device, t, A, W, Epilogue.bias_gelu(), [input_buffer(bias, np.float32)])
        want = _gelu(A.astype(np.float64) @ W + bias)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"M={M} K={K} N={N}")


@pytest.mark.parametrize("t", [LARGE, SMALL], ids=["large-async-cfg", "small-plain"])
@pytest.mark.parametrize("K,N", [(13, 36), (40, 128)])
def test_gemm_with_n_a_multiple_of_4_stages_w_four_floats_at_a_time(simt_device, t, K, N):
    """N % 4 == 0: the W tile moves in 16-byte groups (cp.async 16 on a GPU), guarded per group
    where N is not a multiple of T_Nb (36) and per row where K is not one of T_Kb (13)."""
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    assert "TS_COPY4" in _program(t, K, N, Epilogue.bias()).body
    for M in M_SIZES:
        A = rng.standard_normal((M, K)).astype(np.float32)
        got = _run(simt_device, t, A, W, Epilogue.bias(), [input_buffer(bias, np.float32)])
        np.testing.assert_allclose(got, A.astype(np.float64) @ W + bias, rtol=1e-4, atol=1e-4, err_msg=f"M={M}")


@pytest.mark.parametrize("M", M_SIZES)
def test_gemm_bias_residual_and_plain_store(simt_device, M):
    rng = np.random.default_rng(M)
    K, N = 97, 13
    A = rng.standard_normal((M, K)).astype(np.float32)
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    res = rng.standard_normal((M, N)).astype(np.float32)
    got = _run(simt_device, LARGE, A, W, Epilogue.bias_residual(),
               [input_buffer(bias, np.float32), input_buffer(res, np.float32)])
    np.testing.assert_allclose(got, A.astype(np.float64) @ W + bias + res, rtol=1e-4, atol=1e-4)
    got = _run(simt_device, SMALL, A, W, None, [])
    np.testing.assert_allclose(got, A.astype(np.float64) @ W, rtol=1e-4, atol=1e-4)


def test_padding_lives_in_staging_only_the_store_is_guarded():
    body = gemm_body("k", SMALL, 13, 97, SimtEpilogue())
    inner = body[body.index("for (int kk"):body.index("fused epilogue")]
    assert "if (" not in inner and "? " not in inner.split("for (int kk")[1].split("TS_BARRIER")[0]
    assert ": 0.0f;" in body            # zero-filled out-of-bounds loads while staging
    assert body.count("if (j < N_)") == 1 and "if (i >= M) break;" in body
    # K a multiple of T_Kb and N of T_Nb: the W staging needs no check at all (and N a multiple of
    # 4: it moves 4 floats at a time)
    body = gemm_body("k", SimtTile(32, 64, 8, 16, 32, 2, 8), 64, 128, SimtEpilogue())
    assert "if (1) TS_COPY4(&Bs[0][c][r], &W[gk * N_ + gn]); else TS_ZERO4(&Bs[0][c][r]);" in body
    body = gemm_body("k", SimtTile(32, 64, 8, 16, 32, 2, 8), 64, 130, SimtEpilogue())
    assert "Bs[0][c][r] = (gn < N_) ? W[gk * N_ + gn] : 0.0f;" in body and "TS_COPY4" not in body


@pytest.mark.parametrize("bad", [SimtTile(64, 64, 8, 32, 32, 2, 2), SimtTile(64, 64, 8, 48, 32, 4, 8),
                                 SimtTile(0, 64, 8, 32, 32, 4, 8)])
def test_invalid_tiles_are_refused_with_the_reason(bad):
    with pytest.raises(UnsupportedOperatorError, match="SIMT tile"):
        bad.validate()


def test_a_prologue_epilogue_is_refused_clearly():
    epi = Epilogue("acc", a_prologue="Xa[0] = 1;")
    with pytest.raises(UnsupportedOperatorError, match="prologue"):
        SimtEpilogue.from_cpu(epi)


def test_nvcc_builds_sm80_and_sm90_without_spills_and_parses_resources(nvcc):
    from tscomp.codegen.nvcc import compile_cubin, compile_ptx
    p = _program(LARGE, 768, 3072, Epilogue.bias_gelu())
    for arch in ("sm_80", "sm_90"):
        b = compile_cubin(p.cuda, arch)
        r = b.resources["k"]
        assert b.cubin[:4] == b"\x7fELF"
        assert 0 < r.registers <= 255 and not b.spills
        assert r.shared_bytes == LARGE.shared_bytes()     # the static shared tiles, double-buffered
    ptx80 = compile_ptx(p.cuda, "sm_80")
    assert "cp.async" in ptx80                      # the async staging path on sm_80+
    plain = _program(SMALL, 768, 3072, Epilogue.bias_gelu())
    assert "cp.async" not in compile_ptx(plain.cuda, "sm_80")
    assert compile_cubin(plain.cuda, "sm_75").resources["k"].shared_bytes == SMALL.shared_bytes()


def test_ptxas_output_is_parsed_per_kernel():
    from tscomp.codegen.nvcc import parse_ptxas
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_80'
ptxas info    : Function properties for a
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8256 bytes smem, 392 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_80'
ptxas info    : Function properties for b
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 380 bytes cmem[0]
"""
    res = parse_ptxas(text)
    assert (res["a"].registers, res["a"].shared_bytes, res["a"].spill_stores, res["a"].spill_loads,
            res["a"].stack_bytes) == (255, 8256, 8, 4, 16)
    assert (res["b"].registers, res["b"].shared_bytes, res["b"].spill_stores) == (40, 0, 0)


MMA = SimtTile(64, 64, 16, 32, 32, 4, 8, async_copy=True, mma=True)


def test_tensor_core_tile_is_exact_on_opencl_and_within_tf32_error_on_cuda(simt_device):
    """OpenCL renders the tile's plain fp32 path; a GPU runs wmma TF32 (10-bit mantissa operands):
    relative L2 error ~1e-3 there, which is why TF32 tiles are only chosen on request."""
    rng = np.random.default_rng(5)
    K, N = 97, 130
    W = rng.standard_normal((K, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    for M in (1, 13, 97):
        A = rng.standard_normal((M, K)).astype(np.float32)
        Y = output_buffer((M, N), np.float32)
        p = SimtProgram("/* t */\n", gemm_body("k", MMA, K, N, SimtEpilogue.from_cpu(Epilogue.bias_gelu())),
                        {"TS_WANT_ASYNC": 1, "TS_WANT_MMA": 1})
        p.run([Launch("k", (ceil_div(M, MMA.bm), ceil_div(N, MMA.bn), 1), (MMA.threads, 1, 1),
                      [input_buffer(A, np.float32), input_buffer(W, np.float32), Y, scalar(M),
                       input_buffer(bias, np.float32)])])
        want = _gelu(A.astype(np.float64) @ W + bias)
        if simt_device == "opencl":
            np.testing.assert_allclose(Y.array, want, rtol=1e-4, atol=1e-4)
        else:
            rel = np.linalg.norm(Y.array - want) / np.linalg.norm(want)
            assert rel < 5e-3, f"M={M}: relative L2 error {rel:.2e} beyond TF32's"
    assert "#if TS_MMA" in p.body and "nvcuda::wmma::mma_sync" in p.body and "#define TS_MMA 0" in p.opencl


def test_tensor_core_tile_builds_mma_sync_on_sm80_sm90_and_plain_on_sm75(nvcc):
    from tscomp.codegen.nvcc import compile_cubin, compile_ptx
    p = SimtProgram("/* t */\n", gemm_body("k", MMA, 768, 768, SimtEpilogue.from_cpu(Epilogue.bias())),
                    {"TS_WANT_ASYNC": 1, "TS_WANT_MMA": 1})
    for arch in ("sm_80", "sm_90", "sm_75"):
        b = compile_cubin(p.cuda, arch)
        assert not b.spills and b.resources["k"].shared_bytes <= MMA.shared_bytes()
    assert "mma.sync" in compile_ptx(p.cuda, "sm_80")
    assert "mma.sync" not in compile_ptx(p.cuda, "sm_75")


def test_tensor_core_tiles_need_wmma_multiples():
    with pytest.raises(UnsupportedOperatorError, match="wmma"):
        SimtTile(64, 64, 4, 32, 32, 4, 8, mma=True).validate()
    assert MMA.validate().slug().endswith("_mma_async") and MMA.a_pad == 4
