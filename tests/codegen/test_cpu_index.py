"""The index kernel family (:mod:`tscomp.codegen.cpu_index`, writers in
:mod:`tscomp.graph.ops.c_kernels`): one-op groups (CumSum, Range, ConstantOfShape, ArgMax/ArgMin, TopK,
ScatterElements, ScatterND, Reduce* over non-trailing axes, LpNormalization, LRN, Hardmax, Det,
ReverseSequence) compile to native kernels, match onnxruntime at awkward shapes (1,
primes, range ends), and range-check their data-dependent indices with an error naming the node,
the index input and the value."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.codegen.families import choose_family
from tscomp.compiler import compile_model
from tscomp.errors import IndexOutOfRangeError, UnsupportedOperatorError
from tscomp.runtime import Runtime

ort = pytest.importorskip("onnxruntime")

F, I64 = TP.FLOAT, TP.INT64


def _model(tmp_path, name, nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _compile(path, dims):
    model = compile_model(str(path), dims, max_variants=1)
    return model, Runtime.from_compiled(model, num_threads=2)


def _index_groups(model) -> list:
    """Groups the index family compiled (native kernels; none on numpy)."""
    assert not model.fallback_groups(), {g: model.kernels[g][0].reasons for g in model.fallback_groups()}
    return [g for g, ks in model.kernels.items() if ks[0].family == "index"]


def _check(path, rt, feeds):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = rt.run(feeds)
    for (name, w) in zip(rt.output_names, want):
        assert got[name].shape == w.shape and got[name].dtype == w.dtype, name
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name}")


SHAPES = [(1, 1), (1, 7), (3, 13), (2, 97), (4, 128)]


@pytest.mark.parametrize("reverse,exclusive", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [1, 0, -1])
def test_cumsum_matches_onnxruntime(tmp_path, axis, reverse, exclusive):
    nodes = [helper.make_node("CumSum", ["x", "ax"], ["y"], reverse=reverse, exclusive=exclusive)]
    path = _model(tmp_path, "cumsum", nodes, [("x", F, ["B", "L"])], [("y", F, ["B", "L"])],
                  [helper.make_tensor("ax", I64, [], [axis])])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(axis + 1 + 3 * reverse + 6 * exclusive)
    for B, L in SHAPES:
        _check(path, rt, {"x": rng.standard_normal((B, L)).astype(np.float32)})


@pytest.mark.parametrize("reverse,exclusive", [(0, 0), (1, 1)])
def test_cumprod_is_the_same_native_scan_with_a_product(tmp_path, reverse, exclusive):
    # onnxruntime has no CumProd (opset 26) yet: numpy's cumprod is the reference
    nodes = [helper.make_node("CumProd", ["x", "ax"], ["y"], reverse=reverse, exclusive=exclusive)]
    path = _model(tmp_path, "cumprod", nodes, [("x", F, ["B", "L"])], [("y", F, ["B", "L"])],
                  [helper.make_tensor("ax", I64, [], [1])], opset=26)
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(5)
    for B, L in SHAPES:
        x = (1 + 0.05 * rng.standard_normal((B, L))).astype(np.float32)
        y = np.flip(x, 1) if reverse else x
        want = np.cumprod(y, axis=1, dtype=np.float32)
        if exclusive:
            want = np.concatenate([np.ones((B, 1), np.float32), want[:, :-1]], axis=1)
        want = np.flip(want, 1) if reverse else want
        np.testing.assert_allclose(rt.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)


def test_cumsum_of_int64_position_ids_as_roberta_exports_them(tmp_path):
    """RoBERTa: position ids = CumSum(mask, 1) * mask + pad (int64 throughout)."""
    nodes = [helper.make_node("Cast", ["ids"], ["m"], to=I64),
             helper.make_node("CumSum", ["m", "ax"], ["c"]),
             helper.make_node("Mul", ["c", "m"], ["y"])]
    path = _model(tmp_path, "cumsum_ids", nodes, [("ids", I64, ["B", "L"])], [("y", I64, ["B", "L"])],
                  [helper.make_tensor("ax", I64, [], [1])])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(0)
    for B, L in SHAPES:
        _check(path, rt, {"ids": rng.integers(0, 2, (B, L)).astype(np.int64)})


def test_range_and_constant_of_shape_over_a_symbolic_length(tmp_path):
    """Range(0, L, 1) and ConstantOfShape([B, L]) read only shape values: native kernels with the
    length as a kernel argument."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F),
             helper.make_node("ConstantOfShape", ["s"], ["fill"],
                              value=helper.make_tensor("v", F, [1], [0.5])),
             helper.make_node("Add", ["x", "rf"], ["t"]),
             helper.make_node("Mul", ["t", "fill"], ["y"])]
    path = _model(tmp_path, "range", nodes, [("x", F, ["B", "L"])], [("y", F, ["B", "L"])],
                  [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1])])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    groups = _index_groups(model)
    ops = {model.kernels[g][0].source.split("ONNX op: ")[1].split(" ")[0] for g in groups}
    assert {"Range"} <= ops, ops
    rng = np.random.default_rng(1)
    for B, L in SHAPES:
        _check(path, rt, {"x": rng.standard_normal((B, L)).astype(np.float32)})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(-1, 1, 0), (1, 0, 0), (0, 1, 1), (-1, 0, 1)])
def test_argmax_argmin_match_onnxruntime(tmp_path, op, axis, keepdims, last):
    nodes = [helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)]
    out = ["B", "L"]
    a = axis % 2
    out = [1 if k == a else d for k, d in enumerate(out)] if keepdims else [d for k, d in enumerate(out) if k != a]
    path = _model(tmp_path, "arg", nodes, [("x", F, ["B", "L"])], [("y", I64, out)])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    # a trailing axis is a row reduction (row kernel), a leading one the index family's kernel
    assert _index_groups(model) if a == 0 else not model.fallback_groups()
    rng = np.random.default_rng(2)
    for B, L in SHAPES:
        x = rng.integers(-3, 4, (B, L)).astype(np.float32)   # ties: first vs last index matters
        _check(path, rt, {"x": x})


@pytest.mark.parametrize("largest,axis,dtype", [(1, -1, F), (0, -1, F), (1, 0, F), (1, -1, I64)])
def test_topk_values_and_indices_match_onnxruntime_ties_included(tmp_path, largest, axis, dtype):
    """TopK compiles natively (values and indices; K a constant, the axis extent dynamic), sorted,
    ties in index order as onnxruntime; K beyond the axis extent at run time is refused by name."""
    from onnx import numpy_helper
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)]
    out = ["B", 3] if axis == -1 else [3, "L"]
    path = _model(tmp_path, "topk", nodes, [("x", dtype, ["B", "L"])], [("v", dtype, out), ("i", I64, out)],
                  [numpy_helper.from_array(np.array([3], np.int64), "k")])
    model, rt = _compile(path, ["B=3:4", "L=3:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(5)
    for B, L in [(3, 3), (4, 7), (3, 13), (4, 128)]:
        x = rng.integers(-3, 4, (B, L)).astype(np.float32 if dtype == F else np.int64)   # many ties
        _check(path, rt, {"x": x})
    if axis == -1:
        from tscomp.errors import ShapeError
        with pytest.raises(ShapeError, match="K at most the axis extent"):
            compile_and_run = Runtime.from_compiled(compile_model(str(path), ["B=3:4", "L=1:128"], max_variants=1))
            compile_and_run.run({"x": np.zeros((3, 2), np.float32 if dtype == F else np.int64)})


def _scatter_elements(tmp_path, reduction="none", axis=1):
    attrs = {"axis": axis} | ({"reduction": reduction} if reduction != "none" else {})
    nodes = [helper.make_node("ScatterElements", ["x", "idx", "u"], ["y"], **attrs)]
    return _model(tmp_path, f"scatter_el_{reduction}_{axis}", nodes,
                  [("x", F, ["B", "L"]), ("idx", I64, ["B", "K"]), ("u", F, ["B", "K"])], [("y", F, ["B", "L"])])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_matches_onnxruntime(tmp_path, reduction):
    path = _scatter_elements(tmp_path, reduction)
    model, rt = _compile(path, ["B=1:4", "L=1:128", "K=1:8"])
    assert _index_groups(model)
    rng = np.random.default_rng(3)
    for B, L in SHAPES:
        K = min(L, 5)
        # distinct indices per row for "none" (duplicates are unordered in onnxruntime), negative ones too
        idx = np.stack([rng.permutation(L)[:K] for _ in range(B)]) if reduction == "none" else \
            rng.integers(0, L, (B, K))
        idx = np.where(rng.random((B, K)) < 0.3, idx - L, idx).astype(np.int64)
        _check(path, rt, {"x": rng.standard_normal((B, L)).astype(np.float32), "idx": idx,
                          "u": rng.standard_normal((B, K)).astype(np.float32)})


def test_scatter_elements_out_of_range_index_names_node_input_and_value(tmp_path):
    path = _scatter_elements(tmp_path)
    model, rt = _compile(path, ["B=1:4", "L=1:128", "K=1:8"])
    feeds = {"x": np.zeros((2, 5), np.float32), "idx": np.array([[0, 1], [4, 5]], np.int64),
             "u": np.ones((2, 2), np.float32)}
    with pytest.raises(IndexOutOfRangeError, match=r"ScatterElements node .*index input 'idx' has value 5 at \(1, 1\)"
                                                   r".*\[-5, 4\]"):
        rt.run(feeds)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_matches_onnxruntime_and_checks_indices(tmp_path, reduction):
    attrs = {"reduction": reduction} if reduction != "none" else {}
    nodes = [helper.make_node("ScatterND", ["x", "idx", "u"], ["y"], **attrs)]
    path = _model(tmp_path, f"scatter_nd_{reduction}", nodes,
                  [("x", F, ["B", "L", 3]), ("idx", I64, ["K", 2]), ("u", F, ["K", 3])], [("y", F, ["B", "L", 3])])
    model, rt = _compile(path, ["B=1:4", "L=1:128", "K=1:8"])
    assert _index_groups(model)
    rng = np.random.default_rng(4)
    for B, L in SHAPES:
        pairs = [(b, l) for b in range(B) for l in range(L)]
        K = min(len(pairs), 6)
        idx = np.array([pairs[k] for k in rng.permutation(len(pairs))[:K]], np.int64)
        _check(path, rt, {"x": rng.standard_normal((B, L, 3)).astype(np.float32), "idx": idx,
                          "u": rng.standard_normal((K, 3)).astype(np.float32)})
    bad = {"x": np.zeros((2, 3, 3), np.float32), "idx": np.array([[0, 1], [2, 0]], np.int64),
           "u": np.ones((2, 3), np.float32)}
    with pytest.raises(IndexOutOfRangeError, match=r"ScatterND node .*index input 'idx' has value 2 at \(1, 0\)"):
        rt.run(bad)


def test_an_op_without_a_c_kernel_is_refused_by_name(tmp_path):
    nodes = [helper.make_node("NonZero", ["x"], ["y"])]
    path = _model(tmp_path, "nonzero", nodes, [("x", F, [4])], [("y", I64, [1, "N"])])
    import tscomp.graph as G
    from tscomp.graph.fusion import fuse
    plan = fuse(G.load_model(path, []))
    choice = choose_family(plan, plan.groups[0])
    assert choice.family is None
    assert any("index: " in r and "NonZero" in r and "no C kernel" in r for r in choice.reasons), choice.reasons
    with pytest.raises(UnsupportedOperatorError):
        from tscomp.codegen.cpu_index import analyze_index_group
        analyze_index_group(plan, plan.groups[0])


# ------------------------------------------------------------------ Resize
RESIZE_CASES = [
    ("nearest", "asymmetric", {"nearest_mode": "floor"}),
    ("nearest", "half_pixel", {}),
    ("nearest", "tf_half_pixel_for_nn", {"nearest_mode": "round_prefer_ceil"}),
    ("linear", "half_pixel", {}),
    ("linear", "align_corners", {}),
    ("linear", "pytorch_half_pixel", {"antialias": 1}),
    ("cubic", "half_pixel", {}),
    ("cubic", "asymmetric", {"exclude_outside": 1, "cubic_coeff_a": -0.5}),
    ("cubic", "half_pixel_symmetric", {"antialias": 1}),
]


@pytest.mark.parametrize("mode,coord,extra", RESIZE_CASES, ids=[f"{m}-{c}-{len(e)}" for m, c, e in RESIZE_CASES])
@pytest.mark.parametrize("scale_h,scale_w", [(2.0, 0.5), (0.75, 3.0)])
def test_resize_with_scales_matches_onnxruntime(tmp_path, mode, coord, extra, scale_h, scale_w):
    nodes = [helper.make_node("Resize", ["x", "", "sc"], ["y"], mode=mode, coordinate_transformation_mode=coord,
                              **extra)]
    path = _model(tmp_path, "resize", nodes, [("x", F, ["B", 3, "H", "W"])], [("y", F, [None, None, None, None])],
                  [helper.make_tensor("sc", F, [4], [1.0, 1.0, scale_h, scale_w])])
    model, rt = _compile(path, ["B=1:2", "H=1:40", "W=1:40"])
    assert _index_groups(model)
    rng = np.random.default_rng(5)
    for H, W in [(1, 1), (7, 13), (40, 2), (4, 40)]:
        _check(path, rt, {"x": rng.standard_normal((2, 3, H, W)).astype(np.float32)})


def test_resize_to_sizes_from_the_input_shape_as_vit_exports_it(tmp_path):
    """ViT's position grid: a bicubic Resize to sizes computed from shape values (H // 4, W // 4)."""
    grid = np.random.default_rng(6).standard_normal((1, 8, 5, 5)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "st", "en"], ["hw"]),
             helper.make_node("Div", ["hw", "four"], ["hw4"]),
             helper.make_node("Concat", ["lead", "hw4"], ["sz"], axis=0),
             helper.make_node("Resize", ["g", "", "", "sz"], ["r"], mode="cubic", cubic_coeff_a=-0.75,
                              coordinate_transformation_mode="half_pixel", antialias=0),
             helper.make_node("ReduceSum", ["x", "ax"], ["xs"], keepdims=1),
             helper.make_node("Add", ["r", "xs"], ["y"])]
    inits = [helper.make_tensor("g", F, grid.shape, grid.reshape(-1).tolist()),
             helper.make_tensor("st", I64, [1], [2]), helper.make_tensor("en", I64, [1], [4]),
             helper.make_tensor("four", I64, [1], [4]), helper.make_tensor("lead", I64, [2], [1, 8]),
             helper.make_tensor("ax", I64, [3], [1, 2, 3])]
    path = _model(tmp_path, "resize_sizes", nodes, [("x", F, [1, 2, "H", "W"])], [("y", F, [None, None, None, None])], inits)
    model, rt = _compile(path, ["H=4:64", "W=4:64"])
    assert _index_groups(model)
    rng = np.random.default_rng(7)
    for H, W in [(4, 4), (20, 36), (64, 13), (64, 64)]:
        _check(path, rt, {"x": rng.standard_normal((1, 2, H, W)).astype(np.float32)})


@pytest.mark.parametrize("op,last", [("ArgMax", 0), ("ArgMin", 1)])
def test_arg_reduction_with_a_fused_prologue_is_a_row_kernel(tmp_path, op, last):
    """ArgMax(x + z) over the last axis: the Add is fused into the row kernel's single in-order pass."""
    nodes = [helper.make_node("Add", ["x", "z"], ["s"]),
             helper.make_node(op, ["s"], ["y"], axis=-1, keepdims=0, select_last_index=last)]
    path = _model(tmp_path, "arg_prologue", nodes, [("x", F, ["B", "L"]), ("z", F, ["B", "L"])], [("y", I64, ["B"])])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert not model.fallback_groups()
    (kernel,) = [ks[0] for ks in model.kernels.values()]
    assert kernel.family == "row-or-elementwise" and "Add" in kernel.source and op in kernel.source
    rng = np.random.default_rng(8)
    for B, L in SHAPES:
        x = rng.integers(-3, 4, (B, L)).astype(np.float32)
        z = rng.integers(-1, 2, (B, L)).astype(np.float32)
        _check(path, rt, {"x": x, "z": z})


# ------------------------------------------------------------------ Pad, Trilu, OneHot, EyeLike
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_with_pads_computed_from_the_shape(tmp_path, mode):
    """Window padding as Swin exports it: pad W up to a multiple of 7, (7 - W % 7) % 7 from shape values;
    a negative pad on H crops; reflect/wrap pads may be longer than the input."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "three"], ["w"], axis=0),
             helper.make_node("Mod", ["w", "seven"], ["wm"]),
             helper.make_node("Sub", ["seven", "wm"], ["d"]),
             helper.make_node("Mod", ["d", "seven"], ["pw"]),
             helper.make_node("Concat", ["z3", "pw", "lo", "z1", "pw"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads", "cv"] if mode == "constant" else ["x", "pads"], ["y"], mode=mode)]
    inits = [helper.make_tensor("three", I64, [1], [3]), helper.make_tensor("seven", I64, [1], [7]),
             helper.make_tensor("z3", I64, [3], [0, 0, 1]), helper.make_tensor("lo", I64, [2], [0, 0]),
             helper.make_tensor("z1", I64, [1], [-1]), helper.make_tensor("cv", F, [], [2.5])]
    path = _model(tmp_path, f"pad_{mode}", nodes, [("x", F, ["B", 3, "H", "W"])], [("y", F, [None] * 4)], inits,
                  opset=19)
    model, rt = _compile(path, ["B=1:2", "H=2:20", "W=1:20"])
    assert _index_groups(model)
    rng = np.random.default_rng(9)
    # onnxruntime's reflect needs 2+ elements after the crop and pads shorter than the axis
    shapes = [(3, 7), (4, 6), (13, 13), (20, 20)] if mode == "reflect" else [(2, 1), (3, 7), (13, 8), (20, 20)]
    for H, W in shapes:
        _check(path, rt, {"x": rng.standard_normal((2, 3, H, W)).astype(np.float32)})


@pytest.mark.parametrize("mode", ["constant", "edge", "wrap", "reflect"])
@pytest.mark.parametrize("pads", [[0, 2, 1, 3],            # rank 2: both axes, uneven
                                  [1, 0, 0, 0],            # only a leading (row) axis: rows filled whole
                                  [0, -1, 0, 2],           # the row axis cropped at its start, padded at its end
                                  [2, 0, -1, 0]])           # the other axis padded, then cropped at its end
def test_pad_row_by_row_matches_onnxruntime(tmp_path, mode, pads):
    """The kernel copies a row at a time (lead fill, source run, tail fill): pads on the row's own axis
    and on the axes above it, crops on either, every mode."""
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)]
    path = _model(tmp_path, "pad_rows", nodes, [("x", F, ["H", "W"])], [("y", F, [None, None])],
                  [helper.make_tensor("pads", I64, [4], pads)], opset=19)
    model, rt = _compile(path, ["H=3:40", "W=4:40"])
    assert _index_groups(model)
    rng = np.random.default_rng(11)
    # onnxruntime's reflect refuses a pad as long as the axis (numpy's and tscomp's repeat it)
    for H, W in [(5, 17), (40, 40), (37, 5)] + ([] if mode == "reflect" else [(3, 4)]):
        _check(path, rt, {"x": rng.standard_normal((H, W)).astype(np.float32)})


@pytest.mark.parametrize("view", ["slice", "transpose"])
def test_pad_of_a_view_of_its_input_gathers_the_view_first(tmp_path, view):
    """MobileBERT's shifted embeddings (Slice then Pad) and Swin's window padding after a reshape:
    the fusion absorbs the view into the Pad's group, and the index kernel gathers it contiguous."""
    if view == "slice":
        nodes = [helper.make_node("Slice", ["x", "one", "big", "one"], ["v"]),
                 helper.make_node("Pad", ["v", "pads"], ["y"])]
        pads = [0, 0, 0, 0, 1, 0]            # the sequence shifted by one, a zero row at its end
        out = [("y", F, ["B", "L", 16])]
    else:
        nodes = [helper.make_node("Transpose", ["x"], ["v"], perm=[0, 2, 1]),
                 helper.make_node("Pad", ["v", "pads"], ["y"])]
        pads = [0, 1, 0, 0, 2, 3]
        out = [("y", F, ["B", 19, None])]
    inits = [helper.make_tensor("one", I64, [1], [1]), helper.make_tensor("big", I64, [1], [1 << 40]),
             helper.make_tensor("pads", I64, [6], pads)]
    path = _model(tmp_path, f"pad_of_{view}", nodes, [("x", F, ["B", "L", 16])], out, inits)
    model, rt = _compile(path, ["B=1:3", "L=2:64"])
    assert _index_groups(model)
    assert any("gathered contiguous" in k.source for ks in model.kernels.values() for k in ks)
    rng = np.random.default_rng(12)
    for B, L in [(1, 2), (3, 13), (2, 64)]:
        _check(path, rt, {"x": rng.standard_normal((B, L, 16)).astype(np.float32)})


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, -2), (0, 3)])
def test_trilu_matches_onnxruntime(tmp_path, upper, k):
    nodes = [helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)]
    path = _model(tmp_path, "trilu", nodes, [("x", F, ["B", "L", "L"])], [("y", F, ["B", "L", "L"])],
                  [helper.make_tensor("k", I64, [], [k])])
    model, rt = _compile(path, ["B=1:3", "L=1:64"])
    assert _index_groups(model)
    rng = np.random.default_rng(10)
    for B, L in [(1, 1), (2, 7), (3, 64)]:
        _check(path, rt, {"x": rng.standard_normal((B, L, L)).astype(np.float32)})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot_and_eyelike_match_onnxruntime(tmp_path, axis):
    nodes = [helper.make_node("OneHot", ["idx", "depth", "vals"], ["y"], axis=axis),
             helper.make_node("EyeLike", ["sq"], ["e"], k=1)]
    out = ["B", "L"]
    out.insert(axis % 3, 5)
    path = _model(tmp_path, "onehot", nodes, [("idx", I64, ["B", "L"]), ("sq", F, [4, 6])],
                  [("y", F, out), ("e", F, [4, 6])],
                  [helper.make_tensor("depth", I64, [], [5]), helper.make_tensor("vals", F, [2], [-1.0, 3.0])])
    model, rt = _compile(path, ["B=1:3", "L=1:64"])
    assert len(_index_groups(model)) == 2
    rng = np.random.default_rng(11)
    for B, L in [(1, 1), (2, 7), (3, 64)]:
        _check(path, rt, {"idx": rng.integers(-7, 8, (B, L)).astype(np.int64),   # out of range: all off
                          "sq": np.zeros((4, 6), np.float32)})


def test_tile_is_an_index_map_of_the_elementwise_kernel(tmp_path):
    nodes = [helper.make_node("Tile", ["x", "reps"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    path = _model(tmp_path, "tile", nodes, [("x", F, ["B", "L"])], [("y", F, [None, None])],
                  [helper.make_tensor("reps", I64, [2], [2, 3])])
    model, rt = _compile(path, ["B=1:3", "L=1:64"])
    assert not model.fallback_groups()
    rng = np.random.default_rng(12)
    for B, L in [(1, 1), (2, 7), (3, 64)]:
        _check(path, rt, {"x": rng.standard_normal((B, L)).astype(np.float32)})


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceProd",
              "ReduceMax", "ReduceMin", "ReduceLogSumExp"]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes,keepdims", [([1, 2], 1), ([0, 2], 0), ([1], 1)])
def test_a_reduction_over_non_trailing_axes_is_an_index_kernel_matching_onnxruntime(tmp_path, op, axes, keepdims):
    """The row kernel reduces trailing axes only; any other axes (ConvNeXt-V2's GRN: ReduceL2 over
    the spatial axes of [N, H, W, C]) go to the index family's reduction kernel, not numpy."""
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)]
    out = [1 if a in axes else d for a, d in enumerate(["B", "H", "W", 5])] if keepdims else \
        [d for a, d in enumerate(["B", "H", "W", 5]) if a not in axes]
    path = _model(tmp_path, "reduce", nodes, [("x", F, ["B", "H", "W", 5])], [("y", F, out)],
                  [helper.make_tensor("axes", I64, [len(axes)], axes)])
    model, rt = _compile(path, ["B=1:3", "H=1:40", "W=1:40"])
    assert _index_groups(model)
    rng = np.random.default_rng(len(op) + sum(axes))
    for B, H, W in [(1, 1, 1), (2, 7, 13), (3, 40, 1), (1, 37, 40)]:
        x = rng.uniform(0.5, 1.5, (B, H, W, 5)).astype(np.float32)   # positive: ReduceLogSum's log
        if op == "ReduceProd":
            x = rng.uniform(0.97, 1.03, x.shape).astype(np.float32)   # a product of up to 1600 terms stays finite
        _check(path, rt, {"x": x})


# ------------------------------------------------------------------ LpNormalization, LRN, Hardmax, Det, ReverseSequence
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 1])
def test_lp_normalization_matches_onnxruntime_including_all_zero_lines(tmp_path, p, axis):
    nodes = [helper.make_node("LpNormalization", ["x"], ["y"], axis=axis, p=p)]
    path = _model(tmp_path, "lpnorm", nodes, [("x", F, ["B", "L", 5])], [("y", F, ["B", "L", 5])])
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(p + axis)
    for B, L in SHAPES:
        x = rng.standard_normal((B, L, 5)).astype(np.float32)
        x[0, 0] = 0          # a zero line (axis -1) / zero column entries (axis 1)
        _check(path, rt, {"x": x})


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_lrn_matches_onnxruntime_with_windows_clipped_at_the_first_and_last_channel(tmp_path, size):
    """An even size (onnxruntime takes odd ones only) against the reference: one channel more after."""
    from tscomp.graph.ops.nn import lrn_ref
    from tscomp.graph.ops.registry import OpCall
    attrs = dict(size=size, alpha=2e-3, beta=0.6, bias=1.5)
    nodes = [helper.make_node("LRN", ["x"], ["y"], **attrs)]
    path = _model(tmp_path, "lrn", nodes, [("x", F, ["B", 6, "H", "W"])], [("y", F, ["B", 6, "H", "W"])])
    model, rt = _compile(path, ["B=1:4", "H=1:31", "W=1:31"])
    assert _index_groups(model)
    rng = np.random.default_rng(size)
    for B, H, W in [(1, 1, 1), (2, 7, 13), (4, 31, 3)]:
        x = 3 * rng.standard_normal((B, 6, H, W)).astype(np.float32)
        if size % 2:
            _check(path, rt, {"x": x})
        else:
            np.testing.assert_allclose(rt.run({"x": x})["y"], lrn_ref(OpCall("n", "LRN", attrs, 18, 1), x), rtol=1e-5)


@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 1), (11, 1)])
def test_hardmax_marks_the_first_largest_element_as_onnxruntime(tmp_path, opset, axis):
    """Ties (rounded inputs) go to the first; before opset 13 the lines are the input flattened at the axis."""
    nodes = [helper.make_node("Hardmax", ["x"], ["y"], axis=axis)]
    path = _model(tmp_path, "hardmax", nodes, [("x", F, ["B", "L", 4])], [("y", F, ["B", "L", 4])], opset=opset)
    model, rt = _compile(path, ["B=1:4", "L=1:128"])
    assert _index_groups(model)
    rng = np.random.default_rng(opset + axis)
    for B, L in SHAPES:
        _check(path, rt, {"x": np.round(rng.standard_normal((B, L, 4))).astype(np.float32)})


def test_det_matches_onnxruntime_for_singular_and_pivoting_matrices(tmp_path):
    nodes = [helper.make_node("Det", ["x"], ["y"])]
    path = _model(tmp_path, "det", nodes, [("x", F, ["B", 4, 4])], [("y", F, ["B"])])
    model, rt = _compile(path, ["B=1:97"])
    assert _index_groups(model)
    rng = np.random.default_rng(3)
    for B in (1, 7, 97):
        x = rng.standard_normal((B, 4, 4)).astype(np.float32)
        x[0, 0] = 0                      # a zero leading entry: the first column must pivot
        if B > 1:
            x[1, 3] = x[1, 2]            # two equal rows: singular
        _check(path, rt, {"x": x})


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence_reverses_each_prefix_and_refuses_a_length_past_the_steps(tmp_path, batch_axis, time_axis):
    nodes = [helper.make_node("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=time_axis)]
    dims = ["T", "B", 3] if time_axis == 0 else ["B", "T", 3]
    path = _model(tmp_path, "revseq", nodes, [("x", F, dims), ("lens", I64, ["B"])], [("y", F, dims)])
    model, rt = _compile(path, ["B=1:5", "T=1:64"])
    assert _index_groups(model)
    rng = np.random.default_rng(batch_axis)
    for B, T in [(1, 1), (3, 13), (5, 64)]:
        shape = (T, B, 3) if time_axis == 0 else (B, T, 3)
        lens = rng.integers(0, T + 1, B).astype(np.int64)
        _check(path, rt, {"x": rng.standard_normal(shape).astype(np.float32), "lens": lens})
    shape = (4, 2, 3) if time_axis == 0 else (2, 4, 3)
    with pytest.raises(IndexOutOfRangeError, match=r"ReverseSequence node .*'lens' has value 5 at \(1,\)"):
        rt.run({"x": np.zeros(shape, np.float32), "lens": np.array([1, 5], np.int64)})
