"""``expf`` in generated C is the vectorizable ``ts_expf`` (:data:`tscomp.codegen.c_expr.EXP_HELPER`):
the registry's Exp / Softplus templates call ``expf`` (Sigmoid its own ``ts_sigmoidf`` on the same core), and libm's is a scalar call that
kept every loop around it scalar (a MobileViT 1x1 Conv + SiLU ran 3.4x slower). Accurate to fp32
tolerance against numpy over the whole finite range, special values as libm's, no libm ``expf``
left in a kernel that calls it, and a Sigmoid / SiLU / Exp model still matches onnxruntime."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tscomp.codegen.c_expr import math_helpers
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact
from tests.codegen.math_kernels import elementwise_library, imported_symbols


def test_exp_matches_numpy_to_fp32_relative_tolerance_over_the_finite_range():
    _, run = elementwise_library("expf", "ts_expf")
    x = np.concatenate([np.linspace(-86.9, 88.72, 1_000_001, dtype=np.float32),
                        np.float32([0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 88.72283])])
    got = run(x)
    want = np.exp(x.astype(np.float64))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_exp_special_values_and_range_ends():
    _, run = elementwise_library("expf", "ts_expf")
    got = run(np.float32([np.inf, -np.inf, np.nan, 88.7229, 100.0, -87.5, -100.0, -1e30]))
    assert got[0] == np.inf and got[1] == 0 and np.isnan(got[2])
    assert got[3] == np.inf and got[4] == np.inf              # past ln(FLT_MAX): overflow, as expf
    assert np.all(got[5:] >= 0) and np.all(got[5:] < 1.2e-38)  # expf's subnormal results (or 0)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
@pytest.mark.parametrize("call,helper", [("expf", "ts_expf"), ("tanhf", "ts_tanhf")])
def test_a_kernel_calling_expf_or_tanhf_imports_neither_from_libm(call, helper):
    path, _ = elementwise_library(call, helper)
    symbols = imported_symbols(path)
    assert call not in symbols, symbols


def test_sigmoid_matches_float64_to_3e_7_relative_and_saturates_at_the_range_ends():
    # the logistic's own helper (the registry's Sigmoid for float): an argument clamped to [-87, 87]
    # instead of expf's special-case selects
    _, run = elementwise_library("ts_sigmoidf", "ts_sigmoidf")
    x = np.concatenate([np.linspace(-87, 87, 1_000_001, dtype=np.float32),
                        np.float32([0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 16.6, -16.6])])
    want = 1 / (1 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(run(x), want, rtol=3e-7, atol=0)
    got = run(np.float32([np.inf, -np.inf, np.nan, 100.0, -100.0, 88.0, -88.0]))
    assert got[0] == 1 and got[3] == 1 and got[5] == 1
    assert np.all((got[[1, 4, 6]] >= 0) & (got[[1, 4, 6]] < 2e-38))   # the exact values are below 1e-38
    assert np.isnan(got[2])


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_a_kernel_calling_the_sigmoid_imports_no_libm_exp():
    path, _ = elementwise_library("ts_sigmoidf", "ts_sigmoidf")
    assert "expf" not in imported_symbols(path)


def test_the_exp_helper_only_where_exp_is_called():
    assert "ts_expf" not in math_helpers("y = tanhf(x);")
    assert "#define expf(x) ts_expf(x)" in math_helpers("y = (1 / (1 + expf(-x)));")
    assert "#define expf" not in math_helpers("y = ts_expf(x - top);")   # Softmax calls the helper itself
    sigmoid = math_helpers("y = ts_sigmoidf(x);")      # the logistic's helper needs the exp core, not expf
    assert "ts_expf_core" in sigmoid and "#define expf" not in sigmoid
    assert sigmoid.index("ts_expf_core(float") < sigmoid.index("ts_sigmoidf(float")


def _activation_model(path):
    """x -> Sigmoid, x * Sigmoid(x) (SiLU), Exp(x / 8), Softplus: elementwise groups that call expf."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 37])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("sig", "silu", "ex", "sp")]
    eight = helper.make_tensor("eight", TensorProto.FLOAT, [], [8.0])
    nodes = [helper.make_node("Sigmoid", ["x"], ["sig"]), helper.make_node("Sigmoid", ["x"], ["s2"]),
             helper.make_node("Mul", ["x", "s2"], ["silu"]), helper.make_node("Div", ["x", "eight"], ["x8"]),
             helper.make_node("Exp", ["x8"], ["ex"]), helper.make_node("Softplus", ["x"], ["sp"])]
    model = helper.make_model(helper.make_graph(nodes, "act", [x], outs, [eight]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


def test_sigmoid_silu_exp_softplus_groups_match_onnxruntime(tmp_path):
    path = str(tmp_path / "act.onnx")
    _activation_model(path)
    write_artifact(compile_model(path, ["n=1:64"]), tmp_path / "act.tsc")
    rt = Runtime(tmp_path / "act.tsc")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for n in (1, 7, 64):
        x = (rng.standard_normal((n, 37)) * 30).astype(np.float32)
        x[0, :4] = [0.0, -90.0, 90.0, 700.0 / 8]
        got = rt.run({"x": x})
        for name, want in zip(("sig", "silu", "ex", "sp"), sess.run(None, {"x": x})):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at n = {n}")
        # and against float64 (onnxruntime's own Sigmoid is an approximation: SiLU differs from it by 1e-6)
        d = x.astype(np.float64)
        exact = {"sig": 1 / (1 + np.exp(-d)), "silu": d / (1 + np.exp(-d)), "ex": np.exp(d / 8),
                 "sp": np.logaddexp(0, d)}
        for name, want in exact.items():
            np.testing.assert_allclose(got[name], want, rtol=2e-6, atol=1e-30, err_msg=f"{name} at n = {n}")
