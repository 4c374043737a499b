"""Differential fuzzing of convolution chains against onnxruntime: random chains of 1x1, depthwise,
dense and grouped Convs (strides, dilations, asymmetric pads, a channel multiplier), fused
activations, residual Adds and extra outputs, over channel counts that are and are not whole
vector blocks -- so the channel-blocked layout (tscomp/codegen/channel_blocking.py) is decided
on every kind of edge and every kernel reads and writes both layouts. Compiled with symbolic
N, H, W; compared at rtol = atol = 1e-4 at 1, primes and the range ends.

``make test`` runs ``CONV_FUZZ_EXAMPLES`` chains (derandomized); a longer run:

    TSCOMP_CONV_FUZZ_EXAMPLES=200 [TSCOMP_CONV_FUZZ_SEED=<int>] .venv/bin/python -m pytest -p no:xdist tests/fuzz/test_conv_chains.py -q
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper

ort = pytest.importorskip("onnxruntime")

CONV_FUZZ_EXAMPLES = int(os.environ.get("TSCOMP_CONV_FUZZ_EXAMPLES", "6"))
#: other chains than the fixed slice: ``TSCOMP_CONV_FUZZ_SEED=<int>``
CONV_FUZZ_SEED = os.environ.get("TSCOMP_CONV_FUZZ_SEED")
DIMS = ["N=1:2", "H=1:23", "W=1:23"]
BINDINGS = [(1, 1, 1), (2, 7, 13), (1, 23, 23), (2, 23, 2), (1, 11, 17)]


def conv_chain(seed: int) -> tuple[onnx.ModelProto, str]:
    """A random chain of 2-6 Conv layers from an input [N, C, H, W]; (model, description)."""
    rng = np.random.default_rng(seed)
    inits, nodes, desc = [], [], []

    def const(*shape, scale=0.3):
        name = f"c{len(inits)}"
        inits.append(helper.make_tensor(name, TP.FLOAT, shape, (rng.standard_normal(shape) * scale).astype(np.float32).ravel()))
        return name
    lo, hi = const(scale=0.0), const(scale=0.0)
    inits[-2] = helper.make_tensor(lo, TP.FLOAT, [], [0.0])
    inits[-1] = helper.make_tensor(hi, TP.FLOAT, [], [6.0])
    c0 = int(rng.choice([8, 16, 32]))
    cur, C, tag = "x", c0, (c0, 0)          # tag: (channels, spatial size id) -- same tag, same shape
    seen = {tag: ["x"]}
    outputs = []
    for i in range(int(rng.integers(2, 7))):
        kind = str(rng.choice(["pw", "pw", "dw", "dw", "dense", "grouped"]))
        k, stride, dil, group, cout = 1, 1, 1, 1, C
        if kind == "pw":
            cout = int(rng.choice([8, 16, 24, 32, 48]))
        elif kind == "dw":
            k, stride, dil = int(rng.choice([3, 5])), int(rng.choice([1, 1, 2])), int(rng.choice([1, 1, 2]))
            group, cout = C, C * int(rng.choice([1, 1, 1, 2]))
        elif kind == "dense":
            k, stride, cout = 3, int(rng.choice([1, 2])), int(rng.choice([8, 16, 32]))
        else:
            group = int(rng.choice([g for g in (2, 4) if C % g == 0]))
            k, cout = 3, group * int(rng.choice([4, 8, 16]))
        span = dil * (k - 1)                 # pads that keep every output >= 1 at H = 1
        top, left = int(rng.integers(0, span + 1)), int(rng.integers(0, span + 1))
        pads = [top, left, span - top + int(rng.integers(0, 2)) * (k > 1), span - left]
        out = f"t{i}"
        nodes.append(helper.make_node("Conv", [cur, const(cout, C // group, k, k), const(cout)], [out],
                                      kernel_shape=[k, k], strides=[stride, stride], dilations=[dil, dil],
                                      pads=pads, group=group))
        act = str(rng.choice(["none", "Relu", "Clip"]))
        if act != "none":
            nodes.append(helper.make_node(act, [out] + ([lo, hi] if act == "Clip" else []), [out + "a"]))
            out += "a"
        # a 1x1 keeps the spatial size; any other window starts a new one (its pads vary)
        tag = (cout, tag[1] if kind == "pw" else i + 1)
        if kind == "pw" and seen.get(tag) and rng.random() < 0.6:
            nodes.append(helper.make_node("Add", [out, str(rng.choice(seen[tag]))], [out + "r"]))
            out += "r"
        if rng.random() < 0.15:
            outputs.append(out)              # also a model output: it must stay NCHW
        seen.setdefault(tag, []).append(out)
        desc.append(f"{kind}(k{k} s{stride} d{dil} g{group} {C}->{cout} pads {pads}) {act}")
        cur, C = out, cout
    outputs.append(cur)
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TP.FLOAT, ["N", c0, "H", "W"])],
                          [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in dict.fromkeys(outputs)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, f"input {c0} channels: " + "; ".join(desc)


@settings(max_examples=CONV_FUZZ_EXAMPLES, deadline=None, derandomize=CONV_FUZZ_SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_conv_chain_matches_onnxruntime(seed):
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    model, desc = conv_chain(seed)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "chain.onnx"
        onnx.save(model, str(path))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        compiled = compile_model(str(path), DIMS, max_variants=2)
        c0 = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
        for executor in ("native", "python"):
            rt = Runtime.from_compiled(compiled, num_threads=2, executor=executor)
            for n, h, w in BINDINGS:
                x = np.random.default_rng(seed).standard_normal((n, c0, h, w)).astype(np.float32)
                want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
                got = rt.run({"x": x})
                for name, ref in want.items():
                    np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4,
                                               err_msg=f"{name} at N={n} H={h} W={w} ({executor}); {desc}; "
                                                       f"{compiled.notes}")
        for n, h, w in BINDINGS[1:3]:
            x = np.random.default_rng(seed).standard_normal((n, c0, h, w)).astype(np.float32)
            _every_variant_matches_the_interpreter(compiled, {"x": x}, desc)


def _every_variant_matches_the_interpreter(compiled, inputs: dict, desc: str) -> None:
    """Each group's every variant (tile configurations, the Winograd strategy, both depthwise
    strategies), not only the one the dispatch picks at these shapes, on the interpreter's inputs
    for that group."""
    from tests.codegen.plan_runs import group_env
    from tscomp.graph.fusion.interpret import evaluate_group
    from tscomp.graph.reference import bind_symbols

    plan = compiled.plan
    bound = bind_symbols(plan.graph, inputs)
    env = dict(inputs)
    for g in plan.groups:
        genv = group_env(plan, g, env, bound)
        want = evaluate_group(plan, g, genv, bound)
        for kernel in compiled.kernels[g.name]:
            got = kernel.run(genv, bound)
            for name, ref in want.items():
                np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4,
                                           err_msg=f"group {g.name} variant {getattr(kernel, 'func', kernel)} at {bound}; {desc}")
        env.update(want)


if CONV_FUZZ_SEED is not None:
    test_random_conv_chain_matches_onnxruntime = seed(int(CONV_FUZZ_SEED))(test_random_conv_chain_matches_onnxruntime)
