"""The vectorizable ``tanhf`` of the generated C (:data:`tscomp.codegen.c_expr.TANH_HELPER`, issue 13:
GPT-2/ALBERT's tanh-form GELU called scalar libm ``tanhf`` per element): accurate to fp32 tolerance
against numpy over a range with large |x|, infinities, NaN and signed zero, and no call to libm's
tanhf is left in a kernel that uses it (``test_c_expr_exp``)."""
from __future__ import annotations

import numpy as np

from tscomp.codegen.c_expr import math_helpers
from tests.codegen.math_kernels import elementwise_library


def test_tanh_matches_numpy_to_fp32_tolerance_including_large_arguments():
    _, run = elementwise_library("tanhf", "ts_tanhf")
    x = np.concatenate([np.linspace(-30, 30, 600_001, dtype=np.float32),
                        np.float32([1e-30, -1e-30, 3e-4, -3e-4, 5e-4, 7.9, -7.9, 8.0, 1e4, -1e4, 3e38, -3e38])])
    got = run(x)
    want = np.tanh(x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.all(np.abs(got) <= 1)
    big = np.abs(x) > 9
    assert np.all(got[big] == np.sign(x[big]))


def test_tanh_special_values():
    _, run = elementwise_library("tanhf", "ts_tanhf")
    got = run(np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0]))
    assert got[0] == 1 and got[1] == -1 and np.isnan(got[2])
    assert got[3] == 0 and not np.signbit(got[3]) and got[4] == 0 and np.signbit(got[4])


def test_helpers_only_where_tanhf_is_called():
    assert "ts_tanhf" not in math_helpers("y = expf(x);")
    assert "ts_tanhf" in math_helpers("y = (0.5f * x * (1 + tanhf(0.79f * x)));")
