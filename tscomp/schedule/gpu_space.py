"""The CUDA target's GEMM tile space and its analytic ranking (TSCompiler §5.1 tiling hierarchy,
§6 wave model; FTuner §III-IV analytic uKernel selection; DietCode's f_occ · f_pad cost terms),
with the model's constants calibrated on a GPU (``benchmarks/cuda_model_calibration.py``).

Space: block ⟨T_Mb, T_Nb, T_Kb⟩, warp ⟨T_Mw, T_Nw⟩, thread ⟨T_Mi, T_Ni⟩ (a warp's 32 threads tile
the warp tile), plain or cp.async double-buffered staging. Hard constraints from the target's
:class:`~tscomp.schedule.target.GpuSpec` prune: threads per block, static shared memory per block,
estimated registers per thread (≤ the per-thread maximum and, times the threads, ≤ the per-block
file; ptxas confirms at build time, where the kernel's launch bounds keep it launchable), and at
least one resident block per SM.

Model (:func:`gemm_cost`), per configuration and concrete M (K, N static), in SM cycles. The kernel
walks K in ⌈K/T_Kb⌉ steps; per step a block issues warp instructions for its FMAs (T_Mb·T_Nb·T_Kb/32,
on an architecture with fewer FP32 lanes per SM each counts for more), its shared-memory operand
reads (threads/32 · T_Kb · (T_Mi + T_Ni) · ``lds_instructions``) and its staging copies
((T_Mb + T_Nb)·T_Kb/32 · ``stage_instructions``: index arithmetic, guards, the copy):

* blocks(M) = ⌈M/T_Mb⌉·⌈N/T_Nb⌉; r = resident blocks per SM (occupancy formula); the blocks an SM
  actually holds c = min(r, ⌈blocks/SMs⌉) (a small M leaves SMs idle or single-block);
* one K step of an SM = max(throughput, memory, latency): throughput = c · instructions / min(4,
  c·warps·``issue_per_warp``) (4 schedulers; few warps cannot keep them busy), memory = c·4·(T_Mb +
  T_Nb)·T_Kb / ``bytes_per_cycle``, latency = the staging wait (``latency_plain`` or, double-buffered
  with cp.async, ``latency_async``) + one block's own instructions at its warps' issue rate;
* cost(M) = waves · K steps · step + ``launch_cycles``, waves = ⌈blocks/(r·SMs)⌉ (padding waste is
  in the ⌈⌉ s).

The constants were fitted to 2240 timed launches on an H200 (sm_90): BERT-base's four GEMM shapes at
M = 16..16384, 112 configurations each (the previous model's top 12 and 100 drawn at random); over
those, the configuration this model ranks first is within 1.11× of the fastest measured (geomean;
the previous, uncalibrated model: 1.30×, and 1.5-5× for its own first choice). Other
architectures share the cycle constants (an assumption, not a measurement) with their own FP32
lanes and memory bytes per cycle. TF32 tensor-core tiles (opt-in) are modelled, not calibrated.

The ranking over a dynamic range keeps, per sample M, the cheapest configuration, and orders all by
their mean cost relative to the per-sample best (the DietCode choice). A ranking is marked
``measured: False`` (method ``analytic``); with a GPU present, ``--measure-gpu`` times the model's
best candidates instead (:mod:`tscomp.schedule.gpu_measure`, method ``measured-gpu``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from tscomp.codegen.simt.config import WARP, SimtTile
from tscomp.schedule.target import GpuSpec, Target

#: FP32 FLOP per cycle per SM (FMA = 2) and sustainable global-memory bytes per cycle per SM
#: (DRAM bandwidth / SMs / clock; sm_90's is the calibrated value below)
FLOP_PER_CYCLE = {"sm_80": 128, "sm_86": 256, "sm_89": 256, "sm_90": 256}
BYTES_PER_CYCLE = {"sm_80": 10.0, "sm_86": 5.0, "sm_89": 4.0, "sm_90": 10.4}
#: TF32 tensor-core FP32-equivalent throughput over the SIMT FP32 rate (A100: 156 vs 19.5 TFLOP/s)
TF32_SPEEDUP = 8
#: the kernels declare their tiles as static shared arrays: 48 KiB per block on every architecture
#: (more needs dynamic shared memory and an opt-in attribute, which the generated kernels do not use)
STATIC_SHARED_LIMIT = 48 * 1024
#: registers a kernel needs besides its accumulators and operand fragments (indices, pointers)
REGISTER_OVERHEAD = 40
#: warp schedulers per SM (every architecture the target knows)
SCHEDULERS = 4


@dataclass(frozen=True)
class SimtGemmModel:
    """The cost model's constants (module docstring), fitted by ``benchmarks/cuda_model_calibration.py``
    to the timings in ``benchmarks/results/cuda_gemm_h200.json``."""
    issue_per_warp: float = 0.688       # warp instructions per cycle one warp sustains
    stage_instructions: float = 20.3    # warp instructions per 32 staged elements
    lds_instructions: float = 2.58      # warp instructions per operand value read from shared memory
    latency_plain: float = 1177.0       # cycles a K step waits for plain-staged tiles
    latency_async: float = 357.0        # the same with cp.async double buffering
    launch_cycles: float = 29700.0      # launch and epilogue (0.015 ms at 1.98 GHz)


MODEL = SimtGemmModel()


def gemm_cost(s: GpuSpec, t: SimtTile, M: int, K: int, N: int, registers: int | None = None,
              model: SimtGemmModel = MODEL) -> float:
    """Predicted cycles of the SIMT GEMM under ``t`` at [M, K]·[K, N] on ``s`` (``registers`` from
    ptxas where known, else the estimate); inf where one block does not fit an SM."""
    r = s.blocks_per_sm({"threads": t.threads, "registers": registers or estimated_registers(t),
                         "shared_bytes": t.shared_bytes()})
    if r < 1:
        return math.inf
    blocks = math.ceil(M / t.bm) * math.ceil(N / t.bn)
    held = min(r, math.ceil(blocks / s.sms))
    waves = math.ceil(blocks / (r * s.sms))
    steps = math.ceil(K / t.bk)
    fma_weight = FLOP_PER_CYCLE["sm_90"] / FLOP_PER_CYCLE.get(s.arch, 128)   # FP32 lanes per SM
    if t.mma:   # tensor cores: fewer, wider instructions; each warp reads its fragments once per k
        fma = t.bm * t.bn * t.bk / WARP / TF32_SPEEDUP * fma_weight
        lds = t.warps * t.bk * (t.wm + t.wn) / WARP * model.lds_instructions
    else:
        fma = t.bm * t.bn * t.bk / WARP * fma_weight
        lds = t.warps * t.bk * (t.tm + t.tn) * model.lds_instructions
    stage = (t.bm + t.bn) * t.bk / WARP * model.stage_instructions
    instructions = fma + lds + stage
    throughput = held * instructions / min(SCHEDULERS, held * t.warps * model.issue_per_warp)
    memory = held * 4.0 * (t.bm + t.bn) * t.bk / BYTES_PER_CYCLE.get(s.arch, 8.0)
    wait = model.latency_async if t.async_copy else model.latency_plain
    latency = wait + instructions / min(SCHEDULERS, t.warps * model.issue_per_warp)
    return waves * steps * max(throughput, memory, latency) + model.launch_cycles


def cover(order: list, costs: dict, k: int) -> list:
    """Variants for a dynamic range: ``order[0]`` (the best by mean relative cost), then greedily the
    configuration whose addition most lowers the mean over samples of (the set's cheapest / the
    sample's cheapest) -- what the wave model achieves when it picks among the set per shape --
    until ``k`` or no addition helps. ``costs``: configuration -> cost per sample (inf: cannot run)."""
    n = len(next(iter(costs.values())))
    best = [min(c[i] for c in costs.values()) for i in range(n)]
    picks, held = [order[0]], list(costs[order[0]])

    def mean_with(c):
        return sum(min(h, x) / b for h, x, b in zip(held, c, best)) / n
    while len(picks) < k:
        now = mean_with(held)
        cand = min((t for t in order if t not in picks), key=lambda t: (mean_with(costs[t]), order.index(t)), default=None)
        if cand is None or not mean_with(costs[cand]) < now - 1e-9:
            break
        picks.append(cand)
        held = [min(h, x) for h, x in zip(held, costs[cand])]
    return picks


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
        """A few configurations covering the range: the best-ranked first, then greedily the one
        that lowers the set's mean relative cost over the samples most (``ranked``: this space's
        :meth:`rank`, when the caller has it already)."""
        ranked = ranked if ranked is not None else self.rank()
        ms = self.samples()
        return cover([r.tile for r in ranked], {r.tile: [self.cost(r.tile, m) for m in ms] for r in ranked}, k)

    def choose(self, variants: list[SimtTile], M: int) -> SimtTile:
        """The wave model's choice among compiled variants at a concrete M."""
        return min(variants, key=lambda t: (self.cost(t, M), t.slug()))


__all__ = ["BYTES_PER_CYCLE", "FLOP_PER_CYCLE", "GpuGemmSpace", "MODEL", "Ranked", "SimtGemmModel", "cover",
           "estimated_registers", "gemm_cost"]
