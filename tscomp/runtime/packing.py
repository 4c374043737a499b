"""Weights packed at load (issue 10: the artifact stores each raw weight once; the panels are made
from it when the artifact is loaded, by each family's packer in :data:`PACKERS`, e.g.
:func:`tscomp.codegen.cpu_gemm.prepack_weights`), and which packed copy of a weight a kernel
variant reads (:func:`copy_key`: variants of one layout share one array).

:func:`pack_all` packs a list of jobs on a few threads (numpy releases the GIL while copying).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np


#: how a family's prepacked weight is made from its raw weight (packed at load: the artifact
#: stores the raw weight once, however many tile configurations pack it)
def _analysis_weight(kernel):
    """The raw constant weight the kernel's analysis read (GEMM: W[K, N]; Conv: W[OC, C / G, *k])."""
    analysis = kernel.__dict__.get("analysis")
    return None if analysis is None else analysis.__dict__.get("W")


def _own_pack(kernel, raw):
    return kernel.pack_weight(raw)


def _own_layout(kernel) -> tuple:
    return kernel.weight_layout()


#: family -> (raw weight of a kernel, pack it, what the packed layout depends on: kernels of one raw
#: weight that agree on it share one copy, packed once at load). Each family's kernels know their
#: own layout (``weight_layout``: a GEMM's register-tile width and precision, a Conv's MR-row
#: panels, channel blocks of one vector or plain rows) and pack a raw weight into it (``pack_weight``)
_OWN = (_analysis_weight, _own_pack, _own_layout)
PACKERS = {family: _OWN for family in ("gemm", "conv", "conv-depthwise", "conv-transpose")}


def copy_key(kernel) -> tuple | None:
    """Which packed copy of a weight a variant reads (None: it reads none): variants with equal
    keys read one array at run time. A :data:`PACKERS` family's copy is its raw weight's name and
    its layout (the same before and after an artifact round trip); any other family's is the
    array itself."""
    packed = getattr(kernel, "packed", None)
    if not isinstance(packed, np.ndarray) or packed.size == 0:
        return None
    packer, name = PACKERS.get(kernel.family), getattr(kernel, "weight_name", None)
    if packer is not None and name is not None:
        return "layout", name, kernel.family, packer[2](kernel)
    return "array", packed.ctypes.data


def pack_all(jobs, workers: int = 2) -> list:
    """``[fn(*args) for fn, *args in jobs]``, on ``workers`` threads."""
    if len(jobs) <= 1 or workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job[0](*job[1:]), jobs))


__all__ = ["PACKERS", "copy_key", "pack_all"]
