"""The ``conv-transpose`` family (``tscomp.codegen.cpu_conv_transpose``): ConvTranspose layers of
decoders and vocoders against onnxruntime at awkward sizes, with fused epilogues."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.codegen.build import host_isa
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact

from tests.codegen.onnxruntime_check import assert_matches_onnxruntime

#: (name, input channels, output channels, kernel, attributes, epilogue)
BRANCHES_2D = [
    ("up2", 12, 8, (2, 2), dict(strides=[2, 2]), "relu"),                                  # UNet / SAM
    ("up4", 12, 6, (4, 4), dict(strides=[4, 4]), None),                                    # DPT reassembly
    ("overlap", 12, 5, (4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1]), "relu"),           # taps overlap
    ("outpad", 12, 7, (3, 3), dict(strides=[2, 2], pads=[1, 0, 1, 2], output_padding=[1, 1]), None),
    ("dilated", 12, 4, (3, 2), dict(strides=[1, 3], dilations=[2, 1]), None),
    ("grouped", 12, 20, (2, 3), dict(strides=[2, 1], pads=[0, 1, 0, 1], group=2), "relu"),  # OCg 10 per group
    ("wide", 12, 40, (2, 2), dict(strides=[2, 2]), None),                                  # 3 channel vectors
]


def _model(path, branches, rank=2, channels=12):
    rng = np.random.default_rng(0)
    spatial = ["H", "W"] if rank == 2 else ["L"]
    inits, nodes, outputs = [], [], []
    for name, cin, cout, kernel, attrs, epi in branches:
        g = attrs.get("group", 1)
        w = rng.standard_normal((cin, cout // g, *kernel)).astype(np.float32) * 0.3
        b = rng.standard_normal(cout).astype(np.float32)
        inits += [helper.make_tensor(f"{name}_w", TP.FLOAT, w.shape, w.ravel()),
                  helper.make_tensor(f"{name}_b", TP.FLOAT, b.shape, b)]
        y = f"{name}_y"
        nodes.append(helper.make_node("ConvTranspose", ["x", f"{name}_w", f"{name}_b"], [y], **attrs))
        if epi == "relu":
            nodes.append(helper.make_node("Relu", [y], [f"{name}_r"]))
            y = f"{name}_r"
        outputs.append(helper.make_tensor_value_info(y, TP.FLOAT, None))
    graph = helper.make_graph(nodes, "convt", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", channels, *spatial])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return spatial


def _compare(path, dims, sizes, channels=12, artifact=None):
    model = compile_model(str(path), dims, max_variants=1)
    assert model.fallback_groups() == [], {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    assert {k.family for ks in model.kernels.values() for k in ks} == {"conv-transpose"}
    rt = Runtime(write_artifact(model, artifact), num_threads=2) if artifact else \
        Runtime.from_compiled(model, num_threads=2)
    assert rt.executor == "native"
    rng = np.random.default_rng(1)
    assert_matches_onnxruntime(rt, path, ((f"{n}x{s}", {"x": rng.standard_normal((n, channels, *s)).astype(np.float32)})
                                          for n, *s in sizes))


@pytest.fixture(autouse=True)
def _vector_host():
    if host_isa() not in ("avx2", "avx512", "amx"):
        pytest.skip(f"ConvTranspose kernels need AVX2 or AVX-512 (host: {host_isa()})")


def test_conv_transpose_2d_layers_match_onnxruntime_at_awkward_sizes(tmp_path):
    """Disjoint patches (stride = kernel), overlapping taps, asymmetric pads with output_padding,
    dilation, groups, several channel vectors; 1x1 inputs, odd sizes, batches; and the artifact."""
    path = tmp_path / "convt.onnx"
    _model(path, BRANCHES_2D)
    _compare(path, ["batch=1:3", "H=1:40", "W=1:40"], [(1, 1, 1), (2, 7, 13), (1, 40, 3), (3, 5, 40)],
             artifact=tmp_path / "convt.tsc")


def test_conv_transpose_1d_upsampler_with_overlapping_taps_matches_onnxruntime(tmp_path):
    """HiFi-GAN's upsampler: kernel 16, stride 8, pads 4 (each output sums two input frames)."""
    path = tmp_path / "convt1d.onnx"
    _model(path, [("up8", 12, 6, (16,), dict(strides=[8], pads=[4, 4]), "relu"),
                  ("up3", 12, 17, (3,), dict(strides=[3], pads=[0, 1], output_padding=[2]), None)], rank=1)
    _compare(path, ["batch=1:2", "L=1:300"], [(1, 1), (2, 97), (1, 300)])


def test_conv_transposes_whose_pads_follow_the_output_size_match_onnxruntime(tmp_path):
    """auto_pad SAME_UPPER / SAME_LOWER (output = input x stride) and an explicit output_shape (as
    tf2onnx writes Conv2DTranspose): the pads are the spec's split of the total, per call."""
    path = tmp_path / "same.onnx"
    _model(path, [("upper", 12, 4, (3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER"), None),
                  ("lower", 12, 4, (4, 3), dict(strides=[2, 3], auto_pad="SAME_LOWER"), "relu")])
    _compare(path, ["batch=1:2", "H=1:30", "W=1:30"], [(1, 1, 1), (2, 7, 13), (1, 30, 2)])
    fixed = tmp_path / "output_shape.onnx"
    _model(fixed, [("os", 12, 5, (3, 3), dict(strides=[2, 2], output_shape=[20, 19]), None)])
    _compare(fixed, ["batch=1:2", "H=10:10", "W=10:10"], [(1, 10, 10), (2, 10, 10)])


def test_the_row_blocking_rule_keeps_two_threads_busy_and_tasks_near_their_size():
    from tscomp.codegen.cpu_conv_transpose import TASK_POSITIONS, conv_transpose_rows
    assert conv_transpose_rows(1, 1, 1, 100, 100, 2) == 13           # 8 tasks wanted: ceil(100 / 8) rows
    assert conv_transpose_rows(8, 1, 1, 100, 100, 2) == TASK_POSITIONS // 100   # the images suffice
    assert conv_transpose_rows(1, 1, 1, 1, 5000, 2) == 1
