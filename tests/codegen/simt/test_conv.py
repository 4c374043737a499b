"""SIMT implicit-GEMM Conv (im2col gathered while staging, padding zero-filled) against onnxruntime:
strides, dilations, explicit and SAME pads, channel groups, 1-D and 2-D, a fused bias + Relu +
residual epilogue, at awkward spatial sizes; and ViT's patch embedding against the interpreter."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.cpu_conv import ConvAnalysis
from tscomp.codegen.simt.conv import SimtConv
from tscomp.graph.fusion import fuse
from tscomp.graph.reference import bind_symbols


def _model(tmp_path, C, OC, kernel, group=1, residual=False, **attrs):
    rank = len(kernel)
    sp = ["H", "W"][-rank:] if rank == 2 else ["W"]
    x = helper.make_tensor_value_info("x", TP.FLOAT, ["B", C, *sp])
    y = helper.make_tensor_value_info("y", TP.FLOAT, None)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((OC, C // group, *kernel)).astype(np.float32)
    b = rng.standard_normal(OC).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=list(kernel), group=group, **attrs),
             helper.make_node("Relu", ["c"], ["r"])]
    if residual:
        nodes.append(helper.make_node("Add", ["r", "c"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "conv", [x], [y], [onnx.numpy_helper.from_array(w, "w"),
                                                   onnx.numpy_helper.from_array(b, "b")])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path, sp


CASES = [
    dict(C=3, OC=8, kernel=(3, 3), pads=[1, 1, 1, 1]),
    dict(C=4, OC=6, kernel=(3, 3), strides=[2, 2], dilations=[2, 1], pads=[2, 0, 1, 1], group=2, residual=True),
    dict(C=5, OC=40, kernel=(2, 3), auto_pad="SAME_UPPER", strides=[1, 2]),
    dict(C=6, OC=9, kernel=(5,), strides=[2], pads=[2, 1]),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_conv_matches_onnxruntime_at_awkward_sizes(simt_device, tmp_path, case):
    spec = dict(CASES[case])
    path, sp = _model(tmp_path, **spec)
    plan = fuse(G.load_model(str(path), ["B=1:4"] + [f"{s}=1:64" for s in sp]))
    groups = [g for g in plan.groups if g.kind == "gemm"]
    assert len(groups) == 1
    kernel = SimtConv(ConvAnalysis(plan, groups[0]))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(case)
    smallest = {0: 1, 1: 5, 2: 1, 3: 2}[case]      # the smallest input with a non-empty output
    for size in (7, 13, smallest, 64):
        shape = (2, spec["C"]) + (size,) * len(sp)
        x = rng.standard_normal(shape).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = kernel.run({"x": x}, bind_symbols(plan.graph, {"x": x}))
        np.testing.assert_allclose(list(got.values())[0], want, rtol=1e-4, atol=1e-4, err_msg=f"size {size}")


@pytest.mark.models
def test_vit_patch_embedding_matches_the_interpreter(simt_device, exported_model):
    from tests.codegen.plan_runs import check_against_interpreter, model_plan
    plan, ranges = model_plan(exported_model, "vit", "dynamo", attention=False)
    kernels = {g.name: SimtConv(ConvAnalysis(plan, g)) for g in plan.groups
               if g.kind == "gemm" and any(o.op_type == "Conv" for o in g.ops())}
    assert len(kernels) == 1
    assert check_against_interpreter(plan, "vit", ranges, kernels) == 2
