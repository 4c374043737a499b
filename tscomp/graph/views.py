"""Index maps of injective operators: views of a tensor that are never materialized.

Reshape, Transpose, Squeeze/Unsqueeze/Flatten, Expand, Slice and Split do not
compute anything; they change how a tensor's elements are addressed. The fusion
stage absorbs them as *views* (TSCompiler §4.2: "reshapes and transposes ... to
reduce the off-chip memory access"): a consumer reads the materialized source
through a chain of :class:`ViewOp`, and code generation later composes the chain
into one index expression. Shapes are symbolic (SymPy); :func:`apply_view`
evaluates a chain with numpy at a concrete binding.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import sympy

Expr = sympy.Expr


@dataclass(frozen=True)
class ViewOp:
    kind: str                      # "reshape" | "permute" | "expand" | "slice"
    shape: tuple[Expr, ...]        # the view's output shape
    perm: tuple[int, ...] = ()     # permute
    #: slice: (axis, start, stop, step) per sliced axis, with ONNX/Python clamping semantics
    slices: tuple[tuple[int, Expr, Expr, Expr], ...] = ()

    def canonical(self, canon: Callable[[Expr], Expr]) -> "ViewOp":
        """This view with every size and slice bound passed through ``canon`` (the symbol table's
        canonical form, so index maps built from it simplify against the symbol ranges)."""
        return replace(self, shape=tuple(canon(d) for d in self.shape),
                       slices=tuple((a, canon(s), canon(t), canon(st)) for a, s, t, st in self.slices))

    def describe(self) -> str:
        if self.kind == "permute":
            return f"permute{list(self.perm)}"
        if self.kind == "slice":
            return "slice[" + ", ".join(f"ax{a}:{s}:{e}:{st}" for a, s, e, st in self.slices) + "]"
        return f"{self.kind}[{', '.join(str(d) for d in self.shape)}]"


def reshape(shape: Sequence) -> ViewOp:
    return ViewOp("reshape", tuple(shape))


def permute(perm: Sequence[int], in_shape: Sequence) -> ViewOp:
    return ViewOp("permute", tuple(in_shape[p] for p in perm), perm=tuple(perm))


def expand(shape: Sequence) -> ViewOp:
    return ViewOp("expand", tuple(shape))


def slice_view(shape: Sequence, slices) -> ViewOp:
    return ViewOp("slice", tuple(shape), slices=tuple(slices))


def apply_view(arr: np.ndarray, op: ViewOp, evaluate: Callable[[Expr], int]) -> np.ndarray:
    """One view step on a concrete array; ``evaluate`` maps a symbolic expression to an int."""
    if op.kind == "reshape":
        return arr.reshape(tuple(evaluate(d) for d in op.shape))
    if op.kind == "permute":
        return arr.transpose(op.perm)
    if op.kind == "expand":
        shape = tuple(evaluate(d) for d in op.shape)
        arr = arr.reshape((1,) * (len(shape) - arr.ndim) + arr.shape)
        return np.broadcast_to(arr, shape)
    if op.kind == "slice":
        index = [slice(None)] * arr.ndim
        for axis, start, stop, step in op.slices:
            index[axis] = onnx_slice(arr.shape[axis], evaluate(start), evaluate(stop), evaluate(step))
        return arr[tuple(index)]
    raise ValueError(f"unknown view kind {op.kind!r}")


def onnx_slice(dim: int, start: int, end: int, step: int) -> slice:
    """The Python slice for one ONNX Slice (start, end, step) on an axis of size ``dim``
    (negative values count from the end; out-of-range values clamp)."""
    if step == 0:
        raise ValueError("slice step is 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)
