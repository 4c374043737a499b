"""GEMM weight panels packed at load (issue 10: the artifact stores each raw weight once; every
tile configuration's panel layout is made from it when the artifact is loaded).

:func:`pack_gemm_panels` gives exactly :func:`tscomp.codegen.cpu_gemm.prepack_weights`'s layout
(columns zero-padded to a multiple of ``nr``; per column block of ``nc``, per row block of ``kc``,
the ``nr``-wide panels k-major) with one strided copy per column block instead of one padded copy
plus two copies per block: BERT-base's 192 GEMM variants pack in about a second, not six.
:func:`pack_all` packs a list of jobs on a few threads (numpy releases the GIL while copying).

``precision="bf16"`` (issue 13) packs the same blocks as bfloat16 pairs along K, the VDPBF16PS layout
of :func:`tscomp.codegen.cpu_gemm.prepack_weights` (weights rounded to nearest even, each K block
zero-padded to a multiple of 32 rows, one AMX tile's depth): a uint16 array of about half the fp32
panels' bytes.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tscomp.codegen.cpu_gemm import BF16_K_BLOCK, GemmError, _aligned_empty, _Geometry, _round_up, to_bf16_bits


def pack_gemm_panels(W: np.ndarray, cfg, precision: str = "fp32") -> np.ndarray:
    W = np.asarray(W, dtype=np.float32)
    if W.ndim != 2:
        raise GemmError(f"weight must be 2-D [K, N], got shape {W.shape}")
    K, N = (int(d) for d in W.shape)
    g = _Geometry.of(cfg, K, N, precision)
    if precision == "bf16":
        return _pack_bf16_panels(W, g)
    out = _aligned_empty(g.K * g.NP)
    nfull, rest = divmod(K, g.KC)
    pos = 0
    for j0 in range(0, g.NP, g.NC):
        nw = min(g.NC, g.NP - j0)
        cols = W[:, j0:j0 + nw]
        if cols.shape[1] < nw:                     # the last block: pad the columns with zeros
            padded = np.zeros((K, nw), np.float32)
            padded[:, :cols.shape[1]] = cols
            cols = padded
        seg = out[pos:pos + K * nw]
        p = nw // g.NR
        if nfull:
            src = cols[:nfull * g.KC].reshape(nfull, g.KC, p, g.NR).transpose(0, 2, 1, 3)
            np.copyto(seg[:nfull * g.KC * nw].reshape(nfull, p, g.KC, g.NR), src)
        if rest:
            src = cols[nfull * g.KC:].reshape(rest, p, g.NR).transpose(1, 0, 2)
            np.copyto(seg[nfull * g.KC * nw:].reshape(p, rest, g.NR), src)
        pos += K * nw
    return out


def _pack_bf16_panels(W: np.ndarray, g) -> np.ndarray:
    """The bf16 pair layout: per column block, per K block of ``kl`` rows zero-padded to a multiple of
    ``BF16_K_BLOCK``, ``nw / nr`` panels of its pair-rows, each ``nr`` lanes of (row k, row k + 1)."""
    bits = np.zeros((g.KP, g.NP), np.uint16)
    bits[:g.K, :g.N] = to_bf16_bits(W)
    out = _aligned_empty(g.KP * g.NP, dtype=np.uint16)
    # full blocks are whole multiples of BF16_K_BLOCK; a KC that is not is the one, whole K block
    nfull, rest = divmod(g.K, g.KC) if g.KC % BF16_K_BLOCK == 0 else (0, g.K)
    rest2 = _round_up(rest, BF16_K_BLOCK)
    pos = 0
    for j0 in range(0, g.NP, g.NC):
        nw = min(g.NC, g.NP - j0)
        p = nw // g.NR
        cols = bits[:, j0:j0 + nw]
        seg = out[pos:pos + g.KP * nw]
        if nfull:       # [kblock, q, 2, panel, nr] -> [kblock, panel, q, nr, 2]
            src = cols[:nfull * g.KC].reshape(nfull, g.KC // 2, 2, p, g.NR).transpose(0, 3, 1, 4, 2)
            np.copyto(seg[:nfull * g.KC * nw].reshape(nfull, p, g.KC // 2, g.NR, 2), src)
        if rest:
            src = cols[nfull * g.KC:nfull * g.KC + rest2].reshape(rest2 // 2, 2, p, g.NR).transpose(2, 0, 3, 1)
            np.copyto(seg[nfull * g.KC * nw:].reshape(p, rest2 // 2, g.NR, 2), src)
        pos += g.KP * nw
    return out


def pack_all(jobs, workers: int = 2) -> list:
    """``[fn(*args) for fn, *args in jobs]``, on ``workers`` threads."""
    if len(jobs) <= 1 or workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job[0](*job[1:]), jobs))


__all__ = ["pack_all", "pack_gemm_panels"]
