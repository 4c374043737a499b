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

One axis is the Conv's own: ``vector_axis``, which of the output tile's axes the SIMD lanes run
along -- 1, the positions (``nr_vec`` vectors of positions times ``mr`` broadcast channel rows), or
0, the channels (``nr_vec`` vectors of channels times ``mr`` broadcast positions: few positions,
as in a late stage of a small image, waste no padded lanes). ``mr`` and ``nr_vec`` keep their
meaning as the broadcast count and the vector count of the register tile, so the register
constraints hold for both.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from tscomp.codegen.tile_config import TileConfig, TileConfigError
from tscomp.schedule.gemm_space import BatchedGemmSpace, _caches, _snap
from tscomp.schedule.space import Axis
from tscomp.schedule.target import Target

#: the lanes along the output positions (1) or along the output channels (0)
VECTOR_AXES = (1, 0)


class ConvSpace(BatchedGemmSpace):
    """Tilings of an implicit-GEMM Conv with ``OCg`` channels per group and reduction depth ``K``."""

    def __init__(self, OCg: int, K: int, target: Target):
        super().__init__(int(OCg), None, int(K), target, name="conv")

    def _extra_axes(self) -> list[Axis]:
        # int8 tiles (a quantized Conv's VPDPBUSD or AMX kernels) run their lanes along the positions only
        return [Axis("vector_axis", (1,) if self.target.precision == "int8" else VECTOR_AXES)]

    def _tile_isa(self) -> str:
        # int8 tiles on AMX where the CPU's tiles do int8: whole 16x16 tiles (mr 16 or 32, at most 4 accumulators)
        from tscomp.codegen.families import conv_tile_isa
        return conv_tile_isa(self.target)

    def tile(self, p: Mapping[str, int]) -> TileConfig:
        cfg = super().tile(p)       # rows = mr broadcast channels, columns = nr_vec vectors of positions
        if int(p.get("vector_axis", 1)) == 1:
            return cfg
        # the same register tile transposed: nr_vec vectors of channels (rows) x mr broadcast positions
        return dataclasses.replace(cfg, mr=cfg.nr, nr=cfg.mr, mc=cfg.nr * int(p["mc_tiles"]),
                                   nc=cfg.mr * int(p["nc_panels"]), vector_axis=0)

    def point_of(self, cfg: TileConfig) -> dict[str, int] | None:
        W = self.spec.vector_width
        broadcast, vectors = (cfg.mr, cfg.nr) if cfg.vector_axis == 1 else (cfg.nr, cfg.mr)
        if vectors % W:
            return None
        raw = {"mr": broadcast, "nr_vec": vectors // W, "mc_tiles": max(1, cfg.mc // cfg.mr),
               "nc_panels": max(1, cfg.nc // cfg.nr), "k_steps": max(1, round(self.K / max(1, cfg.kc)))}
        sizes = [ax for ax in self.axes if ax.name != "vector_axis"]     # snapped in log scale
        return {**_snap(raw, sizes), "vector_axis": cfg.vector_axis}

    def config(self, p: Mapping[str, int]) -> TileConfig:
        return self.tile(p).validate(self.isa, row_vectors=True)

    def _heuristic(self) -> list[TileConfig]:
        from tscomp.codegen.cpu_conv import conv_candidate_configs
        try:
            return conv_candidate_configs(self.isa, self.M, self.K, caches=_caches(self.spec))
        except TileConfigError:
            return []


__all__ = ["ConvSpace"]
