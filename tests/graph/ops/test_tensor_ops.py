"""Symbolic behaviour of the shape/layout/indexing operators (tscomp/graph/ops/tensor.py).

ONNX's conformance cases (tests/graph/test_onnx_conformance.py) check these ops at
concrete shapes; this file checks what they cannot: symbolic output shapes from
symbolic *values* (Shape -> Gather -> Concat -> Reshape chains), range-aware
simplification, fresh/data-dependent symbols for unknown values, clear errors, and
the reference executor against onnxruntime at several concrete bindings.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.errors import ShapeError, UnsupportedOperatorError
from tscomp.graph import DimSpec, import_model, propagate_shapes
from tscomp.graph.reference import run_reference

F, I64 = TensorProto.FLOAT, TensorProto.INT64


# --------------------------------------------------------------------------- helpers
def make_model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, [helper.make_tensor_value_info(o, F, None)
                                                   if isinstance(o, str) else o for o in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k)
                                           for k, v in dict(initializers).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def out(name, elem=F):
    return helper.make_tensor_value_info(name, elem, None)


def inp(name, dims, elem=F):
    return helper.make_tensor_value_info(name, elem, dims)


def propagate(model, *dims):
    graph = import_model(model, [DimSpec.parse(d) for d in dims])
    propagate_shapes(graph)
    return graph


def syms(graph, *names):
    return [graph.symbols.symbol(n) for n in names]


def shape_of(graph, value):
    return tuple(graph.values[value].shape)


def assert_matches_onnxruntime(model, graph, feeds):
    want = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run_reference(graph, feeds)
    for name, w in zip(graph.outputs, want):
        assert got[name].shape == w.shape, name
        assert got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6, err_msg=name)


def shape_gather(prefix, src, index):
    """Nodes computing Unsqueeze(Gather(Shape(src), index), 0) -> f'{prefix}' (a 1-element int64)."""
    return [
        helper.make_node("Shape", [src], [f"{prefix}_shape"]),
        helper.make_node("Gather", [f"{prefix}_shape", f"{prefix}_idx"], [f"{prefix}_scalar"], axis=0),
        helper.make_node("Unsqueeze", [f"{prefix}_scalar", "axes0"], [prefix]),
    ], {f"{prefix}_idx": np.array(index, np.int64)}


# --------------------------------------------------------------------------- the BERT attention reshape
def attention_model():
    """x[B, L, 768] -> Reshape to [B, L, 12, 64] via Shape arithmetic -> Transpose -> Reshape([0, 0, -1])."""
    b_nodes, b_init = shape_gather("b", "x", 0)
    l_nodes, l_init = shape_gather("l", "x", 1)
    nodes = b_nodes + l_nodes + [
        helper.make_node("Concat", ["b", "l", "heads", "head_dim"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["split_heads"]),
        helper.make_node("Transpose", ["split_heads"], ["scores_layout"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["scores_layout", "merge"], ["merged"]),
        helper.make_node("Concat", ["b", "minus_one", "heads", "head_dim"], ["target_infer"], axis=0),
        helper.make_node("Reshape", ["x", "target_infer"], ["inferred"]),
    ]
    init = {**b_init, **l_init, "axes0": np.array([0], np.int64), "heads": np.array([12], np.int64),
            "head_dim": np.array([64], np.int64), "merge": np.array([0, 0, -1], np.int64),
            "minus_one": np.array([-1], np.int64)}
    return make_model(nodes, [inp("x", ["B", "L", 768])],
                      ["split_heads", "merged", "inferred", out("target", I64)], init)


def test_reshape_target_built_from_shape_arithmetic_gives_symbolic_dims():
    graph = propagate(attention_model(), "L=1:512")
    B, L = syms(graph, "B", "L")
    assert list(graph.values["target"].symdata) == [B, L, 12, 64]
    assert shape_of(graph, "split_heads") == (B, L, 12, 64)
    assert shape_of(graph, "scores_layout") == (B, 12, L, 64)


def test_reshape_zero_copies_and_minus_one_infers_an_exact_symbolic_dim():
    graph = propagate(attention_model(), "L=1:512")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "merged") == (B, 12, 64 * L)
    # -1 = (B*L*768) / (B*12*64), cancelled exactly to the bare symbol
    assert shape_of(graph, "inferred") == (B, L, 12, 64)


def test_reshape_chain_reference_matches_onnxruntime_at_concrete_shapes():
    model = attention_model()
    graph = propagate(model, "L=1:512")
    rng = np.random.default_rng(0)
    for b, l in [(2, 7), (1, 1), (3, 512)]:
        assert_matches_onnxruntime(model, graph, {"x": rng.standard_normal((b, l, 768)).astype(np.float32)})


def test_reshape_with_runtime_target_gets_fresh_dims_of_the_target_rank():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [inp("x", ["B", 6]), inp("shape", [3], I64)], ["y"])
    graph = propagate(model)
    dims = shape_of(graph, "y")
    assert len(dims) == 3 and all(isinstance(d, sympy.Symbol) for d in dims)
    assert len(set(dims)) == 3
    got = run_reference(graph, {"x": np.arange(24, dtype=np.float32).reshape(4, 6),
                                "shape": np.array([2, -1, 3], np.int64)})
    assert got["y"].shape == (2, 4, 3)


def test_reshape_to_rank_one_with_runtime_target_keeps_the_element_count():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [inp("x", ["B", 6]), inp("shape", [1], I64)], ["y"])
    graph = propagate(model)
    (B,) = syms(graph, "B")
    assert shape_of(graph, "y") == (6 * B,)


def test_reshape_element_count_mismatch_is_a_clear_error():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [inp("x", ["B", 768])], ["y"], {"shape": np.array([0, 700], np.int64)})
    with pytest.raises(ShapeError, match="cannot reshape"):
        propagate(model)


def test_reshape_minus_one_that_does_not_divide_is_a_clear_error():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [inp("x", [5, 7])], ["y"], {"shape": np.array([-1, 3], np.int64)})
    with pytest.raises(ShapeError, match="not a multiple"):
        propagate(model)


# --------------------------------------------------------------------------- Shape / Size / Gather values
def test_shape_gather_and_size_carry_symbolic_values():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Shape", ["x"], ["tail"], start=-2),
             helper.make_node("Gather", ["s", "neg"], ["last_two"], axis=0),
             helper.make_node("Size", ["x"], ["n"])]
    model = make_model(nodes, [inp("x", ["B", "L", 768])], [out("s", I64), out("tail", I64),
                                                             out("last_two", I64), out("n", I64)],
                       {"neg": np.array([-1, -2], np.int64)})
    graph = propagate(model, "L=1:512")
    B, L = syms(graph, "B", "L")
    assert list(graph.values["s"].symdata) == [B, L, 768]
    assert list(graph.values["tail"].symdata) == [L, 768]
    assert list(graph.values["last_two"].symdata) == [768, L]
    assert graph.values["n"].symdata[()] == 768 * B * L
    assert_matches_onnxruntime(model, graph, {"x": np.zeros((2, 5, 768), np.float32)})


def test_shape_of_a_static_input_folds_to_a_constant():
    model = make_model([helper.make_node("Shape", ["x"], ["s"])], [inp("x", [2, 3])], [out("s", I64)])
    graph = propagate(model)
    np.testing.assert_array_equal(graph.values["s"].const, [2, 3])


# --------------------------------------------------------------------------- Slice
def slice_position_ids_model():
    """position_ids[1, 512] sliced by [0 : L] where L = Shape(x)[1] (the BERT/GPT-2 pattern)."""
    l_nodes, l_init = shape_gather("l", "x", 1)
    nodes = l_nodes + [helper.make_node("Slice", ["pos", "zero", "l", "one"], ["ids"]),
                       helper.make_node("Slice", ["pos", "minus", "big", "one"], ["tail"])]
    init = {**l_init, "axes0": np.array([0], np.int64), "pos": np.arange(512, dtype=np.int64)[None],
            "zero": np.array([0], np.int64), "one": np.array([1], np.int64),
            "minus": np.array([-3], np.int64), "big": np.array([2**62], np.int64)}
    return make_model(nodes, [inp("x", ["B", "L"], I64)], [out("ids", I64), out("tail", I64)], init)


def test_slice_by_symbolic_end_within_the_declared_range_gives_the_bare_symbol():
    model = slice_position_ids_model()
    graph = propagate(model, "L=1:512")
    (L,) = syms(graph, "L")
    assert shape_of(graph, "ids") == (1, L)
    assert shape_of(graph, "tail") == (1, 3)


def test_slice_by_unbounded_symbolic_end_clamps_with_min():
    graph = propagate(slice_position_ids_model())
    (L,) = syms(graph, "L")
    assert shape_of(graph, "ids") == (1, sympy.Min(512, L))


def test_slice_reference_matches_onnxruntime():
    model = slice_position_ids_model()
    graph = propagate(model, "L=1:512")
    for l in (1, 9, 512):
        assert_matches_onnxruntime(model, graph, {"x": np.zeros((2, l), np.int64)})


def test_slice_with_negative_step_and_symbolic_dims():
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])]
    model = make_model(nodes, [inp("x", ["B", "L"])], ["y"],
                       {"starts": np.array([-1], np.int64), "ends": np.array([-(2**62)], np.int64),
                        "axes": np.array([1], np.int64), "steps": np.array([-2], np.int64)})
    graph = propagate(model, "L=1:512")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "y") == (B, sympy.ceiling(L / 2))
    for l in (1, 2, 7):
        assert_matches_onnxruntime(model, graph, {"x": np.arange(3 * l, dtype=np.float32).reshape(3, l)})


# --------------------------------------------------------------------------- Range, Expand, ConstantOfShape
def test_range_length_is_symbolic():
    l_nodes, l_init = shape_gather("l", "x", 1)
    nodes = l_nodes + [helper.make_node("Squeeze", ["l", "axes0"], ["l0"]),
                       helper.make_node("Range", ["zero", "l0", "one"], ["r1"]),
                       helper.make_node("Range", ["zero", "l0", "two"], ["r2"]),
                       helper.make_node("Range", ["l0", "zero", "minus_three"], ["r3"])]
    init = {**l_init, "axes0": np.array([0], np.int64), "zero": np.array(0, np.int64),
            "one": np.array(1, np.int64), "two": np.array(2, np.int64), "minus_three": np.array(-3, np.int64)}
    model = make_model(nodes, [inp("x", ["B", "L"])], [out("r1", I64), out("r2", I64), out("r3", I64)], init)
    graph = propagate(model, "L=1:512")
    (L,) = syms(graph, "L")
    assert shape_of(graph, "r1") == (L,)
    assert shape_of(graph, "r2") == (sympy.ceiling(L / 2),)
    assert shape_of(graph, "r3") == (sympy.ceiling(L / 3),)
    for l in (1, 2, 11):
        assert_matches_onnxruntime(model, graph, {"x": np.zeros((1, l), np.float32)})


def test_expand_and_constant_of_shape_take_symbolic_shapes():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=numpy_helper.from_array(np.array([1], np.int64))),
             helper.make_node("Expand", ["bias", "s"], ["bias_b"]),
             helper.make_node("Tile", ["bias", "reps"], ["tiled"])]
    model = make_model(nodes, [inp("x", ["B", "L", 4])], [out("ones", I64), "bias_b", "tiled"],
                       {"bias": np.arange(4, dtype=np.float32)[None, None],
                        "reps": np.array([2, 3, 1], np.int64)})
    graph = propagate(model, "L=1:512")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "ones") == (B, L, 4)
    assert graph.values["ones"].dtype == np.int64
    assert shape_of(graph, "bias_b") == (B, L, 4)
    assert shape_of(graph, "tiled") == (2, 3, 4)
    for b, l in ((1, 1), (3, 5)):
        assert_matches_onnxruntime(model, graph, {"x": np.zeros((b, l, 4), np.float32)})


def test_expand_with_runtime_shape_keeps_non_unit_dims_and_invents_the_rest():
    model = make_model([helper.make_node("Expand", ["x", "shape"], ["y"])],
                       [inp("x", [1, "L"]), inp("shape", [3], I64)], ["y"])
    graph = propagate(model, "L=2:64")
    (L,) = syms(graph, "L")
    a, b, c = shape_of(graph, "y")
    assert c == L and isinstance(a, sympy.Symbol) and isinstance(b, sympy.Symbol)
    got = run_reference(graph, {"x": np.ones((1, 5), np.float32), "shape": np.array([2, 3, 1], np.int64)})
    assert got["y"].shape == (2, 3, 5)


# --------------------------------------------------------------------------- Split, Squeeze/Unsqueeze, Concat
def test_split_and_concat_on_symbolic_dims():
    nodes = [helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3),
             helper.make_node("Concat", ["q", "k"], ["qk"], axis=1),
             helper.make_node("Unsqueeze", ["v", "axes"], ["v4"]),
             helper.make_node("Squeeze", ["v4", "axes"], ["v3"])]
    model = make_model(nodes, [inp("qkv", ["B", "L", 2304])], ["qk", "v4", "v3"],
                       {"axes": np.array([1], np.int64)})
    graph = propagate(model, "L=1:512")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "q") == (B, L, 768)
    assert shape_of(graph, "qk") == (B, 2 * L, 768)
    assert shape_of(graph, "v4") == (B, 1, L, 768)
    assert shape_of(graph, "v3") == (B, L, 768)
    assert_matches_onnxruntime(model, graph, {"qkv": np.random.default_rng(1).standard_normal((2, 3, 2304))
                                              .astype(np.float32)})


def test_concat_unifies_the_other_dims():
    model = make_model([helper.make_node("Concat", ["a", "b"], ["c"], axis=0)],
                       [inp("a", ["P", "D"]), inp("b", ["M", "K"])], ["c"])
    graph = propagate(model)
    P, M, D, K = syms(graph, "P", "M", "D", "K")
    assert graph.symbols.canon(D) == graph.symbols.canon(K)
    assert shape_of(graph, "c") == (P + M, graph.symbols.canon(D))


def test_squeeze_of_a_symbolic_dim_forces_it_to_one():
    model = make_model([helper.make_node("Squeeze", ["x", "axes"], ["y"])],
                       [inp("x", ["B", "L"])], ["y"], {"axes": np.array([0], np.int64)})
    graph = propagate(model)
    (L,) = syms(graph, "L")
    assert shape_of(graph, "y") == (L,)
    assert graph.symbols.canon(syms(graph, "B")[0]) == 1


def test_squeeze_without_axes_of_a_maybe_one_dim_is_unsupported():
    model = make_model([helper.make_node("Squeeze", ["x"], ["y"])], [inp("x", ["B", 1])], ["y"])
    with pytest.raises(UnsupportedOperatorError, match="may or may not be 1"):
        propagate(model)


# --------------------------------------------------------------------------- data-dependent and errors
def test_nonzero_gives_a_data_dependent_symbol_bounded_by_the_element_count():
    model = make_model([helper.make_node("NonZero", ["x"], ["idx"])], [inp("x", ["B", 8])],
                       [out("idx", I64)])
    graph = propagate(model, "B=1:4")
    rank, count = shape_of(graph, "idx")
    info = graph.symbols.get(count.name)
    assert rank == 2 and info.origin == "data-dependent"
    assert (info.min, info.max) == (0, 32)
    x = np.array([[0, 1, 0, 2, 0, 0, 3, 0], [1, 0, 0, 0, 0, 0, 0, 4]], np.float32)
    assert_matches_onnxruntime(model, graph, {"x": x})


def test_nonzero_of_a_constant_folds():
    model = make_model([helper.make_node("NonZero", ["c"], ["idx"])], [], [out("idx", I64)],
                       {"c": np.array([[0, 1], [1, 1]], np.int64)})
    graph = propagate(model)
    np.testing.assert_array_equal(graph.values["idx"].const, [[0, 1, 1], [1, 0, 1]])


def test_unsupported_pad_mode_is_reported():
    model = make_model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="mirror")],
                       [inp("x", [2, 3])], ["y"], {"pads": np.array([0, 1, 0, 1], np.int64)})
    with pytest.raises(UnsupportedOperatorError, match="mode 'mirror'"):
        propagate(model)


def test_pad_with_symbolic_input_and_negative_pads_matches_onnxruntime():
    model = make_model([helper.make_node("Pad", ["x", "pads", "value"], ["y"], mode="constant")],
                       [inp("x", ["B", "L"])], ["y"],
                       {"pads": np.array([1, 2, 0, -1], np.int64), "value": np.array(5.0, np.float32)})
    graph = propagate(model, "L=2:64")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "y") == (B + 1, L + 1)
    assert_matches_onnxruntime(model, graph, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)})


# --------------------------------------------------------------------------- opaque ops at concrete shapes
def test_opaque_ops_match_onnxruntime_on_symbolic_inputs():
    nodes = [helper.make_node("Trilu", ["x"], ["lower"], upper=0),
             helper.make_node("CumSum", ["x", "axis"], ["cs"], exclusive=1, reverse=1),
             helper.make_node("OneHot", ["ids", "depth", "onoff"], ["hot"], axis=1),
             helper.make_node("ScatterElements", ["x", "sidx", "upd"], ["sc"], axis=1, reduction="add"),
             helper.make_node("GatherElements", ["x", "sidx"], ["ge"], axis=1),
             helper.make_node("EyeLike", ["x"], ["eye"], k=1),
             helper.make_node("Dropout", ["x"], ["drop", "mask"])]
    model = make_model(nodes, [inp("x", ["B", "L"]), inp("ids", ["B"], I64), inp("sidx", ["B", 2], I64),
                               inp("upd", ["B", 2])],
                       ["lower", "cs", "hot", "sc", "ge", "eye", "drop", out("mask", TensorProto.BOOL)],
                       {"axis": np.array(1, np.int64), "depth": np.array(5, np.int64),
                        "onoff": np.array([0.5, 2.0], np.float32)})
    graph = propagate(model, "L=2:64")
    B, L = syms(graph, "B", "L")
    assert shape_of(graph, "hot") == (B, 5)
    assert shape_of(graph, "mask") == (B, L)
    rng = np.random.default_rng(2)
    for b, l in ((3, 4), (1, 7)):
        feeds = {"x": rng.standard_normal((b, l)).astype(np.float32),
                 "ids": rng.integers(-5, 6, size=b).astype(np.int64),
                 "sidx": rng.integers(-l, l, size=(b, 2)).astype(np.int64),
                 "upd": rng.standard_normal((b, 2)).astype(np.float32)}
        assert_matches_onnxruntime(model, graph, feeds)


def test_opset9_attribute_forms_of_axes_starts_split_and_pads_match_onnxruntime():
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
             helper.make_node("Squeeze", ["u"], ["s"], axes=[0]),
             helper.make_node("Slice", ["x"], ["sl"], starts=[1], ends=[-1], axes=[1]),
             helper.make_node("Split", ["x"], ["p0", "p1"], axis=1, split=[1, 3]),
             helper.make_node("Pad", ["x"], ["pd"], mode="reflect", pads=[0, 1, 0, 2])]
    model = make_model(nodes, [inp("x", ["B", 4])], ["u", "s", "sl", "p0", "p1", "pd"], opset=9)
    graph = propagate(model)
    (B,) = syms(graph, "B")
    assert shape_of(graph, "u") == (1, B, 4, 1)
    assert shape_of(graph, "sl") == (B, 2)
    assert shape_of(graph, "pd") == (B, 7)
    assert_matches_onnxruntime(model, graph, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)})


def test_a_minus_one_that_halves_a_symbolic_dim_is_its_floor_with_a_checked_relation():
    # pixel_unshuffle as TorchScript exports it: [B, C, H, 1, W] -> [0, 0, -1, 2, 0] is H / 2, whole
    # only for an even H: the dim is floor(H/2) and "H == 2 floor(H/2)" is recorded for the runtime
    model = make_model([helper.make_node("Unsqueeze", ["x", "ax"], ["u"]),
                        helper.make_node("Reshape", ["u", "t"], ["y"])],
                       [inp("x", ["B", 4, "H", "W"])], ["y"],
                       {"ax": np.array([3], np.int64), "t": np.array([0, 0, -1, 2, 0], np.int64)})
    g = propagate(model, "B=1:4", "H=2:24", "W=1:8")
    B, H, W = syms(g, "B", "H", "W")
    assert shape_of(g, "y") == (B, 4, sympy.floor(H / 2), 2, W)
    assert any(c.lhs == H and c.rhs == 2 * sympy.floor(H / 2) for c in g.symbols.constraints)
    x = np.random.default_rng(0).standard_normal((2, 4, 6, 3)).astype(np.float32)
    assert_matches_onnxruntime(model, g, {"x": x})


@pytest.mark.parametrize("op,attrs,dims,want", [
    ("DepthToSpace", {"blocksize": 2}, ["B", 12, "H", "W"], lambda B, H, W: (B, 3, 2 * H, 2 * W)),
    ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, ["B", 12, "H", "W"], lambda B, H, W: (B, 3, 2 * H, 2 * W)),
    ("SpaceToDepth", {"blocksize": 3}, ["B", 2, "H", "W"],
     lambda B, H, W: (B, 18, sympy.floor(H / 3), sympy.floor(W / 3))),
])
def test_depth_space_rearrangements_have_symbolic_shapes_and_match_onnxruntime(op, attrs, dims, want):
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [inp("x", dims)], ["y"], opset=13)
    g = propagate(model, "B=1:4", "H=3:30", "W=3:30")
    assert shape_of(g, "y") == want(*syms(g, "B", "H", "W"))
    x = np.random.default_rng(1).standard_normal((2, dims[1], 9, 6)).astype(np.float32)
    assert_matches_onnxruntime(model, g, {"x": x})


def test_depth_to_space_needs_whole_blocks_of_channels():
    model = make_model([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2)], [inp("x", ["B", 6, "H", "W"])],
                       ["y"], opset=13)
    with pytest.raises(ShapeError, match="multiple of blocksize"):
        propagate(model, "B=1:4", "H=3:30", "W=3:30")


def test_a_minus_one_beside_exact_quotients_is_the_quotient_without_the_floors():
    # pixel_unshuffle as dynamo exports it: [-1, C, H // 2, 2, W // 2, 2] of [B, C, H, W] (the halves are
    # int64 Divs of Shape): the -1 is B where H and W are even, which is checked per binding
    s = [helper.make_node("Shape", ["x"], [f"s{i}"], start=i, end=i + 1) for i in (2, 3)]
    model = make_model(s + [helper.make_node("Div", ["s2", "two"], ["h2"]), helper.make_node("Div", ["s3", "two"], ["w2"]),
                            helper.make_node("Concat", ["m1", "c", "h2", "two", "w2", "two"], ["t"], axis=0),
                            helper.make_node("Reshape", ["x", "t"], ["y"])],
                       [inp("x", ["B", 4, "H", "W"])], ["y"],
                       {"two": np.array([2], np.int64), "m1": np.array([-1], np.int64), "c": np.array([4], np.int64)})
    g = propagate(model, "B=1:4", "H=2:24", "W=2:24")
    B, H, W = syms(g, "B", "H", "W")
    assert shape_of(g, "y") == (B, 4, sympy.floor(H / 2), 2, sympy.floor(W / 2), 2)
    assert any(c.relation == "==" and "must be whole" in c.reason for c in g.symbols.constraints)
    x = np.random.default_rng(2).standard_normal((3, 4, 6, 10)).astype(np.float32)
    assert_matches_onnxruntime(model, g, {"x": x})
