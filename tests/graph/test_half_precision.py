"""float16 models (tscomp/graph/half_precision.py): computed in float32 between float16 inputs and
outputs, every group native, results within float16 rounding of onnxruntime's."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.compiler import compile_model
from tscomp.runtime import Runtime


def _save(tmp_path, nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "half", inputs, outputs, inits)
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), path)
    return path


def _ulps(got, want):
    """|got - want| in float16 units in the last place of ``want``."""
    spacing = np.spacing(np.abs(want).astype(np.float16)).astype(np.float32)
    return np.abs(got.astype(np.float32) - want.astype(np.float32)) / spacing


def test_a_float16_mlp_is_native_computes_in_float32_and_rounds_once(tmp_path):
    """x -> MatMul -> Add -> Gelu -> MatMul -> Softmax, all float16: no numpy group, a float16 output,
    equal to the float32 evaluation of the same float16 numbers rounded once at the end (up to one
    float16 step where the two fp32 summation orders straddle a rounding tie) and within one step
    of onnxruntime's."""
    rng = np.random.default_rng(0)
    w1, b1, w2 = (rng.standard_normal(s).astype(np.float16) * np.float16(0.3) for s in ((32, 48), (48,), (48, 16)))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["a"]),
             helper.make_node("Gelu", ["a"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["h"]),
             helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT16, ["L", 32])],
                 [helper.make_tensor_value_info("y", TP.FLOAT16, None)],
                 [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))])
    model = compile_model(str(path), ["L=1:40"], max_variants=1)
    assert model.fallback_groups() == []
    assert all(model.plan.graph.values[n.outputs[0]].dtype != np.float16 or n.op_type == "Cast"
               for n in model.plan.graph.nodes), "an operator computed in float16"
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in (1, 7, 40):
        x = rng.standard_normal((length, 32)).astype(np.float16)
        got = rt.run({"x": x})["y"]
        assert got.dtype == np.float16 and got.shape == (length, 16)
        a = x.astype(np.float32) @ w1.astype(np.float32) + b1.astype(np.float32)
        g = 0.5 * a * (1 + np.vectorize(math.erf)(a / np.sqrt(2)).astype(np.float32))
        h = g @ w2.astype(np.float32)
        e = np.exp(h - h.max(-1, keepdims=True))
        want = (e / e.sum(-1, keepdims=True)).astype(np.float16)
        assert _ulps(got, want).max() <= 1, length
        assert _ulps(got, sess.run(None, {"x": x})[0]).max() <= 2, length


def test_an_explicit_cast_to_float16_still_rounds(tmp_path):
    """float32 x -> Cast(float16) -> Mul(float16 c) -> Cast(float32): the model's own Cast rounds x to
    float16; the Mul in between computes in float32 (not rounded): y == float32(fp16(x)) * c."""
    c = np.float16(1.7)
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TP.FLOAT16), helper.make_node("Mul", ["h", "c"], ["m"]),
             helper.make_node("Cast", ["m"], ["y"], to=TP.FLOAT)]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["L"])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], [numpy_helper.from_array(np.array(c), "c")])
    model = compile_model(str(path), ["L=1:100"], max_variants=1)
    assert model.fallback_groups() == []
    x = np.random.default_rng(1).standard_normal(100).astype(np.float32)
    got = Runtime.from_compiled(model).run({"x": x})["y"]
    want = x.astype(np.float16).astype(np.float32) * np.float32(c)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, x * np.float32(c))       # the rounding is what the test sees


def test_a_float16_bert_compiles_natively_and_matches_onnxruntime(exported_model):
    """tiny BERT exported after model.half() (dynamo): no numpy group, float16 output, relative L2
    within float16 rounding of onnxruntime (its unit roundoff is 4.9e-4) and no element further
    apart than two float16 steps at the output's largest magnitude (onnxruntime rounds some
    intermediate results to float16, so small elements differ by more of their own steps)."""
    from models.families import make_inputs

    path = exported_model("bert", half=True)
    model = compile_model(str(path), ["batch=1:2", "sequence=1:64"], max_variants=1)
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for b, l in [(1, 1), (2, 13), (1, 64)]:
        feed = make_inputs("bert", {"batch": b, "sequence": l}, rng, "tiny")
        got, want = rt.run(feed)["last_hidden_state"], sess.run(None, feed)[0]
        assert got.dtype == np.float16
        g, w = got.astype(np.float32), want.astype(np.float32)
        assert np.linalg.norm(g - w) <= 1e-3 * np.linalg.norm(w), (b, l)
        step = float(np.spacing(np.float16(np.abs(w).max())))
        assert np.abs(g - w).max() <= 2 * step, (b, l)


def test_a_folded_float16_subgraph_is_computed_in_float32(tmp_path, monkeypatch):
    """x @ (W / ReduceL2(W)), W a float16 constant (wav2vec2's weight norm): constant folding ran the
    ReduceL2 in float16; the rewrite computes it again from float32 operands, as the run-time
    operators compute. The result matches the float32 evaluation; without the refold it does not."""
    from tscomp.graph import half_precision

    rng = np.random.default_rng(4)
    w = (rng.standard_normal((256, 16)) * 8).astype(np.float16)
    nodes = [helper.make_node("ReduceL2", ["w"], ["n"], keepdims=1), helper.make_node("Div", ["w", "n"], ["wn"]),
             helper.make_node("MatMul", ["x", "wn"], ["y"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT16, ["L", 256])],
                 [helper.make_tensor_value_info("y", TP.FLOAT16, None)], [numpy_helper.from_array(w, "w")])
    x = rng.standard_normal((5, 256)).astype(np.float16)
    w32 = w.astype(np.float32)
    exact = x.astype(np.float32) @ (w32 / np.sqrt((w32 * w32).sum()))

    def error() -> float:
        got = Runtime.from_compiled(compile_model(str(path), ["L=1:8"], max_variants=1)).run({"x": x})["y"]
        return float(np.linalg.norm(got.astype(np.float32) - exact) / np.linalg.norm(exact))

    assert error() <= 5e-4                  # float16's unit roundoff is 4.9e-4: the output's rounding
    monkeypatch.setattr(half_precision._Rewrite, "refold", lambda self, node: None)
    assert error() > 2e-3                   # the float16 fold, kept
