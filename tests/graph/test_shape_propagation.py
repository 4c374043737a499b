"""Worklist shape propagation (TSCompiler Alg. 1): folding, shape data, sibling inference."""
import numpy as np
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.errors import ShapeError
from tscomp.graph import DimSpec, import_model, propagate_shapes, simplify
from tscomp.graph.reference import run_reference


def model(nodes, inputs, initializers=(), opset=17):
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    outs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs,
                                               [numpy_helper.from_array(a, n) for n, a in initializers]),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def test_sibling_inference_rewrites_earlier_values_when_matmul_fixes_a_dim():
    w = np.ones((64, 32), np.float32)
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])],
              [("x", TensorProto.FLOAT, ["B", "K"])], [("w", w)])
    g = import_model(m)
    propagate_shapes(g)
    assert g.values["r"].shape == (sympy.Symbol("B", integer=True, positive=True), 64)
    assert g.values["x"].shape[1] == 64
    assert any("MatMul" in str(c) for c in g.symbols.constraints)


def test_embedding_add_constrains_sequence_to_the_table_length():
    table = np.zeros((1, 512, 8), np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["L"], axis=0),
             helper.make_node("Unsqueeze", ["L", "zero"], ["end"]),
             helper.make_node("Slice", ["pos", "zero", "end", "one"], ["p"]),
             helper.make_node("Add", ["x", "p"], ["y"])]
    m = model(nodes, [("x", TensorProto.FLOAT, ["batch", "seq", 8])],
              [("pos", table), ("zero", np.array([0], np.int64)), ("one", np.array(1, np.int64))])
    g = import_model(m)
    propagate_shapes(g)
    assert g.symbols.get("seq").max == 512
    assert [str(d) for d in g.values["y"].shape] == ["batch", "seq", "8"]


def test_shape_of_a_large_folded_constant_is_a_constant():
    big = np.zeros((1, 768, 14, 14), np.float32)  # larger than any shape-data guard
    nodes = [helper.make_node("Transpose", ["big"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Shape", ["t"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["y"])]
    m = model(nodes, [("x", TensorProto.FLOAT, [768 * 196])], [("big", big)])
    g = import_model(m)
    propagate_shapes(g)
    np.testing.assert_array_equal(g.values["s"].const, [1, 14, 14, 768])
    assert g.values["y"].shape == (1, 14, 14, 768)


def test_shape_subgraph_leaves_the_compute_graph_after_simplification():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"]),
             helper.make_node("Concat", ["b1", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    m = model(nodes, [("x", TensorProto.FLOAT, ["B", "L", 12, 64])],
              [("zero", np.array(0, np.int64)), ("zero1", np.array([0], np.int64)),
               ("tail", np.array([-1, 768], np.int64))])
    g = import_model(m, [DimSpec.parse("L=1:512")])
    propagate_shapes(g)
    simplify(g)
    assert [n.op_type for n in g.nodes] == ["Reshape"]
    assert [str(d) for d in g.values["y"].shape] == ["B", "L", "768"]
    x = np.random.default_rng(0).standard_normal((2, 5, 12, 64)).astype(np.float32)
    np.testing.assert_array_equal(run_reference(g, {"x": x})["y"], x.reshape(2, 5, 768))


def test_provably_mismatched_static_dims_name_the_node():
    m = model([helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")],
              [("a", TensorProto.FLOAT, [3, 4]), ("b", TensorProto.FLOAT, [3, 5])])
    g = import_model(m)
    with pytest.raises(ShapeError, match="Add node 'bad_add'"):
        propagate_shapes(g)


def test_symbol_against_constant_broadcast_keeps_the_symbol_free():
    m = model([helper.make_node("Add", ["a", "b"], ["y"])],
              [("a", TensorProto.FLOAT, ["n", 4]), ("b", TensorProto.FLOAT, [3, 4])])
    g = import_model(m)
    propagate_shapes(g)
    assert g.values["y"].shape == (3, 4)
    assert "n" in g.symbols.infos and g.symbols.symbol("n") not in g.symbols.substitution
    # n may be 1 (broadcast) or 3: both run
    for n in (1, 3):
        out = run_reference(g, {"a": np.ones((n, 4), np.float32), "b": np.ones((3, 4), np.float32)})["y"]
        assert out.shape == (3, 4)


def token_grid_model(path, head_channels: int = 4):
    """DPT's reassemble step in miniature: a 4x4 patchify Conv, the tokens [B, N, 8], and the grid
    side int(sqrt(N)) computed by the graph (Cast, Pow 0.5, Cast) to reshape them back into a square
    [B, 8, s, s] for a 3x3 Conv to ``head_channels`` and a ReLU."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 4, 4)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((head_channels, 8, 3, 3)).astype(np.float32), "w2")
    c = lambda name, v, t=TensorProto.INT64: helper.make_tensor(name, t, [len(v)] if isinstance(v, list) else [], v)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
        helper.make_node("Reshape", ["p", "flat"], ["pf"]),
        helper.make_node("Transpose", ["pf"], ["tok"], perm=[0, 2, 1]),
        helper.make_node("Shape", ["tok"], ["shp"]),
        helper.make_node("Gather", ["shp", "one"], ["n"], axis=0),
        helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
        helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
        helper.make_node("Pow", ["nf", "half"], ["rootf"]),
        helper.make_node("Cast", ["rootf"], ["root"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["root", "ax0"], ["r1"]),
        helper.make_node("Concat", ["b1", "r1", "r1", "eight"], ["grid"], axis=0),
        helper.make_node("Reshape", ["tok", "grid"], ["g"]),
        helper.make_node("Transpose", ["g"], ["gc"], perm=[0, 3, 1, 2]),
        helper.make_node("Conv", ["gc", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["y"]),
    ]
    inits = [w1, w2, c("flat", [0, 8, -1]), c("one", 1), c("zero", 0), c("ax0", [0]), c("eight", [8]),
             helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]
    graph = helper.make_graph(nodes, "grid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    import onnx
    onnx.save(model, str(path))


def test_a_token_grid_side_computed_as_a_square_root_is_exact_and_runs_natively(tmp_path):
    """sqrt(6 * 6 patches) is 6 (a Float exponent made it floor(2.449... * 2.449...) = 5, and the
    reshape failed at run time); the side is an integer C expression, so every group is native;
    a patch count that is no square is refused by name, as onnxruntime refuses it."""
    import onnxruntime as ort
    from tscomp.compiler import compile_model
    from tscomp.errors import TscompError
    from tscomp.runtime import Runtime
    path = tmp_path / "grid.onnx"
    token_grid_model(path)
    model = compile_model(str(path), ["batch=1:2", "H=4:128", "W=4:128"], max_variants=1)
    assert model.fallback_groups() == []
    rt = Runtime.from_compiled(model, num_threads=2)
    assert rt.executor == "native"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n, h, w in [(1, 24, 24), (2, 16, 36), (1, 64, 64), (1, 4, 4), (2, 127, 124)]:
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{n}x{h}x{w}")
    with pytest.raises(TscompError, match="Reshape"):
        rt.run({"x": rng.standard_normal((1, 3, 24, 28)).astype(np.float32)})     # 6 x 7 patches
