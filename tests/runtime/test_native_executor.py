"""The native executor: a compiled model's host program runs every group in one native call, gives
the per-group Python path's results exactly, splits into segments around steps that must run from
Python, and reports kernel errors as the per-group path does."""
from __future__ import annotations

import numpy as np
import pytest

from tscomp.codegen.kernel import NotNativeError
from tscomp.errors import IndexOutOfRangeError, TscompError
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import load_artifact
from tscomp.runtime.host_program import program_for

BINDINGS = [(1, 1), (1, 2), (3, 13), (2, 64), (1, 127), (1, 512)]


@pytest.fixture(scope="module")
def bert(compiled_artifact):
    path, onnx_path, ranges = compiled_artifact("bert")
    return path, onnx_path


def _inputs(rt: Runtime, batch: int, seq: int, seed: int = 0) -> dict:
    from models.families import make_inputs

    return make_inputs("bert", {"batch": batch, "sequence": seq}, np.random.default_rng(seed))


def test_every_group_of_tiny_bert_runs_natively_in_one_segment(bert):
    rt = Runtime(bert[0], warmup=False)
    assert rt.executor == "native"
    steps = rt._native.program.steps
    assert all(s.native for s in steps), [s.reason for s in steps if not s.native]
    assert rt._native.program.order == [("native", 0)]


def test_native_and_per_group_executors_give_identical_outputs(bert):
    native = Runtime(bert[0], warmup=False)
    python = Runtime(bert[0], warmup=False, executor="python")
    for batch, seq in BINDINGS:
        inputs = _inputs(native, batch, seq)
        got, want = native.run(inputs), python.run(inputs)
        assert set(got) == set(want)
        for name in want:
            assert got[name].shape == want[name].shape
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} at batch={batch}, seq={seq}")


def test_the_artifact_links_its_host_program_and_the_runtime_uses_that_copy(bert):
    rt = Runtime(bert[0], warmup=False)
    assert rt.manifest["host"]["native_steps"] == len(rt.plan.groups)
    assert rt._native.library.endswith("kernels.so")


def test_an_out_of_range_token_id_is_named_and_the_runtime_keeps_serving(bert):
    rt = Runtime(bert[0], warmup=False)
    inputs = _inputs(rt, 1, 9)
    good = rt.run(inputs)
    bad = dict(inputs)
    bad["input_ids"] = inputs["input_ids"].copy()
    bad["input_ids"][0, 4] = 10 ** 6
    with pytest.raises(IndexOutOfRangeError, match=r"input_ids.*1000000.*\(0, 4\)"):
        rt.run(bad)
    again = rt.run(inputs)
    for name in good:
        np.testing.assert_array_equal(again[name], good[name])


def test_steps_that_cannot_be_called_natively_run_from_python_between_segments(bert):
    model, _ = load_artifact(bert[0])
    groups = model.plan.groups
    several = next(g.name for g in groups if len(model.kernels[g.name]) > 1)
    refused = {groups[0].name, several}

    def refuse():
        raise NotNativeError("refused by the test")
    for name in refused:
        for k in model.kernels[name]:
            k.native_call = refuse
    rt = Runtime.from_compiled(model)
    program = rt._native.program
    python_steps = [s.group for s in program.steps if not s.native]
    assert sorted(python_steps) == sorted(refused)
    assert program.order[0] == ("native", 0)            # segment 0 places the arena first
    assert sum(kind == "native" for kind, _ in program.order) >= 2
    reference = Runtime(bert[0], warmup=False, executor="python")
    for batch, seq in BINDINGS[:4]:
        inputs = _inputs(rt, batch, seq, seed=batch * seq)
        got, want = rt.run(inputs), reference.run(inputs)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_profile_times_every_group_from_the_host_programs_own_stamps(bert):
    """profile() runs the host program as run() does, which stamps the clock after every native
    step: one positive time per group, in Plan order, summing to no more than the call; the
    outputs are unchanged by the stamps, and per_group=True keeps the per-group Python path."""
    import time
    rt = Runtime(bert[0], warmup=False)
    inputs = _inputs(rt, 2, 37)
    want = rt.run(inputs)
    t = time.perf_counter()
    prof = rt.profile(inputs)
    call = time.perf_counter() - t
    assert [g for g, _, _ in prof] == [g.name for g in rt.plan.groups]
    assert all(dt > 0 for _, _, dt in prof) and sum(dt for _, _, dt in prof) <= call
    assert {f for _, f, _ in prof} >= {"gemm"}
    assert rt._native.call_state().struct.trace is None       # the next run() stamps nothing
    got = rt.run(inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    per_group = [g for g, _, _ in rt.profile(inputs, per_group=True)]   # its plan skips shape-only groups
    assert per_group and per_group == [g for g, _, _ in prof if g in set(per_group)]


def test_profile_times_python_steps_between_native_segments(bert):
    model, _ = load_artifact(bert[0])
    refused = model.plan.groups[1].name

    def refuse():
        raise NotNativeError("refused by the test")
    for k in model.kernels[refused]:
        k.native_call = refuse
    rt = Runtime.from_compiled(model)
    prof = rt.profile(_inputs(rt, 1, 9))
    assert [g for g, _, _ in prof] == [g.name for g in rt.plan.groups]
    assert all(dt > 0 for _, _, dt in prof)


def test_the_generated_host_program_is_deterministic_and_names_its_steps(bert):
    model, _ = load_artifact(bert[0])
    a, b = program_for(model), program_for(model)
    assert a.source == b.source
    assert "tscomp host program for" in a.source
    for g in model.plan.groups:
        assert f"group {g.name} (" in a.source


def test_an_unknown_executor_is_a_clear_error(bert):
    with pytest.raises(TscompError, match="unknown executor 'jit'"):
        Runtime(bert[0], warmup=False, executor="jit")


def _view_gemm_model(path):
    """x[batch, 96, seq] -> Transpose -> [batch, seq, 96] -> Slice [16:80] -> MatMul W[64, 24] + b,
    and a second GEMM reading x through Transpose alone; both A operands are views the host
    program must copy (a transpose; a transpose and a slice), in 16 x 16 tiles whose edges the
    sizes 1, 7, 131 and 300 cut."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    W1 = numpy_helper.from_array(rng.standard_normal((64, 24)).astype(np.float32), "W1")
    W2 = numpy_helper.from_array(rng.standard_normal((96, 40)).astype(np.float32), "W2")
    b1 = numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b1")
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("starts", [16]), ("ends", [80]), ("axes", [2]))]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="t"),
             helper.make_node("Slice", ["xt", "starts", "ends", "axes"], ["xs"], name="s"),
             helper.make_node("MatMul", ["xs", "W1"], ["m1"], name="mm1"),
             helper.make_node("Add", ["m1", "b1"], ["y1"], name="add"),
             helper.make_node("MatMul", ["xt", "W2"], ["y2"], name="mm2")]
    graph = helper.make_graph(
        nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 96, "seq"])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], initializer=[W1, W2, b1, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9     # what the installed onnxruntime reads
    onnx.save(model, path)


def test_gemm_operands_read_through_transposes_and_slices_are_copied_natively(tmp_path):
    import onnxruntime as ort

    from tscomp.compiler import compile_model

    path = tmp_path / "views.onnx"
    _view_gemm_model(path)
    model = compile_model(str(path), ["batch=1:4", "seq=1:300"], max_variants=2)
    rt = Runtime.from_compiled(model)
    assert rt.executor == "native" and all(s.native for s in rt._native.program.steps)
    assert "contiguous copy of" in rt._native.program.source
    assert "16 x 16 tiles of a transpose" in rt._native.program.source   # seq is the source's unit stride
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for batch, seq in [(1, 1), (2, 7), (3, 64), (4, 300), (1, 131)]:
        x = rng.standard_normal((batch, 96, seq)).astype(np.float32)
        got = rt.run({"x": x})
        for name, want in zip(("y1", "y2"), sess.run(None, {"x": x})):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {batch}x{seq}")


def test_a_model_whose_host_program_cannot_be_generated_runs_per_group_with_a_warning(bert, monkeypatch):
    from tscomp.runtime import host_program

    def broken(*args, **kw):
        raise RuntimeError("generator bug")
    monkeypatch.setattr(host_program, "generate_host_program", broken)
    with pytest.warns(RuntimeWarning, match="native executor unavailable.*generator bug"):
        rt = Runtime(bert[0], warmup=False)
    assert rt.executor == "python"
    inputs = _inputs(rt, 2, 5)
    want = Runtime(bert[0], warmup=False, executor="python").run(inputs)
    got = rt.run(inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_the_fast_input_binder_agrees_with_bind_symbols_and_defers_its_errors(bert):
    from tscomp.errors import ExecutionError
    from tscomp.graph.reference import bind_symbols
    from tscomp.runtime.binding import InputBinder

    rt = Runtime(bert[0], warmup=False)
    binder = InputBinder(rt.graph)
    for batch, seq in BINDINGS:
        inputs = _inputs(rt, batch, seq)
        assert binder.bind(inputs) == bind_symbols(rt.graph, inputs, check_ranges=False) == \
            {"batch": batch, "sequence": seq}
    inputs = _inputs(rt, 2, 9)
    bad_len = dict(inputs, token_type_ids=inputs["token_type_ids"][:, :5])
    with pytest.raises(ExecutionError, match=r"token_type_ids.*axis 1 is 5.*sequence is already 9"):
        binder.bind(bad_len)
    with pytest.raises(ExecutionError, match="dtype int32"):
        binder.bind(dict(inputs, input_ids=inputs["input_ids"].astype(np.int32)))
    with pytest.raises(ExecutionError, match="missing input"):
        binder.bind({k: v for k, v in inputs.items() if k != "attention_mask"})
    as_lists = {k: v.tolist() for k, v in inputs.items()}     # not arrays: the general path
    np.testing.assert_array_equal(rt.run(as_lists)["last_hidden_state"], rt.run(inputs)["last_hidden_state"])
