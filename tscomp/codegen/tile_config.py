"""Tile configurations of the CPU GEMM macro-kernel, and the hardware-aligned candidates.

TSCompiler §5.1 ("Loop-based modeling") decomposes a GEMM ``Y[M, N] = X[M, K] · W[K, N]``
into a hierarchy of tiles: block tiles ⟨T_Mb, T_Nb, T_Kb⟩ that are independent units of
parallel work (a GPU thread block; here one OpenMP task) iterating over the reduction at a
stride of T_Kb, and, innermost, tiles ⟨T_Mi, T_Ni⟩ mapped onto the hardware's instructions
(here: an ``mr × nr`` block of accumulators held in SIMD registers and updated with FMA).
The GPU's warp level has no CPU counterpart and is dropped. On a CPU the block tile is the
GotoBLAS/BLIS cache blocking: ``kc`` (T_Kb) keeps a ``kc × nr`` panel of the weight in L1,
``mc`` (T_Mb) keeps an ``mc × kc`` block of packed activations in L2, and ``nc`` (T_Nb) is
the width of the weight slice one task sweeps.

§5.1's *hard constraints* (resource limits that must not be exceeded) become
:meth:`TileConfig.validate`: ``nr`` is a whole number of vectors and the accumulators fit
the register file. Its *soft constraints* (alignment with the hardware) and the Roller-style
"hardware-aligned initial population" become :func:`candidate_configs`, which returns a few
configurations sized from the vector width and the cache capacities so that a runtime (the
wave model) can choose among them per concrete M. Imperfect tiles are not a constraint
here: the macro-kernel handles them with DietCode's local padding (§4.1).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tscomp.errors import TscompError

#: floats per SIMD vector for each ISA the CPU backend generates. ``amx`` is AVX-512 plus the AMX
#: tile unit (bf16 and int8 GEMMs, :mod:`tscomp.codegen.cpu_gemm`): its epilogues run on AVX-512.
VECTOR_WIDTH = {"avx512": 16, "avx2": 8, "scalar": 1, "amx": 16}
#: below this many tasks per thread, a macro-kernel (GEMM row blocks, Conv position blocks) rounds
#: their count up to a multiple of the threads: 3 blocks over 2 threads leave one idle for a third
#: of the call, 5 for a fifth; 13 over 2, a 14th
BALANCE_TASKS_PER_THREAD = 4


def evened_count(n, per: int, threads: int, cap):
    """The smallest block count >= ``n`` whose tasks (count x ``per``) divide among the threads, or
    ``n`` itself where that count exceeds ``cap`` (ints or numpy arrays; the macro-kernels' C loops
    search the same count upwards)."""
    step = threads // np.gcd(per, threads)        # counts whose tasks divide: multiples of step
    evened = -(-n // step) * step
    out = np.where(evened <= cap, evened, n)
    return int(out) if out.ndim == 0 else out

#: accumulator registers a register tile may use: 32 zmm / 16 ymm minus the weight vectors
#: and the broadcast operand of one k step (AVX-512: 28; AVX2: 14). The scalar fallback has
#: no register file to speak of; its bound only keeps the unrolled C reasonable. AMX counts
#: 16-float rows of its 16x16 fp32 accumulator tiles: 4 tiles (64 rows) of the 8 tile
#: registers, leaving one or two for the A tiles and at least one for a B tile.
MAX_ACCUMULATORS = {"avx512": 28, "avx2": 14, "scalar": 64, "amx": 64}
#: bytes of one packed GEMM operand element per k, per GEMM precision (X and W alike)
OPERAND_BYTES = {"fp32": 4, "bf16": 2, "int8": 1}
#: AMX tile geometry: 16 rows per tile, 32 bf16 of K per A row (64 bytes), 8 tile registers
AMX_ROWS, AMX_K, AMX_TILE_REGISTERS = 16, 32, 8
#: bytes of one AMX tile row: a tile step's K depth is this over the operand's bytes (32 bf16, 64 int8)
AMX_ROW_BYTES = 64


def amx_k(precision: str) -> int:
    """K depth of one AMX tile step at a GEMM precision: 32 (bf16, TDPBF16PS), 64 (int8, TDPBUSD)."""
    return AMX_ROW_BYTES // OPERAND_BYTES[precision]


class TileConfigError(TscompError, ValueError):
    """A tile configuration violates a hard constraint of the ISA it targets."""


@dataclass(frozen=True)
class TileConfig:
    """One point of the GEMM tiling space.

    ``mr × nr`` — register tile ⟨T_Mi, T_Ni⟩: rows of X × columns of W accumulated in registers.
    ``mc × nc × kc`` — block tile ⟨T_Mb, T_Nb, T_Kb⟩: one parallel task computes an
    ``mc × nc`` block of Y, walking K in steps of ``kc``.
    ``vector_axis`` — the axis of the ``mr × nr`` tile the SIMD lanes run along: 1 (the default)
    columns (``nr`` a whole number of vectors, each of the ``mr`` rows a broadcast operand), 0 rows
    (``mr`` whole vectors, the ``nr`` columns broadcast). Only the Conv family offers 0: its rows are
    output channels, and a late stage's few output positions fill no column vector.
    ``planes`` — (Conv only, column vectors) the tile's columns are read in place from the task's
    zero-padded input planes at a per-k offset, the positions running along the padded width (a few
    columns per output row computed and dropped), instead of from a gathered im2col block.
    """

    mr: int
    nr: int
    mc: int
    nc: int
    kc: int
    vector_axis: int = 1
    planes: bool = False

    def __post_init__(self):
        for field in ("mr", "nr", "mc", "nc", "kc"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TileConfigError(f"TileConfig.{field} must be a positive int, got {value!r}")
        if self.vector_axis not in (0, 1) or isinstance(self.vector_axis, bool):
            raise TileConfigError(f"TileConfig.vector_axis must be 0 (rows) or 1 (columns), got {self.vector_axis!r}")
        if self.mc % self.mr:
            raise TileConfigError(f"TileConfig mc={self.mc} is not a multiple of mr={self.mr}")
        if self.nc % self.nr:
            raise TileConfigError(f"TileConfig nc={self.nc} is not a multiple of nr={self.nr}")
        if self.planes not in (False, True) or (self.planes and self.vector_axis != 1):
            raise TileConfigError(f"TileConfig.planes must be a bool (or 0/1, as tuning records store it), and "
                                  f"True only with vector_axis 1 (got planes={self.planes!r}, "
                                  f"vector_axis={self.vector_axis!r})")
        object.__setattr__(self, "planes", bool(self.planes))

    def accumulators(self, isa: str) -> int:
        """Registers (vectors) the ``mr × nr`` accumulator tile occupies under ``isa``."""
        return self.mr * self.nr // VECTOR_WIDTH[_check_isa(isa)]

    def validate(self, isa: str, *, row_vectors: bool = False) -> "TileConfig":
        """Check the hard constraints for ``isa``; return ``self`` (raises TileConfigError).
        ``row_vectors``: the kernel asking also generates row-vector tiles (``vector_axis`` 0)."""
        if self.vector_axis == 0 and not row_vectors:
            raise TileConfigError(f"{self.describe()}: this kernel vectorizes along the tile's columns only")
        vw = VECTOR_WIDTH[_check_isa(isa)]
        lanes, extent = ("nr", self.nr) if self.vector_axis == 1 else ("mr", self.mr)
        if extent % vw:
            raise TileConfigError(f"{self.describe()}: {lanes}={extent} is not a multiple of the "
                                  f"{isa} vector width ({vw} floats)")
        acc, limit = self.accumulators(isa), MAX_ACCUMULATORS[isa]
        if acc > limit:
            raise TileConfigError(f"{self.describe()}: the {self.mr}x{self.nr} register tile needs {acc} "
                                  f"accumulators, more than the {limit} {isa} allows")
        if isa == "amx" and self.mr % AMX_ROWS:
            raise TileConfigError(f"{self.describe()}: an AMX register tile is whole {AMX_ROWS}-row tiles; "
                                  f"mr={self.mr} is not")
        return self

    def describe(self) -> str:
        lanes = "" if self.vector_axis == 1 else " (vectors along its rows)"
        planes = ", columns read in place from padded input planes" if self.planes else ""
        return (f"register tile T_Mi x T_Ni = {self.mr}x{self.nr}{lanes}, "
                f"block tile T_Mb x T_Nb x T_Kb = {self.mc}x{self.nc}x{self.kc}{planes}")

    def slug(self) -> str:
        """Short identifier usable in C symbol and file names."""
        lanes = ("" if self.vector_axis == 1 else "v") + ("p" if self.planes else "")
        return f"r{self.mr}x{self.nr}{lanes}_b{self.mc}x{self.nc}x{self.kc}"


def _check_isa(isa: str) -> str:
    if isa not in VECTOR_WIDTH:
        raise TileConfigError(f"unknown ISA {isa!r}; expected one of {sorted(VECTOR_WIDTH)}")
    return isa


@dataclass(frozen=True)
class CacheSizes:
    """Per-core data cache capacities in bytes (L3: the whole shared cache)."""

    l1: int = 32 * 1024
    l2: int = 1024 * 1024
    l3: int = 16 * 1024 * 1024


@functools.lru_cache(maxsize=None)
def host_caches() -> CacheSizes:
    """The host's cache sizes read from sysfs (Linux); conservative defaults elsewhere."""
    sizes = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(root.glob("index*")):
            kind = (index / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
            scale = {"K": 1024, "M": 1024 ** 2}.get(text[-1:], 1)
            sizes[level] = int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return CacheSizes()
    default = CacheSizes()
    return CacheSizes(l1=sizes.get(1, default.l1), l2=sizes.get(2, default.l2), l3=sizes.get(3, default.l3))


#: register tiles (mr, nr) per ISA: large-M tiles first, then small-M tiles.
#: AVX-512 large-M: 8x48 / 14x32 / 12x32 use 24-28 of the 32 zmm registers for accumulators
#: (the 2-3 weight vectors of one k step and the broadcast operand take the rest); 8x48 loads
#: 3 weight vectors per 24 FMAs and measured best here. Small-M tiles trade FMA-chain
#: parallelism for fewer padded rows: at M = 1 a 4-row tile computes 4x the useful work, while
#: the kernel is bound by streaming W anyway, so 2x48 and 1x48 (3 chains) win there.
#: AVX2: the classic 6x16 (12 of 16 ymm) and its reshapes. AMX: 2x2 accumulator tiles (32x32,
#: 2 A + 2 B tiles: all 8 registers) and 1x4 (16x64); small M computes 16 padded rows either way
#: (a tile-multiply costs no more at 1 row than at 16), so narrower tiles only add N blocks.
REGISTER_TILES = {
    "amx": {"large": [(32, 32), (16, 64)], "small": [(16, 32), (16, 16)]},
    "avx512": {"large": [(8, 48), (14, 32), (12, 32)], "small": [(4, 48), (2, 48), (1, 48)]},
    "avx2": {"large": [(6, 16), (4, 24), (3, 32)], "small": [(2, 32), (1, 32)]},
    "scalar": {"large": [(4, 8), (2, 8)], "small": [(1, 8)]},
}


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _balanced(total: int, cap: int, align: int) -> int:
    """The smallest multiple of ``align`` that splits ``total`` into ⌈total/cap⌉ near-equal parts."""
    parts = max(1, math.ceil(total / cap))
    return _round_up(math.ceil(total / parts), align)


def block_tile(mr: int, nr: int, K: int, N: int, *, caches: CacheSizes | None = None,
               n_parts: int = 1, mc_rows: int | None = None, small_m: bool = False,
               mc_tiles: int = 8) -> TileConfig:
    """Cache-sized block tile around an ``mr × nr`` register tile (GotoBLAS rules).

    - ``kc``: the ``kc × nr`` weight micro-panel plus the ``mr × kc`` activation micro-panel
      fill at most ~3/4 of L1 (the rest holds the output tile and stack); K is then split
      into equal blocks so the last one is not a sliver. With ``small_m`` the weight panel
      meets only one or two row panels, so keeping it in L1 buys nothing: ``kc`` is then
      bounded only by the ``mr × kc`` activation panel (1/4 of L1), which usually means one
      K step and no partial-sum buffer.
    - ``mc``: the packed ``mc × kc`` activation block takes at most ~1/4 of L2 (the weight
      block and the accumulation buffer share the rest), capped at ``mc_tiles`` register
      tiles (8: M up to a few hundred still gives several row blocks; a tall block instead
      streams each weight panel once for more rows).
    - ``nc``: a multiple of ``nr``; the padded N is cut into ``n_parts`` near-equal slices
      (more slices = more parallel tasks at small M, fewer = less repeated packing of X),
      or more when K takes several steps: the ``mc × nc`` partial sums then live in a
      per-thread buffer that must stay within ~1/2 of L2.
    """
    caches = caches or host_caches()
    if small_m:
        kc_cap = max(8, (caches.l1 // 4) // (4 * mr))
    else:
        kc_cap = max(8, (caches.l1 * 3 // 4) // (4 * (nr + mr)))
    kc = min(_balanced(K, kc_cap, 8), K) if K > kc_cap else K
    mc_cap = max(mr, (caches.l2 // 4) // (4 * kc) // mr * mr)
    mc = mc_rows if mc_rows is not None else min(mc_cap, mc_tiles * mr)
    n_padded = _round_up(N, nr)
    if kc < K:
        n_parts = max(n_parts, math.ceil(4 * mc * n_padded / (caches.l2 // 2)))
    nc = _balanced(n_padded, -(-n_padded // min(n_parts, n_padded // nr)), nr)
    return TileConfig(mr=mr, nr=nr, mc=mc, nc=min(nc, n_padded), kc=kc)


def _tall_block_tile(mr: int, nr: int, K: int, N: int, caches: CacheSizes) -> TileConfig:
    """A block tile of up to 32 register tiles of rows (as L2 allows) whose ``kc × nc`` weight
    block takes about 1/4 of L2: when the weights arrive cold from memory (a model larger than
    L2), every extra row block streams each weight panel again, and a task over all of M
    (the kernel balances its row blocks) streams it once; the N blocks give the parallelism."""
    kc = block_tile(mr, nr, K, N, caches=caches).kc
    n_padded = _round_up(N, nr)
    parts = max(2, -(-4 * kc * n_padded // (caches.l2 // 4)))
    return block_tile(mr, nr, K, N, caches=caches, n_parts=min(parts, n_padded // nr), mc_tiles=32)


def candidate_configs(isa: str, K: int, N: int, *, caches: CacheSizes | None = None) -> list[TileConfig]:
    """A few hardware-aligned tile configurations for a ``[M, K] · [K, N]`` GEMM on ``isa``.

    The heuristic (TSCompiler §5.1's hardware-aligned initial population, Roller-style):

    1. register tiles from :data:`REGISTER_TILES` — ``nr`` a multiple of the vector width,
       ``mr·nr/width`` accumulators within the register file, large-M tiles first;
    2. per register tile, :func:`block_tile` sizes ``kc``/``mc``/``nc`` from the cache
       capacities (:func:`host_caches` by default);
    3. variants: the large-M tiles with ``nc`` = the whole (padded) N (or the widest slice
       whose partial sums fit L2) and with N cut in two/four slices (more tasks when M is
       a few row blocks), and once tall (:func:`_tall_block_tile`); the small-M tiles with
       ``mc = 4·mr``, a single K step where L1 allows, and N cut in 2 or 8 slices so that
       even M = 1 yields several tasks per core.

    Every candidate is valid for ``isa``; duplicates are removed. The list is ordered
    large-M first; it is a population to measure or rank, not a final choice.
    """
    _check_isa(isa)
    if K < 1 or N < 1:
        raise TileConfigError(f"GEMM extents must be positive, got K={K}, N={N}")
    caches = caches or host_caches()
    out: list[TileConfig] = []

    def add(cfg: TileConfig):
        if cfg not in out:
            out.append(cfg.validate(isa))

    # ordered so that a tuner seeding with the first few meets every register tile, whole and tall
    for mr, nr in REGISTER_TILES[isa]["large"]:
        add(block_tile(mr, nr, K, N, caches=caches))
    for mr, nr in REGISTER_TILES[isa]["large"]:
        add(_tall_block_tile(mr, nr, K, N, caches))
    for parts in (2, 4):
        for mr, nr in REGISTER_TILES[isa]["large"]:
            add(block_tile(mr, nr, K, N, caches=caches, n_parts=min(parts, _round_up(N, nr) // nr)))
    for mr, nr in REGISTER_TILES[isa]["small"]:
        for parts in (2, 8):
            add(block_tile(mr, nr, K, N, caches=caches, n_parts=min(parts, _round_up(N, nr) // nr),
                           mc_rows=4 * mr, small_m=True))
    return out


def default_config(isa: str, K: int, N: int) -> TileConfig:
    """The first (large-M) candidate: a reasonable single choice when nothing is measured."""
    return candidate_configs(isa, K, N)[0]
