"""The attention family: QKᵀ, the score epilogue (scale, mask), a row softmax and P·V in one CPU
macro-kernel, the scores never written to memory (issue 13; FlashAttention's online softmax,
Dao et al. 2022, on a CPU; TSCompiler §5.1's tiling applied to a chain of two backbones).

The group is an ``attention`` group of :mod:`tscomp.graph.fusion.attention`: two MatMuls of
activations joined by a Softmax over the key axis. Per task -- one batch entry (batch × heads) and
one block of ``T_Mb`` query rows -- the kernel packs the block's Q rows once (their prologue fused:
the scale, a rotary embedding, ...), then walks the keys in blocks of ``T_Nb``:

1. pack the key block of Kᵀ (k-major, ``T_Nb`` wide) and of V (row-major, head width padded to the
   vector width), each element computed from the expression IR (views, prologue ops);
2. S = Q·Kᵀ for the block with an ``T_Mi × T_Nb`` register tile, then the score epilogue per element
   (the group's ops between the first MatMul and the Softmax: scale, additive or boolean mask);
3. online softmax per row: the new row maximum m', the correction e^(m - m') applied to the row's
   running sum and to its output accumulators, P = e^(S - m');
4. O += P·V with an ``T_Mi × head`` register tile.

The softmax bookkeeping runs per *chunk* of ``T_Nc`` keys (a whole number of key blocks, the
tile configuration's ``nc``): S for the chunk's key blocks goes to an ``T_Mb × T_Nc`` block first
(sized to stay in L2), then each row's maximum, correction and exponentials are taken once over
the chunk, and P·V runs over all the chunk's keys with the output accumulators held in registers.
With ``T_Nc`` = ``T_Nb`` this is the per-block online softmax; with ``T_Nc`` >= N it is the two-pass
softmax (no correction at all): the per-row horizontal reductions, the correction exponential and
the rescaling of O are paid once per chunk instead of once per key block.

Finally O / l goes through the output epilogue to the single store. A row whose scores are all
-inf (fully masked) has no maximum: ONNX's Softmax gives NaN there, and the group's ops on P (the
exporters' ``Where(IsNaN(p), 0, p)`` guard) decide what P·V sees; the analysis evaluates those ops
on NaN and on probabilities with the reference semantics and accepts them only when they leave
probabilities unchanged and map NaN to 0 (the guard) or NaN (no guard).

**bf16 on AMX** (``isa="amx"``: ``--precision bf16`` on a CPU with AMX tiles). QKᵀ and P·V run on the
tile unit: Q rows and the chunk's P rows are rounded to bf16 as A tiles (16 rows, the depth padded to
whole 32-element steps), Kᵀ is packed as 16-key groups of bf16-pair rows and V as key-pair rows (the
B tiles' VNNI layout), S and O accumulate in fp32 tiles; the score epilogue, the softmax and its
online correction, and the output epilogue are unchanged fp32 AVX-512 code. The register tile is one
16-row tile; key blocks are 32 or 64 keys (at most 4 accumulator tiles). Accuracy, against onnxruntime
fp32: cosine >= 0.99999, largest error under 1% of the largest output (tested).

Exact in fp32 up to summation order (tested against onnxruntime). Refused ("not mine"): non-float32
operands, a head width over :data:`MAX_HEAD`, a softmax over another axis, ops on P that are not the
guard, and outputs that are not element-for-element functions of P·V. A refused group runs as its
parts (QKᵀ, softmax and P·V kernels), see :meth:`tscomp.graph.fusion.plan.Plan.split`.
"""
from __future__ import annotations

import ctypes
import math
import re
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.c_expr import PRELUDE, broadcast_index, c_symbol_name, delinearize, math_helpers, reshape_index
from tscomp.codegen.cpu_batched_gemm import _Generator
from tscomp.codegen.cpu_gemm import BF16_ROW_C, ISA_RANK, _emit_amx_setup, _Vec, emit_tile_step
from tscomp.codegen.kernel import NativeArg, NativeCall
from tscomp.codegen.native import PicklableKernel, binding_key, refusals_name_group, sha256_text, structural_signature
from tscomp.codegen.tile_config import MAX_ACCUMULATORS, VECTOR_WIDTH, TileConfig, TileConfigError
from tscomp.codegen.workspace import WORKSPACE_C, carve_c
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Const, Expr, Input, Op, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops import registry
from tscomp.graph.ops.registry import FusionClass, OpCall, c_type
from tscomp.graph.symbols import numel, same

#: the widest head (Q/K depth and V width) the kernel keeps in its per-thread blocks
MAX_HEAD = 512
#: probabilities the ops on P are checked on (they must come back unchanged), then NaN
_PROBE = np.array([0.0, 1e-30, 0.25, 0.5, 1.0, np.nan], np.float32)


#: A key is masked for a query row when the score epilogue gives at most MASK_DEAD at acc = -MASK_PROBE
#: and at acc = +MASK_PROBE (monotone epilogues: additive masks of -inf or of the exporters' finfo.min,
#: a Where selecting -inf). Such a key's probability e^(s - max) is exactly 0 in fp32 as long as its row
#: has a live key and |QKᵀ| < MASK_PROBE; the kernel then skips the masked tail of the keys -- unless a key
#: or value of the batch entry is NaN or infinite (found while packing them): onnxruntime's NaN + -inf and
#: 0 * NaN then make every row NaN (a random Helium's RMSNorm without epsilon gave a padding token's zero
#: embedding inf), and so does the kernel.
MASK_DEAD = -1e30
MASK_PROBE = 1e20


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def attention_splits(nb, n_qb, threads: int):
    """Runs a batch entry's query blocks are cut into: one (each entry packs its keys once) unless
    the entries are fewer than two per thread; then enough runs for two tasks per thread, at most
    one per query block. Works on ints and on numpy arrays (the wave model's grids); the kernel
    computes the same in C (:data:`SPLITS_C`)."""
    nb = np.maximum(nb, 1)
    want = -(-(2 * threads) // nb)
    return np.maximum(1, np.minimum(n_qb, want))


SPLITS_C = """/* the runs a batch entry's query blocks are cut into (tscomp.codegen.cpu_attention.attention_splits) */
static inline int64_t ts_attention_splits(int64_t nb, int64_t n_qb, int64_t threads)
{
    const int64_t want = (2 * threads + (nb > 1 ? nb : 1) - 1) / (nb > 1 ? nb : 1);
    const int64_t s = want < n_qb ? want : n_qb;
    return s > 1 ? s : 1;
}
"""


class AttentionAnalysis:
    """The analysis step: the chain's two MatMuls, its Softmax, the operand expressions (Q, Kᵀ, V
    with their views and prologues), the score epilogue and the output epilogue, the extents NB
    (batch × heads), M (queries), N (keys) and the static head widths DK, DV. Raises
    :class:`UnsupportedOperatorError` ("group <name>: <why>") when the group is not the family's."""

    family = "attention"

    def __init__(self, plan: Plan, group: Group):
        self.plan, self.group = plan, group
        with refusals_name_group(group.name):
            self._analyze()

    def _fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {why}")

    def signature(self) -> str:
        return sha256_text(f"attention NB={self.NB} M={self.M} N={self.N} DK={self.DK} DV={self.DV} "
                           f"{structural_signature(self.group)}")[:16]

    def extents(self) -> dict:
        return {"NB": str(self.NB), "M": str(self.M), "N": str(self.N), "DK": str(self.DK), "DV": str(self.DV)}

    def canon(self, shape) -> tuple:
        return tuple(self.plan.graph.symbols.canon(d) for d in shape)

    def _analyze(self) -> None:
        g = self.group
        if g.kind != "attention":
            self._fail(f"{g.kind} group is not an attention chain")
        ops = g.ops()
        mms = [o for o in ops if o.fusion is FusionClass.BACKBONE]
        reds = [o for o in ops if o.fusion is FusionClass.REDUCTION]
        if len(mms) != 2 or any(o.op_type != "MatMul" for o in mms) or len(reds) != 1:
            self._fail("not two MatMuls joined by one row reduction")
        sm = reds[0]
        if sm.op_type != "Softmax":
            self._fail(f"the row reduction is {sm.op_type}, not a Softmax")
        inner = {id(x) for x in walk([sm])}
        h1 = next((m for m in mms if id(m) in inner), None)
        h2 = next((m for m in mms if m is not h1), None)
        if h1 is None or h2 is None or id(sm) not in {id(x) for x in walk([h2.args[0]])}:
            self._fail("the Softmax is not between QKᵀ and P·V's left operand")
        for t in (h1, h2, sm, *h1.args, *h2.args):
            if np.dtype(t.dtype) != np.float32:
                self._fail(f"{t!r} is {np.dtype(t.dtype)}, only float32 attention is generated")
        s_shape, o_shape = self.canon(h1.shape), self.canon(h2.shape)
        if len(s_shape) < 2 or len(o_shape) != len(s_shape) or \
                not all(same(a, b) for a, b in zip(s_shape[:-2], o_shape[:-2])):
            self._fail("QKᵀ and P·V do not share their batch dimensions")
        rank = len(s_shape)
        axis = int(sm.attrs.get("axis", -1 if sm.opset >= 13 else 1))
        if axis % rank != rank - 1:
            self._fail(f"Softmax over axis {axis}, not the key axis (the last of {rank})")
        if not _same_shape(self.canon(sm.args[0].shape), s_shape):
            self._fail("the score epilogue broadcasts the scores to a larger shape")
        if any(isinstance(x, Op) and x.heavy and x is not h1 for x in walk([sm.args[0]])):
            self._fail("a second heavy op in the score epilogue")
        self.masked_value = self._guard_value(h2.args[0], sm)
        q, k, v = h1.args[0], h1.args[1], h2.args[1]
        self.M, self.N = s_shape[-2], s_shape[-1]
        self.NB = numel(s_shape[:-2])
        DK, DV = self.canon(q.shape)[-1], o_shape[-1]
        if not (sympy.sympify(DK).is_Integer and sympy.sympify(DV).is_Integer):
            self._fail(f"head widths {DK} and {DV} must be static")
        self.DK, self.DV = int(DK), int(DV)
        if max(self.DK, self.DV) > MAX_HEAD or min(self.DK, self.DV) < 1:
            self._fail(f"head widths {self.DK}, {self.DV} outside 1..{MAX_HEAD}")
        if not (same(self.canon(k.shape)[-2], self.DK) and same(self.canon(v.shape)[-2], self.N)
                and same(o_shape[-2], self.M)):
            self._fail("operand extents do not chain (Q·Kᵀ over the head width, P·V over the keys)")
        self.h1, self.h2, self.sm, self.q, self.k, self.v = h1, h2, sm, q, k, v
        self.s_shape, self.o_shape = s_shape, o_shape
        self.out_shapes = {}
        for name, e in g.outputs.items():
            shape = self.canon(e.shape)
            if c_type(e.dtype) is None:
                self._fail(f"output {name} is {np.dtype(e.dtype)} (no C type)")
            if not shape or not same(shape[-1], self.DV) or not same(numel(shape[:-1]), self.NB * self.M):
                self._fail(f"output {name} is not P·V's element space up to a reshape of its leading dims")
            self.out_shapes[name] = shape

    def _guard_value(self, p: Expr, sm: Op) -> float:
        """What P·V's left operand makes of a NaN probability (0.0 or NaN), after checking that its
        ops leave probabilities unchanged (the reference semantics on :data:`_PROBE`)."""
        memo: dict[int, np.ndarray] = {id(sm): _PROBE}

        def value(e: Expr) -> np.ndarray:
            if id(e) in memo:
                return memo[id(e)]
            if isinstance(e, Const) and not e.symbolic:
                out = np.asarray(e.value)
            elif isinstance(e, Op) and not e.heavy:
                opdef = registry.lookup(e.op_type, e.domain, e.opset, e.node)
                if opdef.fusion is not FusionClass.ELEMENTWISE:
                    self._fail(f"{e.op_type} between the Softmax and P·V is not elementwise")
                call = OpCall(e.node, e.op_type, e.attrs, e.opset, e.num_outputs)
                args = [value(a) if a is not None else None for a in e.args]
                out = np.asarray(registry.run_reference(opdef, call, args)[e.output_index])
            else:
                self._fail(f"P·V's left operand reads {e!r} besides the Softmax")
            memo[id(e)] = out
            return out
        value(p)
        got = np.broadcast_to(memo[id(p)], _PROBE.shape).astype(np.float32)
        if not np.array_equal(got[:-1], _PROBE[:-1]):
            self._fail("the ops between the Softmax and P·V change probabilities")
        if np.isnan(got[-1]):
            return math.nan
        if got[-1] == 0.0:
            return 0.0
        self._fail(f"the ops between the Softmax and P·V map NaN to {got[-1]} (only 0 or NaN are generated)")

    def hints(self) -> tuple[int, int]:
        """Typical M and N (their upper bounds, at most 512) for sizing blocks."""
        symtab = self.plan.graph.symbols

        def hint(x):
            x = sympy.sympify(x)
            if x.is_Integer:
                return int(x)
            hi = symtab.bounds(x)[1]
            return 512 if not math.isfinite(hi) else max(1, min(int(hi), 512))
        return hint(self.M), hint(self.N)

    def heuristic_configs(self, isa: str, limit: int = 4, l2: int | None = None) -> list[TileConfig]:
        return candidate_configs(isa, *self.hints(), self.DK, self.DV, l2)[:limit]


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


# ============================================================================ configurations
#: AMX: rows of a tile, the keys of one TDPBF16PS step (16 bf16 pairs), the tile registers the kernel uses
AMX_ROWS, AMX_KEYS = 16, 32


def tile_fits(isa: str, mr: int, nj: int, dv: int) -> bool:
    """The S tile (mr × nj) and the P·V tile (mr × one chunk of the head) fit the accumulators; on AMX
    one 16-row A tile and a key block of whole 32-key steps, at most 4 accumulator tiles wide."""
    if isa == "amx":
        return mr == AMX_ROWS and nj % AMX_KEYS == 0 and nj <= 4 * AMX_ROWS and dv <= MAX_HEAD
    W = VECTOR_WIDTH[isa]
    # the P·V tile fits whenever the S tile does: pv_chunk_vectors sizes its head chunks to mr
    return nj % W == 0 and mr * (nj // W) <= MAX_ACCUMULATORS[isa]


def pv_chunk_vectors(isa: str, mr: int) -> int:
    """Vectors of the head one P·V pass accumulates per row: 4, fewer where ``mr`` rows of 4 would not
    fit the accumulators (AVX2's 14: a 6-row tile takes the head 2 vectors at a time, so that QKᵀ
    can use 6-row tiles -- 2-row tiles left its FMA chains short)."""
    return max(1, min(4, MAX_ACCUMULATORS[isa] // max(mr, 1)))


#: bytes of V one P·V pass over a query block's row tiles keeps in L1 (half of the smallest L1 data
#: cache of the hosts, 32 KiB): keys are sliced to fit, so each row tile reads the slice from L1
#: instead of streaming the chunk's whole V from L2 (BERT-base on an AVX2 Zen 3, 2-row tiles: a
#: 256-key chunk's V is 64 KiB)
PV_SLICE_BYTES = 16 * 1024


def pv_slice_keys(dvp: int) -> int:
    """Keys per P·V slice for a padded head width of ``dvp`` floats (at least 16)."""
    return max(16, PV_SLICE_BYTES // (4 * dvp))


#: the most key blocks one softmax chunk holds (a power of two)
MAX_CHUNK_BLOCKS = 64


def softmax_chunk(mc: int, nj: int, N: int, l2: int) -> int:
    """Keys per softmax chunk (``T_Nc``), a power-of-two number of key blocks: the fewest that hold
    every key (at most :data:`MAX_CHUNK_BLOCKS`), unless the query block's S block that wide would
    not fit a quarter of L2; then the most that do (at least one)."""
    need = 1
    while need * nj < N and need < MAX_CHUNK_BLOCKS:
        need *= 2
    fit = 1
    while 2 * fit * nj * 4 * mc <= l2 // 4:
        fit *= 2
    return nj * min(need, fit)


def candidate_configs(isa: str, M: int, N: int, DK: int, DV: int, l2: int | None = None) -> list[TileConfig]:
    """Tilings ``T_Mi × T_Nb`` register tile (``mr`` rows, ``nr`` = the key block), ``T_Mb`` query
    rows per task: key blocks of 4 and 2 vectors (64 / 32 keys on AVX-512), query blocks of 4-8
    register tiles, fewer when M is short; softmax chunks (``nc``) as wide as :func:`softmax_chunk`
    allows; the per-thread blocks (Q, Kᵀ, V, S, O) fit L2 (``l2``: the host's by default)."""
    if isa not in VECTOR_WIDTH:
        raise TileConfigError(f"unknown ISA {isa!r}")
    if l2 is None:
        from tscomp.codegen.tile_config import host_caches
        l2 = host_caches().l2
    W = VECTOR_WIDTH[isa]
    by_block = []
    for nvec in (4, 2, 1):
        nj = nvec * W
        mr = next((m for m in ((AMX_ROWS,) if isa == "amx" else (6, 4, 8, 2)) if tile_fits(isa, m, nj, DV)), None)
        if mr is None:
            continue
        block = []
        for tiles in (8, 4, 1):
            mc = mr * max(1, min(tiles, -(-M // mr)))
            cfg = TileConfig(mr=mr, nr=nj, mc=mc, nc=softmax_chunk(mc, nj, N, l2), kc=DK)
            if cfg not in block:
                block.append(cfg)
        by_block.append(block)
    # interleaved: each key-block width's best first, so that a short list still spans them
    out = []
    for rank in range(max(map(len, by_block), default=0)):
        out += [b[rank] for b in by_block if rank < len(b)]
    return out


# ============================================================================ source
class CompiledAttention(AttentionAnalysis, PicklableKernel):
    """The source and executor steps: an analysis with one tile configuration and ISA; constructing
    it generates the C text (nothing is compiled), :func:`link` builds and binds it. ``run(env,
    binding)`` returns every output of the group."""

    TRANSIENT = {"fn": None, "_sizes": dict, "plan": None}
    family = "attention"

    def __init__(self, analysis: AttentionAnalysis, cfg: TileConfig, isa: str):
        self.__dict__.update(analysis.__dict__)
        self.fn = None
        self._sizes: dict = {}
        self.symtab = self.plan.graph.symbols
        with refusals_name_group(self.group.name):
            if isa not in ISA_RANK:
                self._fail(f"unknown ISA {isa!r}")
            if not tile_fits(isa, cfg.mr, cfg.nr, self.DV) or cfg.mc % cfg.mr or cfg.nc % cfg.nr:
                raise TileConfigError(f"attention tile {cfg.describe()} does not fit {isa}")
            self.isa, self.cfg = isa, cfg
            self.func = "tscomp_" + re.sub(r"\W", "_", self.group.name) + f"_{isa}_{cfg.slug()}"
            self.source = self._generate()
        self._in_shapes = {name: self.plan.graph.values[name].shape if name in self.plan.graph.values else ()
                           for role, name, _ in self.arg_roles if role == "input"}
        found = {x.name: x.shape for x in walk(self.group.outputs.values()) if isinstance(x, Input)}
        self._in_shapes.update({n: found[n] for n in self._in_shapes if n in found})

    def resources(self) -> dict[str, int]:
        W = VECTOR_WIDTH[self.isa]
        return {"vector_accumulators": self.cfg.mr * (self.cfg.nr // W)}

    # ------------------------------------------------------------------ code generation
    def _fragments(self):
        """The C fragments over the index variables ts_b, ts_i, ts_j, ts_k, ts_d: Q, Kᵀ and V
        elements, the score epilogue (``acc`` = the QKᵀ element) and the output stores (``acc`` =
        the P·V element)."""
        gen = _Generator(self.plan, self.group, self.h1)
        ctx = gen.ctx
        vb, vi, vj = ctx.var("ts_b", self.NB), ctx.var("ts_i", self.M), ctx.var("ts_j", self.N)
        vk, vd = ctx.var("ts_k", self.DK), ctx.var("ts_d", self.DV)
        hb = self.s_shape[:-2]
        bidx = tuple(delinearize(vb, hb, ctx)) if hb else ()

        def operand(e: Expr, idx):
            shape = self.canon(e.shape)
            src = broadcast_index(bidx + idx, hb + shape[-2:], shape)
            gen.begin()
            gen.expect = None
            val = gen.value(e, src)
            return val, gen.lines(0)

        frags = {"q": operand(self.q, (vi, vk)), "k": operand(self.k, (vk, vj)), "v": operand(self.v, (vj, vd))}
        # score epilogue: the ops between QKᵀ and the Softmax, at the element being computed
        gen.heavy = self.h1
        gen.begin()
        s_idx = bidx + (vi, vj)
        gen.expect = s_idx
        frags["s"] = (gen.value(self.sm.args[0], s_idx), gen.lines(0))
        # outputs: each reads P·V at the element it stores (probed first, as the batched family does)
        gen.heavy = self.h2
        o_idx = bidx + (vi, vd)
        out_idx = {}
        for name, e in self.group.outputs.items():
            idx = tuple(ctx.simplify(x) for x in reshape_index(o_idx, self.o_shape, self.out_shapes[name], ctx))
            out_idx[name] = idx
            gen.begin()
            gen.probe = []
            gen.value(e, idx)
            if any(not gen.reads_here(p, o_idx) for p in gen.probe):
                self._fail(f"output {name} reads P·V away from the element it stores")
            gen.probe = None
        gen.begin()
        gen.expect = o_idx
        self.out_c = {name: f"out{k}" for k, name in enumerate(self.group.outputs)}
        stores = [f"{self.out_c[n]}[(ts_b * ts_M + ts_i) * {self.DV} + ts_d] = {gen.value(e, out_idx[n])};"
                  for n, e in self.group.outputs.items()]
        frags["o"] = (None, gen.lines(0) + stores)
        return gen, frags

    def _generate(self) -> str:
        gen, F = self._fragments()
        cfg, isa = self.cfg, self.isa
        amx = isa == "amx"
        vec_isa = "avx512" if amx else isa      # AMX: the tile unit for QKᵀ and P·V, AVX-512 around it
        W = VECTOR_WIDTH[vec_isa]
        DK, DV = self.DK, self.DV
        DVP = _round_up(DV, W)
        DKP = _round_up(DK, AMX_KEYS) if amx else DK
        text = "\n".join(line for _, lines in F.values() for line in lines) + "\n".join(
            str(v) for v, _ in F.values() if v) + "\n".join(gen.decls + gen.statics)
        self.arg_roles: list[tuple[str, str, object]] = []
        params = []
        dtypes = {x.name: np.dtype(x.dtype) for x in walk(self.group.outputs.values()) if isinstance(x, Input)}
        for name, cname in gen.in_c.items():
            if re.search(rf"\b{cname}\[", text):
                dt = dtypes.get(name, np.dtype(self.plan.graph.values[name].dtype))
                params.append(f"const {gen.ctype(dt)}* restrict {cname}")
                self.arg_roles.append(("input", name, dt))
        for name, e in self.group.outputs.items():
            params.append(f"{gen.ctype(e.dtype)}* restrict {self.out_c[name]}")
            self.arg_roles.append(("output", name, np.dtype(e.dtype)))
        params += ["int64_t ts_NB", "int64_t ts_M", "int64_t ts_N"]
        self.syms = sorted((s for s in gen.pr.used if s not in gen.ctx.upper_bounds), key=lambda s: s.name)
        for s in self.syms:
            params.append(f"int64_t {c_symbol_name(s.name)}")
            self.arg_roles.append(("symbol", s.name, s))

        def ind(lines, n):
            return "\n".join(" " * (4 * n) + ln if ln.strip() else "" for ln in lines)
        masked = "0.0f" if self.masked_value == 0.0 else "NAN"
        L = [self._header(), PRELUDE,
             "#include <omp.h>\n#include <string.h>\n#include <math.h>"
             + ("\n#include <immintrin.h>" if isa != "scalar" else "") + "\n"]
        L.append(f"#define TS_MR {cfg.mr}\n#define TS_NJ {cfg.nr}\n#define TS_MB {cfg.mc}\n#define TS_NC {cfg.nc}\n"
                 f"#define TS_DK {DK}\n#define TS_DKP {DKP}   /* Q and K depth as packed (AMX: whole 32-deep steps) */\n"
                 f"#define TS_DV {DV}\n#define TS_DVP {DVP}\n"
                 f"#define TS_MASK_DEAD ({MASK_DEAD:g}f)   /* a score at most this is a masked key */\n"
                 f"#define TS_PV_KEYS {pv_slice_keys(DVP)}   /* keys per P·V pass over the row tiles: their V in L1 */\n")
        L.append("static inline int64_t ts_min64(int64_t a, int64_t b) { return a < b ? a : b; }\n")
        L.append(SPLITS_C)
        L.append(WORKSPACE_C)
        L.extend(gen.statics)
        if amx:
            setup: list[str] = []
            _emit_amx_setup(setup.append, None)
            L.extend(setup)
            L.append(_amx_micro_kernels(cfg.nr, DVP))
        else:
            L.append(_micro_kernels(isa, cfg.mr, cfg.nr, DK, DVP))
        exp_row = _exp_row(vec_isa)
        pack = _AmxPacking(F, ind) if amx else _Fp32Packing(F, ind)
        decls = "\n".join("    " + d for d in gen.decls)
        body = f"""/* Macro-kernel: tasks = NB x splits (a batch entry's query blocks cut into `splits` runs, so that
 * every thread has work when NB is small); a task packs its entry's Kᵀ and V once (all keys), then
 * per block of T_Mb query rows: pack the rows, and per block of T_Nb keys S = Q·Kᵀ, the score
 * epilogue, the online softmax and O += P·V; finally O / l through the output epilogue. */
void {self.func}({', '.join(params)})
{{
    if (ts_NB <= 0 || ts_M <= 0) return;
{decls}
    const int64_t ts_n_qb = (ts_M + TS_MB - 1) / TS_MB;
    const int64_t ts_splits = ts_attention_splits(ts_NB, ts_n_qb, omp_get_max_threads());
    const int64_t ts_run = (ts_n_qb + ts_splits - 1) / ts_splits, ts_n_tasks = ts_NB * ts_splits;
    const int64_t ts_n_kb = (ts_N + TS_NJ - 1) / TS_NJ;
    #pragma omp parallel if (ts_n_tasks > 1 && ts_NB * ts_M * (ts_N + 1) * (TS_DK + TS_DV) > 65536)
    {{{pack.setup}
{carve_c(pack.buffers())}        float ts_mx[TS_MB], ts_l[TS_MB];
        #pragma omp for schedule(dynamic, 1)
        for (int64_t ts_t = 0; ts_t < ts_n_tasks; ++ts_t) {{
            const int64_t ts_b = ts_t / ts_splits, ts_qb0 = (ts_t % ts_splits) * ts_run;
            const int64_t ts_qb1 = ts_min64(ts_n_qb, ts_qb0 + ts_run);
            if (ts_qb0 >= ts_qb1) continue;
            int ts_bad = 0;     /* a non-finite K or V element: the masked tail then runs (NaN semantics) */
            float ts_vnf[TS_DVP];   /* per value column, 0 * (every V element): NaN where one is non-finite */
            memset(ts_vnf, 0, sizeof ts_vnf);
{pack.keys()}
            for (int64_t ts_qb = ts_qb0; ts_qb < ts_qb1; ++ts_qb) {{
            const int64_t ts_m0 = ts_qb * TS_MB;
            const int64_t ts_mv = ts_min64(TS_MB, ts_M - ts_m0), ts_mvp = (ts_mv + TS_MR - 1) / TS_MR * TS_MR;
            /* pack the block's Q rows (prologue fused); rows past M are zero (local padding) */
            for (int64_t ts_r = 0; ts_r < ts_mv; ++ts_r) {{
                const int64_t ts_i = ts_m0 + ts_r;
                #pragma omp simd
                for (int64_t ts_k = 0; ts_k < TS_DK; ++ts_k) {{
{ind(F['q'][1], 5)}
                    ts_q[ts_r * TS_DK + ts_k] = {F['q'][0]};
                }}
            }}
            memset(ts_q + ts_mv * TS_DK, 0, sizeof(float) * (ts_mvp - ts_mv) * TS_DK);{pack.q_convert}
            memset(ts_o, 0, sizeof(float) * TS_MB * TS_DVP);
            for (int64_t ts_r = 0; ts_r < TS_MB; ++ts_r) {{ ts_mx[ts_r] = -INFINITY; ts_l[ts_r] = 0.0f; }}
            int64_t ts_Nq = ts_N;     /* the keys this block of queries processes */
{self._masked_tail_scan(F, ind)}
            const int64_t ts_n_kbq = (ts_Nq + TS_NJ - 1) / TS_NJ;
            for (int64_t ts_cb = 0; ts_cb < ts_n_kbq; ts_cb += TS_NC / TS_NJ) {{
                /* one chunk: key blocks [cb, cb + T_Nc / T_Nb), S for all of them, then the softmax
                 * bookkeeping once per row, then P·V over the chunk's keys */
                const int64_t ts_nbk = ts_min64(TS_NC / TS_NJ, ts_n_kbq - ts_cb);
                const int64_t ts_j0 = ts_cb * TS_NJ, ts_width = ts_nbk * TS_NJ, ts_nv = ts_min64(ts_width, ts_Nq - ts_j0);
                for (int64_t ts_kb = 0; ts_kb < ts_nbk; ++ts_kb) {{
                    const {pack.elem}* restrict ts_ktb = ts_kt + (ts_cb + ts_kb) * TS_NJ * TS_DKP{pack.k_div};
                    for (int64_t ts_r = 0; ts_r < ts_mvp; ts_r += TS_MR)
                        ts_qk({pack.q} + ts_r * TS_DKP, ts_ktb, ts_s + ts_r * TS_NC + ts_kb * TS_NJ);
                }}
                /* score epilogue ({', '.join(o.op_type for o in self._score_ops()) or 'none'}), online softmax */
                for (int64_t ts_r = 0; ts_r < ts_mvp; ++ts_r) {{
                    float* restrict ts_srow = ts_s + ts_r * TS_NC;
                    if (ts_r >= ts_mv) {{ memset(ts_srow, 0, sizeof(float) * ts_width); continue; }}
                    const int64_t ts_i = ts_m0 + ts_r;
                    float ts_bm = -INFINITY;
                    #pragma omp simd reduction(max:ts_bm)
                    for (int64_t ts_c = 0; ts_c < ts_nv; ++ts_c) {{
                        const int64_t ts_j = ts_j0 + ts_c;
                        const float acc = ts_srow[ts_c];
{ind(F['s'][1], 6)}
                        const float ts_sc = {F['s'][0]};
                        ts_srow[ts_c] = ts_sc;
                        ts_bm = ts_sc > ts_bm ? ts_sc : ts_bm;
                    }}
                    const float ts_m_new = ts_bm > ts_mx[ts_r] ? ts_bm : ts_mx[ts_r];
                    if (ts_m_new == -INFINITY) {{   /* every key so far masked: nothing to add */
                        memset(ts_srow, 0, sizeof(float) * ts_width);
                        continue;
                    }}
                    const float ts_corr = ts_expf(ts_mx[ts_r] - ts_m_new);
                    for (int64_t ts_c = ts_nv; ts_c < ts_width; ++ts_c) ts_srow[ts_c] = -INFINITY;  /* padded keys: P = 0 */
                    const float ts_sum = ts_exp_row(ts_srow, ts_m_new, ts_width);
                    ts_l[ts_r] = ts_l[ts_r] * ts_corr + ts_sum;
                    ts_mx[ts_r] = ts_m_new;
                    if (ts_corr != 1.0f) {{
                        #pragma omp simd
                        for (int64_t ts_d = 0; ts_d < TS_DVP; ++ts_d) ts_o[ts_r * TS_DVP + ts_d] *= ts_corr;
                    }}
                }}
{pack.pv}
            }}
            /* O / l through the output epilogue ({', '.join(o.op_type for o in self._output_ops()) or 'store'});
             * a fully masked row: P·V of the guarded NaN probabilities; no keys at all: an empty sum, 0.
             * A row with a NaN score (a NaN key) has NaN probabilities throughout: NaN, or under the
             * guard P = 0, whose P·V is 0 * V summed over every key (NaN where a value is non-finite) */
            for (int64_t ts_r = 0; ts_r < ts_mv; ++ts_r) {{
                const int64_t ts_i = ts_m0 + ts_r;
                const int ts_dead = ts_mx[ts_r] == -INFINITY;
                const int ts_nan_row = {'ts_l[ts_r] != ts_l[ts_r]' if self.masked_value == 0.0 else '0'};
                const float ts_inv = ts_dead ? 0.0f : 1.0f / ts_l[ts_r];
                #pragma omp simd
                for (int64_t ts_d = 0; ts_d < TS_DV; ++ts_d) {{
                    const float acc = ts_dead ? (ts_N > 0 ? {masked} : 0.0f)
                                    : ts_nan_row ? ts_vnf[ts_d] : ts_o[ts_r * TS_DVP + ts_d] * ts_inv;
{ind(F['o'][1], 5)}
                }}
            }}
            }}
        }}
{pack.teardown}    }}
}}
"""
        L.append(math_helpers(body + exp_row))       # ts_expf (and what the epilogues call) before use
        L.append(exp_row)
        L.append(body)
        return "\n".join(L)

    def _masked_tail_scan(self, F, ind) -> str:
        """C that trims ``ts_Nq`` to the keys some row of the query block can see (see MASK_DEAD); only
        where the score epilogue reads a tensor (a mask) besides QKᵀ, else no key can be masked."""
        if not re.search(r"\bin\d+\[", "\n".join(F["s"][1]) + str(F["s"][0])):
            return "            /* no mask in the score epilogue: every key is live */"
        lines, expr = F["s"][1], F["s"][0]

        def dead_at(acc: str) -> str:
            return (f"{{ const float acc = {acc};\n{ind(lines, 8)}\n"
                    f"                                ts_dead = ({expr}) <= TS_MASK_DEAD; }}")
        return f"""            if (!ts_bad) {{  /* masked key tail: a key whose score stays at most TS_MASK_DEAD whatever QKᵀ gives (the
                * score epilogue at acc = -/+{MASK_PROBE:g}) has P = e^(s - max) = 0 in fp32 once its row has
                * a live key; keys past every row's last live key run neither QKᵀ nor P·V (a causal mask
                * halves the work). A row with no live key keeps every key (softmax over masked scores).
                * Not when a key or value is NaN or infinite: a masked NaN score (NaN + -inf) or a NaN value
                * times P = 0 makes every row NaN, as onnxruntime computes it. */
                int64_t ts_live = 0;
                for (int64_t ts_r = 0; ts_r < ts_mv && ts_live < ts_N; ++ts_r) {{
                    const int64_t ts_i = ts_m0 + ts_r;
                    int64_t ts_j = ts_N - 1;
                    for (; ts_j >= 0; --ts_j) {{
                        int ts_dead = 0;
                        {dead_at(f"-{MASK_PROBE:g}f")}
                        if (ts_dead) {dead_at(f"{MASK_PROBE:g}f")}
                        if (!ts_dead) break;
                    }}
                    ts_live = ts_j < 0 ? ts_N : ts_live > ts_j + 1 ? ts_live : ts_j + 1;
                }}
                ts_Nq = ts_live;
            }}"""

    def _score_ops(self) -> list[Op]:
        inner = {id(x) for x in walk([self.h1])}
        return [o for o in walk([self.sm.args[0]]) if isinstance(o, Op) and id(o) not in inner]

    def _output_ops(self) -> list[Op]:
        inner = {id(x) for x in walk([self.h2])}
        return [o for o in walk(self.group.outputs.values()) if isinstance(o, Op) and id(o) not in inner]

    def _header(self) -> str:
        cfg = self.cfg
        return "\n".join([
            "/*",
            f" * tscomp attention macro-kernel `{self.func}` for fused group {self.group.name} (generated; do not edit)",
            f" *   fused: QKᵀ ({self.h1.node}) -> {', '.join(o.op_type for o in self._score_ops()) or 'no score ops'}"
            f" -> Softmax ({self.sm.node}) -> P·V ({self.h2.node}) -> "
            f"{', '.join(o.op_type for o in self._output_ops()) or 'store'}",
            f" *   extents: NB = {self.NB}, M = {self.M} queries, N = {self.N} keys, head widths DK = {self.DK}, "
            f"DV = {self.DV}",
            f" *   tiles: T_Mb = {cfg.mc} query rows per task, T_Nb = {cfg.nr} keys per block, T_Nc = {cfg.nc} keys "
            f"per softmax chunk, register tile T_Mi = {cfg.mr} rows ({self.isa})",
            f" *   a fully masked row (all scores -inf) gives P·V = {'0' if self.masked_value == 0.0 else 'NaN'}",
            " */"])

    # ------------------------------------------------------------------ build and run
    def _bind_function(self, lib) -> None:
        fn = getattr(lib, self.func)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p for role, _, _ in self.arg_roles if role != "symbol"] + \
            [ctypes.c_int64] * (3 + len(self.syms))
        self.fn = fn

    def _evaluate(self, binding: Mapping[str, int]):
        key = binding_key(binding)
        got = self._sizes.get(key)
        if got is None:
            b = dict(binding)
            ev = lambda x: int(self.symtab.evaluate(x, b))   # noqa: E731
            got = self._sizes[key] = (
                ev(self.NB), ev(self.M), ev(self.N),
                {n: tuple(ev(d) for d in s) for n, s in self.out_shapes.items()},
                {n: tuple(ev(d) for d in s) for n, s in self._in_shapes.items()},
                tuple(ev(s) for s in self.syms))
        return got

    def tasks(self, binding: Mapping[str, int]) -> int:
        from tscomp.codegen.build import get_num_threads
        b = dict(binding)
        NB, M = (int(self.symtab.evaluate(x, b)) for x in (self.NB, self.M))
        return NB * int(attention_splits(NB, -(-M // self.cfg.mc), get_num_threads()))

    def native_call(self) -> NativeCall:
        tensors = [NativeArg("tensor", name, dtype=np.dtype(dt).name) for role, name, dt in self.arg_roles
                   if role != "symbol"]
        ints = [NativeArg("int", expr=e) for e in (self.NB, self.M, self.N, *self.syms)]
        return NativeCall(self.func, (*tensors, *ints), guard=self.NB * self.M)

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]:
        NB, M, N, outs, ins, syms = self._evaluate(binding)
        if self.fn is None:
            link(self)
        outputs = {name: np.empty(outs[name], dt) for role, name, dt in self.arg_roles if role == "output"}
        keep, args = [], []
        for role, name, dt in self.arg_roles:
            if role == "input":
                arr = np.ascontiguousarray(env[name])
                if arr.dtype != dt or arr.shape != ins[name]:
                    raise ExecutionError(f"group {self.group.name}: input {name!r} is {arr.dtype}{list(arr.shape)}, "
                                         f"expected {dt}{list(ins[name])}")
                keep.append(arr)
                args.append(arr.ctypes.data)
            elif role == "output":
                args.append(outputs[name].ctypes.data)
        if NB > 0 and M > 0:
            self.fn(*args, NB, M, N, *syms)
        return outputs

    __call__ = run


class _Fp32Packing:
    """The fp32 kernel's operand layouts: Kᵀ in k-major blocks of T_Nb keys, V row-major, P·V on the
    S block (the pieces of :meth:`CompiledAttention._generate` that differ from the AMX kernel's)."""
    setup = teardown = q_convert = k_div = ""
    fixed_extra: tuple = ()
    elem = elem16 = "float"
    q = "ts_q"

    def __init__(self, F, ind):
        self.F, self.ind = F, ind

    def buffers(self) -> list[tuple[str, str, str]]:
        """A task's buffers (C type, name, elements): the fixed-size ones first, then the packed keys
        and values, whose size follows the number of keys (:func:`tscomp.codegen.workspace.carve_c`)."""
        keys = "(ts_n_kb > 0 ? ts_n_kb : 1) * TS_NJ"
        return [("float", "ts_q", "TS_MB * TS_DK"), ("float", "ts_s", "TS_MB * TS_NC"), ("float", "ts_o", "TS_MB * TS_DVP"),
                *self.fixed_extra, (self.elem, "ts_kt", f"{keys} * TS_DKP{self.k_div}"),
                (self.elem16, "ts_v", f"{keys} * TS_DVP")]

    def keys(self) -> str:
        F, ind = self.F, self.ind
        return f"""            /* pack every key of this entry: Kᵀ in k-major blocks of T_Nb keys, V row-major with the
             * head padded to the vector width; keys past N are zero (local padding) */
            for (int64_t ts_j = 0; ts_j < ts_n_kb * TS_NJ; ++ts_j) {{
                float* restrict ts_kcol = ts_kt + (ts_j / TS_NJ) * TS_NJ * TS_DK + ts_j % TS_NJ;
                float* restrict ts_vrow = ts_v + ts_j * TS_DVP;
                if (ts_j >= ts_N) {{
                    for (int64_t ts_k = 0; ts_k < TS_DK; ++ts_k) ts_kcol[ts_k * TS_NJ] = 0.0f;
                    memset(ts_vrow, 0, sizeof(float) * TS_DVP);
                    continue;
                }}
                #pragma omp simd reduction(|:ts_bad)
                for (int64_t ts_k = 0; ts_k < TS_DK; ++ts_k) {{
{ind(F['k'][1], 5)}
                    const float ts_x = {F['k'][0]};
                    ts_kcol[ts_k * TS_NJ] = ts_x;
                    ts_bad |= ts_x - ts_x != 0.0f;
                }}
                #pragma omp simd reduction(|:ts_bad)
                for (int64_t ts_d = 0; ts_d < TS_DV; ++ts_d) {{
{ind(F['v'][1], 5)}
                    const float ts_x = {F['v'][0]};
                    ts_vrow[ts_d] = ts_x;
                    ts_bad |= ts_x - ts_x != 0.0f;
                    ts_vnf[ts_d] += 0.0f * ts_x;
                }}
                for (int64_t ts_d = TS_DV; ts_d < TS_DVP; ++ts_d) ts_vrow[ts_d] = 0.0f;
            }}"""

    @property
    def pv(self) -> str:
        # key slices outermost: every row tile of the block reads the slice's V from L1 (a whole
        # chunk's V -- 256 keys of a 64-wide head, 64 KiB -- streamed from L2 once per row tile)
        return """                for (int64_t ts_c0 = 0; ts_c0 < ts_nv; ts_c0 += TS_PV_KEYS) {
                    const int64_t ts_nk = ts_min64(TS_PV_KEYS, ts_nv - ts_c0);
                    for (int64_t ts_r = 0; ts_r < ts_mvp; ts_r += TS_MR)
                        ts_pv(ts_s + ts_r * TS_NC + ts_c0, ts_v + (ts_j0 + ts_c0) * TS_DVP, ts_o + ts_r * TS_DVP, ts_nk);
                }"""


class _AmxPacking(_Fp32Packing):
    """The AMX kernel's operand layouts (bf16, rounded to nearest even): Q rows and P rows as A tiles,
    Kᵀ as 16-key groups of bf16-pair rows and V as key-pair rows (the B tiles' VNNI layout); the
    softmax and everything around it stays fp32."""
    elem, elem16, k_div, q = "uint32_t", "uint16_t", " / 2", "ts_q16"
    setup = """
        amx_configure();   /* this thread's tile registers */"""
    teardown = """        _tile_release();
"""
    fixed_extra = (("uint16_t", "ts_q16", "TS_MB * TS_DKP"), ("uint16_t", "ts_p16", "TS_MB * TS_NC"))
    q_convert = """
            for (int64_t ts_r = 0; ts_r < ts_mvp; ++ts_r)    /* Q rows as bf16 A tiles, depth padded with 0 */
                ts_bf16_row(ts_q + ts_r * TS_DK, ts_q16 + ts_r * TS_DKP, TS_DK, TS_DKP);"""

    def keys(self) -> str:
        F, ind = self.F, self.ind
        return f"""            /* pack every key of this entry as bf16 B tiles, 16 keys at a time; keys past N are zero
             * (local padding): Kᵀ in groups of 16 keys, DKP/2 rows of 16 bf16 pairs
             * (ts_kt[(j/16)*(DKP/2)*16 + p*16 + j%16] holds K[j][2p], K[j][2p+1]: a 16 x DKP/2 transpose
             * of the group's rows, one gather per row), V as key pairs (ts_v[((j/2)*DVP + d)*2 + j%2] =
             * V[j][d]: two keys' rows interleaved, one permute per 16 elements) */
            const __m512i ts_gidx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                       _mm512_set1_epi32(TS_DKP / 2));
            const __m512i ts_pidx = _mm512_loadu_si512(ts_pair_interleave);
            for (int64_t ts_g = 0; ts_g < ts_n_kb * TS_NJ; ts_g += 16) {{
                uint32_t ts_kg[16 * (TS_DKP / 2)] __attribute__((aligned(64)));
                uint16_t ts_vg[16 * TS_DVP] __attribute__((aligned(64)));
                for (int64_t ts_jj = 0; ts_jj < 16; ++ts_jj) {{
                    const int64_t ts_j = ts_g + ts_jj;
                    float ts_krow[TS_DKP], ts_vrow[TS_DVP];
                    memset(ts_krow, 0, sizeof ts_krow);
                    memset(ts_vrow, 0, sizeof ts_vrow);
                    if (ts_j < ts_N) {{
                        #pragma omp simd reduction(|:ts_bad)
                        for (int64_t ts_k = 0; ts_k < TS_DK; ++ts_k) {{
{ind(F['k'][1], 7)}
                            ts_krow[ts_k] = {F['k'][0]};
                            ts_bad |= ts_krow[ts_k] - ts_krow[ts_k] != 0.0f;
                        }}
                        #pragma omp simd reduction(|:ts_bad)
                        for (int64_t ts_d = 0; ts_d < TS_DV; ++ts_d) {{
{ind(F['v'][1], 7)}
                            ts_vrow[ts_d] = {F['v'][0]};
                            ts_bad |= ts_vrow[ts_d] - ts_vrow[ts_d] != 0.0f;
                            ts_vnf[ts_d] += 0.0f * ts_vrow[ts_d];
                        }}
                    }}
                    ts_bf16_row(ts_krow, (uint16_t*)(ts_kg + ts_jj * (TS_DKP / 2)), TS_DKP, TS_DKP);
                    ts_bf16_row(ts_vrow, ts_vg + ts_jj * TS_DVP, TS_DVP, TS_DVP);
                }}
                uint32_t* restrict ts_kdst = ts_kt + (ts_g / 16) * (TS_DKP / 2) * 16;
                for (int64_t ts_p = 0; ts_p < TS_DKP / 2; ++ts_p)
                    _mm512_storeu_si512(ts_kdst + ts_p * 16, _mm512_i32gather_epi32(ts_gidx, ts_kg + ts_p, 4));
                for (int64_t ts_q = 0; ts_q < 8; ++ts_q) {{
                    uint16_t* restrict ts_vdst = ts_v + (ts_g / 2 + ts_q) * TS_DVP * 2;
                    for (int64_t ts_d = 0; ts_d < TS_DVP; ts_d += 16) {{
                        const __m512i ts_a = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(ts_vg + 2 * ts_q * TS_DVP + ts_d)));
                        const __m512i ts_b = _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i*)(ts_vg + (2 * ts_q + 1) * TS_DVP + ts_d)));
                        _mm512_storeu_si512(ts_vdst + 2 * ts_d, _mm512_permutex2var_epi16(ts_a, ts_pidx, ts_b));
                    }}
                }}
            }}"""

    @property
    def pv(self) -> str:
        return """                /* P rows as bf16 A tiles over the chunk's whole width (P = 0 past its live keys) */
                for (int64_t ts_r = 0; ts_r < ts_mvp; ++ts_r)
                    ts_bf16_row(ts_s + ts_r * TS_NC, ts_p16 + ts_r * TS_NC, ts_width, ts_width);
                for (int64_t ts_r = 0; ts_r < ts_mvp; ts_r += TS_MR)
                    ts_pv(ts_p16 + ts_r * TS_NC, ts_v + (ts_j0 / 2) * TS_DVP * 2, ts_o + ts_r * TS_DVP, ts_width);"""


#: the AMX kernel's tile registers: A (16 rows of Q or P), the accumulators, the rotating B tiles
_AMX_A, _AMX_ACC, _AMX_B = 0, (2, 3, 4, 5), (1, 6, 7)


def _amx_micro_kernels(nj: int, dvp: int) -> str:
    """AMX ``ts_qk`` (S[16 × nj] = Q · Kᵀ over the packed depth) and ``ts_pv`` (O[16 × dvp] += P · V over
    ``width`` keys, whole 32-key steps, the head in chunks of up to 4 accumulator tiles), and the fp32 ->
    bf16 row conversion the packing uses (the GEMM packing's :data:`~tscomp.codegen.cpu_gemm.BF16_ROW_C`)."""
    a, acc, bs = _AMX_A, _AMX_ACC, _AMX_B
    n_s = nj // AMX_ROWS
    L = [BF16_ROW_C,
         "/* 32 uint16 lanes: a[0], b[0], a[1], b[1], ... (two keys' V rows as key pairs) */",
         "static const uint16_t ts_pair_interleave[32] __attribute__((aligned(64))) = {"
         + ", ".join(str(i // 2 + (32 if i % 2 else 0)) for i in range(32)) + "};",
         f"/* AMX tiles: {a} = A (16 rows of Q or P, bf16), {', '.join(map(str, bs))} = B (Kᵀ or V pairs, rotating), "
         f"{acc[0]}..{acc[-1]} = fp32 accumulators",
         " * S tile: 16 query rows x NJ keys over the packed depth, stored into the chunk's S block (row stride T_Nc) */",
         "static inline __attribute__((always_inline)) void ts_qk(const uint16_t* restrict q, const uint32_t* restrict kt, "
         "float* restrict s)", "{",
         "    " + " ".join(f"_tile_zero({acc[c]});" for c in range(n_s)),
         "    for (int ks = 0; ks < TS_DKP / 32; ++ks) {",
         f"        _tile_loadd({a}, q + ks * 32, TS_DKP * 2);"]
    for c in range(n_s):
        b = bs[c % len(bs)]
        L.append(f"        _tile_loadd({b}, kt + {c} * (TS_DKP / 2) * 16 + ks * 256, 64); _tile_dpbf16ps({acc[c]}, {a}, {b});")
    L.append("    }")
    L.append("    " + " ".join(f"_tile_stored({acc[c]}, s + {c * AMX_ROWS}, TS_NC * 4);" for c in range(n_s)))
    L.append("}")
    L += ["/* O tile: 16 rows x the head in chunks of up to 4 accumulator tiles, += P (bf16 rows, stride T_Nc) . V",
          " * (key-pair rows) over `width` keys, a whole number of 32-key steps */",
          "static inline __attribute__((always_inline)) void ts_pv(const uint16_t* restrict p, const uint16_t* restrict v, "
          "float* restrict o, int64_t width)", "{"]
    nd = dvp // AMX_ROWS
    for d0 in range(0, nd, len(acc)):
        ds = list(range(d0, min(nd, d0 + len(acc))))
        L.append("    {")
        L.append("    " + " ".join(f"_tile_loadd({acc[i]}, o + {d * AMX_ROWS}, TS_DVP * 4);" for i, d in enumerate(ds)))
        L.append("    for (int64_t t = 0; t < width; t += 32) {")
        L.append(f"        _tile_loadd({a}, p + t, TS_NC * 2);")
        for i, d in enumerate(ds):
            b = bs[i % len(bs)]
            L.append(f"        _tile_loadd({b}, v + (t / 2) * TS_DVP * 2 + {d * 2 * AMX_ROWS}, TS_DVP * 4); "
                     f"_tile_dpbf16ps({acc[i]}, {a}, {b});")
        L.append("    }")
        L.append("    " + " ".join(f"_tile_stored({acc[i]}, o + {d * AMX_ROWS}, TS_DVP * 4);" for i, d in enumerate(ds)))
        L.append("    }")
    L.append("}\n")
    return "\n".join(L)


def _micro_kernels(isa: str, mr: int, nj: int, dk: int, dvp: int) -> str:
    """``ts_qk``: S[mr × nj] = Q[mr × dk] · Kᵀ[dk × nj]; ``ts_pv``: O[mr × dvp] += P[mr × nv] · V[nv × dvp],
    the head split into chunks of at most 4 vectors (the register tile)."""
    if isa == "scalar":
        return """static inline void ts_qk(const float* restrict q, const float* restrict kt, float* restrict s)
{
    for (int r = 0; r < TS_MR; ++r)
        for (int c = 0; c < TS_NJ; ++c) {
            float a = 0.0f;
            for (int k = 0; k < TS_DK; ++k) a = fmaf(q[r * TS_DK + k], kt[k * TS_NJ + c], a);
            s[r * TS_NC + c] = a;
        }
}
static inline void ts_pv(const float* restrict p, const float* restrict v, float* restrict o, int64_t nv)
{
    for (int r = 0; r < TS_MR; ++r)
        for (int64_t c = 0; c < nv; ++c)
            for (int d = 0; d < TS_DVP; ++d) o[r * TS_DVP + d] = fmaf(p[r * TS_NC + c], v[c * TS_DVP + d], o[r * TS_DVP + d]);
}
"""
    v = _Vec(isa)
    W = v.width
    L = ["/* S tile: MR x NJ accumulators over the head width (no bounds tests: padded rows/keys are zero),",
         " * stored into the chunk's S block (row stride T_Nc) */",
         "static inline __attribute__((always_inline)) void ts_qk(const float* restrict q, const float* restrict kt, "
         "float* restrict s)", "{"]
    accs = [[f"c{r}_{c}" for c in range(nj // W)] for r in range(mr)]
    L.append(f"    {v.type} " + ", ".join(a for row in accs for a in row) + ";")
    L.extend("    " + " ".join(f"{a} = {v.zero()};" for a in row) for row in accs)
    L.append(f"    for (int k = 0; k < {dk}; ++k) {{")
    emit_tile_step(L.append, accs, [v.load(f"kt + k * {nj} + {c * W}") for c in range(nj // W)],
                   [v.set1(f"q[{r} * {dk} + k]") for r in range(mr)], v.fma, v.type, isa, indent="        ")
    L.append("    }")
    for r, row in enumerate(accs):
        L.append("    " + " ".join(v.store(f"s + {r} * TS_NC + {c * W}", a) for c, a in enumerate(row)))
    L.append("}")
    L += [f"/* O tile: MR rows x the head in chunks of up to {pv_chunk_vectors(isa, mr)} vectors, over the chunk's nv "
          "keys (P row stride T_Nc) */",
          "static inline __attribute__((always_inline)) void ts_pv(const float* restrict p, const float* restrict v, "
          "float* restrict o, int64_t nv)", "{"]
    nvec, per = dvp // W, pv_chunk_vectors(isa, mr)
    for c0 in range(0, nvec, per):
        cs = range(c0, min(nvec, c0 + per))
        accs = [[f"o{r}_{c}" for c in cs] for r in range(mr)]
        L.append("    {")
        L.append(f"    {v.type} " + ", ".join(a for row in accs for a in row) + ";")
        for r, row in enumerate(accs):
            L.append("    " + " ".join(f"{a} = {v.load(f'o + {r * dvp + c * W}')};" for c, a in zip(cs, row)))
        L.append("    for (int64_t c = 0; c < nv; ++c) {")
        emit_tile_step(L.append, accs, [v.load(f"v + c * {dvp} + {c * W}") for c in cs],
                       [v.set1(f"p[{r} * TS_NC + c]") for r in range(mr)], v.fma, v.type, isa, indent="        ")
        L.append("    }")
        for r, row in enumerate(accs):
            L.append("    " + " ".join(v.store(f"o + {r * dvp + c * W}", a) for c, a in zip(cs, row)))
        L.append("    }")
    L.append("}\n")
    return "\n".join(L)


def _exp_polynomial(p: str, t: str) -> str:
    """The reduction x - n ln2 (ln2 in two parts) and the degree-6 Taylor polynomial of e^r, for the
    intrinsics prefix ``p`` and vector type ``t`` (``n``, ``x`` defined before; ``p`` the result)."""
    return f"""    {t} r = {p}_fmadd_ps(n, {p}_set1_ps(-0.693359375f), x);
    r = {p}_fmadd_ps(n, {p}_set1_ps(2.12194440e-4f), r);
    {t} p = {p}_set1_ps(1.0f / 720.0f);
""" + "".join(f"    p = {p}_fmadd_ps(p, r, {p}_set1_ps({c}));\n"
              for c in ("1.0f / 120.0f", "1.0f / 24.0f", "1.0f / 6.0f", "0.5f", "1.0f", "1.0f"))


def _exp_row_loop(p: str, t: str, width: int) -> str:
    """``ts_exp_row``'s head and loop for the intrinsics prefix ``p`` (the sum left in ``acc``)."""
    return f"""static inline float ts_exp_row(float* restrict s, float m, int64_t n)
{{
    const {t} vm = {p}_set1_ps(m);
    {t} acc = {p}_setzero_ps();
    for (int64_t c = 0; c < n; c += {width}) {{   /* n: a whole number of key blocks, so of vectors */
        const {t} p = ts_exp_nonpositive({p}_sub_ps({p}_loadu_ps(s + c), vm));
        {p}_storeu_ps(s + c, p);
        acc = {p}_add_ps(acc, p);
    }}
"""


_EXP_ROW_AVX2 = """static inline __m256 ts_exp_nonpositive(__m256 x)
{
    /* as the AVX-512 kernel's: 0 below -87 (never a denormal), NaN stays NaN (unordered: live; MAXPS
     * returns its second operand, x, when either is NaN, and NaN * 2^n stays NaN) */
    const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ);
    x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
""" + _exp_polynomial("_mm256", "__m256") + """    /* 2^n for n in [-126, 0]: the biased exponent n + 127 in [1, 127] */
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), live);
}
""" + _exp_row_loop("_mm256", "__m256", 8) + """    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
"""


def _exp_row(isa: str) -> str:
    """``ts_exp_row(s, m, n)``: s[c] = e^(s[c] - m) over the n keys of a score row's chunk, returning their
    sum. The arguments are never positive (m is the row maximum), so on AVX-512 the exponential is
    range reduction to r in [-ln2/2, ln2/2], a degree-6 Taylor polynomial (truncation < 1.3e-7
    relative) and VSCALEFPS for the 2^n -- 11 vector operations, a third of
    :data:`~tscomp.codegen.c_expr.EXP_HELPER`'s general expf; results below 2^-125 (x < -87, -inf
    included) are 0 rather than denormal (no microcode assists), NaN stays NaN. AVX2 the same with
    VROUNDPS and the exponent added as an integer (2^n is a normal number for every kept x); the
    generic helper's clamps and selects cost it twice the time (BERT-base's softmax rows on a Zen 3)."""
    if isa == "avx2":
        return _EXP_ROW_AVX2
    if isa != "avx512":
        return """static inline float ts_exp_row(float* restrict s, float m, int64_t n)
{
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t c = 0; c < n; ++c) { const float p = ts_expf(s[c] - m); s[c] = p; sum += p; }
    return sum;
}
"""
    return """static inline __m512 ts_exp_nonpositive(__m512 x)
{
    /* e^x below 2^-125 (x < -87) is returned as 0, never as a denormal: a denormal result costs a
     * microcode assist of ~100+ cycles (padded and masked keys made the softmax 3-7x slower); against
     * the row sum (>= 1) such a term is far below fp32 resolution. NaN stays NaN (unordered: live). */
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);       /* NaN stays (max returns its second operand) */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
""" + _exp_polynomial("_mm512", "__m512") + """    return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}
""" + _exp_row_loop("_mm512", "__m512", 16) + """    return _mm512_reduce_add_ps(acc);
}
"""


def link(kernel: CompiledAttention) -> CompiledAttention:
    """The build step: source → shared library (cached by content) → bound entry point."""
    from tscomp.codegen.cpu_gemm import GemmError, check_host_isa
    from tscomp.codegen.families import link_native
    try:
        check_host_isa(kernel.isa)            # AMX: the tiles and the OS's grant, not only the ISA rank
    except GemmError as exc:
        raise UnsupportedOperatorError(f"group {kernel.group.name}: {exc}") from None
    return link_native(kernel)


def compile_attention_group(plan: Plan, group: Group, cfg: TileConfig | None = None, *, isa: str) -> CompiledAttention:
    """Analysis, source and build of one attention group (the heuristic's first tiling by default)."""
    a = AttentionAnalysis(plan, group)
    return link(CompiledAttention(a, cfg or a.heuristic_configs(isa, 1)[0], isa))


__all__ = ["AttentionAnalysis", "CompiledAttention", "MAX_HEAD", "candidate_configs", "compile_attention_group",
           "link", "softmax_chunk", "tile_fits"]
