"""``GridSample`` (opsets 16 and 20): sample an image at the points a grid gives (torch's
``F.grid_sample``: deformable attention in DETR-style detectors, optical flow, keypoint sampling).

The registry gives it the symbolic shape rule -- ``[N, C, *grid's spatial extents]`` --, a
vectorized numpy reference (the semantics) and a native C kernel
(:func:`tscomp.graph.ops.c_kernels.grid_sample_c`: every tap a data-dependent gather, indices
clamped into the image). Semantics as the operator definition: the grid's last axis holds the
coordinates in ``[-1, 1]``, innermost spatial axis first (x, then y, ...); ``align_corners`` maps
-1 and 1 to the corner pixels' centres (else to their outer edges); ``mode`` nearest (round half to
even), (bi)linear or (bi)cubic (Keys' kernel, alpha -0.75), separable over every spatial axis;
``padding_mode`` zeros (taps outside read 0), border (coordinates and taps clamped; cubic clamps
its taps only, as onnxruntime and torch do) or reflection
(coordinates reflected at the borders, -0.5 and size - 0.5, or the corner centres with
``align_corners``).
"""
from __future__ import annotations

import itertools

import numpy as np
import onnx.defs

from tscomp.graph.ops.registry import FusionClass, OpCall, OpDef, ShapeContext, register

#: opset 16's mode names -> opset 20's
_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}
_PADDINGS = ("zeros", "border", "reflection")


def grid_sample_shape(ctx: ShapeContext) -> None:
    x, grid = ctx.shape(0), ctx.shape(1)
    if len(x) < 3 or len(grid) != len(x):
        ctx.fail(f"X must be [N, C, spatial...] and the grid [N, spatial..., r] of the same rank, "
                 f"got ranks {len(x)} and {len(grid)}")
    if not grid[-1].is_Integer or int(grid[-1]) != len(x) - 2:
        ctx.fail(f"the grid's last axis holds {grid[-1]} coordinates for {len(x) - 2} spatial axes")
    if _MODES.get(ctx.attr("mode", "linear")) is None or ctx.attr("padding_mode", "zeros") not in _PADDINGS:
        ctx.fail(f"mode {ctx.attr('mode')!r} / padding_mode {ctx.attr('padding_mode')!r} is not a GridSample mode")
    ctx.unify(x[0], grid[0], "X's and the grid's batch")
    ctx.set_output(0, ctx.dtype(0), [x[0], x[1], *grid[1:-1]])


def _reflect(x, lo: float, hi: float):
    """``x`` reflected at ``lo`` and ``hi`` until inside (any number of reflections)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below = x < lo
    dist = np.where(below, lo - x, x - hi)
    n = np.floor(dist / span)
    rest = dist - n * span
    even = n % 2 == 0
    inside = (x >= lo) & (x <= hi)
    toward_lo = np.where(even, lo + rest, hi - rest)      # reflected at lo an even number of times
    toward_hi = np.where(even, hi - rest, lo + rest)
    return np.where(inside, x, np.where(below, toward_lo, toward_hi))


def _cubic_weights(t):
    """Keys' cubic convolution weights (alpha -0.75) of the taps at -1, 0, 1, 2 for ``t`` in [0, 1)."""
    a = -0.75
    def far(d):
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    def near(d):
        return ((a + 2) * d - (a + 3)) * d * d + 1
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _taps(x, mode: str):
    """Per coordinate: [(integer tap index, weight), ...]."""
    if mode == "nearest":
        return [(x.astype(np.int64), np.ones_like(x))]
    base = np.floor(x)
    t = x - base
    base = base.astype(np.int64)
    if mode == "linear":
        return [(base, 1 - t), (base + 1, t)]
    return [(base + k - 1, w) for k, w in enumerate(_cubic_weights(t))]


def grid_sample_ref(call: OpCall, X, grid):
    mode = _MODES[call.attr("mode", "linear")]
    padding = call.attr("padding_mode", "zeros")
    align = bool(call.attr("align_corners", 0))
    dims = X.shape[2:]
    coords = np.asarray(grid, np.float64)[..., ::-1]          # coordinate i addresses spatial axis i
    taps_per_axis = []
    for i, d in enumerate(dims):
        g = coords[..., i]
        x = (g + 1) / 2 * (d - 1) if align else ((g + 1) * d - 1) / 2
        if mode == "nearest":
            x = np.rint(x)
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        outside = (x < lo) | (x > hi)
        if padding == "border" and mode != "cubic":     # cubic clamps its taps only (onnxruntime, torch)
            x = np.where(outside, np.clip(x, 0, d - 1), x)
        elif padding == "reflection":
            x = np.where(outside, _reflect(x, lo, hi), x)
        taps = []
        for idx, w in _taps(x, mode):
            valid = (idx >= 0) & (idx < d)
            if padding == "border":
                idx = np.clip(idx, 0, d - 1)
            elif padding == "reflection":
                idx = np.trunc(_reflect(idx.astype(np.float64), lo, hi)).astype(np.int64)
            taps.append((np.clip(idx, 0, d - 1), w * valid if padding == "zeros" else w))
        taps_per_axis.append(taps)
    n = np.arange(X.shape[0]).reshape((-1,) + (1,) * (coords.ndim - 2))
    xt = np.moveaxis(X, 1, -1)                                 # [N, spatial..., C]: gathers keep C last
    out = np.zeros(coords.shape[:-1] + (X.shape[1],), np.float64)
    for combo in itertools.product(*taps_per_axis):
        weight = np.prod([w for _, w in combo], axis=0)
        out += weight[..., None] * xt[(n, *(idx for idx, _ in combo))]
    return np.moveaxis(out, -1, 1).astype(X.dtype)


register(OpDef("GridSample", FusionClass.OPAQUE, grid_sample_shape, grid_sample_ref, arity=(2, 2),
                  opsets=(16, onnx.defs.onnx_opset_version())))

__all__ = ["grid_sample_ref", "grid_sample_shape"]
