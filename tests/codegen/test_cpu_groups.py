"""Generated C for non-GEMM fused groups, checked against the numpy interpreter of the Plan and
onnxruntime: row reductions at awkward row lengths, an elementwise/injective mix, every C template
of the elementwise registry, and every supported group of real exported models."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.cpu_groups import CompiledGroup, generate_group
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion import Group, fuse
from tscomp.graph.fusion.interpret import evaluate_group
from tscomp.graph.reference import bind_symbols
from tests.codegen.plan_runs import close, group_env, interpreted_groups, model_plan

ROWS_AND_LENGTHS = [(1, 1), (3, 7), (1, 13), (5, 97), (2, 511), (1, 512), (3, 513)]


# ----------------------------------------------------------------------------- helpers
def save_model(tmp_path, name, nodes, inputs, outputs, inits=(), opset=18):
    def info(spec):
        n, t, dims = spec
        return helper.make_tensor_value_info(n, t, dims)
    graph = helper.make_graph(nodes, name, [info(i) for i in inputs], [info(o) for o in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def const(name, values, dtype=np.float32):
    arr = np.asarray(values, dtype=dtype)
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape, arr.reshape(-1).tolist())


class CompiledPlan:
    """Every group that generate_group supports, compiled; the rest interpreted."""

    def __init__(self, path, dims):
        self.path = path
        self.plan = fuse(G.load_model(path, dims))
        self.kernels, self.unsupported = {}, {}
        for g in self.plan.groups:
            try:
                self.kernels[g.name] = CompiledGroup.build(self.plan, g)
            except UnsupportedOperatorError as exc:
                self.unsupported[g.name] = str(exc)

    def run(self, inputs):
        """Graph outputs, and per compiled group (its outputs, the interpreter's)."""
        plan = self.plan
        binding = bind_symbols(plan.graph, inputs)
        env = dict(inputs)
        checks = {}
        for g in plan.groups:
            genv = group_env(plan, g, env, binding)
            want = evaluate_group(plan, g, genv, binding)
            if g.name in self.kernels:
                got = self.kernels[g.name].run(genv, binding)
                checks[g.name] = (got, want)
                env.update(got)
            else:
                env.update(want)
        return {o: env[o] for o in plan.graph.outputs}, checks


def ort_outputs(path, inputs):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))


def check_against_ort(cp: CompiledPlan, inputs, *, all_compiled=True):
    if all_compiled:
        assert not cp.unsupported, cp.unsupported
    outs, checks = cp.run(inputs)
    for name, (got, want) in checks.items():
        for k in want:
            close(got[k], want[k], f"{name}:{k} vs interpreter")
    for name, want in ort_outputs(cp.path, inputs).items():
        close(outs[name], want, f"{name} vs onnxruntime")
    return checks


# ----------------------------------------------------------------------------- row reductions
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_with_prologue_at_awkward_rows(tmp_path, op):
    path = save_model(tmp_path, op.lower(), [
        helper.make_node("Mul", ["X", "s"], ["xs"]),
        helper.make_node("Add", ["xs", "M"], ["xm"]),
        helper.make_node(op, ["xm"], ["Y"], axis=-1),
    ], [("X", TP.FLOAT, ["R", 2, "N"]), ("M", TP.FLOAT, ["R", 1, "N"])], [("Y", TP.FLOAT, ["R", 2, "N"])],
        [const("s", 0.125)])
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    assert [g.kind for g in cp.plan.groups] == ["reduce"]
    rng = np.random.default_rng(0)
    for r, n in ROWS_AND_LENGTHS:
        x = rng.standard_normal((r, 2, n)).astype(np.float32) * 8
        m = np.where(rng.random((r, 1, n)) < 0.2, np.float32(-1e9), np.float32(0)).astype(np.float32)
        check_against_ort(cp, {"X": x, "M": m})


def test_softmax_of_masked_rows_and_nan_follows_numpy(tmp_path):
    """Fully masked rows (all -inf) and NaN give NaN rows, as the reference does (exported
    attention zeroes them afterwards with IsNaN + Where)."""
    path = save_model(tmp_path, "masked", [helper.make_node("Add", ["X", "M"], ["xm"]),
                                           helper.make_node("Softmax", ["xm"], ["Y"], axis=-1)],
                      [("X", TP.FLOAT, ["R", "N"]), ("M", TP.FLOAT, ["R", "N"])], [("Y", TP.FLOAT, ["R", "N"])])
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    x = np.random.default_rng(8).standard_normal((4, 17)).astype(np.float32)
    m = np.zeros((4, 17), np.float32)
    m[1, :] = -np.inf
    m[2, 3:] = -np.inf
    x[0, 5] = np.nan
    _, checks = cp.run({"X": x, "M": m})
    (got, want), = checks.values()
    assert np.isnan(got["Y"][:2]).all() and not np.isnan(got["Y"][2:]).any()
    close(got["Y"], want["Y"], "masked softmax vs interpreter")


def test_softmax_before_opset_13_normalizes_every_trailing_axis(tmp_path):
    path = save_model(tmp_path, "softmax11", [helper.make_node("Softmax", ["X"], ["Y"], axis=1)],
                      [("X", TP.FLOAT, ["R", 3, "N"])], [("Y", TP.FLOAT, ["R", 3, "N"])], opset=11)
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    rng = np.random.default_rng(1)
    for r, n in ROWS_AND_LENGTHS:
        check_against_ort(cp, {"X": rng.standard_normal((r, 3, n)).astype(np.float32)})


def test_layer_norm_with_residual_prologue_and_epilogue(tmp_path):
    nodes = [
        helper.make_node("Add", ["X", "Res"], ["xr"]),
        helper.make_node("LayerNormalization", ["xr", "scale", "bias"], ["ln", "mean", "rstd"], axis=-1,
                         epsilon=1e-5),
        helper.make_node("Mul", ["ln", "half"], ["Y"]),
    ]
    ins = [("X", TP.FLOAT, ["R", "N"]), ("Res", TP.FLOAT, ["R", "N"]), ("scale", TP.FLOAT, ["N"]),
           ("bias", TP.FLOAT, ["N"])]
    outs = [("Y", TP.FLOAT, ["R", "N"]), ("mean", TP.FLOAT, ["R", 1]), ("rstd", TP.FLOAT, ["R", 1])]
    path = save_model(tmp_path, "layernorm", nodes, ins, outs, [const("half", 0.5)])
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    rng = np.random.default_rng(2)
    for r, n in ROWS_AND_LENGTHS:
        inputs = {"X": (rng.standard_normal((r, n)) * 3 + 1).astype(np.float32),
                  "Res": rng.standard_normal((r, n)).astype(np.float32),
                  "scale": rng.standard_normal(n).astype(np.float32), "bias": rng.standard_normal(n).astype(np.float32)}
        check_against_ort(cp, inputs)


def _head_norm_model(tmp_path, tail: str):
    """Qwen3's key norm: a projection [B, L, 64] split into 4 heads of 16, RMSNorm over each head
    (decomposed: Pow, ReduceMean, Add, Sqrt, Div, Mul), transposed into [B, 4, L, 16] and scaled
    by a per-position table there (the rotary cos term); ``tail`` "rotate" adds rotate_half
    (Split, Neg, Concat) and the sin term."""
    nodes = [helper.make_node("Reshape", ["X", "heads"], ["xh"]),
             helper.make_node("Pow", ["xh", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "last"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["xh", "rms"], ["nx"]), helper.make_node("Mul", ["nx", "w"], ["nw"]),
             helper.make_node("Transpose", ["nw"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Mul", ["t", "cos"], ["Y" if tail == "scale" else "yc"])]
    if tail == "rotate":
        nodes += [helper.make_node("Split", ["t"], ["t1", "t2"], axis=-1, num_outputs=2),
                  helper.make_node("Neg", ["t2"], ["n2"]), helper.make_node("Concat", ["n2", "t1"], ["rh"], axis=-1),
                  helper.make_node("Mul", ["rh", "cos"], ["ys"]), helper.make_node("Add", ["yc", "ys"], ["Y"])]
    ins = [("X", TP.FLOAT, ["B", "L", 64]), ("cos", TP.FLOAT, [1, 1, "L", 16])]
    rng = np.random.default_rng(5)
    inits = [const("heads", [0, 0, 4, 16], np.int64), const("two", 2.0), const("last", [-1], np.int64),
             const("eps", 1e-6), const("w", rng.standard_normal(16))]
    return save_model(tmp_path, f"head_norm_{tail}", nodes, ins, [("Y", TP.FLOAT, ["B", 4, "L", 16])], inits)


def test_rows_normalized_per_head_are_stored_transposed_into_heads(tmp_path):
    cp = CompiledPlan(_head_norm_model(tmp_path, "scale"), ["B=1:3", "L=1:64"])
    sources = [k.source for k in cp.kernels.values()]
    assert any("scattered: the rows in another layout" in src for src in sources)
    rng = np.random.default_rng(6)
    for b, n in [(1, 1), (3, 7), (2, 64), (1, 13)]:
        check_against_ort(cp, {"X": rng.standard_normal((b, n, 64)).astype(np.float32),
                               "cos": rng.standard_normal((1, 1, n, 16)).astype(np.float32)})


def test_a_row_group_storing_its_rows_in_both_layouts_matches_onnxruntime(tmp_path):
    # with rotate_half after it, the norm group exports the rows as they are (for the Split) and
    # the scaled transposed copy: one full-row store and one scattered store per row element
    cp = CompiledPlan(_head_norm_model(tmp_path, "rotate"), ["B=1:3", "L=1:64"])
    assert any("scattered: the rows in another layout" in k.source for k in cp.kernels.values())
    rng = np.random.default_rng(7)
    for b, n in [(1, 1), (2, 9), (3, 64)]:
        check_against_ort(cp, {"X": rng.standard_normal((b, n, 64)).astype(np.float32),
                               "cos": rng.standard_normal((1, 1, n, 16)).astype(np.float32)})


@pytest.mark.parametrize("spatial", [["L"], ["H", "W"]])
def test_instance_norm_is_a_row_kernel_with_a_per_channel_affine(tmp_path, spatial):
    """wav2vec2's feature extractor (GroupNorm with a group per channel, exported as
    InstanceNormalization over [N, C, L]); the image form normalizes each (n, c) over H x W."""
    C = 5
    rng = np.random.default_rng(8)
    nodes = [helper.make_node("InstanceNormalization", ["X", "scale", "bias"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["Y"])]
    dims = ["N", C, *spatial]
    path = save_model(tmp_path, "instnorm", nodes, [("X", TP.FLOAT, dims)], [("Y", TP.FLOAT, dims)],
                      [const("scale", rng.standard_normal(C)), const("bias", rng.standard_normal(C))])
    cp = CompiledPlan(path, ["N=1:3"] + [f"{d}=1:600" for d in spatial])
    sizes = [(1, 1), (3, 7), (2, 97), (1, 600)] if len(spatial) == 1 else [(1, 1, 1), (2, 7, 13), (3, 31, 17)]
    for size in sizes:
        shape = (size[0], C, *size[1:])
        check_against_ort(cp, {"X": (rng.standard_normal(shape) * 3 + 1).astype(np.float32)})


def test_a_reduction_followed_only_by_unit_axes_is_a_row_reduction(tmp_path):
    """ConvBERT's dynamic-convolution kernel weights: Softmax over axis 1 of [R, 9, 1] (and a
    keepdims sum alike): the unit axis after the reduced one leaves the rows contiguous."""
    nodes = [helper.make_node("Softmax", ["X"], ["Y"], axis=1),
             helper.make_node("ReduceSum", ["X", "one"], ["S"], keepdims=1)]
    path = save_model(tmp_path, "unit_tail", nodes, [("X", TP.FLOAT, ["R", 9, 1])],
                      [("Y", TP.FLOAT, ["R", 9, 1]), ("S", TP.FLOAT, ["R", 1, 1])], [const("one", [1], np.int64)])
    cp = CompiledPlan(path, ["R=1:512"])
    rng = np.random.default_rng(9)
    for r in (1, 7, 512):
        check_against_ort(cp, {"X": (rng.standard_normal((r, 9, 1)) * 3).astype(np.float32)})


def test_group_norm_over_reshapes_loads_and_stores_its_rows_without_division(tmp_path):
    """PoolFormer's GroupNorm with one group: [N, C, H, W] reshaped to [N, 1, C*H*W],
    InstanceNormalization, reshaped back, per-channel scale and shift. The row runs over the
    image in memory order, so its loads and its store are unit-stride, and it is split into runs
    of H*W, one per channel, so the per-channel scale and shift are read once per run: no division
    per element anywhere."""
    C = 6
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Reshape", ["X", "flat"], ["xf"]),
             helper.make_node("InstanceNormalization", ["xf", "one", "zero"], ["nf"], epsilon=1e-5),
             helper.make_node("Shape", ["X"], ["shp"]), helper.make_node("Reshape", ["nf", "shp"], ["n"]),
             helper.make_node("Mul", ["n", "g"], ["ng"]), helper.make_node("Add", ["ng", "b"], ["Y"])]
    path = save_model(tmp_path, "groupnorm", nodes, [("X", TP.FLOAT, ["N", C, "H", "W"])],
                      [("Y", TP.FLOAT, ["N", C, "H", "W"])],
                      [const("flat", [0, 1, -1], np.int64), const("one", [1.0]), const("zero", [0.0]),
                       const("g", rng.standard_normal((C, 1, 1))), const("b", rng.standard_normal((C, 1, 1)))])
    cp = CompiledPlan(path, ["N=1:3", "H=1:64", "W=1:64"])
    (src,) = [k.source for k in cp.kernels.values()]
    body = src[src.index("{", src.index("void tscomp_")):]
    loads = [line for line in body.splitlines() if "in0[" in line or "out0[" in line or "k0[" in line]
    index = [line.split("/*")[0].split("[", 1)[1] for line in loads]
    assert any("k0[" in line for line in loads) and not any("/" in i or "%" in i for i in index), loads
    for n, h, w in [(1, 1, 1), (2, 7, 13), (3, 64, 5)]:
        check_against_ort(cp, {"X": (rng.standard_normal((n, C, h, w)) * 2 + 1).astype(np.float32)})


def test_decomposed_layer_norm_stitches_two_reductions(tmp_path):
    nodes = [
        helper.make_node("ReduceMean", ["X"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["X", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["nrm"]),
        helper.make_node("Mul", ["nrm", "scale"], ["sc"]),
        helper.make_node("Add", ["sc", "bias"], ["Y"]),
    ]
    ins = [("X", TP.FLOAT, ["R", "N"]), ("scale", TP.FLOAT, ["N"]), ("bias", TP.FLOAT, ["N"])]
    path = save_model(tmp_path, "ln_decomposed", nodes, ins, [("Y", TP.FLOAT, ["R", "N"])],
                      [const("two", 2.0), const("eps", 1e-5)], opset=17)
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    heavy = [o.op_type for g in cp.plan.groups for o in g.ops() if o.heavy]
    assert heavy.count("ReduceMean") == 2 and len(cp.plan.groups) == 1, cp.plan.describe()
    rng = np.random.default_rng(3)
    for r, n in ROWS_AND_LENGTHS:
        inputs = {"X": (rng.standard_normal((r, n)) * 2 - 1).astype(np.float32),
                  "scale": rng.standard_normal(n).astype(np.float32), "bias": rng.standard_normal(n).astype(np.float32)}
        check_against_ort(cp, inputs)


@pytest.mark.parametrize("op,axes,keepdims,dtype", [
    ("ReduceSum", [-1], 1, TP.FLOAT), ("ReduceMax", [-1], 1, TP.FLOAT), ("ReduceMin", [2], 0, TP.FLOAT),
    ("ReduceMean", [1, 2], 0, TP.FLOAT), ("ReduceL2", [-1], 1, TP.FLOAT), ("ReduceLogSumExp", [-1], 1, TP.FLOAT),
    ("ReduceSumSquare", [-1], 0, TP.FLOAT), ("ReduceSum", [-1], 1, TP.INT64), ("ReduceMax", [-2, -1], 1, TP.INT64),
])
def test_trailing_reductions(tmp_path, op, axes, keepdims, dtype):
    out_dims = ["R", 3, "N"]
    for a in sorted({a % 3 for a in axes}, reverse=True):
        if keepdims:
            out_dims[a] = 1
        else:
            del out_dims[a]
    path = save_model(tmp_path, op.lower(), [helper.make_node(op, ["X", "axes"], ["Y"], keepdims=keepdims)],
                      [("X", dtype, ["R", 3, "N"])], [("Y", dtype, out_dims)], [const("axes", axes, np.int64)])
    cp = CompiledPlan(path, ["R=1:8", "N=1:1024"])
    rng = np.random.default_rng(4)
    for r, n in ROWS_AND_LENGTHS:
        x = rng.standard_normal((r, 3, n)) * 3
        x = x.astype(np.float32) if dtype == TP.FLOAT else np.round(x * 10).astype(np.int64)
        check_against_ort(cp, {"X": x})


def test_a_row_over_several_trailing_axes_is_one_flat_vector_loop(tmp_path):
    """A squeeze-excitation block's mean over [H, W] (how the dynamo exporter writes an adaptive
    average pool): the row over both axes is one flat simd loop whose loads are unit-stride (a
    collapse(2) simd nest ran 4-11x slower); a factor broadcast along one reduced axis reads it
    through the delinearized index and still matches."""
    C = 4
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("ReduceMean", ["X", "hw"], ["m"], keepdims=1),
             helper.make_node("Mul", ["X", "colw"], ["xw"]),
             helper.make_node("ReduceSum", ["xw", "hw"], ["s"], keepdims=0)]
    path = save_model(tmp_path, "se_mean", nodes, [("X", TP.FLOAT, ["N", C, "H", "W"]), ("colw", TP.FLOAT, [1, 1, 1, "W"])],
                      [("m", TP.FLOAT, ["N", C, 1, 1]), ("s", TP.FLOAT, ["N", C])], [const("hw", [2, 3], np.int64)])
    cp = CompiledPlan(path, ["N=1:3", "H=1:64", "W=1:64"])
    sources = [k.source for k in cp.kernels.values()]
    assert sources and not any("simd collapse" in src for src in sources)
    mean_src = next(src for src in sources if "ReduceMean" in src)
    loads = [line for line in mean_src.splitlines() if "in0[" in line and "=" in line]
    assert loads and not any("/" in line.split("in0[", 1)[1] or "%" in line.split("in0[", 1)[1] for line in loads), loads
    for n, h, w in [(1, 1, 1), (2, 7, 13), (3, 64, 5), (1, 24, 24)]:
        check_against_ort(cp, {"X": rng.standard_normal((n, C, h, w)).astype(np.float32),
                               "colw": rng.standard_normal((1, 1, 1, w)).astype(np.float32)})


def test_an_elementwise_nest_with_a_short_inner_axis_runs_its_trailing_axes_as_one_flat_loop(tmp_path):
    """[N, C, H, W] with small H, W (a CNN's late stage) and a per-channel scale: [H, W] is one flat
    simd loop (a loop of W alone is mostly remainder, and QuantizeLinear's division chain ran at its
    latency: 4x slower), the per-channel constant stays outside it, and nothing divides the flat
    index; a transposed read keeps the plain nest (it would divide every element)."""
    C = 8
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Mul", ["X", "scale"], ["xs"]),
             helper.make_node("QuantizeLinear", ["xs", "qs", "qz"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "qs", "qz"], ["Y"]),
             helper.make_node("Transpose", ["X"], ["xt"], perm=[0, 1, 3, 2]),
             helper.make_node("Add", ["xt", "X"], ["T"])]
    path = save_model(tmp_path, "short_rows", nodes, [("X", TP.FLOAT, ["N", C, "S", "S"])],
                      [("Y", TP.FLOAT, ["N", C, "S", "S"]), ("T", TP.FLOAT, ["N", C, "S", "S"])],
                      [const("scale", rng.uniform(0.5, 2, (1, C, 1, 1))), const("qs", 0.05),
                       const("qz", 128, np.uint8)])
    cp = CompiledPlan(path, ["N=1:3", "S=1:40"])
    (quant,), (transposed,) = ([k.source for k in cp.kernels.values() if ("Round" in k.source) == want]
                               for want in (True, False))
    flat_loop = quant.split("for (int64_t iflat = 0; iflat < S_*S_; ++iflat) {", 1)
    assert len(flat_loop) == 2, quant
    assert "k0[i1]" in flat_loop[0] and "k0[" not in flat_loop[1]       # the channel's scale: once per row
    assert "/" not in flat_loop[1].split("in0[", 1)[1].split("]")[0]     # the load: no division
    assert "iflat" not in transposed and "for (int64_t i3 = 0; i3 < S_; ++i3)" in transposed
    for n, h in [(1, 1), (2, 7), (3, 40), (1, 13)]:
        check_against_ort(cp, {"X": rng.standard_normal((n, C, h, h)).astype(np.float32) * 4})


def test_reductions_over_leading_axes_are_refused(tmp_path):
    path = save_model(tmp_path, "lead", [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=1)],
                      [("X", TP.FLOAT, ["R", "N"])], [("Y", TP.FLOAT, [1, "N"])], [const("axes", [0], np.int64)])
    plan = fuse(G.load_model(path, ["R=1:8", "N=1:64"]))
    with pytest.raises(UnsupportedOperatorError, match=r"group g\d+_reduce: ReduceSum node .*trailing axes"):
        generate_group(plan, plan.groups[0])


def test_unsupported_groups_name_the_group_and_the_op(tmp_path):
    gemm = save_model(tmp_path, "gemm", [helper.make_node("MatMul", ["X", "W"], ["Y"])],
                      [("X", TP.FLOAT, ["R", 4]), ("W", TP.FLOAT, [4, 5])], [("Y", TP.FLOAT, ["R", 5])])
    plan = fuse(G.load_model(gemm, ["R=1:8"]))
    with pytest.raises(UnsupportedOperatorError, match=r"^group g0_gemm: gemm groups are not generated here"):
        generate_group(plan, plan.groups[0])
    bn = save_model(tmp_path, "bn", [helper.make_node("BatchNormalization", ["X", "s", "b", "mu", "var"], ["Y"])],
                    [("X", TP.FLOAT, ["R", 3, 4])], [("Y", TP.FLOAT, ["R", 3, 4])],
                    [const(n, np.ones(3)) for n in ("s", "b", "mu", "var")])
    plan = fuse(G.load_model(bn, ["R=1:8"], simplify_graph=False))     # simplified, BN is Mul + Add
    with pytest.raises(UnsupportedOperatorError,
                       match=r"^group g0_elementwise: BatchNormalization node .* no C template"):
        generate_group(plan, plan.groups[0])


# ----------------------------------------------------------------------------- elementwise / injective
def test_gather_concat_views_where_cast(tmp_path):
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e1"], axis=0),                 # [B, L, 8]
        helper.make_node("Gather", ["table2", "ids"], ["e2"], axis=0),                # [B, L, 4]
        helper.make_node("Concat", ["e1", "e2"], ["c"], axis=2),                      # [B, L, 12]
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]),                  # [B, 12, L]
        helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),            # [B, 5, L]: rows 7..11
        helper.make_node("Less", ["s", "zero"], ["neg"]),
        helper.make_node("Mul", ["s", "two"], ["s2"]),
        helper.make_node("Greater", ["s", "zero"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=TP.FLOAT),
        helper.make_node("Where", ["neg", "s2", "posf"], ["Y"]),
        helper.make_node("Cast", ["s"], ["Yi"], to=TP.INT64),
    ]
    ins = [("ids", TP.INT64, ["B", "L"]), ("table", TP.FLOAT, [11, 8]), ("table2", TP.FLOAT, [11, 4])]
    outs = [("Y", TP.FLOAT, ["B", 5, "L"]), ("Yi", TP.INT64, ["B", 5, "L"])]
    inits = [const("starts", [-5], np.int64), const("ends", [1000], np.int64), const("axes", [1], np.int64),
             const("zero", 0.0), const("two", 2.0)]
    path = save_model(tmp_path, "injective", nodes, ins, outs, inits)
    cp = CompiledPlan(path, ["B=1:8", "L=1:1024"])
    rng = np.random.default_rng(5)
    for b, l in [(1, 1), (3, 7), (2, 13), (1, 97), (2, 513)]:
        inputs = {"ids": rng.integers(-11, 11, size=(b, l)).astype(np.int64),
                  "table": (rng.standard_normal((11, 8)) * 3).astype(np.float32),
                  "table2": (rng.standard_normal((11, 4)) * 3).astype(np.float32)}
        check_against_ort(cp, inputs)


def test_gather_elements_and_gather_nd(tmp_path):
    nodes = [
        helper.make_node("GatherElements", ["D", "K"], ["ge"], axis=1),               # [B, 3]
        helper.make_node("GatherND", ["E", "P"], ["gn"], batch_dims=1),               # [B, 3, 4]
        helper.make_node("Unsqueeze", ["ge", "ax"], ["geu"]),                         # [B, 3, 1]
        helper.make_node("Mul", ["gn", "geu"], ["Y"]),
    ]
    ins = [("D", TP.FLOAT, ["B", "L"]), ("K", TP.INT64, ["B", 3]), ("E", TP.FLOAT, ["B", "L", 4]),
           ("P", TP.INT64, ["B", 3, 1])]
    path = save_model(tmp_path, "gathers", nodes, ins, [("Y", TP.FLOAT, ["B", 3, 4])], [const("ax", [2], np.int64)])
    cp = CompiledPlan(path, ["B=1:8", "L=1:1024"])
    rng = np.random.default_rng(7)
    for b, l in [(1, 1), (3, 7), (2, 13), (1, 97)]:
        inputs = {"D": rng.standard_normal((b, l)).astype(np.float32), "K": rng.integers(-l, l, (b, 3)),
                  "E": rng.standard_normal((b, l, 4)).astype(np.float32), "P": rng.integers(-l, l, (b, 3, 1))}
        check_against_ort(cp, inputs)


#: (op, attrs, inputs) over float inputs X, Y, Z, ints I, J, bools P, Q; scalar constants c*
ELEMENTWISE_CASES = [
    *[(op, {}, ["X"]) for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Floor", "Ceil", "Round",
                                 "Sign", "Sin", "Cos", "Atan", "Softplus", "Softsign", "IsNaN", "IsInf")],
    ("Log", {}, ["Xpos"]), ("Sqrt", {}, ["Xpos"]), ("Reciprocal", {}, ["Xpos"]), ("Tan", {}, ["Xsmall"]),
    ("Gelu", {}, ["X"]), ("Gelu", {"approximate": "tanh"}, ["X"]), ("LeakyRelu", {"alpha": 0.1}, ["X"]),
    ("Elu", {}, ["X"]), ("HardSigmoid", {}, ["X"]), ("Clip", {}, ["X", "cneg", "cpos"]),
    ("Clip", {}, ["X", "", "cpos"]),
    *[(op, {}, ["X"]) for op in ("HardSwish", "Selu", "Celu", "ThresholdedRelu", "Shrink", "Mish", "Sinh", "Cosh",
                                 "Asinh")],
    ("Selu", {"alpha": 1.5, "gamma": 2.0}, ["X"]), ("Celu", {"alpha": 0.7}, ["X"]),
    ("ThresholdedRelu", {"alpha": 0.3}, ["X"]), ("Shrink", {"lambd": 1.2, "bias": 0.4}, ["X"]),
    *[(op, {}, ["Xsmall"]) for op in ("Asin", "Acos", "Atanh")], ("Acosh", {}, ["Xpos1"]),
    *[(op, {}, ["X", "Y"]) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "LessOrEqual",
                                      "Greater", "GreaterOrEqual", "PRelu")],
    ("Pow", {}, ["X", "c2"]), ("Pow", {}, ["X", "c3"]), ("Pow", {}, ["Xpos", "chalf"]), ("Pow", {}, ["Xpos", "Y"]),
    ("Mod", {"fmod": 1}, ["X", "Y"]), ("Max", {}, ["X", "Y", "Z"]), ("Min", {}, ["X", "Y", "Z"]),
    ("Sum", {}, ["X", "Y", "Z"]), ("Mean", {}, ["X", "Y", "Z"]), ("Where", {}, ["P", "X", "Y"]),
    *[(op, {}, ["I", "J"]) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Greater")],
    ("Mod", {}, ["I", "J"]), ("Abs", {}, ["I"]), ("Neg", {}, ["I"]),
    *[(op, {}, ["I", "J"]) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")], ("BitwiseNot", {}, ["I"]),
    *[(op, {}, ["P", "Q"]) for op in ("And", "Or", "Xor")], ("Not", {}, ["P"]),
    ("Cast", {"to": TP.FLOAT}, ["I"]), ("Cast", {"to": TP.INT64}, ["X"]), ("Cast", {"to": TP.BOOL}, ["X"]),
    ("Cast", {"to": TP.FLOAT}, ["P"]), ("Cast", {"to": TP.INT32}, ["I"]), ("CastLike", {}, ["I", "X"]),
    ("Identity", {}, ["X"]),
]
FLOATS, INTS, BOOLS = ("X", "Y", "Z", "Xpos", "Xsmall", "Xpos1"), ("I", "J"), ("P", "Q")
SCALARS = {"cneg": -0.5, "cpos": 0.5, "c2": 2.0, "c3": 3.0, "chalf": 0.5}


def _elementwise_inputs(n, rng, specials=False):
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    if specials:
        x[: min(n, 6)] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.5], np.float32)[: min(n, 6)]
    return {"X": x, "Y": (rng.standard_normal(n) * 2 + 0.1).astype(np.float32),
            "Z": rng.standard_normal(n).astype(np.float32),
            "Xpos": (np.abs(rng.standard_normal(n)) * 3 + 0.01).astype(np.float32),
            "Xsmall": rng.uniform(-1.4, 1.4, n).astype(np.float32),
            "Xpos1": (np.abs(rng.standard_normal(n)) * 3 + 1).astype(np.float32),
            "I": rng.integers(-50, 50, n).astype(np.int64),
            "J": np.where(rng.random(n) < 0.5, -1, 1) * rng.integers(1, 9, n).astype(np.int64),
            "P": rng.random(n) < 0.5, "Q": rng.random(n) < 0.5}


def test_every_elementwise_c_template(tmp_path):
    """One model with one node per case; its groups merged into one kernel (one compile),
    compared with the numpy references (special values included) and with onnxruntime."""
    types = {**{k: TP.FLOAT for k in FLOATS}, **{k: TP.INT64 for k in INTS}, **{k: TP.BOOL for k in BOOLS}}
    nodes, outs = [], []
    for k, (op, attrs, args) in enumerate(ELEMENTWISE_CASES):
        name = f"o{k}_{op}"
        nodes.append(helper.make_node(op, args, [name], **attrs))
        outs.append((name, TP.UNDEFINED, None))
    inputs = [(n, t, ["N"]) for n, t in types.items()]
    inits = [const(n, v) for n, v in SCALARS.items()]
    graph = helper.make_graph(nodes, "ew", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_empty_tensor_value_info(o[0]) for o in outs], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend([v for v in model.graph.value_info if v.name in {o[0] for o in outs}])
    path = tmp_path / "ew.onnx"
    onnx.save(model, path)
    plan = fuse(G.load_model(path, ["N=1:1024"]))
    groups = [g for g in plan.groups if g.kind == "elementwise"]
    merged = Group("gall_elementwise", "elementwise", [n for g in groups for n in g.nodes],
                   sorted({i for g in groups for i in g.inputs}), {k: v for g in groups for k, v in g.outputs.items()})
    kernel = CompiledGroup.build(plan, merged)
    rng = np.random.default_rng(6)
    for n, specials in [(13, True), (97, False), (1, False)]:
        feeds = _elementwise_inputs(n, rng, specials)
        binding = bind_symbols(plan.graph, feeds)
        env = group_env(plan, merged, dict(feeds), binding)
        got = kernel.run(env, binding)
        want = evaluate_group(plan, merged, env, binding)
        for name in want:
            if specials and name.endswith("_Cast") and want[name].dtype.kind in "iu":
                continue  # float -> int of NaN/inf is undefined (C and numpy disagree)
            close(got[name], want[name], f"{name} at N={n} vs numpy")
        if not specials:
            for name, ref in ort_outputs(path, feeds).items():
                close(got[name], ref, f"{name} at N={n} vs onnxruntime")


# ----------------------------------------------------------------------------- real models
MODELS = [pytest.param(f, e, None, id=f"{f}-{e}") for f in ("bert", "albert", "roberta", "distilbert", "gpt2", "vit")
          for e in ("dynamo", "torchscript")]
MODELS += [pytest.param(f, "torchscript", 14, id=f"{f}-torchscript-opset14") for f in ("bert", "gpt2")]


@pytest.mark.models
@pytest.mark.parametrize("family,exporter,opset", MODELS)
def test_model_groups_match_the_interpreter(exported_model, record_property, family, exporter, opset):
    """Every elementwise/reduce group generate_group supports, compiled and run on the inputs the
    interpreter gives it, at sequence 1 and a prime (ViT: one patch and a prime image size)."""
    plan, ranges = model_plan(exported_model, family, exporter, opset)
    kernels, refused = {}, {}
    for g in plan.groups:
        if g.kind not in ("elementwise", "reduce"):
            continue
        try:
            kernels[g.name] = CompiledGroup.build(plan, g)
        except UnsupportedOperatorError as exc:
            refused[g.name] = str(exc)
    for binding, g, genv, bound, want in interpreted_groups(plan, family, ranges):
        if g.name in kernels:
            got = kernels[g.name].run(genv, bound)
            for name in want:
                close(got[name], want[name], f"{g.name}:{name} at {binding}")
    candidates = [g for g in plan.groups if g.kind in ("elementwise", "reduce")]
    others = Counter(g.kind for g in plan.groups if g.kind not in ("elementwise", "reduce"))
    summary = (f"{family}-{exporter}{'-opset' + str(opset) if opset else ''}: {len(kernels)}/{len(candidates)} "
               f"elementwise/reduce groups compiled; refused: {refused or '-'}; not generated here: "
               f"{', '.join(f'{n} {k}' for k, n in sorted(others.items())) or '-'}")
    record_property("coverage", summary)
    print(summary)
    # every reduction group of these transformers is a trailing-axis row reduction
    assert all(g.name in kernels for g in candidates if g.kind == "reduce"), refused
    assert len(kernels) >= len(candidates) - len(refused) and kernels


def test_group_sizes_come_from_compiled_expressions_and_a_missing_symbol_is_named(tmp_path):
    """A group kernel's argument sizes at a new shape are evaluated by compiled integer expressions
    (no SymPy per call), read from the inputs where the binding lacks a symbol, memoized per
    binding; a symbol neither gives is an ExecutionError naming it."""
    path = save_model(tmp_path, "relu", [helper.make_node("Relu", ["X"], ["Y"])],
                      [("X", TP.FLOAT, ["rows", "cols"])], [("Y", TP.FLOAT, ["rows", "cols"])])
    cp = CompiledPlan(path, ["rows=1:8", "cols=1:64"])
    (kernel,) = cp.kernels.values()
    x = np.arange(-15, 20, dtype=np.float32).reshape(5, 7)
    np.testing.assert_array_equal(kernel.run({"X": x}, {})["Y"], np.maximum(x, 0))   # rows, cols from X's shape
    np.testing.assert_array_equal(kernel.run({"X": x[:2, :3]}, {"rows": 2, "cols": 3})["Y"], np.maximum(x[:2, :3], 0))
    assert kernel._sizes_at({}, {"rows": 2, "cols": 3}) == kernel._sizes_at({"X": x[:2, :3]}, {"rows": 2, "cols": 3})
    with pytest.raises(ExecutionError, match=r"no value for shape symbol cols, rows"):
        kernel._sizes_at({}, {})


# ----------------------------------------------------------------------------- pixel shuffle views
@pytest.mark.parametrize("op,mode", [("DepthToSpace", "DCR"), ("DepthToSpace", "CRD"), ("SpaceToDepth", "DCR")])
def test_depth_space_rearrangements_are_views_fused_into_the_next_kernel(tmp_path, op, mode):
    """Pixel shuffle / unshuffle (DepthToSpace, SpaceToDepth) at dynamic H, W: the rearrangement is
    the reading kernel's index map (one elementwise group, no copy, no numpy), onnxruntime's values
    at sides 2..24, odd and prime ones included (SpaceToDepth: even sides, whole blocks)."""
    attrs = {"blocksize": 2} | ({"mode": mode} if op == "DepthToSpace" else {})
    path = save_model(tmp_path, f"{op}_{mode}".lower(), [
        helper.make_node(op, ["X"], ["s"], **attrs),
        helper.make_node("Relu", ["s"], ["Y"]),
    ], [("X", TP.FLOAT, ["N", 8, "H", "W"])], [("Y", TP.FLOAT, ["N", "c_out", "h_out", "w_out"])], opset=13)
    cp = CompiledPlan(path, ["N=1:3", "H=2:24", "W=2:24"])
    assert len(cp.plan.groups) == 1 and not cp.unsupported
    rng = np.random.default_rng(4)
    sides = [(2, 2), (24, 6), (10, 24)] if op == "SpaceToDepth" else [(2, 2), (23, 5), (7, 24), (13, 17)]
    for k, (h, w) in enumerate(sides):
        check_against_ort(cp, {"X": rng.standard_normal((1 + k % 3, 8, h, w)).astype(np.float32)})


def test_an_odd_side_that_space_to_depth_cannot_block_is_refused_by_name(tmp_path):
    from tscomp.compiler import compile_model
    from tscomp.errors import ShapeError
    from tscomp.runtime import Runtime
    path = save_model(tmp_path, "s2d", [helper.make_node("SpaceToDepth", ["X"], ["Y"], blocksize=2)],
                      [("X", TP.FLOAT, ["N", 4, "H", "W"])], [("Y", TP.FLOAT, ["N", 16, "h_out", "w_out"])], opset=13)
    rt = Runtime.from_compiled(compile_model(str(path), ["N=1:2", "H=2:16", "W=2:16"], max_variants=1))
    assert rt.run({"X": np.ones((1, 4, 6, 4), np.float32)})["Y"].shape == (1, 16, 3, 2)
    with pytest.raises(ShapeError, match="H must be a multiple of the blocksize 2"):
        rt.run({"X": np.ones((1, 4, 7, 4), np.float32)})
