"""A GEMM group's generated loops stay vector loops when they quantize (QuantizeLinear's division as
:data:`tscomp.codegen.c_expr.QUOTIENT_HELPER`'s FMA sequence) around a GELU (erf or tanh form): a
ConvNeXt or Gemma block's MLP in a QDQ model. A NaN test written ``q != q`` in that helper, and
``ts_tanhf``'s ``(x < 0 ? -x : x) < c`` (a select of two comparisons), each kept GCC from
vectorizing such a loop: the model ran 2-3x slower, every result still right. Checked on the
generated source with GCC's own vectorization report."""
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


def _qdq_gelu_model(tmp_path, gelu: str, K=16, N=64):
    """x -> MatMul -> QDQ -> GELU -> QDQ (the GEMM's epilogue), and for ``gelu="tanh"`` a second
    MatMul that reads the result (the same chain as its A prologue)."""
    rng = np.random.default_rng(3)
    inits, nodes = [], []

    def const(name, value, dtype=TP.FLOAT):
        inits.append(helper.make_tensor(name, dtype, [], [value]))
        return name

    def qdq(x, tag, scale, zp):
        s, z = const(f"s{tag}", scale), const(f"z{tag}", zp, TP.UINT8)
        nodes.extend([helper.make_node("QuantizeLinear", [x, s, z], [f"q{tag}"]),
                      helper.make_node("DequantizeLinear", [f"q{tag}", s, z], [f"d{tag}"])])
        return f"d{tag}"

    def matmul(x, tag, k, n):
        w = rng.standard_normal((k, n)).astype(np.float32) / 4
        inits.append(helper.make_tensor(f"W{tag}", TP.FLOAT, w.shape, w.reshape(-1).tolist()))
        nodes.append(helper.make_node("MatMul", [x, f"W{tag}"], [f"mm{tag}"]))
        return f"mm{tag}"

    def gelu_of(x):
        if gelu == "erf":   # 0.5 x (1 + erf(x / sqrt 2))
            nodes.extend([helper.make_node("Div", [x, const("sqrt2", 1.4142135)], ["xs"]),
                          helper.make_node("Erf", ["xs"], ["e"])])
        else:               # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            nodes.extend([helper.make_node("Mul", [x, x], ["x2"]), helper.make_node("Mul", ["x2", x], ["x3"]),
                          helper.make_node("Mul", ["x3", const("c3", 0.044715)], ["cx3"]),
                          helper.make_node("Add", [x, "cx3"], ["inner"]),
                          helper.make_node("Mul", ["inner", const("k", 0.7978846)], ["kin"]),
                          helper.make_node("Tanh", ["kin"], ["e"])])
        nodes.extend([helper.make_node("Add", ["e", const("one", 1.0)], ["e1"]),
                      helper.make_node("Mul", [x, "e1"], ["m"]), helper.make_node("Mul", ["m", const("half", 0.5)], ["g"])])
        return "g"
    out = qdq(gelu_of(qdq(matmul("x", 0, K, N), 0, 0.0024068237, 122)), 1, 0.0014896005, 81)
    if gelu == "tanh":
        out = matmul(out, 1, N, K)
    graph = helper.make_graph(nodes, "qdq_gelu", [helper.make_tensor_value_info("x", TP.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info(out, TP.FLOAT, ["M", None])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / f"qdq_gelu_{gelu}.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("gelu", ["erf", "tanh"])
def test_quantizing_gelu_loops_of_a_gemm_group_are_vectorized(tmp_path, gelu):
    plan = fuse(G.load_model(_qdq_gelu_model(tmp_path, gelu), ["M=1:1024"]))
    gemms = [g for g in plan.groups if g.kind == "gemm"]
    assert gemms, plan.describe()
    checked = 0
    for group in gemms:
        source = compile_gemm_group(plan, group).source
        if "ts_quotient(" not in source:
            continue
        lines = source.splitlines()
        # every simd loop whose body quantizes: the loop header follows its pragma
        loops = [i + 1 for i, line in enumerate(lines, 1) if "#pragma omp simd" in line and
                 any("ts_quotient(" in body for body in lines[i:i + 12])]
        path = tmp_path / f"{group.name}.c"
        path.write_text(source)
        flags = [f for f in BASE_FLAGS if f != "-shared"] + list(vector_width_flags())
        report = subprocess.run([compiler(), *flags, "-fopt-info-vec-optimized", "-c", str(path), "-o", str(tmp_path / "k.o")],
                                capture_output=True, text=True, check=True).stderr
        vectorized = {int(n) for n in re.findall(rf"{group.name}\.c:(\d+):\d+: optimized: loop vectorized", report)}
        missed = [n for n in loops if not vectorized & {n, n + 1}]
        assert not missed, f"{group.name}: quantizing loops at lines {missed} are not vectorized"
        checked += len(loops)
    assert checked >= (2 if gelu == "erf" else 3)
