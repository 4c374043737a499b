"""``QuantizeLinear`` and ``DequantizeLinear``: the Q/DQ pairs of a quantized (QDQ-format) model.

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
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

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


_LATEST = onnx.defs.onnx_opset_version()
register(OpDef("QuantizeLinear", FusionClass.OPAQUE, quantize_shape, quantize_ref, arity=(2, 3), opsets=(10, _LATEST)))
register(OpDef("DequantizeLinear", FusionClass.OPAQUE, dequantize_shape, dequantize_ref, arity=(2, 3),
               opsets=(10, _LATEST)))

__all__ = ["INTEGER_TYPES", "dequantize_ref", "quantize_ref"]
