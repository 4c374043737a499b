"""A one-function C library applying a float function elementwise in an ``omp simd`` loop, built
as tscomp builds kernels (its prelude and the math helpers the call needs), for the tests of the
vectorizable math helpers."""
from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess

import numpy as np

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.c_expr import PRELUDE, math_helpers


@functools.cache
def elementwise_library(call: str, helper: str, expr: str | None = None):
    """``(library path, run)``: ``run(x)`` returns ``call(x[i])`` (or the C ``expr`` of ``x[i]``) for
    every element of ``x`` (float32), computed by ``void <call>_all(x, y, n)``, whose source must
    have pulled in ``helper`` (the vectorizable function the call is redirected to: checked). Built
    once per process."""
    func = f"{call}_all"
    body = f"""
void {func}(const float* restrict x, float* restrict y, int64_t n)
{{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i)
        y[i] = {expr or f"{call}(x[i])"};
}}
"""
    source = PRELUDE + math_helpers(body) + body
    assert helper in source, f"{call} is not redirected to {helper}"
    path = build_library(source, func)
    fn = getattr(load_library(path), func)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def run(x):
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        fn(x.ctypes.data, y.ctypes.data, x.size)
        return y
    return path, run


def imported_symbols(path) -> str:
    """The dynamic symbols a library imports (``nm -D --undefined-only``), or None without nm."""
    if shutil.which("nm") is None:
        return None
    return subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True).stdout
