"""Einsum as MatMul (tscomp.graph.einsum): two-operand contractions become views around one
MatMul -- the graph computes what onnxruntime computes, and the compiled model runs the MatMul in
the GEMM families, not on the numpy fallback."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import load_model
from tscomp.graph.reference import run_reference

#: (equation, operand shapes with "L" dynamic, which operand is a constant weight (index) or None)
CASES = [
    ("ibnd,jbnd->bnij", [("L", 2, 4, 8), ("L", 2, 4, 8)], None),      # XLNet content score
    ("ibh,hnd->ibnd", [("L", 2, 16), (16, 4, 8)], 1),                  # XLNet head projection
    ("ibnd,hnd->ibh", [("L", 2, 4, 8), (16, 4, 8)], 1),                # XLNet output projection
    ("hnd,ibh->ibnd", [(16, 4, 8), ("L", 2, 16)], 0),                  # the weight on the left
    ("ibnd,snd->ibns", [("L", 2, 4, 8), (2, 4, 8)], 1),                # batched constant (n)
    ("bnij,jbnd->ibnd", [(2, 4, "L", "L"), ("L", 2, 4, 8)], None),      # contracting the dynamic axis
    ("ijbs,ibns->bnij", [("L", "L", 2, 2), ("L", 2, 4, 2)], None),
    ("i,j->ij", [("L",), (6,)], None),                                  # outer product: no K
    ("bi,bi->b", [(3, "L"), (3, "L")], None),                           # no free label on either side
    ("nd,dm->mn", [("L", 8), (8, 5)], 1),
    ("bhqd,bhkd->bhqk", [(2, 3, "L", 8), (2, 3, "L", 8)], None),
    ("ijbn->bnij", [("L", "L", 2, 4)], None),                           # a permutation: one Transpose
    # an ellipsis: spelled out as labels, aligned from the right
    ("...qhd,...khd->...hqk", [(2, "L", 9, 4, 8), (2, "L", 27, 4, 8)], None),   # LongT5 block-local scores
    ("...hqk,...khd->...qhd", [(2, "L", 4, 9, 27), (2, "L", 27, 4, 8)], None),  # ... and their values
    ("...ij,jk->...ik", [(3, "L", 5), (5, 6)], 1),                     # an ellipsis one side only
    ("b...d,bd->b...", [(2, "L", 8), (2, 8)], None),                   # in the middle of a term
    ("...ij->...ji", [(2, "L", 3)], None),                             # a permutation
]


def _model(tmp_path, equation, shapes, weight):
    rng = np.random.default_rng(0)
    inputs, inits, names = [], [], []
    for k, shape in enumerate(shapes):
        if k == weight:
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), f"w{k}"))
        else:
            inputs.append(helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, list(shape)))
        names.append(f"w{k}" if k == weight else f"x{k}")
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "einsum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path, inputs


def _feeds(inputs, L, rng):
    return {i.name: rng.standard_normal([L if d.dim_param == "L" else d.dim_value
                                         for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in inputs}


@pytest.mark.parametrize("equation,shapes,weight", CASES, ids=[c[0] for c in CASES])
def test_an_einsum_becomes_views_around_one_matmul_with_onnxruntimes_values(tmp_path, equation, shapes, weight):
    path, inputs = _model(tmp_path, equation, shapes, weight)
    graph = load_model(path, ["L=1:40"])
    ops = [n.op_type for n in graph.nodes]
    assert "Einsum" not in ops and ops.count("MatMul") == (len(shapes) == 2), ops
    assert set(ops) <= {"MatMul", "Transpose", "Reshape", "Unsqueeze", "Squeeze"}, ops
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for L in (1, 7, 40):
        feeds = _feeds(inputs, L, rng)
        np.testing.assert_allclose(run_reference(graph, feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_einsums_that_are_not_a_matrix_product_stay_einsums(tmp_path):
    """A diagonal (a label twice in one term), a label summed in one operand alone, three operands."""
    for equation, shapes in (("ii,ij->j", [(5, 5), (5, "L")]), ("ij,jk->i", [(4, 5), (5, "L")]),
                             ("ij,jk,kl->il", [(3, 4), (4, 5), (5, "L")])):
        path, _ = _model(tmp_path, equation, shapes, None)
        assert [n.op_type for n in load_model(path, ["L=1:8"]).nodes] == ["Einsum"], equation


@pytest.mark.parametrize("equation,shapes,weight", [CASES[0], CASES[1], CASES[4], CASES[5], CASES[12]],
                         ids=["activations", "weight", "batched-constant", "dynamic-contraction", "ellipsis"])
def test_a_compiled_einsum_runs_natively_and_matches_onnxruntime(tmp_path, equation, shapes, weight):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    from tscomp.runtime.artifact import write_artifact
    path, inputs = _model(tmp_path, equation, shapes, weight)
    rt = Runtime(str(write_artifact(compile_model(str(path), ["L=1:40"]), tmp_path / "m.tsc")), num_threads=2)
    assert all(k.family != "numpy" for ks in rt.model.kernels.values() for k in ks)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for L in (1, 13, 40):
        feeds = _feeds(inputs, L, rng)
        np.testing.assert_allclose(rt.run(feeds)["y"], sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
