"""The CUDA target's GEMM tile space and its analytic ranking (no GPU here, so nothing is measured:
TSCompiler §5.1 tiling hierarchy, §6 wave model; FTuner §III-IV analytic uKernel selection;
DietCode's f_occ · f_pad cost terms).

Space: block ⟨T_Mb, T_Nb, T_Kb⟩, warp ⟨T_Mw, T_Nw⟩, thread ⟨T_Mi, T_Ni⟩ (a warp's 32 threads tile
the warp tile), plain or cp.async double-buffered staging. Hard constraints from the target's
:class:`~tscomp.schedule.target.GpuSpec` prune: threads per block, static shared memory per block,
estimated registers per thread (≤ the per-thread maximum and, times the threads, ≤ the per-block
file; a configuration whose estimate would spill is dropped — ptxas confirms at build time), and at
least one resident block per SM.

Model, per configuration and concrete M (K, N static):

* blocks(M) = ⌈M/T_Mb⌉·⌈N/T_Nb⌉; blocks per wave = the spec's occupancy formula × SMs (§6);
* one block's time = max(compute, memory, shared) with compute = 2·T_Mb·T_Nb·K / (FP32 FLOP per cycle per
  SM / resident blocks) and memory = 4·(T_Mb + T_Nb)·K / (bytes per cycle per SM / resident blocks)
  — the compute-to-memory ratio T_Mb·T_Nb/(T_Mb + T_Nb) decides which bound wins; stalls not hidden
  at low occupancy scale it by 1/min(1, occupancy/0.25) (cp.async staging hides the copy: ×0.8 of
  the memory term); shared = 4·K·threads·(T_Mi + T_Ni) / (128 bytes per cycle / resident blocks),
  the register tile's reuse of shared memory;
* cost(M) = ⌈blocks/blocks per wave⌉ × block time (padding waste is in the ⌈⌉ s).

The ranking over a dynamic range keeps, per sample M, the cheapest configuration, and orders all by
their mean cost relative to the per-sample best (the DietCode choice). Everything is marked
``measured: False`` (method ``analytic``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tscomp.codegen.simt.config import WARP, SimtTile
from tscomp.schedule.target import GpuSpec, Target

#: FP32 FLOP per cycle per SM (FMA = 2) and sustainable global-memory bytes per cycle per SM
#: (DRAM bandwidth / SMs / clock; an estimate, the model only needs it relative to the FLOP rate)
FLOP_PER_CYCLE = {"sm_80": 128, "sm_86": 256, "sm_89": 256, "sm_90": 256}
BYTES_PER_CYCLE = {"sm_80": 10.0, "sm_86": 5.0, "sm_89": 4.0, "sm_90": 12.0}
#: TF32 tensor-core FP32-equivalent throughput over the SIMT FP32 rate (A100: 156 vs 19.5 TFLOP/s)
TF32_SPEEDUP = 8
#: shared-memory bytes per cycle per SM (32 banks x 4 bytes)
SHARED_BYTES_PER_CYCLE = 128.0
#: the kernels declare their tiles as static shared arrays: 48 KiB per block on every architecture
#: (more needs dynamic shared memory and an opt-in attribute, which the generated kernels do not use)
STATIC_SHARED_LIMIT = 48 * 1024
#: registers a kernel needs besides its accumulators and operand fragments (indices, pointers)
REGISTER_OVERHEAD = 40


def gemm_cost(s: GpuSpec, t: SimtTile, M: int, K: int, N: int, registers: int | None = None) -> float:
    """Predicted cycles of the SIMT GEMM under ``t`` at [M, K]·[K, N] on ``s`` (the wave model with
    the analytic single-block time; ``registers`` from ptxas where known, else the estimate)."""
    r = {"threads": t.threads, "registers": registers or estimated_registers(t), "shared_bytes": t.shared_bytes()}
    per_sm = s.blocks_per_sm(r)
    if per_sm < 1:
        return math.inf
    bpw = per_sm * s.sms
    blocks = math.ceil(M / t.bm) * math.ceil(N / t.bn)
    kpad = math.ceil(K / t.bk) * t.bk
    flops = FLOP_PER_CYCLE.get(s.arch, 128) * (TF32_SPEEDUP if t.mma else 1)
    compute = 2.0 * t.bm * t.bn * kpad / (flops / per_sm)
    memory = 4.0 * (t.bm + t.bn) * kpad / (BYTES_PER_CYCLE.get(s.arch, 8.0) / per_sm)
    if t.async_copy:
        memory *= 0.8
    # shared-memory reads of the inner product: T_Mi + T_Ni words per thread per k for T_Mi·T_Ni FMAs
    # (tensor cores: each warp reads its A and B fragments once per k instead)
    words = t.warps * (t.wm + t.wn) if t.mma else t.threads * (t.tm + t.tn)
    shared = 4.0 * kpad * words / (SHARED_BYTES_PER_CYCLE / per_sm)
    stall = 1.0 / min(1.0, s.occupancy(r) / 0.25)
    return math.ceil(blocks / bpw) * max(compute, memory, shared) * stall


def _warp_skew(t: SimtTile) -> int:
    """How far a warp's 32 lanes are from a 4 x 8 / 8 x 4 arrangement (the model does not see the
    layout; among equal scores the squarer warp tile reads shared memory with fewer bank conflicts)."""
    lanes_m = t.wm // t.tm
    return abs(lanes_m.bit_length() - (WARP // lanes_m).bit_length())


def estimated_registers(t: SimtTile) -> int:
    """Accumulators + one A and one B fragment + addressing (ptxas reports the real number)."""
    mma = (t.wm // 16) * (t.wn // 16) * 8 + 8 if t.mma else 0     # accumulator + operand fragments per lane
    return t.tm * t.tn + t.tm + t.tn + mma + REGISTER_OVERHEAD


@dataclass(frozen=True)
class Ranked:
    tile: SimtTile
    score: float                # mean cost relative to the per-sample best (1.0 = best everywhere)
    occupancy: float
    blocks_per_wave: int
    registers: int              # estimated
    shared_bytes: int
    best_at: tuple[int, ...]    # sample Ms where it is the cheapest

    def to_json(self) -> dict:
        return {"tile": self.tile.to_json(), "score": round(self.score, 4), "occupancy": round(self.occupancy, 3),
                "blocks_per_wave": self.blocks_per_wave, "registers_estimate": self.registers,
                "shared_bytes": self.shared_bytes, "best_at": list(self.best_at), "measured": False,
                "method": "analytic"}


class GpuGemmSpace:
    """SIMT GEMM configurations for a [M, K]·[K, N] group on a CUDA ``target`` (M dynamic)."""

    BLOCK_MN = (16, 32, 64, 128)
    BLOCK_K = (8, 16, 32)
    THREAD = (2, 4, 8)

    def __init__(self, K: int, N: int, target: Target, m_range: tuple[int, int] = (1, 4096), *, tf32: bool = False):
        """``tf32``: also tensor-core tiles (wmma TF32: ~1e-3 relative error, so only on request)."""
        self.tf32 = tf32
        if not isinstance(target.spec, GpuSpec):
            raise ValueError(f"GpuGemmSpace needs a CUDA target, got {target.key()}")
        self.K, self.N, self.target, self.spec = int(K), int(N), target, target.spec
        self.m_range = m_range
        self.configs = [t for t in self._enumerate() if self.feasible(t)]

    def _enumerate(self):
        asyncs = (False, True) if self.spec.cp_async else (False,)
        for bm, bn, bk, tm, tn, a in itertools.product(self.BLOCK_MN, self.BLOCK_MN, self.BLOCK_K, self.THREAD,
                                                       self.THREAD, asyncs):
            for lanes_m in (2, 4, 8, 16):
                lanes_n = WARP // lanes_m
                wm, wn = lanes_m * tm, lanes_n * tn
                if bm % wm == 0 and bn % wn == 0:
                    yield SimtTile(bm, bn, bk, wm, wn, tm, tn, a)
                    if self.tf32 and self.spec.arch >= "sm_80" and wm % 16 == 0 and wn % 16 == 0 and bk % 8 == 0:
                        yield SimtTile(bm, bn, bk, wm, wn, tm, tn, a, mma=True)

    def resources(self, t: SimtTile) -> dict:
        return {"threads": t.threads, "registers": estimated_registers(t), "shared_bytes": t.shared_bytes()}

    def feasible(self, t: SimtTile) -> bool:
        s = self.spec
        r = self.resources(t)
        return (r["threads"] <= s.max_threads_per_block
                and r["shared_bytes"] <= min(s.smem_per_block, STATIC_SHARED_LIMIT)
                and r["registers"] <= s.max_regs_per_thread and r["registers"] * r["threads"] <= s.regs_per_block
                and s.blocks_per_sm(r) >= 1)

    def cost(self, t: SimtTile, M: int) -> float:
        """Predicted cycles at M (see the module docstring)."""
        return gemm_cost(self.spec, t, M, self.K, self.N)

    def samples(self, n: int = 12) -> list[int]:
        lo, hi = self.m_range
        pts = {lo, hi, *[int(round(math.exp(math.log(max(lo, 1)) + (math.log(hi) - math.log(max(lo, 1))) * i / (n - 1))))
                         for i in range(n)]}
        return sorted(p for p in pts if lo <= p <= hi)

    def rank(self, limit: int | None = None, samples: list[int] | None = None) -> list[Ranked]:
        ms = samples or self.samples()
        costs = {t: [self.cost(t, m) for m in ms] for t in self.configs}
        best = [min(c[i] for c in costs.values()) for i in range(len(ms))]
        out = []
        for t, c in costs.items():
            r = self.resources(t)
            out.append(Ranked(t, sum(ci / bi for ci, bi in zip(c, best)) / len(ms), self.spec.occupancy(r),
                              self.spec.blocks_per_wave(r), r["registers"], r["shared_bytes"],
                              tuple(m for m, ci, bi in zip(ms, c, best) if ci == bi)))
        out.sort(key=lambda x: (round(x.score, 9), -x.occupancy, not x.tile.async_copy, _warp_skew(x.tile), x.tile.slug()))
        return out[:limit] if limit else out

    def variants(self, k: int = 3, ranked: list[Ranked] | None = None) -> list[SimtTile]:
        """A few configurations covering the range: the best-ranked, plus the per-sample winners
        (``ranked``: this space's :meth:`rank`, when the caller has it already)."""
        ranked = ranked if ranked is not None else self.rank()
        picks = [ranked[0].tile]

        def shape(t):   # variants that differ only in warp layout or staging cost the same: keep one
            return (t.bm, t.bn, t.bk, t.tm, t.tn, t.mma)
        for r in sorted(ranked, key=lambda x: -len(x.best_at)):
            if r.best_at and shape(r.tile) not in {shape(p) for p in picks}:
                picks.append(r.tile)
            if len(picks) >= k:
                break
        return picks

    def choose(self, variants: list[SimtTile], M: int) -> SimtTile:
        """The wave model's choice among compiled variants at a concrete M."""
        return min(variants, key=lambda t: (self.cost(t, M), t.slug()))


__all__ = ["BYTES_PER_CYCLE", "FLOP_PER_CYCLE", "GpuGemmSpace", "Ranked", "estimated_registers", "gemm_cost"]
