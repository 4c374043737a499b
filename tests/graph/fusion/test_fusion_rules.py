"""Every fusion rule of :mod:`tscomp.graph.fusion.partition` (TSCompiler §4.2, Fig. 3) on a small
ONNX graph with symbolic dims: the group structure the rule produces, and the Plan's numerics
(``run_plan``, interpreting each group's expression IR) against onnxruntime at concrete shapes
including 1 and primes."""
from __future__ import annotations

import math
import pathlib

import networkx as nx
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import DimSpec, import_model, propagate_shapes, simplify
from tscomp.graph.fusion import RULES, fuse, run_plan

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RANGES = {"B": "1:8", "L": "1:512"}
#: concrete bindings: 1, primes, and a mix
SHAPES = ({"B": 1, "L": 1}, {"B": 2, "L": 7}, {"B": 3, "L": 31})
X = [("x", F, ["B", "L", 64])]

_rng = np.random.default_rng(0)


def rand(*shape, scale=1.0):
    return (_rng.standard_normal(shape) * scale).astype(np.float32)


def scalar(v):
    return np.array(v, np.float32)


def ints(*values):
    return np.array(values, np.int64)


# ----------------------------------------------------------------------------- helpers
def node(op, inputs, output, **attrs):
    """One ONNX node, named after its (first) output so tests can name nodes by value."""
    outputs = [output] if isinstance(output, str) else list(output)
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def build(nodes, inputs, initializers=None, outputs=None, opset=17):
    """A model: ``inputs`` as (name, elem type, dims with dim_params), float outputs (default: the
    last node's output)."""
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(o, F, None) for o in (outputs or [nodes[-1].output[0]])]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in (initializers or {}).items()]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def compile_plan(model, *, horizontal=True):
    params = sorted({d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim
                     if d.dim_param})
    graph = import_model(model, [DimSpec.parse(f"{p}={RANGES[p]}") for p in params])
    propagate_shapes(graph)
    simplify(graph)
    return fuse(graph, horizontal=horizontal)


def make_inputs(model, binding, int_high):
    feeds = {}
    for vi in model.graph.input:
        tt = vi.type.tensor_type
        shape = [binding[d.dim_param] if d.dim_param else d.dim_value for d in tt.shape.dim]
        if tt.elem_type == I64:
            feeds[vi.name] = _rng.integers(0, int_high, size=shape, dtype=np.int64)
        else:
            feeds[vi.name] = rand(*shape)
    return feeds


def check_numerics(model, plan, shapes=SHAPES, *, int_high=2, feeds=None):
    """run_plan == onnxruntime (fp32, rtol/atol 1e-4) at every binding in ``shapes``."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for binding in shapes:
        inputs = feeds(binding) if feeds else make_inputs(model, binding, int_high)
        want = dict(zip((o.name for o in session.get_outputs()), session.run(None, inputs)))
        got = run_plan(plan, inputs)
        for name, expected in want.items():
            np.testing.assert_allclose(got[name], expected, rtol=1e-4, atol=1e-4,
                                       err_msg=f"output {name} at {binding}")


def group_of(plan, node_name):
    found = [g for g in plan.groups if node_name in g.nodes]
    assert len(found) == 1, f"{node_name} is in {[g.name for g in found]}"
    return found[0]


def op_nodes(ops):
    return [o.node for o in ops]


def assert_topological(plan):
    """Groups run in an order where every crossing tensor is written before it is read, and the
    group DAG is acyclic."""
    writer = {v: g.name for g in plan.groups for v in g.outputs}
    dag = nx.DiGraph()
    dag.add_nodes_from(g.name for g in plan.groups)
    written = set()
    for g in plan.groups:
        for v in g.inputs:
            if v in writer:
                assert v in written, f"{g.name} reads {v} before {writer[v]} writes it"
                dag.add_edge(writer[v], g.name)
        written |= set(g.outputs)
    assert nx.is_directed_acyclic_graph(dag)


def linear(x, out, w, b=None):
    """MatMul (+ bias Add) nodes named ``out + '_mm'`` / ``out``."""
    if b is None:
        return [node("MatMul", [x, w], out)]
    return [node("MatMul", [x, w], out + "_mm"), node("Add", [out + "_mm", b], out)]


def test_every_rule_is_asserted_on_in_this_module():
    source = pathlib.Path(__file__).read_text()
    assert [r.name for r in RULES if f'"{r.name}"' not in source] == []


# ----------------------------------------------------------------------------- gemm-epilogue
def gelu_erf(x, y):
    return [node("Div", [x, "sqrt2"], y + "_div"), node("Erf", [y + "_div"], y + "_erf"),
            node("Add", [y + "_erf", "one"], y + "_1p"), node("Mul", [x, y + "_1p"], y + "_mul"),
            node("Mul", [y + "_mul", "half"], y)]


def gelu_tanh(x, y):
    return [node("Pow", [x, "three"], y + "_cube"), node("Mul", [y + "_cube", "c"], y + "_c3"),
            node("Add", [x, y + "_c3"], y + "_in"), node("Mul", [y + "_in", "k"], y + "_k"),
            node("Tanh", [y + "_k"], y + "_tanh"), node("Add", [y + "_tanh", "one"], y + "_1p"),
            node("Mul", [x, y + "_1p"], y + "_mul"), node("Mul", [y + "_mul", "half"], y)]


GELU_CONSTS = {"sqrt2": scalar(math.sqrt(2)), "one": scalar(1), "half": scalar(0.5), "three": scalar(3),
               "c": scalar(0.044715), "k": scalar(math.sqrt(2 / math.pi))}


@pytest.mark.parametrize("gelu", [gelu_erf, gelu_tanh], ids=["erf", "tanh"])
def test_bias_and_gelu_fuse_into_gemm_epilogue(gelu):
    nodes = linear("x", "h", "w", "b") + gelu("h", "y")
    model = build(nodes, X, {"w": rand(64, 64, scale=0.2), "b": rand(64), **GELU_CONSTS})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.backbone, g.rules) == ("gemm", "MatMul", ["gemm-epilogue"])
    assert sorted(g.nodes) == sorted(n.name for n in nodes)
    pro, heavy, epi = g.prologue_epilogue()
    assert pro == [] and op_nodes(heavy) == ["h_mm"]
    assert sorted(op_nodes(epi)) == sorted(n.name for n in nodes[1:])
    assert "Erf" in [o.op_type for o in epi] or "Tanh" in [o.op_type for o in epi]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_relu_residual_and_scale_fuse_into_gemm_epilogue():
    nodes = linear("x", "h", "w", "b") + [node("Relu", ["h"], "r"), node("Add", ["r", "x"], "res"),
                                          node("Mul", ["res", "s"], "y")]
    model = build(nodes, X, {"w": rand(64, 64), "b": rand(64), "s": scalar(0.125)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert g.rules == ["gemm-epilogue"] and set(g.inputs) == {"x", "w"}  # the bias is inlined
    _, heavy, epi = g.prologue_epilogue()
    assert op_nodes(heavy) == ["h_mm"]
    assert [o.op_type for o in epi] == ["Add", "Relu", "Add", "Mul"]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_onnx_gemm_with_trans_b_and_bias_takes_a_relu_epilogue():
    model = build([node("Gemm", ["a", "w", "c"], "mm", transB=1), node("Relu", ["mm"], "y")],
                  [("a", F, ["L", 64])], {"w": rand(32, 64), "c": rand(32)})
    plan = compile_plan(model)
    assert [(g.kind, g.backbone, g.rules, g.nodes) for g in plan.groups] == [
        ("gemm", "Gemm", ["gemm-epilogue"], ["mm", "y"])]
    check_numerics(model, plan)


def test_attention_mask_broadcast_onto_scores_fuses_into_gemm_epilogue():
    nodes = [node("MatMul", ["q", "k"], "scores"), node("Mul", ["scores", "s"], "scaled"),
             node("Add", ["scaled", "mask"], "y")]
    model = build(nodes, [("q", F, ["B", 4, "L", 16]), ("k", F, ["B", 4, 16, "L"]),
                          ("mask", F, ["B", 1, 1, "L"])], {"s": scalar(0.25)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.rules, set(g.nodes)) == ("gemm", ["gemm-epilogue"], {"scores", "scaled", "y"})
    assert "mask" in g.inputs and [str(d) for d in g.iteration_space()] == ["B", "4", "L", "L"]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_head_transpose_after_gemm_is_absorbed_as_views_in_the_epilogue():
    nodes = linear("x", "h", "w", "b") + [node("Reshape", ["h", "heads"], "split_heads"),
                                          node("Transpose", ["split_heads"], "t", perm=[0, 2, 1, 3]),
                                          node("Mul", ["t", "s"], "y")]
    model = build(nodes, X, {"w": rand(64, 64), "b": rand(64), "heads": ints(0, 0, 4, 16),
                             "s": scalar(0.25)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert {"split_heads", "t"} <= set(g.nodes) and g.rules == ["gemm-epilogue"]
    _, _, epi = g.prologue_epilogue()
    assert [o.op_type for o in epi] == ["Add", "Mul"]  # the views are index maps, not ops
    assert [str(d) for d in g.outputs["y"].shape] == ["B", "4", "L", "16"]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_head_transposed_graph_output_is_written_by_a_copy_group():
    """A view that is itself a graph output must be materialized: the GEMM writes its own
    layout and an output-copy group writes the transposed one."""
    nodes = linear("x", "h", "w", "b") + [node("Reshape", ["h", "heads"], "split_heads"),
                                          node("Transpose", ["split_heads"], "y", perm=[0, 2, 1, 3])]
    model = build(nodes, X, {"w": rand(64, 64), "b": rand(64), "heads": ints(0, 0, 4, 16)})
    plan = compile_plan(model)
    assert [(g.kind, g.rules) for g in plan.groups] == [("gemm", ["gemm-epilogue"]),
                                                       ("elementwise", ["output-copy"])]
    assert set(plan.groups[1].nodes) == {"split_heads", "y"} and plan.groups[1].inputs == ["h"]
    assert plan.crossing_values() == ["h", "y"]
    check_numerics(model, plan)


# ----------------------------------------------------------------------------- gemm-prologue
def test_single_use_scale_on_an_operand_fuses_into_gemm_prologue():
    nodes = [node("Mul", ["x", "s"], "xs")] + linear("xs", "y", "w")
    model = build(nodes, X, {"w": rand(64, 64), "s": scalar(0.5)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.rules, set(g.nodes)) == ("gemm", ["gemm-prologue"], {"xs", "y"})
    pro, heavy, epi = g.prologue_epilogue()
    assert (op_nodes(pro), op_nodes(heavy), epi) == (["xs"], ["y"], [])
    assert g.inputs == ["x", "w"] and plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_producer_shared_by_two_gemms_is_not_absorbed_and_crosses_groups():
    nodes = ([node("Mul", ["x", "s"], "xs")] + linear("xs", "y1", "w1") + linear("xs", "y2", "w2")
             + [node("Add", ["y1", "y2"], "y")])
    model = build(nodes, X, {"w1": rand(64, 64), "w2": rand(64, 64), "s": scalar(0.5)})
    plan = compile_plan(model, horizontal=False)
    assert group_of(plan, "xs").kind == "elementwise"
    assert group_of(plan, "xs") is not group_of(plan, "y1") and group_of(plan, "xs") is not group_of(plan, "y2")
    assert all("gemm-prologue" not in g.rules for g in plan.groups)
    assert "xs" in plan.crossing_values()
    assert group_of(plan, "y1").inputs[0] == "xs" and group_of(plan, "y2").inputs[0] == "xs"
    assert_topological(plan)
    check_numerics(model, plan)


def test_scale_on_the_k_operand_read_through_a_transpose_fuses_into_gemm_prologue():
    nodes = [node("Mul", ["k", "s"], "ks"), node("Transpose", ["ks"], "kt", perm=[0, 1, 3, 2]),
             node("MatMul", ["q", "kt"], "y")]
    model = build(nodes, [("q", F, ["B", 4, "L", 16]), ("k", F, ["B", 4, "L", 16])], {"s": scalar(0.25)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.rules, sorted(g.nodes)) == (["gemm-prologue"], ["ks", "kt", "y"])
    pro, heavy, epi = g.prologue_epilogue()
    assert (op_nodes(pro), op_nodes(heavy), epi) == (["ks"], ["y"], [])
    check_numerics(model, plan)


def test_producer_of_an_epilogue_operand_is_not_labelled_gemm_prologue():
    """Relu(z) feeds the residual Add, not the MatMul; with K == N == 32 it has an operand's size.
    (With K != N the same graph gives two groups and no gemm-prologue.)"""
    nodes = linear("x", "mm", "w") + [node("Relu", ["z"], "r"), node("Add", ["mm", "r"], "y")]
    model = build(nodes, [("x", F, ["B", "L", 32]), ("z", F, ["B", "L", 32])], {"w": rand(32, 32)})
    plan = compile_plan(model)
    check_numerics(model, plan)
    g = group_of(plan, "mm")
    pro, _, _ = g.prologue_epilogue()
    assert ("gemm-prologue" in g.rules) == bool(pro)


# ----------------------------------------------------------------------------- gemm-row-reduction
def test_output_projection_bias_residual_and_layernorm_form_one_gemm_group():
    nodes = linear("x", "h", "w", "b") + [
        node("Add", ["h", "x"], "res"),
        node("LayerNormalization", ["res", "gamma", "beta"], "y", axis=-1, epsilon=1e-5)]
    model = build(nodes, X, {"w": rand(64, 64, scale=0.2), "b": rand(64), "gamma": rand(64), "beta": rand(64)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.backbone) == ("gemm", "MatMul")
    assert g.rules == ["gemm-epilogue", "gemm-row-reduction"]
    pro, heavy, epi = g.prologue_epilogue()
    assert pro == [] and [o.op_type for o in heavy] == ["MatMul", "LayerNormalization"]
    assert op_nodes(epi) == ["h", "res"]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_softmax_over_dynamic_n_scores_is_not_a_gemm_row_reduction():
    nodes = [node("MatMul", ["q", "k"], "scores"), node("Softmax", ["scores"], "y", axis=-1)]
    model = build(nodes, [("q", F, ["B", 4, "L", 16]), ("k", F, ["B", 4, 16, "L"])])
    plan = compile_plan(model)
    assert [(g.kind, g.backbone, g.nodes) for g in plan.groups] == [
        ("gemm", "MatMul", ["scores"]), ("reduce", "Softmax", ["y"])]
    assert all("gemm-row-reduction" not in g.rules for g in plan.groups)
    assert plan.crossing_values() == ["scores", "y"]
    check_numerics(model, plan)


@pytest.mark.parametrize("reduction", ["Softmax", "ReduceSum"])
def test_reduction_over_the_gemm_m_axis_is_not_a_row_reduction(reduction):
    extra = {"axis": 1} if reduction == "Softmax" else {"keepdims": 1}
    inputs = ["mm"] if reduction == "Softmax" else ["mm", "axes"]
    nodes = linear("x", "mm", "w") + [node(reduction, inputs, "y", **extra)]
    model = build(nodes, [("x", F, ["B", 64, 32])], {"w": rand(32, 64), "axes": ints(1)})
    plan = compile_plan(model)
    check_numerics(model, plan)  # the interpreter is numpy: right either way
    assert all("gemm-row-reduction" not in g.rules for g in plan.groups)
    assert group_of(plan, "y") is not group_of(plan, "mm")


def test_epilogue_after_a_gemm_row_reduction_joins_the_group():
    nodes = linear("x", "mm", "w") + [
        node("LayerNormalization", ["mm", "gamma", "beta"], "ln", axis=-1, epsilon=1e-5),
        node("Mul", ["ln", "s"], "y")]
    model = build(nodes, X, {"w": rand(64, 64), "gamma": rand(64), "beta": rand(64), "s": scalar(3)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    assert plan.groups[0].rules == ["gemm-row-reduction", "gemm-epilogue"]
    assert op_nodes(plan.groups[0].prologue_epilogue()[2]) == ["y"]
    check_numerics(model, plan)


# ----------------------------------------------------------------------------- reduce-level rules
def test_embedding_gather_and_position_add_fuse_into_layernorm_prologue():
    nodes = [node("Gather", ["word_table", "ids"], "word"),
             node("Shape", ["ids"], "ids_shape"), node("Gather", ["ids_shape", "one"], "seq", axis=0),
             node("Unsqueeze", ["seq", "zero"], "seq_end"),
             node("Slice", ["pos_table", "zero", "seq_end"], "pos"),
             node("Add", ["word", "pos"], "emb"),
             node("LayerNormalization", ["emb", "gamma", "beta"], "y", axis=-1, epsilon=1e-5)]
    model = build(nodes, [("ids", I64, ["B", "L"])],
                  {"word_table": rand(50, 64), "pos_table": rand(512, 64), "one": ints(1)[0],
                   "zero": ints(0), "gamma": rand(64), "beta": rand(64)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.backbone, g.rules) == ("reduce", "LayerNormalization", ["reduce-prologue"])
    assert {"word", "emb", "y", "pos"} <= set(g.nodes)   # the Slice of the table is a view
    pro, heavy, epi = g.prologue_epilogue()
    assert ([o.op_type for o in pro], op_nodes(heavy), epi) == (["Gather", "Add"], ["y"], [])
    assert set(g.inputs) == {"ids", "word_table", "pos_table"}
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan, int_high=50)


def test_nan_guard_after_softmax_fuses_into_reduce_epilogue():
    nodes = [node("Softmax", ["x"], "p", axis=-1), node("IsNaN", ["p"], "nan"),
             node("Where", ["nan", "zero", "p"], "y")]
    model = build(nodes, X, {"zero": scalar(0)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.backbone, g.rules) == ("reduce", "Softmax", ["reduce-epilogue"])
    pro, heavy, epi = g.prologue_epilogue()
    assert (pro, op_nodes(heavy), op_nodes(epi)) == ([], ["p"], ["nan", "y"])

    def masked_rows(binding):  # a fully masked row makes Softmax NaN, which the guard zeroes
        x = rand(binding["B"], binding["L"], 64)
        x[:, 0, :] = -np.inf
        return {"x": x}
    check_numerics(model, plan, feeds=masked_rows)


def test_decomposed_layernorm_stitches_both_reductions_into_one_group():
    nodes = [node("ReduceMean", ["x"], "mean", axes=[-1]), node("Sub", ["x", "mean"], "centered"),
             node("Pow", ["centered", "two"], "sq"), node("ReduceMean", ["sq"], "var", axes=[-1]),
             node("Add", ["var", "eps"], "var_eps"), node("Sqrt", ["var_eps"], "std"),
             node("Div", ["centered", "std"], "normed"), node("Mul", ["normed", "gamma"], "scaled"),
             node("Add", ["scaled", "beta"], "y")]
    model = build(nodes, X, {"two": scalar(2), "eps": scalar(1e-5), "gamma": rand(64), "beta": rand(64)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert g.kind == "reduce" and sorted(g.nodes) == sorted(n.name for n in nodes)
    assert set(g.rules) == {"reduce-epilogue", "reduce-stitch"}
    _, heavy, epi = g.prologue_epilogue()
    assert op_nodes(heavy) == ["mean", "var"]
    assert sorted(op_nodes(epi)) == sorted(n.name for n in nodes if n.op_type != "ReduceMean")
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


@pytest.mark.parametrize("second", ["ReduceMean", "Softmax"])
def test_reductions_over_different_axes_are_not_stitched(second):
    nodes = [node("ReduceMean", ["x"], "mean", axes=[-1]), node("Sub", ["x", "mean"], "centered"),
             node(second, ["centered"], "y", axes=[1]) if second == "ReduceMean"
             else node(second, ["centered"], "y", axis=1)]
    model = build(nodes, [("x", F, ["B", "L", "L"])])
    plan = compile_plan(model)
    check_numerics(model, plan)
    assert group_of(plan, "y") is not group_of(plan, "mean")
    assert all("reduce-stitch" not in g.rules for g in plan.groups)


def test_a_reduction_over_leading_axes_stays_alone_for_the_index_family():
    """SwiftFormer's token sum: x * w -> ReduceSum over axis 1 -> + b. The row kernel reduces only
    trailing axes, so nothing is stitched to the reduction (fused, the group had no family and ran
    on numpy); alone, the index family's any-axes kernel compiles it."""
    from tscomp.codegen.families import choose_family
    nodes = [node("Mul", ["x", "w"], "xw"), node("ReduceSum", ["xw", "axes"], "s", keepdims=1),
             node("Add", ["s", "b"], "y")]
    model = build(nodes, X, {"w": rand(64), "axes": ints(1), "b": rand(64)})
    plan = compile_plan(model)
    check_numerics(model, plan)
    reduce_group = group_of(plan, "s")
    assert reduce_group.nodes == ["s"] and group_of(plan, "xw") is not reduce_group
    assert choose_family(plan, reduce_group).family.name == "index"


# ----------------------------------------------------------------------------- elementwise / opaque
def test_attention_mask_chain_forms_one_elementwise_group():
    nodes = [node("Unsqueeze", ["mask", "ax1"], "m1"), node("Unsqueeze", ["m1", "ax2"], "m2"),
             node("Cast", ["m2"], "mf", to=F), node("Sub", ["one", "mf"], "inv"),
             node("Mul", ["inv", "big"], "y")]
    model = build(nodes, [("mask", I64, ["B", "L"])],
                  {"ax1": ints(1), "ax2": ints(2), "one": scalar(1), "big": scalar(-1e4)})
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert (g.kind, g.backbone, g.rules) == ("elementwise", None, ["elementwise-consumer"])
    assert sorted(g.nodes) == sorted(n.name for n in nodes)
    assert [o.op_type for o in g.ops()] == ["Cast", "Sub", "Mul"]
    assert [str(d) for d in g.outputs["y"].shape] == ["B", "1", "1", "L"]
    assert plan.crossing_values() == ["y"]
    check_numerics(model, plan)


def test_sibling_producer_of_an_elementwise_consumer_joins_its_group():
    nodes = [node("Cast", ["a"], "af", to=F), node("Cast", ["b"], "bf", to=F),
             node("Add", ["af", "bf"], "y")]
    model = build(nodes, [("a", I64, ["B", "L"]), ("b", I64, ["B", "L"])])
    plan = compile_plan(model)
    assert len(plan.groups) == 1
    assert plan.groups[0].rules == ["elementwise-consumer", "elementwise-producer"]
    assert sorted(plan.groups[0].nodes) == ["af", "bf", "y"]
    check_numerics(model, plan, int_high=5)


def test_elementwise_consumer_that_broadcasts_into_a_larger_space_is_not_absorbed():
    nodes = [node("Cast", ["mask"], "mf", to=F), node("Unsqueeze", ["mf", "ax"], "mu"),
             node("Add", ["x", "mu"], "y")]
    model = build(nodes, [("mask", I64, ["B", "L"]), ("x", F, ["B", "L", 64])], {"ax": ints(2)})
    plan = compile_plan(model)
    assert [g.nodes for g in plan.groups] == [["mf"], ["y", "mu"]]
    assert plan.crossing_values() == ["mf", "y"]
    check_numerics(model, plan)


@pytest.mark.parametrize("opaque", ["CumSum", "Range"])
def test_opaque_operator_runs_as_a_group_of_its_own(opaque):
    if opaque == "CumSum":
        nodes = [node("Relu", ["x"], "r"), node("CumSum", ["r", "axis"], "op"), node("Mul", ["op", "s"], "y")]
        model = build(nodes, X, {"axis": ints(1)[0], "s": scalar(2)})
    else:
        nodes = [node("Relu", ["x"], "r"), node("Range", ["zero", "n", "step"], "op"),
                 node("Cast", ["op"], "opf", to=F), node("Mul", ["opf", "s"], "y")]
        model = build(nodes, [("x", F, ["B", "L", 64]), ("n", I64, [])],
                      {"zero": ints(0)[0], "step": ints(1)[0], "s": scalar(2)}, outputs=["r", "y"])
    plan = compile_plan(model)
    g = group_of(plan, "op")
    assert (g.kind, g.nodes, g.rules) == ("opaque", ["op"], [])
    assert group_of(plan, "r") is not g and group_of(plan, "y") is not g
    assert "op" in plan.crossing_values()
    assert_topological(plan)
    if opaque == "CumSum":
        check_numerics(model, plan)
    else:
        check_numerics(model, plan, feeds=lambda b: {"x": rand(b["B"], b["L"], 64),
                                                      "n": np.array(b["L"], np.int64)})


# ----------------------------------------------------------------------------- views
def test_transpose_between_two_gemms_is_a_view_in_the_consumer():
    nodes = linear("x", "k", "w") + [node("Transpose", ["k"], "kt", perm=[0, 2, 1]),
                                     node("MatMul", ["x", "kt"], "y")]
    model = build(nodes, X, {"w": rand(64, 64)})
    plan = compile_plan(model)
    assert [(g.kind, sorted(g.nodes)) for g in plan.groups] == [("gemm", ["k"]), ("gemm", ["kt", "y"])]
    assert "kt" not in plan.crossing_values() and plan.crossing_values() == ["k", "y"]
    assert plan.groups[1].inputs == ["x", "k"]
    check_numerics(model, plan)


# ----------------------------------------------------------------------------- horizontal fusion
def qkv_nodes(with_bias=True):
    nodes, weights = [], {}
    for p in "qkv":
        nodes += linear("x", p, "w" + p, "b" + p if with_bias else None)
        weights["w" + p] = rand(64, 64, scale=0.125)
        if with_bias:
            weights["b" + p] = rand(64)
    nodes += [node("Reshape", [p, "heads"], p + "_h") for p in "qkv"]
    nodes += [node("Transpose", ["q_h"], "q_t", perm=[0, 2, 1, 3]),
              node("Transpose", ["k_h"], "k_t", perm=[0, 2, 3, 1]),
              node("Transpose", ["v_h"], "v_t", perm=[0, 2, 1, 3]),
              node("MatMul", ["q_t", "k_t"], "scores"), node("MatMul", ["scores", "v_t"], "y")]
    weights["heads"] = ints(0, 0, 4, 16)
    return nodes, weights


@pytest.mark.parametrize("opset", [17, 20])
def test_qkv_projections_become_one_gemm_with_merged_bias_read_through_split_views(opset):
    nodes, weights = qkv_nodes()
    model = build(nodes, X, weights, opset=opset)
    plan = compile_plan(model)
    assert len(plan.rewrites) == 1
    assert "q_mm, k_mm, v_mm" in plan.rewrites[0] and "64 + 64 + 64" in plan.rewrites[0]
    assert "biases merged" in plan.rewrites[0]
    gemms = [g for g in plan.groups if g.kind == "gemm"]
    assert len(gemms) == 3  # fused QKV projection, Q·K^T, P·V
    qkv = gemms[0]
    pro, heavy, epi = qkv.prologue_epilogue()
    assert pro == [] and [o.op_type for o in epi] == ["Add"] and len(heavy) == 1
    assert [str(d) for d in heavy[0].shape] == ["B", "L", "192"]
    assert len(qkv.outputs) == 1 and qkv.inputs[0] == "x"
    assert len(qkv.inputs) == 3 and all("hfused" in v for v in qkv.inputs[1:])  # merged weight and bias
    fused_out = next(iter(qkv.outputs))
    split = next(n.name for n in plan.graph.nodes if n.op_type == "Split")
    # the Split and the head views are index maps inside the attention GEMMs
    assert split in group_of(plan, "scores").nodes and split in group_of(plan, "y").nodes
    assert {"q_t", "k_t", "q_h", "k_h"} <= set(group_of(plan, "scores").nodes)
    assert plan.crossing_values() == [fused_out, "scores", "y"]
    assert not any(n in plan.crossing_values() for n in ("q", "k", "v", "q_t", "k_t", "v_t"))
    described = plan.to_json()[0]
    assert (described["kind"], described["backbone"], described["outputs"]) == ("gemm", "MatMul", [fused_out])
    assert described["iteration_space"] == ["B", "L", "192"]
    check_numerics(model, plan)


def test_qkv_without_bias_merge_the_matmuls_only():
    nodes, weights = qkv_nodes(with_bias=False)
    model = build(nodes, X, weights)
    plan = compile_plan(model)
    assert len(plan.rewrites) == 1 and "biases merged" not in plan.rewrites[0]
    pro, heavy, epi = plan.groups[0].prologue_epilogue()
    assert (pro, epi) == ([], []) and [str(d) for d in heavy[0].shape] == ["B", "L", "192"]
    check_numerics(model, plan)


def test_matmuls_with_different_k_or_runtime_weights_are_not_merged():
    nodes = (linear("x", "a", "w1") + linear("x2", "c", "w2") + linear("x", "d", "x3")
             + [node("Add", ["a", "c"], "ac"), node("Add", ["ac", "d"], "y")])
    model = build(nodes, X + [("x2", F, ["B", "L", 32]), ("x3", F, [64, 64])],
                  {"w1": rand(64, 64), "w2": rand(32, 64)})
    plan = compile_plan(model)
    assert plan.rewrites == []
    assert sorted(g.backbone for g in plan.groups) == ["MatMul"] * 3
    assert not any(n.op_type == "Split" for n in plan.graph.nodes)
    check_numerics(model, plan, shapes=SHAPES[:2])


# ----------------------------------------------------------------------------- acyclicity
def test_consumer_that_also_depends_on_a_later_gemm_does_not_join_the_first():
    """g1 = MatMul(x) -> e1 = Relu -> g2 = MatMul(e1); ``y`` reads g1's and g2's outputs. Putting
    ``y`` into g1 would make g1 -> g2 -> g1 a cycle: it must go to g2."""
    nodes = (linear("x", "g1", "w1") + [node("Relu", ["g1"], "e1")] + linear("e1", "g2", "w2")
             + [node("Add", ["g1", "g2"], "y")])
    model = build(nodes, X, {"w1": rand(64, 64), "w2": rand(64, 64)})
    plan = compile_plan(model, horizontal=False)
    first, second = group_of(plan, "g1"), group_of(plan, "g2")
    assert first is not second
    assert group_of(plan, "y") is second and group_of(plan, "e1") is first
    assert plan.groups.index(first) < plan.groups.index(second)
    assert set(first.outputs) == {"g1", "e1"} and set(second.inputs) >= {"g1", "e1"}
    assert_topological(plan)
    check_numerics(model, plan)


def test_elementwise_node_between_two_groups_via_an_opaque_op_stays_acyclic():
    """r = Relu(x); c = CumSum(r) (opaque); y = Add(r, Exp(c)): ``y`` would close a cycle through
    the opaque group if it joined r's group, and Exp may not join r either."""
    nodes = [node("Relu", ["x"], "r"), node("CumSum", ["r", "axis"], "c"), node("Exp", ["c"], "ec"),
             node("Add", ["r", "ec"], "y")]
    model = build(nodes, X, {"axis": ints(1)[0]})
    plan = compile_plan(model)
    assert group_of(plan, "r") is not group_of(plan, "y")
    assert group_of(plan, "c").kind == "opaque"
    assert_topological(plan)
    check_numerics(model, plan)


def test_a_refused_reduction_epilogue_splits_again_instead_of_running_on_numpy(tmp_path):
    """GEMM -> residual -> LayerNorm -> requantized through a [B*L, H] view (GPT-2's QDQ export): no
    family takes the group whole, nor its epilogue (the row family cannot store through the merged
    view's index); the epilogue's own split -- the LayerNorm with what feeds it, then the rest --
    compiles, and the model matches onnxruntime."""
    from onnx import save

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    h = 16
    inits = [numpy_helper.from_array(rand(h, h), "w"), numpy_helper.from_array(rand(h), "g"),
             numpy_helper.from_array(rand(h), "b"), numpy_helper.from_array(np.array([-1, h], np.int64), "flat"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(3, np.uint8), "zp")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "b"], ["ln"], axis=-1),
             helper.make_node("Reshape", ["ln", "flat"], ["v"]),
             helper.make_node("QuantizeLinear", ["v", "s", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])]
    graph = helper.make_graph(nodes, "requantized_layernorm", [helper.make_tensor_value_info("x", F, ["B", "L", h])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    path = tmp_path / "m.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9), path)
    model = compile_model(str(path), ["B=1:2", "L=1:20"], max_variants=1)
    assert model.fallback_groups() == []
    assert sorted(ks[0].family for ks in model.kernels.values()) == ["gemm", "row-or-elementwise", "row-or-elementwise"]
    rt = Runtime.from_compiled(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, l in [(1, 1), (2, 7), (2, 20)]:
        x = rand(b, l, h)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
