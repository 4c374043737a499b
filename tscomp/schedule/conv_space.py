"""The implicit-GEMM Conv macro-kernel's tilings as a search space (TSCompiler §5.1, loop-based model).

A Conv group of the ``conv`` family (:mod:`tscomp.codegen.cpu_conv`) is, per image and channel
group, the GEMM ``[OCg, K] · [K, P]``: OCg output channels and K = Cg·KH·KW are static, the number
of output positions P = OH·OW is dynamic. That is the shape of the batched GEMM's space with a
static M and K and a dynamic N, so the axes and the hard constraints are
:class:`~tscomp.schedule.gemm_space.BatchedGemmSpace`'s (``mr``, ``nr_vec``, ``mc_tiles``,
``nc_panels``, ``k_steps``; the accumulators fit the register file, the weight block and the
gathered column block fit L2, a K block is at least 8 deep, a channel block is not taller than the
padded OCg); the hardware-aligned initial population is the Conv family's own heuristic
(:func:`~tscomp.codegen.cpu_conv.conv_candidate_configs`).
"""
from __future__ import annotations

from tscomp.codegen.tile_config import TileConfig, TileConfigError
from tscomp.schedule.gemm_space import BatchedGemmSpace, _caches
from tscomp.schedule.target import Target


class ConvSpace(BatchedGemmSpace):
    """Tilings of an implicit-GEMM Conv with ``OCg`` channels per group and reduction depth ``K``."""

    def __init__(self, OCg: int, K: int, target: Target):
        super().__init__(int(OCg), None, int(K), target, name="conv")

    def _heuristic(self) -> list[TileConfig]:
        from tscomp.codegen.cpu_conv import conv_candidate_configs
        try:
            return conv_candidate_configs(self.spec.isa, self.M, self.K, caches=_caches(self.spec))
        except TileConfigError:
            return []


__all__ = ["ConvSpace"]
