"""Per-thread scratch memory for the generated CPU kernels: a buffer each thread keeps across calls.

A kernel's packing buffers (a Conv's gathered block, attention's packed Kᵀ/V and score block, a
batched GEMM's A and B panels) are taken from the calling thread's workspace instead of
``aligned_alloc``/``free`` on every call: a call allocates nothing (at tiny shapes the allocator's
round trips were ~20% of an attention call), and every shape and every variant of every kernel
reuses the same, cache-warm lines, where a fresh allocation of another size may land elsewhere.

The workspace is a weak symbol, so every kernel linked into one library shares one buffer per
thread (groups run one at a time): the memory held is the largest single need, not the sum over
kernels. It only grows; a thread's buffer lives as long as the thread.
"""
from __future__ import annotations

from typing import Sequence

#: the per-thread workspace every kernel shares
THREAD_WORKSPACE = "tscomp_thread_workspace"


def thread_workspace_c(function: str = THREAD_WORKSPACE) -> str:
    """C of ``float* <function>(size_t floats)``: the calling thread's buffer of at least that many
    floats, 64-byte aligned (NULL where it cannot be had)."""
    return f"""\
__attribute__((weak)) float* {function}(size_t floats)
{{
    static __thread float* buf = NULL;
    static __thread size_t cap = 0;
    if (floats > cap) {{
        free(buf);
        buf = (float*)aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        cap = buf ? floats : 0;
    }}
    return buf;
}}
"""


WORKSPACE_C = thread_workspace_c()


def carve_c(buffers: Sequence[tuple[str, str, str]], indent: str = "        ",
            function: str = THREAD_WORKSPACE) -> str:
    """C that declares ``<ctype>* <name>`` for each ``(ctype, name, count)`` as consecutive pieces of
    one workspace request, each piece a whole number of 64-byte lines (so every piece is as aligned
    as ``aligned_alloc(64, ...)`` made it). ``count`` is a C expression in elements of ``ctype``.
    List the buffers whose size does not depend on the shape first: their place then does not move
    between shapes, so a new shape finds them where the last one left them, in cache."""
    sizes = [f"ts_ws_{name.removeprefix('ts_')}" for _, name, _ in buffers]
    lines = [f"/* per-thread buffers, carved from this thread's workspace ({function}): nothing allocated per call */"]
    lines += [f"const size_t {size} = ((size_t)(sizeof({ctype}) * ({count})) + 63) / 64 * 64;"
              for size, (ctype, _, count) in zip(sizes, buffers)]
    lines.append(f"char* ts_ws = (char*){function}(({' + '.join(sizes)}) / sizeof(float));")
    for i, (ctype, name, _) in enumerate(buffers):
        offset = " + ".join(sizes[:i]) or "0"
        lines.append(f"{ctype}* {name} = ({ctype}*)(ts_ws + {offset});")
    return "".join(f"{indent}{line}\n" for line in lines)
