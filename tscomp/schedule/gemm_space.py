"""The loop-based model of the CPU GEMM macro-kernels as a search space (TSCompiler §5.1).

A GEMM ``Y[M, N] = X[M, K] · W[K, N]`` is tiled hierarchically: a block tile ⟨T_Mb, T_Nb, T_Kb⟩
is one parallel task (a GPU thread block; here one OpenMP task) that walks K at a stride of T_Kb,
and an instruction-level tile ⟨T_Mi, T_Ni⟩ is held in vector registers and updated with FMA. The
GPU's warp level has no CPU counterpart. The search space's axes are the tiling choices,
expressed relative to the hardware so that every value is *aligned* (§5.1's soft constraints:
T_Ni a whole number of SIMD vectors, T_Mb a whole number of register tiles, T_Kb a multiple of 8)::

    mr        T_Mi, rows of the register tile
    nr_vec    T_Ni / vector width
    mc_tiles  T_Mb / T_Mi
    n_parts   the padded N cut into this many T_Nb column blocks (constant weights, N static)
    nc_panels T_Nb / T_Ni                                        (batched GEMM, N often dynamic)
    k_steps   K cut into this many T_Kb blocks (K static)
    kc        T_Kb                                               (batched GEMM with a dynamic K)

The hard constraints prune (§5.1: resource limits that must not be exceeded): the accumulators fit
the register file, the packed operand blocks fit L2, a K block is at least 8 deep, N is not cut
finer than one register tile. Imperfect tiles are not a constraint: the macro-kernels use local
padding (DietCode §4.1).

Precision (issue 13) is read from the Target: at ``bf16`` the packed X block and the weight
panels hold 2-byte elements (the L2 constraint on the X block counts them so) and the register
tile's K step is 2 (an odd T_Kb of a split K is rounded up to even by the kernel's geometry, so
every point stays valid); the accumulators and so the register constraint are unchanged (fp32).
On a CPU with AMX (``Target.gemm_isa == "amx"``) the register tile is whole 16x16 accumulator tiles:
``mr`` is 16 or 32 rows, at most 4 accumulator tiles (so A and B tiles keep registers), and K blocks
are whole 32-deep tile steps.

The initial population is today's hardware-aligned heuristic (:func:`tscomp.codegen.tile_config.
candidate_configs` and the batched family's list) — Roller-style tiles that saturate a core —
instantiated, as §5.1 says, on a large static shape.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

from tscomp.codegen.tile_config import (MAX_ACCUMULATORS, OPERAND_BYTES, VECTOR_WIDTH, CacheSizes, TileConfig,
                                       TileConfigError, amx_k)
from tscomp.schedule.space import Axis, Constraint, DiscreteSpace
from tscomp.schedule.target import CpuSpec, Target, TargetError

MR_VALUES = (1, 2, 3, 4, 6, 8, 12)
#: AMX register tiles are whole 16-row tiles (1 or 2 A tiles), K blocks whole tile steps (32 bf16, 64 int8 deep)
AMX_MR_VALUES = (16, 32)
NR_VEC_VALUES = (1, 2, 3, 4)
#: independent FMA chains a register tile needs: fewer leaves the FMA pipes idle for the latency
MIN_CHAINS = 4
#: up to 32 register tiles of rows: a tall row block streams cold weights once for more rows
MC_TILES = (1, 2, 4, 8, 16, 32)
N_PARTS = (1, 2, 4, 8)
NC_PANELS = (1, 2, 4, 8)
K_STEPS = (1, 2, 4)
KC_VALUES = (32, 64, 128, 256)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _balanced(total: int, parts: int, align: int) -> int:
    """Block size that cuts ``total`` into ``parts`` near-equal blocks, rounded up to ``align``."""
    return _round_up(math.ceil(total / max(1, parts)), align)


def _cpu(target: Target) -> CpuSpec:
    if not isinstance(target.spec, CpuSpec):
        raise TargetError(f"the CPU GEMM search space needs a CPU target, got {target.key()}")
    return target.spec


def _caches(spec: CpuSpec) -> CacheSizes:
    return CacheSizes(l1=spec.l1, l2=spec.l2, l3=spec.l3)


# ---------------------------------------------------------------------------- constant-weight GEMM
class GemmSpace(DiscreteSpace):
    """Tilings of a constant-weight GEMM with static K, N and a dynamic M (at most ``m_max``)."""

    def __init__(self, K: int, N: int, target: Target, *, m_max: int | None = None, name: str = "gemm"):
        self.K, self.N, self.target = int(K), int(N), target
        spec = _cpu(target)
        self.spec = spec
        self.m_max = m_max
        self.isa = isa = target.gemm_isa       # bf16 (and int8) on a CPU with AMX: the tile unit
        self.k_align = amx_k(target.precision) if isa == "amx" else 8
        W = VECTOR_WIDTH[isa]
        axes = (Axis("mr", AMX_MR_VALUES if isa == "amx" else MR_VALUES), Axis("nr_vec", NR_VEC_VALUES),
                Axis("mc_tiles", MC_TILES), Axis("n_parts", N_PARTS), Axis("k_steps", K_STEPS))
        max_acc = MAX_ACCUMULATORS[isa]
        l2 = spec.l2
        a_bytes = OPERAND_BYTES[target.precision]        # X is packed as bf16 pairs at bf16, bytes at int8
        constraints = [
            Constraint("registers", lambda p: p["mr"] * p["nr_vec"] <= max_acc,
                       f"the mr x nr accumulator tile fits the register file ({max_acc} {isa} accumulators)"),
            Constraint("fma-chains", lambda p: p["mr"] * p["nr_vec"] >= MIN_CHAINS,
                       f"at least {MIN_CHAINS} accumulators (independent FMA chains)"),
            Constraint("n-blocks", lambda p: p["n_parts"] * p["nr_vec"] * W <= _round_up(self.N, p["nr_vec"] * W),
                       "N is not cut finer than one register tile per block"),
            Constraint("k-depth", lambda p: p["k_steps"] == 1 or self.K / p["k_steps"] >= self.k_align,
                       f"a K block is at least {self.k_align} deep"),
            Constraint("l2-a-block", lambda p: a_bytes * self.tile(p).mc * self.tile(p).kc <= l2 // 2,
                       "the packed mc x kc block of X fits half of L2"),
            Constraint("l2-partial-sums", lambda p: p["k_steps"] == 1 or 4 * self.tile(p).mc * self.tile(p).nc <= l2,
                       "with several K steps, the mc x nc partial sums fit L2"),
        ]
        if m_max is not None:
            constraints.append(Constraint("m-block", lambda p: p["mr"] * p["mc_tiles"] <= _round_up(m_max, p["mr"]),
                                          f"a block is not taller than the largest M ({m_max})"))
        self.axes = tuple(axes)              # point_of snaps to them before the base class is set up
        initial = [self.point_of(c) for c in self._heuristic()]
        super().__init__(axes, constraints, [p for p in initial if p is not None],
                         name=f"{name}[K={K},N={N}]@{target.key()}")

    def tile(self, p: Mapping[str, int]) -> TileConfig:
        """The TileConfig of a point (block sizes balanced over the extents)."""
        W = VECTOR_WIDTH[self.isa]
        mr, nr = int(p["mr"]), int(p["nr_vec"]) * W
        np_ = _round_up(self.N, nr)
        nc = min(np_, _balanced(np_, int(p["n_parts"]), nr))
        kc = self.K if int(p["k_steps"]) == 1 else min(self.K, _balanced(self.K, int(p["k_steps"]), self.k_align))
        return TileConfig(mr=mr, nr=nr, mc=mr * int(p["mc_tiles"]), nc=nc, kc=kc)

    def point_of(self, cfg: TileConfig) -> dict[str, int] | None:
        """The nearest point of this space to a TileConfig from elsewhere (the heuristic), or None."""
        W = VECTOR_WIDTH[self.isa]
        if cfg.nr % W:
            return None
        np_ = _round_up(self.N, cfg.nr)
        parts = max(1, round(np_ / max(cfg.nc, 1)))
        steps = max(1, round(self.K / max(cfg.kc, 1)))
        mc_tiles = max(1, cfg.mc // cfg.mr)
        if self.m_max is not None:          # a block no taller than the largest M (the m-block constraint)
            mc_tiles = min(mc_tiles, -(-self.m_max // cfg.mr))
        raw = {"mr": cfg.mr, "nr_vec": cfg.nr // W, "mc_tiles": mc_tiles, "n_parts": parts, "k_steps": steps}
        return _snap(raw, self.axes)

    def _heuristic(self) -> list[TileConfig]:
        from tscomp.codegen.tile_config import candidate_configs
        try:
            return candidate_configs(self.isa, self.K, self.N, caches=_caches(self.spec))
        except TileConfigError:
            return []

    def config(self, p: Mapping[str, int]) -> TileConfig:
        return self.tile(p).validate(self.isa)


# ---------------------------------------------------------------------------- batched GEMM
class BatchedGemmSpace(DiscreteSpace):
    """Tilings of a batched GEMM whose M, N, K may each be static (an int) or dynamic (``None``,
    with ``hints`` giving a typical value for the initial population)."""

    def __init__(self, M: int | None, N: int | None, K: int | None, target: Target, *, name: str = "batched-gemm"):
        self.M, self.N, self.K, self.target = M, N, K, target
        spec = _cpu(target)
        self.spec = spec
        self.isa = isa = self._tile_isa()
        axes = [Axis("mr", AMX_MR_VALUES if isa == "amx" else MR_VALUES), Axis("nr_vec", NR_VEC_VALUES),
                Axis("mc_tiles", MC_TILES[:4]), Axis("nc_panels", NC_PANELS)]
        axes.append(Axis("k_steps", K_STEPS) if K is not None else Axis("kc", KC_VALUES))
        axes += self._extra_axes()
        max_acc = MAX_ACCUMULATORS[isa]
        W, l2 = spec.vector_width, spec.l2
        constraints = [
            Constraint("registers", lambda p: p["mr"] * p["nr_vec"] <= max_acc,
                       f"the mr x nr accumulator tile fits the register file ({max_acc} {isa} accumulators)"),
            Constraint("fma-chains", lambda p: p["mr"] * p["nr_vec"] >= MIN_CHAINS,
                       f"at least {MIN_CHAINS} accumulators (independent FMA chains)"),
            Constraint("l2-blocks", lambda p: 4 * (self.tile(p).mc + self.tile(p).nc) * self.tile(p).kc <= l2,
                       "the packed A block (mc x kc) and B block (kc x nc) fit L2"),
        ]
        if K is not None:
            constraints.append(Constraint("k-depth", lambda p: p["k_steps"] == 1 or K / p["k_steps"] >= 8,
                                          "a K block is at least 8 deep"))
        if N is not None:
            constraints.append(Constraint("n-block", lambda p: p["nc_panels"] == 1 or
                                          p["nc_panels"] * p["nr_vec"] * W <= _round_up(N, p["nr_vec"] * W),
                                          "a column block is not wider than the padded N"))
        if M is not None:
            constraints.append(Constraint("m-block", lambda p: p["mc_tiles"] == 1 or
                                          self.tile(p).mc <= _round_up(M, self.tile(p).mr),
                                          "a row block is not taller than the padded M"))
        self.axes = tuple(axes)
        initial = [self.point_of(c) for c in self._heuristic()]
        dims = ",".join(f"{n}={'?' if v is None else v}" for n, v in (("M", M), ("N", N), ("K", K)))
        super().__init__(axes, constraints, [p for p in initial if p is not None],
                         name=f"{name}[{dims}]@{target.key()}")

    def _extra_axes(self) -> list[Axis]:
        """Axes a subclass adds to the batched GEMM's (none here)."""
        return []

    def _tile_isa(self) -> str:
        """The instruction set of the register tile (a subclass may run its tiles on AMX)."""
        return self.spec.isa

    def tile(self, p: Mapping[str, int]) -> TileConfig:
        W = self.spec.vector_width
        mr, nr = int(p["mr"]), int(p["nr_vec"]) * W
        if "k_steps" in p:
            kc = self.K if int(p["k_steps"]) == 1 else min(self.K, _balanced(self.K, int(p["k_steps"]), 8))
        else:
            kc = int(p["kc"])
        return TileConfig(mr=mr, nr=nr, mc=mr * int(p["mc_tiles"]), nc=nr * int(p["nc_panels"]), kc=kc)

    def point_of(self, cfg: TileConfig) -> dict[str, int] | None:
        W = self.spec.vector_width
        if cfg.nr % W:
            return None
        raw = {"mr": cfg.mr, "nr_vec": cfg.nr // W, "mc_tiles": max(1, cfg.mc // cfg.mr),
               "nc_panels": max(1, cfg.nc // cfg.nr)}
        if self.K is not None:
            raw["k_steps"] = max(1, round(self.K / max(1, cfg.kc)))
        else:
            raw["kc"] = cfg.kc
        return _snap(raw, self.axes)

    def _heuristic(self) -> list[TileConfig]:
        from tscomp.codegen.cpu_batched_gemm import candidate_configs
        try:
            return candidate_configs(self.isa, self.M, self.N, self.K, caches=_caches(self.spec))
        except TileConfigError:
            return []

    def config(self, p: Mapping[str, int]) -> TileConfig:
        return self.tile(p).validate(self.isa)


def _snap(raw: Mapping[str, int], axes: Iterable[Axis]) -> dict[str, int]:
    """Each coordinate moved to the nearest value its axis offers (in log scale: tile sizes are
    multiplicative quantities)."""
    out = {}
    for ax in axes:
        v = max(1, int(raw[ax.name]))
        out[ax.name] = min(ax.values, key=lambda a: (abs(math.log(a) - math.log(v)), a))
    return out


__all__ = ["BatchedGemmSpace", "GemmSpace"]
