"""The SIMT index family (:mod:`tscomp.codegen.simt.index`): one-op groups rendered from the op's
registry writer (the same ``c_kernel`` the CPU index family runs) in the SIMT dialect, run as OpenCL
against onnxruntime at awkward sizes (1, 7, 13, 97); Resize (ViT's bicubic position grid among
them) computes each thread's taps in private arrays, the scatters run their in-order updates on one
thread of one work-group after a barrier — checked under Oclgrind's race detector too."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tests.codegen.simt.test_races import needs_oclgrind
from tests.codegen.test_cpu_index import RESIZE_CASES, _model, _scatter_elements
from tscomp.codegen.simt.dialect import body_of
from tscomp.codegen.simt.families import SimtPlanRunner, simt_kernel_for_group, simt_kernels
from tscomp.errors import IndexOutOfRangeError
from tscomp.graph.fusion import fuse

ort = pytest.importorskip("onnxruntime")
F, I64 = TP.FLOAT, TP.INT64


def _runner(path, dims):
    plan = fuse(G.load_model(path, dims))
    kernels = simt_kernels(plan)
    fams = {g: k.family for g, k in kernels.items()}
    assert "numpy" not in fams.values(), {g: k.reasons for g, k in kernels.items() if k.family == "numpy"}
    return plan, kernels, SimtPlanRunner(plan, kernels)


def _check(path, runner, feeds, rtol=1e-4, atol=1e-4):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    got = runner.run(feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol, err_msg=name)


def _index_kernels(kernels):
    ks = [k for k in kernels.values() if k.family == "simt-index"]
    assert ks
    for k in ks:
        body = body_of(k.program.opencl)
        assert body == body_of(k.program.cuda)            # one body, two preludes
        assert "#pragma omp" not in body and "malloc" not in body and "free(" not in body
        assert k.source.startswith("/*\n * tscomp SIMT index kernel for group") and "ONNX op: " in k.source
    return ks


AWKWARD = [(1, 1), (7, 13), (97, 1), (13, 97), (1, 7)]


@pytest.mark.parametrize("mode,coord,extra", RESIZE_CASES, ids=[f"{m}-{c}-{len(e)}" for m, c, e in RESIZE_CASES])
@pytest.mark.parametrize("scale_h,scale_w", [(2.0, 0.5), (0.75, 3.0)])
def test_resize_with_scales_matches_onnxruntime(simt_device, tmp_path, mode, coord, extra, scale_h, scale_w):
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["y"], mode=mode, coordinate_transformation_mode=coord,
                              **extra)]
    path = _model(tmp_path, "resize", nodes, [("x", F, ["B", 3, "H", "W"])], [("y", F, [None, None, None, None])],
                  [helper.make_tensor("sc", F, [4], [1.0, 1.0, scale_h, scale_w])])
    _, kernels, runner = _runner(path, ["B=1:2", "H=1:97", "W=1:97"])
    (k,) = _index_kernels(kernels)
    body = body_of(k.program.opencl)
    # taps per thread, not a table per call; antialiased downscaling by s widens a row to 2 * ceil(radius / s)
    assert body.count("computed by this thread") == 2
    assert "ts_first = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0)" in body and not k.src.one_group
    radius = {"linear": 1, "cubic": 2}.get(mode)
    for axis, s in ((2, scale_h), (3, scale_w)):
        shrink = s if extra.get("antialias") and s < 1 else 1.0
        width = 1 if radius is None else int(2 * np.ceil(radius / shrink))
        assert f"double ts_wa{axis}[{width}];" in body, (axis, width)
    rng = np.random.default_rng(5)
    for H, W in AWKWARD:
        _check(path, runner, {"x": rng.standard_normal((2, 3, H, W)).astype(np.float32)})


def test_resize_to_sizes_from_the_input_shape_as_vit_exports_it(simt_device, tmp_path):
    """ViT's position grid: bicubic to sizes computed from shape values (H // 4, W // 4), which enter
    as the kernel's shape-symbol arguments; the grid (a weight) is the kernel's input."""
    grid = np.random.default_rng(6).standard_normal((1, 8, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["hw"]),
             helper.make_node("Div", ["hw", "four"], ["hw4"]),
             helper.make_node("Concat", ["lead", "hw4"], ["sz"], axis=0),
             helper.make_node("Resize", ["g", "", "", "sz"], ["y"], mode="cubic", cubic_coeff_a=-0.75,
                              coordinate_transformation_mode="half_pixel", antialias=0)]
    inits = [helper.make_tensor("g", F, grid.shape, grid.reshape(-1).tolist()),
             helper.make_tensor("st", I64, [1], [2]), helper.make_tensor("en", I64, [1], [4]),
             helper.make_tensor("four", I64, [1], [4]), helper.make_tensor("lead", I64, [2], [1, 8])]
    path = _model(tmp_path, "resize_sizes", nodes, [("x", F, [1, 2, "H", "W"])], [("y", F, [None] * 4)], inits)
    _, kernels, runner = _runner(path, ["H=4:400", "W=4:400"])
    (k,) = _index_kernels(kernels)
    assert [a.role for a in k.source_info.args] == ["input", "output", "symbol", "symbol"]
    assert "ts_ia2[4];" in k.program.body and "ts_wa3[4];" in k.program.body   # cubic: 4 taps per axis
    rng = np.random.default_rng(7)
    for H, W in [(4, 4), (28, 52), (388, 4), (52, 388), (400, 400)]:     # grids of 1, 7, 13, 97, 100
        _check(path, runner, {"x": rng.standard_normal((1, 2, H, W)).astype(np.float32)})


def test_resize_antialias_by_a_run_time_factor_is_refused_by_name(tmp_path):
    """Antialiased downscaling to run-time sizes: the tap count per output is known only at run
    time; the SIMT family says so and the group runs on the numpy fallback."""
    nodes = [helper.make_node("Resize", ["x", "", "", "sz"], ["y"], mode="linear", antialias=1)]
    path = _model(tmp_path, "resize_aa", nodes, [("x", F, [1, 1, 8, 8]), ("sz", I64, [4])], [("y", F, [None] * 4)])
    plan = fuse(G.load_model(path, []))
    k = simt_kernel_for_group(plan, plan.groups[-1])
    assert k.family == "numpy"
    assert any("simt-index" in r and "known only at run time" in r for r in k.reasons), k.reasons


@pytest.mark.parametrize("mode,padding", [("bilinear", "zeros"), ("bicubic", "reflection"), ("nearest", "border")])
def test_grid_sample_matches_onnxruntime(simt_device, tmp_path, mode, padding):
    """One thread per output point, its taps in private arrays; grid points well outside [-1, 1]."""
    import onnx
    from tests.graph.ops.test_sampling_ops import _model as grid_sample_model
    path = tmp_path / "gs.onnx"
    onnx.save(grid_sample_model(mode=mode, padding_mode=padding, align_corners=0), path)
    _, kernels, runner = _runner(path, ["B=1:3", "H=1:97", "W=1:97", "gh=1:13", "gw=1:13"])
    _index_kernels(kernels)
    rng = np.random.default_rng(8)
    for (H, W), (p, q) in zip(AWKWARD, [(1, 1), (13, 7), (1, 13), (7, 1), (13, 13)]):
        _check(path, runner, {"x": rng.standard_normal((2, 3, H, W)).astype(np.float32),
                              "grid": rng.uniform(-2.5, 2.5, (2, p, q, 2)).astype(np.float32)})


def test_lp_normalization_lrn_hardmax_det_and_reverse_sequence_match_onnxruntime(simt_device, tmp_path):
    """The registry writers of five more opaque ops, each a SIMT kernel (Det's LU in private
    arrays), at awkward sizes."""
    nodes = [helper.make_node("LpNormalization", ["x"], ["lp"], axis=-1, p=2),
             helper.make_node("LRN", ["x"], ["lrn"], size=3),
             helper.make_node("Hardmax", ["x"], ["hm"], axis=1),
             helper.make_node("Det", ["m"], ["det"]),
             helper.make_node("ReverseSequence", ["x3", "lens"], ["rev"], batch_axis=0, time_axis=1)]
    path = _model(tmp_path, "five", nodes,
                  [("x", F, ["B", 5, "H", "W"]), ("m", F, ["B", 3, 3]), ("x3", F, ["B", "H", 2]), ("lens", I64, ["B"])],
                  [("lp", F, [None] * 4), ("lrn", F, [None] * 4), ("hm", F, [None] * 4), ("det", F, [None]),
                   ("rev", F, [None] * 3)], opset=17)
    _, kernels, runner = _runner(path, ["B=1:13", "H=1:97", "W=1:13"])
    assert len(_index_kernels(kernels)) == 5
    rng = np.random.default_rng(9)
    for B, H, W in [(1, 1, 1), (7, 13, 3), (13, 97, 1)]:
        _check(path, runner, {"x": rng.standard_normal((B, 5, H, W)).astype(np.float32),
                              "m": rng.standard_normal((B, 3, 3)).astype(np.float32),
                              "x3": rng.standard_normal((B, H, 2)).astype(np.float32),
                              "lens": rng.integers(0, H + 1, B).astype(np.int64)})
    bad = {"x": np.zeros((2, 5, 4, 1), np.float32), "m": np.zeros((2, 3, 3), np.float32),
           "x3": np.zeros((2, 4, 2), np.float32), "lens": np.array([1, 5], np.int64)}
    with pytest.raises(IndexOutOfRangeError, match=r"ReverseSequence node .*'lens' has value 5"):
        runner.run(bad)


def test_a_dft_is_refused_by_name_for_its_work_buffer(tmp_path):
    """The DFT's C kernel plans into a per-call work buffer, which SIMT kernels do not allocate:
    the family says so (the group runs on the numpy fallback there), nothing is half-rendered."""
    from tests.graph.ops.test_signal_ops import _dft_model
    path = tmp_path / "dft.onnx"
    path.write_bytes(_dft_model(axis=1, parts=2).SerializeToString())     # its input a group input, no view
    plan = fuse(G.load_model(str(path), ["batch=1:2", "seq=1:64", "hidden=1:8"]))
    k = simt_kernel_for_group(plan, plan.groups[-1])
    assert k.family == "numpy"
    assert any("simt-index" in r and "DFT" in r and "work buffer" in r for r in k.reasons), k.reasons


@pytest.mark.parametrize("axis,reverse,exclusive", [(1, 0, 0), (0, 1, 1), (-1, 1, 0)])
def test_cumsum_matches_onnxruntime(simt_device, tmp_path, axis, reverse, exclusive):
    nodes = [helper.make_node("CumSum", ["x", "ax"], ["y"], reverse=reverse, exclusive=exclusive)]
    path = _model(tmp_path, "cumsum", nodes, [("x", F, ["B", "L"])], [("y", F, ["B", "L"])],
                  [helper.make_tensor("ax", I64, [], [axis])])
    _, kernels, runner = _runner(path, ["B=1:13", "L=1:97"])
    (k,) = _index_kernels(kernels)
    assert "ts_f0 / ((" in k.program.body        # (outer, inner) lines collapsed into one grid-stride loop
    rng = np.random.default_rng(axis + 2)
    for B, L in [(1, 1), (7, 13), (13, 97), (1, 97)]:
        _check(path, runner, {"x": rng.standard_normal((B, L)).astype(np.float32)}, rtol=1e-4, atol=1e-4)


def test_range_argmax_pad_trilu_onehot_match_onnxruntime(simt_device, tmp_path):
    """Range over a shape value, ArgMax over a leading axis, Pad (reflect), Trilu and OneHot in one
    model: every group a SIMT kernel (the Range one reads only shape values)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("ArgMax", ["x"], ["am"], axis=0, keepdims=0, select_last_index=1),
             helper.make_node("Pad", ["x", "pads"], ["pd"], mode="reflect"),
             helper.make_node("Trilu", ["sq"], ["tl"], upper=0),
             helper.make_node("OneHot", ["am", "depth", "vals"], ["oh"], axis=0)]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1]),
             helper.make_tensor("pads", I64, [4], [0, 1, 0, 2]), helper.make_tensor("depth", I64, [], [5]),
             helper.make_tensor("vals", F, [2], [-1.0, 3.0])]
    path = _model(tmp_path, "misc", nodes, [("x", F, ["B", "L"]), ("sq", F, ["L", "L"])],
                  [("r", I64, ["L"]), ("am", I64, ["L"]), ("pd", F, ["B", None]), ("tl", F, ["L", "L"]),
                   ("oh", F, [5, "L"])], inits, opset=19)
    plan, kernels, runner = _runner(path, ["B=1:13", "L=3:97"])
    ops = {k.source.split("ONNX op: ")[1].split(" ")[0] for k in _index_kernels(kernels)}
    assert {"Range", "ArgMax", "Pad", "Trilu", "OneHot"} <= ops, ops
    rng = np.random.default_rng(9)
    for B, L in [(1, 3), (7, 13), (13, 97), (2, 7)]:
        x = rng.integers(-3, 4, (B, L)).astype(np.float32)          # ties: the last index matters
        _check(path, runner, {"x": x, "sq": rng.standard_normal((L, L)).astype(np.float32)})



@pytest.mark.parametrize("op", ["ReduceL2", "ReduceLogSumExp", "ReduceMax"])
def test_a_reduction_over_non_trailing_axes_matches_onnxruntime(simt_device, tmp_path, op):
    """The CPU index family's reduction kernel (any axes) rendered in the SIMT dialect: one
    work-item per output element."""
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)]
    path = _model(tmp_path, "reduce", nodes, [("x", F, ["B", "L", 3])], [("y", F, [1, "L", 1])],
                  [helper.make_tensor("axes", I64, [2], [0, 2])])
    plan, kernels, runner = _runner(path, ["B=1:97", "L=1:97"])
    _index_kernels(kernels)
    rng = np.random.default_rng(3)
    for B, L in AWKWARD:
        _check(path, runner, {"x": rng.standard_normal((B, L, 3)).astype(np.float32)})

@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_elements_runs_its_updates_on_one_thread_and_checks_indices(simt_device, tmp_path, reduction):
    path = _scatter_elements(tmp_path, reduction)
    _, kernels, runner = _runner(path, ["B=1:13", "L=1:97", "K=1:8"])
    (k,) = _index_kernels(kernels)
    body = body_of(k.program.opencl)
    assert k.src.one_group and "ts_first = TS_THREAD(0), ts_step = TS_NTHREADS(0)" in body
    assert body.index("TS_BARRIER_GLOBAL();") < body.index("if (TS_THREAD(0) == 0)") < body.index("ts_index(")
    rng = np.random.default_rng(3)
    for B, L in [(1, 1), (7, 13), (13, 97), (2, 7)]:
        K = min(L, 5)
        idx = np.stack([rng.permutation(L)[:K] for _ in range(B)]) if reduction == "none" else \
            rng.integers(0, L, (B, K))
        idx = np.where(rng.random((B, K)) < 0.3, idx - L, idx).astype(np.int64)
        _check(path, runner, {"x": rng.standard_normal((B, L)).astype(np.float32), "idx": idx,
                              "u": rng.standard_normal((B, K)).astype(np.float32)})
    bad = {"x": np.zeros((2, 5), np.float32), "idx": np.array([[0, 1], [4, 5]], np.int64),
           "u": np.ones((2, 2), np.float32)}
    with pytest.raises(IndexOutOfRangeError, match=r"ScatterElements node .*index input 'idx' has value 5 at \(1, 1\)"):
        runner.run(bad)


RACE_SCRIPT = r"""
import sys, numpy as np
import tscomp.graph as G
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.interpret import evaluate_group
from tscomp.graph.reference import bind_symbols
from tscomp.codegen.simt.families import simt_kernel_for_group
from tscomp.runtime.device_opencl import device
assert "oclgrind" in device("opencl").device_name.lower()
rng = np.random.default_rng(0)
n = 0
for path, dims, feeds in [
        (sys.argv[1], ["B=1:4", "L=1:16", "K=1:8"],
         {"x": rng.standard_normal((3, 7)).astype(np.float32), "idx": np.array([[0, 6, -1], [2, 2, 3], [5, 4, 0]]),
          "u": rng.standard_normal((3, 3)).astype(np.float32)}),
        (sys.argv[2], ["B=1:2", "H=1:16", "W=1:16"], {"x": rng.standard_normal((1, 3, 7, 5)).astype(np.float32)})]:
    plan = fuse(G.load_model(path, dims))
    bound = bind_symbols(plan.graph, feeds)
    for g in plan.groups:
        k = simt_kernel_for_group(plan, g)
        assert k.family == "simt-index", k.family
        genv = {nm: feeds[nm] for nm in g.inputs}
        got, want = k.run(genv, bound), evaluate_group(plan, g, genv, bound)
        for nm in want: np.testing.assert_allclose(got[nm], want[nm], rtol=1e-5, atol=1e-5); n += 1
print("checked", n)
"""


@needs_oclgrind
def test_scatter_and_resize_kernels_are_race_free_under_oclgrind(tmp_path):
    """The scatter's one-work-group copy + barrier + serial updates, and Resize's per-thread taps."""
    scatter = _scatter_elements(tmp_path, "add")
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="cubic")]
    resize = _model(tmp_path, "resize", nodes, [("x", F, ["B", 3, "H", "W"])], [("y", F, [None] * 4)],
                    [helper.make_tensor("sc", F, [4], [1.0, 1.0, 1.5, 0.6])])
    env = dict(os.environ, TSCOMP_OPENCL_DEVICE="oclgrind", OCLGRIND_DATA_RACES="1", OCLGRIND_MAX_ERRORS="20")
    proc = subprocess.run([sys.executable, "-c", RACE_SCRIPT, str(scatter), str(resize)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "race" not in proc.stderr.lower() and "error" not in proc.stderr.lower(), proc.stderr[-3000:]
    assert "checked 2" in proc.stdout
