"""The implicit-GEMM Conv on int8 instructions (tscomp/codegen/cpu_conv_int8.py): bit-exact integer
sums against an int64 convolution at awkward geometries, and the cases that stay fp32."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.codegen.cpu_conv import CompiledConv, ConvAnalysis, conv_source
from tscomp.codegen.cpu_conv_int8 import conv_int8_x_offset, prepack_conv_weight_int8, prepack_conv_weight_int8_amx
from tscomp.codegen.tile_config import TileConfig
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse


def _vnni() -> bool:
    from tscomp.schedule.target import host_cpu
    spec = host_cpu().spec
    return spec.isa == "avx512" and spec.vnni


needs_vnni = pytest.mark.skipif(not _vnni(), reason="int8 Conv kernels need AVX-512 with avx512_vnni (VPDPBUSD)")


def _amx_int8() -> bool:
    from tscomp.schedule.target import host_cpu
    return host_cpu().spec.amx_int8


needs_amx_int8 = pytest.mark.skipif(not _amx_int8(), reason="this CPU has no AMX int8 tiles (or the OS does not grant them)")


def _conv_plan(tmp_path, rng, c, oc, kernel, x_range, **attrs):
    """A one-Conv model with an integer weight in [-128, 127], fused, its input recorded as holding
    the integers ``x_range`` (what the graph stage records for a quantized activation)."""
    group = attrs.get("group", 1)
    w = rng.integers(-128, 128, (oc, c // group, *kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TP.FLOAT, ["batch", c, "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "conv.onnx"
    import onnx
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    plan = fuse(load_model(str(path), ["batch=1:3", "H=1:64", "W=1:64"]))
    plan.graph.values["x"].integer_range = x_range
    return plan, w


def _exact_conv(x: np.ndarray, w: np.ndarray, strides, pads, dilations, group) -> np.ndarray:
    """The convolution in int64 (exact): per kernel tap, a strided slice of the padded input."""
    x, w = x.astype(np.int64), w.astype(np.int64)
    N, C, H, W = x.shape
    OC, Cg, KH, KW = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    OH = (H + pads[0] + pads[2] - dh * (KH - 1) - 1) // sh + 1
    OW = (W + pads[1] + pads[3] - dw * (KW - 1) - 1) // sw + 1
    y = np.zeros((N, OC, OH, OW), np.int64)
    OCg = OC // group
    for g in range(group):
        xs = xp[:, g * Cg:(g + 1) * Cg]
        for kh in range(KH):
            for kw in range(KW):
                patch = xs[:, :, kh * dh: kh * dh + sh * (OH - 1) + 1: sh, kw * dw: kw * dw + sw * (OW - 1) + 1: sw]
                y[:, g * OCg:(g + 1) * OCg] += np.einsum("nchw,oc->nohw", patch, w[g * OCg:(g + 1) * OCg, :, kh, kw])
    return y


GEOMETRIES = {
    # c, oc, kernel, attrs, tile: phase planes and several K steps (K = 576 in steps of 40), a partial tile
    "3x3-deep": (64, 70, (3, 3), dict(pads=[1, 1, 1, 1]), TileConfig(mr=8, nr=32, mc=16, nc=64, kc=40)),
    # the pointwise gather, K = 48 in steps of 20 (the last 8), 130 channels
    "1x1": (48, 130, (1, 1), dict(), TileConfig(mr=4, nr=48, mc=64, nc=96, kc=20)),
    # 1x1 stride 2: the generic gather (in place, no phase planes), then its quads
    "1x1-stride2": (24, 40, (1, 1), dict(strides=[2, 2]), TileConfig(mr=8, nr=32, mc=40, nc=64, kc=12)),
    # stride 2, asymmetric pads (taps on the padding: the integer 0)
    "3x3-stride2": (8, 40, (3, 3), dict(pads=[1, 0, 1, 2], strides=[2, 2]), TileConfig(mr=8, nr=16, mc=40, nc=32, kc=72)),
    # groups and dilation: OCg 18, K = 8 x 9 = 72 in steps of 36
    "grouped-dilated": (16, 36, (3, 3), dict(group=2, pads=[1, 2, 1, 2], dilations=[1, 2]),
                        TileConfig(mr=6, nr=32, mc=18, nc=64, kc=36)),
    # K = 45, not a multiple of 4: a short last quad, in steps of 20 (20, 20, 5)
    "k45": (5, 24, (3, 3), dict(pads=[1, 1, 1, 1]), TileConfig(mr=8, nr=16, mc=24, nc=48, kc=20)),
}


@needs_vnni
@pytest.mark.parametrize("x_offset", [-131, 0, -255])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_int8_conv_sums_are_exact_at_awkward_geometries(tmp_path, geometry, x_offset):
    """X holds integers in [x_offset, x_offset + 255] (0 among them: the padding), W in [-128, 127]:
    the kernel's output is the exact integer convolution (int32 sums converted once) at one position,
    a prime number of them and several position blocks, one image and several."""
    c, oc, kernel, attrs, cfg = GEOMETRIES[geometry]
    rng = np.random.default_rng(abs(x_offset) + len(geometry))
    plan, w = _conv_plan(tmp_path, rng, c, oc, kernel, (x_offset, x_offset + 255), **attrs)
    analysis = ConvAnalysis(plan, plan.groups[0])
    assert analysis.int8_x_offset == x_offset
    compiled = CompiledConv(analysis, cfg, "avx512", precision="int8")
    assert compiled.precision == "int8" and compiled.func.endswith("_int8") and "VPDPBUSD" in compiled.source
    for n, h, wd in [(1, 1, 1), (2, 7, 13), (1, 23, 17)]:
        x = rng.integers(x_offset, x_offset + 256, (n, c, h, wd)).astype(np.float32)
        x.flat[0], x.flat[-1] = x_offset, x_offset + 255              # both ends of the byte range
        got = next(iter(compiled.run({"x": x}, {"batch": n, "H": h, "W": wd}).values()))
        want = _exact_conv(x, w, attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]),
                           attrs.get("dilations", [1, 1]), attrs.get("group", 1))
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=f"{geometry} {n}x{h}x{wd}")


#: the same geometries under AMX tiles (whole 16x16 tiles, at most 4 accumulators; K steps of 64): a
#: partial channel panel, several K steps with a short last one, a single step shorter than 64
AMX_TILES = {"3x3-deep": TileConfig(mr=32, nr=32, mc=64, nc=64, kc=128),
             "1x1": TileConfig(mr=16, nr=64, mc=64, nc=128, kc=20),
             "1x1-stride2": TileConfig(mr=32, nr=16, mc=32, nc=64, kc=64),
             "3x3-stride2": TileConfig(mr=16, nr=32, mc=48, nc=32, kc=64),
             "grouped-dilated": TileConfig(mr=16, nr=32, mc=32, nc=64, kc=36),
             "k45": TileConfig(mr=32, nr=16, mc=32, nc=48, kc=20)}


@needs_amx_int8
@pytest.mark.parametrize("x_offset", [-131, 0, -255])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_amx_int8_conv_sums_are_exact_at_awkward_geometries(tmp_path, geometry, x_offset):
    """TDPBUSD multiplies unsigned A by signed B, so the AMX kernel multiplies W + 128 by X - x_offset - 128
    and corrects per channel and per position: any slip in those corrections or in the padding of K
    to a 64-deep step is off by whole integers."""
    c, oc, kernel, attrs, _ = GEOMETRIES[geometry]
    cfg = AMX_TILES[geometry]
    rng = np.random.default_rng(abs(x_offset) + len(geometry))
    plan, w = _conv_plan(tmp_path, rng, c, oc, kernel, (x_offset, x_offset + 255), **attrs)
    compiled = CompiledConv(ConvAnalysis(plan, plan.groups[0]), cfg, "amx", precision="int8")
    assert compiled.precision == "int8" and "TDPBUSD" in compiled.source and "_tile_dpbusd(" in compiled.source
    for n, h, wd in [(1, 1, 1), (2, 7, 13), (1, 23, 17)]:
        x = rng.integers(x_offset, x_offset + 256, (n, c, h, wd)).astype(np.float32)
        x.flat[0], x.flat[-1] = x_offset, x_offset + 255
        got = next(iter(compiled.run({"x": x}, {"batch": n, "H": h, "W": wd}).values()))
        want = _exact_conv(x, w, attrs.get("strides", [1, 1]), attrs.get("pads", [0, 0, 0, 0]),
                           attrs.get("dilations", [1, 1]), attrs.get("group", 1))
        np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=f"{geometry} {n}x{h}x{wd}")


def test_the_packed_int8_weight_holds_quads_then_the_corrections():
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (6, 2, 3, 1)).astype(np.float32)      # K = 6: two quads, the second padded
    packed = prepack_conv_weight_int8(w, 1, 4, -131)
    assert packed.ctypes.data % 64 == 0
    raw = packed.view(np.uint8)
    quads = raw[:2 * 2 * 4 * 4].view(np.int8).reshape(2, 2, 4, 4)      # [panel][quad][row][k % 4]
    flat = np.zeros((8, 8), np.int64)
    flat[:6, :6] = w.reshape(6, 6)
    for panel in range(2):
        for q in range(2):
            np.testing.assert_array_equal(quads[panel, q], flat[panel * 4:panel * 4 + 4, 4 * q:4 * q + 4])
    corrections = raw[2 * 2 * 4 * 4:].view(np.int32)
    np.testing.assert_array_equal(corrections, -131 * flat.sum(axis=1))


def test_the_amx_weight_holds_unsigned_rows_then_the_channel_and_byte_sum_corrections():
    """Per panel, per row, K bytes W + 128 then zeros up to 64; then per padded row the int32
    (x_offset + 128) * sum_k W + 128 * 128 * K (a padded row's W is 0)."""
    rng = np.random.default_rng(4)
    w = rng.integers(-128, 128, (20, 3, 3, 3)).astype(np.float32)       # K = 27, OC = 20: two 16-row panels
    packed = prepack_conv_weight_int8_amx(w, 1, 16, -131)
    assert packed.ctypes.data % 64 == 0
    raw = packed.view(np.uint8)
    rows = raw[:32 * 64].reshape(32, 64)
    flat = np.zeros((32, 27), np.int64)
    flat[:20] = w.reshape(20, 27)
    np.testing.assert_array_equal(rows[:, :27], flat + 128 * (np.arange(32) < 20)[:, None])
    assert not rows[:, 27:].any() and not rows[20:].any()
    np.testing.assert_array_equal(raw[32 * 64:].view(np.int32), (-131 + 128) * flat.sum(axis=1) + 128 * 128 * 27)


def test_amx_int8_conv_source_names_its_tiles(tmp_path):
    """Generating needs no AMX (only running does)."""
    rng = np.random.default_rng(6)
    plan, _ = _conv_plan(tmp_path, rng, 16, 32, (3, 3), (-131, 124), pads=[1, 1, 1, 1])
    src = conv_source(ConvAnalysis(plan, plan.groups[0]), TileConfig(mr=32, nr=32, mc=32, nc=64, kc=100), "amx", "int8")
    assert "int8 on AMX tiles" in src and "_tile_dpbusd(" in src and "#define TS_KPAD 192" in src
    assert "#define TS_KC 128" in src          # K steps whole 64-deep tile steps


def test_operands_that_do_not_fit_bytes_stay_fp32():
    w = np.array([[1.0, -128.0], [127.0, 3.0]], np.float32)
    assert conv_int8_x_offset((-131, 124), w, 8) == -131
    assert conv_int8_x_offset((0, 255), w, 8) == 0
    assert conv_int8_x_offset((5, 200), w, 8) == 0                  # the padding's 0 joins the range
    assert conv_int8_x_offset((5, 260), w, 8) is None               # with 0: 261 values
    assert conv_int8_x_offset((-131, 125), w, 8) is None            # 257 values
    assert conv_int8_x_offset(None, w, 8) is None                   # not known to be integers
    assert conv_int8_x_offset((0, 255), w * 2, 8) is None           # 254 and -256: no signed byte
    assert conv_int8_x_offset((0, 255), w + 0.5, 8) is None         # not integers
    assert conv_int8_x_offset((0, 255), w, 70000) is None           # int32 could overflow


def test_row_vector_tiles_and_other_isas_are_refused_int8_and_compile_in_fp32(tmp_path):
    rng = np.random.default_rng(5)
    plan, _ = _conv_plan(tmp_path, rng, 16, 32, (3, 3), (-131, 124), pads=[1, 1, 1, 1])
    analysis = ConvAnalysis(plan, plan.groups[0])
    rows = TileConfig(mr=32, nr=5, mc=64, nc=15, kc=40, vector_axis=0)
    with pytest.raises(UnsupportedOperatorError, match="int8 Conv needs AVX-512.*lanes along the positions"):
        conv_source(analysis, rows, "avx512", "int8")
    assert CompiledConv(analysis, rows, "avx512", precision="int8").precision == "fp32"
    assert CompiledConv(analysis, TileConfig(mr=4, nr=16, mc=32, nc=32, kc=40), "avx2", precision="int8").precision \
        == "fp32"


@pytest.mark.parametrize("isa,cfg", [
    pytest.param("avx512", TileConfig(mr=8, nr=32, mc=48, nc=64, kc=20), marks=needs_vnni),
    pytest.param("amx", TileConfig(mr=32, nr=32, mc=64, nc=64, kc=20), marks=needs_amx_int8)])
def test_int8_pointwise_conv_between_channel_blocked_layouts_is_exact(tmp_path, isa, cfg):
    """A 1x1 Conv whose input its producer stores channel-blocked (a depthwise kernel's) and whose
    output its consumer reads so (tscomp/codegen/channel_blocking.py): the gather transposes the
    blocks into the column block, then its quads; the tile is stored back in blocks (the AMX
    kernel's transposes on AVX-512: an AMX kernel once asked for 'amx' ones and failed to generate)."""
    rng = np.random.default_rng(9)
    plan, w = _conv_plan(tmp_path, rng, 32, 48, (1, 1), (-131, 124))
    analysis = ConvAnalysis(plan, plan.groups[0])
    analysis.read_blocked(16)
    analysis.store_blocked(16)
    compiled = CompiledConv(analysis, cfg, isa, precision="int8")
    assert compiled.precision == "int8" and "_xb16_yb16_int8" in compiled.func
    for n, h, wd in [(1, 1, 1), (2, 7, 13)]:
        x = rng.integers(-131, 125, (n, 32, h, wd)).astype(np.float32)
        got = next(iter(compiled.run({"x": x}, {"batch": n, "H": h, "W": wd}).values()))
        np.testing.assert_array_equal(got.astype(np.int64), _exact_conv(x, w, [1, 1], [0, 0, 0, 0], [1, 1], 1))
