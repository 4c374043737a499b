"""The per-thread workspace and the buffers carved from it (tscomp.codegen.workspace)."""
from __future__ import annotations

import ctypes

import numpy as np

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.workspace import WORKSPACE_C, carve_c

#: three buffers as a kernel declares them: two of fixed size, then one that follows a runtime count
_BUFFERS = [("float", "ts_a", "5"), ("uint16_t", "ts_b", "33"), ("double", "ts_c", "n")]


def _carving_library():
    source = ("#include <stdint.h>\n#include <stdlib.h>\n" + WORKSPACE_C +
              "void carve(int64_t n, int64_t* out)\n{\n" + carve_c(_BUFFERS, indent="    ") +
              "    out[0] = (int64_t)ts_a; out[1] = (int64_t)ts_b; out[2] = (int64_t)ts_c;\n"
              "    for (int64_t i = 0; i < n; ++i) ts_c[i] = (double)i;   /* the whole last piece is writable */\n}\n")
    lib = load_library(build_library(source, "test_workspace_carve"))
    lib.carve.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    return lib


def _carve(lib, n: int) -> np.ndarray:
    out = np.zeros(3, dtype=np.int64)
    lib.carve(n, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)))
    return out


def test_carved_buffers_are_line_aligned_consecutive_and_do_not_overlap():
    lib = _carving_library()
    a, b, c = _carve(lib, 1000)
    assert a % 64 == 0 and b % 64 == 0 and c % 64 == 0
    assert b - a == 64            # 5 floats: one whole line
    assert c - b == 128           # 33 uint16: 66 bytes, two lines


def test_a_call_reuses_the_threads_buffer_and_grows_it_only_when_it_needs_more():
    lib = _carving_library()
    first = _carve(lib, 4000)
    assert (_carve(lib, 10) == first).all()           # smaller need: the same memory, nothing allocated
    grown = _carve(lib, 1 << 20)                      # 8 MiB more than it holds: a new, larger buffer
    assert grown[1] - grown[0] == 64 and grown[2] - grown[1] == 128
    assert (_carve(lib, 4000) == grown).all()         # and that one is kept
