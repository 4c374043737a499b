"""Dynamic padding to a multiple of the window size (Swin-style window attention, issue 11).

Exporters compute the pad amounts of a window-attention block as shape arithmetic,
``Shape -> Gather -> Mod -> Sub -> Mod -> Concat -> Pad``, then reshape the padded image into
``[1, C, Hp/7, 7, Wp/7, 7]`` windows and finally Slice the padding off. TSCompiler §4.1's symbolic
propagation must carry those amounts exactly (``(7 - H % 7) % 7 == 7*ceiling(H/7) - H``) so that
every value resolves over ``H`` and ``W``; a model whose shapes stay unresolved is refused at
compile time with one line naming the value, the node and the op.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import sympy
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import load_model, require_resolved_shapes, unresolved_values
from tscomp.graph.reference import run_reference
from tscomp.graph.resolution import UnresolvedShapeError
from tscomp.graph.symbols import SymbolTable

C, WINDOW, MAX_SIDE = 4, 7, 64
DIMS = [f"H=1:{MAX_SIDE}", f"W=1:{MAX_SIDE}"]
# 1, primes, multiples of the window, one past a multiple, and the range ends
SIDES = [(1, 1), (1, 64), (64, 1), (2, 3), (7, 7), (13, 29), (14, 8), (49, 50), (61, 63), (64, 64)]


def _i64(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def window_attention_model(path) -> None:
    """Pad H and W up to a multiple of 7 (amounts as exporters emit them), window-partition, a
    per-window channel MatMul, window-reverse, crop."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "two"], ["h"], axis=0),
        n("Gather", ["shape", "three"], ["w"], axis=0),
    ]
    for side in ("h", "w"):  # pad = (7 - side % 7) % 7; padded = side + pad; windows = padded / 7
        nodes += [n("Mod", [side, "seven"], [f"{side}_mod"]),
                  n("Sub", ["seven", f"{side}_mod"], [f"{side}_rest"]),
                  n("Mod", [f"{side}_rest", "seven"], [f"{side}_pad"]),
                  n("Add", [side, f"{side}_pad"], [f"{side}_padded"]),
                  n("Div", [f"{side}_padded", "seven"], [f"{side}_windows"]),
                  n("Mul", [f"{side}_windows", "seven"], [f"{side}_full"]),
                  n("Unsqueeze", [f"{side}_pad", "zero_axis"], [f"{side}_pad1"]),
                  n("Unsqueeze", [f"{side}_windows", "zero_axis"], [f"{side}_windows1"]),
                  n("Unsqueeze", [f"{side}_full", "zero_axis"], [f"{side}_full1"]),
                  n("Unsqueeze", [side, "zero_axis"], [f"{side}1"])]
    nodes += [
        n("Concat", ["zeros6", "h_pad1", "w_pad1"], ["pads"], axis=0),
        n("Pad", ["x", "pads", "pad_value"], ["padded"], mode="constant"),
        n("Concat", ["one", "c", "h_windows1", "seven1", "w_windows1", "seven1"], ["win_shape"], axis=0),
        n("Reshape", ["padded", "win_shape"], ["windows"]),
        n("Transpose", ["windows"], ["windows_t"], perm=[0, 2, 4, 3, 5, 1]),
        n("Reshape", ["windows_t", "tokens_shape"], ["tokens"]),
        n("MatMul", ["tokens", "weight"], ["mixed"]),
        n("Concat", ["one", "h_windows1", "w_windows1", "seven1", "seven1", "c"], ["back_shape"], axis=0),
        n("Reshape", ["mixed", "back_shape"], ["back"]),
        n("Transpose", ["back"], ["back_t"], perm=[0, 5, 1, 3, 2, 4]),
        n("Concat", ["one", "c", "h_full1", "w_full1"], ["image_shape"], axis=0),
        n("Reshape", ["back_t", "image_shape"], ["image"]),
        n("Concat", ["h1", "w1"], ["ends"], axis=0),
        n("Slice", ["image", "zeros2", "ends", "axes23"], ["y"]),
    ]
    inits = [_i64("two", 2), _i64("three", 3), _i64("seven", WINDOW), _i64("zero_axis", [0]),
             _i64("zeros6", [0] * 6), _i64("one", [1]), _i64("c", [C]), _i64("seven1", [WINDOW]),
             _i64("tokens_shape", [-1, WINDOW * WINDOW, C]), _i64("zeros2", [0, 0]), _i64("axes23", [2, 3]),
             numpy_helper.from_array(np.zeros((), np.float32), "pad_value"),
             numpy_helper.from_array(rng.standard_normal((C, C)).astype(np.float32), "weight")]
    graph = helper.make_graph(
        nodes, "window_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, "H", "W"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def window_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("window") / "window_attention.onnx"
    window_attention_model(path)
    return path


def _inputs(h: int, w: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(h * 100 + w).standard_normal((1, C, h, w)).astype(np.float32)}


# ------------------------------------------------------------------ symbolic integer arithmetic
def test_pad_amount_to_a_window_multiple_is_exact_with_range_zero_to_six():
    table = SymbolTable()
    h = table.new_symbol("H", origin="user", min=1, max=MAX_SIDE)
    pad = table.canon(sympy.Mod(WINDOW - sympy.Mod(h, WINDOW), WINDOW))
    assert pad == WINDOW * sympy.ceiling(h / WINDOW) - h
    assert table.bounds(pad) == (0, WINDOW - 1)
    assert table.canon(h + pad) == WINDOW * sympy.ceiling(h / WINDOW)
    assert table.canon(sympy.floor((h + pad) / WINDOW)) == sympy.ceiling(h / WINDOW)
    for v in range(1, MAX_SIDE + 1):
        assert table.evaluate(pad, {"H": v}) == (WINDOW - v % WINDOW) % WINDOW


def test_mod_of_a_side_has_range_below_the_divisor_and_vanishes_when_the_range_is_smaller():
    table = SymbolTable()
    h = table.new_symbol("H", origin="user", min=1, max=MAX_SIDE)
    small = table.new_symbol("small", origin="user", min=1, max=6)
    assert table.bounds(sympy.Mod(h, WINDOW)) == (0, WINDOW - 1)
    assert table.bounds(h - WINDOW * sympy.floor(h / WINDOW)) == (0, WINDOW - 1)
    assert table.canon(sympy.Mod(small, WINDOW)) == small
    assert table.canon(sympy.Mod(h, WINDOW)) == sympy.Mod(h, WINDOW)


# ------------------------------------------------------------------ the window-attention model
def test_window_padding_model_resolves_every_shape(window_model):
    graph = load_model(window_model, DIMS)
    assert unresolved_values(graph) == []
    require_resolved_shapes(graph)
    h, w = (graph.symbols.symbol(s) for s in ("H", "W"))
    assert graph.values["padded"].shape[2:] == (WINDOW * sympy.ceiling(h / WINDOW),
                                               WINDOW * sympy.ceiling(w / WINDOW))
    assert graph.values["tokens"].shape[0] == sympy.ceiling(h / WINDOW) * sympy.ceiling(w / WINDOW)
    assert graph.values["y"].shape == (1, C, h, w)


def test_window_padding_model_inspect_json_reports_zero_unresolved(window_model):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tscomp.cli", "inspect", str(window_model),
                          "--dim", DIMS[0], "--dim", DIMS[1], "--json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["unresolved"] == []


@pytest.mark.parametrize("h,w", SIDES)
def test_window_padding_reference_matches_onnxruntime(window_model, h, w):
    graph = load_model(window_model, DIMS)
    sess = ort.InferenceSession(str(window_model), providers=["CPUExecutionProvider"])
    feeds = _inputs(h, w)
    (want,) = sess.run(None, feeds)
    got = run_reference(graph, feeds)["y"]
    assert got.shape == want.shape == (1, C, h, w)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_window_padding_model_compiles_and_runs_like_onnxruntime(window_model):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    rt = Runtime.from_compiled(compile_model(str(window_model), DIMS, max_variants=1), num_threads=1)
    sess = ort.InferenceSession(str(window_model), providers=["CPUExecutionProvider"])
    for h, w in SIDES:
        feeds = _inputs(h, w)
        (want,) = sess.run(None, feeds)
        got = rt.run(feeds)["y"]
        assert got.shape == want.shape, (h, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"H={h} W={w}")


# ------------------------------------------------------------------ refusing unresolved shapes
def _data_dependent_reshape_model(path) -> None:
    """Reshape's target comes from an int64 input tensor: no input dim binds the output's dims."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "target"], ["r"], name="reshape_by_data"),
         helper.make_node("Relu", ["r"], ["y"], name="relu")],
        "data_dependent_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_unresolved_shape_is_refused_at_compile_time_naming_value_node_and_op(tmp_path):
    from tscomp.compiler import compile_model

    path = tmp_path / "data_dependent_reshape.onnx"
    _data_dependent_reshape_model(path)
    with pytest.raises(UnresolvedShapeError) as info:
        compile_model(str(path), ["n=1:64"])
    msg = str(info.value)
    assert "\n" not in msg
    assert "'r'" in msg and "Reshape" in msg and "'reshape_by_data'" in msg


def test_unresolved_shape_is_a_one_line_cli_error(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "data_dependent_reshape.onnx"
    _data_dependent_reshape_model(path)
    proc = subprocess.run([sys.executable, "-m", "tscomp.cli", "compile", str(path), "--dim", "n=1:64",
                           "-o", str(tmp_path / "out.tsc")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert "reshape_by_data" in proc.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------ a real Swin (transformers)
SWIN_DIMS = ["batch=1:8", "height=8:224", "width=8:224"]
# 8 (one 2x2-patch stage-2 map), primes, multiples of 4*7, the range end, non-square
SWIN_SIDES = [(8, 8), (29, 101), (56, 56), (60, 92), (97, 13), (224, 224)]


@pytest.fixture(scope="module")
def swin_model(tmp_path_factory):
    """A tiny random-weight Swin (two stages, window 7, patch 4) exported by the TorchScript exporter
    with dynamic batch, height and width. (The dynamo exporter also exports it and tscomp resolves and
    matches that file too, but the export takes ~70 s here: too slow for the suite.)"""
    pytest.importorskip("transformers")
    import torch
    import transformers

    config = transformers.SwinConfig(image_size=56, patch_size=4, embed_dim=16, depths=[1, 1],
                                     num_heads=[2, 2], window_size=7)
    torch.manual_seed(0)
    model = transformers.SwinModel(config, add_pooling_layer=False).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).last_hidden_state

    path = tmp_path_factory.mktemp("swin") / "swin-tiny-torchscript.onnx"
    import warnings
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHiddenState().eval(), (torch.randn(2, 3, 60, 92),), str(path), dynamo=False,
                          input_names=["pixel_values"], output_names=["last_hidden_state"], opset_version=17,
                          dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"}})
    return path


@pytest.fixture(scope="module")
def swin_graph(swin_model):
    return load_model(swin_model, SWIN_DIMS)


@pytest.mark.models
def test_swin_pads_through_mod_and_resolves_every_shape(swin_model, swin_graph):
    ops = {n.op_type for n in onnx.load(str(swin_model)).graph.node}
    assert {"Mod", "Pad"} <= ops
    assert unresolved_values(swin_graph) == []


def _swin_feeds(h: int, w: int) -> dict[str, np.ndarray]:
    return {"pixel_values": np.random.default_rng(h * w).standard_normal((1, 3, h, w)).astype(np.float32)}


@pytest.mark.models
def test_swin_reference_matches_onnxruntime_at_awkward_sides(swin_model, swin_graph):
    sess = ort.InferenceSession(str(swin_model), providers=["CPUExecutionProvider"])
    for h, w in SWIN_SIDES:
        (want,) = sess.run(None, _swin_feeds(h, w))
        got = run_reference(swin_graph, _swin_feeds(h, w))["last_hidden_state"]
        assert got.shape == want.shape, (h, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"H={h} W={w}")


@pytest.mark.models
@pytest.mark.base  # opt-in with the slow checks: compiling Swin's ~30 groups takes ~60 s on 2 cores (the
#                    window model above covers the compile path in the default suite)
def test_compiled_swin_matches_onnxruntime_at_awkward_sides(swin_model):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    rt = Runtime.from_compiled(compile_model(str(swin_model), SWIN_DIMS, max_variants=1), num_threads=1)
    sess = ort.InferenceSession(str(swin_model), providers=["CPUExecutionProvider"])
    for h, w in SWIN_SIDES:
        (want,) = sess.run(None, _swin_feeds(h, w))
        got = rt.run(_swin_feeds(h, w))["last_hidden_state"]
        assert got.shape == want.shape, (h, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"H={h} W={w}")


# ------------------------------------------------------------------ integer Mod / Div data rules
def test_shape_arithmetic_mod_and_div_keep_onnx_integer_semantics_for_every_sign(tmp_path):
    """Mod (fmod=0 takes the divisor's sign, fmod=1 the dividend's) and Div (truncates toward zero, also
    of a numerator whose sign the range does not decide: 20 - n over n = 1..40) on shape values stay
    symbolic and agree with onnxruntime at every binding."""
    n = helper.make_node
    nodes = [n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "zero"], ["s"], axis=0),
             n("Neg", ["s"], ["neg"]),
             n("Mod", ["s", "seven"], ["mod7"]), n("Mod", ["s", "minus3"], ["mod_m3"]),
             n("Mod", ["neg", "seven"], ["neg_mod7"]), n("Mod", ["s", "five"], ["fmod5"], fmod=1),
             n("Div", ["neg", "four"], ["neg_div4"]), n("Div", ["s", "four"], ["div4"]),
             n("Sub", ["twenty", "s"], ["mixed"]), n("Div", ["mixed", "three"], ["mixed_div3"])]
    outs = ["mod7", "mod_m3", "neg_mod7", "fmod5", "neg_div4", "div4", "mixed_div3"]
    graph = helper.make_graph(
        nodes, "shape_arithmetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(o, TensorProto.INT64, []) for o in outs],
        [_i64("zero", 0), _i64("seven", 7), _i64("minus3", -3), _i64("five", 5), _i64("four", 4),
         _i64("twenty", 20), _i64("three", 3)])
    path = tmp_path / "shape_arithmetic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    loaded = load_model(path, ["n=1:40"], simplify_graph=False)
    symbolic = {o: loaded.values[o].symdata for o in outs}
    assert all(v is not None for v in symbolic.values()), symbolic
    assert loaded.symbols.bounds(symbolic["mod7"][()]) == (0, 6)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for value in range(1, 41):
        want = dict(zip(outs, sess.run(outs, {"x": np.zeros(value, np.float32)})))
        for o in outs:
            assert loaded.symbols.evaluate(symbolic[o][()], {"n": value}) == int(want[o]), (o, value)


def traced_same_padding_model(path, both_ends: bool) -> None:
    """A TorchScript-traced "same" padding (BiT's DynamicPad2d): the pads ``(13 - n) / 2`` (and, with
    ``both_ends``, ``(13 - n) - (13 - n) / 2``) were computed from the traced size, so they pad inputs
    shorter than 13 and crop (negative pads) longer ones, through Shape -> Sub -> Div -> Concat ->
    Pad; a Softmax over the padded axis and an Add follow. With both ends the padded length is 13
    whatever n; with the leading pad alone it is ``n + trunc((13 - n) / 2)``, a Piecewise length."""
    n = helper.make_node
    end = ["end1"] if both_ends else ["zero1"]
    nodes = [n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "two"], ["side"], axis=0),
             n("Sub", ["thirteen", "side"], ["total"]), n("Div", ["total", "two"], ["begin"]),
             n("Sub", ["total", "begin"], ["end"]),
             n("Unsqueeze", ["begin", "axis0"], ["begin1"]), n("Unsqueeze", ["end", "axis0"], ["end1"]),
             n("Concat", ["zeros2", "begin1", "zeros2", *end], ["pads"], axis=0),
             n("Pad", ["x", "pads", "pad_value"], ["padded"]),
             n("Softmax", ["padded"], ["soft"], axis=-1), n("Add", ["soft", "padded"], ["y"])]
    inits = [_i64("two", 2), _i64("thirteen", 13), _i64("axis0", [0]), _i64("zeros2", [0, 0]), _i64("zero1", [0]),
             numpy_helper.from_array(np.array(0.5, np.float32), "pad_value")]
    graph = helper.make_graph(nodes, "traced_same_padding",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


@pytest.mark.parametrize("both_ends", [True, False], ids=["both-ends", "leading-only"])
def test_traced_same_padding_pads_short_inputs_and_crops_long_ones_like_onnxruntime(tmp_path, both_ends):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    path = tmp_path / "traced_same_padding.onnx"
    traced_same_padding_model(path, both_ends)
    model = compile_model(str(path), ["n=1:40"], max_variants=1)
    padded = model.plan.graph.values["padded"].shape[2]
    assert (padded == 13) if both_ends else padded.has(sympy.Piecewise)
    rt = Runtime.from_compiled(model, num_threads=1)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for side in (1, 2, 11, 12, 13, 14, 15, 29, 40):
        x = {"x": np.random.default_rng(side).standard_normal((1, 2, side)).astype(np.float32)}
        (want,) = sess.run(None, x)
        got = rt.run(x)["y"]
        assert got.shape == want.shape, side
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"n={side}")
