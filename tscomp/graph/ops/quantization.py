"""Quantized models' operators: ``QuantizeLinear`` and ``DequantizeLinear`` (the Q/DQ pairs of a
QDQ-format model), and ``DynamicQuantizeLinear``, ``MatMulInteger`` and ``ConvInteger`` (what
onnxruntime's ``quantize_dynamic`` writes: activations quantized per call, int8 weights, int32
accumulation).

A QDQ model keeps its weights as integers behind a DequantizeLinear -- a constant whose value
constant folding computes at compile time, so the compiled kernels read float weights -- and
fake-quantizes activations with Q -> DQ pairs. The registry gives both operators their shape and
type rules and numpy references (the activation pairs run on the numpy fallback: per-axis and
blocked scales are not numpy-broadcastable, so they are not offered to the fused elementwise
kernels). Semantics as the operator definitions: per-tensor, per-axis (``axis``) or blocked
(``block_size`` along ``axis``) scales and zero points; quantization rounds half to even and
saturates to the output type (the zero point's type, else ``output_dtype``, else uint8);
dequantization computes ``(x - zero_point) * scale`` in the scale's type. 8- and 16-bit integer
types; float8 and 4-bit types are outside tscomp's scope.

``DynamicQuantizeLinear`` follows onnxruntime (its schema's function body divides by a zero scale
when the tensor is all zeros; onnxruntime takes scale 1 there): the range is widened to hold 0,
``scale = (max - min) / 255`` in fp32, ``zero_point = round(clip(0 - min / scale, 0, 255))``, and
``y = saturate(round(x / scale) + zero_point)``, every rounding half to even. ``MatMulInteger`` and
``ConvInteger`` are exact: ``(a - a_zero_point)`` times ``(b - b_zero_point)`` summed in int64 and
stored as int32 (per-tensor or per-row zero points of A, per-tensor or per-column ones of B;
ConvInteger pads with the input's zero point, so a padded tap adds nothing).
:mod:`tscomp.graph.quantized_arithmetic` turns each of them into arithmetic the kernel families
compile; these references are what that arithmetic must reproduce.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from tscomp.graph.ops.nn import conv_ref, conv_shape, matmul_shape
from tscomp.graph.ops.registry import FusionClass, OpCall, OpDef, ShapeContext, register

#: integer types a quantized tensor may have here
INTEGER_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32))


def _output_dtype(attr_value: int, fallback) -> np.dtype:
    if attr_value:
        return np.dtype(helper.tensor_dtype_to_np_dtype(int(attr_value)))
    return np.dtype(fallback)


def quantize_shape(ctx: ShapeContext) -> None:
    zp = ctx.dtype(2) if ctx.has_input(2) else None
    out = zp if zp is not None else _output_dtype(ctx.attr("output_dtype", 0), np.uint8)
    if np.dtype(out) not in INTEGER_TYPES:
        ctx.unsupported(f"quantizing to {np.dtype(out)} (float8 and 4-bit types are outside tscomp's scope)")
    ctx.set_output(0, out, ctx.shape(0))


def dequantize_shape(ctx: ShapeContext) -> None:
    if np.dtype(ctx.dtype(0)) not in INTEGER_TYPES:
        ctx.unsupported(f"dequantizing {np.dtype(ctx.dtype(0))} (float8 and 4-bit types are outside tscomp's scope)")
    ctx.set_output(0, _output_dtype(ctx.attr("output_dtype", 0), ctx.dtype(1)), ctx.shape(0))


def _along(param, x, call: OpCall):
    """A scale or zero point broadcast against ``x``: a scalar as is, a per-axis vector along
    ``axis``, a blocked tensor repeated ``block_size`` times along ``axis``."""
    param = np.asarray(param)
    if param.size == 1 and param.ndim <= 1:
        return param.reshape(())
    axis = int(call.attr("axis", 1)) % x.ndim
    block = int(call.attr("block_size", 0))
    if block:
        return np.take(np.repeat(param, block, axis=axis), np.arange(x.shape[axis]), axis=axis)
    shape = [1] * x.ndim
    shape[axis] = param.shape[0]
    return param.reshape(shape)


def quantize_ref(call: OpCall, x, scale, zero_point=None):
    out = np.dtype(zero_point.dtype) if zero_point is not None else \
        _output_dtype(call.attr("output_dtype", 0), np.uint8)
    zp = 0 if zero_point is None else _along(zero_point, x, call).astype(np.int64)
    # x / scale in x's own precision (a float64 quotient rounds some ties the other way), then to even
    q = np.rint(np.divide(x, _along(scale, x, call).astype(x.dtype))).astype(np.float64) + zp
    info = np.iinfo(out)
    return np.clip(q, info.min, info.max).astype(out)


def dequantize_ref(call: OpCall, x, scale, zero_point=None):
    out = _output_dtype(call.attr("output_dtype", 0), scale.dtype)
    zp = 0 if zero_point is None else _along(zero_point, x, call).astype(np.int64)
    scale = _along(scale, x, call)
    return ((x.astype(np.int64) - zp).astype(scale.dtype) * scale).astype(out)


def dynamic_quantize_shape(ctx: ShapeContext) -> None:
    if np.dtype(ctx.dtype(0)) != np.float32:
        ctx.fail(f"DynamicQuantizeLinear quantizes float32, got {np.dtype(ctx.dtype(0))}")
    ctx.set_output(0, np.uint8, ctx.shape(0))
    ctx.set_output(1, np.float32, ())
    ctx.set_output(2, np.uint8, ())


def dynamic_quantize_parameters(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """(scale, zero point) of ``x`` as onnxruntime computes them, every step in fp32."""
    f32 = np.float32
    lo = min(f32(x.min()), f32(0)) if x.size else f32(0)
    hi = max(f32(x.max()), f32(0)) if x.size else f32(0)
    scale = f32(1) if hi == lo else f32(f32(hi - lo) / f32(255))
    zero_point = np.rint(np.clip(f32(f32(0) - f32(lo / scale)), f32(0), f32(255)))
    return scale, np.uint8(zero_point)


def dynamic_quantize_ref(call: OpCall, x):
    x = np.asarray(x, np.float32)
    scale, zero_point = dynamic_quantize_parameters(x)
    y = np.clip(np.rint(np.divide(x, scale)) + np.float32(zero_point), 0, 255).astype(np.uint8)
    return y, np.array(scale, np.float32), np.array(zero_point, np.uint8)


def _integer_operands(ctx: ShapeContext, first: int, second: int) -> None:
    for i in (first, second):
        if np.dtype(ctx.dtype(i)) not in (np.dtype(np.uint8), np.dtype(np.int8)):
            ctx.fail(f"input {i} of {ctx.op_type} must be uint8 or int8, got {np.dtype(ctx.dtype(i))}")


def matmul_integer_shape(ctx: ShapeContext) -> None:
    _integer_operands(ctx, 0, 1)
    matmul_shape(ctx)
    ctx.set_output(0, np.int32, ctx.out_shapes[0])


def minus_zero_point(values, zero_point, axis: int = 0) -> np.ndarray:
    """``values - zero_point`` in int64; a zero point of several elements lies along ``axis``."""
    shifted = np.asarray(values).astype(np.int64)
    if zero_point is None:
        return shifted
    zp = np.asarray(zero_point).astype(np.int64)
    if zp.size == 1:
        return shifted - zp.reshape(())
    shape = [1] * shifted.ndim
    shape[axis] = zp.size
    return shifted - zp.reshape(shape)


def matmul_integer_ref(call: OpCall, a, b, a_zero_point=None, b_zero_point=None):
    # A's zero point may be per row, B's per column
    return np.matmul(minus_zero_point(a, a_zero_point, max(a.ndim - 2, 0)),
                     minus_zero_point(b, b_zero_point, b.ndim - 1)).astype(np.int32)


def conv_integer_shape(ctx: ShapeContext) -> None:
    _integer_operands(ctx, 0, 1)
    conv_shape(ctx, bias=False)
    ctx.set_output(0, np.int32, ctx.out_shapes[0])


def conv_integer_ref(call: OpCall, x, w, x_zero_point=None, w_zero_point=None):
    # float64 holds every partial sum exactly (|products| < 2^16, far fewer than 2^37 taps)
    y = conv_ref(call, minus_zero_point(x, x_zero_point).astype(np.float64),
                 minus_zero_point(w, w_zero_point).astype(np.float64))   # per output channel
    return y.astype(np.int32)


_LATEST = onnx.defs.onnx_opset_version()
register(OpDef("QuantizeLinear", FusionClass.OPAQUE, quantize_shape, quantize_ref, arity=(2, 3), opsets=(10, _LATEST)))
register(OpDef("DequantizeLinear", FusionClass.OPAQUE, dequantize_shape, dequantize_ref, arity=(2, 3),
               opsets=(10, _LATEST)))
register(OpDef("DynamicQuantizeLinear", FusionClass.OPAQUE, dynamic_quantize_shape, dynamic_quantize_ref,
               arity=(1, 1), opsets=(11, _LATEST)))
register(OpDef("MatMulInteger", FusionClass.OPAQUE, matmul_integer_shape, matmul_integer_ref, arity=(2, 4),
               opsets=(10, _LATEST)))
register(OpDef("ConvInteger", FusionClass.OPAQUE, conv_integer_shape, conv_integer_ref, arity=(2, 4),
               opsets=(10, _LATEST)))

__all__ = ["INTEGER_TYPES", "dequantize_ref", "dynamic_quantize_parameters", "minus_zero_point", "quantize_ref"]
