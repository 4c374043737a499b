"""Differential fuzzing against onnxruntime (issue 12): random small graphs over the registered
ops (:mod:`tests.fuzz.graphs`), compiled with symbolic dims, run at random bindings inside the
declared ranges, compared with onnxruntime at rtol = atol = 1e-4.

``make test`` runs a fixed-seed slice (``FUZZ_EXAMPLES`` graphs, derandomized). The long run:

    TSCOMP_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -p no:xdist tests/fuzz -q

(``TSCOMP_FUZZ_SEED=<int>`` explores other graphs than the fixed slice, ``TSCOMP_FUZZ_LOG=<file>``
appends one line per graph checked and keeps the graph being checked in ``<file>.current.onnx``
/ ``.current.txt``, which outlive a native crash; hypothesis shrinks a
failure to a minimal graph, printed with its ops, inputs and bindings). Regression cases for bugs
the fuzzer found live at the end of this file.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz.graphs import GraphCase, graph_cases

ort = pytest.importorskip("onnxruntime")

FUZZ_EXAMPLES = int(os.environ.get("TSCOMP_FUZZ_EXAMPLES", "12"))
FUZZ_SEED = os.environ.get("TSCOMP_FUZZ_SEED")
RTOL = ATOL = 1e-4

#: counts of the last run (graphs compiled, bindings compared), printed by the long run
STATS = {"graphs": 0, "bindings": 0}


def check_against_onnxruntime(case: GraphCase) -> None:
    """Compile ``case`` with tscomp, run it at each binding, compare every output with onnxruntime."""
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    log = os.environ.get("TSCOMP_FUZZ_LOG")
    if log:   # a native crash kills the process before hypothesis can report: keep the graph first
        onnx.save(case.model, log + ".current.onnx")
        with open(log + ".current.txt", "w") as f:
            f.write(f"{case.describe()}\nbindings {case.bindings}\ndims {case.dims}\n")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.onnx"
        onnx.save(case.model, str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        rt = Runtime.from_compiled(compile_model(str(path), case.dims))
        STATS["graphs"] += 1
        for binding in case.bindings:
            feeds = case.feeds(binding)
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            got = rt.run(feeds)
            for name, w in want.items():
                assert got[name].shape == w.shape, f"{name}: shape {got[name].shape} != {w.shape}; {case.describe()}"
                np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL,
                                           err_msg=f"{name} at {binding}; {case.describe()}")
            STATS["bindings"] += 1
    if log:                      # progress of a long run, readable while it runs
        with open(log, "a") as f:
            f.write(f"graph {STATS['graphs']} ok ({len(case.bindings)} bindings, {STATS['bindings']} in all): "
                    f"{case.describe()}\n")


#: ``TSCOMP_FUZZ_SHRINK=0`` reports a failing graph as drawn (shrinking a compiled graph can take minutes)
PHASES = [p for p in Phase if os.environ.get("TSCOMP_FUZZ_SHRINK", "1") != "0" or p is not Phase.shrink]

_settings = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=FUZZ_SEED is None, phases=PHASES,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much], database=None, print_blob=True)


@_settings
@given(case=graph_cases())
def test_random_graph_matches_onnxruntime_at_random_bindings(case):
    check_against_onnxruntime(case)


if FUZZ_SEED is not None:
    test_random_graph_matches_onnxruntime_at_random_bindings = seed(int(FUZZ_SEED))(
        test_random_graph_matches_onnxruntime_at_random_bindings)


def teardown_module(module):
    print(f"\nfuzz: {STATS['graphs']} graphs compiled, {STATS['bindings']} bindings compared with onnxruntime")


# ---------------------------------------------------------------------------------------------
# Regressions: each bug the fuzzer found, as the graph it shrank to.
def regression_case(nodes, inputs: dict, inits: dict, outputs: list[str], bindings) -> GraphCase:
    from onnx import TensorProto, helper, numpy_helper
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "regression", vis,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return GraphCase(model, {n: (np.float32, s) for n, s in inputs.items()}, {}, bindings, 0)


def test_softmax_over_a_one_element_row_keeps_its_exp_inside_the_row():
    """Softmax of a [1] slice of a reduction: the row has no loop, and exp(x - max) was hoisted
    above the declaration of the row maximum (C compile error 'mx0' undeclared)."""
    from onnx import helper
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("Slice", ["s", "st", "en", "ax", "sp"], ["sl"]),
             helper.make_node("Softmax", ["sl"], ["y"], axis=0)]
    inits = {"axes": np.array([1], np.int64), "st": np.array([0], np.int64), "en": np.array([1], np.int64),
             "ax": np.array([-1], np.int64), "sp": np.array([1], np.int64)}
    check_against_onnxruntime(regression_case(nodes, {"x": (3, "n")}, inits, ["s", "sl", "y"],
                                              [{"n": 1}, {"n": 7}]))


def test_a_group_whose_source_the_family_refuses_falls_back_instead_of_failing_the_compile():
    """x·xᵀ of a [1, 3] reduction: the batched GEMM family's analysis took the group, and only
    source generation found its output reading the MatMul at a fixed element (compile failed with
    UnsupportedOperatorError); such a group now falls back to numpy with that reason."""
    from onnx import helper
    nodes = [helper.make_node("Relu", ["x"], ["t1"]),
             helper.make_node("ReduceSum", ["t1", "axes"], ["t4"], keepdims=1),
             helper.make_node("Relu", ["t4"], ["t6"]),
             helper.make_node("Transpose", ["t6"], ["t8"], perm=[1, 0]),
             helper.make_node("MatMul", ["t6", "t8"], ["t10"])]
    check_against_onnxruntime(regression_case(nodes, {"x": ("n", 3)}, {"axes": np.array([0], np.int64)},
                                              ["t1", "t4", "t6", "t10"], [{"n": 1}, {"n": 5}, {"n": 13}]))


def test_a_row_sum_of_a_gemm_writes_one_value_per_row():
    """ReduceSum over the columns of x·W: found by the fuzzer under ASan (heap-buffer-overflow
    write in the GEMM kernel's row pass)."""
    from onnx import helper
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t2"]),
             helper.make_node("ReduceSum", ["t2", "axes"], ["t5"], keepdims=1)]
    inits = {"w": np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32),
             "axes": np.array([-1], np.int64)}
    check_against_onnxruntime(regression_case(nodes, {"x": ("n", 6)}, inits, ["t5"],
                                              [{"n": 13}, {"n": 1}, {"n": 5}]))
