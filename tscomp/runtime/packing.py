"""GEMM weight panels packed at load (issue 10: the artifact stores each raw weight once; every
tile configuration's panel layout is made from it when the artifact is loaded).

:func:`pack_gemm_panels` gives exactly :func:`tscomp.codegen.cpu_gemm.prepack_weights`'s layout
(``nr``-column panels over all of K, k-major; the columns zero-padded to a multiple of ``nr``) with
one strided copy of the full panels and a small one for the padded last panel, instead of a padded
copy of W first. The layout depends on ``nr`` (and the precision) alone, so a group's variants with
the same register-tile width pack to the same bytes and share one copy.
:func:`pack_all` packs a list of jobs on a few threads (numpy releases the GIL while copying).

``precision="bf16"`` (issue 13) packs the same panels as bfloat16 pairs along K, the VDPBF16PS
layout of :func:`tscomp.codegen.cpu_gemm.prepack_weights` (weights rounded to nearest even, K
zero-padded to a multiple of 32 rows, one AMX tile's depth): a uint16 array of about half the fp32
panels' bytes.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tscomp.codegen.cpu_gemm import GemmError, _aligned_empty, _Geometry, to_bf16_bits


def pack_gemm_panels(W: np.ndarray, cfg, precision: str = "fp32") -> np.ndarray:
    W = np.asarray(W, dtype=np.float32)
    if W.ndim != 2:
        raise GemmError(f"weight must be 2-D [K, N], got shape {W.shape}")
    K, N = (int(d) for d in W.shape)
    g = _Geometry.of(cfg, K, N, precision)
    if precision == "bf16":
        return _pack_bf16_panels(W, g)
    out = _aligned_empty(g.K * g.NP)
    full, rest = divmod(N, g.NR)
    panels = out.reshape(g.NP // g.NR, K, g.NR)
    if full:
        np.copyto(panels[:full], W[:, :full * g.NR].reshape(K, full, g.NR).transpose(1, 0, 2))
    if rest:                                        # the last panel: its columns past N are zeros
        panels[full] = 0.0
        panels[full, :, :rest] = W[:, full * g.NR:]
    return out


def _pack_bf16_panels(W: np.ndarray, g) -> np.ndarray:
    """The bf16 pair layout: per panel of ``nr`` columns, K's pair-rows (K zero-padded to
    ``BF16_K_BLOCK``), each ``nr`` lanes of (row k, row k + 1)."""
    bits = np.zeros((g.KP, g.NP), np.uint16)
    bits[:g.K, :g.N] = to_bf16_bits(W)
    out = _aligned_empty(g.KP * g.NP, dtype=np.uint16)
    # [q, 2, panel, nr] -> [panel, q, nr, 2]
    np.copyto(out.reshape(g.NP // g.NR, g.KP // 2, g.NR, 2),
              bits.reshape(g.KP // 2, 2, g.NP // g.NR, g.NR).transpose(2, 0, 3, 1))
    return out


def pack_all(jobs, workers: int = 2) -> list:
    """``[fn(*args) for fn, *args in jobs]``, on ``workers`` threads."""
    if len(jobs) <= 1 or workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job[0](*job[1:]), jobs))


__all__ = ["pack_all", "pack_gemm_panels"]
