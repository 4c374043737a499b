"""The attention family's search space (TSCompiler §5.1's loop-based model for the fused
QKᵀ → softmax → P·V kernel of :mod:`tscomp.codegen.cpu_attention`).

Axes: the register tile's rows ``mr`` (T_Mi), the key block in vectors ``nj_vec`` (T_Nb / vector
width: the S tile's width and the P·V reduction step), the query block in register tiles
``mb_tiles`` (T_Mb / T_Mi: one task's rows, over which each packed key block is reused) and the
softmax chunk in key blocks ``chunk_blocks`` (T_Nc / T_Nb: the keys whose scores are held at once,
so that the softmax's per-row bookkeeping is paid once per chunk).
On a CPU with AMX at ``--precision bf16`` the register tile is one 16-row AMX tile and key blocks are
32 or 64 keys (whole 32-key TDPBF16PS steps, at most 4 accumulator tiles).
Hard constraints: the S tile and the P·V tile fit the accumulator registers; the per-thread blocks
(Q rows, Kᵀ and V blocks, S and O tiles) fit half of L2, so a task's working set stays on its core;
a query block is not taller than the padded query count when that count is static.
"""
from __future__ import annotations

from typing import Mapping

from tscomp.codegen.cpu_attention import AMX_ROWS, MAX_CHUNK_BLOCKS
from tscomp.codegen.tile_config import TileConfig
from tscomp.schedule.gemm_space import _cpu, _round_up, _snap
from tscomp.schedule.space import Axis, Constraint, DiscreteSpace
from tscomp.schedule.target import Target

MR_VALUES = (1, 2, 3, 4, 6, 8)
NJ_VEC_VALUES = (1, 2, 4, 6, 8)
MB_TILES = (1, 2, 4, 8, 16)
CHUNK_BLOCKS = tuple(2 ** i for i in range(MAX_CHUNK_BLOCKS.bit_length()))     # 1 .. 64


class AttentionSpace(DiscreteSpace):
    def __init__(self, analysis, target: Target):
        from tscomp.codegen.cpu_attention import tile_fits

        from tscomp.codegen.families import attention_isa

        spec = _cpu(target)
        self.analysis, self.spec = analysis, spec
        # bf16 on AMX: 16-row tiles, key blocks of whole 32-key steps (tile_fits says which)
        isa = self.isa = attention_isa(target)
        W = spec.vector_width
        DK, DV = analysis.DK, analysis.DV
        M = analysis.hints()[0] if not _dynamic(analysis.M) else None
        N = analysis.hints()[1]       # the key count, or its upper bound (at most 512) when dynamic
        axes = [Axis("mr", (AMX_ROWS,) if isa == "amx" else MR_VALUES), Axis("nj_vec", NJ_VEC_VALUES), Axis("mb_tiles", MB_TILES),
                Axis("chunk_blocks", CHUNK_BLOCKS)]

        def block_bytes(p) -> int:
            mb, nj = p["mr"] * p["mb_tiles"], p["nj_vec"] * W
            nc = nj * p["chunk_blocks"]
            return 4 * (mb * DK + DK * nj + nj * _round_up(DV, W) + mb * nc + mb * _round_up(DV, W))
        constraints = [
            Constraint("registers", lambda p: tile_fits(isa, p["mr"], p["nj_vec"] * W, DV),
                       "the S tile (mr x key block) and the P.V tile fit the accumulator registers"),
            Constraint("l2-blocks", lambda p: block_bytes(p) <= spec.l2 // 2,
                       "a task's Q rows, key blocks, S chunk and O tile fit half of L2"),
            Constraint("chunk", lambda p: p["chunk_blocks"] == 1 or
                       (p["chunk_blocks"] // 2) * p["nj_vec"] * W < _round_up(N, p["nj_vec"] * W),
                       "a softmax chunk is no wider than the keys (their bound when dynamic) need: half of it "
                       "would not hold them"),
        ]
        if M is not None:
            constraints.append(Constraint("m-block", lambda p: p["mb_tiles"] == 1 or
                                          p["mr"] * p["mb_tiles"] <= _round_up(M, p["mr"]),
                                          "a query block is not taller than the padded query count"))
        self.axes = tuple(axes)
        initial = [self.point_of(c) for c in analysis.heuristic_configs(isa, 8, l2=spec.l2)]
        super().__init__(axes, constraints, [p for p in initial if p is not None],
                         name=f"attention[DK={DK},DV={DV}]@{target.key()}")

    def tile(self, p: Mapping[str, int]) -> TileConfig:
        W = self.spec.vector_width
        mr, nj = int(p["mr"]), int(p["nj_vec"]) * W
        return TileConfig(mr=mr, nr=nj, mc=mr * int(p["mb_tiles"]), nc=nj * int(p["chunk_blocks"]), kc=self.analysis.DK)

    def point_of(self, cfg: TileConfig) -> dict[str, int] | None:
        W = self.spec.vector_width
        if cfg.nr % W:
            return None
        return _snap({"mr": cfg.mr, "nj_vec": cfg.nr // W, "mb_tiles": max(1, cfg.mc // cfg.mr),
                      "chunk_blocks": max(1, cfg.nc // cfg.nr)}, self.axes)

    def config(self, p: Mapping[str, int]) -> TileConfig:
        return self.tile(p)


def _dynamic(x) -> bool:
    import sympy
    return not sympy.sympify(x).is_Integer


__all__ = ["AttentionSpace"]
