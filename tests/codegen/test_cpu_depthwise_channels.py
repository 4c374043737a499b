"""The channel-blocked depthwise strategy (``tscomp.codegen.cpu_depthwise_channels``): the kernel
against onnxruntime at awkward sizes, the register transpose, and the runtime's choice between the
two depthwise strategies."""
import numpy as np
import onnxruntime as ort
import pytest

from tscomp.codegen.build import build_library, host_isa, load_library
from tscomp.codegen.cpu_conv import CompiledConv, DepthwiseAnalysis
from tscomp.codegen.cpu_depthwise_channels import (DepthwiseChannelBlocks, channel_block_rows, channel_blocks_config,
                                                   transpose_block_c)
from tscomp.codegen.cpu_gemm import ISA_RANK
from tscomp.codegen.tile_config import VECTOR_WIDTH, TileConfigError
from tscomp.compiler import compile_model
from tscomp.graph import load_model
from tscomp.graph.fusion import fuse
from tscomp.runtime import Runtime

from tests.codegen.test_cpu_conv import _model

ISAS = ["avx512", "avx2"]


def _skip_unless_runs(isa):
    if ISA_RANK[host_isa()] < ISA_RANK[isa]:
        pytest.skip(f"{isa} kernels do not run on this host ({host_isa()})")


@pytest.mark.parametrize("isa", ISAS)
def test_the_register_transpose_transposes_a_block(tmp_path, isa):
    _skip_unless_runs(isa)
    import ctypes
    L = VECTOR_WIDTH[isa]
    src = f"""#include <stdint.h>
#include <immintrin.h>
{transpose_block_c(isa)}
void run(const float* a, int64_t lda, float* d, int64_t ldd)
{{
    const float* rows[{L}];
    for (int i = 0; i < {L}; ++i) rows[i] = a + i * lda;
    ts_transpose_block(rows, 3, d, ldd);
}}
"""
    fn = load_library(build_library(src, "run")).run
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    a = np.arange(L * 40, dtype=np.float32).reshape(L, 40)
    d = np.full((L, 21), -1, np.float32)
    fn(a.ctypes.data, 40, d.ctypes.data, 21)
    np.testing.assert_array_equal(d[:, :L], a[:, 3:3 + L].T)
    assert (d[:, L:] == -1).all()          # nothing written past the block



@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("w,h", [(5, None), (None, 3), (7, 11), (1, 1)])
def test_the_partial_transpose_reads_and_writes_only_its_columns_and_rows(tmp_path, isa, w, h):
    _skip_unless_runs(isa)
    import ctypes
    L = VECTOR_WIDTH[isa]
    w, h = min(w or L, L), min(h or L, L)
    src = f"""#include <stdint.h>
#include <immintrin.h>
{transpose_block_c(isa)}
void run(const float* const* rows, float* d, int64_t ldd, int64_t w, int64_t h)
{{
    ts_transpose_block_part(rows, 0, d, ldd, w, h);
}}
"""
    fn = load_library(build_library(src, "run")).run
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    # each source row is exactly w floats at the end of its own array: a read past column w would
    # read the NaN guard, a row past h is a NULL pointer the function must not dereference
    arrays = [np.concatenate([np.arange(w, dtype=np.float32) + 100 * v, [np.nan] * 8]).astype(np.float32)
              for v in range(h)]
    rows = (ctypes.c_void_p * L)(*([a.ctypes.data for a in arrays] + [None] * (L - h)))
    d = np.full((L + 1, 21), -1, np.float32)
    fn(rows, d.ctypes.data, 21, w, h)
    want = np.array([a[:w] for a in arrays]).T
    np.testing.assert_array_equal(d[:w, :h], want)
    assert (d[:w, h:] == -1).all() and (d[w:] == -1).all()     # nothing stored past the part


DEPTHWISE = [
    ("dw3", 1, (3, 3), dict(pads=[1, 1, 1, 1]), ("bn", "relu")),
    ("dw_s2", 1, (3, 3), dict(pads=[1, 0, 1, 2], strides=[2, 2]), ()),
    ("dw_mult", 2, (3, 3), dict(pads=[0, 1, 2, 1]), ("silu",)),             # a channel multiplier
    ("dw_s3_dil", 1, (3, 5), dict(pads=[2, 3, 2, 3], strides=[3, 3], dilations=[2, 2]), ()),
    ("dw7", 1, (7, 7), dict(pads=[3, 3, 3, 3]), ()),                         # more taps than registers
]


def _has_output(h: int, w: int, kernel, attrs) -> bool:
    """Whether the window fits the padded input (else the Conv has no output position)."""
    pads, dil = attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1])
    return all(size + pads[a] + pads[a + 2] >= dil[a] * (kernel[a] - 1) + 1 for a, size in enumerate((h, w)))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("channels", [21, 48])          # a partial channel block; whole blocks
def test_channel_blocked_kernel_matches_onnxruntime_at_awkward_sizes(tmp_path, isa, channels):
    """Each depthwise Conv (stride, dilation, asymmetric pads, a channel multiplier, a 7x7) as the
    channel-blocked kernel: 1x1 images, odd sizes, widths past and short of a vector, batches."""
    _skip_unless_runs(isa)
    for name, mult, kernel, attrs, epi in DEPTHWISE:
        path = tmp_path / f"{name}.onnx"
        _model(path, [(name, mult * channels, kernel, dict(group=channels, **attrs), epi)], channels=channels)
        plan = fuse(load_model(str(path), ["batch=1:3", "H=1:100", "W=1:100"]))
        analysis = DepthwiseAnalysis(plan, plan.groups[0])
        cfg = DepthwiseChannelBlocks(VECTOR_WIDTH[isa], 2048)        # a small budget: several row blocks
        k = CompiledConv(analysis, cfg, isa)
        assert "channel-blocked" in k.source and k.func.endswith(f"_cb{VECTOR_WIDTH[isa]}")
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        env0 = {n: plan.graph.values[n].const for n in plan.groups[0].inputs if n != "x"}
        rng = np.random.default_rng(0)
        for n, h, w in [(1, 1, 1), (1, 5, 5), (2, 7, 13), (1, 23, 40), (3, 11, 2)]:
            if not _has_output(h, w, kernel, attrs):
                continue
            x = rng.standard_normal((n, channels, h, w)).astype(np.float32)
            want = sess.run(None, {"x": x})[0]
            got = next(iter(k.run(env0 | {"x": x}, {"batch": n, "H": h, "W": w}).values()))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {n}x{h}x{w}")


def test_row_blocking_keeps_the_buffer_within_budget_and_the_threads_busy():
    from tscomp.codegen.cpu_conv import Geometry2D
    geo = Geometry2D(kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, rank=2)
    cfg = DepthwiseChannelBlocks(16, 65536)
    rows = int(channel_block_rows(cfg, geo, 1, 32, 112, 112, 2))
    row = 114 * 16
    assert ((rows - 1) + 3) * row + 2 * rows * 112 * 16 <= 65536 < ((rows) + 3) * row + 2 * (rows + 1) * 112 * 16
    # 960 channels at 5x5: 60 channel blocks already keep 2 threads busy: whole images per task
    assert int(channel_block_rows(cfg, geo, 1, 960, 5, 5, 2)) == 5
    # 16 channels at 20 rows: one channel block, so the rows split into 8 tasks for 2 threads
    assert int(channel_block_rows(cfg, geo, 1, 16, 20, 20, 2)) == 3


def test_no_channel_blocks_on_a_scalar_isa_and_a_wrong_lane_count_is_refused():
    assert channel_blocks_config("scalar", 1 << 20) is None
    assert channel_blocks_config("avx2", 1 << 20).lanes == 8
    with pytest.raises(TileConfigError, match="one avx512 vector of channels"):
        DepthwiseChannelBlocks(8, 1024).validate("avx512")


def test_both_depthwise_strategies_become_measured_variants_and_the_artifact_serves_each_shape(tmp_path, monkeypatch):
    """With two variants allowed, a depthwise group gets the direct kernel and the channel-blocked
    one, each measured at the dispatch shapes; the runtime picks per shape, and the artifact (the
    configuration written as plain data, the raw weight stored once and packed at load in each
    strategy's layout) loads and matches onnxruntime at every shape, whichever variant serves it.
    (Every copy is kept here: whether a second layout is worth its memory is the copy rule's
    question, tested in tests/runtime/test_dispatch.py.)"""
    import json

    from tscomp.runtime import dispatch
    from tscomp.runtime.artifact import write_artifact
    monkeypatch.setattr(dispatch, "COPY_WORTH_RESIDENT", 0.0)
    monkeypatch.setattr(dispatch, "COPY_WORTH", 0.0)
    if channel_blocks_config(host_isa(), 1 << 20) is None:
        pytest.skip(f"no channel-blocked variant on {host_isa()}")
    channels = 40
    path = tmp_path / "dw.onnx"
    _model(path, [("dw", channels, (3, 3), dict(group=channels, pads=[1, 1, 1, 1], strides=[2, 2]), ("relu",))],
           channels=channels)
    model = compile_model(str(path), ["batch=1:2", "H=1:64", "W=1:64"], max_variants=2)
    (variants,) = model.kernels.values()
    assert [k.cfg.slug() if k.cfg else "direct" for k in variants] == ["direct", f"cb{VECTOR_WIDTH[host_isa()]}"]
    assert all(k.samples for k in variants) and variants[1].tuning["method"] == "heuristic"
    rt = Runtime(write_artifact(model, tmp_path / "dw.tsc"), num_threads=2)
    (loaded,) = rt.model.kernels.values()
    assert isinstance(loaded[1].cfg, DepthwiseChannelBlocks)
    entries = json.loads((tmp_path / "dw.tsc" / "plan.json").read_text())["packed_weights"]
    assert len(entries) == 2 and len({e["raw"] for e in entries}) == 1      # one raw weight, two layouts
    for k, built in zip(loaded, variants):
        np.testing.assert_array_equal(k.packed, built.packed)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    for n, h, w in [(1, 1, 1), (2, 3, 64), (1, 64, 64), (1, 31, 17)]:
        x = rng.standard_normal((n, channels, h, w)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["dw_0"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4,
                                   err_msg=f"{n}x{h}x{w}")
