"""DFT: symbolic output shapes (ONNX's conformance cases have static ones only), errors that name
the node, and compiled models around DFTs on the native kernel agreeing with onnxruntime at awkward
lengths and with a float64 FFT at long ones."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import sympy
from onnx import TensorProto, helper

from tscomp.errors import ShapeError, UnsupportedOperatorError
from tests.graph.ops.test_nn_ops import make_model, propagated

FLOAT = TensorProto.FLOAT


def _dft_model(*, onesided=0, inverse=0, axis=None, dft_length=None, parts=1, opset=20):
    """x [batch, seq, hidden] -> Unsqueeze(-1) (a real signal; parts = 2: x and x * 2 as real and
    imaginary parts) -> DFT along ``axis`` -> y."""
    nodes = [helper.make_node("Unsqueeze", ["x", "last"], ["re"])]
    signal = "re"
    if parts == 2:
        nodes += [helper.make_node("Mul", ["re", "two"], ["im"]),
                  helper.make_node("Concat", ["re", "im"], ["sig"], axis=-1)]
        signal = "sig"
    inits = {"last": np.array([-1], np.int64), "two": np.array(2.0, np.float32)}
    ins = [signal, "", ""]
    if dft_length is not None:
        inits["n"] = np.array(dft_length, np.int64)
        ins[1] = "n"
    attrs = dict(onesided=onesided, inverse=inverse)
    if opset >= 20 and axis is not None:
        inits["axis"] = np.array(axis, np.int64)
        ins[2] = "axis"
    elif axis is not None:
        attrs["axis"] = axis
    nodes.append(helper.make_node("DFT", [i for i in ins if i] if not ins[2] else ins, ["y"], **attrs))
    return make_model(nodes, [("x", ["batch", "seq", "hidden"])], ["y"], inits, opset=opset)


def test_a_one_sided_spectrum_has_floor_n_over_2_plus_1_frequencies_of_a_symbolic_length():
    g = propagated(_dft_model(onesided=1, axis=1), "batch=1:4", "seq=1:512", "hidden=1:64")
    b, L, h = (sympy.Symbol(n, integer=True, positive=True) for n in ("batch", "seq", "hidden"))
    shape = g.values["y"].shape
    assert shape[0] == b and shape[2] == h and shape[3] == 2
    assert sympy.simplify(shape[1] - (sympy.floor(L / 2) + 1)) == 0


def test_a_full_dft_keeps_the_extents_and_dft_length_sets_the_transformed_one():
    g = propagated(_dft_model(axis=-2, parts=2), "batch=1:4", "seq=1:512", "hidden=1:64")
    assert [str(d) for d in g.values["y"].shape] == ["batch", "seq", "hidden", "2"]
    g = propagated(_dft_model(axis=1, dft_length=40, opset=17), "batch=1:4", "seq=1:512", "hidden=1:64")
    assert [str(d) for d in g.values["y"].shape] == ["batch", "40", "hidden", "2"]


def test_the_complex_parts_axis_and_a_complex_rfft_are_refused_naming_the_node():
    with pytest.raises(ShapeError, match=r"DFT node .*axis 3 is out of range"):
        propagated(_dft_model(axis=3), "batch=1:4", "seq=1:8", "hidden=1:8")
    with pytest.raises(UnsupportedOperatorError, match=r"DFT node .*real input only"):
        propagated(_dft_model(onesided=1, axis=1, parts=2), "batch=1:4", "seq=1:8", "hidden=1:8")


KINDS = {"rfft-seq": dict(onesided=1, axis=1), "complex-hidden": dict(axis=2, parts=2),
         "inverse-seq": dict(inverse=1, axis=-2, parts=2), "padded-seq": dict(axis=1, dft_length=20),
         "irfft-seq": dict(inverse=1, onesided=1, axis=1, parts=2), "full-seq-opset17": dict(axis=1, opset=17)}


def _compiled(tmp_path, kind: str, seq_max: int, threads: int = 2):
    """(the compiled model, a runtime of its artifact, the ONNX model's path) for ``KINDS[kind]``."""
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime
    from tscomp.runtime.artifact import write_artifact

    path = tmp_path / f"{kind}.onnx"
    path.write_bytes(_dft_model(**KINDS[kind]).SerializeToString())
    model = compile_model(str(path), ["batch=1:3", f"seq=1:{seq_max}", "hidden=1:16"])
    return model, Runtime(write_artifact(model, tmp_path / f"{kind}.tsc"), num_threads=threads), path


@pytest.mark.parametrize("kind", list(KINDS))
def test_compiled_dft_models_run_natively_and_match_onnxruntime_at_awkward_lengths(tmp_path, kind):
    """Every group native (the DFT on its C kernel); sequence lengths 1, 2, 7, 13, 37 (a prime past
    the direct radixes: Bluestein), 60 (radixes 4, 3 and 5) and the range end."""
    model, rt, path = _compiled(tmp_path, kind, 64)
    assert model.fallback_groups() == []
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for b, L, h in [(1, 1, 1), (2, 2, 5), (1, 7, 16), (3, 13, 3), (1, 37, 8), (2, 60, 3), (1, 64, 8)]:
        x = rng.standard_normal((b, L, h)).astype(np.float32)
        want = sess.run(None, {"x": x})[0]
        got = rt.run({"x": x})["y"]
        assert got.shape == want.shape, (kind, b, L, h)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max(initial=0))))


def _numpy_float64(kind: str, x: np.ndarray) -> np.ndarray:
    """The transform of ``KINDS[kind]`` on ``x`` [batch, seq, hidden], in float64 (numpy's FFT)."""
    if kind == "rfft-seq":
        y = np.fft.rfft(x.astype(np.float64), axis=1)
    elif kind == "irfft-seq":
        return np.fft.irfft(x + 2j * x.astype(np.float64), axis=1)[..., None]
    else:
        y = np.fft.fft(x.astype(np.float64), axis=1)
    return np.stack([y.real, y.imag], axis=-1)


@pytest.mark.parametrize("kind", ["rfft-seq", "irfft-seq", "full-seq-opset17"])
def test_the_dft_kernel_agrees_with_a_float64_fft_at_long_awkward_lengths(tmp_path, kind):
    """Primes (Bluestein), smooth and power-of-two lengths up to 1024, to float32 rounding of a
    float64 FFT (onnxruntime's own DFT drifts to ~1e-3 of the largest value at a prime like 509,
    so it is no reference there)."""
    _, rt, _ = _compiled(tmp_path, kind, 1024)
    rng = np.random.default_rng(1)
    for L in (97, 360, 509, 512, 1000, 1021, 1024):
        x = rng.standard_normal((2, L, 3)).astype(np.float32)
        want = _numpy_float64(kind, x)
        got = rt.run({"x": x})["y"]
        assert got.shape == want.shape, (kind, L)
        assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max(), (kind, L)


def test_a_dft_gives_the_same_bits_on_one_thread_as_on_two(tmp_path):
    """Each signal is transformed wholly by one thread, in lanes whose arithmetic does not depend
    on their neighbours: the thread count cannot change a result (solo calls rely on it)."""
    _, two, _ = _compiled(tmp_path, "complex-hidden", 256, threads=2)
    (tmp_path / "one").mkdir()
    _, one, _ = _compiled(tmp_path / "one", "complex-hidden", 256, threads=1)
    x = np.random.default_rng(2).standard_normal((3, 251, 13)).astype(np.float32)
    assert np.array_equal(two.run({"x": x})["y"], one.run({"x": x})["y"])


def test_the_reference_matches_numpy_fft_for_an_irfft():
    from tscomp.graph.ops.registry import OpCall
    from tscomp.graph.ops.signal import dft_ref

    spectrum = np.fft.rfft(np.arange(10, dtype=np.float64))
    x = np.stack([spectrum.real, spectrum.imag], axis=-1)[None].astype(np.float32)    # [1, 6, 2]
    y = dft_ref(OpCall("n", "DFT", {"inverse": 1, "onesided": 1}, 20, 1), x, None, np.array(1))
    assert y.shape == (1, 10, 1)
    np.testing.assert_allclose(y[0, :, 0], np.arange(10), atol=1e-4)
