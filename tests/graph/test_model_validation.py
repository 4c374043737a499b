"""Import refuses invalid models the way onnxruntime does, with one-line errors naming the node
and value at fault (issue 12, item 5): SSA violations, dangling references, a directory given as
the model, If on a run-time condition; folds If on a constant condition into its taken branch;
refuses data-dependent output shapes (NonZero of run-time data) before anything is compiled."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.errors import ModelLoadError, UnsupportedOperatorError
from tscomp.graph import import_model, load_model, propagate_shapes, read_model
from tscomp.graph.onnx_import import refuse_data_dependent_shapes
from tscomp.graph.reference import run_reference

F = TensorProto.FLOAT


def vi(name, shape=("n", 3), elem=F):
    return helper.make_tensor_value_info(name, elem, list(shape))


def model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_two_nodes_writing_one_value_is_refused_naming_both_nodes_and_the_value():
    m = model([helper.make_node("Relu", ["x"], ["y"], name="first"),
               helper.make_node("Neg", ["x"], ["y"], name="second")], [vi("x")], [vi("y")])
    with pytest.raises(ModelLoadError, match=r"value 'y' is written by two nodes, 'first' and 'second'"):
        import_model(m)


def test_node_overwriting_a_graph_input_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["x"], name="clobber")], [vi("x")], [vi("x")])
    with pytest.raises(ModelLoadError, match=r"Relu node 'clobber' writes 'x', which is already a graph input"):
        import_model(m)


def test_dangling_input_reference_is_refused_naming_node_and_input():
    m = model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [vi("x")], [vi("y")])
    with pytest.raises(ModelLoadError, match=r"Add node 'add' reads 'ghost', which nothing produces"):
        import_model(m)


def test_directory_given_as_model_says_it_is_a_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="is a directory, expected an .onnx file"):
        read_model(tmp_path)


def if_model(cond, *, as_constant_node: bool):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [], [vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [], [vi("e")])
    nodes = [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    inits = []
    c = numpy_helper.from_array(np.array(cond), "c")
    if as_constant_node:
        nodes.insert(0, helper.make_node("Constant", [], ["c"], name="cond", value=c))
    else:
        inits.append(c)
    return model(nodes, [vi("x")], [vi("y")], inits)


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("as_constant_node", [True, False])
def test_if_with_constant_condition_folds_to_the_taken_branch(tmp_path, cond, as_constant_node):
    path = tmp_path / "if.onnx"
    onnx.save(if_model(cond, as_constant_node=as_constant_node), str(path))
    graph = load_model(path, ["n=1:8"])
    assert all(n.op_type != "If" for n in graph.nodes)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    y = run_reference(graph, {"x": x})["y"]
    np.testing.assert_array_equal(y, np.maximum(x, 0) if cond else -x)


def test_if_on_a_run_time_condition_is_refused_naming_node_and_condition():
    m = if_model(True, as_constant_node=False)
    m.graph.initializer.pop()
    m.graph.input.append(vi("c", (), TensorProto.BOOL))
    graph = import_model(m)
    with pytest.raises(UnsupportedOperatorError, match=r"If node 'branch': its condition 'c' depends on run-time data"):
        propagate_shapes(graph)


def shape_if_model(axis: int):
    """TorchScript's squeeze(dim) of a dim it cannot see: If(Shape(x)[axis] == 1, Squeeze, Identity)."""
    then_g = helper.make_graph([helper.make_node("Squeeze", ["x", "ax"], ["t"], name="sq")], "then", [],
                               [helper.make_tensor_value_info("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="keep")], "else", [],
                               [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "i"], ["d"], axis=0),
             helper.make_node("Equal", ["d", "one"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="squeeze_if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y"], ["z"])]
    inits = [numpy_helper.from_array(np.array(axis, np.int64), "i"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([axis], np.int64), "ax")]
    return model(nodes, [vi("x", ("n", 1, "m"))], [helper.make_tensor_value_info("z", F, None)], inits)


@pytest.mark.parametrize("axis,dims,squeezed", [(1, ["n=1:8", "m=1:8"], True), (2, ["n=1:8", "m=2:8"], False)])
def test_an_if_on_a_shape_the_ranges_decide_is_spliced_in_during_shape_propagation(tmp_path, axis, dims, squeezed):
    # axis 1 is static 1: squeezed; axis 2 is m in 2..8, never 1: kept
    path = tmp_path / "shape_if.onnx"
    onnx.save(shape_if_model(axis), str(path))
    graph = load_model(path, dims)
    assert all(n.op_type != "If" for n in graph.nodes)
    x = np.linspace(-1, 1, 2 * 1 * 3, dtype=np.float32).reshape(2, 1, 3)
    z = run_reference(graph, {"x": x})["z"]
    np.testing.assert_array_equal(z, np.maximum(x.reshape(2, 3) if squeezed else x, 0))


def test_an_if_on_a_shape_the_ranges_do_not_decide_is_refused_by_name(tmp_path):
    path = tmp_path / "shape_if.onnx"
    onnx.save(shape_if_model(2), str(path))
    with pytest.raises(UnsupportedOperatorError, match=r"If node 'squeeze_if': its condition 'c' depends on run-time "
                                                       r"data or on dimensions the declared ranges do not decide"):
        load_model(path, ["n=1:8", "m=1:8"])


def nonzero_model():
    return model([helper.make_node("NonZero", ["x"], ["idx"], name="nz")], [vi("x")],
                 [helper.make_tensor_value_info("idx", TensorProto.INT64, None)])


def test_nonzero_of_run_time_data_is_refused_as_data_dependent_shape():
    graph = import_model(nonzero_model())
    propagate_shapes(graph)
    with pytest.raises(UnsupportedOperatorError, match=r"NonZero node 'nz': data-dependent output shape is not supported"):
        refuse_data_dependent_shapes(graph)


def test_nonzero_of_a_constant_is_not_refused():
    c = numpy_helper.from_array(np.array([[0, 1], [1, 1]], np.int64), "c")
    m = model([helper.make_node("NonZero", ["c"], ["idx"], name="nz")], [],
              [helper.make_tensor_value_info("idx", TensorProto.INT64, None)], [c])
    graph = import_model(m)
    propagate_shapes(graph)
    refuse_data_dependent_shapes(graph)


def test_compile_refuses_nonzero_of_run_time_data(tmp_path):
    from tscomp.compiler import compile_model
    path = tmp_path / "nz.onnx"
    onnx.save(nonzero_model(), str(path))
    with pytest.raises(UnsupportedOperatorError, match="data-dependent output shape is not supported"):
        compile_model(str(path), ["n=1:8"])
