"""ONNX import: symbols from dim_params and --dim, constants, external data, bad files."""
import re

import numpy as np
import onnx
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.errors import DimSpecError, ModelLoadError, UnsupportedOperatorError
from tscomp.graph import DimSpec, import_model, load_model, read_model


def two_input_model(op="Add", dims_a=("batch size", "seq"), dims_b=("batch size", "seq")):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, list(dims_a))
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, list(dims_b))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["a", "b"], ["y"], name="the_node")
    return helper.make_model(helper.make_graph([node], "g", [a, b], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_dim_params_become_shared_sanitized_symbols():
    g = import_model(two_input_model())
    assert g.values["a"].shape == g.values["b"].shape
    assert [str(d) for d in g.values["a"].shape] == ["batch_size", "seq"]
    assert g.symbols.get("seq").origin == "dim_param"


def test_dim_spec_bounds_a_dim_param():
    g = import_model(two_input_model(), [DimSpec.parse("seq=1:128")])
    info = g.symbols.get("seq")
    assert (info.min, info.max, info.origin) == (1, 128, "user")


def test_dim_spec_renames_by_param_and_by_input_axis():
    g = import_model(two_input_model(), [DimSpec.parse("L@seq=1:64"), DimSpec.parse("B@a:0=1:4")])
    assert [str(d) for d in g.values["b"].shape] == ["B", "L"]


def test_dim_spec_for_unknown_name_lists_the_model_dims():
    with pytest.raises(DimSpecError, match="no dynamic dimension named 'L'.*seq"):
        import_model(two_input_model(), [DimSpec.parse("L=1:512")])


def cache_model():
    """y = Concat(past, new) + mask: the mask's length ``total`` is past + sequence."""
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["p"])
    new = helper.make_tensor_value_info("new", TensorProto.FLOAT, ["s"])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["total"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Concat", ["past", "new"], ["both"], axis=0),
             helper.make_node("Add", ["both", "mask"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "g", [past, new, mask], [y]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_a_derived_dim_spec_rewrites_the_dim_into_its_expression_with_the_range_it_implies():
    g = import_model(cache_model(), [DimSpec.parse("p=0:40"), DimSpec.parse("s=1:8"), DimSpec.parse("total=p+s")])
    p, s = g.symbols.symbol("p"), g.symbols.symbol("s")
    assert g.symbols.canon(g.values["mask"].shape[0]) == p + s
    assert g.symbols.bounds(g.symbols.symbol("total")) == (1, 48)
    assert "total" not in {i.name for i in g.symbols.live_symbols()}


@pytest.mark.parametrize("spec, error", [("total=p+q", "'q' is not a dimension of the model other than 'total'"),
                                         ("total=total+1", "'total' is not a dimension"),
                                         ("total=p-s", "p-s can be negative \\(as low as -8\\)"),
                                         ("total=(p+s", "'\\(p\\+s' is not an expression of dims")])
def test_a_derived_dim_over_unknown_dims_or_that_can_be_negative_is_rejected(spec, error):
    with pytest.raises(DimSpecError, match=f"--dim {re.escape(spec)}: {error}"):
        import_model(cache_model(), [DimSpec.parse("p=0:40"), DimSpec.parse("s=1:8"), DimSpec.parse(spec)])


def test_dim_spec_contradicting_input_rank_names_the_input():
    with pytest.raises(DimSpecError, match="input 'a' has rank 2, so axis 2 does not exist"):
        import_model(two_input_model(), [DimSpec.parse("L@a:2=1:512")])


def test_dim_spec_on_static_axis_outside_range_is_rejected():
    with pytest.raises(DimSpecError, match="static"):
        import_model(two_input_model(dims_a=(3, "seq")), [DimSpec.parse("B@a:0=4:8")])


def test_unnamed_dims_get_fresh_symbols():
    m = two_input_model(dims_a=(None, None), dims_b=(None, None))
    for vi in m.graph.input:
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()
    g = import_model(m)
    assert all(isinstance(d, sympy.Symbol) for d in g.values["a"].shape)


def test_unknown_operator_is_reported_with_node_and_opset(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(two_input_model(op="FancyOp"), path)
    with pytest.raises(UnsupportedOperatorError, match="node 'the_node': operator FancyOp \\(opset 17\\)"):
        load_model(path)


def test_truncated_file_is_a_load_error_naming_the_file(tmp_path):
    path = tmp_path / "trunc.onnx"
    data = two_input_model().SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="trunc.onnx"):
        read_model(path)


def test_garbage_file_is_a_load_error(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"this is not protobuf at all \x00\xff" * 10)
    with pytest.raises(ModelLoadError, match="junk.onnx"):
        read_model(path)


def test_missing_file_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        read_model(tmp_path / "nope.onnx")


def test_external_data_is_loaded(tmp_path):
    w = np.arange(4096, dtype=np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                                            [numpy_helper.from_array(w, "w")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "ext.onnx"
    onnx.save(m, path, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    assert (tmp_path / "ext.onnx.data").exists()
    g = load_model(path)
    from tscomp.graph.reference import run_reference
    out = run_reference(g, {"x": np.ones((3, 4096), np.float32)})["y"]
    np.testing.assert_array_equal(out, np.ones((3, 4096)) + w)


def test_missing_external_data_is_a_load_error(tmp_path):
    test_external_data_is_loaded(tmp_path)
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(ModelLoadError, match="external tensor data"):
        read_model(tmp_path / "ext.onnx")


def test_dim_spec_reusing_another_dims_name_is_rejected():
    m = two_input_model(dims_a=("batch", "seq"), dims_b=("batch", "seq"))
    with pytest.raises(DimSpecError, match="already the name of the model's dim_param 'batch'"):
        import_model(m, [DimSpec.parse("batch@seq=1:64")])


def test_dim_params_that_sanitize_alike_stay_distinct():
    g = import_model(two_input_model(dims_a=("a b", "s"), dims_b=("a_b", "s")))
    assert g.values["a"].shape[0] != g.values["b"].shape[0]
