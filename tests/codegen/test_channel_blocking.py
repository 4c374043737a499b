"""Channel-blocked activations between convolutions (tscomp/codegen/channel_blocking.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_gemm import ISA_RANK
from tscomp.codegen.cpu_conv import from_channel_blocks, to_channel_blocks
from tscomp.codegen.tile_config import VECTOR_WIDTH
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact
from tscomp.schedule.target import host_cpu

from tests.codegen.onnxruntime_check import assert_matches_onnxruntime

#: (label, N, H, W): 1, primes, the range ends
SIZES = [("1x1", 1, 1, 1), ("primes", 2, 7, 13), ("wide", 1, 13, 41), ("ends", 3, 41, 2), ("square", 1, 16, 16)]


def _inverted_residual(path, *, cin=16, hidden=64, stride=1, extra_output=False, residual=True, blocks=1,
                       kernel=(3, 3), pads=(1, 1, 1, 1), dilations=(1, 1)):
    """MobileNetV2's block: 1x1 expand + Clip, depthwise 3x3 + Clip, 1x1 project (+ the block's
    input), ``blocks`` of them in a row (the first with ``stride``)."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("lo", TP.FLOAT, [], [0.0]), helper.make_tensor("hi", TP.FLOAT, [], [6.0])]

    def w(*shape):
        inits.append(helper.make_tensor(f"w{len(inits)}", TP.FLOAT, shape,
                                        (rng.standard_normal(shape) * 0.3).astype(np.float32).ravel()))
        return inits[-1].name
    nodes, x = [], "x"
    for b in range(blocks):
        s = stride if b == 0 else 1
        nodes += [helper.make_node("Conv", [x, w(hidden, cin, 1, 1), w(hidden)], [f"e{b}"], kernel_shape=[1, 1]),
                  helper.make_node("Clip", [f"e{b}", "lo", "hi"], [f"ea{b}"]),
                  helper.make_node("Conv", [f"ea{b}", w(hidden, 1, *kernel), w(hidden)], [f"d{b}"],
                                   kernel_shape=list(kernel), pads=list(pads), strides=[s, s],
                                   dilations=list(dilations), group=hidden),
                  helper.make_node("Clip", [f"d{b}", "lo", "hi"], [f"da{b}"]),
                  helper.make_node("Conv", [f"da{b}", w(cin, hidden, 1, 1), w(cin)], [f"p{b}"], kernel_shape=[1, 1])]
        out = f"p{b}"
        if residual and s == 1:
            nodes.append(helper.make_node("Add", [out, x], [f"y{b}"]))
            out = f"y{b}"
        x = out
    outputs = [helper.make_tensor_value_info(x, TP.FLOAT, None)]
    if extra_output:          # the first depthwise result is also a model output: it must stay NCHW
        outputs.append(helper.make_tensor_value_info("da0", TP.FLOAT, None))
    xin = helper.make_tensor_value_info("x", TP.FLOAT, ["N", cin, "H", "W"])
    m = helper.make_model(helper.make_graph(nodes, "ir", [xin], outputs, inits),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(m, str(path))
    return path


def _compile(path, target=None):
    return compile_model(str(path), ["N=1:3", "H=1:41", "W=1:41"], max_variants=2, target=target)


def _feeds(cin):
    rng = np.random.default_rng(1)
    for label, n, h, w in SIZES:
        yield label, {"x": rng.standard_normal((n, cin, h, w)).astype(np.float32)}


def _blocked_groups(model) -> dict[str, tuple[int, int]]:
    out = {}
    for name, ks in model.kernels.items():
        a = getattr(ks[0], "analysis", None)
        if a is not None and (getattr(a, "x_lanes", 0) or getattr(a, "y_lanes", 0)):
            out[name] = (a.x_lanes, a.y_lanes)
    return out


def _need_vectors():
    if VECTOR_WIDTH.get(host_isa(), 1) < 8:
        pytest.skip(f"no channel blocks on {host_isa()}")


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("executor", ["native", "python"])
def test_an_inverted_residual_block_stores_its_inner_tensors_blocked_and_matches_onnxruntime(tmp_path, stride, executor):
    _need_vectors()
    path = _inverted_residual(tmp_path / "ir.onnx", stride=stride)
    model = _compile(path)
    L = VECTOR_WIDTH[host_isa()]
    # expand -> depthwise -> project: two blocked tensors, the block's input and output stay NCHW
    assert sorted(_blocked_groups(model).values()) == [(0, L), (L, 0), (L, L)]
    assert any("channel-blocked activations: 2 tensor(s)" in n for n in model.notes)
    for ks in model.kernels.values():
        for k in ks:
            if k.family == "conv-depthwise":
                assert k.cfg is not None and k.cfg.lanes == L        # the channel-blocked strategy only
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2, executor=executor), path, _feeds(16))



@pytest.mark.parametrize("executor", ["native", "python"])
def test_a_blocked_tensor_read_as_x_and_as_a_residual_by_one_conv_matches_onnxruntime(tmp_path, executor):
    _need_vectors()
    rng = np.random.default_rng(4)

    def t(name, *shape):
        return helper.make_tensor(name, TP.FLOAT, shape, (rng.standard_normal(shape) * 0.3).astype(np.float32).ravel())
    # x -> 1x1 expand -> depthwise -> da; y = Conv1x1(da) + da (da: the Conv's X and its epilogue's residual)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["e", "w1", "b1"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=32),
             helper.make_node("Relu", ["d"], ["da"]),
             helper.make_node("Conv", ["da", "w2", "b2"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["p", "da"], ["y"])]
    inits = [t("w0", 32, 16, 1, 1), t("b0", 32), t("w1", 32, 1, 3, 3), t("b1", 32), t("w2", 32, 32, 1, 1), t("b2", 32)]
    g = helper.make_graph(nodes, "xr", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 16, "H", "W"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "xr.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    model = _compile(path)
    assert any("channel-blocked activations: 2 tensor(s)" in n for n in model.notes)
    readers = [ks[0] for ks in model.kernels.values() if getattr(ks[0], "analysis", None) is not None
               and ks[0].analysis.blocked_operands]
    assert len(readers) == 1 and readers[0].analysis.x_lanes and "_rb" in readers[0].func
    assert "channel-blocked operand" in readers[0].source
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2, executor=executor), path, _feeds(16))


def test_tensors_between_implicit_gemm_convs_stay_nchw(tmp_path):
    _need_vectors()
    # two chained inverted residual blocks: the stream between them is written by a 1x1 and read by a
    # 1x1 and an Add -- no depthwise on either side, nothing saved by blocking it
    path = _inverted_residual(tmp_path / "two.onnx", blocks=2)
    model = _compile(path)
    assert any("channel-blocked activations: 4 tensor(s)" in n for n in model.notes)
    assert not any(ks[0].analysis.blocked_operands for ks in model.kernels.values()
                   if getattr(ks[0], "analysis", None) is not None)
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, _feeds(16))


@pytest.mark.parametrize("kernel,pads,stride,dilations", [
    ((5, 3), (2, 0, 3, 2), 2, (1, 2)),          # asymmetric pads, dilated columns, stride 2
    ((7, 7), (3, 3, 3, 3), 1, (1, 1)),          # more taps than registers, a wide border
    ((3, 3), (0, 0, 0, 0), 1, (1, 1)),          # no padding: no border positions at all
])
def test_a_blocked_depthwise_reads_its_input_in_place_with_any_window(tmp_path, kernel, pads, stride, dilations):
    _need_vectors()
    path = _inverted_residual(tmp_path / "w.onnx", kernel=kernel, pads=pads, stride=stride, dilations=dilations,
                              residual=False)
    model = compile_model(str(path), ["N=1:3", "H=9:41", "W=9:41"], max_variants=2)
    dw = [k for ks in model.kernels.values() for k in ks if k.family == "conv-depthwise"]
    assert dw and all(k.analysis.x_lanes and "ts_border_position" in k.source for k in dw)
    rng = np.random.default_rng(2)
    feeds = ((f"{n}x{h}x{w}", {"x": rng.standard_normal((n, 16, h, w)).astype(np.float32)})
             for n, h, w in [(1, 9, 9), (2, 11, 13), (1, 41, 9), (3, 17, 41)])
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, feeds)


def test_one_dimensional_convolutions_are_blocked_too(tmp_path):
    _need_vectors()
    rng = np.random.default_rng(3)

    def t(name, *shape):
        return helper.make_tensor(name, TP.FLOAT, shape, (rng.standard_normal(shape) * 0.3).astype(np.float32).ravel())
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["e"], kernel_shape=[1]),
             helper.make_node("Relu", ["e"], ["ea"]),
             helper.make_node("Conv", ["ea", "w1", "b1"], ["d"], kernel_shape=[5], pads=[2, 1], group=32),
             helper.make_node("Conv", ["d", "w2", "b2"], ["y"], kernel_shape=[1])]
    inits = [t("w0", 32, 16, 1), t("b0", 32), t("w1", 32, 1, 5), t("b1", 32), t("w2", 16, 32, 1), t("b2", 16)]
    g = helper.make_graph(nodes, "c1d", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 16, "L"])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "c1d.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    model = compile_model(str(path), ["N=1:3", "L=4:97"], max_variants=2)
    assert any("channel-blocked activations: 2 tensor(s)" in n for n in model.notes)
    feeds = ((f"{n}x{length}", {"x": rng.standard_normal((n, 16, length)).astype(np.float32)})
             for n, length in [(1, 4), (2, 13), (3, 97), (1, 64)])
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, feeds)


def _each_form_matches_nchw(path, configs) -> set:
    """Every Conv group of ``path`` (channel-blocked by the layout pass) under each tile config,
    against the NCHW kernel of the same config, at 1, primes and the range ends; returns the forms
    seen: (input read "in place" / "gathered", vector axis, x lanes, y lanes, whether a channel-major
    tile's epilogue ran in place before its blocked store)."""
    from tscomp.codegen.channel_blocking import block_conv_chains
    from tscomp.codegen.cpu_conv import CompiledConv
    from tscomp.codegen.families import link_native
    from tscomp.compiler import choose_families
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse
    from tscomp.schedule.samples import group_inputs_at
    from tscomp.schedule.schedules import TuningOptions, schedule_plan

    def families():
        return choose_families(fuse(load_model(str(path), ["N=1:3", "H=1:41", "W=1:41"])))
    target = host_cpu(2)
    _, nchw = families()           # analyses of their own: the layout pass changes the ones it is given
    plain = {(name, i): link_native(CompiledConv(c.analysis, cfg, host_isa()))
             for name, c in nchw.items() if c.family.name == "conv" for i, cfg in enumerate(configs)}
    plan, choices = families()
    assert block_conv_chains(plan, choices, schedule_plan(plan, choices, target, TuningOptions(tune=False)), target)
    rng = np.random.default_rng(5)
    sym = {i.name.rstrip("_"): i.name for i in plan.graph.symbols.live_symbols()}    # N is N_ in the plan
    seen = set()
    for (name, i), ref in plain.items():
        a = choices[name].analysis
        k = link_native(CompiledConv(a, configs[i], host_isa()))
        seen.add(("in place" if "read in place" in k.source else "gathered", configs[i].vector_axis,
                  a.x_lanes, a.y_lanes, "conv_epilogue_in_place(tile" in k.source))
        for n, h, w in ((1, 1, 1), (2, 13, 7), (3, 41, 41)):
            binding = {sym["N"]: n, sym["H"]: h, sym["W"]: w}
            env = group_inputs_at(plan, choices[name].group, binding, rng)
            want = ref.run(env, binding)
            for out, arr in k.run(env, binding).items():
                np.testing.assert_allclose(arr, want[out], rtol=1e-4, atol=1e-4, err_msg=f"{k.func} {binding}")
    return seen


def test_every_tile_form_of_a_blocked_1x1_computes_the_same(tmp_path):
    """The dispatch picks one variant per shape; each form must be right: row-vector tiles reading a
    blocked input in place and storing blocks as they are, column tiles gathering it by transposes
    and storing each finished tile through the in-place epilogue and a transpose -- against the NCHW
    kernel of the same configuration."""
    _need_vectors()
    from tscomp.codegen.cpu_conv import TileConfig
    L = VECTOR_WIDTH[host_isa()]
    path = _inverted_residual(tmp_path / "ir.onnx", cin=32, hidden=64)
    configs = [TileConfig(mr=2 * L, nr=4, mc=2 * L, nc=16, kc=64, vector_axis=0),
               TileConfig(mr=4, nr=2 * L, mc=16, nc=64, kc=64, vector_axis=1)]   # 8 accumulators on any ISA
    seen = _each_form_matches_nchw(path, configs)
    # the projection reads blocks (in place, gathered), the expansion writes them (row and column tiles)
    assert {("in place", 0, L, 0, False), ("gathered", 1, L, 0, False), ("gathered", 0, 0, L, False),
            ("gathered", 1, 0, L, True)} <= seen


def _silu_expand(path, *, hidden=48, blocked_residual=False):
    """x -> 1x1 expand (bias, SiLU, times a per-channel constant, plus ``r``) -> depthwise 3x3 -> y:
    the expand's output is stored channel-blocked. ``r`` is a model input (NCHW), or with
    ``blocked_residual`` the block's own blocked tensor: x -> expand0 -> dw0 -> d, then
    r = d, the expand reading d as X and as its residual."""
    rng = np.random.default_rng(7)

    def t(name, *shape):
        return helper.make_tensor(name, TP.FLOAT, shape, (rng.standard_normal(shape) * 0.5).astype(np.float32).ravel())
    inits = [t("we", hidden, hidden if blocked_residual else 16, 1, 1), t("be", hidden), t("scale", hidden, 1, 1),
             t("wd", hidden, 1, 3, 3), t("bd", hidden)]
    nodes, inputs, x, r = [], [helper.make_tensor_value_info("x", TP.FLOAT, ["N", 16, "H", "W"])], "x", "r"
    if blocked_residual:
        inits += [t("w0", hidden, 16, 1, 1), t("b0", hidden), t("w1", hidden, 1, 3, 3), t("b1", hidden)]
        nodes += [helper.make_node("Conv", ["x", "w0", "b0"], ["e0"], kernel_shape=[1, 1]),
                  helper.make_node("Conv", ["e0", "w1", "b1"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                   group=hidden)]
        x = r = "d"
    else:
        inputs.append(helper.make_tensor_value_info("r", TP.FLOAT, ["N", hidden, "H", "W"]))
    nodes += [helper.make_node("Conv", [x, "we", "be"], ["e"], kernel_shape=[1, 1]),
              helper.make_node("Sigmoid", ["e"], ["s"]), helper.make_node("Mul", ["e", "s"], ["silu"]),
              helper.make_node("Mul", ["silu", "scale"], ["m"]), helper.make_node("Add", ["m", r], ["a"]),
              helper.make_node("Conv", ["a", "wd", "bd"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=hidden)]
    g = helper.make_graph(nodes, "silu", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_a_column_tile_runs_its_epilogue_in_place_unless_it_reads_a_blocked_operand(tmp_path):
    """A column-vector tile is channel-major: its fused math (SiLU, a per-channel constant, an NCHW
    residual) runs in place along the positions, whole vectors, then each run of channels within
    one block is transposed into the output -- 6-channel tiles start mid-block and cross blocks. An
    epilogue reading a channel-blocked residual keeps the blocked form (that read would be strided
    along the positions). Both against the NCHW kernel, and the model against onnxruntime."""
    _need_vectors()
    from tscomp.codegen.cpu_conv import TileConfig
    L = VECTOR_WIDTH[host_isa()]
    configs = [TileConfig(mr=6, nr=2 * L, mc=12, nc=64, kc=64, vector_axis=1),
               TileConfig(mr=L, nr=4, mc=L, nc=16, kc=64, vector_axis=0)]
    nchw_residual = _each_form_matches_nchw(_silu_expand(tmp_path / "silu.onnx"), configs)
    assert ("gathered", 1, 0, L, True) in nchw_residual
    blocked = _each_form_matches_nchw(_silu_expand(tmp_path / "silu_rb.onnx", blocked_residual=True), configs)
    # the expand reading d (X and residual): blocked form; the first expand (bias only): in place
    assert ("gathered", 1, L, L, False) in blocked and ("gathered", 1, L, L, True) not in blocked
    assert ("gathered", 1, 0, L, True) in blocked
    rng = np.random.default_rng(2)
    feeds = [(label, {"x": rng.standard_normal((n, 16, h, w)).astype(np.float32),
                      "r": rng.standard_normal((n, 48, h, w)).astype(np.float32)}) for label, n, h, w in SIZES]
    path = tmp_path / "silu.onnx"
    assert_matches_onnxruntime(Runtime.from_compiled(_compile(path), num_threads=2), path, feeds)


def test_avx2_blocks_of_eight_match_onnxruntime(tmp_path):
    if ISA_RANK[host_isa()] < ISA_RANK["avx2"]:
        pytest.skip(f"avx2 kernels do not run on {host_isa()}")
    path = _inverted_residual(tmp_path / "ir.onnx", cin=8, hidden=24)     # 24: whole blocks of 8, not of 16
    model = _compile(path, target=host_cpu(2, isa="avx2"))
    assert sorted(_blocked_groups(model).values()) == [(0, 8), (8, 0), (8, 8)]
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, _feeds(8))


def test_a_model_output_and_a_channel_count_off_the_blocks_stay_nchw(tmp_path):
    _need_vectors()
    L = VECTOR_WIDTH[host_isa()]
    # the depthwise result is a model output: only the expand -> depthwise tensor is blocked
    path = _inverted_residual(tmp_path / "out.onnx", extra_output=True)
    model = _compile(path)
    assert sorted(_blocked_groups(model).values()) == [(0, L), (L, 0)]
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, _feeds(16))
    # 20 hidden channels are not whole blocks of 8 or 16: nothing is blocked
    path = _inverted_residual(tmp_path / "odd.onnx", hidden=20)
    model = _compile(path)
    assert _blocked_groups(model) == {}
    assert not any("channel-blocked" in n for n in model.notes)
    assert_matches_onnxruntime(Runtime.from_compiled(model, num_threads=2), path, _feeds(16))


def test_an_artifact_round_trip_keeps_the_layouts(tmp_path):
    _need_vectors()
    path = _inverted_residual(tmp_path / "ir.onnx")
    model = _compile(path)
    rt = Runtime(write_artifact(model, tmp_path / "ir.tsc"), num_threads=2)
    assert _blocked_groups(model) == {g: (rt.model.kernels[g][0].analysis.x_lanes, rt.model.kernels[g][0].analysis.y_lanes)
                                      for g in _blocked_groups(model)}
    assert_matches_onnxruntime(rt, path, _feeds(16))


def test_channel_blocks_permute_the_elements_and_round_trip():
    x = np.arange(2 * 32 * 3 * 5, dtype=np.float32).reshape(2, 32, 3, 5)
    b = to_channel_blocks(x, 16)
    assert b.shape == x.shape
    n, c, h, w = 1, 21, 2, 3
    p = h * 5 + w
    assert b.reshape(-1)[((n * 2 + c // 16) * 15 + p) * 16 + c % 16] == x[n, c, h, w]
    np.testing.assert_array_equal(from_channel_blocks(b, 16), x)
