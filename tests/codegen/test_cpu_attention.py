"""The attention family (:mod:`tscomp.codegen.cpu_attention`): QKᵀ, mask, softmax and P·V in one
kernel, checked against onnxruntime on a hand-built attention at awkward sizes (fully masked rows,
head widths that are not a vector multiple, every candidate tiling), against the Plan interpreter
on every tiny model family, and the refusals that send a chain back to its parts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.build import host_isa
from tscomp.codegen.cpu_attention import AttentionAnalysis, CompiledAttention, compile_attention_group, link
from tscomp.codegen.tile_config import VECTOR_WIDTH, TileConfig
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion import fuse
from tscomp.graph.reference import bind_symbols, materialize
from tests.codegen.plan_runs import check_against_interpreter, close, model_plan

H = 3


def attention_model(tmp_path, dk: int, dv: int, *, guard: bool = True, p_op: str | None = None,
                    probs_out: bool = False, name: str = "att"):
    """q [b, M, H, dk], k [b, N, H, dk], v [b, N, H, dv], mask [b, 1, M, N] (additive) ->
    softmax(q·kᵀ / sqrt(dk) + mask) · v as [b, H, M, dv]; ``guard``: the exporters'
    Where(IsNaN(p), 0, p) on the probabilities; ``p_op``: another op on them (Mul by 2 / Sqrt);
    ``probs_out``: the probabilities are a graph output too."""
    scale = helper.make_tensor("scale", TP.FLOAT, [], [1.0 / np.sqrt(dk)])
    zero = helper.make_tensor("zero", TP.FLOAT, [], [0.0])
    two = helper.make_tensor("two", TP.FLOAT, [], [2.0])
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qt", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s1"]),
             helper.make_node("Add", ["s1", "mask"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p0"], axis=-1)]
    p = "p0"
    if guard:
        nodes += [helper.make_node("IsNaN", [p], ["nan"]), helper.make_node("Where", ["nan", "zero", p], ["p1"])]
        p = "p1"
    if p_op == "mul2":
        nodes.append(helper.make_node("Mul", [p, "two"], ["p2"]))
        p = "p2"
    elif p_op == "sqrt":
        nodes.append(helper.make_node("Sqrt", [p], ["p2"]))
        p = "p2"
    nodes.append(helper.make_node("MatMul", [p, "vt"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, ["b", H, "M", dv])]
    if probs_out:
        outputs.append(helper.make_tensor_value_info("p0", TP.FLOAT, ["b", H, "M", "N"]))
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("q", TP.FLOAT, ["b", "M", H, dk]),
         helper.make_tensor_value_info("k", TP.FLOAT, ["b", "N", H, dk]),
         helper.make_tensor_value_info("v", TP.FLOAT, ["b", "N", H, dv]),
         helper.make_tensor_value_info("mask", TP.FLOAT, ["b", 1, "M", "N"])],
        outputs, initializer=[scale, zero, two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


DIMS = ["b=1:3", "M=1:600", "N=1:600"]

def window_attention_model(tmp_path, heads: int = 2, keys: int = 16, dk: int = 8):
    """Swin's window attention: q, k, v [w, heads, keys, dk] with a static key count and a learned
    [heads, keys, keys] bias -> softmax(q·kᵀ + bias) · v. (path, numpy reference of q, k, v)."""
    bias = np.random.default_rng(3).standard_normal((heads, keys, keys)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
         helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "bias"], ["sb"]),
         helper.make_node("Softmax", ["sb"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])],
        "windows", [helper.make_tensor_value_info(n, TP.FLOAT, ["w", heads, keys, dk]) for n in "qkv"],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["w", heads, keys, dk])],
        initializer=[helper.make_tensor("bias", TP.FLOAT, bias.shape, bias.reshape(-1))])
    path = tmp_path / "windows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)

    def reference(q, k, v):
        s = q @ k.transpose(0, 1, 3, 2) + bias
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ v
    return path, reference


def test_window_attention_with_a_static_key_count_compiles_fused(tmp_path):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    path, reference = window_attention_model(tmp_path)
    model = compile_model(str(path), ["w=1:64"], max_variants=1)
    assert not model.fallback_groups()
    assert [ks[0].family for ks in model.kernels.values()] == ["attention"]
    rt = Runtime.from_compiled(model, num_threads=2)
    rng = np.random.default_rng(4)
    for w in (1, 7, 64):
        feeds = {n: rng.standard_normal((w, 2, 16, 8)).astype(np.float32) for n in "qkv"}
        np.testing.assert_allclose(rt.run(feeds)["y"], reference(**feeds), rtol=1e-4, atol=1e-4)


def plan_of(path):
    return fuse(G.load_model(path, DIMS))


def feeds_at(b, M, N, dk, dv, rng, *, dead_rows=(), dead_keys=()):
    """Random q, k, v; a mask of zeros with -inf at every key of ``dead_rows`` (fully masked query
    rows) and at the keys ``dead_keys`` of every row (padding)."""
    mask = np.zeros((b, 1, M, N), np.float32)
    for r in dead_rows:
        if r < M:
            mask[:, :, r, :] = -np.inf
    for c in dead_keys:
        if c < N:
            mask[..., c] = -np.inf
    return {"q": rng.standard_normal((b, M, H, dk)).astype(np.float32),
            "k": rng.standard_normal((b, N, H, dk)).astype(np.float32),
            "v": rng.standard_normal((b, N, H, dv)).astype(np.float32), "mask": mask}


def run_group(plan, kernel, feeds):
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in kernel.group.inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    return kernel.run(env, bound)


def ort_run(path, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def the_attention_group(plan):
    groups = [g for g in plan.groups if g.kind == "attention"]
    assert len(groups) == 1, plan.describe()
    return groups[0]


#: (M, N): 1, primes, vector and block edges, and both sides of the key block
SIZES = [(1, 1), (7, 13), (13, 97), (97, 7), (64, 64), (65, 130), (200, 33), (1, 511)]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    path = attention_model(tmp_path_factory.mktemp("att"), 24, 40)
    plan = plan_of(path)
    return path, plan, compile_attention_group(plan, the_attention_group(plan), isa=host_isa())


@pytest.mark.parametrize("M,N", SIZES)
def test_fused_attention_matches_onnxruntime_with_head_widths_off_the_vector_width(guarded, M, N):
    path, plan, kernel = guarded
    feeds = feeds_at(2, M, N, 24, 40, np.random.default_rng(M * 1000 + N), dead_keys=(0, N - 1) if N > 2 else ())
    close(run_group(plan, kernel, feeds)["y"], ort_run(path, feeds)[0], f"M={M} N={N}")


def test_fully_masked_rows_give_zero_under_the_nan_guard(guarded):
    """ONNX's Softmax of an all -inf row is NaN; the guard turns it into 0, so the row's P·V is 0."""
    path, plan, kernel = guarded
    feeds = feeds_at(2, 70, 90, 24, 40, np.random.default_rng(1), dead_rows=(0, 5, 69))
    got, want = run_group(plan, kernel, feeds)["y"], ort_run(path, feeds)[0]
    assert np.all(want[:, :, [0, 5, 69]] == 0)
    close(got, want, "dead rows")


def test_fully_masked_rows_stay_nan_without_the_guard(tmp_path):
    path = attention_model(tmp_path, 16, 16, guard=False)
    plan = plan_of(path)
    kernel = compile_attention_group(plan, the_attention_group(plan), isa=host_isa())
    assert np.isnan(kernel.masked_value)
    feeds = feeds_at(1, 9, 20, 16, 16, np.random.default_rng(2), dead_rows=(3,))
    got, want = run_group(plan, kernel, feeds)["y"], ort_run(path, feeds)[0]
    assert np.isnan(want[:, :, 3]).all() and np.isnan(got[:, :, 3]).all()
    close(got, want, "no guard")


def test_every_candidate_tiling_is_correct(guarded):
    path, plan, _ = guarded
    a = AttentionAnalysis(plan, the_attention_group(plan))
    cfgs = a.heuristic_configs(host_isa(), 8)
    assert len({c.nr for c in cfgs}) >= 2, cfgs            # several key-block widths
    feeds = feeds_at(3, 101, 150, 24, 40, np.random.default_rng(3), dead_rows=(7,), dead_keys=(149,))
    want = ort_run(path, feeds)[0]
    for cfg in cfgs:
        kernel = link(CompiledAttention(a, cfg, host_isa()))
        close(run_group(plan, kernel, feeds)["y"], want, cfg.slug())


def test_softmax_chunks_narrower_than_the_keys_carry_the_online_correction_across_chunks(guarded):
    """T_Nc below N: the per-row maximum, sum and output are corrected from chunk to chunk, a chunk
    whose keys are all masked adds nothing, and a partial last chunk pads its keys to P = 0."""
    path, plan, _ = guarded
    a = AttentionAnalysis(plan, the_attention_group(plan))
    W = VECTOR_WIDTH[host_isa()]
    feeds = feeds_at(2, 45, 150, 24, 40, np.random.default_rng(9), dead_rows=(4,), dead_keys=range(0, 40))
    want = ort_run(path, feeds)[0]
    for nr, blocks in [(W, 1), (2 * W, 1), (W, 2), (2 * W, 3), (W, 16)]:
        cfg = TileConfig(mr=2, nr=nr, mc=8, nc=nr * blocks, kc=24)   # 2 x 4 accumulators: fits AVX2 too
        kernel = link(CompiledAttention(a, cfg, host_isa()))
        assert f"T_Nc = {nr * blocks} keys" in kernel.source
        close(run_group(plan, kernel, feeds)["y"], want, cfg.slug())


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_every_isa_the_host_runs_computes_the_same_attention(guarded, isa):
    from tscomp.codegen.cpu_gemm import ISA_RANK
    if ISA_RANK[isa] > ISA_RANK[host_isa()]:
        pytest.skip(f"this host has {host_isa()}, not {isa}")
    path, plan, _ = guarded
    a = AttentionAnalysis(plan, the_attention_group(plan))
    feeds = feeds_at(2, 37, 70, 24, 40, np.random.default_rng(6), dead_rows=(3,))
    want = ort_run(path, feeds)[0]
    for cfg in a.heuristic_configs(isa, 3):
        close(run_group(plan, link(CompiledAttention(a, cfg, isa)), feeds)["y"], want, f"{isa} {cfg.slug()}")


def test_generated_source_names_its_tiles_and_fused_ops(guarded):
    _, _, kernel = guarded
    head = kernel.source.split("*/")[0]
    assert "Softmax" in head and "-> Mul, Add -> Softmax" in head and f"T_Mb = {kernel.cfg.mc}" in head


@pytest.mark.parametrize("p_op", ["mul2", "sqrt"])
def test_ops_that_change_probabilities_are_refused_and_the_chain_runs_as_its_parts(tmp_path, p_op):
    from tscomp.compiler import compile_plan
    from tscomp.runtime import Runtime
    from tscomp.runtime.artifact import write_artifact

    path = attention_model(tmp_path, 16, 16, p_op=p_op)
    plan = plan_of(path)
    group = the_attention_group(plan)
    with pytest.raises(UnsupportedOperatorError, match=f"group {group.name}: the ops between the Softmax and P·V"):
        AttentionAnalysis(plan, group)
    model = compile_plan(plan)
    assert not any(g.kind == "attention" for g in model.plan.groups)
    assert {g.name for g in group.parts} <= {g.name for g in model.plan.groups}
    assert model.fallback_groups() == [], model.fallback_groups()
    write_artifact(model, tmp_path / "m.tsc")
    feeds = feeds_at(2, 11, 17, 16, 16, np.random.default_rng(4))
    close(Runtime(tmp_path / "m.tsc").run(feeds)["y"], ort_run(path, feeds)[0], p_op)


def test_a_compiled_model_runs_the_fused_kernel_through_the_artifact(tmp_path):
    from tscomp.compiler import compile_plan
    from tscomp.runtime import Runtime
    from tscomp.runtime.artifact import write_artifact

    path = attention_model(tmp_path, 32, 32)
    model = compile_plan(plan_of(path))
    fams = {ks[0].family for ks in model.kernels.values()}
    assert fams == {"attention"}, fams
    write_artifact(model, tmp_path / "m.tsc")
    rt = Runtime(tmp_path / "m.tsc")
    rng = np.random.default_rng(5)
    for M, N in [(1, 1), (17, 3), (130, 257)]:
        feeds = feeds_at(3, M, N, 32, 32, rng, dead_rows=(0,))
        close(rt.run(feeds)["y"], ort_run(path, feeds)[0], f"M={M} N={N}")


FAMILIES = ("bert", "albert", "roberta", "distilbert", "gpt2", "vit", "llama")
MODELS = [pytest.param(f, e, id=f"{f}-{e}") for f in FAMILIES for e in ("dynamo", "torchscript")
          if not (f == "llama" and e == "torchscript")]


@pytest.mark.models
@pytest.mark.parametrize("family,exporter", MODELS)
def test_every_tiny_model_fuses_its_attention_and_matches_the_interpreter(exported_model, family, exporter):
    plan, ranges = model_plan(exported_model, family, exporter)
    groups = [g for g in plan.groups if g.kind == "attention"]
    assert groups, plan.describe()
    kernels = {g.name: compile_attention_group(plan, g, isa=host_isa()) for g in groups}
    assert check_against_interpreter(plan, family, ranges, kernels) == 2 * len(kernels)


@pytest.mark.parametrize("fill", [-np.inf, np.finfo(np.float32).min], ids=["-inf", "finfo.min"])
@pytest.mark.parametrize("M,N", [(1, 1), (13, 13), (97, 97), (200, 200), (7, 130)])
def test_a_causal_mask_skips_the_masked_key_tail_and_matches_onnxruntime(guarded, fill, M, N):
    """Keys past every row's last visible key are skipped (no QKᵀ, no P·V); a query row whose keys are
    all masked by a finite fill (softmax over equal masked scores: uniform) keeps every key."""
    path, plan, kernel = guarded
    assert "masked key tail" in kernel.source
    rng = np.random.default_rng(M * 7 + N)
    feeds = feeds_at(2, M, N, 24, 40, rng)
    i, j = np.arange(M)[:, None], np.arange(N)[None, :]
    feeds["mask"][:] = np.where(j > i + (N - M), fill, 0.0).astype(np.float32)
    if M > 3:
        feeds["mask"][1, :, 2, :] = fill                 # one fully masked row in the second entry
    want = ort_run(path, feeds)[0]
    a = AttentionAnalysis(plan, the_attention_group(plan))
    W = VECTOR_WIDTH[host_isa()]
    for cfg in [kernel.cfg, TileConfig(mr=2, nr=W, mc=8, nc=2 * W, kc=24)]:
        k = link(CompiledAttention(a, cfg, host_isa()))
        close(run_group(plan, k, feeds)["y"], want, cfg.slug())


@pytest.mark.parametrize("what,index", [("k", 2), ("v", 5), ("k", -1)])
@pytest.mark.parametrize("guard", [False, True], ids=["no-guard", "nan-guard"])
def test_a_nan_key_or_value_behind_a_causal_mask_gives_what_onnxruntime_gives(tmp_path, guard, what, index):
    """A NaN key (or value) behind a causal mask: onnxruntime's NaN + -inf and 0 * NaN reach every
    query row of that batch entry (NaN without the exporters' guard; the guard zeroes NaN
    probabilities, not a NaN value's products). The kernel then does not skip the masked tail and
    gives the same NaNs and numbers (a random Helium gave a padding token's zero embedding inf
    through an RMSNorm without epsilon); the finite entry keeps its skip and its numbers."""
    path = attention_model(tmp_path, 24, 40, guard=guard)
    plan = plan_of(path)
    kernel = compile_attention_group(plan, the_attention_group(plan), isa=host_isa())
    M = N = 13
    feeds = feeds_at(2, M, N, 24, 40, np.random.default_rng(5))
    i, j = np.arange(M)[:, None], np.arange(N)[None, :]
    feeds["mask"][:] = np.where(j > i, -np.inf, 0.0).astype(np.float32)
    feeds[what][0, index % N, 0, 3] = np.nan
    want, got = ort_run(path, feeds)[0], run_group(plan, kernel, feeds)["y"]
    if not guard:       # every query row of the entry reached (a NaN key: whole rows; a NaN value: its column)
        assert np.isnan(want[0, 0]).any(axis=-1).all() and not np.isnan(want[1]).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    close(np.nan_to_num(got), np.nan_to_num(want), "NaN where onnxruntime has NaN, its numbers elsewhere")


def _has_amx() -> bool:
    from tscomp.schedule.target import host_cpu
    return host_isa() == "avx512" and host_cpu().spec.amx


@pytest.mark.skipif(not _has_amx(), reason="this CPU has no AMX bf16 tiles (or the OS does not grant them)")
@pytest.mark.parametrize("dk,dv", [(24, 40), (64, 64), (128, 96)])   # 96: two chunks of O tiles
def test_amx_attention_matches_onnxruntime_to_bf16_accuracy(tmp_path, dk, dv):
    """bf16 mode on AMX: Q, K, V and P rounded to bf16, QKᵀ and P·V on the tiles, the softmax in fp32.
    Every heuristic tiling and two chunked ones (T_Nc below N: the online correction across chunks),
    at awkward sizes with masked keys and a fully masked row (NaN where onnxruntime has NaN, or 0
    under the guard): cosine >= 0.9999 and the largest error <= 1% of the largest output (measured:
    cosine >= 0.999993, largest error 0.2-0.9%)."""
    path = attention_model(tmp_path, dk, dv, name=f"amx{dk}")
    plan = plan_of(path)
    a = AttentionAnalysis(plan, the_attention_group(plan))
    cfgs = a.heuristic_configs("amx", 8)
    assert cfgs and {c.mr for c in cfgs} == {16} and {c.nr for c in cfgs} == {32, 64}
    cfgs += [TileConfig(mr=16, nr=32, mc=16, nc=32, kc=dk), TileConfig(mr=16, nr=64, mc=32, nc=128, kc=dk)]
    kernels = [link(CompiledAttention(a, cfg, "amx")) for cfg in cfgs]
    assert "_tile_dpbf16ps" in kernels[0].source
    for M, N in SIZES + [(101, 150)]:
        feeds = feeds_at(2, M, N, dk, dv, np.random.default_rng(M * 1000 + N), dead_rows=(3,) if M > 3 else (),
                         dead_keys=(0, N - 1) if N > 2 else ())
        want = ort_run(path, feeds)[0]
        for k in kernels:
            got = run_group(plan, k, feeds)["y"]
            assert np.array_equal(np.isnan(got), np.isnan(want)), (M, N, k.cfg.slug())
            g, w = got[~np.isnan(want)].astype(np.float64), want[~np.isnan(want)].astype(np.float64)
            cos = (g @ w) / (np.linalg.norm(g) * np.linalg.norm(w))
            assert cos >= 0.9999 and np.abs(g - w).max() <= 1e-2 * np.abs(w).max(), (M, N, k.cfg.slug(), cos)


def test_amx_attention_is_refused_where_the_cpu_has_no_tiles(guarded, monkeypatch):
    """Generating the AMX kernel is pure (any host); building it where the tiles are missing raises a
    clear error naming the group."""
    from tscomp.codegen import cpu_gemm
    _, plan, _ = guarded
    a = AttentionAnalysis(plan, the_attention_group(plan))
    kernel = CompiledAttention(a, a.heuristic_configs("amx", 1)[0], "amx")
    assert "_tile_loadd" in kernel.source and "amx_configure" in kernel.source

    def no_amx(isa):
        raise cpu_gemm.GemmError("ISA amx requested but this CPU has no AMX bf16 tiles")
    monkeypatch.setattr(cpu_gemm, "check_host_isa", no_amx)
    with pytest.raises(UnsupportedOperatorError, match="no AMX bf16 tiles"):
        link(kernel)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_softmax_row_exponential_matches_exp_and_keeps_zero_and_nan(isa, tmp_path):
    """``ts_exp_row`` (the intrinsic range reduction and polynomial of the AVX2 and AVX-512 kernels):
    e^(s - m) within 5e-7 relative, 0 below -87 and for masked (-inf) keys, NaN kept, the sum returned."""
    import ctypes

    from tscomp.codegen.build import build_library, load_library
    from tscomp.codegen.cpu_attention import _exp_row
    from tscomp.codegen.cpu_gemm import ISA_RANK
    if ISA_RANK[isa] > ISA_RANK[host_isa()]:
        pytest.skip(f"this host has {host_isa()}, not {isa}")
    src = "#include <stdint.h>\n#include <immintrin.h>\n" + _exp_row(isa) + \
        "float row(float* s, float m, int64_t n) { return ts_exp_row(s, m, n); }\n"
    fn = load_library(build_library(src, f"exp_row_{isa}", out_dir=tmp_path)).row
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_float, ctypes.c_int64]
    rng = np.random.default_rng(3)
    x = np.concatenate([-rng.exponential(8.0, 200), [0.0, -1e-7, -86.9, -87.0, -87.1, -100.0, -np.inf] * 4, [-0.5] * 4])
    x = x[: len(x) // 16 * 16].astype(np.float32)
    m = np.float32(1.5)
    s = (x + m).astype(np.float32)
    total = fn(s.ctypes.data, m, s.size)
    d = (x + m).astype(np.float32) - m                       # the kernel's argument, in fp32
    want = np.where(d < -87, 0.0, np.exp(d.astype(np.float64)))
    np.testing.assert_allclose(s, want, rtol=5e-7, atol=0)
    assert total == pytest.approx(want.sum(), rel=1e-6)
    nan = np.full(16, np.nan, np.float32)
    assert np.isnan(fn(nan.ctypes.data, 0.0, nan.size)) and np.isnan(nan).all()
