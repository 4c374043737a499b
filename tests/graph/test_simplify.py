"""Graph simplification: a zero constant Pad of the spatial axes folds into the Conv after it
(TensorFlow-style "SAME" ports such as MobileNetV2 emit one before every Conv); any other Pad stays;
a BatchNormalization with constant statistics becomes Mul + Add; an RNN op with constant weights becomes
projections + a recurrence."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.compiler import compile_model
from tscomp.graph import load_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact

C = 3


def _pad_conv_model(path, pads, *, mode="constant", value=None, conv_pads=(1, 0, 0, 2), extra_reader=False,
                    strides=(2, 1)):
    """x [N, C, H, W] -> Pad(pads, mode, value) -> Conv 3x3 (own pads, strides) -> y; with
    ``extra_reader`` the padded tensor is also a graph output."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, C, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.asarray(pads, np.int64), "pads")]
    pad_inputs = ["x", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), "value"))
        pad_inputs.append("value")
    nodes = [helper.make_node("Pad", pad_inputs, ["xp"], mode=mode),
             helper.make_node("Conv", ["xp", "w"], ["y"], pads=list(conv_pads), strides=list(strides))]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, None)]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("xp", TP.FLOAT, None))
    graph = helper.make_graph(nodes, "pad_conv", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", C, "H", "W"])],
                              outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


def _ops(path):
    return [n.op_type for n in load_model(path, ["N=1:2", "H=1:40", "W=1:40"]).nodes]


def test_a_zero_spatial_pad_folds_into_the_conv_and_matches_onnxruntime(tmp_path):
    path = str(tmp_path / "m.onnx")
    _pad_conv_model(path, [0, 0, 2, 1, 0, 0, 1, 3], value=0.0)
    graph = load_model(path, ["N=1:2", "H=1:40", "W=1:40"])
    (conv,) = graph.nodes
    assert conv.op_type == "Conv" and list(conv.attrs["pads"]) == [1 + 2, 0 + 1, 0 + 1, 2 + 3]
    assert conv.inputs[0] == "x"
    model = compile_model(path, ["N=1:2", "H=1:40", "W=1:40"])
    write_artifact(model, tmp_path / "m.tsc")
    rt = Runtime(tmp_path / "m.tsc")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n, h, w in [(1, 1, 1), (2, 7, 13), (1, 40, 40), (2, 2, 37)]:
        x = rng.standard_normal((n, C, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("why, kwargs", [
    ("a non-zero pad value", dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.5)),
    ("a reflect pad", dict(pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="reflect")),
    ("a padded batch axis", dict(pads=[1, 0, 1, 1, 0, 0, 1, 1])),
    ("a negative pad (a crop)", dict(pads=[0, 0, -1, 1, 0, 0, 1, 1])),
])
def test_a_pad_the_conv_cannot_absorb_stays_in_the_graph(tmp_path, why, kwargs):
    path = str(tmp_path / "m.onnx")
    _pad_conv_model(path, **kwargs)
    assert "Pad" in _ops(path), why


def test_a_pad_with_another_reader_stays_for_it_while_the_conv_reads_the_unpadded_input(tmp_path):
    path = str(tmp_path / "m.onnx")
    _pad_conv_model(path, [0, 0, 1, 1, 0, 0, 1, 1], extra_reader=True)
    graph = load_model(path, ["N=1:2", "H=1:40", "W=1:40"])
    conv = next(n for n in graph.nodes if n.op_type == "Conv")
    assert [n.op_type for n in graph.nodes].count("Pad") == 1 and conv.inputs[0] == "x"


def test_a_batch_norm_with_constant_statistics_becomes_a_fused_affine_and_matches_onnxruntime(tmp_path):
    """x [N, C, L] -> MatMul (a BN after a GEMM, as SwiftFormer's attention output has: no Conv to
    fuse it into) -> BatchNormalization: the graph holds Mul and Add with [C, 1] constants, and the
    compiled model runs natively and matches onnxruntime."""
    rng = np.random.default_rng(1)
    chans, feat = 6, 8
    inits = [numpy_helper.from_array(rng.standard_normal((feat, feat)).astype(np.float32), "w")]
    for name, arr in (("scale", rng.standard_normal(chans)), ("bias", rng.standard_normal(chans)),
                      ("mean", rng.standard_normal(chans)), ("var", rng.uniform(0.1, 2.0, chans))):
        inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"], ["y"], epsilon=1e-3)]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", chans, feat])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "bn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    assert [n.op_type for n in load_model(path, ["N=1:5"]).nodes] == ["MatMul", "Mul", "Add"]
    rt = Runtime(str(write_artifact(compile_model(str(path), ["N=1:5"]), tmp_path / "bn.tsc")), num_threads=2)
    assert all(k.family != "numpy" for ks in rt.model.kernels.values() for k in ks)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 2, 5):
        x = rng.standard_normal((n, chans, feat)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,opset,axis", [("Softmax", 17, -1), ("LogSoftmax", 17, 2), ("Softmax", 11, 2)])
def test_a_softmax_over_one_element_is_x_times_zero_plus_one_with_onnxruntimes_nans(tmp_path, op, opset, axis):
    """[N, T, 1] weights normalized over their last axis (SwiftFormer): 1 (LogSoftmax: 0) where x
    is finite, NaN where it is NaN or infinite -- as onnxruntime computes it."""
    weight = numpy_helper.from_array(np.random.default_rng(4).standard_normal((6, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node(op, ["h"], ["y"], axis=axis)]
    graph = helper.make_graph(nodes, "sm", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", "T", 6])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], [weight])
    path = tmp_path / "sm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    dims = ["N=1:3", "T=1:20"]
    assert op not in [n.op_type for n in load_model(path, dims).nodes]
    rt = Runtime(str(write_artifact(compile_model(str(path), dims), tmp_path / "sm.tsc")), num_threads=2)
    assert all(k.family != "numpy" for ks in rt.model.kernels.values() for k in ks)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(5).standard_normal((2, 7, 6)).astype(np.float32)
    x[0, 1, 0], x[1, 2, 3], x[1, 4, 0] = np.nan, np.inf, -np.inf
    np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [2, 8])
def test_group_norm_rows_keep_the_channel_axis_and_compile_natively(tmp_path, groups):
    """GroupNorm as torch exports it -- Reshape(x, [0, G, -1]) -> InstanceNormalization ->
    Reshape(Shape(x)) -> Mul, Add by [C, 1, 1] -- normalizes [N, G, C/G, H*W] rows, so the whole
    group is one native row kernel (it ran on numpy: the per-channel constants' index into [N, G,
    C/G*H*W] rows is a floor by a symbolic size), matching onnxruntime at dynamic H, W."""
    rng = np.random.default_rng(3)
    chans = 16
    inits = [numpy_helper.from_array(np.array([0, groups, -1], np.int64), "rows"),
             numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
             numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
             numpy_helper.from_array(rng.standard_normal((chans, 1, 1)).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal((chans, 1, 1)).astype(np.float32), "beta")]
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-5),
             helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Reshape", ["n", "xs"], ["nx"]),
             helper.make_node("Mul", ["nx", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["y"])]
    graph = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", chans, "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "gn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    dims = ["N=1:3", "H=1:20", "W=1:20"]
    g = load_model(path, dims)
    norm = next(n for n in g.nodes if n.op_type == "InstanceNormalization")
    assert [int(d) for d in g.values[norm.inputs[0]].shape[1:3]] == [groups, chans // groups]
    rt = Runtime(str(write_artifact(compile_model(str(path), dims), tmp_path / "gn.tsc")), num_threads=2)
    assert all(k.family != "numpy" for ks in rt.model.kernels.values() for k in ks)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n, h, w in [(1, 1, 1), (2, 7, 13), (3, 20, 5), (1, 20, 20)]:
        x = rng.standard_normal((n, chans, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,lbr", [("LSTM", 0), ("GRU", 1), ("GRU", 0)])
def test_a_recurrence_with_constant_weights_becomes_projections_and_a_recurrence(tmp_path, op, lbr):
    """An RNN op with constant W, R, B becomes MatMul (every step's input projection) + Add (the
    biases that can join it) + tscomp.Recurrence over R transposed; GRU's h-gate recurrent bias
    under linear_before_reset stays with the recurrence; the artifact round trip (a custom-domain
    node in its plan) matches onnxruntime."""
    rng = np.random.default_rng(4)
    gates, hidden, feat = {"LSTM": 4, "GRU": 3}[op], 5, 3
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.5, name) for name, shape in
             (("W", (2, gates * hidden, feat)), ("R", (2, gates * hidden, hidden)), ("B", (2, 2 * gates * hidden)))]
    attrs = {"linear_before_reset": lbr} if op == "GRU" else {}
    node = helper.make_node(op, ["x", "W", "R", "B"], ["y"], hidden_size=hidden, direction="bidirectional", **attrs)
    graph = helper.make_graph([node], "rnn", [helper.make_tensor_value_info("x", TP.FLOAT, ["L", "N", feat])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "rnn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    nodes = load_model(path, ["L=1:9", "N=1:3"]).nodes
    assert [(n.domain, n.op_type) for n in nodes] == [("", "MatMul"), ("", "Add"), ("tscomp", "Recurrence")]
    assert bool(nodes[-1].inputs[2]) == bool(lbr)            # the kept h-gate recurrent bias
    rt = Runtime(str(write_artifact(compile_model(str(path), ["L=1:9", "N=1:3"]), tmp_path / "rnn.tsc")), num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for L, n in ((1, 1), (9, 3), (4, 2)):
        x = rng.standard_normal((L, n, feat)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def _branches_model(path, strides, branches, dilations=None):
    """x [N, 4, H, W] -> sum of Convs with the given (kernel, pads) on x (each with a bias; ``dilations``
    per branch, None for 1) -> Relu."""
    rng = np.random.default_rng(9)
    inits, nodes, outs = [], [], []
    for k, ((kh, kw), pads) in enumerate(branches):
        inits += [numpy_helper.from_array(rng.standard_normal((6, 4, kh, kw)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), f"b{k}")]
        extra = {"dilations": dilations[k]} if dilations and dilations[k] else {}
        nodes.append(helper.make_node("Conv", ["x", f"w{k}", f"b{k}"], [f"c{k}"], pads=list(pads), strides=list(strides),
                                      **extra))
        outs.append(f"c{k}")
    total = outs[0]
    for k, o in enumerate(outs[1:]):
        nodes.append(helper.make_node("Add", [total, o], [f"s{k}"]))
        total = f"s{k}"
    nodes.append(helper.make_node("Relu", [total], ["y"]))
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 4, "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


TEXTNET_BRANCHES = [((3, 3), (1, 1, 1, 1)), ((3, 1), (1, 0, 1, 0)), ((1, 3), (0, 1, 0, 1))]
#: a 2x2 kernel padded only at the end reads rows y, y + 1: the lower-right of the 3x3 window; an
#: unpadded 1x1, its centre
CORNER_BRANCHES = [((3, 3), (1, 1, 1, 1)), ((2, 2), (0, 0, 1, 1)), ((1, 1), (0, 0, 0, 0))]


@pytest.mark.parametrize("strides,branches", [((1, 1), TEXTNET_BRANCHES), ((2, 2), TEXTNET_BRANCHES),
                                              ((1, 1), CORNER_BRANCHES)], ids=["textnet", "textnet-s2", "corner"])
def test_parallel_convs_of_one_input_merge_into_one_conv_and_match_onnxruntime(tmp_path, strides, branches):
    """TextNet's 3x3 + 3x1 + 1x3 branches (RepVGG-style) on one input: one Conv with the kernels
    summed, each where its taps read (the 3x1 in the 3x3's middle column), the biases summed."""
    path = tmp_path / "branches.onnx"
    _branches_model(path, strides, branches)
    graph = load_model(path, ["N=1:2", "H=3:40", "W=3:40"])
    convs = [n for n in graph.nodes if n.op_type == "Conv"]
    assert [n.op_type for n in graph.nodes] == ["Conv", "Relu"] and convs[0].attrs["kernel_shape"] == [3, 3]
    rt = Runtime(str(write_artifact(compile_model(str(path), ["N=1:2", "H=3:40", "W=3:40"]), tmp_path / "b.tsc")),
                 num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for n, h, w in ((1, 3, 3), (2, 17, 40), (1, 40, 9)):
        x = rng.standard_normal((n, 4, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_parallel_convs_of_different_dilations_stay_apart(tmp_path):
    """A 3x3 and a dilated 3x3 (pads 1 and 2: the same output size) read different positions: no one
    kernel holds both, so the sum stays two Convs and an Add."""
    path = tmp_path / "apart.onnx"
    _branches_model(path, (1, 1), [((3, 3), (1, 1, 1, 1)), ((3, 3), (2, 2, 2, 2))], dilations=[None, [2, 2]])
    graph = load_model(path, ["N=1:2", "H=3:40", "W=3:40"])
    assert [n.op_type for n in graph.nodes] == ["Conv", "Conv", "Add", "Relu"]


def _zeroed_rows_model(path, *, per_key: bool = False):
    """P = Softmax(S), c = ReduceMax(mask, last axis, keepdims) == -inf (rows the mask blocks
    entirely; ``per_key``: mask == -inf itself, varying along the keys), y = MatMul(Where(c, 0, P),
    V): opset 23's "safe softmax" as its Attention body writes it (CastLikes and a Cast included)."""
    blocked = [helper.make_node("Equal", ["mask", "neginf_t"], ["c"])] if per_key else [
        helper.make_node("ReduceMax", ["mask", "last"], ["rowmax"], keepdims=1),
        helper.make_node("Equal", ["rowmax", "neginf_t"], ["c"])]
    nodes = [helper.make_node("Softmax", ["s"], ["p0"], axis=-1),
             helper.make_node("CastLike", ["p0", "s"], ["p"]),
             helper.make_node("CastLike", ["neginf", "mask"], ["neginf_t"]), *blocked,
             helper.make_node("Cast", ["zero"], ["zero_t"], to=TP.FLOAT),
             helper.make_node("Where", ["c", "zero_t", "p"], ["safe"]),
             helper.make_node("MatMul", ["safe", "v"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "neginf"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    inputs = [helper.make_tensor_value_info("s", TP.FLOAT, ["B", 2, "L", "L"]),
              helper.make_tensor_value_info("mask", TP.FLOAT, ["B", 1, "L", "L"]),
              helper.make_tensor_value_info("v", TP.FLOAT, ["B", 2, "L", 8])]
    graph = helper.make_graph(nodes, "safe", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)


def test_rows_zeroed_before_a_matmul_are_zeroed_after_it_and_match_onnxruntime(tmp_path):
    """Where(c, 0, P) @ V with c constant along P's last axis becomes Where(c, 0, P @ V) (the
    CastLikes gone, the constant one folded); fully masked rows -- NaN probabilities -- give 0."""
    path = tmp_path / "safe.onnx"
    _zeroed_rows_model(path)
    graph = load_model(path, ["B=1:2", "L=1:33"])
    order = [n.op_type for n in graph.nodes]
    assert "CastLike" not in order and order.index("MatMul") < order.index("Where")
    rt = Runtime.from_compiled(compile_model(str(path), ["B=1:2", "L=1:33"], max_variants=1))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for b, L in [(1, 1), (2, 7), (1, 33)]:
        mask = np.where(rng.random((b, 1, L, L)) < 0.3, -np.inf, 0.0).astype(np.float32)
        mask[0, 0, 0] = -np.inf                              # a row blocked entirely
        s = (rng.standard_normal((b, 2, L, L)) + mask).astype(np.float32)
        feeds = {"s": s, "mask": mask, "v": rng.standard_normal((b, 2, L, 8)).astype(np.float32)}
        got, want = rt.run(feeds)["y"], sess.run(None, feeds)[0]
        assert not np.isnan(want).any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_where_that_varies_along_the_keys_stays_before_the_matmul(tmp_path):
    path = tmp_path / "per_key.onnx"
    _zeroed_rows_model(path, per_key=True)
    order = [n.op_type for n in load_model(path, ["B=1:2", "L=1:33"]).nodes]
    assert order.index("Where") < order.index("MatMul")


def test_a_where_before_a_matrix_vector_product_stays(tmp_path):
    """MatMul(Where(c, 0, P), v) with a vector v drops the last axis c is constant along: moving
    the Where would broadcast c [M, 1] against the [M] product into [M, M]."""
    nodes = [helper.make_node("Less", ["p", "zero"], ["neg"]),
             helper.make_node("Cast", ["neg"], ["neg_f"], to=TP.FLOAT),
             helper.make_node("ReduceMax", ["neg_f", "last"], ["rowmax"], keepdims=1),    # c: [M, 1]
             helper.make_node("Greater", ["rowmax", "zero"], ["c"]),
             helper.make_node("Where", ["c", "zero", "p"], ["safe"]),
             helper.make_node("MatMul", ["safe", "v"], ["y"])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "last"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    inputs = [helper.make_tensor_value_info("p", TP.FLOAT, ["M", 6]), helper.make_tensor_value_info("v", TP.FLOAT, [6])]
    graph = helper.make_graph(nodes, "mv", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "mv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    order = [n.op_type for n in load_model(path, ["M=1:9"]).nodes]
    assert order.index("Where") < order.index("MatMul")
