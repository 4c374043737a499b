"""Symbolic behaviour of the GEMM / conv / normalization / reduction / resampling ops.

ONNX's conformance cases (tests/graph/test_onnx_conformance.py) only have static
shapes; these tests check what they cannot: symbolic output shapes, unification
of dims the op forces equal, errors that name the node, and agreement of the
numpy reference with onnxruntime at awkward concrete shapes (1, 7, 13).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.errors import ShapeError, UnsupportedOperatorError
from tscomp.graph import DimSpec, import_model, propagate_shapes
from tscomp.graph.reference import run_reference

RTOL = ATOL = 1e-4
FLOAT = TensorProto.FLOAT


# ----------------------------------------------------------------------------- helpers
def make_model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    """inputs: [(name, shape)] float32 graph inputs; initializers: {name: array}."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, FLOAT, shape) for name, shape in inputs],
        [helper.make_empty_tensor_value_info(name) for name in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(initializers).items()])
    # IR version 10: what the installed onnxruntime accepts
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def propagated(model, *dims):
    graph = import_model(model, [DimSpec.parse(d) for d in dims])
    propagate_shapes(graph)
    return graph


def sym(graph, name):
    return graph.symbols.symbol(name)


def shape_of(graph, value):
    return tuple(graph.values[value].shape)


def assert_matches_onnxruntime(model, graph, feeds):
    """Run the reference executor (which also checks every tensor against its propagated
    shape) and onnxruntime on the same model and inputs."""
    ours = run_reference(graph, feeds)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, feeds)
    for name, want in zip(graph.outputs, theirs):
        assert ours[name].shape == want.shape, name
        np.testing.assert_allclose(ours[name], want, rtol=RTOL, atol=ATOL, err_msg=name)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------- MatMul / Gemm
def test_matmul_with_weight_keeps_symbolic_batch_and_sequence():
    w = rand(64, 32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", ["B", "L", 64])], ["y"], {"w": w})
    graph = propagated(model, "B=1:8", "L=1:128")
    assert shape_of(graph, "y") == (sym(graph, "B"), sym(graph, "L"), 32)
    for b, length in ((1, 1), (2, 7), (3, 13)):
        assert_matches_onnxruntime(model, graph, {"x": rand(b, length, 64)})


def test_batched_matmul_broadcasts_batch_dims_and_keeps_symbolic_rows_and_cols():
    model = make_model([helper.make_node("MatMul", ["q", "k"], ["s"])],
                       [("q", ["B", 4, "L", 16]), ("k", ["B", 4, 16, "L"])], ["s"])
    graph = propagated(model, "B=1:8", "L=1:128")
    b, length = sym(graph, "B"), sym(graph, "L")
    assert shape_of(graph, "s") == (b, 4, length, length)
    for bv, lv in ((1, 1), (2, 7), (1, 13)):
        assert_matches_onnxruntime(model, graph, {"q": rand(bv, 4, lv, 16), "k": rand(bv, 4, 16, lv)})


def test_matmul_broadcasts_a_size_one_batch_dim_against_a_symbolic_one():
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])],
                       [("a", [1, "L", 8]), ("b", ["B", 8, 5])], ["y"])
    graph = propagated(model)
    assert shape_of(graph, "y") == (sym(graph, "B"), sym(graph, "L"), 5)
    assert_matches_onnxruntime(model, graph, {"a": rand(1, 7, 8), "b": rand(3, 8, 5)})


def test_matmul_with_1d_operands_drops_the_vector_axes():
    model = make_model([helper.make_node("MatMul", ["v", "m"], ["y"]), helper.make_node("MatMul", ["m", "u"], ["z"])],
                       [("v", ["K"]), ("m", ["B", "K", "P"]), ("u", ["P"])], ["y", "z"])
    graph = propagated(model)
    assert shape_of(graph, "y") == (sym(graph, "B"), sym(graph, "P"))
    assert shape_of(graph, "z") == (sym(graph, "B"), sym(graph, "K"))
    assert_matches_onnxruntime(model, graph, {"v": rand(7), "m": rand(2, 7, 13), "u": rand(13)})


def test_matmul_unifies_two_different_symbols_on_the_reduction_dim():
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="proj")],
                       [("a", ["M", "K1"]), ("b", ["K2", 8])], ["y"])
    graph = propagated(model)
    k1, k2 = graph.symbols.symbol("K1"), graph.symbols.symbol("K2")
    subst = graph.symbols.substitution
    assert subst.get(k1) == k2 or subst.get(k2) == k1
    assert any("MatMul reduction dim" in c.reason and "proj" in c.reason for c in graph.symbols.constraints)
    assert shape_of(graph, "y") == (sym(graph, "M"), 8)
    assert graph.symbols.canon(k1) == graph.symbols.canon(k2)


def test_matmul_with_mismatched_static_reduction_dims_raises_shape_error_naming_the_node():
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"], name="bad_proj")],
                       [("a", ["B", 64])], ["y"], {"w": rand(32, 8)})
    with pytest.raises(ShapeError, match=r"bad_proj.*reduction dim.*64.*32"):
        propagated(model)


def test_gemm_with_transposed_weight_and_bias_keeps_symbolic_rows():
    w, bias = rand(32, 64), rand(32)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, alpha=0.5, beta=2.0)
    model = make_model([node], [("x", ["B", 64])], ["y"], {"w": w, "b": bias})
    graph = propagated(model)
    assert shape_of(graph, "y") == (sym(graph, "B"), 32)
    for b in (1, 7, 13):
        assert_matches_onnxruntime(model, graph, {"x": rand(b, 64)})


# ----------------------------------------------------------------------------- Conv
def test_conv_stride_4_gives_floor_of_symbolic_spatial_dims():
    w, bias = rand(8, 3, 4, 4), rand(8)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[4, 4], strides=[4, 4])
    model = make_model([node], [("x", ["B", 3, "H", "W"])], ["y"], {"w": w, "b": bias})
    graph = propagated(model, "H=4:512", "W=4:512")
    n, h, wd = sym(graph, "B"), sym(graph, "H"), sym(graph, "W")
    assert shape_of(graph, "y") == (n, 8, sympy.floor(h / 4), sympy.floor(wd / 4))
    for nv, hv, wv in ((1, 4, 7), (2, 13, 17), (1, 16, 4)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, 3, hv, wv)})


def test_conv_patch_embedding_16x16_stride_16_gives_floor_h_over_16():
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[16, 16], strides=[16, 16])
    model = make_model([node], [("x", ["B", 3, "H", "W"])], ["y"], {"w": rand(24, 3, 16, 16)})
    graph = propagated(model, "H=16:1024", "W=16:1024")
    assert [str(d) for d in shape_of(graph, "y")] == ["B", "24", "floor(H/16)", "floor(W/16)"]
    assert_matches_onnxruntime(model, graph, {"x": rand(2, 3, 33, 16)})


@pytest.mark.parametrize("attrs, expected", [
    (dict(pads=[1, 1, 1, 1], strides=[2, 2]), lambda h: sympy.floor((h - 1) / 2) + 1),
    (dict(auto_pad="SAME_UPPER", strides=[2, 2]), lambda h: sympy.ceiling(h / 2)),
    (dict(auto_pad="SAME_LOWER", strides=[3, 3]), lambda h: sympy.ceiling(h / 3)),
    (dict(auto_pad="VALID", dilations=[2, 2]), lambda h: h - 4),
    (dict(pads=[0, 2, 1, 0], strides=[1, 2]), None),
])
def test_grouped_conv_output_dims_follow_the_padding_formula_and_match_onnxruntime(attrs, expected):
    w, bias = rand(6, 2, 3, 3), rand(6)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=2, kernel_shape=[3, 3], **attrs)
    model = make_model([node], [("x", ["B", 4, "H", "W"])], ["y"], {"w": w, "b": bias})
    graph = propagated(model, "H=5:256", "W=5:256")
    out = shape_of(graph, "y")
    assert out[:2] == (sym(graph, "B"), 6)
    if expected is not None:
        h = sym(graph, "H")
        assert graph.symbols.canon(out[2] - expected(h)) == 0, out[2]   # canon: one form per integer shift
    for nv, hv, wv in ((1, 5, 7), (2, 13, 6), (1, 8, 11)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, 4, hv, wv)})


def test_1d_conv_with_dilation_over_a_symbolic_sequence():
    node = helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2], pads=[1, 2], strides=[2])
    model = make_model([node], [("x", ["B", 6, "L"])], ["y"], {"w": rand(4, 6, 3)})
    graph = propagated(model, "L=3:4096")
    length = sym(graph, "L")
    assert sympy.simplify(shape_of(graph, "y")[2] - (sympy.floor((length - 2) / 2) + 1)) == 0
    for b, lv in ((1, 3), (2, 13), (1, 64)):
        assert_matches_onnxruntime(model, graph, {"x": rand(b, 6, lv)})


def test_conv_unifies_input_channels_with_weight_channels_times_group():
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=2, name="dw")
    model = make_model([node], [("x", ["B", 3, "H", "W"])], ["y"], {"w": rand(4, 2, 3, 3)})
    with pytest.raises(ShapeError, match=r"dw.*input channels.*3.*4"):
        propagated(model)


def test_conv_with_unknown_auto_pad_is_unsupported_and_names_the_value():
    node = helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_MIDDLE")
    model = make_model([node], [("x", ["B", 3, "H", "W"])], ["y"], {"w": rand(4, 3, 3, 3)})
    with pytest.raises(UnsupportedOperatorError, match="auto_pad='SAME_MIDDLE'"):
        propagated(model)


def test_conv_transpose_stride_2_doubles_symbolic_spatial_dims():
    w, bias = rand(4, 3, 4, 4), rand(3)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    model = make_model([node], [("x", ["B", 4, "H", "W"])], ["y"], {"w": w, "b": bias})
    graph = propagated(model)
    n, h, wd = sym(graph, "B"), sym(graph, "H"), sym(graph, "W")
    assert shape_of(graph, "y") == (n, 3, 2 * h, 2 * wd)
    for nv, hv, wv in ((1, 1, 7), (2, 13, 5)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, 4, hv, wv)})


# ----------------------------------------------------------------------------- reductions
def test_softmax_layernorm_and_reducemean_over_symbolic_dims():
    nodes = [
        helper.make_node("Softmax", ["x"], ["sm"], axis=-1),
        helper.make_node("LogSoftmax", ["x"], ["lsm"], axis=1),
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln", "mean", "inv"], axis=-1, epsilon=1e-5),
        helper.make_node("ReduceMean", ["x", "axes"], ["rm"], keepdims=0),
        helper.make_node("ReduceSum", ["x", "axes"], ["rs"], keepdims=1),
        helper.make_node("ReduceMax", ["x"], ["rmax"], keepdims=0),
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0, select_last_index=1),
    ]
    model = make_model(nodes, [("x", ["B", "L", 32])], ["sm", "lsm", "ln", "mean", "inv", "rm", "rs", "rmax", "am"],
                       {"g": rand(32), "b": rand(32), "axes": np.array([1], dtype=np.int64)})
    graph = propagated(model)
    b, length = sym(graph, "B"), sym(graph, "L")
    assert shape_of(graph, "sm") == shape_of(graph, "ln") == (b, length, 32)
    assert shape_of(graph, "mean") == shape_of(graph, "inv") == (b, length, 1)
    assert shape_of(graph, "rm") == (b, 32)
    assert shape_of(graph, "rs") == (b, 1, 32)
    assert shape_of(graph, "rmax") == ()
    assert shape_of(graph, "am") == (b, 32)
    assert graph.values["am"].dtype == np.int64
    for bv, lv in ((1, 1), (2, 7), (3, 13)):
        assert_matches_onnxruntime(model, graph, {"x": rand(bv, lv, 32) * 4})


def test_softmax_before_opset_13_normalizes_over_the_flattened_trailing_axes():
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", ["B", "L", 8])], ["y"], opset=11)
    graph = propagated(model)
    y = run_reference(graph, {"x": rand(2, 7, 8)})["y"]
    np.testing.assert_allclose(y.sum(axis=(1, 2)), np.ones(2), rtol=1e-5)
    assert_matches_onnxruntime(model, graph, {"x": rand(2, 7, 8)})


def test_reduce_with_runtime_axes_input_gives_data_dependent_dims_bound_at_run_time():
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                       [("x", ["B", 1, 6])], ["y"])
    model.graph.input.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [1]))
    graph = propagated(model)
    out = shape_of(graph, "y")
    assert out[1] == 1 and all(graph.symbols.get(d.name).origin == "data-dependent" for d in (out[0], out[2]))
    got = run_reference(graph, {"x": rand(3, 1, 6), "axes": np.array([2], dtype=np.int64)})["y"]
    assert got.shape == (3, 1, 1)


def test_reduce_prod_of_a_shape_keeps_symbolic_element_values():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
             helper.make_node("Reshape", ["x", "n"], ["flat"])]
    model = make_model(nodes, [("x", ["B", "L", 4])], ["flat"])
    graph = propagated(model)
    assert shape_of(graph, "flat") == (4 * sym(graph, "B") * sym(graph, "L"),)
    assert_matches_onnxruntime(model, graph, {"x": rand(3, 7, 4)})


def test_instance_and_batch_normalization_and_global_pool_keep_symbolic_spatial_dims():
    c = 5
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["inorm"], epsilon=1e-5),
             helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["bn"]),
             helper.make_node("GlobalAveragePool", ["x"], ["gap"])]
    var = np.abs(rand(c)) + 0.5
    model = make_model(nodes, [("x", ["B", c, "H", "W"])], ["inorm", "bn", "gap"],
                       {"s": rand(c), "b": rand(c), "m": rand(c), "v": var})
    graph = propagated(model)
    n, h, w = sym(graph, "B"), sym(graph, "H"), sym(graph, "W")
    assert shape_of(graph, "inorm") == shape_of(graph, "bn") == (n, c, h, w)
    assert shape_of(graph, "gap") == (n, c, 1, 1)
    for nv, hv, wv in ((1, 1, 7), (2, 13, 3)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, c, hv, wv)})


def test_batch_normalization_training_mode_on_a_run_time_tensor_is_unsupported():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], training_mode=1)
    model = make_model([node], [("x", ["B", 2, "H"])], ["y"], {k: np.ones(2, np.float32) for k in "sbmv"})
    with pytest.raises(UnsupportedOperatorError, match="training mode .* on a run-time tensor"):
        propagated(model)


def test_batch_normalization_training_mode_of_a_constant_folds_to_weight_standardization():
    """BiT's convolutions standardize their own weights with a training-mode BN (batch statistics
    of the weight, momentum 1): folded at compile time, the Conv reads the standardized weight."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((1, 4, 18)).astype(np.float32) * 0.3 + 0.1
    nodes = [helper.make_node("BatchNormalization", ["w", "s", "b", "m", "v"], ["ws", "rm", "rv"],
                              training_mode=1, momentum=1.0, epsilon=1e-8),
             helper.make_node("Reshape", ["ws", "shape"], ["w4"]),
             helper.make_node("Conv", ["x", "w4"], ["y"], pads=[1, 1, 1, 1])]
    inits = {"w": w, "s": np.ones(4, np.float32), "b": np.zeros(4, np.float32), "m": np.zeros(4, np.float32),
             "v": np.ones(4, np.float32), "shape": np.array([4, 2, 3, 3], np.int64)}
    model = make_model(nodes, [("x", ["B", 2, "H", "W"])], ["y"], inits)
    graph = propagated(model)
    assert graph.values["ws"].const is not None        # folded: no BN left to run
    standardized = (w - w.mean(axis=(0, 2), keepdims=True)) / np.sqrt(w.var(axis=(0, 2), keepdims=True) + 1e-8)
    np.testing.assert_allclose(graph.values["ws"].const, standardized, rtol=1e-5, atol=1e-5)
    assert_matches_onnxruntime(model, graph, {"x": rand(2, 2, 5, 7)})


# ----------------------------------------------------------------------------- Einsum
@pytest.mark.parametrize("equation, a_shape, b_shape, expected", [
    ("bhid,bhjd->bhij", ["B", 4, "L", 16], ["B", 4, "L", 16], ("B", 4, "L", "L")),
    ("bhij,bhjd->bhid", ["B", 4, "L", "L"], ["B", 4, "L", 16], ("B", 4, "L", 16)),
    ("bld,df->blf", ["B", "L", 16], [16, 8], ("B", "L", 8)),
    ("...ld,...md", ["B", "L", 16], ["B", "M", 16], ("B", "L", "M")),
])
def test_einsum_forms_used_by_attention_have_symbolic_shapes(equation, a_shape, b_shape, expected):
    model = make_model([helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)],
                       [("a", a_shape), ("b", b_shape)], ["y"])
    graph = propagated(model)
    assert [str(d) for d in shape_of(graph, "y")] == [str(d) for d in expected]
    sizes = {"B": 2, "L": 7, "M": 13}
    concrete = lambda shape: [sizes.get(d, d) for d in shape]  # noqa: E731
    assert_matches_onnxruntime(model, graph, {"a": rand(*concrete(a_shape)), "b": rand(*concrete(b_shape), seed=1)})


# ----------------------------------------------------------------------------- Resize
def test_resize_with_sizes_computed_from_shape_gives_doubled_symbolic_dims():
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
        helper.make_node("Slice", ["s", "two", "four"], ["hw"]),
        helper.make_node("Mul", ["hw", "twos"], ["hw2"]),
        helper.make_node("Concat", ["nc", "hw2"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
    ]
    consts = {"zero": np.array([0], np.int64), "two": np.array([2], np.int64), "four": np.array([4], np.int64),
              "twos": np.array([2, 2], np.int64)}
    model = make_model(nodes, [("x", ["B", 3, "H", "W"])], ["y"], consts)
    graph = propagated(model)
    n, h, w = sym(graph, "B"), sym(graph, "H"), sym(graph, "W")
    assert shape_of(graph, "y") == (n, 3, 2 * h, 2 * w)
    for nv, hv, wv in ((1, 1, 7), (2, 13, 5)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, 3, hv, wv)})


@pytest.mark.parametrize("coordinate_mode", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
def test_bicubic_resize_by_scales_like_vit_position_embedding_interpolation(coordinate_mode):
    scales = np.array([1, 1, 8 / 7, 8 / 7], dtype=np.float32)  # a 14x14 grid to 16x16
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic", cubic_coeff_a=-0.75,
                            coordinate_transformation_mode=coordinate_mode)
    model = make_model([node], [("x", [1, 24, "G", "G"])], ["y"], {"scales": scales})
    graph = propagated(model)
    g = sym(graph, "G")
    assert shape_of(graph, "y") == (1, 24, sympy.floor(8 * g / 7), sympy.floor(8 * g / 7))
    for gv in (14, 7, 13):
        assert_matches_onnxruntime(model, graph, {"x": rand(1, 24, gv, gv)})


@pytest.mark.parametrize("attrs", [
    dict(mode="nearest"),
    dict(mode="nearest", nearest_mode="floor", coordinate_transformation_mode="asymmetric"),
    dict(mode="linear"),
    dict(mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
])
def test_downsampling_resize_by_scales_matches_onnxruntime(attrs):
    scales = np.array([1, 1, 0.5, 0.75], dtype=np.float32)
    model = make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)],
                       [("x", ["B", 2, "H", "W"])], ["y"], {"scales": scales})
    graph = propagated(model)
    h, w = sym(graph, "H"), sym(graph, "W")
    assert shape_of(graph, "y")[2:] == (sympy.floor(h / 2), sympy.floor(3 * w / 4))
    for hv, wv in ((2, 7), (13, 4), (8, 8)):
        assert_matches_onnxruntime(model, graph, {"x": rand(1, 2, hv, wv)})


def test_resize_with_unknown_mode_is_unsupported_and_names_the_value():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="area")
    model = make_model([node], [("x", [1, 1, "H", "W"])], ["y"], {"scales": np.ones(4, np.float32)})
    with pytest.raises(UnsupportedOperatorError, match="mode='area'"):
        propagated(model)


# ----------------------------------------------------------------------------- pools
@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
])
def test_pools_give_symbolic_window_dims_and_match_onnxruntime(op, attrs):
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", ["B", 3, "H", "W"])], ["y"])
    graph = propagated(model, "H=3:512", "W=3:512")
    out = shape_of(graph, "y")
    assert out[:2] == (sym(graph, "B"), 3)
    assert sym(graph, "H") in out[2].free_symbols and not out[2].has(sympy.Min)
    for nv, hv, wv in ((1, 3, 7), (2, 13, 4), (1, 8, 9)):
        assert_matches_onnxruntime(model, graph, {"x": rand(nv, 3, hv, wv)})


def test_ceil_mode_pool_keeps_the_last_window_inside_the_input_symbolically():
    # kernel 1, stride 2: ceil mode would add a window starting past the input on even lengths
    model = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1], strides=[2], ceil_mode=1)],
                       [("x", ["B", 2, "L"])], ["y"])
    graph = propagated(model)
    length = sym(graph, "L")
    out = shape_of(graph, "y")[2]
    for lv in (1, 2, 7, 8, 13):
        assert out.subs(length, lv) == (lv + 1) // 2
        assert_matches_onnxruntime(model, graph, {"x": rand(1, 2, lv)})


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_window_geometry_as_expressions_equals_the_concrete_geometry(auto_pad, ceil_mode):
    """The host program evaluates a window's pads and output length from expressions of the input
    length: they must agree with the concrete rule at every length."""
    import sympy

    from tscomp.graph.ops.nn import Window

    n = sympy.Symbol("n", integer=True, positive=True)
    for kernel, stride, dil, pads in [(3, 1, 1, (1, 1)), (3, 2, 1, (1, 0)), (7, 2, 1, (3, 3)), (2, 3, 2, (0, 1)),
                                      (1, 1, 1, (0, 0))]:
        win = Window((kernel,), (stride,), (dil,), pads, auto_pad, ceil_mode)
        exprs = win.geometry_expr(0, n)
        for size in range(max(1, win.span(0) - pads[0] - pads[1]), 40):
            got = tuple(int(sympy.sympify(e).subs(n, size)) for e in exprs)
            assert got == win.geometry(0, size), (kernel, stride, dil, pads, size)


@pytest.mark.parametrize("op,attrs,shape", [
    ("LpNormalization", {"axis": 1, "p": 1}, (2, 5, 3)), ("LpNormalization", {}, (3, 4)),
    ("LRN", {"size": 3}, (2, 6, 4, 5)), ("LRN", {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, (1, 7, 3, 3)),
    ("Hardmax", {"axis": 1}, (2, 5, 3)), ("Det", {}, (4, 3, 3))])
def test_numpy_reference_operators_match_onnxruntime(op, attrs, shape):
    """Operators that run on the numpy fallback (no kernel family yet), beside onnxruntime."""
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", list(shape))], ["y"])
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph = import_model(model)
    propagate_shapes(graph)
    np.testing.assert_allclose(run_reference(graph, {"x": x})["y"], want, rtol=1e-5, atol=1e-6)
