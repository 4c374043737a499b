"""CPU GEMM macro-kernels: C source generated from a tile configuration.

``Y[M, N] = epilogue(X[M, K] · W[K, N])`` where W is a constant weight prepacked at compile
time, K and N are static and M (batch × sequence) is dynamic: it enters the kernel as an
integer argument, so one compiled kernel serves every M (TSCompiler's macro-kernel).

Tiling (TSCompiler §5.1, see :mod:`tscomp.codegen.tile_config`): one OpenMP task computes an
``mc × nc`` block of Y (block tile ⟨T_Mb, T_Nb⟩), walking K in steps of ``kc`` (T_Kb). Tasks are
mapped to (row block, N block) and claimed affinity-first (:mod:`tscomp.codegen.task_affinity`): a
thread computes the same weight columns at every M (where the N blocks are a multiple of the
threads, as the run-time split at small M makes them), so its panels stay in its core's L2 from
one request to the next, whatever their lengths -- and whatever ``nc`` is: thread i's N blocks
are the i-th contiguous 1/nth of them, so the variants the runtime switches between at different
M (nc = 128 at L = 64, a run-time half of N at L = 1) leave each core the columns the next one
reads. Per
step, for every ``nr``-column weight panel and every ``mr``-row panel of X it runs the
micro-kernel: an ``mr × nr`` tile of accumulators in SIMD registers (⟨T_Mi, T_Ni⟩) updated with
broadcast-FMA over ``kc``. The fp32 SIMD kernels broadcast X's elements from X itself (``mr``
rows ``K`` apart, each read along k: the hardware prefetchers follow ``mr`` streams); only the
bf16, AMX and scalar kernels pack the ``mc × kc`` slice of X into ``mr``-row panels first
(converted to bf16 pairs or AMX rows). Packing was a copy of X per task and K step, that is
``N / nc`` copies of X per call: 2-7% of an fp32 GEMM's time at BERT-base's shapes.
Partial sums between K steps live in a per-thread buffer laid out tile by tile; after the
last step the epilogue is applied to the accumulators and the tile is stored once.

Imperfect tiles use DietCode's local padding (§4.1): W's columns are zero-padded to a
multiple of ``nr`` when it is packed (at compile time); the last, partial row panel runs a
micro-kernel of exactly its height (or, where X is packed, reads zero-filled rows), so the
FMA loop has no bounds checks at all; only the final store is guarded (masked stores on the
last partial columns, a row test on the last partial rows).

Packed weight layout (:func:`prepack_weights`): Np = N rounded up to ``nr``; W is cut into
``Np / nr`` panels of ``nr`` columns, panel ``p`` (columns ``[p·nr, p·nr + nr)``) occupying
``K · nr`` floats at offset ``p · nr · K``, k-major (row k's ``nr`` columns contiguous). A task's
K block ``[k0, k0 + kl)`` of a panel is the contiguous stretch at ``k0 · nr`` inside it -- exactly
the order the micro-kernel streams it. The layout depends on ``nr`` alone, not on the block tile
(``mc``, ``nc``, ``kc``): a group's variants with the same register-tile width share one packed
copy at run time (less memory, and a request that switches variants finds the weight in cache).

Epilogues (:class:`Epilogue`) are a C expression template over ``acc`` (the accumulated
value, float), ``i`` (row) and ``j`` (column) (both int64_t, global indices), the
compile-time constants ``N`` and ``K``, and named extra kernel arguments. It is applied to
the finished tile (valid part only) in a ``#pragma omp simd`` loop right before the single
store, so bias/residual/arithmetic templates vectorize. Besides math.h, the prelude offers
``tscomp_erff(x)``: erf as a rational approximation (|error| < 5e-7) that vectorizes, where
libm's ``erff`` is a scalar call per element (glibc declares its vector variants only
under -ffast-math).

Two optional hooks of an :class:`Epilogue` extend the kernel around the tiles (TSCompiler §4.2's
fusion of what surrounds the backbone): ``row_pass`` — C run by each task over its finished rows
``[m0, m0 + mv)`` of Y after the last K step, while they are in cache (a fused LayerNorm: row
statistics, then the normalized row) when a task owns whole rows (``nc`` >= padded N); when N is
split over tasks (more tasks for small M), it runs once all tiles are stored, in parallel over row
chunks after the task loop's barrier — and ``a_prologue`` — C that computes the A operand into X (a caller-provided scratch)
before the tiles start (prologue ops fused before the GEMM).

Precision (issue 13; TSCompiler §5.4 reaches its GPU results with reduced-precision TensorCore
GEMMs, this is the CPU's counterpart). ``precision="fp32"`` is everything above. ``precision="bf16"``
(AVX-512 with AVX512_BF16 only) keeps the tiling, padding, accumulators, partial sums and epilogue
exactly as they are and changes only the operands of the inner product: W is packed as bfloat16
(round to nearest even) in *pairs along K* -- the VDPBF16PS layout: one 32-bit lane holds
``(W[k, j], W[k+1, j])``, low half the even k -- so a panel's K rows become pair-rows of ``nr`` lanes
(K zero-padded to a multiple of 32, ``BF16_K_BLOCK``); the X panel is converted to bf16
pairs while it is packed (``_mm512_cvtne2ps_pbh``/``_mm512_cvtneps_pbh``, round to nearest even,
an odd tail zero-padded); the micro-kernel's k loop steps by 2 and issues one
``_mm512_dpbf16_ps(acc, broadcast x pair, w pair vector)`` where fp32 issues two FMAs.
Accumulation stays float32 (each bf16 x bf16 product is exact in fp32; VDPBF16PS rounds each
accumulation to nearest even and treats bf16 denormals as zero). K blocks are whole multiples of
32 (only the last may be shorter, and K is padded to 32 in the panels), so the same panels serve the
AMX kernels below; the VDPBF16PS loop skips the padding.

AMX (``isa="amx"``, bf16 here, int8 below; :attr:`tscomp.schedule.target.Target.gemm_isa` chooses it where the CPU
has AMX tiles and the OS grants them): the register tile is (MR/16) x (NR/16) fp32 accumulator tiles of
16x16 (2x2 or 1x4: at most 4, so the A and B tiles keep registers), and per 32-deep K step the kernel
loads the MR/16 A tiles (X packed as row-major bf16 rows: 16 rows x 32 k) and each B tile (16
bf16-pair rows x 16 columns of the very weight panel above, row stride NR lanes) and issues
``_tile_dpbf16ps``. Partial sums go through the same per-thread buffer, the finished tile through a
tile buffer into the unchanged epilogue. A tile multiply costs the same for 1 row as for 16, so the
last row panel is computed padded (rows past M are zero in the packed X). Each thread configures its
tile registers in the parallel region; the kernel's library asks Linux for the tile state when loaded.

``precision="int8"`` (AVX-512 with AVX512_VNNI; never a model-wide precision:
:func:`tscomp.codegen.families.gemm_target` chooses it for a GEMM whose operands are integers held
in float32 -- a quantized model's -- with W in [-128, 127] and X spanning at most 256 values from
``x_offset``): the bf16 layout with *quads* for pairs. W is packed as int8 quads along K (one 32-bit
lane holds ``W[k..k+3, j]``; K blocks whole multiples of 64 and K zero-padded to 64, one AMX int8
tile step, the VPDPBUSD loop skipping the padding), X is packed as unsigned bytes
``X - x_offset`` in [0, 255], and the k loop issues one VPDPBUSD (acc, broadcast x quad, w quad
vector) per four k: 64 multiply-adds per instruction, where VDPBF16PS does 32 and an FMA 16.
Accumulators and the partial sums between K blocks are int32 (exact: |sum| < 2^31 for K <= 65536);
since ``X = U + x_offset``, ``X . W = U . W + x_offset * colsum(W)``, and that correction (int32,
stored after the weight panels) is what the accumulators start from. The finished tile is
converted to float32 once -- one rounding of the exact integer sum, as onnxruntime's
MatMulInteger then Cast -- and goes through the unchanged epilogue.

int8 on AMX (``isa="amx"``, ``precision="int8"``, where the tiles do int8:
:attr:`tscomp.schedule.target.CpuSpec.amx_int8`): the AMX kernel above with int32 accumulator tiles,
A tiles of 16 rows x 64 bytes ``X - x_offset`` (rows past M and columns past K zero) and B tiles of
16 quad-rows x 16 columns of the very same int8 panels, one TDPBUSD per 64-deep step (16x16x64
multiply-adds: twice the bf16 tiles' rate, on half their weight bytes). The accumulators start
from zero; the column corrections are added once, when the finished int32 tile is converted to
float32 before the epilogue.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from tscomp.codegen.build import build_library, host_isa, load_library
from tscomp.codegen.c_expr import GEMM_KERNEL_NAMES, math_helpers
from tscomp.codegen.register_operands import BROADCASTS, held_operand, hold
from tscomp.codegen.task_affinity import AFFINITY_C, claim_loop, shares_declaration
from tscomp.codegen.tile_config import (AMX_K, AMX_ROW_BYTES, AMX_ROWS, AMX_TILE_REGISTERS, BALANCE_TASKS_PER_THREAD,
                                       MAX_ACCUMULATORS, OPERAND_BYTES, VECTOR_WIDTH, TileConfig, TileConfigError,
                                       amx_k, default_config, evened_count, host_caches)
from tscomp.errors import TscompError
from tscomp.schedule.target import GEMM_PRECISIONS     # the target's precisions: one list

ISA_RANK = {"scalar": 0, "avx2": 1, "avx512": 2, "amx": 3}


class GemmError(TscompError, ValueError):
    """A GEMM kernel was asked for something it cannot do (bad shapes, dtypes, arguments)."""


# --------------------------------------------------------------------------------------
# Epilogue interface


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# names the generated code uses where an epilogue expression is evaluated: an argument may not shadow
# them (shape symbols so named are renamed by c_expr.c_symbol_name)
_RESERVED = GEMM_KERNEL_NAMES
_RESERVED_PATTERN = re.compile(r"(c\d+_\d+(_s\d+)?|w\d+|m\d+|micro_kernel_\d+)\Z")  # accumulators, weight vectors, masks, row tails
#: C types an epilogue argument may have, with their ctypes and (for pointers) numpy dtype.
ARG_TYPES = {
    "const float*": (ctypes.c_void_p, np.float32),
    "float*": (ctypes.c_void_p, np.float32),          # an extra output the epilogue stores to
    "const int64_t*": (ctypes.c_void_p, np.int64),
    "const int32_t*": (ctypes.c_void_p, np.int32),
    "const int16_t*": (ctypes.c_void_p, np.int16),      # quantized tensors a prologue or epilogue converts
    "const uint16_t*": (ctypes.c_void_p, np.uint16),
    "const int8_t*": (ctypes.c_void_p, np.int8),
    "const uint8_t*": (ctypes.c_void_p, np.uint8),
    "const _Float16*": (ctypes.c_void_p, np.float16),  # a float16 model's input, cast in the prologue
    "float": (ctypes.c_float, None),
    "int64_t": (ctypes.c_int64, None),
}


@dataclass(frozen=True)
class EpilogueArg:
    """One extra kernel argument an epilogue reads.

    ``shape`` (pointer arguments only) states the expected array shape with ``"M"``, ``"N"``,
    ``"K"`` or integers, so :class:`GemmKernel` can check what it is given; the expression
    indexes the array itself (row-major), e.g. ``residual[i*N + j]``.
    """

    name: str
    ctype: str = "const float*"
    shape: tuple = ()

    def __post_init__(self):
        if not _IDENT.match(self.name) or self.name in _RESERVED or _RESERVED_PATTERN.match(self.name):
            raise GemmError(f"epilogue argument name {self.name!r} is not a free C identifier")
        if self.ctype not in ARG_TYPES:
            raise GemmError(f"epilogue argument {self.name!r}: C type {self.ctype!r} not one of {sorted(ARG_TYPES)}")

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    def c_param(self) -> str:
        return f"{self.ctype} restrict {self.name}" if self.is_pointer else f"{self.ctype} {self.name}"


@dataclass(frozen=True)
class Epilogue:
    """Elementwise code fused after the GEMM, applied once per output before the single store.

    ``expr`` is a C expression of type float over ``acc``, ``i``, ``j``, ``N``, ``K`` and the
    ``args`` by name; math.h is available. ``body`` holds C statements run first for each
    element (locals the expression uses, side stores through ``float*`` arguments), and
    ``prelude`` file-scope helper code (static functions). ``label`` names it in the header.
    """

    expr: str
    args: tuple[EpilogueArg, ...] = ()
    label: str = "custom"
    body: str = ""
    prelude: str = ""
    #: C statements of ``static void row_pass(float* restrict Y, int64_t m0, int64_t mv, <args>)``:
    #: a pass over the finished rows [m0, m0 + mv) of Y run by the task that computed them (a
    #: fused row reduction such as LayerNorm); requires one N block (``nc`` >= padded N).
    row_pass: str = ""
    row_label: str = ""
    #: C statements of ``static void a_prologue(float* restrict Xa, int64_t M, <args>)``: computes
    #: the A operand [M, K] into the (writable, caller-allocated) X buffer before the GEMM starts
    #: (prologue ops fused before the GEMM: one elementwise pass instead of a separate kernel).
    a_prologue: str = ""

    def __post_init__(self):
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise GemmError(f"epilogue {self.label!r}: duplicate argument names {names}")
        if not self.expr.strip():
            raise GemmError(f"epilogue {self.label!r}: empty expression")

    @staticmethod
    def bias() -> "Epilogue":
        return Epilogue("acc + bias[j]", (EpilogueArg("bias", shape=("N",)),), "bias")

    @staticmethod
    def bias_gelu(erf: str = "tscomp_erff") -> "Epilogue":
        """bias then exact (erf) GELU: 0.5·v·(1 + erf(v/√2)).

        ``erf="tscomp_erff"`` (default) uses the kernel prelude's rational approximation
        (|error| < 5e-7), which vectorizes; ``erf="erff"`` calls libm once per element.
        """
        if erf not in ("tscomp_erff", "erff"):
            raise GemmError(f"bias_gelu: erf must be 'tscomp_erff' or 'erff', got {erf!r}")
        v = "(acc + bias[j])"
        return Epilogue(f"0.5f * {v} * (1.0f + {erf}({v} * 0.70710678f))",
                        (EpilogueArg("bias", shape=("N",)),), "bias + GELU(erf)")

    @staticmethod
    def bias_residual() -> "Epilogue":
        return Epilogue("acc + bias[j] + residual[i * N + j]",
                        (EpilogueArg("bias", shape=("N",)), EpilogueArg("residual", shape=("M", "N"))),
                        "bias + residual")


# --------------------------------------------------------------------------------------
# Weight prepacking


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


#: bf16 weights are packed in K blocks of whole multiples of this depth (zero-padded): one AMX tile's
#: 32 bf16 of K, so one packed layout serves the VDPBF16PS kernels (which skip the padding) and AMX
BF16_K_BLOCK = AMX_K
#: int8 weights are packed in quads along K (VPDPBUSD's and TDPBUSD's four bytes per 32-bit lane)
INT8_K_QUAD = 4
#: int8 K blocks are whole multiples of this depth (only the last may be shorter) and K is zero-padded
#: to it in the panels: one AMX int8 tile step (64 bytes of K), so the same panels serve VPDPBUSD
#: (which skips the padding) and AMX
INT8_K_BLOCK = AMX_ROW_BYTES
#: K at most this deep for an int8 GEMM: 255 x 128 x K stays inside an int32 accumulator
INT8_MAX_K = 65536


def check_precision(precision: str, isa: str | None = None) -> str:
    """``precision`` if the GEMM generator supports it on ``isa``; else :class:`GemmError`."""
    if precision not in GEMM_PRECISIONS:
        raise GemmError(f"unknown GEMM precision {precision!r}; expected one of {', '.join(GEMM_PRECISIONS)}")
    if precision == "bf16" and isa is not None and isa not in ("avx512", "amx"):
        raise GemmError(f"bf16 GEMM kernels need AVX-512 with AVX512_BF16 (VDPBF16PS) or AMX; not implemented for {isa}")
    if precision == "int8" and isa is not None and isa not in ("avx512", "amx"):
        raise GemmError(f"int8 GEMM kernels need AVX-512 with AVX512_VNNI (VPDPBUSD) or AMX; not implemented for {isa}")
    if isa == "amx" and precision not in ("bf16", "int8"):
        raise GemmError(f"AMX GEMM kernels are bf16 (TDPBF16PS) or int8 (TDPBUSD); {precision} GEMMs run on the SIMD ISA")
    return precision


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even (NaN stays a quiet NaN):
    what ``_mm512_cvtneps_pbh`` computes, for the weights packed here and for reference results."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_round(a: np.ndarray) -> np.ndarray:
    """``a`` rounded to the nearest bfloat16 (to nearest even), as float32."""
    return (to_bf16_bits(a).astype(np.uint32) << 16).view(np.float32)


def row_blocks(M, MC: int, MR: int, n_nblocks: int, threads: int, tall_rows: int = 0):
    """The macro-kernel's row-block count at M rows (an int, or an array for an array of M; its C
    computes the same): ceil(M / MC), or -- where that many blocks times the ``n_nblocks`` N blocks
    are a few tasks (under :data:`BALANCE_TASKS_PER_THREAD` per thread) that do not divide among
    the threads -- the next count that does, at most one block per register tile. 139 rows under
    64-row blocks on 2 threads are 4 blocks, not 3: a third block would run alone in a second wave
    (measured: BERT-size 3072x768 GEMMs at 161 instead of 212 GFLOP/s). Up to ``tall_rows`` rows
    (:attr:`_Geometry.tall_rows`: a weight too large for the L3) one block takes all of M."""
    M = np.maximum(M, 1)
    n = -(-M // MC)
    tasks = n * n_nblocks
    uneven = (tasks >= threads) & (tasks < BALANCE_TASKS_PER_THREAD * threads) & (tasks % threads != 0)
    out = np.where(M <= tall_rows, 1, np.where(uneven, evened_count(n, n_nblocks, threads, -(-M // MR)), n))
    return int(out) if out.ndim == 0 else out


def row_block_classes(M, MC: int, MR: int, n_nblocks: int, threads: int, granule: int,
                      tall_rows: int = 0) -> list[tuple]:
    """``[(count, rows)]`` of the macro-kernel's row blocks at M rows (ints or arrays): the register
    tiles dealt evenly over :func:`row_blocks` blocks, the first ones a tile more; the last block
    holds the partial tile, its rows rounded up to ``granule`` (1 where row tails compute exact rows,
    MR where a partial tile costs a whole one)."""
    M = np.maximum(M, 1)
    n = row_blocks(M, MC, MR, n_nblocks, threads, tall_rows)
    tiles = -(-M // MR)
    q, extra = tiles // n, tiles % n       # the last block is never among the first `extra`
    last = M - (tiles - q) * MR
    return [(extra, (q + 1) * MR), (n - extra - 1, q * MR), (n * 0 + 1, -(-last // granule) * granule)]


def tall_rows(K: int, NP: int, MR: int, MC: int, NC: int, precision: str, caches) -> int:
    """Rows up to which one row block takes all of M, for a weight that does not fit half the L3
    (an LLM's 512 x 32000 vocabulary head is 65 MB): every further row block of a task streams its
    weight columns from memory again, so 17 rows under 16-row blocks read the whole weight twice
    (measured: 6.0 ms at M = 17 vs 4.6 at M = 16 on a Zen 3, where one block costs a partial-sum
    buffer instead). The bound keeps that buffer (rows x NC floats per thread) within the L2; 0
    where it would not exceed MC, the weight fits, or the precision is not fp32."""
    if precision != "fp32" or K * NP * 4 <= caches.l3 // 2:
        return 0
    rows = caches.l2 // (4 * NC) // MR * MR
    return rows if rows > MC else 0


@dataclass(frozen=True)
class _Geometry:
    """Static extents of one generated kernel (the config clamped to the problem)."""

    K: int
    N: int
    NP: int      # N padded to a multiple of nr
    MR: int
    NR: int
    MC: int
    NC: int      # min(nc, NP)
    KC: int      # min(kc, K); bf16: rounded up to BF16_K_BLOCK when K takes several blocks
    precision: str = "fp32"
    l1: int = 32 * 1024   # the core's L1 data cache (bytes): whether a weight panel stays there between row passes
    x_in_place: bool = False   # the micro-kernel reads X itself (fp32 SIMD), not packed X panels
    tall_rows: int = 0    # up to this many rows one block takes all of M (0: MC-row blocks always)

    @staticmethod
    def of(cfg: TileConfig, K: int, N: int, precision: str = "fp32", l1: int | None = None) -> "_Geometry":
        if not (isinstance(K, int) and isinstance(N, int) and K >= 1 and N >= 1):
            raise GemmError(f"GEMM extents must be positive ints, got K={K!r}, N={N!r}")
        check_precision(precision)
        NP = _round_up(N, cfg.nr)
        KC = min(cfg.kc, K)
        if precision == "bf16":
            KC = min(_round_up(KC, BF16_K_BLOCK), K)   # whole AMX tile depths: only the last block is short
        elif precision == "int8":
            KC = min(_round_up(KC, INT8_K_BLOCK), K)   # whole AMX int8 tile depths: only the last block is short
        caches = host_caches()
        NC = min(cfg.nc, NP)
        return _Geometry(K=K, N=N, NP=NP, MR=cfg.mr, NR=cfg.nr, MC=cfg.mc, NC=NC, KC=KC,
                         precision=precision, l1=l1 or caches.l1,
                         tall_rows=tall_rows(K, NP, cfg.mr, cfg.mc, NC, precision, caches))

    @property
    def KP(self) -> int:
        """K as packed: fp32 K; bf16 K rounded up to BF16_K_BLOCK, int8 K to INT8_K_BLOCK (each K block
        zero-padded to it)."""
        return _round_up(self.K, self.k_granule)

    @property
    def k_granule(self) -> int:
        """The packed K step K blocks are whole multiples of: 1 (fp32), a bf16 or an int8 AMX tile depth."""
        return {"fp32": 1, "bf16": BF16_K_BLOCK, "int8": INT8_K_BLOCK}[self.precision]

    @property
    def k_lane(self) -> int:
        """k values per 32-bit lane of a packed panel: 1 (fp32), 2 (a bf16 pair), 4 (an int8 quad)."""
        return 4 // OPERAND_BYTES[self.precision]

    @property
    def KCP(self) -> int:
        """A K block's packed depth: KC rounded up to :attr:`k_granule`."""
        return _round_up(self.KC, self.k_granule)

    @property
    def panel_stays_in_l1(self) -> bool:
        """Whether a K block of one weight panel and of one X panel fit ~3/4 of L1 together (the
        GotoBLAS sizing of ``kc``), so the row passes after the first find the weight panel there.
        Small-M configurations size ``kc`` for the X panel alone; their weight panel streams from L2
        on every pass."""
        per_k = OPERAND_BYTES[self.precision]             # bytes per k of each operand
        return (self.NR + self.MR) * self.KCP * per_k <= self.l1 * 3 // 4

    @property
    def n_nblocks(self) -> int:
        return -(-self.NP // self.NC)

    def tasks(self, M: int, threads: int) -> int:
        """The macro-kernel's task count at M rows on ``threads`` threads (its C computes the same):
        :func:`row_blocks` x N blocks, N cut finer, in whole panels, when that is fewer than the
        threads."""
        n_mblocks = row_blocks(M, self.MC, self.MR, self.n_nblocks, threads, self.tall_rows)
        nc = self.NC
        if n_mblocks * self.n_nblocks < threads:
            panels = self.NP // self.NR
            parts = min(panels, -(-threads // n_mblocks))
            nc = -(-panels // parts) * self.NR
        return n_mblocks * -(-self.NP // nc)

    @property
    def n_kblocks(self) -> int:
        return -(-self.K // self.KC)


def packed_size(cfg: TileConfig, K: int, N: int, precision: str = "fp32") -> int:
    """Number of elements (floats; bf16: uint16; int8: int32 lanes) :func:`prepack_weights` produces."""
    g = _Geometry.of(cfg, K, N, precision)
    return g.KP // 4 * g.NP + g.NP if precision == "int8" else g.KP * g.NP


def prepack_weights(W: np.ndarray, cfg: TileConfig, precision: str = "fp32", x_offset: int = 0) -> np.ndarray:
    """W[K, N] → the flat, 64-byte-aligned float32 panel layout the kernel streams.

    Columns are zero-padded up to a multiple of ``nr`` here, once (local padding: the
    micro-kernel then never tests column bounds). ``precision="bf16"``: uint16 bfloat16 bit
    patterns in the pair layout of the module docstring (per panel, per pair of rows, ``nr``
    lanes of ``(W[k, j], W[k+1, j])``; K zero-padded to a multiple of ``BF16_K_BLOCK``).
    ``precision="int8"``: W's integers (in [-128, 127]) as int8 quads (per panel, per quad of rows,
    ``nr`` lanes of ``W[k..k+3, j]``; K zero-padded to a multiple of ``INT8_K_BLOCK``), followed by the NP int32
    column corrections ``x_offset * sum_k W[k, j]`` (the kernel packs X as ``X - x_offset``).
    """
    W = np.asarray(W)
    if W.ndim != 2:
        raise GemmError(f"weight must be 2-D [K, N], got shape {W.shape}")
    K, N = W.shape
    g = _Geometry.of(cfg, int(K), int(N), precision)
    if precision == "int8":
        return _prepack_int8(W, g, x_offset)
    if precision == "bf16":
        bits = np.zeros((g.KP, g.NP), np.uint16)
        bits[:g.K, :g.N] = to_bf16_bits(W)
        out = _aligned_empty(g.KP * g.NP, dtype=np.uint16)
        np.copyto(out.reshape(g.NP // g.NR, g.KP // 2, g.NR, 2),     # [q, 2, panel, nr] -> [panel, q, nr, 2]
                  bits.reshape(g.KP // 2, 2, g.NP // g.NR, g.NR).transpose(2, 0, 3, 1))
        return out
    out = _aligned_empty(g.K * g.NP)
    panels = out.reshape(g.NP // g.NR, K, g.NR)          # [panel, k, nr]: one strided copy, no padded W
    full, rest = divmod(N, g.NR)
    if full:
        np.copyto(panels[:full], W[:, :full * g.NR].reshape(K, full, g.NR).transpose(1, 0, 2))
    if rest:                                             # the last panel: its columns past N are zeros
        panels[full] = 0.0
        panels[full, :, :rest] = W[:, full * g.NR:]
    return out


def int8_weight_fits(W: np.ndarray) -> bool:
    """Whether every element of ``W`` is an integer in [-128, 127] (an int8 GEMM's weight)."""
    return bool(np.all(np.trunc(W) == W)) and float(W.min(initial=0.0)) >= -128 and float(W.max(initial=0.0)) <= 127


def _prepack_int8(W: np.ndarray, g: _Geometry, x_offset: int) -> np.ndarray:
    if not int8_weight_fits(W):
        raise GemmError("an int8 GEMM's weight must hold integers in [-128, 127]")
    if g.K > INT8_MAX_K:
        raise GemmError(f"an int8 GEMM sums K <= {INT8_MAX_K} products in int32; K = {g.K}")
    q = np.zeros((g.KP, g.NP), np.int8)
    q[:g.K, :g.N] = W.astype(np.int8)
    panels = g.KP // 4 * g.NP
    out = _aligned_empty(panels + g.NP, dtype=np.int32)
    np.copyto(out[:panels].view(np.int8).reshape(g.NP // g.NR, g.KP // 4, g.NR, 4),   # [panel, quad, nr, 4]
              q.reshape(g.KP // 4, 4, g.NP // g.NR, g.NR).transpose(2, 0, 3, 1))
    out[panels:] = int(x_offset) * q.sum(axis=0, dtype=np.int64)
    return out


def _aligned_empty(n: int, align: int = 64, dtype=np.float32) -> np.ndarray:
    item = np.dtype(dtype).itemsize
    raw = np.empty(n * item + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    return raw[offset:offset + n * item].view(dtype)


def aligned_copy(a: np.ndarray, align: int = 64) -> np.ndarray:
    """``a`` (float32, or bf16 panels as uint16) in a buffer starting on an ``align``-byte boundary:
    packed weight panels are streamed in whole cache lines, and a panel split across lines costs up
    to 2x on small M."""
    if a.ctypes.data % align == 0:
        return a
    out = _aligned_empty(a.size, align, dtype=a.dtype).reshape(a.shape)
    out[...] = a
    return out


# --------------------------------------------------------------------------------------
# C generation


#: per (ISA, lane type): the vector type and the spelling of each operation the micro-kernels use
_VECTOR_OPS = {
    ("avx512", "float"): dict(type="__m512", zero="_mm512_setzero_ps()", load="_mm512_loadu_ps({p})",
                              store="_mm512_storeu_ps({p}, {v});", set1="_mm512_set1_ps({x})",
                              add="_mm512_add_ps({a}, {b})", fma="_mm512_fmadd_ps({a}, {b}, {c})"),
    ("avx2", "float"): dict(type="__m256", zero="_mm256_setzero_ps()", load="_mm256_loadu_ps({p})",
                            store="_mm256_storeu_ps({p}, {v});", set1="_mm256_set1_ps({x})",
                            add="_mm256_add_ps({a}, {b})", fma="_mm256_fmadd_ps({a}, {b}, {c})"),
    # the int8 kernels' int32 lanes: accumulators, W quads and broadcast X quads
    ("avx512", "int32"): dict(type="__m512i", zero="_mm512_setzero_si512()",
                              load="_mm512_loadu_si512((const void*)({p}))",
                              store="_mm512_storeu_si512((void*)({p}), {v});", set1="_mm512_set1_epi32((int){x})",
                              add="_mm512_add_epi32({a}, {b})"),
}


class _Vec:
    """The handful of SIMD operations the micro-kernel needs, per ISA and lane type (float, or the
    int8 kernels' int32)."""

    def __init__(self, isa: str, lanes: str = "float"):
        self.isa, self.width = isa, VECTOR_WIDTH[isa]
        self._ops = _VECTOR_OPS.get((isa, lanes), {})
        self.type = self._ops.get("type", "float")

    def zero(self):
        return self._ops["zero"]

    def load(self, ptr):
        return self._ops["load"].format(p=ptr)

    def store(self, ptr, v):
        return self._ops["store"].format(p=ptr, v=v)

    def set1(self, x):
        return self._ops["set1"].format(x=x)

    def fma(self, a, b, c):
        return self._ops["fma"].format(a=a, b=b, c=c)

    def add(self, a, b):
        return self._ops["add"].format(a=a, b=b)


def check_host_isa(isa: str, precision: str = "bf16") -> str:
    """``isa`` if this host runs kernels generated for it (AMX: at ``precision``); else
    :class:`GemmError` saying what it lacks."""
    host = host_isa()
    if isa == "amx":
        from tscomp.schedule.target import host_cpu
        spec = host_cpu().spec
        if not (spec.amx_int8 if precision == "int8" else spec.amx):
            raise GemmError(f"ISA amx requested but this CPU has no AMX {'int8' if precision == 'int8' else 'bf16'} "
                            f"tiles (or the OS does not grant them)")
    elif ISA_RANK[isa] > ISA_RANK[host]:
        raise GemmError(f"ISA {isa} requested but this host only supports {host}")
    return isa


def _c_name(name: str) -> str:
    if not _IDENT.match(name):
        raise GemmError(f"kernel name {name!r} is not a C identifier")
    return name


def generate_gemm(cfg: TileConfig, K: int, N: int, isa: str, epilogue: Epilogue | None = None,
                  name: str = "tscomp_gemm", precision: str = "fp32", l1: int | None = None,
                  x_offset: int = 0) -> str:
    """C source of the macro-kernel ``void name(const float* X, const float* Wpacked, float* Y,
    int64_t M, <epilogue args>)`` for ``Y[M, N] = epilogue(X[M, K] · W[K, N])``; with
    ``precision="bf16"`` Wpacked holds :func:`prepack_weights`'s bf16 pairs (the pointer type stays
    ``const float*`` so every caller's prototype is the same) and the inner product is VDPBF16PS.
    ``l1``: the target core's L1 data cache in bytes (default: this host's), which decides whether
    the row passes after a panel's first re-read it from L1 without prefetching it. ``precision="int8"``:
    Wpacked holds :func:`prepack_weights`'s int8 quads and column corrections for ``x_offset``, X's
    elements are integers in [x_offset, x_offset + 255]."""
    cfg.validate(isa)
    check_precision(precision, isa)
    bf16, int8 = precision == "bf16", precision == "int8"
    amx = isa == "amx"
    # fp32 SIMD kernels broadcast X's elements where X lies; bf16, int8, AMX and scalar kernels pack it
    g = dataclasses.replace(_Geometry.of(cfg, K, N, precision, l1),
                            x_in_place=precision == "fp32" and isa in ("avx2", "avx512"))
    name = _c_name(name)
    epi_params = "".join(f", {a.c_param()}" for a in epilogue.args) if epilogue else ""
    epi_names = "".join(f", {a.name}" for a in epilogue.args) if epilogue else ""
    L: list[str] = []
    emit = L.append

    epi_text = (f"{epilogue.label}: Y = {epilogue.expr}" if epilogue else "none (Y = acc)").replace("*/", "* /")
    epi_text = epi_text if "\n" not in epi_text else f"{epilogue.label} (see the epilogue loop)"
    emit(f"""/*
 * tscomp CPU GEMM macro-kernel `{name}` (generated; do not edit).
 *
 *   Y[M, N] = epilogue(X[M, K] . W[K, N]),  K = {K}, N = {N} static, M dynamic (argument)
 *
 * ISA:        {_isa_text(isa, g)}
 * Precision:  {_precision_text(g)}
 * Tiles:      {cfg.describe()}
 *             (TSCompiler 5.1: <T_Mb,T_Nb,T_Kb> = <{g.MC},{g.NC},{g.KC}> one OpenMP task per Mb x Nb block;
 *              <T_Mi,T_Ni> = <{g.MR},{g.NR}> accumulators held in registers over each Kb step)
 * Epilogue:   {epi_text}
 * Row pass:   {(epilogue.row_label or 'row reduction') + ' over each task' + "'" + 's whole rows, after its last K step' if epilogue is not None and epilogue.row_pass.strip() else 'none'}
 * Padding:    local padding (DietCode 4.1): W columns zero-padded to {g.NP} when prepacked;
 *             {_x_text(g)};
 *             the FMA loop never tests bounds, the final store is guarded.
 * Prefetch:   {_prefetch_text(isa, g)}
 * Row tail:   {'the last row panel (M mod MR rows) runs a micro-kernel of exactly that height (FTuner: two tile sizes, no padded rows)' if isa not in ('scalar', 'amx') and g.MR > 1 else 'padded to MR rows'}
 */
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
{'#include <immintrin.h>' if isa != 'scalar' else ''}

#define K   {g.K}
#define N   {g.N}
#define NP  {g.NP}   /* N padded to a multiple of NR */
#define MR  {g.MR}
#define NR  {g.NR}
#define MC  {g.MC}
#define NC  {g.NC}
#define KC  {g.KC}{_bf16_defines(g) if bf16 else ''}{_int8_defines(g, x_offset) if int8 else ''}{_amx_defines(g) if amx else ''}
#define N_NBLOCKS {g.n_nblocks}
#define N_KBLOCKS {g.n_kblocks}
#define BALANCE_TASKS_PER_THREAD {BALANCE_TASKS_PER_THREAD}
#define TALL_ROWS {g.tall_rows}   /* rows up to which one block takes all of M (0: never) */

static inline int64_t min_i64(int64_t a, int64_t b) {{ return a < b ? a : b; }}
{AFFINITY_C}""")
    if epilogue is not None:
        emit(math_helpers("\n".join((epilogue.expr, epilogue.body, epilogue.row_pass, epilogue.a_prologue))))
    if epilogue is not None and epilogue.prelude:
        emit(epilogue.prelude)
    if amx:
        _emit_amx_setup(emit, g)
        _emit_pack_amx(emit, g, x_offset)
    elif bf16:
        _emit_pack_bf16(emit, g)
    elif int8:
        _emit_int8_helpers(emit)
    elif not g.x_in_place:
        _emit_pack(emit, g)
    _emit_micro_kernel(emit, g, isa, epilogue, epi_params, epi_names)
    rows = epilogue is not None and bool(epilogue.row_pass.strip())
    if rows:
        emit(f"""/* Row pass ({epilogue.row_label or 'row reduction'}): rows [m0, m0 + mv) of Y are complete
 * ({'this task covers all N columns, so they are still in cache' if g.n_nblocks == 1 else
    'N is split over tasks: called after every tile is stored'}); statistics per row, then the normalized row. */
static void row_pass(float* restrict Y, int64_t m0, int64_t mv{epi_params})
{{
{epilogue.row_pass.rstrip()}
}}
""")
    pro = epilogue is not None and bool(epilogue.a_prologue.strip())
    if pro:
        emit(f"""/* A prologue: the GEMM's A operand [M, K] computed from the group inputs into X (the caller
 * passes a writable scratch as X), one parallel elementwise pass before the tiles start. */
static void a_prologue(float* restrict Xa, int64_t M{epi_params})
{{
{epilogue.a_prologue.rstrip()}
}}
""")
    _emit_macro_kernel(emit, g, name, epi_params, epi_names, row_pass=rows, a_prologue=pro, amx=amx)
    return "\n".join(L)


def _prefetch_text(isa: str, g: "_Geometry") -> str:
    if isa == "scalar":
        return "none (hardware prefetchers only)"
    if isa == "amx":
        return (f"the weight stream {L2_PREFETCH_LINES} cache line(s) per K row into L2, the next panel"
                if L2_PREFETCH_LINES else "none (hardware prefetchers only)")
    stream = (f"the weight stream {L2_PREFETCH_LINES} cache line(s) per K row into L2 (the next panel, spread over the "
              f"first NR/16 row passes; per {L2_STREAM_K_STRIDE} K rows over {L2_STREAM_K_STRIDE} x NR/16 passes in a task "
              f"that has that many)" if L2_PREFETCH_LINES else "")
    panel = (f"the weight panel {PREFETCH_K_STEPS} k steps ahead into L1 (thin tiles further: "
             f"{PREFETCH_ONE_ROW_K_STEPS} / rows) "
             + ("on its first row pass (later passes find it in L1)" if g.panel_stays_in_l1
                else "on every row pass (it is larger than L1)"))
    return f"{panel};\n *             {stream}" if stream else panel


def _x_text(g: _Geometry) -> str:
    if g.x_in_place:
        return ("X read in place (MR rows K floats apart, no packing); the last row panel runs a kernel\n"
                " *             of exactly its height, so no row past M is read")
    return "X packed per task and K block into MR-row panels, rows past M zero-filled"


def _isa_text(isa: str, g: _Geometry) -> str:
    if isa == "amx":
        c, a = _amx_tiles(g)
        acc, x, w, op = (("int32", "64 u8", "s8 quads", "TDPBUSD") if g.precision == "int8" else
                         ("fp32", "32 bf16", "bf16 pairs", "TDPBF16PS"))
        return (f"amx (AMX tile unit: {c} {acc} accumulator tile{'s' if c > 1 else ''} of 16x16, {a} A tile{'s' if a > 1 else ''} "
                f"of 16 rows x {x}, B tiles of 16 {w} x 16 columns; {op}; epilogue on AVX-512)")
    vw = VECTOR_WIDTH[isa]
    return f"{isa} ({vw} float{'s' if vw > 1 else ''} per vector{', FMA intrinsics' if isa != 'scalar' else ', portable C'})"


def _precision_text(g: _Geometry) -> str:
    if g.precision == "int8":
        return ("int8 operands, int32 accumulation: W packed as s8 quads along K (VPDPBUSD / AMX B-tile layout, "
                f"K blocks padded to multiples of {INT8_K_BLOCK}), X packed as u8 X - XLO; the sums corrected by "
                "XLO x colsum(W), converted to fp32 once, epilogue in fp32")
    if g.precision == "bf16":
        return ("bf16 operands, fp32 accumulation: W packed as bf16 pairs along K (VDPBF16PS / AMX B-tile layout, "
                f"K blocks padded to multiples of {BF16_K_BLOCK}), X rounded to bf16 (nearest even) while packed; "
                "epilogue in fp32")
    return "fp32 (operands, accumulation and epilogue)"


def _bf16_defines(g: _Geometry) -> str:
    return f"""
#define KP  {g.KP}   /* K as packed: rounded up to a whole AMX tile depth (bf16 pairs) */
#define KQ  {(g.KC + 1) // 2}   /* bf16 pairs per K block (KC rounded up to even, halved) */
#define KROW {_round_up(g.KC, 32) + 32}   /* bf16 row buffer of the X packing: whole 32-lane conversions */"""


#: fp32 -> bf16 rows, rounded to nearest even: the one conversion the bf16 packings share (X for the
#: VDPBF16PS and AMX GEMMs here; Q, K, V and P in the AMX attention of cpu_attention)
BF16_ROW_C = """/* n floats -> bf16 (round to nearest even: VCVTNE2PS2BF16 32 at a time, the low half from the first
 * vector, then masked 16s), zero up to npad (a multiple of 16): the lanes past n load as 0 */
static inline void ts_bf16_row(const float* restrict src, uint16_t* restrict dst, int64_t n, int64_t npad)
{
    int64_t c = 0;
    for (; c + 32 <= n; c += 32)
        _mm512_storeu_si512(dst + c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + c + 16), _mm512_loadu_ps(src + c)));
    for (; c < npad; c += 16) {
        const int64_t left = n - c;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
        _mm256_storeu_si256((__m256i*)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + c)));
    }
}
"""


def _emit_pack_bf16(emit, g: _Geometry):
    emit(BF16_ROW_C)
    _emit_lane_pack(emit, "bf16 pairs", 2, """(bf16 X[m0 + p*MR + r, k0 + 2q], bf16 X[.., k0 + 2q + 1]) as one
 * 32-bit lane (low half the even k), rounded to nearest even by VCVTNE2PS2BF16. An odd kl leaves the
 * last pair's high half zero""", "ts_bf16_row(src, (uint16_t*)row, kl, (kl + 15) / 16 * 16);")


def _emit_lane_pack(emit, what: str, per_lane: int, lane_text: str, convert_row: str) -> None:
    """``pack_x`` of the kernels whose X panels hold ``per_lane`` k values per 32-bit lane (bf16
    pairs, int8 quads): each row of the block converted into ``row`` (``convert_row``: C reading
    ``src``, the row's first element), then its lanes dealt into the MR-row panel."""
    emit(f"""/* Pack rows [m0, m0 + mv) x columns [k0, k0 + kl) of X into MR-row panels of {what}:
 * panel p holds xp[p*MR*KQ + q*MR + r] = {lane_text}; rows past M are zero (local padding): the
 * micro-kernel needs no tests. */
static void pack_x(const float* restrict X, int64_t m0, int64_t mv, int64_t k0, int64_t kl,
                   uint32_t* restrict xp)
{{
    uint32_t row[KROW / {per_lane}] __attribute__((aligned(64)));   /* one row of the block as 32-bit lanes */
    const int64_t kq = (kl + {per_lane - 1}) / {per_lane};
    for (int64_t p = 0; p * MR < mv; ++p) {{
        uint32_t* restrict dst = xp + p * (MR * KQ);
        const int64_t rows = min_i64(MR, mv - p * MR);
        for (int r = 0; r < MR; ++r) {{
            if (r >= rows) {{
                for (int64_t q = 0; q < kq; ++q)
                    dst[q * MR + r] = 0u;
                continue;
            }}
            const float* restrict src = X + (m0 + p * MR + r) * (int64_t)K + k0;
            {convert_row}
            for (int64_t q = 0; q < kq; ++q)
                dst[q * MR + r] = row[q];
        }}
    }}
}}
""")


def _int8_defines(g: _Geometry, x_offset: int) -> str:
    return f"""
#define KP  {g.KP}   /* K as packed: rounded up to a whole quad */
#define KQ  {(g.KC + 3) // 4}   /* int8 quads per K block */
#define KROW {_round_up(g.KC, 16) + 16}   /* byte row buffer of the X packing: whole 16-lane conversions */
#define XLO {int(x_offset)}   /* X's smallest value: X is packed as the byte X - XLO */"""


#: floats holding integers -> the bytes the int8 kernels multiply: X's rows for the VPDPBUSD and AMX
#: GEMMs (XLO: the kernel's define)
U8_ROW_C = """/* n floats holding integers in [XLO, XLO + 255] -> the bytes x - XLO (exact), zero up to a
 * multiple of 16 */
static inline void ts_u8_row(const float* restrict src, uint8_t* restrict dst, int64_t n)
{
    const __m512i lo = _mm512_set1_epi32(XLO);
    for (int64_t c = 0; c < n; c += 16) {
        const int64_t left = n - c;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        const __m512i u = _mm512_maskz_sub_epi32(m, _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(m, src + c)), lo);
        _mm_storeu_si128((__m128i*)(dst + c), _mm512_cvtepi32_epi8(u));
    }
}
"""


def _emit_int8_helpers(emit):
    """The int8 kernels' dot-product step and their X packing."""
    emit("""/* acc += the four u8 x s8 products of each 32-bit lane of x and w (VPDPBUSD). Written in assembly:
 * GCC 12 allocates _mm512_dpbusd_epi32's result apart from its accumulator and copies every
 * accumulator back on every k step (an 8x48 tile ran at half the rate of an 8x32 one). */
static inline __attribute__((always_inline)) __m512i ts_dpbusd(__m512i acc, __m512i x, __m512i w)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
}
""")
    emit(U8_ROW_C)
    _emit_lane_pack(emit, "byte quads", 4, """the bytes X[m0 + p*MR + r, k0 + 4q .. 4q + 3] - XLO as
 * one 32-bit lane (lowest byte the first k); X holds integers in [XLO, XLO + 255] (the graph stage's
 * integer range), so each converts exactly, and the bytes of a short last quad multiply the zero
 * padding of W""", "ts_u8_row(src, (uint8_t*)row, kl);")


def _amx_defines(g: _Geometry) -> str:
    return f"""
#define KCP {g.KCP}   /* a K block's packed depth in the X panels: whole {amx_k(g.precision)}-deep tile steps */"""


def _amx_tiles(g: _Geometry) -> tuple[int, int]:
    """(accumulator tiles, A tiles) of an AMX register tile; the remaining registers hold B tiles."""
    return (g.MR // AMX_ROWS) * (g.NR // AMX_ROWS), g.MR // AMX_ROWS


def _emit_amx_setup(emit, g: _Geometry) -> None:
    """The tile-register configuration every thread loads, and the process's request for the tile
    state (Linux grants AMX per process on request: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA))."""
    used = AMX_TILE_REGISTERS
    emit(f"""/* AMX: the kernel asks Linux for the tile state when its library is loaded (idempotent; the
 * runtime checked at load that it is granted), and each thread configures its {used} tile registers
 * as 16 rows x 64 bytes (fp32 16x16 accumulators, bf16 16x32 A rows, 16 bf16-pair rows of B). */
extern long syscall(long number, ...);
__attribute__((constructor)) static void amx_request_tile_state(void)
{{
    syscall(158 /* SYS_arch_prctl */, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
}}

static void amx_configure(void)
{{
    struct {{ uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }}
        __attribute__((packed, aligned(64))) cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < {used}; ++t) {{ cfg.colsb[t] = 64; cfg.rows[t] = 16; }}
    _tile_loadconfig(&cfg);
}}
""")


def _emit_pack_amx(emit, g: _Geometry, x_offset: int = 0) -> None:
    if g.precision == "int8":
        _emit_pack_amx_int8(emit)
        return
    emit(BF16_ROW_C)
    emit("""/* Pack rows [m0, m0 + mv) x columns [k0, k0 + kl) of X for the AMX A tiles: MR-row panels,
 * row-major bf16, KCP elements (a whole number of 64-byte tile rows) per row:
 * xp[(p*MR + r)*KCP + k] = bf16 X[m0 + p*MR + r, k0 + k], rounded to nearest even (VCVTNE2PS2BF16).
 * Columns past kl up to the next multiple of 32 and rows past M are zero (local padding). */
static void pack_x(const float* restrict X, int64_t m0, int64_t mv, int64_t k0, int64_t kl,
                   uint16_t* restrict xp)
{
    const int64_t kp = (kl + 31) / 32 * 32;
    const int64_t rows = (mv + MR - 1) / MR * MR;
    for (int64_t r = 0; r < rows; ++r) {
        uint16_t* restrict dst = xp + r * KCP;
        if (r >= mv) {
            memset(dst, 0, sizeof(uint16_t) * kp);
            continue;
        }
        ts_bf16_row(X + (m0 + r) * (int64_t)K + k0, dst, kl, kp);
    }
}
""")


def _emit_pack_amx_int8(emit) -> None:
    emit(U8_ROW_C)
    emit(f"""/* Pack rows [m0, m0 + mv) x columns [k0, k0 + kl) of X for the AMX int8 A tiles: MR-row panels,
 * row-major bytes, KCP per row: xp[(p*MR + r)*KCP + k] = X[m0 + p*MR + r, k0 + k] - XLO (exact: X holds
 * integers in [XLO, XLO + 255]). Columns past kl up to the next multiple of {INT8_K_BLOCK} and rows past M are
 * zero (local padding: the padded columns multiply W's zero padding). */
static void pack_x(const float* restrict X, int64_t m0, int64_t mv, int64_t k0, int64_t kl,
                   uint8_t* restrict xp)
{{
    const int64_t kp = (kl + {INT8_K_BLOCK - 1}) / {INT8_K_BLOCK} * {INT8_K_BLOCK}, kw = (kl + 15) / 16 * 16;
    const int64_t rows = (mv + MR - 1) / MR * MR;
    for (int64_t r = 0; r < rows; ++r) {{
        uint8_t* restrict dst = xp + r * KCP;
        if (r >= mv) {{
            memset(dst, 0, kp);
            continue;
        }}
        ts_u8_row(X + (m0 + r) * (int64_t)K + k0, dst, kl);   /* writes kw bytes */
        memset(dst + kw, 0, kp - kw);
    }}
}}
""")


def _emit_amx_body(emit, g: _Geometry, epilogue: "Epilogue | None") -> None:
    """An MR x NR register tile on the AMX unit: (MR/16) x (NR/16) accumulator tiles, per 32-deep K
    step the A tiles loaded once and each B tile loaded once and multiplied into its column of
    accumulators (TDPBF16PS). Registers: accumulators first, then A, then B (rotating when fewer
    B registers are left than B tiles)."""
    n_c, n_a = _amx_tiles(g)
    ncol = g.NR // AMX_ROWS
    b_regs = list(range(n_c + n_a, AMX_TILE_REGISTERS))
    acc = [[a * ncol + c for c in range(ncol)] for a in range(n_a)]
    int8 = g.precision == "int8"
    depth, x_bytes = amx_k(g.precision), OPERAND_BYTES[g.precision]
    dot = "_tile_dpbusd" if int8 else "_tile_dpbf16ps"
    emit(f"    const int64_t ks = (kl + {depth - 1}) / {depth};   /* {depth}-deep tile steps (the packed depth is padded to {depth}) */")
    emit("    if (first) {")
    emit("        " + " ".join(f"_tile_zero({t});" for row in acc for t in row))
    emit("    } else {")
    for a, row in enumerate(acc):
        emit("        " + " ".join(f"_tile_loadd({t}, ct + {a * AMX_ROWS * g.NR + c * AMX_ROWS}, NR * 4);"
                                   for c, t in enumerate(row)))
    emit("    }")
    # the weight stream into L2, at the SIMD kernels' rate per K pair-row (see wn)
    prefetch = [f"        for (int l = 0; l < {AMX_ROWS * L2_PREFETCH_LINES}; ++l)",
                f"            _mm_prefetch((const char*)(wn + (s * {AMX_ROWS * L2_PREFETCH_LINES} + l) * 16), _MM_HINT_T1);"
                ] if L2_PREFETCH_LINES else []
    emit_amx_tile_steps(emit, acc, b_regs, dot, "no bounds tests (local padding)",
                        lambda a: (f"xp + {a * AMX_ROWS} * KCP + s * {depth}", f"KCP * {x_bytes}"),
                        lambda c: (f"wp + s * {AMX_ROWS} * NR + {c * AMX_ROWS}", "NR * 4"), prefetch)

    def store_tiles(base: str, stride: str) -> None:
        for a, row in enumerate(acc):
            emit("        " + " ".join(f"_tile_stored({t}, {base} + {a * AMX_ROWS} * {stride} + {c * AMX_ROWS}, "
                                       f"{stride} * 4);" for c, t in enumerate(row)))

    emit("    if (!last) {  /* partial sums to the per-thread buffer */")
    store_tiles("ct", "NR")
    emit("        return;")
    emit("    }")
    if epilogue is None and not int8:
        emit("    if (mv == MR && nv == NR) {  /* interior tile: the tiles straight to Y */")
        store_tiles("(Y + i0 * N + j0)", "N")
        emit("        return;")
        emit("    }")
    emit("    float tile[MR * NR] __attribute__((aligned(64)));")
    emit("    {")
    store_tiles("tile", "NR")
    emit("    }")
    if int8:
        emit("""    /* the exact int32 sums of X - XLO, plus the column corrections XLO x colsum(W), converted to fp32 once */
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; c += 16) {
            float* restrict t = tile + r * NR + c;
            _mm512_store_ps(t, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512((const void*)t),
                                                                   _mm512_loadu_si512((const void*)(corr + j0 + c)))));
        }""")
    if epilogue is None:
        emit("""    for (int64_t r = 0; r < mv; ++r)       /* edge tile: guarded store of the valid part */
        memcpy(Y + (i0 + r) * N + j0, tile + r * NR, sizeof(float) * nv);""")
    else:
        _emit_epilogue_loop(emit, epilogue)


def emit_amx_tile_steps(emit, acc: list[list[int]], b_regs: list[int], dot: str, comment: str, a_tile, b_tile,
                        between=()) -> None:
    """The K loop of an AMX register tile over ``ks`` steps: per step the A tiles (``a_tile(a)`` ->
    (address, row stride in bytes), in the registers after the accumulators) loaded once, then each
    B tile (``b_tile(c)``) loaded into a rotating register and multiplied by ``dot`` (TDPBF16PS or
    TDPBUSD) into its column of accumulators ``acc[a][c]``. ``between``: C lines after the A loads."""
    n_c = sum(len(row) for row in acc)
    emit(f"    for (int64_t s = 0; s < ks; ++s) {{  /* {dot[1:].upper().replace('TILE_', 'T')} loop: {comment} */")
    for a in range(len(acc)):
        emit("        _tile_loadd({}, {}, {});".format(n_c + a, *a_tile(a)))
    for line in between:
        emit(line)
    for c in range(len(acc[0])):
        reg = b_regs[c % len(b_regs)]
        emit("        _tile_loadd({}, {}, {});".format(reg, *b_tile(c)))
        emit("        " + " ".join(f"{dot}({acc[a][c]}, {n_c + a}, {reg});" for a in range(len(acc))))
    emit("    }")


def _emit_pack(emit, g: _Geometry):
    emit("""/* Pack rows [m0, m0 + mv) x columns [k0, k0 + kl) of X into MR-row panels, k-major:
 * panel p holds xp[p*MR*KC + k*MR + r] = X[m0 + p*MR + r, k0 + k]. Rows past M are zero
 * (local padding), so the micro-kernel computes full MR-row tiles unconditionally. */
static void pack_x(const float* restrict X, int64_t m0, int64_t mv, int64_t k0, int64_t kl,
                   float* restrict xp)
{
    for (int64_t p = 0; p * MR < mv; ++p) {
        float* restrict dst = xp + p * (MR * KC);
        const int64_t rows = min_i64(MR, mv - p * MR);
        if (rows == MR) {
            const float* restrict src = X + (m0 + p * MR) * (int64_t)K + k0;
            for (int64_t k = 0; k < kl; ++k)
                for (int r = 0; r < MR; ++r)
                    dst[k * MR + r] = src[r * (int64_t)K + k];
        } else {
            for (int64_t k = 0; k < kl; ++k)
                for (int r = 0; r < MR; ++r)
                    dst[k * MR + r] = r < rows ? X[(m0 + p * MR + r) * (int64_t)K + k0 + k] : 0.0f;
        }
    }
}
""")


def _emit_micro_kernel(emit, g: _Geometry, isa: str, epilogue: Epilogue | None, epi_params: str, epi_names: str):
    """The full-height micro-kernel, and (SIMD ISAs) one per shorter height for the last row panel.

    FTuner's combination of tile sizes applied to the register tile: M = q·MR + t runs q panels of
    the MR-row kernel and one of a t-row kernel, so a short or awkward M (9 rows under a 6-row tile)
    computes exactly its rows instead of a zero-padded second panel (12). The panel layout is the
    same (a partial panel is still packed MR wide); only the rows the kernel reads differ."""
    corr_param, corr_arg = _corrections(g)
    params = f"""int64_t kl, const {_x_operand(g, isa == 'amx')}* restrict xp, const {_operand(g)}* restrict wp,
    const {_operand(g)}* restrict wn, int pull, int stream_log2, float* restrict ct,
    int first, int last, float* restrict Y, int64_t i0, int64_t j0, int64_t mv, int64_t nv{corr_param}{epi_params}"""
    emit(f"""/* Micro-kernel: an MR x NR tile of accumulators over kl steps of k.
 *   xp: {_xp_text(g)}; wp: packed W panel (k-major, NR per k);
 *   wn: a stretch of weights to pull into L2 meanwhile (one cache line per streaming k step), or NULL;
 *   pull: prefetch wp's panel into L1 ahead of use (SIMD kernels; the panel's first row pass);
 *   stream_log2: the stream pulls its line on every (1 << stream_log2)-th k step (SIMD kernels);
 *   ct: this tile's slot in the per-thread partial-sum buffer (MR*NR floats{'; int8: int32 sums' if g.precision == 'int8' else ''});
 *   first: start from {'the column corrections corr[j0..]' if g.precision == 'int8' else 'zero'} (else from ct); last: apply the epilogue and store to Y
 *   (else save the partial sums to ct). (i0, j0): tile origin in Y; mv x nv: its valid
 *   part (< MR x NR only on the last row/column tiles: guarded store, nothing else). */
static inline __attribute__((always_inline)) void micro_kernel(
    {params})
{{""")
    if isa in ("scalar", "amx"):
        if isa == "scalar":
            _emit_scalar_body(emit, g, epilogue)
        else:
            _emit_amx_body(emit, g, epilogue)
        emit("}\n")
        emit(f"""/* {'Scalar code has no register tile to fit' if isa == 'scalar' else 'A tile multiply costs the same at 1 row as at 16'}: the last row panel runs the same kernel (padded rows). */
static inline void micro_kernel_tail(int64_t rows, {params})
{{
    (void)rows;
    micro_kernel(kl, xp, wp, wn, pull, stream_log2, ct, first, last, Y, i0, j0, mv, nv{corr_arg}{epi_names});
}}
""")
        return
    vec = _Vec(isa, "int32" if g.precision == "int8" else "float")
    _emit_simd_body(emit, g, vec, epilogue, g.MR)
    emit("}\n")
    for rows in range(1, g.MR):
        emit(f"""/* Row-tail micro-kernel: the last row panel holds {rows} of MR = {g.MR} rows. */
static __attribute__((noinline)) void micro_kernel_{rows}(
    {params})
{{""")
        _emit_simd_body(emit, g, vec, epilogue, rows)
        emit("}\n")
    cases = "\n".join(f"        case {r}: micro_kernel_{r}(kl, xp, wp, wn, pull, stream_log2, ct, first, last, Y, i0, j0, mv, nv"
                      f"{corr_arg}{epi_names}); return;" for r in range(1, g.MR))
    emit(f"""/* The last row panel (0 < rows < MR valid): the micro-kernel of exactly that height. Kept out of
 * line, like the kernels it calls, so that the full-height kernel's loop is compiled as before. */
static __attribute__((noinline)) void micro_kernel_tail(int64_t rows, {params})
{{
    switch (rows) {{
{cases}
        default: __builtin_unreachable();
    }}
}}
""")


def _corrections(g: _Geometry) -> tuple[str, str]:
    """The micro-kernels' extra parameter and argument: an int8 kernel's column corrections (the int32
    ``XLO x colsum(W)`` after the weight panels), where its accumulators start; nothing otherwise."""
    return (", const int32_t* restrict corr", ", corr") if g.precision == "int8" else ("", "")


def _xp_text(g: _Geometry) -> str:
    return "X at the tile's first row, column k0 (its MR rows K floats apart)" if g.x_in_place else \
        "packed X panel (k-major, MR per k)"


def _operand(g: _Geometry) -> str:
    """C element type of the packed X and W panels: float, or a 32-bit lane holding a bf16 pair or
    an int8 quad."""
    return "float" if g.precision == "fp32" else "uint32_t"


def _x_operand(g: _Geometry, amx: bool) -> str:
    """C element type of the packed X panel: AMX A tiles are rows of single bf16 or bytes, else :func:`_operand`."""
    if amx:
        return "uint8_t" if g.precision == "int8" else "uint16_t"
    return _operand(g)


def emit_accumulators(emit, v: "_Vec", MR: int, NR: int, start=None, stride: int | None = None) -> list[list[str]]:
    """Declare the MR x (NR / width) vector accumulators ``c<r>_<c>``: on the first K step zero, or
    ``start(c)`` for column vector c, else reloaded from the partial-sum tile ``ct`` (rows ``stride``
    floats apart: NR, or a wider tile's rows where a narrow tail kernel computes part of it)."""
    W = v.width
    stride = NR if stride is None else stride
    accs = [[f"c{r}_{c}" for c in range(NR // W)] for r in range(MR)]
    emit(f"    {v.type} " + ", ".join(a for row in accs for a in row) + ";")
    emit("    if (first) {")
    for row in accs:
        emit("        " + " ".join(f"{a} = {start(c) if start else v.zero()};" for c, a in enumerate(row)))
    emit("    } else {")
    for r, row in enumerate(accs):
        emit("        " + " ".join(f"{a} = {v.load(f'ct + {r * stride + c * W}')};" for c, a in enumerate(row)))
    emit("    }")
    return accs


def emit_fma_step(emit, v: "_Vec", accs: list[list[str]], vectors: list[str], broadcast, *,
                  indent: str = "        ", after_loads: tuple[str, ...] = ()) -> None:
    """One k step of a register tile held in ``accs`` (rows of vector accumulators): load the
    ``vectors`` (pointer expressions) as ``w0, w1, ...``, emit ``after_loads`` (prefetches), then per
    row one broadcast of ``broadcast(r)`` multiplied into that row's accumulators. Whichever operand
    :func:`~tscomp.codegen.register_operands.held_operand` picks is loaded once into a register."""
    emit_tile_step(emit, accs, [v.load(ptr) for ptr in vectors], [v.set1(broadcast(r)) for r in range(len(accs))],
                   v.fma, v.type, v.isa, indent=indent, after_loads=after_loads)


def emit_tile_step(emit, accs: list[list[str]], loads: list[str], broadcasts: list[str], madd, vtype: str, isa: str,
                   *, indent: str, after_loads: tuple[str, ...] = (), live_accumulators: int | None = None) -> None:
    """The statements of one k step: ``loads[c]`` (C expressions of the vectors), ``broadcasts[r]``
    (of the rows' broadcast operands), ``madd(x, w, acc)`` into ``accs[r][c]``. The operand held in
    registers (:func:`~tscomp.codegen.register_operands.held_operand`; the vectors where neither is)
    is made first, each in a local of its own, then ``after_loads``; then each element of the other
    operand in turn, multiplied into its accumulators. ``live_accumulators``: the accumulator
    registers live across the step (more than ``accs`` where several accumulator sets interleave)."""
    live = sum(map(len, accs)) if live_accumulators is None else live_accumulators
    held = held_operand(isa, live, len(loads), len(broadcasts))
    keep = (lambda name: " " + hold(name)) if held else (lambda name: "")
    vectors_first = held != BROADCASTS
    outer, inner = (loads, broadcasts) if vectors_first else (broadcasts, loads)
    o, i = ("w", "x") if vectors_first else ("x", "w")
    for n, value in enumerate(outer):
        emit(f"{indent}{vtype} {o}{n} = {value};{keep(f'{o}{n}')}")
    for line in after_loads:
        emit(indent + line)
    operands = (lambda n: ("x", f"w{n}")) if vectors_first else (lambda n: (f"x{n}", "w"))    # (x, w) of madd
    for m, value in enumerate(inner):
        row = [(accs[m][n] if vectors_first else accs[n][m], *operands(n)) for n in range(len(outer))]
        emit(f"{indent}{{ {vtype} {i} = {value};{keep(i)} "
             + " ".join(f"{a} = {madd(x, w, a)};" for a, x, w in row) + " }")


#: independent multiply-adds a core needs in flight to hide the FMA latency (latency 4 x up to 2
#: pipes): a register tile with fewer accumulators than this runs latency-bound
FMA_IN_FLIGHT = 8


def accumulator_sets(rows: int, nvec: int, max_accumulators: int) -> int:
    """Independent accumulator sets a ``rows x nvec`` register tile uses along k: enough that
    ``FMA_IN_FLIGHT`` multiply-adds are independent (a 1-row tail of one vector is otherwise one
    dependent chain, 4x slower per row than a full tile), as many as the register file holds."""
    tile = rows * nvec
    fit = max(1, max_accumulators // tile)
    return max(1, min(-(-FMA_IN_FLIGHT // tile), fit, 4))


#: k steps ahead the micro-kernel prefetches its weight panel into L1 (a software prefetch per cache
#: line). A model's weights reach a GEMM cold (from L3 or memory, see schedule/cold_start.py) and the
#: hardware prefetchers lose the stream at every 4 KiB page; measured (Xeon with AVX-512, 2 threads,
#: K=768 N=2304 r8x48, weights rotated over 160 MB): M=16 494 -> 346 us, M=139 2043 -> 1702 us,
#: M=498 5161 -> 4866 us, and 7-20% on K=3072 N=768; 8 steps ahead gained a little less, 32 less.
PREFETCH_K_STEPS = 16

#: k steps of a one-row micro-kernel (M = 1: a matrix-vector product) the prefetch runs ahead; a
#: k step of ``rows`` rows is ``rows`` FMAs per weight vector, so the distance that covers the same
#: time is this over ``rows`` (:func:`prefetch_k_steps`). Measured (AMD EPYC Zen 4, 2 threads, A/B
#: in one process against 16 for every tile): BERT-base at L = 1..9, weights from memory, 0.90-0.94x
#: (L = 64: 0.99x); tiny BERT's first call at L = 1..3 after calls at L = 64 (weights partly in L3)
#: 1.5-3.5 us faster; tiny BERT with its weights held in L2 (the same length over and over) 1.00-1.025x.
#: 128 gained another ~4% on BERT-base but cost tiny BERT's L2-resident calls 3-5%.
PREFETCH_ONE_ROW_K_STEPS = 64


def prefetch_k_steps(rows: int) -> int:
    """How far ahead (k steps) a micro-kernel of ``rows`` rows prefetches its weight panel:
    :data:`PREFETCH_K_STEPS` for full tiles, further for thin ones, whose k steps are a few cycles
    (16 steps of one row do not cover a panel line's trip from L3)."""
    return max(PREFETCH_K_STEPS, PREFETCH_ONE_ROW_K_STEPS // max(1, rows))

#: cache lines of the weight stream each streaming k step pulls into L2 ahead of its use (see the
#: macro-kernel's ``wn``): 0 turns the stream prefetch off
L2_PREFETCH_LINES = 1

#: k steps per streaming k step (a power of two) in a task with at least L2_STREAM_K_STRIDE x NR/16
#: row passes per panel: the SIMD kernels then pull a line of the next panel on every
#: L2_STREAM_K_STRIDE-th k step, the stream spread over that many times the passes (a task with fewer
#: rows streams on every k step: it has no passes to spare). One line per k step fetched the next
#: panel within its first NR/16 passes, a 147 KB panel in ~9 us (~16 GB/s from one core); our reading,
#: not measured directly, is that this is more than one core draws from memory here and the queued
#: prefetches held up the loop's own loads.
#: Measured (Xeon with AVX-512, 2 threads, weights rotated over 160 MB; every k step -> every second):
#: K=3072 N=768 r8x48_b64x384x768 M=64 1.033 -> 0.916 ms, M=128 1.991 -> 1.786, M=256 3.549 -> 3.407;
#: K=768 N=3072 r8x48_b256x768x192 M=64 1.014 -> 0.854, M=139 1.835 -> 1.726; warm weights unchanged.
#: Every fourth: worse again (too few passes left to cover the panel).
L2_STREAM_K_STRIDE = 2


def _emit_k_loop(emit, accs, nvec: int, W: int, k: str, count: str, what: str, elem: str, vtype: str, *,
                 isa: str, load, broadcast, madd, add=None, zero: str = "", acc_type: str = "", sets: int = 1,
                 prefetch: int = 0, stream_lines: int = 0, indent: str = "", x_row_stride: str = "") -> None:
    """The register tile's inner loop over ``count`` packed K steps (one fp32 k, or one bf16 pair):
    per step ``nvec`` W-panel vectors, then per row of the tile one broadcast X element multiplied
    into the row's accumulators (``madd(x, w, acc)``). With ``sets`` > 1 (a tile too small to hide
    the FMA latency), step ``k + s`` goes into a set of its own, summed into ``accs`` (``add``) after
    the loop. ``prefetch`` > 0: each step prefetches the weight panel that many steps ahead into L1
    (past the K block's end, that is the same panel's next K rows); ``stream_lines`` > 0: each step
    also pulls that many cache lines of the stretch ``wn`` into L2 (the macro-kernel's weight stream).
    ``indent`` prefixes every line (the loop inside a branch). ``isa`` decides which operand is held
    in registers (:func:`emit_tile_step`). ``x_row_stride``: X is read in place,
    row r of the tile at ``xp + r * x_row_stride`` (else X is a packed panel, MR elements per k)."""
    emit = (lambda line, _emit=emit: _emit(indent + line)) if indent else emit
    live = sum(map(len, accs)) * sets

    def step(kk: str, indent: str, names) -> None:
        xk = f"xp + ({kk})" if x_row_stride else f"xp + ({kk}) * MR"
        emit(f"{indent}{{ const {elem}* restrict wk = wp + ({kk}) * NR; const {elem}* restrict xk = {xk};")
        prefetches = []
        if prefetch:          # the weight panel PREFETCH_K_STEPS ahead, one prefetch per cache line
            for line in range(0, nvec * W * 4, 64):
                prefetches.append(f"_mm_prefetch((const char*)(wk + {prefetch} * NR) + {line}, _MM_HINT_T0);")
        if stream_lines:   # and ``stream_lines`` lines of the stretch ``wn`` into L2 every (1 << stream_log2)-th step
            step_line = f"(({kk}) >> stream_log2)"
            prefetches.append(f"if (!(({kk}) & ((1 << stream_log2) - 1))) {{  /* the weight stream into L2 */")
            for line in range(stream_lines):
                prefetches.append(f"  _mm_prefetch((const char*)(wn + {step_line} * {16 * stream_lines}) + {64 * line}, "
                                  f"_MM_HINT_T1);")
            prefetches.append("}")
        rows = [f"xk[{r} * {x_row_stride}]" if x_row_stride else f"xk[{r}]" for r in range(len(names))]
        emit_tile_step(emit, names, [load(f"wk + {c * W}") for c in range(nvec)], [broadcast(x) for x in rows],
                       madd, vtype, isa, indent=indent + "  ", after_loads=tuple(prefetches), live_accumulators=live)
        emit(f"{indent}}}")

    if sets == 1:
        emit(f"    for (int64_t {k} = 0; {k} < {count}; ++{k}) {{  /* {what}: no bounds tests (local padding) */")
        step(k, "        ", accs)
        emit("    }")
        return
    extra = [[[f"{a}_s{s}" for a in row] for row in accs] for s in range(1, sets)]
    emit(f"    {acc_type} " + ", ".join(f"{a} = {zero}" for group in extra for row in group for a in row) + ";")
    emit(f"    int64_t {k} = 0;")
    emit(f"    for (; {k} + {sets} <= {count}; {k} += {sets}) {{  /* {what}, {sets} independent accumulator sets "
         f"(latency) */")
    for s, names in enumerate([accs, *extra]):
        step(f"{k} + {s}", "        ", names)
    emit("    }")
    emit(f"    for (; {k} < {count}; ++{k})")
    step(k, "        ", accs)
    for group in extra:
        for row, extra_row in zip(accs, group):
            emit("    " + " ".join(f"{a} = {add(a, e)};" for a, e in zip(row, extra_row)))


def _prefetch_cases(g: _Geometry) -> list[tuple[bool, bool]]:
    """The (pull, stream) pairs a SIMD micro-kernel is called with (the macro-kernel's ``pull`` and
    ``wn``): the first row pass over a panel pulls it into L1 and streams (when the L2 stream is on);
    the later passes stream until the next panel is covered, then not; they pull again only a panel
    larger than L1."""
    stream = bool(L2_PREFETCH_LINES)
    later_pull = not g.panel_stays_in_l1
    cases = [(True, stream)]                                   # a panel's first row pass
    for case in ((later_pull, stream), (later_pull, False)):  # the later ones
        if case not in cases:
            cases.append(case)
    return cases


def _emit_simd_body(emit, g: _Geometry, v: _Vec, epilogue: Epilogue | None, rows: int):
    """The body of a micro-kernel computing ``rows`` (<= MR) rows of the register tile."""
    NR, W = g.NR, v.width
    nvec = NR // W
    int8 = g.precision == "int8"
    start = (lambda c: v.load(f"corr + j0 + {c * W}")) if int8 else None
    accs = emit_accumulators(emit, v, rows, NR, start)
    latency = dict(sets=accumulator_sets(rows, nvec, MAX_ACCUMULATORS[v.isa]), add=v.add, zero=v.zero(),
                   acc_type=v.type)

    def k_loop(prefetch: int, stream_lines: int) -> None:
        if int8:
            _emit_k_loop(emit, accs, nvec, W, "q", "kq", "VPDPBUSD loop", "uint32_t", v.type, isa=v.isa,
                         load=v.load, broadcast=v.set1,
                         madd=lambda x, w, acc: f"ts_dpbusd({acc}, {x}, {w})",
                         prefetch=prefetch, stream_lines=stream_lines, indent="    ", **latency)
        elif g.precision == "bf16":
            _emit_k_loop(emit, accs, nvec, W, "q", "kq", "VDPBF16PS loop", "uint32_t", "__m512bh", isa=v.isa,
                         load=lambda p: f"(__m512bh)_mm512_loadu_si512({p})",
                         broadcast=lambda x: f"(__m512bh)_mm512_set1_epi32((int){x})",
                         madd=lambda x, w, acc: f"_mm512_dpbf16_ps({acc}, {x}, {w})",
                         prefetch=prefetch, stream_lines=stream_lines, indent="    ", **latency)
        else:
            _emit_k_loop(emit, accs, nvec, W, "k", "kl", "FMA loop", "float", v.type, isa=v.isa,
                         load=v.load, broadcast=v.set1, madd=v.fma, prefetch=prefetch, stream_lines=stream_lines,
                         indent="    ", x_row_stride="K" if g.x_in_place else "", **latency)

    if g.precision == "bf16":
        emit("    const int64_t kq = (kl + 1) / 2;   /* bf16 pairs: the K step is 2 */")
    elif int8:
        emit("    const int64_t kq = (kl + 3) / 4;   /* int8 quads: the K step is 4 */")
    # Prefetches are instructions too (4 of an 8x48 tile's ~40 per k step, issued on a core whose
    # other hyperthread may be a neighbour's): one loop per (pull, wn) case the macro-kernel passes,
    # each issuing only the prefetches its row pass needs
    # (the last case is the plain else: whatever the caller passes, every loop computes the same)
    cases = _prefetch_cases(g)
    for n, (pull, stream) in enumerate(cases):
        what = " and ".join(x for x in ("the panel into L1 ahead of use" if pull else "",
                                        "the weight stream into L2" if stream else "") if x) or "no prefetches"
        test = f"{'pull' if pull else '!pull'} && {'wn' if stream else '!wn'}"
        opening = (f"if ({test})" if n == 0 else "} else" if n == len(cases) - 1 else f"}} else if ({test})")
        emit(f"    {opening} {{  /* {what} */")
        k_loop(prefetch_k_steps(rows) if pull else 0, L2_PREFETCH_LINES if stream else 0)
    emit("    }")

    def store_tile(base: str, row_stride: str, comment: str) -> None:
        """Every accumulator vector to ``base + r*row_stride + c*W``, then return."""
        emit(f"    {comment}")
        for r, row in enumerate(accs):
            emit("        " + " ".join(v.store(f"{base} + {r} * {row_stride} + {c * W}", a)
                                     for c, a in enumerate(row)))
        emit("        return;")
        emit("    }")

    store_tile("ct", "NR", "if (!last) {  /* partial sums to the per-thread buffer */")
    if int8:     # the exact int32 sums, converted to float once: the rest is the fp32 kernel's
        floats = [[f"f{a[1:]}" for a in row] for row in accs]
        for row, frow in zip(accs, floats):
            emit("    const __m512 " + ", ".join(f"{f} = _mm512_cvtepi32_ps({a})" for a, f in zip(row, frow)) + ";")
        accs, v = floats, _Vec("avx512")
    if epilogue is None:
        emit("    float* restrict y = Y + i0 * N + j0;")
        store_tile("y", "N", f"if (mv == {rows} && nv == NR) {{  /* interior tile: plain vector stores */")
        emit("    /* edge tile (local padding's writeback guard): masked columns, tested rows */")
        if v.isa == "avx512":
            for c in range(nvec):
                emit(f"    const __mmask16 m{c} = nv >= {(c + 1) * W} ? (__mmask16)0xFFFF : "
                     f"nv <= {c * W} ? (__mmask16)0 : (__mmask16)((1u << (nv - {c * W})) - 1u);")
            store = lambda ptr, c, a: f"_mm512_mask_storeu_ps({ptr}, m{c}, {a});"
        else:
            emit("    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);")
            for c in range(nvec):
                emit(f"    const __m256i m{c} = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(nv - {c * W})), lane);")
            store = lambda ptr, c, a: f"_mm256_maskstore_ps({ptr}, m{c}, {a});"
        for r, row in enumerate(accs):
            cond = "" if r == 0 else f"if (mv > {r}) "
            emit(f"    {cond}{{ " + " ".join(store(f"y + {r} * N + {c * W}", c, a) for c, a in enumerate(row)) + " }")
    else:
        emit("    float tile[MR * NR] __attribute__((aligned(64)));")
        for r, row in enumerate(accs):
            emit("    " + " ".join(v.store(f"tile + {r * NR + c * W}", a) for c, a in enumerate(row)))
        _emit_epilogue_loop(emit, epilogue)


def _emit_scalar_body(emit, g: _Geometry, epilogue: Epilogue | None):
    emit("""    float acc_t[MR][NR];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c)
            acc_t[r][c] = first ? 0.0f : ct[r * NR + c];
    for (int64_t k = 0; k < kl; ++k) {  /* FMA loop: no bounds tests (local padding) */
        const float* restrict wk = wp + k * NR;
        const float* restrict xk = xp + k * MR;
        for (int r = 0; r < MR; ++r)
            for (int c = 0; c < NR; ++c)
                acc_t[r][c] = fmaf(xk[r], wk[c], acc_t[r][c]);
    }
    if (!last) {
        for (int r = 0; r < MR; ++r)
            for (int c = 0; c < NR; ++c)
                ct[r * NR + c] = acc_t[r][c];
        return;
    }""")
    if epilogue is None:
        emit("""    for (int64_t r = 0; r < mv; ++r)       /* guarded store of the valid part */
        for (int64_t c = 0; c < nv; ++c)
            Y[(i0 + r) * N + j0 + c] = acc_t[r][c];""")
    else:
        emit("    const float* tile = &acc_t[0][0];")
        _emit_epilogue_loop(emit, epilogue)


def _indent(code: str, spaces: int) -> str:
    return "".join(" " * spaces + line.strip() + "\n" for line in code.splitlines() if line.strip())


def _emit_epilogue_loop(emit, epilogue: Epilogue):
    emit(f"""    /* fused epilogue ({epilogue.label}) on the valid part, then the single store */
    for (int64_t r = 0; r < mv; ++r) {{
        const int64_t i = i0 + r;
        float* restrict yrow = Y + i * N;
        #pragma omp simd
        for (int64_t c = 0; c < nv; ++c) {{
            const int64_t j = j0 + c;
            const float acc = tile[r * NR + c];
{_indent(epilogue.body, 12)}            yrow[j] = {epilogue.expr};
        }}
    }}""")


def _emit_macro_kernel(emit, g: _Geometry, name: str, epi_params: str, epi_names: str, row_pass: bool = False,
                       a_prologue: bool = False, amx: bool = False):
    single = g.n_kblocks == 1
    before = f"\n    a_prologue((float*)X, M{epi_names});  /* X is the caller's scratch: A computed here */" \
        if a_prologue else ""
    # a task owning whole rows (one N block, as configured or after the run-time split) reduces them
    # while they are in cache; otherwise the row pass runs after the task loop's barrier
    after = f"\n            if (n_nblocks == 1) row_pass(Y, m0, mv{epi_names});  /* fused row reduction over this task's rows */" \
        if row_pass else ""
    rows_after = f"""
        /* N was split over tasks: the row reduction starts once every tile is stored (claimed tasks
         * end without the barrier an `omp for` has) */
        if (n_nblocks > 1) {{
            #pragma omp barrier
            #pragma omp for schedule(static)
            for (int64_t r0 = 0; r0 < M; r0 += MR)
                row_pass(Y, r0, min_i64(MR, M - r0){epi_names});
        }}""" if row_pass else ""
    int8 = g.precision == "int8"
    op = _operand(g)
    # fp32: W offsets in floats; bf16 / int8: in 32-bit lanes of bf16 pairs / int8 quads (K padded to
    # BF16_K_BLOCK / INT8_K_QUAD, divided by the k values per lane)
    lane = g.k_lane
    panel = f"(KP / {lane}) * NR" if lane > 1 else "K * NR"          # one NR-column panel over all of K
    k_rows = (lambda k: f"({k}) / {lane} * NR") if lane > 1 else (lambda k: f"({k}) * NR")   # K row k's offset in a panel
    w_base = f"(const uint32_t*)Wp + j0 * (int64_t)(KP / {lane})" if lane > 1 else "Wp + j0 * (int64_t)K"
    w_kblock = f"wblock + {k_rows('k0')}"
    w_panel = f"wk + jp * (int64_t)({panel})"
    w_next = f"(jp + 1) * NR < nw ? wpanel + (int64_t)({panel}) : wblock + {k_rows('k0 + kl')}"
    # the L2 stream: pass ip covers the ip-th stretch of the next panel's K block (SIMD: one line per
    # L2_STREAM_K_STRIDE k steps, the bf16 step being a pair-row; AMX: one per pair-row, 16 per tile
    # step); L2_STREAM_K_STRIDE x NR / 16 passes cover it all (AMX: NR / 16, and a panel's later passes
    # start over; the SIMD kernels get NULL there and skip the prefetches)
    per_pass = 16 * L2_PREFETCH_LINES
    # packed K steps of a K block (lanes of its rows): bf16 blocks are whole tile depths, int8 whole quads
    steps = f"((kl + {g.k_granule - 1}) / {g.k_granule} * {g.k_granule // lane})" if lane > 1 else "kl"
    window = max(1, g.NR // per_pass) if per_pass else 0
    if not per_pass:
        w_stream = "NULL"
    elif amx:
        w_stream = f"wnext + (ip % {window}) * ({steps} * {per_pass})"
    else:
        w_stream = f"ip < ({window} << stream_log2) ? wnext + ip * ((({steps}) + (1 << stream_log2) - 1) >> stream_log2) * {per_pass} : NULL"
    # a task with enough row passes spreads the stream over L2_STREAM_K_STRIDE times as many (SIMD)
    stride_shift = L2_STREAM_K_STRIDE.bit_length() - 1
    stride_rule = "0" if amx or not per_pass else f"(mv + MR - 1) / MR >= {window * L2_STREAM_K_STRIDE} ? {stride_shift} : 0"
    # the panel into L1 on its first row pass; the later passes find it there unless it is larger than L1
    pull = "ip == 0" if g.panel_stays_in_l1 else "1"
    x_panel = "MR * KCP" if amx else "MR * KQ" if lane > 1 else "MR * KC"
    x_op = _x_operand(g, amx)
    x_block = "KCP" if amx else "KQ" if lane > 1 else "KC"
    in_place = g.x_in_place   # the micro-kernel reads X where it lies: no per-thread X panels
    x_tile = "X + (m0 + ip * MR) * (int64_t)K + k0" if in_place else f"xpack + ip * ({x_panel})"
    xpack_alloc = "" if in_place else (f"\n        {x_op}* xpack = ({x_op}*)aligned_alloc(64, (sizeof({x_op}) * block_tiles * MR * "
                                       f"{x_block} + 63) / 64 * 64);")
    pack_step = "" if in_place else "\n                pack_x(X, m0, mv, k0, kl, xpack);"
    xpack_free = "" if in_place else "\n        free(xpack);"
    tall = (f"\n    /* the weight ({g.K} x {g.NP} floats) exceeds half the L3: up to TALL_ROWS rows run as one block, so\n"
            f"     * each weight column streams from memory once (tall_rows in Python) */\n"
            f"    if (M <= TALL_ROWS) n_mblocks = 1;") if g.tall_rows else ""
    corr_arg = _corrections(g)[1]
    corr_decl = ("\n    /* the int32 column corrections XLO x colsum(W), after the weight panels */\n"
                 "    const int32_t* restrict corr = (const int32_t*)Wp + (int64_t)(KP / 4) * NP;") if int8 else ""
    tiles_on = "\n        amx_configure();   /* this thread's tile registers: 16 rows x 64 bytes each */" if amx else ""
    tiles_off = "\n        _tile_release();" if amx else ""
    emit(f"""/* Macro-kernel: tasks = ceil(M / MC) balanced row blocks (evened over the threads) x N_NBLOCKS block tiles (more where that is fewer than the threads), shared among the OpenMP
 * threads; each task walks K in N_KBLOCKS steps of KC{' (here one step: no partial sums)' if single else ''}. */
void {name}(const float* restrict X, const float* restrict Wp, float* restrict Y, int64_t M{epi_params})
{{
    if (M <= 0) return;{before}{corr_decl}
    const int64_t nth = omp_get_max_threads();
    const int64_t row_tiles = (M + MR - 1) / MR;
    int64_t n_mblocks = (M + MC - 1) / MC;{tall}
    /* a few tasks that do not divide among the threads: the next block count that does (whole
     * register tiles), or the last wave runs one block on one thread (row_blocks in Python) */
    {'else ' if g.tall_rows else ''}if (n_mblocks * N_NBLOCKS >= nth && n_mblocks * N_NBLOCKS < BALANCE_TASKS_PER_THREAD * nth && (n_mblocks * N_NBLOCKS) % nth)
        for (int64_t want = n_mblocks + 1; want <= row_tiles; ++want)
            if ((want * N_NBLOCKS) % nth == 0) {{ n_mblocks = want; break; }}
    /* balanced row blocks: the register tiles dealt evenly (the first blocks one more), not MC-row
     * blocks and a thin remainder that streams every weight panel again for a few rows */
    const int64_t tiles_per = row_tiles / n_mblocks, tiles_extra = row_tiles % n_mblocks;
    const int64_t block_tiles = tiles_per + (tiles_extra > 0);   /* the tallest block's register tiles */
    /* too few tasks for the threads (small M): N cut finer at run time, in whole NR panels (W is
     * packed panel by panel over all of K, so any panel starts a block); _Geometry.tasks in Python
     * computes the same */
    int64_t nc = NC;
    if (n_mblocks * N_NBLOCKS < nth) {{
        const int64_t panels = NP / NR, parts = min_i64(panels, (nth + n_mblocks - 1) / n_mblocks);
        nc = (panels + parts - 1) / parts * NR;
    }}
    const int64_t n_nblocks = (NP + nc - 1) / nc;
    const int64_t n_tasks = n_mblocks * n_nblocks;
    /* thread i owns tasks i, i + nth, ...: the i-th contiguous 1/nth of the N blocks where they
     * divide among the threads, the same weight columns at every M and under every nc (ts_task_blocks) */
{shares_declaration('nth')}
    #pragma omp parallel if (n_tasks > 1)
    {{{tiles_on}
        /* per-thread workspaces (sizes rounded up to the 64-byte alignment, as C11 asks) */{xpack_alloc}
        float* cbuf = {'NULL' if single else '(float*)aligned_alloc(64, (sizeof(float) * block_tiles * MR * NC + 63) / 64 * 64)'};
{claim_loop('t', 'n_tasks', 'nth', '        ')}
            int64_t mb, nb;
            ts_task_blocks(t, nth, n_nblocks, &mb, &nb);
            const int64_t m0 = (mb * tiles_per + min_i64(mb, tiles_extra)) * MR;
            const int64_t mv = min_i64((tiles_per + (mb < tiles_extra)) * MR, M - m0);
            const int64_t j0 = nb * nc, nw = min_i64(nc, NP - j0);  /* nw: a multiple of NR */
            const int stream_log2 = {stride_rule};  /* log2 of the stream's k-step stride */
            const {op}* wblock = {w_base};
            for (int64_t kb = 0; kb < N_KBLOCKS; ++kb) {{
                const int64_t k0 = kb * KC, kl = min_i64(KC, K - k0);{pack_step}
                const {op}* wk = {w_kblock};
                for (int64_t jp = 0; jp * NR < nw; ++jp) {{
                    const {op}* wpanel = {w_panel};
                    const int64_t jj = j0 + jp * NR, nv = min_i64(NR, N - jj);
                    /* the next panel: of this K block, or the next K block's first */
                    const {op}* wnext = {w_next};
                    for (int64_t ip = 0; ip * MR < mv; ++ip) {{
                        float* ct = {'NULL' if single else 'cbuf + (jp * block_tiles + ip) * (MR * NR)'};
                        const int64_t rows = min_i64(MR, mv - ip * MR);
                        /* row pass ip pulls the ip-th stretch of the next panel into L2, one line per k step:
                         * the weight stream spread over the panel's row passes, well ahead of its use */
                        const {op}* wn = {w_stream};
                        const int pull = {pull};
                        if (rows == MR)
                            micro_kernel(kl, {x_tile}, wpanel, wn, pull, stream_log2, ct, {'1, 1' if single else 'kb == 0, kb == N_KBLOCKS - 1'},
                                         Y, m0 + ip * MR, jj, MR, nv{corr_arg}{epi_names});
                        else  /* the last row panel: a kernel of exactly its height (no padded rows computed) */
                            micro_kernel_tail(rows, kl, {x_tile}, wpanel, wn, pull, stream_log2, ct, {'1, 1' if single else 'kb == 0, kb == N_KBLOCKS - 1'},
                                              Y, m0 + ip * MR, jj, rows, nv{corr_arg}{epi_names});
                    }}
                }}
            }}{after}
        }}{rows_after}{xpack_free}
        free(cbuf);{tiles_off}
    }}
}}
""")


# --------------------------------------------------------------------------------------
# Python wrapper


class GemmKernel:
    """A built, loaded GEMM macro-kernel with its prepacked weight.

    ``GemmKernel(W, cfg, isa=..., epilogue=...)`` generates, compiles (cached by content) and
    loads the kernel; ``run(X, **epilogue_arrays)`` computes ``Y[M, N]`` for any M.
    """

    def __init__(self, W: np.ndarray, cfg: TileConfig | None = None, *, isa: str | None = None,
                 epilogue: Epilogue | None = None, name: str = "tscomp_gemm", precision: str = "fp32",
                 x_offset: int = 0):
        W = np.asarray(W)
        if W.ndim != 2 or W.dtype != np.float32:
            raise GemmError(f"weight must be a 2-D float32 array [K, N], got {W.dtype} {W.shape}")
        self.K, self.N = (int(d) for d in W.shape)
        host = host_isa()
        self.isa = isa or host
        if self.isa not in ISA_RANK:
            raise TileConfigError(f"unknown ISA {self.isa!r}; expected one of {sorted(ISA_RANK)}")
        check_host_isa(self.isa, precision)
        self.precision = check_precision(precision, self.isa)
        if precision != "fp32":
            from tscomp.schedule.target import host_cpu
            host_cpu(precision=precision)    # TargetError naming what this CPU lacks
        self.cfg = (cfg or default_config(self.isa, self.K, self.N)).validate(self.isa)
        self.epilogue = epilogue
        self.name = f"{_c_name(name)}_{self.isa}_{self.cfg.slug()}" + ("" if precision == "fp32" else f"_{precision}")
        self.source = generate_gemm(self.cfg, self.K, self.N, self.isa, epilogue, name=self.name,
                                    precision=precision, x_offset=x_offset)
        self.library_path = build_library(self.source, self.name)
        self._lib = load_library(self.library_path)
        fn = getattr(self._lib, self.name)
        fn.restype = None
        extra = [ARG_TYPES[a.ctype][0] for a in (epilogue.args if epilogue else ())]
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *extra]
        self._fn = fn
        self.packed = prepack_weights(W, self.cfg, precision, x_offset)

    def set_num_threads(self, n: int) -> None:
        """Set the OpenMP thread count of this thread's kernels (one place sets it:
        :func:`tscomp.codegen.build.set_num_threads`, which remembers the last count per thread)."""
        from tscomp.codegen.build import set_num_threads
        set_num_threads(n)

    def run(self, X: np.ndarray, *, out: np.ndarray | None = None, **arrays) -> np.ndarray:
        X = _check_array("X", X, np.float32, 2)
        M, K = X.shape
        if K != self.K:
            raise GemmError(f"X has {K} columns but the kernel was compiled for K={self.K}")
        if out is None:
            out = np.empty((M, self.N), np.float32)
        else:
            out = _check_array("out", out, np.float32, 2)
            if out.shape != (M, self.N):
                raise GemmError(f"out has shape {out.shape}, expected {(M, self.N)}")
        extra = []
        args = self.epilogue.args if self.epilogue else ()
        names = {a.name for a in args}
        unknown = sorted(set(arrays) - names)
        if unknown:
            raise GemmError(f"unexpected epilogue argument(s) {unknown}; this kernel takes {sorted(names) or 'none'}")
        dims = {"M": M, "N": self.N, "K": self.K}
        for a in args:
            if a.name not in arrays:
                raise GemmError(f"missing epilogue argument {a.name!r} ({a.ctype})")
            value = arrays[a.name]
            ctype, dtype = ARG_TYPES[a.ctype]
            if a.is_pointer:
                want = tuple(dims.get(d, d) for d in a.shape)
                arr = _check_array(a.name, value, dtype, len(want) if a.shape else None)
                if a.shape and arr.shape != want:
                    raise GemmError(f"epilogue argument {a.name!r} has shape {arr.shape}, expected {want}")
                extra.append(_ptr(arr))
            else:
                extra.append(value)
        if M:
            self._fn(_ptr(X), _ptr(self.packed), _ptr(out), M, *extra)
        return out

    __call__ = run


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _check_array(name: str, a, dtype, ndim: int | None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise GemmError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise GemmError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise GemmError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise GemmError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return a
