"""Division by a constant as a product with two FMA corrections (:data:`tscomp.codegen.c_expr.QUOTIENT_HELPER`):
a QDQ model's QuantizeLinear divides every activation by its scale, and the vector division ran at
a tenth of the FMA rate. The helper must give the division's own result (a quantized value one step
apart changes every later layer): checked bit for bit against numpy's float32 division over every
float whose quotient rounds near a half (the ties QuantizeLinear's Round sees) and a spread of
magnitudes, for scales from quantized models and awkward ones."""
from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.math_kernels import elementwise_library
from tscomp.graph.ops.elementwise import _c_div, _c_float
from tscomp.graph.ops.registry import CTypes

F32 = np.dtype(np.float32)


def _divider(scale: np.float32):
    """``run(x)``: the generated C of ``x / scale`` (the registry's Div template), per element."""
    expr = _c_div(["x[i]", _c_float(float(scale), F32)], {}, CTypes(F32, (F32, F32)))
    assert expr.startswith("ts_quotient("), expr
    return elementwise_library(f"divide_{float(scale)!r}".replace(".", "_").replace("-", "m"), "ts_quotient", expr)[1]


def _near_ties(scale: np.float32, rng) -> np.ndarray:
    """Floats x whose x / scale lies within a few ulp of k + 1/2 for k in [-300, 300], and their
    neighbours: where a quotient one ulp off rounds to the other integer."""
    k = np.arange(-300, 301, dtype=np.float64) + 0.5
    centre = (k * np.float64(scale)).astype(np.float32)
    near = centre[:, None].view(np.int32) + np.arange(-8, 9)      # 8 floats either side
    spread = rng.uniform(-1e4, 1e4, 200_000).astype(np.float32) * scale
    return np.concatenate([near.reshape(-1).view(np.float32), spread])


@pytest.mark.parametrize("scale", [0.039286155, 0.087133095, 1 / 3, 0.0035888287, 14.066298, 6.2786590e-08, 1.0, 255.0])
def test_division_by_a_constant_equals_the_float32_division_bit_for_bit(scale):
    scale = np.float32(scale)
    run = _divider(scale)
    rng = np.random.default_rng(0)
    x = _near_ties(scale, rng)
    magnitudes = (rng.uniform(0.5, 1, 100_000) * 2.0 ** rng.integers(-90, 100, 100_000)).astype(np.float32)
    x = np.concatenate([x, magnitudes, -magnitudes])
    want = x / scale
    got = run(x)
    assert np.array_equal(got.view(np.int32), want.view(np.int32)), x[got != want][:5]
    if np.float32(1) / scale * scale != 1:     # the test set tells a plain product from the division
        assert np.any(x * (np.float32(1) / scale) != want)


def test_division_special_values_as_the_division():
    scale = np.float32(0.05)
    x = np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, -1e-40])
    with np.errstate(over="ignore"):     # 3.4e38 / 0.05 overflows, as it must
        got, want = _divider(scale)(x), x / scale
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite][:5], want[finite][:5]) and np.signbit(got[4])
    assert np.allclose(got[finite][5:], want[finite][5:], rtol=1e-6, atol=0)   # overflow and subnormal ends


def test_a_divisor_that_is_not_a_literal_or_is_extreme_stays_a_division():
    types = CTypes(F32, (F32, F32))
    assert _c_div(["a", "b"], {}, types) == "(a / b)"
    assert _c_div(["a", "1e-35f"], {}, types) == "(a / 1e-35f)"
    assert _c_div(["a", "2.0"], {}, CTypes(np.dtype(np.float64), (np.dtype(np.float64),) * 2)) == "(a / 2.0)"
