"""Identical kernels compile to one function: a model's repeated layers share their code, each
keeps its own data, and the artifact links every function once."""
from __future__ import annotations

import types

import numpy as np
import onnxruntime as ort

from tscomp.codegen.sharing import canonical_source, share_identical_kernels
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact
from tests.schedule.test_schedules import two_layer_mlp

BODY = "void {f}(float* y, long n) {{ for (long i = 0; i < n; ++i) y[i] = {c} * y[i]; }}\n"


def kernel(func: str, group: str, c: str = "2.0f"):
    return types.SimpleNamespace(func=func, source=f"/*\n * kernel for group {group}\n */\n" + BODY.format(f=func, c=c))


def test_the_canonical_source_drops_the_header_and_names_the_entry_point_kernel():
    k = kernel("tscomp_g7_gemm", "g7_gemm")
    text = canonical_source(k.source, k.func)
    assert "g7" not in text and text.lstrip().startswith("void KERNEL(")


def test_the_canonical_source_drops_comments_inside_the_body_but_keeps_string_literals():
    src = ('void f(float* y) {\n    /* LayerNormalization node_layer_norm_3: row statistics */\n'
           '    y[0] = 1.0f;  // the first element\n    puts("a /* not a comment */ and // neither");\n}\n')
    text = canonical_source(src, "f")
    assert "node_layer_norm_3" not in text and "first element" not in text
    assert '"a /* not a comment */ and // neither"' in text and "y[0] = 1.0f;" in text


def test_kernels_differing_only_in_comments_that_name_their_layer_share_one_function():
    # a fused LayerNorm epilogue's row pass names its ONNX node inside the body: layer 3's kernel
    # is still layer 1's machine code
    body = "void {f}(float* y) {{\n    /* LayerNormalization {node}: row statistics */\n    y[0] = 0.0f;\n}}\n"
    a = types.SimpleNamespace(func="tscomp_g3_gemm", source=body.format(f="tscomp_g3_gemm", node="node_layer_norm_1"))
    b = types.SimpleNamespace(func="tscomp_g9_gemm", source=body.format(f="tscomp_g9_gemm", node="node_layer_norm_3"))
    assert share_identical_kernels([a, b]) == 1 and b.func == "tscomp_g3_gemm"


def test_kernels_differing_only_in_header_and_name_share_the_first_ones_function():
    a, b = kernel("tscomp_g0_gemm", "g0"), kernel("tscomp_g6_gemm", "g6")
    other = kernel("tscomp_g9_gemm", "g9", c="3.0f")       # a different constant: its own function
    assert share_identical_kernels([a, b, other]) == 1
    assert b.func == a.func == "tscomp_g0_gemm" and b.source == a.source
    assert other.func == "tscomp_g9_gemm"


def test_a_two_layer_model_compiles_each_distinct_kernel_once_and_stays_exact(tmp_path):
    # biases wider than MAX_INLINE_CONST are kernel arguments, so the layers' sources are identical
    # (an inlined constant array would make them differ, and then they are not shared)
    path = two_layer_mlp(tmp_path / "mlp.onnx", hidden=96, inner=128)
    model = compile_model(path, ["B=1:2", "L=1:33"])
    gemms = [ks[0] for ks in model.kernels.values() if ks[0].family == "gemm"]
    assert len(gemms) == 4 and len({k.func for k in gemms}) == 2      # layer 1 runs layer 0's functions
    assert len({id(k.packed) for k in gemms}) == 4                      # each with its own weights
    write_artifact(model, tmp_path / "mlp.tsc")
    kernel_files = sorted(p.name for p in (tmp_path / "mlp.tsc" / "kernels").glob("*gemm*.c"))
    assert len(kernel_files) == len({k.func for ks in model.kernels.values() for k in ks if k.family == "gemm"})
    rt = Runtime(tmp_path / "mlp.tsc")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for B, L in ((1, 1), (2, 7), (1, 33), (2, 13)):
        x = rng.standard_normal((B, L, 96)).astype(np.float32)
        np.testing.assert_allclose(next(iter(rt.run({"x": x}).values())), sess.run(None, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)
