"""The vectorizable ``tanhf`` of the generated C (:data:`tscomp.codegen.c_expr.TANH_HELPER`, issue 13:
GPT-2/ALBERT's tanh-form GELU called scalar libm ``tanhf`` per element): accurate to fp32 tolerance
against numpy over a range with large |x|, infinities, NaN and signed zero, and no call to libm's
tanhf is left in a kernel that uses it."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.c_expr import PRELUDE, math_helpers

_BODY = """
void tanh_all(const float* restrict x, float* restrict y, int64_t n)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i)
        y[i] = tanhf(x[i]);
}
"""


@pytest.fixture(scope="module")
def tanh_lib():
    source = PRELUDE + math_helpers(_BODY) + _BODY
    assert "ts_tanhf" in source
    path = build_library(source, "tanh_all")
    fn = load_library(path).tanh_all
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def run(x):
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        fn(x.ctypes.data, y.ctypes.data, x.size)
        return y
    return path, run


def test_tanh_matches_numpy_to_fp32_tolerance_including_large_arguments(tanh_lib):
    _, run = tanh_lib
    x = np.concatenate([np.linspace(-30, 30, 600_001, dtype=np.float32),
                        np.float32([1e-30, -1e-30, 3e-4, -3e-4, 5e-4, 7.9, -7.9, 8.0, 1e4, -1e4, 3e38, -3e38])])
    got = run(x)
    want = np.tanh(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(got) <= 1)
    big = np.abs(x) > 9
    assert np.all(got[big] == np.sign(x[big]))


def test_tanh_special_values(tanh_lib):
    _, run = tanh_lib
    got = run(np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0]))
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2])
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_a_kernel_using_tanh_does_not_call_libm_tanhf(tanh_lib):
    path, _ = tanh_lib
    symbols = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True).stdout
    assert "tanhf" not in symbols, symbols


def test_helpers_only_where_tanhf_is_called():
    assert "ts_tanhf" not in math_helpers("y = expf(x);")
    assert "ts_tanhf" in math_helpers("y = (0.5f * x * (1 + tanhf(0.79f * x)));")
