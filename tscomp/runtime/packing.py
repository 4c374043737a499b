"""GEMM weight panels packed at load (issue 10: the artifact stores each raw weight once; every
tile configuration's panel layout is made from it when the artifact is loaded).

:func:`pack_gemm_panels` is :func:`tscomp.codegen.cpu_gemm.prepack_weights` (``nr``-column panels
over all of K, k-major, the columns zero-padded to a multiple of ``nr``; ``precision="bf16"``:
bfloat16 pairs along K, K zero-padded to a multiple of 32) on the stored float32 weight: one
strided copy per weight. The layout depends on ``nr`` (and the precision) alone, so a group's
variants with the same register-tile width share one copy.
:func:`pack_all` packs a list of jobs on a few threads (numpy releases the GIL while copying).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tscomp.codegen.cpu_gemm import prepack_weights


def pack_gemm_panels(W: np.ndarray, cfg, precision: str = "fp32") -> np.ndarray:
    return prepack_weights(np.asarray(W, dtype=np.float32), cfg, precision)


def pack_all(jobs, workers: int = 2) -> list:
    """``[fn(*args) for fn, *args in jobs]``, on ``workers`` threads."""
    if len(jobs) <= 1 or workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job[0](*job[1:]), jobs))


__all__ = ["pack_all", "pack_gemm_panels"]
