"""Data-dependent indices are range-checked in generated kernels: an out-of-range Gather index
(an embedding id, a token type, a GatherElements index) raises IndexOutOfRangeError naming the
node, the index input, the value and the valid range — as onnxruntime refuses them — instead of
reading outside the table; the Runtime stays usable afterwards, and negative in-range indices
still count from the end (issue 12, item 1)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tscomp.compiler import compile_model
from tscomp.errors import ExecutionError, IndexOutOfRangeError
from tscomp.runtime import Runtime

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def bert(exported_model, tmp_path_factory):
    """(onnx path, Runtime, onnxruntime session, vocab size, type vocab size) of tiny BERT."""
    path = exported_model("bert", "tiny", "dynamo")
    rt = Runtime.from_compiled(compile_model(path, ["batch=1:8", "sequence=1:64"]))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = onnx.load(str(path))
    sizes = {}
    for node in model.graph.node:
        if node.op_type == "Gather":
            for init in model.graph.initializer:
                if init.name == node.input[0]:
                    sizes.setdefault(node.input[1], init.dims[0])
    vocab = next(v for k, v in sizes.items() if "input_ids" in k or v > 100)
    types = sizes.get("token_type_ids", 2)
    return path, rt, sess, vocab, types


def feeds(seq: int = 9, **override) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    f = {"input_ids": rng.integers(0, 100, (1, seq)).astype(np.int64),
         "attention_mask": np.ones((1, seq), np.int64),
         "token_type_ids": np.zeros((1, seq), np.int64)}
    f.update(override)
    return f


def with_value(name: str, value: int, at=(0, 3)) -> dict[str, np.ndarray]:
    f = feeds()
    f[name] = f[name].copy()
    f[name][at] = value
    return f


def assert_matches_onnxruntime(rt, sess, f) -> None:
    got = rt.run(f)
    want = sess.run(None, {i.name: f[i.name] for i in sess.get_inputs()})
    for name, w in zip([o.name for o in sess.get_outputs()], want):
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", ["1e6", "1500", "-100000", "vocab", "-vocab-1"])
def test_out_of_range_input_id_raises_naming_node_and_value_then_runtime_still_works(bert, value):
    path, rt, sess, vocab, _ = bert
    v = {"1e6": 10 ** 6, "1500": 1500, "-100000": -100000, "vocab": vocab, "-vocab-1": -vocab - 1}[value]
    with pytest.raises(IndexOutOfRangeError) as info:
        rt.run(with_value("input_ids", v))
    msg = str(info.value)
    assert f"has value {v} " in msg and f"[{-vocab}, {vocab - 1}]" in msg, msg
    assert "Gather node" in msg and "input_ids" in msg and "(0, 3)" in msg, msg
    assert isinstance(info.value, ExecutionError) and info.value.value == v
    assert_matches_onnxruntime(rt, sess, feeds())


def test_out_of_range_token_type_raises_naming_token_type_input(bert):
    _, rt, sess, _, types = bert
    with pytest.raises(IndexOutOfRangeError, match=rf"token_type_ids.*value 7 .*\[{-types}, {types - 1}\]"):
        rt.run(with_value("token_type_ids", 7))
    assert_matches_onnxruntime(rt, sess, feeds())


def test_negative_in_range_indices_count_from_the_end(bert):
    _, rt, sess, vocab, _ = bert
    from_end, explicit = rt.run(with_value("input_ids", -1)), rt.run(with_value("input_ids", vocab - 1))
    for name in explicit:
        np.testing.assert_array_equal(from_end[name], explicit[name])
    assert_matches_onnxruntime(rt, sess, with_value("input_ids", vocab - 1))


def test_reference_executor_raises_on_out_of_range_index(bert):
    from tscomp.graph.reference import run_reference
    import tscomp
    path = bert[0]
    graph = tscomp.load_model(str(path), ["batch=1:8", "sequence=1:64"])
    with pytest.raises(Exception, match="(?i)index|bounds|range"):
        run_reference(graph, with_value("input_ids", 10 ** 6))


# ------------------------------------------------------------------ GatherElements, small graph
def gather_elements_model(path, axis: int = 1) -> str:
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, ["n", 5])
    ind = helper.make_tensor_value_info("idx", TensorProto.INT64, ["n", 3])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    node = helper.make_node("GatherElements", ["data", "idx"], ["g"], name="pick", axis=axis)
    relu = helper.make_node("Relu", ["g"], ["y"], name="relu")
    graph = helper.make_graph([node, relu], "ge", [data, ind], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return str(path)


def test_gather_elements_out_of_range_raises_and_negative_indices_work(tmp_path):
    path = gather_elements_model(tmp_path / "ge.onnx")
    rt = Runtime.from_compiled(compile_model(path, ["n=1:17"]))
    data = np.arange(20, dtype=np.float32).reshape(4, 5)
    good = np.array([[0, -1, 4]] * 4, dtype=np.int64)
    np.testing.assert_array_equal(rt.run({"data": data, "idx": good})["y"],
                                  np.take_along_axis(data, good % 5, axis=1))
    for bad in (5, -6, 1 << 40):
        idx = good.copy()
        idx[2, 1] = bad
        with pytest.raises(IndexOutOfRangeError, match=rf"GatherElements node 'pick'.*'idx' has value {bad} "
                                                       rf"at \(2, 1\).*\[-5, 4\]"):
            rt.run({"data": data, "idx": idx})
    np.testing.assert_array_equal(rt.run({"data": data, "idx": good})["y"],
                                  np.take_along_axis(data, good % 5, axis=1))


def test_generator_lists_its_index_checks_for_the_families_built_on_it(tmp_path):
    """GroupGenerator.index_checks names every data-dependent index it emitted (the GEMM
    families subclassing it read this to refuse or support such groups)."""
    import tscomp
    from tscomp.codegen.cpu_groups import GroupGenerator
    from tscomp.graph.fusion import fuse
    plan = fuse(tscomp.load_model(gather_elements_model(tmp_path / "ge.onnx"), ["n=1:17"]))
    group = next(g for g in plan.groups if "pick" in g.nodes)
    gen = GroupGenerator(plan, group)
    source = gen.generate()
    assert [(c.node, c.op_type, c.input) for c in gen.index_checks] == [("pick", "GatherElements", "idx")]
    assert source.checks_indices and "ts_index(" in source.source and "int64_t* restrict tscomp_err" in source.source


def gemm_with_gathers_model(path) -> str:
    """y = Gather(table, ids) @ W + Gather(bias_table, ids): a checked gather in front of a GEMM (its A
    operand) and one behind it (its epilogue) — wherever fusion puts them, a bad id must raise."""
    rng = np.random.default_rng(1)
    table = helper.make_tensor("table", TensorProto.FLOAT, [11, 8], rng.standard_normal(88).astype(np.float32))
    btab = helper.make_tensor("btab", TensorProto.FLOAT, [11, 16], rng.standard_normal(176).astype(np.float32))
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 16], rng.standard_normal(128).astype(np.float32))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 16])
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["m"], name="proj"),
             helper.make_node("Gather", ["btab", "ids"], ["b"], name="row_bias"),
             helper.make_node("Add", ["m", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "gg", [ids], [out], initializer=[table, btab, w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    return str(path)


def test_gathers_fused_around_a_gemm_raise_on_bad_index_instead_of_reading_out_of_bounds(tmp_path):
    """The GEMM kernels carry no error record, so a gather in their prologue or epilogue is refused
    by the GEMM family (GroupGenerator.reports_index_errors) and runs where it is checked."""
    path = gemm_with_gathers_model(tmp_path / "gg.onnx")
    rt = Runtime.from_compiled(compile_model(path, ["n=1:33"]))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    good = np.array([0, 10, -1, 5, -11, 3, 7], dtype=np.int64)
    np.testing.assert_allclose(rt.run({"ids": good})["y"], sess.run(None, {"ids": good})[0], rtol=1e-4, atol=1e-4)
    for bad in (11, -12, 10 ** 6):
        ids = good.copy()
        ids[4] = bad
        with pytest.raises(IndexOutOfRangeError, match=rf"'ids' has value {bad} "):
            rt.run({"ids": ids})
    np.testing.assert_allclose(rt.run({"ids": good})["y"], sess.run(None, {"ids": good})[0], rtol=1e-4, atol=1e-4)


def test_generators_without_an_error_record_refuse_a_data_dependent_index(tmp_path):
    """Today's fusion keeps gathers out of GEMM groups (the test above); should a plan put one there,
    the GEMM families' generators refuse it rather than emit an unchecked read or a trap."""
    import tscomp
    from tscomp.codegen import cpu_batched_gemm, cpu_gemm_group
    from tscomp.codegen.cpu_groups import GroupGenerator
    from tscomp.errors import UnsupportedOperatorError
    from tscomp.graph.fusion import fuse
    plan = fuse(tscomp.load_model(gather_elements_model(tmp_path / "ge.onnx"), ["n=1:17"]))
    group = next(g for g in plan.groups if "pick" in g.nodes)
    gen = GroupGenerator(plan, group)
    gen.reports_index_errors = False
    with pytest.raises(UnsupportedOperatorError, match=r"GatherElements node 'pick'.*without an error record"):
        gen.generate()
    for cls in (cpu_gemm_group._EpilogueGenerator, cpu_gemm_group._RowPassGenerator, cpu_batched_gemm._Generator):
        assert cls.reports_index_errors is False, cls
