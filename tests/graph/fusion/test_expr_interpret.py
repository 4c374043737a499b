"""The fused-group expression IR (walk, prologue/epilogue split), view index maps, and the Plan
interpreter's handling of symbolic constants."""
from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import DimSpec, import_model, propagate_shapes, simplify
from tscomp.graph.fusion import fuse, run_plan
from tscomp.graph.fusion.expr import Const, Input, Op, split_prologue_epilogue, walk
from tscomp.graph.ops.registry import FusionClass
from tscomp.graph.views import ViewOp, apply_view, expand, onnx_slice, permute, reshape, slice_view

L = sympy.Symbol("L", integer=True, positive=True)
F32 = np.dtype(np.float32)


def op(op_type, *args, fusion=FusionClass.ELEMENTWISE, shape=(L, 8)):
    return Op(shape, F32, op_type=op_type, args=args, fusion=fusion, node=op_type.lower(), opset=17)


def test_walk_visits_shared_subexpressions_once_children_before_parents():
    x = Input((L, 8), F32, name="x")
    r = op("Relu", x)
    y = op("Add", r, op("Exp", r))
    order = list(walk([y, r]))
    assert len(order) == len({id(e) for e in order}) == 4
    assert all(order.index(c) < order.index(e) for e in order for c in e.children())


def test_prologue_is_what_feeds_the_backbone_and_the_rest_is_epilogue():
    x = Input((L, 8), F32, name="x")
    w = Input((8, 8), F32, name="w")
    scaled = op("Mul", x, Const((), F32, value=np.array(0.5, np.float32)))
    mm = op("MatMul", scaled, w, fusion=FusionClass.BACKBONE)
    side = op("Relu", x)                         # reads the group's input, feeds only the epilogue
    y = op("Add", mm, side)
    pro, heavy, epi = split_prologue_epilogue([y])
    assert (pro, heavy) == ([scaled], [mm])
    assert {id(e) for e in epi} == {id(side), id(y)}


def test_a_group_without_heavy_op_is_all_epilogue():
    x = Input((L, 8), F32, name="x")
    y = op("Neg", op("Abs", x))
    pro, heavy, epi = split_prologue_epilogue([y])
    assert (pro, heavy, [e.op_type for e in epi]) == ([], [], ["Abs", "Neg"])


def test_stitched_reductions_put_the_backbone_first_among_heavy_ops():
    x = Input((L, 8), F32, name="x")
    w = Input((8, 8), F32, name="w")
    mm = op("MatMul", x, w, fusion=FusionClass.BACKBONE)
    ln = op("LayerNormalization", op("Add", mm, x), fusion=FusionClass.REDUCTION)
    pro, heavy, epi = split_prologue_epilogue([ln])
    assert (pro, [e.op_type for e in heavy], [e.op_type for e in epi]) == ([], ["MatMul", "LayerNormalization"],
                                                                          ["Add"])


# ----------------------------------------------------------------------------- views
def test_view_chain_reshape_permute_expand_matches_numpy():
    binding = {"L": 6}
    ev = lambda e: int(sympy.sympify(e).subs({L: binding["L"]}))
    arr = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    heads = reshape((L, 2, 4))
    out = apply_view(arr, heads, ev)
    out = apply_view(out, permute((1, 0, 2), heads.shape), ev)
    out = apply_view(out, expand((3, 2, L, 4)), ev)
    np.testing.assert_array_equal(out, np.broadcast_to(arr.reshape(6, 2, 4).transpose(1, 0, 2), (3, 2, 6, 4)))
    assert permute((1, 0, 2), heads.shape).shape == (2, L, 4)


def _slice_session():
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])] + [
        helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("starts", "ends", "steps")]
    graph = helper.make_graph(nodes, "s", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([0], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


BIG = 2 ** 63 - 1


def test_onnx_slice_clamps_like_onnxruntime():
    """Every start/end/step class, on axes of size 1 and 5. Left out: ``end`` of INT32_MAX/INT64_MAX
    with a negative step, which onnxruntime reads as "to the beginning" while the ONNX spec (and
    onnx.reference, and :func:`onnx_slice`) clamp it to dim - 1, giving an empty slice."""
    session = _slice_session()
    bounds = (-BIG - 1, -2 ** 31, -9, -5, -1, 0, 1, 3, 5, 9, 2 ** 31 - 1, BIG)
    for dim, start, end, step in itertools.product((1, 5), bounds, bounds, (-3, -1, 1, 2)):
        if step < 0 and end in (2 ** 31 - 1, BIG):
            continue
        x = np.arange(dim, dtype=np.float32)
        (want,) = session.run(None, {"x": x, "starts": np.array([start]), "ends": np.array([end]),
                                     "steps": np.array([step])})
        got = x[onnx_slice(dim, start, end, step)]
        np.testing.assert_array_equal(got, want, err_msg=f"dim={dim} start={start} end={end} step={step}")


def test_slice_view_with_symbolic_end_evaluates_at_the_binding():
    arr = np.arange(20, dtype=np.float32).reshape(10, 2)
    view = slice_view((L - 1, 2), [(0, sympy.Integer(1), L, sympy.Integer(1))])
    got = apply_view(arr, view, lambda e: int(sympy.sympify(e).subs({L: 4})))
    np.testing.assert_array_equal(got, arr[1:4])


def test_unknown_view_kind_is_an_error():
    with pytest.raises(ValueError, match="bogus"):
        apply_view(np.zeros(2), ViewOp("bogus", (2,)), int)


# ----------------------------------------------------------------------------- interpreter
def test_symbolic_shape_value_is_an_inlined_const_evaluated_at_the_binding():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="s"),
             helper.make_node("Gather", ["s", "one"], ["l"], name="l", axis=0),
             helper.make_node("Add", ["ids", "l"], ["y"], name="y")]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "L"]),
           helper.make_tensor_value_info("ids", TensorProto.INT64, ["B"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
                          [numpy_helper.from_array(np.array(1, np.int64), "one")]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    graph = import_model(model, [DimSpec.parse("B=1:8"), DimSpec.parse("L=1:512")])
    propagate_shapes(graph)
    simplify(graph)
    plan = fuse(graph)
    assert len(plan.groups) == 1 and plan.groups[0].inputs == ["ids"]
    consts = [e for e in walk(plan.groups[0].outputs.values()) if isinstance(e, Const)]
    assert len(consts) == 1 and consts[0].symbolic
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, seq in ((1, 1), (3, 7), (2, 509)):
        feeds = {"x": np.zeros((b, seq), np.float32), "ids": np.arange(b, dtype=np.int64)}
        np.testing.assert_array_equal(run_plan(plan, feeds)["y"], session.run(None, feeds)[0])

