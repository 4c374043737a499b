"""Signal-processing operators: ``DFT`` (opsets 17 and 20).

The registry entry gives the symbolic shape rule (the output length an expression of the symbols:
``floor(n/2) + 1`` for a one-sided spectrum), the numpy reference below (the semantics), and a
native kernel (:mod:`tscomp.graph.ops.signal_c`: a mixed-radix FFT with Bluestein's algorithm in
double precision), so a model around an FFT (FNet's token mixing, a spectrogram front end) runs
every group native; a DFT whose axis or ``dft_length`` only run time knows keeps the numpy
fallback.

The layout is ONNX's: the last axis holds a value's real part (size 1: a real signal) or its real
and imaginary parts (size 2); the transform runs along ``axis`` (opset 17: an attribute, default
1; opset 20: an optional input, default -2), which may not be that last axis. ``dft_length`` zero
pads or truncates the signal; ``onesided`` with a forward transform takes a real signal and keeps
the ``floor(n/2) + 1`` non-redundant frequencies (RFFT), with ``inverse`` it returns the real
signal of a one-sided spectrum (IRFFT, default length ``2 (m - 1)``). The inverse is scaled by
``1/n``, as numpy's.
"""
from __future__ import annotations

import numpy as np
import sympy

from tscomp.graph.ops.registry import FusionClass, OpCall, OpDef, ShapeContext, register


def _axis_in_range(axis: int, rank: int, fail) -> int:
    """``axis`` of a rank-``rank`` DFT input made non-negative; the last axis (the complex parts)
    and anything outside ``[-rank, rank - 2]`` is refused."""
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        fail(f"axis {axis} is out of range for a rank-{rank} input (the last axis holds the complex parts)")
    return axis % rank


def _kind(inverse: bool, onesided: bool) -> str:
    return {(False, False): "DFT", (True, False): "inverse DFT", (False, True): "RFFT",
            (True, True): "IRFFT"}[(inverse, onesided)]


def dft_shape(ctx: ShapeContext) -> None:
    shape = ctx.shape(0)
    rank = len(shape)
    if rank < 2 or not (shape[-1].is_Integer and int(shape[-1]) in (1, 2)):
        ctx.fail(f"input {list(shape)} must end in an axis of size 1 (real) or 2 (complex)")
    if ctx.dtype(0).kind != "f":
        ctx.fail(f"input of type {ctx.dtype(0)}: only floating point")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    if onesided and not inverse and int(shape[-1]) != 1:
        ctx.unsupported("a one-sided forward DFT (RFFT) of a complex signal: ONNX defines it for real input only")
    if ctx.opset >= 20:
        given_axis = ctx.int_list(2) if ctx.has_input(2) else [sympy.Integer(-2)]
    else:
        given_axis = [sympy.Integer(int(ctx.attr("axis", 1)))]
    if given_axis is None or not given_axis[0].is_Integer:
        _shape_for_an_axis_known_at_run_time(ctx, shape, inverse, onesided)
        return
    a = _axis_in_range(int(given_axis[0]), rank, ctx.fail)
    if ctx.has_input(1):
        given = ctx.int_list(1)
        if given is None or len(given) != 1:
            ctx.fail("dft_length (input 1) must be a scalar known at compile time or from the shapes")
        n = given[0]
    else:
        n = 2 * (shape[a] - 1) if onesided and inverse else shape[a]
    if n.is_Integer and int(n) < 1:
        ctx.fail(f"dft_length {n} must be positive")
    out = list(shape)
    out[a] = sympy.floor(n / 2) + 1 if onesided and not inverse else n
    out[-1] = 1 if onesided and inverse else 2
    ctx.set_output(0, ctx.dtype(0), out)


def _shape_for_an_axis_known_at_run_time(ctx: ShapeContext, shape, inverse: bool, onesided: bool) -> None:
    """An axis input computed at run time: a full-length complex DFT keeps every signal extent;
    otherwise the transformed one (which, only run time says) is unknown, so each signal extent is
    a fresh symbol, bound when the node runs."""
    keeps = not onesided and not ctx.has_input(1)
    dims = list(shape[:-1]) if keeps else [ctx.fresh("dft") for _ in shape[:-1]]
    ctx.set_output(0, ctx.dtype(0), dims + [1 if onesided and inverse else 2])


def dft_ref(call: OpCall, x, dft_length=None, axis=None):
    if call.opset >= 20:
        axis = -2 if axis is None else int(np.asarray(axis).reshape(-1)[0])
    else:
        axis = int(call.attr("axis", 1))

    def fail(msg):
        raise ValueError(f"DFT node {call.name!r}: {msg}")

    a = _axis_in_range(axis, x.ndim, fail)
    inverse, onesided = bool(call.attr("inverse", 0)), bool(call.attr("onesided", 0))
    # in the input's precision (numpy's FFT keeps float32 as complex64), as the ONNX reference does
    if x.shape[-1] == 1:
        signal = x[..., 0]
    else:
        signal = np.empty(x.shape[:-1], np.result_type(x.dtype, np.complex64))
        signal.real, signal.imag = x[..., 0], x[..., 1]
    n = None if dft_length is None else int(np.asarray(dft_length).reshape(-1)[0])
    if inverse and onesided:
        return np.fft.irfft(signal, n, axis=a)[..., None].astype(x.dtype)
    if onesided:
        y = np.fft.rfft(np.real(signal), n, axis=a)
    else:
        y = (np.fft.ifft if inverse else np.fft.fft)(signal, n, axis=a)
    return np.stack([y.real, y.imag], axis=-1).astype(x.dtype)


register(OpDef("DFT", FusionClass.OPAQUE, dft_shape, dft_ref, arity=(1, 3), opsets=(17, 20)))

__all__ = ["dft_ref", "dft_shape"]
