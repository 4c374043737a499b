"""Quantized operators as float arithmetic (tscomp/graph/quantized_arithmetic.py): what
onnxruntime's ``quantize_dynamic`` writes (DynamicQuantizeLinear -> MatMulInteger / ConvInteger ->
Cast -> Mul -> Add) compiles with no numpy group, the quantized activations are bit-identical to
onnxruntime's, and the float results match it; an integer result used as an integer stays exact."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tests.integer_gemm_reference import plain_session
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime


def _save(tmp_path, nodes, inputs, outputs, inits, name="quantized.onnx"):
    graph = helper.make_graph(nodes, "quantized", inputs, outputs, inits)
    path = tmp_path / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), path)
    return path


_plain = plain_session


def _dynamic_linear(tmp_path, k=300, n=24, per_column=False, symmetric=False):
    """x -> DynamicQuantizeLinear -> MatMulInteger(int8 weight) -> Cast -> Mul(scales) -> Add(bias),
    the quantized tensor, its scale and zero point also graph outputs (the weight's zero point 0 if
    ``symmetric``)."""
    rng = np.random.default_rng(0)
    w_zp = rng.integers(-3, 4, n if per_column else ()).astype(np.int8) * (not symmetric)
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), "wq"),
             numpy_helper.from_array(w_zp, "w_zp"),
             numpy_helper.from_array(np.array(0.01, np.float32), "w_scale"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"]),
             helper.make_node("MatMulInteger", ["xq", "wq", "x_zp", "w_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=TP.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             helper.make_node("Mul", ["acc_f", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, None),
               helper.make_tensor_value_info("xq", TP.UINT8, None),
               helper.make_tensor_value_info("x_scale", TP.FLOAT, None),
               helper.make_tensor_value_info("x_zp", TP.UINT8, None)]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", k])], outputs, inits)


@pytest.mark.parametrize("per_column", [False, True], ids=["per-tensor", "per-column"])
def test_a_dynamically_quantized_linear_layer_is_native_and_quantizes_bit_identically(tmp_path, per_column):
    path = _dynamic_linear(tmp_path, per_column=per_column)
    model = compile_model(str(path), ["B=1:3", "L=1:61"], max_variants=1)
    assert model.fallback_groups() == []
    ops = {n.op_type for n in model.plan.graph.nodes}
    assert not ops & {"DynamicQuantizeLinear", "MatMulInteger"}, ops
    rt, sess = Runtime.from_compiled(model), _plain(path)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(1)
    for b, l, kind in [(1, 1, "normal"), (2, 13, "normal"), (3, 61, "normal"), (1, 7, "positive"),
                       (1, 5, "negative"), (2, 3, "zeros"), (1, 37, "ties")]:
        x = (rng.standard_normal((b, l, 300)) * 3).astype(np.float32)
        x = {"normal": x, "positive": np.abs(x), "negative": -np.abs(x), "zeros": 0 * x,
             "ties": np.round(x * 8) / 8}[kind]
        want, got = dict(zip(names, sess.run(None, {"x": x}))), rt.run({"x": x})
        for name in ("xq", "x_scale", "x_zp"):
            assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), (name, b, l, kind)
        np.testing.assert_allclose(got["y"], want["y"], rtol=1e-4, atol=1e-4, err_msg=f"{b}x{l} {kind}")


def test_a_dynamically_quantized_conv_is_native_and_matches_onnxruntime(tmp_path):
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (8, 2, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(-2, np.int8), "w_zp"),     # onnxruntime refuses a per-channel one
             numpy_helper.from_array(np.array(0.02, np.float32), "w_scale")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"]),
             helper.make_node("ConvInteger", ["xq", "wq", "x_zp", "w_zp"], ["acc"], pads=[1, 1, 1, 1], group=2),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=TP.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             helper.make_node("Mul", ["acc_f", "scale"], ["y"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, "H", "W"])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = compile_model(str(path), ["N=1:2", "H=1:33", "W=1:33"], max_variants=1)
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for n, h, w in [(1, 1, 1), (2, 7, 13), (1, 33, 33), (2, 31, 2)]:
        x = rng.standard_normal((n, 4, h, w)).astype(np.float32)          # the padded taps add nothing
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_an_integer_product_used_as_an_integer_stays_exact_on_its_reference(tmp_path):
    """The float form is only taken for a result cast to float: an int32 graph output keeps the
    exact reference (a float32 accumulation of 300 products of up to 255 * 128 could round)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (300, 16)).astype(np.int8), "wq")]
    nodes = [helper.make_node("MatMulInteger", ["xq", "wq"], ["acc"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("xq", TP.UINT8, ["L", 300])],
                 [helper.make_tensor_value_info("acc", TP.INT32, None)], inits)
    model = compile_model(str(path), ["L=1:9"], max_variants=1)
    assert "MatMulInteger" in {n.op_type for n in model.plan.graph.nodes}
    rt, sess = Runtime.from_compiled(model), _plain(path)
    xq = np.full((9, 300), 255, np.uint8)                                 # the largest sums
    got, want = rt.run({"xq": xq})["acc"], sess.run(None, {"xq": xq})[0]
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_per_tensor_activation_qdq_pairs_fuse_into_native_kernels(tmp_path):
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(7, np.int8), "zp"),
             numpy_helper.from_array(rng.standard_normal((20, 12)).astype(np.float32), "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"]),
             helper.make_node("MatMul", ["d", "w"], ["y"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["L", 20])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = compile_model(str(path), ["L=1:50"], max_variants=1)
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for l in (1, 2, 29, 50):
        x = (rng.standard_normal((l, 20)) * 8).astype(np.float32)        # some saturate at -128 / 127
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_dynamically_quantized_bert_compiles_natively_and_matches_onnxruntime(tmp_path, exported_model):
    """onnxruntime's ``quantize_dynamic`` of tiny BERT. A quantized model amplifies fp32 rounding: where
    an activation lands within an ulp of a rounding tie, one quantized element may differ by 1 between
    two correct implementations (onnxruntime's own optimized session differs from its plain one so),
    shifting a few outputs by ~1e-3. So: the relative L2 error below 1e-4, and at most 1% of the
    elements outside rtol = atol = 1e-4 (a wrong scale, zero point or weight fails both by far)."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    path = tmp_path / "bert-tiny-dq.onnx"
    quantization.quantize_dynamic(str(exported_model("bert")), str(path), weight_type=quantization.QuantType.QInt8)
    model = compile_model(str(path), ["batch=1:2", "sequence=1:64"], max_variants=1)
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), _plain(path)
    rng = np.random.default_rng(5)
    for b, l in [(1, 1), (2, 2), (1, 17), (2, 31), (1, 64)]:
        feed = {"input_ids": rng.integers(0, 1000, (b, l)).astype(np.int64),
                "attention_mask": np.ones((b, l), np.int64), "token_type_ids": np.zeros((b, l), np.int64)}
        want, got = sess.run(None, feed)[0], rt.run(feed)["last_hidden_state"]
        assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want), (b, l)
        assert np.mean(np.abs(got - want) > 1e-4 + 1e-4 * np.abs(want)) <= 0.01, (b, l)


def test_a_run_time_zero_point_is_applied_after_a_centred_matmul_so_the_gemm_can_run_on_int8(tmp_path):
    """DynamicQuantizeLinear's zero point is known only at run time: MatMulInteger becomes
    ``(Cast(A) - 128) . W + (128 - zp) * colsum(W)``, whose A spans [-128, 127] whatever the zero
    point -- an int8 GEMM where the CPU has avx512_vnni -- and equals onnxruntime at every zero point
    (all-positive inputs: 0; all-negative: 255)."""
    path = _dynamic_linear(tmp_path, symmetric=True)
    model = compile_model(str(path), ["B=1:3", "L=1:61"], max_variants=1)
    assert model.fallback_groups() == []
    graph = model.plan.graph
    matmul = [nd for nd in graph.nodes if nd.op_type == "MatMul"]
    assert len(matmul) == 1 and graph.values[matmul[0].inputs[0]].integer_range == (-128, 127)
    assert [ks[0].precision for ks in model.kernels.values() if ks[0].family == "gemm"] == [_gemm_precision_for(True)]
    rt, sess = Runtime.from_compiled(model), _plain(path)
    rng = np.random.default_rng(9)
    for x in (rng.uniform(0.1, 3, (1, 7, 300)), -rng.uniform(0.1, 3, (2, 1, 300)), rng.standard_normal((3, 61, 300)),
              np.zeros((1, 2, 300))):
        x = x.astype(np.float32)
        got, want_out = rt.run({"x": x}), dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
        assert np.array_equal(got["x_zp"], want_out["x_zp"])
        np.testing.assert_allclose(got["y"], want_out["y"], rtol=1e-4, atol=1e-4)


def test_an_artifact_with_int8_gemms_is_refused_by_name_on_a_cpu_without_vnni(tmp_path, monkeypatch):
    """Compiled where the CPU has avx512_vnni, loaded where it has not: a clear error naming the
    kernels' precision and the instructions, before any kernel runs (not an illegal instruction)."""
    import dataclasses
    import tscomp.schedule.target as target_mod
    from tscomp.runtime.artifact import ArtifactError, write_artifact
    if _gemm_precision_for(True) != "int8":
        pytest.skip("nothing compiles to int8 here (no avx512_vnni, or AMX bf16 tiles, which come first)")
    model = compile_model(str(_dynamic_linear(tmp_path, symmetric=True)), ["B=1:3", "L=1:61"], max_variants=1)
    path = write_artifact(model, tmp_path / "m.tsc")
    Runtime(path)                                          # loads here
    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, vnni=False))
    with pytest.raises(ArtifactError, match=r"integer operands in int8.*avx512_vnni"):
        Runtime(path)


def test_an_artifact_with_amx_int8_gemms_is_refused_by_name_on_a_cpu_whose_tiles_lack_int8(tmp_path, monkeypatch):
    """Compiled where the AMX tiles do int8 (TDPBUSD), loaded where they do not (or the OS does not
    grant them): refused by kernel name and what is missing, not an illegal instruction."""
    import dataclasses
    import json
    import tscomp.schedule.target as target_mod
    from tscomp.runtime.artifact import ArtifactError, write_artifact
    if not target_mod.host_cpu().spec.amx_int8:
        pytest.skip("this CPU has no AMX int8 tiles: its int8 GEMMs run on VPDPBUSD")
    model = compile_model(str(_dynamic_linear(tmp_path, symmetric=True)), ["B=1:3", "L=1:61"], max_variants=1)
    path = write_artifact(model, tmp_path / "m.tsc")
    gemms = [v for g in json.loads((path / "manifest.json").read_text())["groups"] for v in g["variants"]
             if v["family"] == "gemm"]
    assert gemms and all(v["isa"] == "amx" and v["precision"] == "int8" for v in gemms)
    Runtime(path)                                          # loads here
    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, amx_int8=False))
    with pytest.raises(ArtifactError, match=r"kernel\(s\) \(e.g. tscomp_\w+_amx_\w+_int8\) run on AMX int8 tiles"):
        Runtime(path)


def test_integer_operand_gemms_take_bf16_where_the_cpu_has_it_and_float_ones_stay_fp32(tmp_path):
    """bf16 holds every integer up to 256 exactly, so a quantized GEMM's bf16 inner products are its
    fp32 ones (tscomp.codegen.families.gemm_target); a float GEMM of the same model stays fp32."""
    from tscomp.schedule.target import host_cpu
    rng = np.random.default_rng(6)
    path = _dynamic_linear(tmp_path)
    model = onnx.load(path)
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((24, 8)).astype(np.float32), "wf"))
    model.graph.node.append(helper.make_node("MatMul", ["y", "wf"], ["z"]))
    model.graph.output.append(helper.make_tensor_value_info("z", TP.FLOAT, None))
    onnx.save(model, path)
    compiled = compile_model(str(path), ["B=1:3", "L=1:61"], max_variants=1)
    precisions = sorted(ks[0].precision for ks in compiled.kernels.values() if ks[0].family == "gemm")
    assert precisions == sorted(["bf16" if host_cpu().spec.bf16 else "fp32", "fp32"]), precisions
    rt, sess = Runtime.from_compiled(compiled), _plain(path)
    x = (rng.standard_normal((2, 29, 300)) * 3).astype(np.float32)
    for name, want in zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})):
        np.testing.assert_allclose(rt.run({"x": x})[name], want, rtol=1e-4, atol=1e-4, err_msg=name)


def _gemm_precision_for(weight_fits_a_signed_byte: bool) -> str:
    """The precision tscomp.codegen.families.gemm_target gives a GEMM of integer operands here."""
    from tscomp.schedule.target import host_cpu
    spec = host_cpu().spec
    if weight_fits_a_signed_byte and spec.isa == "avx512" and spec.vnni and (spec.amx_int8 or not spec.amx):
        return "int8"      # VPDPBUSD, or TDPBUSD where the AMX tiles have int8 (bf16 tiles alone come first)
    return "bf16" if spec.bf16 else "fp32"


@pytest.mark.parametrize("symmetric", [False, True], ids=["weight-zero-points", "symmetric-weight"])
def test_a_qdq_matmul_multiplies_the_integer_parts_and_scales_the_sums(tmp_path, symmetric):
    """QDQ format: a per-tensor dequantized activation times a per-column dequantized int8 weight is
    the MatMul of their integer parts times both scales. The activation's integers span 256 values
    (a constant zero point): with a symmetric weight the GEMM runs on int8 instructions (VPDPBUSD)
    where the CPU has avx512_vnni, with the weight's zero points (its integer part past a signed
    byte) on bf16 where the CPU has it; onnxruntime's results either way."""
    rng = np.random.default_rng(7)
    k, n = 40, 24
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (k, n)).astype(np.int8), "wq"),
             numpy_helper.from_array(rng.uniform(0.001, 0.01, n).astype(np.float32), "w_scale"),
             numpy_helper.from_array(rng.integers(-3, 4, n).astype(np.int8) * (not symmetric), "w_zp"),
             numpy_helper.from_array(np.array(0.03, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(131, np.uint8), "x_zp")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["w"], axis=1),
             helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w"], ["y"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", k])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = compile_model(str(path), ["B=1:2", "L=1:40"], max_variants=1)
    assert model.fallback_groups() == []
    weights = [model.plan.graph.values[nd.inputs[1]].const for nd in model.plan.graph.nodes if nd.op_type == "MatMul"]
    assert len(weights) == 1 and np.array_equal(weights[0], np.trunc(weights[0]))       # the integer part
    gemm = [ks[0] for ks in model.kernels.values() if ks[0].family == "gemm"]
    assert [g.precision for g in gemm] == [_gemm_precision_for(symmetric)]
    if gemm[0].precision == "int8":
        assert gemm[0].x_offset == -131          # the bytes packed are the quantized activation itself
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for b, l in [(1, 1), (2, 13), (1, 40)]:
        x = rng.uniform(-4, 4, (b, l, k)).astype(np.float32)                # some saturate
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("foldable", [True, False], ids=["folded", "too-large-to-fold"])
def test_a_dequantized_embedding_table_is_gathered_as_integers_then_scaled(tmp_path, monkeypatch, foldable):
    """QDQ embedding: Gather(DQ(table), ids) runs as DQ(Gather(table, ids)), so no kernel dequantizes
    the whole table per call (BERT-base's word table is over the fold limit) and it stays int8."""
    from tscomp.graph import shape_propagation
    if not foldable:
        monkeypatch.setattr(shape_propagation, "MAX_FOLD_ELEMENTS", 100)     # stands in for a 23M-element table
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array(rng.integers(0, 256, (50, 16)).astype(np.uint8), "table_q"),
             numpy_helper.from_array(np.array(0.02, np.float32), "scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    nodes = [helper.make_node("DequantizeLinear", ["table_q", "scale", "zp"], ["table"]),
             helper.make_node("Gather", ["table", "ids"], ["rows"]),
             helper.make_node("Relu", ["rows"], ["y"])]
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("ids", TP.INT64, ["B", "L"])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = compile_model(str(path), ["B=1:2", "L=1:30"], max_variants=1)
    graph = model.plan.graph
    assert model.fallback_groups() == []
    assert not [n.name for n in graph.nodes if graph.values[n.outputs[0]].shape == (50, 16)]
    table = [graph.values[n.inputs[0]].const for n in graph.nodes if n.op_type == "Gather"]
    assert len(table) == 1 and np.array_equal(table[0], np.trunc(table[0]))        # the integer part
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for b, l in [(1, 1), (2, 17), (1, 30)]:
        ids = rng.integers(0, 50, (b, l)).astype(np.int64)
        np.testing.assert_allclose(rt.run({"ids": ids})["y"], sess.run(None, {"ids": ids})[0], rtol=1e-4, atol=1e-4)


def test_requantizing_a_view_with_the_same_scale_moves_the_integers_without_rounding(tmp_path):
    """Q(Transpose(DQ(q))) with DQ's scale and zero point is Transpose(q) bit for bit: no Div or Round
    is generated for it, the requantized tensor equals onnxruntime's, and a different scale still
    quantizes."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(np.array(0.037, np.float32), "s"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s2"),
             numpy_helper.from_array(np.array(121, np.uint8), "zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d"]),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 1]),
             helper.make_node("QuantizeLinear", ["t", "s", "zp"], ["q2"]),            # same scale: a view of q
             helper.make_node("QuantizeLinear", ["t", "s2", "zp"], ["q3"])]           # another scale: rounds
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", 12])],
                 [helper.make_tensor_value_info(n, TP.UINT8, None) for n in ("q2", "q3")], inits)
    model = compile_model(str(path), ["B=1:2", "L=1:40"], max_variants=1)
    assert sum(n.op_type == "Round" for n in model.plan.graph.nodes) == 2        # x's and q3's, not q2's
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for b, l in [(1, 1), (2, 23), (1, 40)]:
        x = (rng.standard_normal((b, l, 12)) * 5).astype(np.float32)
        want, got = sess.run(None, {"x": x}), rt.run({"x": x})
        assert np.array_equal(got["q2"], want[0]) and np.array_equal(got["q3"], want[1]), (b, l)


def _qdq_conv_model(tmp_path, rng, per_channel: bool, bias: bool, oc=20, c=6, k=3, stride=1, pads=1, group=1,
                    weight_zero_points=False):
    """x -> Q/DQ (uint8, zero point 131) -> Conv with a dequantized int8 weight (per output channel
    or per tensor, symmetric or with zero points) and a float bias -> y."""
    w = rng.integers(-127, 128, (oc, c // group, k, k)).astype(np.int8)
    scale = rng.uniform(0.001, 0.01, oc if per_channel else ()).astype(np.float32)
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(scale, "w_scale"),
             numpy_helper.from_array(rng.integers(-3, 4, oc if per_channel else ()).astype(np.int8) * weight_zero_points,
                                     "w_zp"),
             numpy_helper.from_array(np.array(0.03, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(131, np.uint8), "x_zp"),
             numpy_helper.from_array(rng.uniform(-1, 1, oc).astype(np.float32), "b")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zp"], ["w"], axis=0),
             helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("Conv", ["xd", "w"] + (["b"] if bias else []), ["y"], pads=[pads] * 4,
                              strides=[stride] * 2, group=group)]
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["N", c, "H", "W"])],
                 [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)


@pytest.mark.parametrize("per_channel,bias,stride,group", [(True, True, 1, 1), (False, False, 2, 1), (True, True, 1, 2)],
                         ids=["per-channel-biased", "per-tensor-strided", "per-channel-grouped"])
def test_a_qdq_conv_convolves_the_integer_parts_and_scales_the_sums(tmp_path, per_channel, bias, stride, group):
    """QDQ / QOperator format: a Conv of a per-tensor dequantized activation and a per-output-channel
    (or per-tensor) dequantized int8 weight is the Conv of their integer parts (the image's zero
    padding is the activation's zero point: integer 0), times both scales, plus the bias;
    onnxruntime's results."""
    rng = np.random.default_rng(11)
    path = _qdq_conv_model(tmp_path, rng, per_channel, bias, stride=stride, group=group)
    model = compile_model(str(path), ["N=1:2", "H=5:23", "W=5:23"], max_variants=1)
    assert model.fallback_groups() == []
    graph = model.plan.graph
    convs = [nd for nd in graph.nodes if nd.op_type == "Conv"]
    assert len(convs) == 1
    weight, x = graph.values[convs[0].inputs[1]].const, graph.values[convs[0].inputs[0]]
    assert weight is not None and np.array_equal(weight, np.trunc(weight)) and np.abs(weight).max() <= 127
    assert x.integer_range == (-131, 124)          # the quantized activation minus its zero point
    tiles = [k for ks in model.kernels.values() for k in ks if k.family == "conv" and k.cfg.vector_axis == 1]
    assert tiles and {k.precision for k in tiles} == {_conv_precision()}
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for n, h, w in [(1, 5, 5), (2, 13, 23), (1, 23, 7)]:
        x = rng.uniform(-4, 4, (n, 6, h, w)).astype(np.float32)               # some saturate
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _conv_precision() -> str:
    """The precision tscomp.codegen.families.conv_target gives an implicit-GEMM Conv of integer
    operands here."""
    from tscomp.schedule.target import host_cpu
    spec = host_cpu().spec
    return "int8" if spec.isa == "avx512" and spec.vnni else "fp32"


def test_an_artifact_with_int8_convs_is_refused_by_name_on_a_cpu_without_vnni(tmp_path, monkeypatch):
    import dataclasses
    import tscomp.schedule.target as target_mod
    from tscomp.runtime.artifact import ArtifactError, write_artifact
    if _conv_precision() != "int8":
        pytest.skip("nothing compiles to int8 here (no AVX-512 with avx512_vnni)")
    path = _qdq_conv_model(tmp_path, np.random.default_rng(2), True, True)
    model = compile_model(str(path), ["N=1:2", "H=5:23", "W=5:23"], max_variants=1)
    art = write_artifact(model, tmp_path / "m.tsc")
    Runtime(art)
    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, vnni=False))
    with pytest.raises(ArtifactError, match=r"kernel\(s\) \(e.g. tscomp_\w+_conv_\w+_int8\).*int8.*avx512_vnni"):
        Runtime(art)


def test_an_int8_conv_artifact_stores_the_raw_int8_weight_and_packs_it_at_load(tmp_path):
    """The int8 Conv's packed quads are bytes in 32-bit words; the artifact stores the raw weight
    (one byte an element) and packs it at load, as for every other kernel -- not the packed copy."""
    import json
    from tscomp.runtime.artifact import write_artifact
    path = _qdq_conv_model(tmp_path, np.random.default_rng(4), True, True, oc=64, c=32)
    model = compile_model(str(path), ["N=1:2", "H=5:23", "W=5:23"], max_variants=2)
    art = write_artifact(model, tmp_path / "m.tsc")
    entries = json.loads((art / "plan.json").read_text())["packed_weights"]
    assert entries and all("raw" in e for e in entries), entries
    assert json.loads((art / "manifest.json").read_text())["weights_bytes"] < 64 * 32 * 9 * 2   # int8, not panels
    rt, sess = Runtime(art), _plain(path)
    x = np.random.default_rng(5).uniform(-4, 4, (2, 32, 11, 17)).astype(np.float32)
    np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_a_qdq_conv_with_weight_zero_points_convolves_integers_in_fp32(tmp_path):
    """A weight with zero points: its integer part (W - zp) can pass a signed byte, so the Conv of
    the integer parts runs on fp32 (exact while the sums stay below 2^24), not int8; onnxruntime's
    results."""
    rng = np.random.default_rng(12)
    path = _qdq_conv_model(tmp_path, rng, True, True, weight_zero_points=True)
    model = compile_model(str(path), ["N=1:2", "H=5:23", "W=5:23"], max_variants=1)
    assert model.fallback_groups() == []
    weight = [model.plan.graph.values[nd.inputs[1]].const for nd in model.plan.graph.nodes if nd.op_type == "Conv"][0]
    assert np.array_equal(weight, np.trunc(weight)) and np.abs(weight).max() > 127      # shifted past a byte
    assert {k.precision for ks in model.kernels.values() for k in ks if k.family == "conv"} == {"fp32"}
    rt, sess = Runtime.from_compiled(model), _plain(path)
    for n, h, w in [(1, 5, 5), (2, 13, 23)]:
        x = rng.uniform(-4, 4, (n, 6, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
