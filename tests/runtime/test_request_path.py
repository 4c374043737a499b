"""The request path in C: a request binds, checks and calls the host program in one C function,
gives the Python path's results exactly, and hands every unusual request back to the Python path,
which serves it or refuses it with its specific error."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tscomp.codegen.build import get_num_threads
from tscomp.errors import ExecutionError, IndexOutOfRangeError, TscompError
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import load_artifact

BINDINGS = [(1, 1), (1, 2), (3, 13), (2, 64), (1, 127), (1, 512)]


@pytest.fixture(scope="module")
def bert(compiled_artifact):
    path, _, ranges = compiled_artifact("bert")
    note = Runtime(path, warmup=False).request_path_note
    if "Python.h" in note:           # an interpreter installed without its development headers
        pytest.skip(note)
    return path, ranges


def _inputs(batch: int, seq: int, seed: int = 0) -> dict:
    from models.families import make_inputs

    return make_inputs("bert", {"batch": batch, "sequence": seq}, np.random.default_rng(seed))


class _Counting:
    """Wraps a runtime's C request path, counting the requests it served and handed back."""

    def __init__(self, rt: Runtime):
        self.inner, self.served, self.handed_back = rt._request, 0, 0
        rt._request = self

    def __call__(self, inputs):
        out = self.inner(inputs)
        if out is None:
            self.handed_back += 1
        else:
            self.served += 1
        return out


def test_tiny_bert_requests_take_the_c_path_and_match_the_python_path_exactly(bert):
    rt = Runtime(bert[0])          # the warm-up reserves the arena for the top of the ranges
    assert rt.request_path_note == "native (C)"
    python = Runtime(bert[0], warmup=False)
    python._request = None
    counting = _Counting(rt)
    for batch, seq in BINDINGS:
        inputs = _inputs(batch, seq, seed=seq)
        got, want = rt.run(inputs), python.run(inputs)
        assert list(got) == list(want)
        for name in want:
            assert got[name].shape == want[name].shape and got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} at batch={batch}, seq={seq}")
    assert counting.served == len(BINDINGS) and counting.handed_back == 0


def test_a_request_that_needs_a_larger_arena_is_handed_back_once_and_the_arena_grows(bert):
    rt = Runtime(bert[0], warmup=False)        # no arena reserved
    counting = _Counting(rt)
    inputs = _inputs(2, 64)
    first = rt.run(inputs)
    assert counting.handed_back == 1 and counting.served == 0
    second = rt.run(inputs)
    assert counting.served == 1
    for name in first:
        np.testing.assert_array_equal(second[name], first[name])


def test_unusual_requests_are_handed_back_and_get_the_python_paths_errors(bert):
    rt = Runtime(bert[0])
    counting = _Counting(rt)
    good = _inputs(1, 9)
    want = rt.run(good)
    assert counting.served == 1
    handed = 0

    def expect_handed_back():
        nonlocal handed
        handed += 1
        assert counting.handed_back == handed

    with pytest.raises(TscompError, match="input_ids"):                 # wrong dtype
        rt.run({**good, "input_ids": good["input_ids"].astype(np.float32)})
    expect_handed_back()
    with pytest.raises(TscompError):                                    # a missing input
        rt.run({k: v for k, v in good.items() if k != "token_type_ids"})
    expect_handed_back()
    with pytest.raises(ExecutionError, match="sequence = 513"):        # outside the declared range
        rt.run({k: np.tile(v, (1, 57))[:, :513] for k, v in _inputs(1, 9).items()})
    expect_handed_back()
    bad = {k: v.copy() for k, v in good.items()}
    bad["input_ids"][0, 4] = 10 ** 6                                   # the kernel's index check fires
    with pytest.raises(IndexOutOfRangeError, match=r"input_ids.*1000000.*\(0, 4\)"):
        rt.run(bad)
    expect_handed_back()
    # a non-contiguous input is served by the Python path (which makes it contiguous), identically
    wide = {k: np.repeat(v, 2, axis=1)[:, ::2] for k, v in good.items()}
    assert not wide["input_ids"].flags.c_contiguous
    got = rt.run(wide)
    expect_handed_back()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    again = rt.run(good)                                               # and C serves the next one
    assert counting.served == 2
    for name in want:
        np.testing.assert_array_equal(again[name], want[name])


def test_the_c_path_sets_each_runtimes_thread_count_for_the_python_path_after_it(bert):
    one, two = Runtime(bert[0], num_threads=1), Runtime(bert[0], num_threads=2)
    inputs = _inputs(1, 7)
    one.run(inputs)
    assert get_num_threads() == 1
    two.run(inputs)
    assert get_num_threads() == 2
    one.profile(inputs)            # the Python path (profile never takes the C path) sets its own count
    assert get_num_threads() == 1
    two.run(inputs)
    assert get_num_threads() == 2


def test_the_c_path_reports_its_kernel_time_and_overhead(bert):
    rt = Runtime(bert[0])
    rt.run(_inputs(1, 33))
    kernel, overhead = rt._native.last_kernel_seconds, rt.last_call_overhead
    assert kernel > 0 and overhead > 0


def test_models_with_a_python_step_keep_the_python_request_path_and_say_why(bert):
    from tscomp.codegen.kernel import NotNativeError

    model, _ = load_artifact(bert[0])

    def refuse():
        raise NotNativeError("refused by the test")
    for k in model.kernels[model.plan.groups[1].name]:
        k.native_call = refuse
    rt = Runtime.from_compiled(model)
    assert rt._request is None and "from Python" in rt.request_path_note
    assert rt.executor == "native"


def test_relations_between_symbols_are_checked_in_c_and_a_broken_one_is_named_by_python(tmp_path):
    """A token grid reshaped to int(sqrt(N)) x int(sqrt(N)) needs N to be a square: the host program
    checks that relation per request, so the model keeps the C path; a request that breaks it is
    handed back, and the Python path names the relation."""
    from tests.graph.test_shape_propagation import token_grid_model
    from tscomp.compiler import compile_model

    path = tmp_path / "grid.onnx"
    token_grid_model(path)
    rt = Runtime.from_compiled(compile_model(str(path), ["batch=1:2", "H=4:128", "W=4:128"], max_variants=1))
    assert rt._relations and rt.request_path_note == "native (C)"
    rt.warm_up()                   # reserves the arena: no request is handed back to grow it
    python = Runtime.from_compiled(rt.model)
    python._request = None
    counting = _Counting(rt)
    rng = np.random.default_rng(0)
    for n, h, w in [(1, 24, 24), (2, 16, 36), (1, 4, 4)]:
        x = {"x": rng.standard_normal((n, 3, h, w)).astype(np.float32)}
        np.testing.assert_array_equal(rt.run(x)["y"], python.run(x)["y"])
    assert counting.served == 3
    with pytest.raises(TscompError, match="break a relation.*Reshape"):
        rt.run({"x": rng.standard_normal((1, 3, 24, 28)).astype(np.float32)})     # 6 x 7 patches
    assert counting.handed_back == 1
    check = rt._native._lib.tscomp_host_relations        # the C check itself refuses 24 x 28, not a kernel
    check.argtypes, check.restype = [ctypes.c_void_p], ctypes.c_int
    at = lambda **b: check(np.array([b[s] for s in rt._native.symbols], np.int64).ctypes.data)
    assert at(batch=1, H=24, W=24) == 0 and at(batch=1, H=24, W=28) > 0


def test_an_equivalent_dtype_spelled_differently_is_served_in_c(bert):
    """int64 made as C long long (numpy type 'q') is the graph's int64 ('l' on Linux): the same
    bytes, so the C path serves it rather than handing every such request back."""
    rt = Runtime(bert[0])
    counting = _Counting(rt)
    good = _inputs(1, 9)
    want = rt.run(good)
    other = {k: v.astype(np.longlong) if v.dtype == np.int64 else v for k, v in good.items()}
    got = rt.run(other)
    assert counting.served == 2 and counting.handed_back == 0
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
