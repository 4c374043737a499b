"""Pooling groups compiled to the native CPU kernels of :mod:`tscomp.codegen.cpu_pool`, checked against
onnxruntime on single-pool ONNX models built with onnx.helper at awkward spatial sizes (1, 7, 13, 97):
MaxPool / AveragePool (count_include_pad both ways, ceil_mode, strides, dilations, asymmetric pads,
SAME) in 1-D and 2-D, GlobalAveragePool / GlobalMaxPool with fused prologue and epilogue."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.codegen.cpu_pool import PoolAnalysis
from tscomp.codegen.families import choose_family
from tscomp.compiler import compile_model
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse
from tscomp.runtime import Runtime

from tests.codegen.onnxruntime_check import assert_matches_onnxruntime

C = 3


def _save(path, nodes, inputs, outputs, opset=19):
    g = helper.make_graph(nodes, "pools", inputs, [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.save(m, str(path))


def _pool_model(path, pools, rank=2):
    """x [batch, C, *spatial] -> Relu -> several pools (each an output); ``pools``: (name, op, attrs)."""
    spatial = ["H", "W"][:rank] if rank == 2 else ["L"]
    nodes = [helper.make_node("Relu", ["x"], ["xr"])]
    for name, op, attrs in pools:
        nodes.append(helper.make_node(op, ["xr"], [name], **attrs))
    _save(path, nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", C, *spatial])], [p[0] for p in pools])
    return spatial


def _compare(path, spatial, sizes, lo=1, expect_family="pool"):
    dims = ["batch=1:3"] + [f"{s}={lo}:100" for s in spatial]
    model = compile_model(str(path), dims, max_variants=1)
    assert model.fallback_groups() == [], {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    pools = [g.name for g in model.plan.groups if g.backbone in ("MaxPool", "AveragePool", "GlobalAveragePool",
                                                                   "GlobalMaxPool")]
    assert pools and all(model.kernels[g][0].family == expect_family for g in pools)
    rng = np.random.default_rng(0)
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path,
                               ((f"{n} {s}", {"x": rng.standard_normal((n, C, *s)).astype(np.float32)})
                                for n, *s in sizes))


POOLS_2D = [
    ("max3s2", "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("max_ceil", "MaxPool", dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
    ("max_dil", "MaxPool", dict(kernel_shape=[2, 2], dilations=[2, 1], pads=[1, 0, 1, 1])),
    # a dilated, strided kernel row: the column pass reads the combined row at stride 2, taps 2 apart
    ("max_wdil", "MaxPool", dict(kernel_shape=[3, 3], strides=[1, 2], dilations=[1, 2], pads=[0, 2, 1, 1])),
    ("avg_wdil", "AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2], dilations=[1, 2], pads=[1, 1, 0, 2])),
    ("avg_excl", "AveragePool", dict(kernel_shape=[3, 3], strides=[1, 2], pads=[1, 2, 0, 1])),
    ("avg_incl", "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("avg_ceil_incl", "AveragePool", dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1,
                                          count_include_pad=1)),
    ("avg_same", "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
    ("gap", "GlobalAveragePool", {}),
    ("gmp", "GlobalMaxPool", {}),
]


def test_pools_2d_match_onnxruntime_at_awkward_sizes(tmp_path):
    path = tmp_path / "p2.onnx"
    spatial = _pool_model(path, POOLS_2D)
    _compare(path, spatial, [(1, 2, 2), (2, 7, 13), (1, 13, 97), (3, 97, 7)], lo=2)


def test_pools_at_size_one(tmp_path):
    path = tmp_path / "p1x1.onnx"
    pools = [("max", "MaxPool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
             ("avg", "AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
             ("avgi", "AveragePool", dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0], count_include_pad=1)),
             ("gap", "GlobalAveragePool", {})]
    spatial = _pool_model(path, pools)
    _compare(path, spatial, [(1, 1, 1), (2, 1, 7), (1, 13, 1)])


def test_pools_1d_match_onnxruntime(tmp_path):
    path = tmp_path / "p1.onnx"
    pools = [("max", "MaxPool", dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
             ("avg", "AveragePool", dict(kernel_shape=[4], strides=[3], pads=[2, 1], ceil_mode=1)),
             ("avgi", "AveragePool", dict(kernel_shape=[3], pads=[1, 1], count_include_pad=1)),
             ("gap", "GlobalAveragePool", {}), ("gmp", "GlobalMaxPool", {})]
    spatial = _pool_model(path, pools, rank=1)
    _compare(path, spatial, [(1, 1), (2, 7), (1, 13), (3, 97)])


def test_global_pool_fuses_prologue_and_epilogue(tmp_path):
    """x*2 (prologue) -> GlobalAveragePool -> Flatten -> +1 (epilogue): one native group."""
    path = tmp_path / "g.onnx"
    two = helper.make_tensor("two", TP.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TP.FLOAT, [], [1.0])
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"]), helper.make_node("GlobalAveragePool", ["x2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Add", ["f", "one"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", C, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], [two, one])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    (group,) = [g for g in plan.groups if g.backbone == "GlobalAveragePool"]
    assert {o.op_type for o in group.ops()} >= {"Mul", "GlobalAveragePool", "Add"}
    assert choose_family(plan, group).family.name == "pool"
    _compare(path, ["H", "W"], [(1, 1, 1), (2, 7, 13), (1, 97, 13)])


def test_maxpool_indices_output_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "i.onnx"
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", C, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None),
                           helper.make_tensor_value_info("i", TP.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    plan = fuse(load_model(str(path), ["batch=1:3", "H=2:100", "W=2:100"]))
    (group,) = plan.groups
    with pytest.raises(UnsupportedOperatorError, match=r"group .*: MaxPool .* with the Indices output"):
        PoolAnalysis(plan, group)


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.UINT8], ids=["float", "uint8-cast"])
def test_a_global_pool_over_a_static_batch_of_one_compiles_natively(tmp_path, dtype):
    """x [1, C, H, W] (-> Cast) -> Sub -> GlobalAveragePool -> Mul: with a batch of one the epilogue's
    composed index names the row (0, c + C*n) -- the same row, once compared whole (the group ran on
    numpy) -- and a uint8 input (a quantized model's) is read by the pool kernel as uint8."""
    prologue = [helper.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT)] if dtype == TP.UINT8 else \
        [helper.make_node("Identity", ["x"], ["xf"])]
    nodes = prologue + [helper.make_node("Sub", ["xf", "z"], ["s"]), helper.make_node("GlobalAveragePool", ["s"], ["p"]),
                        helper.make_node("Mul", ["p", "z"], ["y"])]
    g = helper.make_graph(nodes, "pools", [helper.make_tensor_value_info("x", dtype, [1, C, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [onnx.numpy_helper.from_array(np.float32(0.75), "z")])
    path = tmp_path / "gap1.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), path)
    model = compile_model(str(path), ["H=1:30", "W=1:30"], max_variants=1)
    assert model.fallback_groups() == [], {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    rng = np.random.default_rng(1)
    feeds = []
    for h, w in ((1, 1), (7, 30), (29, 2)):
        x = rng.integers(0, 256, (1, C, h, w)) if dtype == TP.UINT8 else rng.standard_normal((1, C, h, w))
        feeds.append((f"{h}x{w}", {"x": x.astype(np.uint8 if dtype == TP.UINT8 else np.float32)}))
    assert_matches_onnxruntime(Runtime.from_compiled(model), path, feeds)
