"""Fused gemm groups (constant-weight MatMul/Gemm + elementwise epilogue) compiled to the CPU
macro-kernel (:mod:`tscomp.codegen.cpu_gemm_group`), checked against the Plan interpreter on the
tiny exported models and against onnxruntime on a hand-built MatMul + bias + Relu + residual."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import tscomp.graph as G
from tscomp.codegen.cpu_gemm_group import compile_gemm_group, candidate_configs_for
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion import fuse
from tscomp.graph.reference import bind_symbols, materialize
from tests.codegen.plan_runs import check_against_interpreter, compile_gemm_groups, close, model_plan


#: why a gemm group may legitimately be refused here (another kernel family handles it)
OUT_OF_SCOPE = ("B operand is not a constant weight (a batched GEMM with two activation operands)",
                "backbone Conv is not a MatMul/Gemm")

MODELS = [pytest.param(f, e, None, id=f"{f}-{e}")
          for f in ("bert", "albert", "roberta", "distilbert", "gpt2", "vit") for e in ("dynamo", "torchscript")]
# old-opset torchscript exports decompose LayerNorm; the first GEMM then gets the LayerNorm tail
# (Div, Mul, Add) as a prologue computing its A operand
MODELS += [pytest.param(f, "torchscript", 14, id=f"{f}-torchscript-opset14") for f in ("albert", "gpt2", "vit")]


@pytest.mark.models
@pytest.mark.parametrize("family,exporter,opset", MODELS)
def test_model_gemm_groups_match_the_interpreter(exported_model, record_property, family, exporter, opset):
    plan, ranges = model_plan(exported_model, family, exporter, opset)
    kernels, refused = compile_gemm_groups(plan, compile_gemm_group)
    check_against_interpreter(plan, family, ranges, kernels)
    summary = (f"{family}-{exporter}{f'-opset{opset}' if opset else ''}: {len(kernels)}/{len(kernels) + len(refused)} gemm groups compiled "
               f"({', '.join(kernels)}); refused: " + ("; ".join(refused.values()) or "-"))
    record_property("gemm_coverage", summary)
    print(summary)
    assert kernels, summary
    # every constant-weight GEMM group compiles; only out-of-scope groups are refused
    for name, why in refused.items():
        assert any(reason in why for reason in OUT_OF_SCOPE), f"{name} refused in scope: {why}"
    by_name = {g.name: g for g in plan.groups}
    row_groups = [n for n in kernels if kernels[n].has_row_pass]
    assert len(row_groups) >= 4, f"LayerNorm-epilogue groups not fused: {summary}"
    for n in row_groups:
        assert "row_pass(Y, m0, mv" in kernels[n].source
    if family == "bert":
        epis = {n: [o.op_type for o in by_name[n].prologue_epilogue()[2]] for n in kernels}
        widths = {n: int(list(by_name[n].outputs.values())[0].shape[-1]) for n in kernels}
        qkv = [n for n in kernels if widths[n] == 384 and epis[n] == ["Add"]]
        ffn_up = [n for n in kernels if widths[n] == 512 and "Add" in epis[n]
                  and any(op in ("Gelu", "Erf") for op in epis[n])]
        assert len(qkv) == 2, f"QKV (+bias) groups not accepted: {summary}"
        assert len(ffn_up) == 2, f"FFN-up (+bias+GELU) groups not accepted: {summary}"


def _save(tmp_path, K, N):
    rng = np.random.default_rng(1)
    W = rng.standard_normal((K, N)).astype(np.float32) / np.sqrt(K)
    b = rng.standard_normal(N).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["biased"]),
             helper.make_node("Relu", ["biased"], ["act"]),
             helper.make_node("Add", ["act", "res"], ["y"])]
    graph = helper.make_graph(
        nodes, "mm_bias_relu_res",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "S", K]),
         helper.make_tensor_value_info("res", TP.FLOAT, ["B", "S", N])],
        [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "S", N])],
        initializer=[helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
                     helper.make_tensor("b", TP.FLOAT, b.shape, b.tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / "mm.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("M", [1, 7, 13, 97, 513])
def test_matmul_bias_relu_residual_vs_onnxruntime(tmp_path, M):
    ort = pytest.importorskip("onnxruntime")
    K, N = 40, 72
    path = _save(tmp_path, K, N)
    plan = fuse(G.load_model(path, ["B=1:4", "S=1:1024"]))
    gemm = [g for g in plan.groups if g.kind == "gemm"]
    assert len(gemm) == 1 and len(plan.groups) == 1, plan.describe()
    kernel = compile_gemm_group(plan, gemm[0])
    rng = np.random.default_rng(M)
    B, S = (1, M)
    feeds = {"x": rng.standard_normal((B, S, K)).astype(np.float32),
             "res": rng.standard_normal((B, S, N)).astype(np.float32)}
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in gemm[0].inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    got = kernel.run(env, bound)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    close(got["y"], ref, f"M={M}")


def test_unsupported_groups_are_refused_with_the_group_name(tmp_path):
    # batched GEMM with two activation operands
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "bmm", [helper.make_tensor_value_info("a", TP.FLOAT, ["S", 8]),
                                             helper.make_tensor_value_info("b", TP.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["S", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "bmm.onnx"
    onnx.save(model, path)
    plan = fuse(G.load_model(path, ["S=1:64"]))
    g = next(g for g in plan.groups if g.kind == "gemm")
    with pytest.raises(UnsupportedOperatorError, match=rf"group {g.name}: .*not a constant weight"):
        compile_gemm_group(plan, g)


# ------------------------------------------------------------------ row-reduction (LayerNorm) epilogues
def _ln_model(tmp_path, K, N, variant):
    """MatMul + bias + residual, then LayerNormalization ("ln"), the same exporting the residual
    sum too ("ln_sum", GPT-2's residual stream), the decomposed LayerNorm of old torchscript
    exports ("decomposed": ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), or "ln"
    with a scale and shift on the A operand first ("prologue")."""
    rng = np.random.default_rng(2)
    W = rng.standard_normal((K, N)).astype(np.float32) / np.sqrt(K)
    b = rng.standard_normal(N).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(N)).astype(np.float32)
    inits = [helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
             helper.make_tensor("b", TP.FLOAT, b.shape, b.tolist()),
             helper.make_tensor("gamma", TP.FLOAT, gamma.shape, gamma.tolist()),
             helper.make_tensor("beta", TP.FLOAT, beta.shape, beta.tolist())]
    a = "x"
    if variant == "prologue":     # ConvNeXt-V2's GRN scale and shift on the A operand, a constant vector each
        inits += [helper.make_tensor("gx", TP.FLOAT, [K], (1 + 0.1 * rng.standard_normal(K)).astype(np.float32)),
                  helper.make_tensor("bx", TP.FLOAT, [K], (0.1 * rng.standard_normal(K)).astype(np.float32))]
        nodes = [helper.make_node("Mul", ["x", "gx"], ["xg"]), helper.make_node("Add", ["xg", "bx"], ["xa"])]
        a = "xa"
    else:
        nodes = []
    nodes += [helper.make_node("MatMul", [a, "W"], ["mm"]),
              helper.make_node("Add", ["mm", "b"], ["biased"]),
              helper.make_node("Add", ["biased", "res"], ["h"])]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT, ["B", "S", N])]
    if variant == "decomposed":
        inits += [helper.make_tensor("two", TP.FLOAT, [], [2.0]), helper.make_tensor("eps", TP.FLOAT, [], [1e-5])]
        nodes += [helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]),
                  helper.make_node("Sub", ["h", "mu"], ["hc"]),
                  helper.make_node("Pow", ["hc", "two"], ["hc2"]),
                  helper.make_node("ReduceMean", ["hc2"], ["var"], axes=[-1]),
                  helper.make_node("Add", ["var", "eps"], ["var_eps"]),
                  helper.make_node("Sqrt", ["var_eps"], ["std"]),
                  helper.make_node("Div", ["hc", "std"], ["nrm"]),
                  helper.make_node("Mul", ["nrm", "gamma"], ["scaled"]),
                  helper.make_node("Add", ["scaled", "beta"], ["y"])]
        opset = 17
    else:
        nodes.append(helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5))
        opset = 18
    if variant == "ln_sum":
        outputs.append(helper.make_tensor_value_info("h", TP.FLOAT, ["B", "S", N]))
    graph = helper.make_graph(
        nodes, f"mm_ln_{variant}",
        [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "S", K]),
         helper.make_tensor_value_info("res", TP.FLOAT, ["B", "S", N])], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    path = tmp_path / f"mm_ln_{variant}.onnx"
    onnx.save(model, path)
    return path


_LN_KERNELS: dict = {}


def _ln_kernel(tmp_path_factory, K, N, variant, cfg=None):
    key = (K, N, variant, cfg)
    if key not in _LN_KERNELS:
        path = _ln_model(tmp_path_factory.mktemp("ln"), K, N, variant)
        plan = fuse(G.load_model(path, ["B=1:4", "S=1:1024"]))
        gemm = [g for g in plan.groups if g.kind == "gemm"]
        assert len(gemm) == 1 and len(plan.groups) == 1, plan.describe()
        _LN_KERNELS[key] = (path, plan, gemm[0], compile_gemm_group(plan, gemm[0], cfg))
    return _LN_KERNELS[key]


def _run_vs_ort(path, plan, group, kernel, B, S, K, N):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(B * 1000 + S)
    feeds = {"x": rng.standard_normal((B, S, K)).astype(np.float32),
             "res": rng.standard_normal((B, S, N)).astype(np.float32)}
    bound = bind_symbols(plan.graph, feeds)
    env = dict(feeds)
    for name in group.inputs:
        if name not in env:
            env[name] = materialize(plan.graph, plan.graph.values[name], bound)
    got = kernel.run(env, bound)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for name, ref in zip(names, sess.run(None, feeds)):
        close(got[name], ref, f"{name} at B={B}, S={S}")


@pytest.mark.parametrize("M", [1, 7, 13, 97, 511, 512, 513])
def test_layernorm_epilogue_vs_onnxruntime(tmp_path_factory, M):
    K, N = 40, 72                       # N not a multiple of the register tile: padded columns
    path, plan, group, kernel = _ln_kernel(tmp_path_factory, K, N, "ln")
    assert kernel.has_row_pass and kernel.analysis.y_inplace and "row_pass(Y, m0, mv" in kernel.source
    _run_vs_ort(path, plan, group, kernel, 1, M, K, N)


@pytest.mark.parametrize("variant", ["ln_sum", "decomposed"])
@pytest.mark.parametrize("B,S", [(1, 1), (3, 13), (1, 513)])
def test_layernorm_epilogue_variants_vs_onnxruntime(tmp_path_factory, variant, B, S):
    K, N = 40, 72
    path, plan, group, kernel = _ln_kernel(tmp_path_factory, K, N, variant)
    assert kernel.has_row_pass and "row_pass(Y, m0, mv" in kernel.source
    if variant == "ln_sum":
        assert kernel.y_output == "h" and not kernel.analysis.y_inplace      # Y is the exported residual sum
    _run_vs_ort(path, plan, group, kernel, B, S, K, N)


def test_an_a_prologue_and_a_layernorm_row_pass_with_constant_vectors_compile_together(tmp_path):
    """Both generators put their constant arrays (GRN's scale and shift, LayerNorm's gamma and
    beta) at file scope: their names must not collide (ConvNeXt-V2 failed to compile)."""
    import onnxruntime as ort
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    path = _ln_model(tmp_path, 64, 48, "prologue")
    model = compile_model(str(path), ["B=1:3", "S=1:64"], max_variants=1)
    assert not model.fallback_groups()
    (gemm,) = [ks[0] for ks in model.kernels.values() if ks[0].family == "gemm"]
    assert "k_pro0" in gemm.source and "k_row0" in gemm.source
    rt = Runtime.from_compiled(model, num_threads=2)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for B, S in [(1, 1), (3, 13), (2, 64)]:
        feeds = {"x": rng.standard_normal((B, S, 64)).astype(np.float32),
                 "res": rng.standard_normal((B, S, 48)).astype(np.float32)}
        close(rt.run(feeds)["y"], sess.run(None, feeds)[0], f"B={B} S={S}")


def test_layernorm_epilogue_several_k_steps_and_configs(tmp_path_factory):
    """K = 600 takes several K steps (partial sums) before the row pass; every candidate config
    (whole rows per task, or N split with the row pass after the tiles) gives the same result."""
    K, N = 600, 200
    path, plan, group, kernel = _ln_kernel(tmp_path_factory, K, N, "ln")
    configs = candidate_configs_for(kernel)
    assert 2 <= len(configs) <= 4
    assert configs[0].nc >= -(-N // configs[0].nr) * configs[0].nr       # the default keeps whole rows
    for cfg in configs:
        k = compile_gemm_group(plan, group, cfg)
        for B, S in ((1, 1), (2, 37)):
            _run_vs_ort(path, plan, group, k, B, S, K, N)


def test_runtime_contract_pickle_bind_tasks_memo(tmp_path_factory):
    import ctypes
    import pickle
    K, N = 40, 72
    path, plan, group, kernel = _ln_kernel(tmp_path_factory, K, N, "ln")
    assert kernel.func in kernel.source and kernel.cfg is not None and kernel.fn is not None
    clone = pickle.loads(pickle.dumps(kernel))
    assert clone.fn is None and clone.packed is not None and clone.source == kernel.source
    from tscomp.codegen.build import build_library
    clone._bind_function(ctypes.CDLL(str(build_library(kernel.source, kernel.func))))
    assert clone.fn is not None
    _run_vs_ort(path, plan, group, clone, 2, 9, K, N)
    # tasks: ceil(M / T_Mb) x N blocks (one N block with a row pass) on one thread; on two, a single
    # row block has its N cut in two (whole panels)
    def bound(B, S):
        return bind_symbols(plan.graph, {"x": np.zeros((B, S, K), np.float32), "res": np.zeros((B, S, N), np.float32)})
    from tscomp.codegen.build import get_num_threads, set_num_threads
    before = get_num_threads()
    try:
        set_num_threads(1)
        assert clone.tasks(bound(2, 9)) == -(-18 // clone.cfg.mc)
        assert clone.tasks(bound(4, 1000)) == -(-4000 // clone.cfg.mc)
        set_num_threads(2)
        assert clone.geometry.n_nblocks == 1 and clone.geometry.NP // clone.geometry.NR >= 2
        assert clone.tasks(bound(1, 1)) == 2
    finally:
        set_num_threads(before)
    # a repeated binding evaluates no symbolic size again
    calls = []
    real = clone.symtab.evaluate
    clone.symtab.evaluate = lambda *a, **k: calls.append(a) or real(*a, **k)
    try:
        _run_vs_ort(path, plan, group, clone, 2, 9, K, N)
    finally:
        clone.symtab.evaluate = real
    assert not calls, calls
    # variants for a group without a row pass: N may be split across tasks
    plain_plan = fuse(G.load_model(_save(tmp_path_factory.mktemp("plain"), 768, 768), ["B=1:4", "S=1:1024"]))
    plain = compile_gemm_group(plain_plan, plain_plan.groups[0])
    cfgs = candidate_configs_for(plain)
    assert 3 <= len(cfgs) <= 4 and len(set(cfgs)) == len(cfgs)
    assert plain.tasks(bind_symbols(plain_plan.graph, {"x": np.zeros((1, 1, 768), np.float32),
                                                       "res": np.zeros((1, 1, 768), np.float32)})) >= 1


def test_a_constant_weight_read_through_views_is_prepacked_not_refused(tmp_path):
    """MatMul(x, Reshape(Transpose(W))) with W an initializer: the gemm family evaluates the views on
    the constant once (neither family may refuse it for the other's reason)."""
    import onnxruntime as ort

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 2, 8)).astype(np.float32)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[2, 1, 0]),
             helper.make_node("Reshape", ["wt", "shape"], ["w2"]),
             helper.make_node("MatMul", ["x", "w2"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["B", 3, 8])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, ["B", 3, 8])],
                          [helper.make_tensor("w", TP.FLOAT, w.shape, w.ravel()),
                           helper.make_tensor("shape", TP.INT64, (2,), [8, 8])])
    path = tmp_path / "viewed_weight.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    model = compile_model(str(path), ["B=1:9"])
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for B in (1, 4, 9):
        x = rng.standard_normal((B, 3, 8)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["z"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fill", [0.0, 0.75])
def test_a_constant_broadcast_as_the_a_operand_is_generated_into_the_scratch(tmp_path, fill):
    """MatMul(Reshape(Transpose(Expand(c, Shape(x)))), W) + x: the A operand is a constant broadcast
    through views (MRA multiplies an expanded zeros_like by its projection). The gemm family once
    refused it ("A operand is computed in the group") and the group ran on numpy; it computes A into
    its scratch as any prologue."""
    import onnxruntime as ort

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    rng = np.random.default_rng(1)
    w = rng.standard_normal((12, 12)).astype(np.float32)
    # Expand to [3, L, 4], transposed to [L, 3, 4], flattened to [L, 12]
    nodes = [helper.make_node("Shape", ["x"], ["l"], start=0, end=1),
             helper.make_node("Concat", ["three", "l", "four"], ["s"], axis=0),
             helper.make_node("Expand", ["c", "s"], ["filled"]),
             helper.make_node("Transpose", ["filled"], ["ft"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["ft", "flat"], ["a"]),
             helper.make_node("MatMul", ["a", "w"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["L", 12])],
                          [helper.make_tensor_value_info("z", TP.FLOAT, ["L", 12])],
                          [helper.make_tensor("w", TP.FLOAT, w.shape, w.ravel()),
                           helper.make_tensor("c", TP.FLOAT, (), [fill]),
                           helper.make_tensor("three", TP.INT64, (1,), [3]),
                           helper.make_tensor("four", TP.INT64, (1,), [4]),
                           helper.make_tensor("flat", TP.INT64, (2,), [-1, 12])])
    path = tmp_path / "broadcast_a.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    model = compile_model(str(path), ["L=1:40"])
    assert model.fallback_groups() == []
    (gemm,) = [ks[0] for ks in model.kernels.values() if ks[0].family == "gemm"]
    assert "A computed by the prologue (a broadcast constant) into a scratch" in gemm.source
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for L in (1, 4, 37, 40):
        x = rng.standard_normal((L, 12)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["z"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_row_statistic_alone_is_not_stored_in_place_of_the_gemm_result(tmp_path, keepdims):
    """x·W then ReduceSum over the columns, the sum the only output: with keepdims=1 the [M, 1]
    sum has the GEMM's rank and was taken for the normalized row, so the kernel used the M-element
    output as its M x N result (heap-buffer-overflow found by the differential fuzzer under ASan).
    The GEMM result goes to a scratch; the sum to its own output."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    W = rng.standard_normal((6, 4)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]),
             helper.make_node("ReduceSum", ["mm", "axes"], ["s"], keepdims=keepdims)]
    graph = helper.make_graph(nodes, "row_sum", [helper.make_tensor_value_info("x", TP.FLOAT, ["M", 6])],
                              [helper.make_tensor_value_info("s", TP.FLOAT, None)],
                              initializer=[helper.make_tensor("W", TP.FLOAT, W.shape, W.reshape(-1).tolist()),
                                           helper.make_tensor("axes", TP.INT64, [1], [-1])])
    path = tmp_path / "row_sum.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    plan = fuse(G.load_model(path, ["M=1:300"]))
    (group,) = [g for g in plan.groups if g.kind == "gemm"]
    kernel = compile_gemm_group(plan, group)
    assert kernel.has_row_pass and kernel.y_output is None, (kernel.y_output, group.outputs)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for M in (1, 13, 64, 65, 300):
        x = rng.standard_normal((M, 6)).astype(np.float32)
        got = kernel.run({"x": x}, bind_symbols(plan.graph, {"x": x}))
        close(got["s"], sess.run(None, {"x": x})[0], f"M={M}")


def _flatten_matmul(tmp_path, x_shape, prologue: bool):
    """[Sub ->] Reshape to [1, -1] -> MatMul -> Mul: a CNN head with a static batch of one."""
    rng = np.random.default_rng(3)
    k = int(np.prod([d for d in x_shape if isinstance(d, int)]))
    nodes = ([helper.make_node("Sub", ["x", "z"], ["xs"])] if prologue else
             [helper.make_node("Identity", ["x"], ["xs"])]) + [
        helper.make_node("Reshape", ["xs", "shape"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["m"]),
        helper.make_node("Mul", ["m", "z"], ["y"])]
    inits = [onnx.numpy_helper.from_array(rng.standard_normal((k, 5)).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
             onnx.numpy_helper.from_array(np.float32(0.5), "z")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    path = tmp_path / "flatten_matmul.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("prologue", [False, True], ids=["plain", "with-prologue"])
def test_a_static_batch_of_one_flattened_into_a_gemm_compiles_natively(tmp_path, prologue):
    """M = 1 by a Reshape of a [1, C, H, W] tensor: the epilogue names the GEMM's only row 0, which
    is row i (it was refused as a read 'at (0, j)', and the head ran on numpy)."""
    import onnxruntime as ort

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    path = _flatten_matmul(tmp_path, [1, 4, 4, 4], prologue)
    model = compile_model(str(path), [])
    assert model.fallback_groups() == []
    x = np.random.default_rng(4).standard_normal((1, 4, 4, 4)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Runtime.from_compiled(model).run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("symbol", ["M", "N", "K", "tile"])
def test_a_shape_symbol_named_like_a_gemm_kernel_identifier_compiles_natively(tmp_path, symbol):
    """A dim named M (or N, K, tile, ...) is renamed in the generated C instead of colliding with the
    kernel's own identifiers (it was refused as 'not a free C identifier', the GEMM on numpy)."""
    import onnxruntime as ort

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x2"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT, [symbol, 8]),
              helper.make_tensor_value_info("x2", TP.FLOAT, [symbol, 8])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")])
    path = tmp_path / "symbol_named_m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    model = compile_model(str(path), [f"{symbol}=1:20"])
    assert model.fallback_groups() == []
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for m in (1, 7, 20):
        feed = {"x": rng.standard_normal((m, 8)).astype(np.float32), "x2": rng.standard_normal((m, 8)).astype(np.float32)}
        np.testing.assert_allclose(rt.run(feed)["y"], sess.run(None, feed)[0], rtol=1e-4, atol=1e-4)
