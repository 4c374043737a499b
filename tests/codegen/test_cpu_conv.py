"""Conv groups compiled to the native CPU kernels of :mod:`tscomp.codegen.cpu_conv` (implicit GEMM and
direct depthwise), checked against onnxruntime on single-Conv ONNX models built with onnx.helper at
awkward spatial sizes (1, 7, 13, 97): 1-D and 2-D, stride 1/2, padding (asymmetric, SAME), dilation,
groups 1 / in between / C, fused epilogues (bias, BatchNormalization, Relu, SiLU, residual Add)."""
from __future__ import annotations

import pickle

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.codegen.build import build_object
from tscomp.codegen.cpu_conv import (CompiledConv, ConvAnalysis, conv_candidate_configs, conv_source,
                                    phase_planes_pay)
from tscomp.codegen.families import choose_family
from tscomp.codegen.tile_config import TileConfig, TileConfigError
from tscomp.compiler import compile_model
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact

from tests.codegen.onnxruntime_check import assert_matches_onnxruntime

C = 4


def _model(path, branches, *, channels=C, rank=2, opset=17, residual=None, names=None):
    """One input x [N, channels, *spatial] feeding several independent Conv branches, each a graph
    output. ``branches``: (name, OC, kernel, attrs, epilogue) with epilogue a tuple of "bn", "relu",
    "silu", "res" (adds the input ``r`` of the branch's output shape, given by ``residual``)."""
    rng = np.random.default_rng(0)
    spatial = ["H", "W"][:rank] if rank == 2 else ["L"]
    batch = "batch"
    if names:
        batch, *spatial = names
    inits, nodes, outputs = [], [], []
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [batch, channels, *spatial])]

    def const(name, arr):
        inits.append(helper.make_tensor(name, TP.FLOAT, arr.shape, arr.astype(np.float32).ravel()))
        return name

    for name, oc, kernel, attrs, epi in branches:
        group = attrs.get("group", 1)
        w = const(f"{name}_w", rng.standard_normal((oc, channels // group, *kernel)) * 0.5)
        b = const(f"{name}_b", rng.standard_normal(oc))
        y = f"{name}_conv"
        nodes.append(helper.make_node("Conv", ["x", w, b], [y], **attrs))
        for k, step in enumerate(epi):
            z = f"{name}_{k}"
            if step == "bn":
                stats = (("s", rng.uniform(0.5, 2, oc)), ("o", rng.standard_normal(oc)),
                         ("m", rng.standard_normal(oc)), ("v", rng.uniform(0.5, 2, oc)))
                args = [const(f"{name}_{s}", v) for s, v in stats]
                nodes.append(helper.make_node("BatchNormalization", [y, *args], [z], epsilon=1e-3))
            elif step == "relu":
                nodes.append(helper.make_node("Relu", [y], [z]))
            elif step == "silu":
                nodes.append(helper.make_node("Sigmoid", [y], [z + "s"]))
                nodes.append(helper.make_node("Mul", [y, z + "s"], [z]))
            elif step == "res":
                inputs.append(helper.make_tensor_value_info("r", TP.FLOAT, residual))
                nodes.append(helper.make_node("Add", [y, "r"], [z]))
            y = z
        outputs.append(helper.make_tensor_value_info(y, TP.FLOAT, None))
    graph = helper.make_graph(nodes, "convs", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return spatial


def _compile_and_compare(path, spatial, sizes, *, channels=C, lo=1, residual_channels=None, families=None,
                         variants=1):
    dims = ["batch=1:3"] + [f"{s}={lo}:100" for s in spatial]
    model = compile_model(str(path), dims, max_variants=variants)
    assert model.fallback_groups() == [], {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    if families is not None:
        assert {k.family for ks in model.kernels.values() for k in ks} == families
    rng = np.random.default_rng(1)

    def feeds():
        for n, *s in sizes:
            feed = {"x": rng.standard_normal((n, channels, *s)).astype(np.float32)}
            if residual_channels:
                feed["r"] = rng.standard_normal((n, residual_channels, *s)).astype(np.float32)
            yield f"N={n} {s}", feed
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, feeds())
    return model


SIZES_2D = [(1, 1, 1), (2, 7, 13), (1, 13, 97), (3, 97, 7), (1, 1, 13)]

BRANCHES_2D = [
    ("same3", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu", "res")),
    ("stride2", 16, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), ("relu",)),
    ("dilated", 8, (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2]), ("silu",)),
    ("asym", 6, (2, 5), dict(pads=[0, 2, 1, 2], strides=[1, 2]), ()),
    ("stem", 16, (7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2]), ("relu",)),
    ("same_upper", 8, (3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2]), ()),
    ("pointwise_g2", 6, (1, 1), dict(group=2), ("relu",)),
    ("down1x1", 8, (1, 1), dict(strides=[2, 2]), ()),
    ("grouped", 8, (3, 3), dict(group=2, pads=[1, 2, 1, 2], dilations=[1, 2]), ()),
    ("depthwise", C, (3, 3), dict(group=C, pads=[1, 1, 1, 1]), ("relu",)),
    ("depthwise_s2", 2 * C, (3, 3), dict(group=C, pads=[1, 2, 1, 0], strides=[2, 2]), ()),
    ("depthwise_dil", C, (5, 3), dict(group=C, pads=[4, 1, 4, 1], dilations=[2, 1]), ("bn",)),
    ("depthwise_7x7", C, (7, 7), dict(group=C, pads=[3, 3, 3, 3]), ()),          # ConvNeXt's
]


def test_conv2d_branches_match_onnxruntime_at_awkward_sizes(tmp_path):
    path = tmp_path / "conv2d.onnx"
    spatial = _model(path, BRANCHES_2D, residual=["batch", 8, "H", "W"])
    model = _compile_and_compare(path, spatial, SIZES_2D, residual_channels=8,
                                 families={"conv", "conv-depthwise"})
    depthwise = [g for g, ks in model.kernels.items() if ks[0].family == "conv-depthwise"]
    assert len(depthwise) == 4


def test_convs_whose_taps_overlap_gather_from_phase_planes_and_the_others_in_place(tmp_path):
    """The awkward-sizes model above checks the numbers of both gathers; this checks which Convs
    take which: every tap overlap (a kernel wider than its stride on either axis, dilation counted)
    gathers plain copies from the task's phase planes; a 1x1 at stride 2 and a patchify (kernel =
    stride), which read each input element at most once, gather in place."""
    path = tmp_path / "conv2d.onnx"
    _model(path, BRANCHES_2D, residual=["batch", 8, "H", "W"])
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:97", "W=1:97"]))
    seen = {}
    for g in plan.groups:
        if choose_family(plan, g).family.name != "conv":
            continue
        a = ConvAnalysis(plan, g)
        geo = a.geo
        source = conv_source(a, conv_candidate_configs("avx512", a.OCg, a.K)[0], "avx512")
        overlap = geo.kw * geo.dw > geo.sw or geo.kh * geo.dh > geo.sh
        assert a.phased == overlap and ("pack_b_phased(" in source) == overlap, (g.name, geo)
        seen[(geo.kh, geo.kw, geo.sh, geo.sw)] = a.phased
    assert seen[(7, 7, 2, 2)] and seen[(3, 3, 2, 2)] and seen[(2, 5, 1, 2)]      # stem, stride 2, asymmetric
    assert seen[(1, 1, 2, 2)] is False                                          # 1x1 downsampling
    patchify = type("Geo", (), dict(kh=4, kw=4, sh=4, sw=4, dh=1, dw=1))
    assert not phase_planes_pay(patchify)


def test_depthwise_rows_the_taps_end_before_the_input_does(tmp_path):
    """A stride-2 3x3 depthwise without padding on an even width: no tap reads the last input
    column, so the kernel's padded block holds fewer columns than the input row has."""
    path = tmp_path / "dw_tail.onnx"
    spatial = _model(path, [("dw", C, (3, 3), dict(group=C, strides=[2, 2]), ("relu",))])
    _compile_and_compare(path, spatial, [(1, 3, 3), (2, 8, 8), (1, 9, 14), (3, 100, 4)], lo=3,
                         families={"conv-depthwise"})



def test_depthwise_tasks_that_take_several_channels_of_a_small_image_match_onnxruntime(tmp_path):
    """48 channels at 3..13 pixels a side: a task takes several whole channels (and one padding of
    the phase planes serves them all); a channel multiplier, stride 3 with dilation 2 (nine phase
    planes, taps landing in several of them), and a 5x5 at stride 2 (more taps than registers: one
    pass per kernel column over blocks of 4 output rows, the rows after the last block flat)."""
    path = tmp_path / "dw_small.onnx"
    channels = 48
    spatial = _model(path, [("dw", channels, (3, 3), dict(group=channels, pads=[1, 1, 1, 1]), ("relu",)),
                            ("dw_mult", 2 * channels, (3, 3), dict(group=channels, pads=[0, 1, 2, 1]), ()),
                            ("dw_s3", channels, (3, 5), dict(group=channels, pads=[2, 3, 2, 3], strides=[3, 3],
                                                             dilations=[2, 2]), ("bn",)),
                            ("dw_5x5_s2", channels, (5, 5), dict(group=channels, pads=[2, 1, 2, 3], strides=[2, 2]),
                             ())], channels=channels)
    _compile_and_compare(path, spatial, [(1, 3, 3), (2, 7, 13), (1, 13, 5), (3, 4, 11)], channels=channels, lo=3,
                         families={"conv-depthwise"})

BRANCHES_1D = [
    ("k3", 8, (3,), dict(pads=[1, 1]), ("relu",)),
    ("k4s2", 8, (4,), dict(pads=[1, 2], strides=[2]), ()),
    ("dil", 6, (3,), dict(pads=[2, 2], dilations=[2]), ()),
    ("dw", C, (3,), dict(group=C, pads=[1, 1]), ()),
    ("g2", 6, (5,), dict(group=2, pads=[2, 2], strides=[2]), ("silu",)),
]


def test_conv1d_branches_match_onnxruntime_at_awkward_sizes(tmp_path):
    path = tmp_path / "conv1d.onnx"
    spatial = _model(path, BRANCHES_1D, rank=1)
    _compile_and_compare(path, spatial, [(1, 1), (2, 7), (1, 13), (3, 97)])


def test_patch_embedding_conv_matches_onnxruntime(tmp_path):
    """ViT's patch embedding: kernel = stride = patch, no padding (sizes from one patch up)."""
    path = tmp_path / "patch.onnx"
    spatial = _model(path, [("patch", 24, (4, 4), dict(strides=[4, 4]), ())], channels=3)
    _compile_and_compare(path, spatial, [(1, 4, 4), (2, 7, 13), (1, 13, 97), (1, 97, 7)], channels=3, lo=4)


def test_deep_conv_with_several_k_steps_and_channel_blocks_matches_onnxruntime(tmp_path):
    """K = 64·3·3 = 576 takes several K steps (partial sums), 70 channels a partial register tile,
    200 channels several channel blocks (one task sweeping them all, or runs of them when one image
    of 1x7 positions leaves fewer tasks than threads), 13x97 positions several position blocks."""
    path = tmp_path / "deep.onnx"
    branches = [("deep", 70, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu",)),
                ("deep_wide", 200, (3, 3), dict(pads=[1, 1, 1, 1]), ()),   # 3 channel blocks x K steps
                ("wide1x1", 130, (1, 1), dict(), ())]
    spatial = _model(path, branches, channels=64)
    model = _compile_and_compare(path, spatial, [(1, 13, 97), (2, 1, 7), (1, 1, 7)], channels=64, variants=2)
    kernels = [k for ks in model.kernels.values() for k in ks if isinstance(k.cfg, TileConfig) and k.cfg.kc < 576]
    assert kernels, "expected a configuration with several K steps"


# ------------------------------------------------------------------ family, configs, ISAs
def _plan(tmp_path, branches, **kw):
    path = tmp_path / "m.onnx"
    spatial = _model(path, branches, **kw)
    graph = load_model(str(path), ["batch=1:3"] + [f"{s}=1:100" for s in spatial])
    return fuse(graph)


def test_conv_group_is_taken_by_the_conv_family_with_the_epilogue_fused(tmp_path):
    plan = _plan(tmp_path, [("a", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu"))])
    (group,) = plan.groups
    choice = choose_family(plan, group)
    assert choice.family.name == "conv"
    src = conv_source(choice.analysis, conv_candidate_configs("avx2", 8, 36)[0], "avx2")
    assert "fused epilogue: bias, Mul, Add, Relu" in src     # BatchNormalization: its affine (simplify)
    assert "_mm256_fmadd_ps" in src and "im2col" in src


def test_every_isa_generates_its_micro_kernel_and_avx512_compiles(tmp_path):
    plan = _plan(tmp_path, [("a", 16, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu",))])
    analysis = ConvAnalysis(plan, plan.groups[0])
    for isa, intrinsic in (("avx512", "_mm512_fmadd_ps"), ("avx2", "_mm256_fmadd_ps"), ("scalar", "fmaf(")):
        cfgs = conv_candidate_configs(isa, analysis.OCg, analysis.K)
        assert cfgs and all(c.validate(isa, row_vectors=True) for c in cfgs)
        src = conv_source(analysis, cfgs[0], isa)
        assert intrinsic in src
    build_object(conv_source(analysis, conv_candidate_configs("avx512", 16, 36)[0], "avx512"),
                 "conv_avx512_compile_check", extra_flags=("-mavx512f",))


def test_scalar_kernel_runs_and_matches_onnxruntime(tmp_path):
    path = tmp_path / "s.onnx"
    _model(path, [("a", 5, (3, 3), dict(pads=[1, 0, 0, 1], strides=[2, 1]), ("relu",))])
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    analysis = ConvAnalysis(plan, plan.groups[0])
    kernel = CompiledConv(analysis, conv_candidate_configs("scalar", 5, 36)[0], "scalar")
    x = np.random.default_rng(0).standard_normal((2, C, 13, 7)).astype(np.float32)
    env = {name: plan.graph.values[name].const for name in plan.groups[0].inputs if name != "x"} | {"x": x}
    got = kernel.run(env, {"batch": 2, "H": 13, "W": 7})
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4)


def _assert_kernel_matches_onnxruntime(kernel, plan, path, channels: int, sizes, residual: int | None = None):
    """Run ``kernel`` (the plan's one Conv group) at each (n, h, w) of ``sizes`` on random inputs (and a
    residual of ``residual`` channels) and compare it with onnxruntime on the model at ``path``."""
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    env0 = {name: plan.graph.values[name].const for name in plan.groups[0].inputs if name not in ("x", "r")}
    for n, h, w in sizes:
        feed = {"x": rng.standard_normal((n, channels, h, w)).astype(np.float32)}
        if residual:
            feed["r"] = rng.standard_normal((n, residual, h, w)).astype(np.float32)
        got = kernel.run(env0 | feed, {"batch": n, "H": h, "W": w})
        want = sess.run(None, feed)[0]
        np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{kernel.func} {n}x{h}x{w}")


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("branch,channels", [
    (("deep", 70, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu")), 64),       # partial channel tile, K steps
    (("wide1x1", 130, (1, 1), dict(), ()), 48),                                 # pointwise gather
    (("stride2", 40, (3, 3), dict(pads=[1, 0, 1, 2], strides=[2, 2]), ("relu",)), 8),
    (("grouped", 36, (3, 3), dict(group=2, pads=[1, 2, 1, 2], dilations=[1, 2]), ("silu",)), 16),  # OCg 18
])
def test_row_vector_tiles_match_onnxruntime_at_few_and_many_positions(tmp_path, isa, branch, channels):
    """``vector_axis`` 0: the lanes run along the output channels and the positions are broadcast
    (a late stage's 2x2 positions fill no column vector); the finished tile is transposed back into
    the [channel, position] tile the fused epilogue reads; a last tile of fewer than NR positions
    runs the kernel of exactly its width. Positions 1, 4, a prime and several position blocks (tails
    of 1 to 4 of 5 positions); channels past a whole register tile; several K steps."""
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.cpu_gemm import ISA_RANK
    from tscomp.codegen.tile_config import TileConfig
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"{isa} kernels do not run on this host ({host_isa()})")
    path = tmp_path / "rv.onnx"
    _model(path, [branch], channels=channels)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    analysis = ConvAnalysis(plan, plan.groups[0])
    mr = {"avx512": 32, "avx2": 16}[isa]
    cfg = TileConfig(mr=mr, nr=5, mc=2 * mr, nc=15, kc=min(analysis.K, 40), vector_axis=0)
    kernel = CompiledConv(analysis, cfg, isa)
    assert "the SIMD lanes along the channels" in kernel.source and "x5v_b" in kernel.func
    assert all(f"micro_kernel_{n}(" in kernel.source for n in range(1, 5)) and "micro_kernel_5(" not in kernel.source
    _assert_kernel_matches_onnxruntime(kernel, plan, path, channels, [(1, 1, 1), (1, 2, 2), (2, 7, 13), (1, 23, 17)])


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("planes", [False, True])
@pytest.mark.parametrize("branch,channels", [
    (("same3", 21, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu")), 24),     # partial channel tile, K steps
    (("wide1x1", 40, (1, 1), dict(), ("relu",)), 48),
])
def test_column_tiles_run_a_last_partial_position_tile_in_whole_vectors(tmp_path, isa, branch, channels, planes):
    """fp32 column-vector tiles of 4 vectors (AVX2: 3) compute a last position tile of fewer vectors'
    worth of positions with the narrow kernel of just that many vectors (its partial sums kept at the
    tile's row stride across K steps): positions leaving tails of 1 to 4 vectors (1, 17, 40, 50,
    97, 144, 3 x 37 images) against onnxruntime; the wave model counts those vectors (3 x 11: 33 or,
    along the padded width, 37 positions -- fewer vectors than a whole tile)."""
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.cpu_conv import column_tail_granule, conv_task_grid, plane_positions
    from tscomp.codegen.cpu_gemm import ISA_RANK
    from tscomp.runtime.wave import task_classes
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"{isa} kernels do not run on this host ({host_isa()})")
    if planes and branch[2] == (1, 1):
        pytest.skip("the padded planes are for Convs with taps")
    path = tmp_path / "narrow.onnx"
    _model(path, [branch], channels=channels)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    analysis = ConvAnalysis(plan, plan.groups[0])
    width, vectors = {"avx512": (16, 4), "avx2": (8, 3)}[isa]
    cfg = TileConfig(mr=4, nr=vectors * width, mc=8, nc=2 * vectors * width, kc=min(analysis.K, 40), planes=planes)
    kernel = CompiledConv(analysis, cfg, isa)
    assert column_tail_granule(cfg, isa) == width
    assert all(f"micro_kernel_v{n}(" in kernel.source for n in range(1, vectors))
    assert f"micro_kernel_v{vectors}(" not in kernel.source
    _assert_kernel_matches_onnxruntime(kernel, plan, path, channels,
                                       [(1, 1, 1), (1, 1, 17), (1, 5, 8), (1, 5, 10), (1, 1, 97), (2, 12, 12), (3, 37, 3)])
    P = plane_positions(3, 11, analysis.geo) if planes else 3 * 11     # one partial tile: 33 or 37 positions
    classes = task_classes(kernel, {"batch": 1, "H": 3, "W": 11}, 2)
    n_ob = -(-analysis.OCg // 8)
    _, runs = conv_task_grid(P, 1, n_ob, cfg, 2)
    channels = runs * -(-n_ob // runs) * 8            # each run counted at its widest
    tiles = -(-P // cfg.nr)
    computed = (tiles - 1) * cfg.nr + -(-(P - (tiles - 1) * cfg.nr) // width) * width
    assert computed < tiles * cfg.nr and sum(c * wk for c, wk in classes) == computed * channels * analysis.K, P


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("branch,channels", [
    (("same3", 70, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu", "res")), 24),  # partial tile, K steps, residual
    (("stride2", 40, (3, 3), dict(pads=[1, 0, 1, 2], strides=[2, 2]), ("relu",)), 8),   # asymmetric pads
    (("stem", 16, (7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2]), ("relu",)), 3),
    (("dilated", 12, (5, 3), dict(pads=[4, 1, 4, 1], dilations=[2, 1]), ("silu",)), 6),
    (("grouped", 36, (3, 3), dict(group=2, pads=[1, 2, 1, 2], dilations=[1, 2]), ()), 16),
    (("asym", 6, (2, 5), dict(pads=[0, 2, 1, 2], strides=[1, 2]), ()), 8),
])
def test_padded_plane_tiles_match_onnxruntime(tmp_path, isa, branch, channels):
    """``planes``: the tiles read the task's zero-padded input planes in place (one plane per channel
    and stride phase, the positions along the padded width), no im2col gather; every output row's
    padding columns are computed and dropped when the tile is stored. Strides, dilations, asymmetric
    padding, channel groups, a partial channel tile, several K steps and position blocks, images of
    one pixel, one row, one column and prime sizes, a batch."""
    from tscomp.codegen.build import host_isa
    from tscomp.codegen.cpu_conv import PLANE_TILES, plane_configs
    from tscomp.codegen.cpu_gemm import ISA_RANK
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"{isa} kernels do not run on this host ({host_isa()})")
    path = tmp_path / "planes.onnx"
    residual = ["batch", 70, "H", "W"] if "res" in branch[4] else None
    _model(path, [branch], channels=channels, residual=residual)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    analysis = ConvAnalysis(plan, plan.groups[0])
    offered = plane_configs(isa, analysis)          # (strided Convs: not offered, the kernel takes them)
    assert len(offered) == (analysis.geo.sh * analysis.geo.sw == 1)
    (mr, nr), kc = PLANE_TILES[isa], min(analysis.K, 16)
    for cfg in offered + [TileConfig(mr=mr, nr=nr, mc=2 * mr, nc=2 * nr, kc=kc, planes=True)]:
        kernel = CompiledConv(analysis, cfg, isa)
        assert "build_planes(" in kernel.source and "pack_b" not in kernel.source and "p_b" in kernel.func
        _assert_kernel_matches_onnxruntime(kernel, plan, path, channels,
                                           [(1, 1, 1), (1, 1, 37), (1, 29, 1), (2, 7, 13), (1, 23, 17), (1, 61, 53)],
                                           residual=70 if residual else None)


def test_padded_planes_are_offered_beside_the_gathering_tiles_for_convs_with_taps(tmp_path):
    """A unit-stride Conv with taps gets the padded-planes strategy beside its tiles (fp32, NCHW); a 1x1
    (whose gather is a copy) and a strided one do not, and the wave model counts its positions along
    the padded width."""
    from tscomp.codegen.cpu_conv import plane_configs, plane_positions
    from tscomp.runtime.wave import task_classes
    plan = _plan(tmp_path, [("a", 64, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu",)),
                            ("b", 64, (1, 1), dict(), ()),
                            ("c", 64, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), ())], channels=64)
    three, one, strided = (ConvAnalysis(plan, g) for g in plan.groups)
    assert one.pointwise and plane_configs("avx512", one) == [] and plane_configs("scalar", three) == []
    assert plane_configs("avx512", strided) == []
    with pytest.raises(TileConfigError, match="planes"):          # the planes are read along the positions
        TileConfig(mr=64, nr=4, mc=64, nc=64, kc=64, vector_axis=0, planes=True)
    recorded = TileConfig(mr=8, nr=48, mc=64, nc=192, kc=288, planes=1)   # as a tuning record stores it
    assert recorded.planes is True and recorded.slug() == "r8x48p_b64x192x288"
    (cfg,) = plane_configs("avx512", three)
    assert cfg.planes and cfg.vector_axis == 1 and cfg.kc % 8 == 0 and cfg.kc <= three.K
    k = CompiledConv(three, cfg, "avx512")
    classes = task_classes(k, {"batch": 1, "H": 56, "W": 56}, 2)
    assert plane_positions(56, 56, three.geo) == 55 * 58 + 56
    tiles = -(-plane_positions(56, 56, three.geo) // cfg.nr)    # 67 full tiles and 30 positions in 2 vectors
    computed = (tiles - 1) * cfg.nr + 32
    assert sum(c * w for c, w in classes) == computed * -(-64 // cfg.mc) * cfg.mc * three.K


def test_a_few_uneven_tasks_are_evened_out_over_the_threads():
    from tscomp.codegen.cpu_conv import conv_task_grid
    from tscomp.codegen.tile_config import TileConfig
    col = TileConfig(mr=8, nr=32, mc=64, nc=256, kc=64)
    assert conv_task_grid(1080, 1, 4, col, 2) == (6, 1)      # 5 position blocks over 2 threads: 6
    assert conv_task_grid(1080, 2, 4, col, 2) == (5, 1)      # 2 images x 5: already even
    assert conv_task_grid(3136, 1, 4, col, 2) == (13, 1)     # 13 tasks: little idle time left
    assert conv_task_grid(40, 1, 4, col, 2) == (2, 1)        # at most one block per NR positions
    assert conv_task_grid(20, 1, 4, col, 2) == (1, 2)        # one block: the channels in 2 runs
    # row vectors: every task streams its channel blocks' weights, so it is the channels that are cut
    row = TileConfig(mr=64, nr=4, mc=256, nc=64, kc=64, vector_axis=0)
    assert conv_task_grid(6, 1, 2, row, 2) == (1, 2)
    assert conv_task_grid(150, 1, 4, row, 2) == (3, 2)       # 3 position blocks x 2 runs
    assert conv_task_grid(0, 1, 4, row, 2) == (0, 0)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_the_conv_task_grid_over_a_grid_of_shapes_is_the_grid_of_each_shape(threads):
    """The dispatch evaluates the task grid over numpy arrays of shapes; each entry must be what
    the scalar call (the runtime's task count, the kernel's rule) gives for that shape."""
    from tscomp.codegen.cpu_conv import conv_task_grid
    from tscomp.codegen.tile_config import TileConfig
    P, images, n_ob = np.meshgrid([0, 1, 6, 20, 40, 150, 784, 1080, 3136], [0, 1, 2, 3], [1, 2, 4, 7, 16],
                                  indexing="ij")
    for cfg in (TileConfig(mr=8, nr=32, mc=64, nc=256, kc=64), TileConfig(mr=64, nr=4, mc=256, nc=64, kc=64, vector_axis=0)):
        n_pb, runs = conv_task_grid(P, images, n_ob, cfg, threads)
        for i in np.ndindex(P.shape):
            assert (n_pb[i], runs[i]) == conv_task_grid(int(P[i]), int(images[i]), int(n_ob[i]), cfg, threads)
            assert all(isinstance(v, int) for v in conv_task_grid(int(P[i]), int(images[i]), int(n_ob[i]), cfg, threads))


def test_position_blocks_share_the_register_tiles_evenly():
    """ceil(P / nr) register tiles of positions are dealt to the blocks so that no block holds more
    than one tile over another: P = 784 under 64-position tiles in 4 blocks is 3 + 3 + 3 + 4 tiles,
    not 4 + 4 + 4 + 1 (2 threads: 7 tiles against 6, not 8 against 5)."""
    from tscomp.codegen.cpu_conv import position_block_tiles
    assert position_block_tiles(784, 4, 64) == [(3, 3), (1, 4)]
    for P in (1, 31, 32, 33, 196, 784, 3136):
        for n_pb in range(1, -(-P // 32) + 1):
            blocks = [t for c, t in position_block_tiles(P, n_pb, 32) for _ in range(c)]
            assert len(blocks) == n_pb and sum(blocks) == -(-P // 32) and max(blocks) - min(blocks) <= 1, (P, n_pb)


@pytest.mark.parametrize("out_channels,kernel", [(64, 3), (512, 1)])
def test_the_wave_model_costs_the_conv_position_blocks_the_kernel_runs(tmp_path, out_channels, kernel):
    """The task classes of an implicit-GEMM Conv are its blocks as the macro-kernel deals them: every
    task counted once, and together they cover the register tiles of P once per run of channel
    blocks (column tiles pad the last tile; row-vector tiles, with a tail kernel of the exact width,
    do not). 512 channels: a few blocks whose tiles do not divide among the threads are cut into
    channel runs too (MIN_RUN_CHANNELS)."""
    from tscomp.codegen.build import get_num_threads
    from tscomp.codegen.cpu_conv import CompiledConv, column_tail_granule, plane_configs, plane_positions
    from tscomp.runtime.wave import task_classes
    pads = [kernel // 2] * 4
    plan = _plan(tmp_path, [("wide", out_channels, (kernel, kernel), dict(pads=pads), ("relu",))], channels=16)
    analysis = ConvAnalysis(plan, plan.groups[0])
    configs = conv_candidate_configs("avx512", analysis.OCg, analysis.K) + plane_configs("avx512", analysis)
    assert {c.vector_axis for c in configs} == {0, 1} and any(c.planes for c in configs) == (kernel > 1)
    for k in (CompiledConv(analysis, cfg, "avx512") for cfg in configs):
        a = k.analysis
        for n, h, w in ((1, 1, 1), (1, 5, 7), (1, 10, 15), (2, 17, 17), (1, 28, 28), (3, 40, 97)):
            binding = {"batch": n, "H": h, "W": w}      # 10 x 15: 3 row-vector blocks, evened by runs
            classes = task_classes(k, binding, get_num_threads())
            assert sum(c for c, _ in classes) == k.tasks(binding), (k.func, binding)
            P, nr = h * w, k.cfg.nr                   # "same" padding: as many positions as pixels
            if k.cfg.planes:                          # along the padded width
                P = plane_positions(h, w, a.geo)
            granule = column_tail_granule(k.cfg, k.isa)      # the last tile's positions, rounded up
            covered = n * ((-(-P // nr) - 1) * nr + -(-(P - (-(-P // nr) - 1) * nr) // granule) * granule)
            channels = sum(c * wk for c, wk in classes) // (a.Cg * kernel * kernel)
            assert channels % covered == 0 and channels // covered >= a.OCg, (k.func, binding, classes)


def test_row_vector_configs_are_refused_by_the_gemm_kernels():
    from tscomp.codegen.cpu_gemm import generate_gemm
    from tscomp.codegen.tile_config import TileConfig, TileConfigError
    with pytest.raises(TileConfigError, match="columns only"):
        generate_gemm(TileConfig(mr=16, nr=4, mc=32, nc=8, kc=16, vector_axis=0), 16, 8, "avx2")


def test_compiled_conv_pickles_without_the_graph_and_the_raw_weight(tmp_path):
    plan = _plan(tmp_path, [("a", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ())])
    analysis = ConvAnalysis(plan, plan.groups[0])
    kernel = CompiledConv(analysis, conv_candidate_configs("avx2", 8, 36)[0], "avx2")
    state = pickle.loads(pickle.dumps(kernel)).analysis.__dict__
    assert "plan" not in state and "W" not in state
    assert kernel.weight_name == "a_w" and kernel.packed.ctypes.data % 64 == 0


def test_artifact_round_trip_runs_the_prepacked_conv(tmp_path):
    path = tmp_path / "a.onnx"
    _model(path, [("a", 8, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), ("relu",))])
    model = compile_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"], max_variants=2)
    rt = Runtime(write_artifact(model, tmp_path / "a.tsc"), num_threads=2)
    x = np.random.default_rng(0).standard_normal((1, C, 13, 97)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(rt.run({"x": x})["a_0"], want, rtol=1e-4, atol=1e-4)


def _refusal(tmp_path, build, dims) -> str:
    path = tmp_path / "r.onnx"
    onnx.save(build(), str(path))
    plan = fuse(load_model(str(path), dims))
    group = next(g for g in plan.groups if g.backbone == "Conv")
    with pytest.raises(UnsupportedOperatorError) as exc:
        ConvAnalysis(plan, group)
    return str(exc.value)


def test_a_computed_weight_and_a_3d_conv_are_refused_with_the_reason(tmp_path):
    def computed_weight():
        g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 2, "H", "W"]),
                                    helper.make_tensor_value_info("w", TP.FLOAT, [3, 2, 1, 1])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    def conv3d():
        w = helper.make_tensor("w", TP.FLOAT, [3, 2, 1, 1, 1], np.ones(6, np.float32))
        # SAME padding of a strided axis: the graph stage's rewrite onto 2-D (tscomp.graph.volumetric) declines it
        g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2, 2])],
                              "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", 2, "D", "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], [w])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    why = _refusal(tmp_path, computed_weight, ["batch=1:3", "H=1:20", "W=1:20"])
    assert why.startswith("group ") and "weight is not a constant" in why
    why = _refusal(tmp_path, conv3d, ["batch=1:3", "D=1:9", "H=1:20", "W=1:20"])
    assert "only 1-D and 2-D convolutions; a 3-D one is compiled as 2-D when the graph stage can rewrite it" in why


# ------------------------------------------------------------------ the real models
@pytest.mark.models
@pytest.mark.parametrize("family,exporter", [pytest.param(f, e, id=f"{f}-{e}") for f in ("resnet", "vit")
                                             for e in ("dynamo", "torchscript")])
def test_every_conv_and_pool_group_of_the_tiny_cnn_and_vit_gets_a_native_family(exported_model, family, exporter):
    from models.families import symbol_ranges
    ranges = symbol_ranges(family, "tiny")
    path = exported_model(family, "tiny", exporter)
    plan = fuse(load_model(str(path), [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]))
    pooling = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
    groups = [g for g in plan.groups if g.backbone == "Conv" or {o.op_type for o in g.ops()} & pooling]
    assert groups
    for g in groups:
        choice = choose_family(plan, g)
        assert choice.family is not None and choice.family.name in ("conv", "conv-depthwise", "pool"), \
            (g.name, choice.reasons)


def _save_x_to_z(path, nodes, inits, *, opset: int, channels: int = C) -> None:
    """A graph from input x [batch, channels, H, W] to output z, saved at ``path``."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", channels, "H", "W"])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 18 else 9
    onnx.save(m, str(path))


def test_elementwise_prologue_before_a_conv_is_fused_and_matches_onnxruntime(tmp_path):
    """(x * scale + shift[C, 1, 1]) -> Conv -> Relu, an input normalization: one native Conv group."""
    path = tmp_path / "pro.onnx"
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("scale", TP.FLOAT, [], [0.5]),
             helper.make_tensor("shift", TP.FLOAT, [C, 1, 1], rng.standard_normal(C).astype(np.float32)),
             helper.make_tensor("w", TP.FLOAT, [6, C, 3, 3], rng.standard_normal(6 * C * 9).astype(np.float32))]
    nodes = [helper.make_node("Mul", ["x", "scale"], ["xs"]), helper.make_node("Add", ["xs", "shift"], ["xn"]),
             helper.make_node("Conv", ["xn", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["y"], ["z"])]
    _save_x_to_z(path, nodes, inits, opset=17)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
    (group,) = plan.groups
    assert {o.op_type for o in group.ops()} == {"Mul", "Add", "Conv", "Relu"}
    src = conv_source(ConvAnalysis(plan, group), conv_candidate_configs("avx2", 6, 36)[0], "avx2")
    assert "fused prologue: Mul, Add" in src and "x_prologue((float*)X" in src
    _compile_and_compare(path, ["H", "W"], [(1, 1, 1), (2, 7, 13), (1, 97, 13)])


@pytest.mark.parametrize("depthwise", [True, False])
def test_an_epilogue_in_the_transposed_layout_stores_scattered_and_matches_onnxruntime(tmp_path, depthwise):
    """SegFormer's Mix-FFN: Conv -> flatten the image -> transpose to [N, H*W, C] -> GELU, all in
    the Conv's group: each output element computed at (n, c, p) lands at [n, p, c]. 20 channels:
    the depthwise kernel's tasks take 16 channels (whole output lines) and then the 4 left."""
    path = tmp_path / "mixffn.onnx"
    rng = np.random.default_rng(1)
    C = 20
    cin = 1 if depthwise else C
    inits = [helper.make_tensor("w", TP.FLOAT, [C, cin, 3, 3], rng.standard_normal(C * cin * 9).astype(np.float32)),
             helper.make_tensor("b", TP.FLOAT, [C], rng.standard_normal(C).astype(np.float32)),
             helper.make_tensor("flat", TP.INT64, [3], [0, C, -1])]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=C if depthwise else 1),
             helper.make_node("Reshape", ["y", "flat"], ["yf"]),
             helper.make_node("Transpose", ["yf"], ["yt"], perm=[0, 2, 1]),
             helper.make_node("Gelu", ["yt"], ["z"])]
    _save_x_to_z(path, nodes, inits, opset=20, channels=C)
    model = compile_model(str(path), ["batch=1:3", "H=1:40", "W=1:40"], max_variants=1)
    assert not model.fallback_groups()
    assert any("scattered" in k.source for ks in model.kernels.values() for k in ks)
    rt = Runtime.from_compiled(model, num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n, h, w in [(1, 1, 1), (2, 7, 13), (3, 40, 29)]:
        x = rng.standard_normal((n, C, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["z"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_shape_symbols_named_like_kernel_identifiers_do_not_collide(tmp_path):
    """Dims called G, tile, nv (a macro, an epilogue parameter, a local of the macro-kernel)."""
    path = tmp_path / "names.onnx"
    _model(path, [("a", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu", "res")),
                  ("dw", C, (3, 3), dict(pads=[1, 1, 1, 1], group=C), ())],
           residual=["G", 8, "tile", "nv"], names=["G", "tile", "nv"])
    model = compile_model(str(path), ["G=1:3", "tile=1:50", "nv=1:50"], max_variants=1)
    assert model.fallback_groups() == []
    rt = Runtime.from_compiled(model, num_threads=2)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, C, 7, 13)).astype(np.float32),
             "r": rng.standard_normal((2, 8, 7, 13)).astype(np.float32)}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = rt.run(feeds)
    np.testing.assert_allclose(got["a_1"], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["dw_conv"], want[1], rtol=1e-4, atol=1e-4)


def test_a_range_reaching_an_empty_output_compiles_and_runs(tmp_path):
    """A 4x4/4 patch Conv over sides from 1: below one patch the output is empty (0 positions)."""
    path = tmp_path / "empty.onnx"
    _model(path, [("patch", 8, (4, 4), dict(strides=[4, 4]), ())], channels=3)
    model = compile_model(str(path), ["batch=1:2", "H=1:40", "W=1:40"], max_variants=2)
    rt = Runtime.from_compiled(model, num_threads=2)
    x = np.ones((1, 3, 3, 9), np.float32)
    assert rt.run({"x": x})["patch_conv"].shape == (1, 8, 0, 2)


def test_outputs_go_into_given_buffers_and_a_wrong_buffer_is_named(tmp_path):
    from tscomp.errors import ExecutionError
    plan = _plan(tmp_path, [("a", 8, (3, 3), dict(pads=[1, 1, 1, 1]), ("relu",))])
    analysis = ConvAnalysis(plan, plan.groups[0])
    from tscomp.codegen.families import link_native
    kernel = link_native(CompiledConv(analysis, conv_candidate_configs("avx2", 8, 36)[0], "avx2"))
    env = {n: plan.graph.values[n].const for n in plan.groups[0].inputs if n != "x"}
    env["x"] = np.random.default_rng(0).standard_normal((1, C, 7, 13)).astype(np.float32)
    binding = {"batch": 1, "H": 7, "W": 13}
    want = kernel.run(env, binding)["a_0"]
    buf = np.full((1, 8, 7, 13), np.nan, np.float32)
    assert kernel.run(env, binding, {"a_0": buf})["a_0"] is buf
    np.testing.assert_array_equal(buf, want)
    with pytest.raises(ExecutionError, match="output buffer 'a_0' is float64"):
        kernel.run(env, binding, {"a_0": np.empty((1, 8, 7, 13))})


def test_a_strided_conv_epilogue_reads_its_floored_sizes_from_constants_not_inside_the_loop(tmp_path):
    """The output of a stride-2 Conv is floor((H - 1)/2) + 1 high: the epilogue's store index names
    that size through a function-scope constant, so the vectorized loop holds no ts_floordiv call
    (which kept GCC from vectorizing it: PoolFormer's GELU epilogue ran scalar)."""
    path = tmp_path / "s2.onnx"
    spatial = _model(path, [("s2", 8, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), ("silu",)),
                            ("dw", C, (3, 3), dict(group=C, pads=[1, 1, 1, 1], strides=[2, 2]), ("relu",))])
    model = _compile_and_compare(path, spatial, [(1, 1, 1), (2, 13, 8)])
    for kernels in model.kernels.values():
        source = kernels[0].source
        epilogue = source[source.index("void conv_epilogue("):]
        epilogue = epilogue[:epilogue.index("\n}\n")]
        assert "const int64_t ts_sz0 = " in epilogue      # ts_floordiv, or a plain / of a proven non-negative
        loop = epilogue[epilogue.index("#pragma omp simd"):]
        assert "ts_floordiv" not in loop, loop


def test_a_one_channel_head_stores_from_the_fused_epilogue_whatever_form_its_shape_takes(tmp_path):
    """A depth head (DPT's): a 3x3 Conv to 1 channel and a ReLU over a token grid whose side is
    int(sqrt(N)). The ReLU's shape is written in another (equal) form than the Conv's, so the
    epilogue locates the Conv element it reads from the output's index: n*P + p, which is the
    Conv's own (n*1 + c)*P + p at c = 0 -- an extent-1 axis counts as 0, and the group is the
    conv family's, not the numpy fallback's."""
    from tests.graph.test_shape_propagation import token_grid_model
    path = tmp_path / "head.onnx"
    token_grid_model(path, head_channels=1)
    model = compile_model(str(path), ["batch=1:2", "H=4:64", "W=4:64"], max_variants=1)
    assert model.fallback_groups() == [] and {k.family for ks in model.kernels.values() for k in ks} == {"conv"}
    rt = Runtime.from_compiled(model, num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for n, h, w in [(1, 24, 24), (2, 16, 36), (1, 4, 4)]:
        x = rng.standard_normal((n, 3, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
