"""Weights packed at load (issue 10: the artifact stores each raw weight once; the panels are made
from it when the artifact is loaded, by each family's packer in :data:`tscomp.runtime.artifact.PACKERS`,
e.g. :func:`tscomp.codegen.cpu_gemm.prepack_weights`).

:func:`pack_all` packs a list of jobs on a few threads (numpy releases the GIL while copying).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor


def pack_all(jobs, workers: int = 2) -> list:
    """``[fn(*args) for fn, *args in jobs]``, on ``workers`` threads."""
    if len(jobs) <= 1 or workers <= 1:
        return [fn(*args) for fn, *args in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job[0](*job[1:]), jobs))


__all__ = ["pack_all"]
