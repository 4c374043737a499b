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
