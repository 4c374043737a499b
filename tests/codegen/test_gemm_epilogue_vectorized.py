"""A GEMM group's tile epilogue stays a vector loop when it quantizes (QuantizeLinear's division as
:data:`tscomp.codegen.c_expr.QUOTIENT_HELPER`'s FMA sequence, a GELU between two quantizations: a
ConvNeXt block's pointwise layer in a QDQ model). A NaN test written ``q != q`` in that helper kept
GCC from vectorizing this loop: the epilogue ran scalar and the model 3x slower, every result still
right. Checked on the generated source with GCC's own vectorization report."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.build import BASE_FLAGS, compiler, vector_width_flags
from tscomp.codegen.cpu_gemm_group import compile_gemm_group
from tscomp.graph.fusion import fuse


def _qdq_gelu_model(tmp_path, K=16, N=64):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N)).astype(np.float32) / 4

    def qdq(x, tag, scale, zp):
        return [helper.make_node("QuantizeLinear", [x, f"s{tag}", f"z{tag}"], [f"q{tag}"]),
                helper.make_node("DequantizeLinear", [f"q{tag}", f"s{tag}", f"z{tag}"], [f"d{tag}"])], \
            [helper.make_tensor(f"s{tag}", TP.FLOAT, [], [scale]), helper.make_tensor(f"z{tag}", TP.UINT8, [], [zp])]
    n0, i0 = qdq("mm", 0, 0.0024068237, 122)
    n1, i1 = qdq("g", 1, 0.0014896005, 81)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), *n0,
             helper.make_node("Div", ["d0", "sqrt2"], ["xs"]), helper.make_node("Erf", ["xs"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["d0", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["g"]), *n1]
    inits = [helper.make_tensor("W", TP.FLOAT, w.shape, w.reshape(-1).tolist()), *i0, *i1,
             helper.make_tensor("sqrt2", TP.FLOAT, [], [1.4142135]), helper.make_tensor("one", TP.FLOAT, [], [1.0]),
             helper.make_tensor("half", TP.FLOAT, [], [0.5])]
    graph = helper.make_graph(nodes, "qdq_gelu", [helper.make_tensor_value_info("x", TP.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("d1", TP.FLOAT, ["M", N])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "qdq_gelu.onnx"
    onnx.save(model, path)
    return path


def test_a_quantizing_gelu_epilogue_is_vectorized(tmp_path):
    plan = fuse(G.load_model(_qdq_gelu_model(tmp_path), ["M=1:1024"]))
    (gemm,) = [g for g in plan.groups if g.kind == "gemm"]
    source = compile_gemm_group(plan, gemm).source
    assert "ts_quotient(" in source
    lines = source.splitlines()
    loop = next(i for i, line in enumerate(lines, 1) if re.search(r"for \(int64_t c = 0; c < nv; \+\+c\)", line))
    path = tmp_path / "epilogue.c"
    path.write_text(source)
    flags = [f for f in BASE_FLAGS if f != "-shared"] + list(vector_width_flags())
    report = subprocess.run([compiler(), *flags, "-fopt-info-vec-optimized", "-c", str(path), "-o", str(tmp_path / "e.o")],
                            capture_output=True, text=True, check=True).stderr
    vectorized = {int(n) for n in re.findall(r"epilogue\.c:(\d+):\d+: optimized: loop vectorized", report)}
    assert vectorized & {loop, loop + 1}, f"the epilogue loop (line {loop}) is not vectorized: {sorted(vectorized)}"
