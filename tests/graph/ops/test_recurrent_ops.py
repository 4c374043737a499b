"""RNN, GRU and LSTM (tscomp/graph/ops/recurrent.py): symbolic shapes over a dynamic sequence and
batch, and the numpy reference against onnxruntime where ONNX's own conformance cases do not reach:
both directions, ``sequence_lens`` shorter than the sequence, initial states, GRU's
``linear_before_reset``, LSTM peepholes and ``clip`` (``layout`` 1, which onnxruntime refuses, is
covered by the conformance cases' expected outputs); a compiled model around an LSTM runs."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.graph.ops.test_tensor_ops import inp, make_model, propagate, shape_of, syms
from tscomp.graph.reference import run_reference

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
IN, HID = 5, 4


def _recurrent_model(op, *, direction="forward", layout=0, with_lens=False, with_init=False, hidden=HID, **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    rng = np.random.default_rng(len(op) + dirs + layout)
    scale = 0.5 * (HID / hidden) ** 0.5        # the same state magnitudes at any hidden size
    inits = {"W": rng.standard_normal((dirs, g * hidden, IN)).astype(np.float32) * 0.5,
             "R": rng.standard_normal((dirs, g * hidden, hidden)).astype(np.float32) * scale,
             "B": rng.standard_normal((dirs, 2 * g * hidden)).astype(np.float32) * 0.1}
    names = ["x", "W", "R", "B", "lens" if with_lens else ""]
    inputs = [inp("x", ["B", "L", IN] if layout else ["L", "B", IN])]
    if with_lens:
        inputs.append(inp("lens", ["B"], TensorProto.INT32))
    if with_init:
        names.append("h0")
        inputs.append(inp("h0", ["B", dirs, hidden] if layout else [dirs, "B", hidden]))
        if op == "LSTM":
            names.append("c0")
            inputs.append(inp("c0", ["B", dirs, hidden] if layout else [dirs, "B", hidden]))
    if op == "LSTM" and attrs.pop("peepholes", False):
        names += [""] * (7 - len(names)) + ["P"]
        inits["P"] = rng.standard_normal((dirs, 3 * hidden)).astype(np.float32) * 0.3
    outs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, **attrs)
    return make_model([node], inputs, outs, inits), dirs


def _feeds(rng, op, s, b, dirs, hidden, layout, with_lens, with_init, min_len):
    """Inputs of a :func:`_recurrent_model` at sequence length ``s`` and batch ``b`` (sequence
    lengths drawn from ``min_len`` to ``s``)."""
    feeds = {"x": rng.standard_normal((b, s, IN) if layout else (s, b, IN)).astype(np.float32)}
    if with_lens:
        feeds["lens"] = rng.integers(min_len, s + 1, b).astype(np.int32)
    if with_init:
        state = (b, dirs, hidden) if layout else (dirs, b, hidden)
        feeds["h0"] = rng.standard_normal(state).astype(np.float32)
        if op == "LSTM":
            feeds["c0"] = rng.standard_normal(state).astype(np.float32)
    return feeds


CASES = [("RNN", {}), ("GRU", {"direction": "bidirectional"}), ("GRU", {"linear_before_reset": 1}),
         ("LSTM", {"direction": "bidirectional", "with_lens": True, "with_init": True}),
         ("LSTM", {"direction": "reverse", "with_lens": True}),
         ("LSTM", {"peepholes": True, "clip": 0.8, "with_init": True}),
         ("GRU", {"direction": "reverse", "with_lens": True, "with_init": True})]


@pytest.mark.parametrize("op,kw", CASES, ids=[f"{op}-{'-'.join(kw) or 'default'}" for op, kw in CASES])
def test_recurrent_shapes_are_symbolic_and_the_reference_matches_onnxruntime(op, kw):
    kw = dict(kw)
    layout, with_lens, with_init = kw.get("layout", 0), kw.pop("with_lens", False), kw.pop("with_init", False)
    model, dirs = _recurrent_model(op, with_lens=with_lens, with_init=with_init, **kw)
    g = propagate(model, "L=1:30", "B=1:6")
    S, B = syms(g, "L", "B")
    assert shape_of(g, "y") == ((B, S, dirs, HID) if layout else (S, dirs, B, HID))
    assert shape_of(g, "y_h") == ((B, dirs, HID) if layout else (dirs, B, HID))
    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(9)
    for s, b in [(1, 1), (7, 3), (30, 6)]:
        feeds = _feeds(rng, op, s, b, dirs, HID, layout, with_lens, with_init, min_len=1)
        got = run_reference(g, feeds)
        for name, want in zip(g.outputs, sess.run(None, feeds)):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=f"{name} at S={s}, B={b}")


def test_a_model_around_an_lstm_compiles_and_matches_onnxruntime(tmp_path):
    import onnx

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    model, _ = _recurrent_model("LSTM", direction="bidirectional")
    rng = np.random.default_rng(1)
    # a projection after the recurrence: [S, 2, B, 4] -> Transpose -> [S, B, 2, 4] -> MatMul by [4, 3]
    model.graph.node.extend([helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
                             helper.make_node("MatMul", ["yt", "proj"], ["out"])])
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((HID, 3)).astype(np.float32), "proj"))
    model.graph.output.append(helper.make_tensor_value_info("out", TensorProto.FLOAT, None))
    path = tmp_path / "lstm.onnx"
    onnx.save(model, path)
    rt = Runtime.from_compiled(compile_model(str(path), ["L=1:40", "B=1:4"], max_variants=1))
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for s, b in [(1, 1), (13, 2), (40, 4)]:
        x = rng.standard_normal((s, b, IN)).astype(np.float32)
        got = rt.run({"x": x})
        for name, want in zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at S={s}, B={b}")


NATIVE_CASES = [(op, kw, HID) for op, kw in CASES] + [
    ("LSTM", {"layout": 1, "input_forget": 1, "with_init": True}, HID),
    ("RNN", {"direction": "reverse", "activations": ["Relu"]}, HID),
    ("GRU", {"direction": "bidirectional", "with_lens": True,
             "activations": ["HardSigmoid", "Softsign", "ScaledTanh", "LeakyRelu"],
             "activation_alpha": [0.3, 0.7, 0.2], "activation_beta": [0.4, 1.3]}, HID),
    # hidden sizes whose recurrent product the team splits by hidden unit (SPLIT_MIN_MACS)
    ("LSTM", {"direction": "bidirectional", "with_lens": True, "with_init": True}, 200),
    ("LSTM", {"peepholes": True, "clip": 0.8, "layout": 1}, 184),
    ("GRU", {"direction": "reverse", "with_lens": True, "with_init": True}, 216),
    ("GRU", {"linear_before_reset": 1}, 216),
    ("RNN", {"direction": "bidirectional"}, 368),
]


@pytest.mark.parametrize("op,kw,hidden", NATIVE_CASES,
                         ids=[f"{op}-{'-'.join(kw) or 'default'}-h{h}" for op, kw, h in NATIVE_CASES])
def test_the_recurrence_runs_natively_and_matches_the_reference(op, kw, hidden, tmp_path):
    """Every direction, layout, optional input and attribute, at hidden sizes one thread runs and
    the team splits: the projections through the GEMM family, the recurrence through the index
    family's C kernel (no numpy group), against the numpy reference of the ONNX op at lengths 1, 7
    and 30 and batches 1, 3, 6 (sequence lengths from 0 to the whole sequence)."""
    from tscomp.compiler import compile_model
    from tscomp.graph.ops.recurrent import SPLIT_MIN_MACS
    from tscomp.runtime import Runtime
    kw = dict(kw)
    layout, with_lens, with_init = kw.get("layout", 0), kw.pop("with_lens", False), kw.pop("with_init", False)
    model, dirs = _recurrent_model(op, with_lens=with_lens, with_init=with_init, hidden=hidden, **kw)
    onnx.save(model, tmp_path / "rnn.onnx")
    compiled = compile_model(str(tmp_path / "rnn.onnx"), ["L=1:30", "B=1:6"], max_variants=1)
    families = {k.family for ks in compiled.kernels.values() for k in ks}
    assert "numpy" not in families and "index" in families
    assert (GATES[op] * hidden * hidden >= SPLIT_MIN_MACS) == (hidden > HID)
    rt = Runtime.from_compiled(compiled)
    g = propagate(model, "L=1:30", "B=1:6")
    rng = np.random.default_rng(11)
    for s, b in [(1, 1), (7, 3), (30, 6)]:
        feeds = _feeds(rng, op, s, b, dirs, hidden, layout, with_lens, with_init, min_len=0)
        want, got = run_reference(g, feeds), rt.run(feeds)
        for name in g.outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} at S={s}, B={b}")


def test_a_sequence_length_outside_the_sequence_is_refused_by_name(tmp_path):
    from tscomp.compiler import compile_model
    from tscomp.errors import IndexOutOfRangeError
    from tscomp.runtime import Runtime
    model, _ = _recurrent_model("LSTM", with_lens=True)
    onnx.save(model, tmp_path / "lstm.onnx")
    rt = Runtime.from_compiled(compile_model(str(tmp_path / "lstm.onnx"), ["L=1:30", "B=1:6"], max_variants=1))
    x = np.zeros((5, 2, IN), np.float32)
    for bad in (6, -1):
        with pytest.raises(IndexOutOfRangeError, match=rf"'lens' has value {bad} .*\[0, 5\]"):
            rt.run({"x": x, "lens": np.array([3, bad], np.int32)})


def test_an_initial_state_expanded_from_a_constant_runs_natively_as_the_dynamo_exporter_writes_it(tmp_path):
    """torch's dynamo exporter gives nn.LSTM its zero initial state as Expand(constant) over the
    batch: the recurrence kernel reads the constant through the view (it ran on numpy, and there the
    interpreter looked the internal op up without its domain and failed)."""
    from tscomp.compiler import compile_model
    from tscomp.graph.fusion import fuse, run_plan
    from tscomp.runtime import Runtime
    model, _ = _recurrent_model("LSTM")
    node = model.graph.node[0]
    del node.input[:]
    node.input.extend(["x", "W", "R", "B", "", "h0", "c0"])
    state = helper.make_node("Concat", ["one", "batch", "hid"], ["state_shape"], axis=0)
    batch = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Slice", ["x_shape", "one", "two"], ["batch"])]
    model.graph.node.insert(0, helper.make_node("Expand", ["zero", "state_shape"], ["c0"]))
    model.graph.node.insert(0, helper.make_node("Expand", ["half", "state_shape"], ["h0"]))
    model.graph.node.insert(0, state)
    for n in reversed(batch):
        model.graph.node.insert(0, n)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(v, dtype), k) for k, v, dtype in
                                    (("one", [1], np.int64), ("two", [2], np.int64), ("hid", [HID], np.int64),
                                     ("zero", [[[0.0]]], np.float32), ("half", [[[0.5]]], np.float32))])
    onnx.save(model, tmp_path / "lstm.onnx")
    compiled = compile_model(str(tmp_path / "lstm.onnx"), ["L=1:30", "B=1:6"], max_variants=1)
    assert "numpy" not in {k.family for ks in compiled.kernels.values() for k in ks}
    rt = Runtime.from_compiled(compiled)
    sess = onnxruntime.InferenceSession(str(tmp_path / "lstm.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for s, b in [(1, 1), (9, 4)]:
        x = rng.standard_normal((s, b, IN)).astype(np.float32)
        want = sess.run(None, {"x": x})
        for got in (rt.run({"x": x}), run_plan(compiled.plan, {"x": x})):       # kernels, and the interpreter
            for name, w in zip([o.name for o in sess.get_outputs()], want):
                np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=f"{name} at S={s}, B={b}")
