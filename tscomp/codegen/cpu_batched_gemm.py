"""Batched GEMM macro-kernels for fused groups whose MatMul has two activation operands
(attention's ``Q·Kᵀ`` and ``P·V``), with the group's prologue and epilogue fused.

The heavy op is ``C[b, m, n] = Σ_k A[b, m, k] · B[b, k, n]`` where ``b`` runs over the (numpy-
broadcast) batch dims of the MatMul flattened to one index, and the batch count, M, N and K may all
be symbolic: they enter the kernel as ``int64_t`` arguments, so one compiled kernel serves every
binding (TSCompiler's macro-kernel). A and B are *expressions* of group inputs — views
(Split/Slice/Reshape/Transpose index maps of, say, the fused QKV tensor) and elementwise prologue
ops (the 1/√d scales, IsNaN/Where on the softmax result). Their element loads are generated from
the expression IR by the elementwise generator of :mod:`tscomp.codegen.cpu_groups` (the same way
:mod:`tscomp.codegen.cpu_gemm_group` generates its epilogue), so nothing is materialized between
groups: the prologue is evaluated *while packing*.

Tiling (TSCompiler §5.1, :mod:`tscomp.codegen.tile_config`): one OpenMP task computes a block
``[T_Mb = mc rows] × [T_Nb = nc columns]`` of one batch entry; tasks are ordered (batch, N block,
M block) with the M block fastest and handed out in chunks of consecutive tasks, so a thread re-packs
B only when its (batch, N block) changes (dynamic chunks of up to one (batch, N block)'s M blocks:
a core that another process holds then delays nobody). Per task:

* A's ``mc × K`` rows are packed row-major (K contiguous) and B's ``K × nc`` columns into
  ``nr``-column panels, k-major — each element computed from the IR (views, scales, masks) as it
  is packed. The loop order of each packing nest follows the operand's memory layout: the inner
  loop runs along the axis with unit stride in the input (k for Q and Kᵀ read from a [.., seq, 3·d]
  tensor, n for V), so the loads vectorize.
* K is walked in steps of ``kc`` (T_Kb); per step every ``mr × nr`` register tile (⟨T_Mi, T_Ni⟩)
  runs the FMA micro-kernel: ``mr × nr/W`` accumulator vectors, one broadcast of A and ``nr/W``
  loads of B per k (AVX-512 / AVX2 intrinsics, portable C fallback). Partial sums between K steps
  live in a per-thread buffer; after the last step the tile goes to a small buffer from which the
  epilogue loop stores it.

Imperfect tiles use DietCode's local padding (§4.1): rows past the M block are zero in the packed A,
columns past N are zero in the packed B, so the micro-kernel never tests bounds; only the packing
loads and the final stores are guarded (they run over the valid part only).

Epilogue: elementwise ops after the MatMul, generated from the IR with ``acc`` = the MatMul's value
at (b, m, n), applied in a ``#pragma omp simd`` loop over the finished tile and stored at the output
element (b·M + m)·N + n. Every group output must be that element-for-element function of the MatMul:
its shape a reshape of the leading dims of the MatMul's (same last axis, same element count), and it
must read the MatMul at exactly the element being stored (probed on the IR; anything else is refused).

Refused (``UnsupportedOperatorError("group <name>: <why>")``): non-gemm groups, backbones other than
MatMul, a B operand that is a constant [K, N] weight (prepacked by :class:`~tscomp.codegen.cpu_gemm_group.
CompiledGemmGroup`; a batched constant such as [heads, K, N] is read like an activation), rank-1 operands, non-float32 operands, stitched reductions after the MatMul,
outputs outside the MatMul's element space or reading it elsewhere than at the stored element.
"""
from __future__ import annotations

import ctypes
import math
import re
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.build import build_library, host_isa, load_library
from tscomp.codegen.c_expr import (PRELUDE, broadcast_index, math_helpers, c_symbol_name, delinearize, linearize,
                                   reshape_index)
from tscomp.codegen.cpu_gemm import ISA_RANK, _Vec, emit_accumulators, emit_fma_step
from tscomp.codegen.kernel import NativeArg, NativeCall
from tscomp.codegen.native import (PicklableKernel, binding_key, gemm_parts, refusals_name_group, sha256_text,
                                   structural_signature)
from tscomp.codegen.cpu_groups import GroupGenerator, _Block
from tscomp.codegen.tile_config import (VECTOR_WIDTH, CacheSizes, TileConfig, TileConfigError,
                                        host_caches)
from tscomp.codegen.workspace import WORKSPACE_C, carve_c
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Expr, Input, Op, View, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops.registry import c_type
from tscomp.graph.symbols import numel, same

# ============================================================================ tile configurations
#: register tiles (mr, nr) per ISA for attention-shaped GEMMs, large-M first. AVX-512: 14x32 (28 of
#: the 32 zmm as accumulators, 14 broadcasts + 2 loads per 28 FMAs), 6x64 (24 accumulators, a whole
#: 64-wide head in one panel: P·V's N), 8x48, and 4x32 for short sequences (fewer padded rows).
#: AVX2: the classic 6x16 and reshapes. Scalar: small C loops the compiler may vectorize.
BATCHED_TILES = {
    "avx512": [(14, 32), (6, 64), (8, 48), (4, 32)],
    "avx2": [(6, 16), (4, 24), (2, 32)],
    "scalar": [(4, 8), (1, 8)],
}

#: a typical dynamic extent, for sizing blocks and ranking tiles when M, N or K is symbolic
DYNAMIC_HINT = 512


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _tile_cycles(isa: str, mr: int, nr: int, M: int, N: int, K: int) -> float:
    """Rough FMA-loop cycles of one ``M × N × K`` GEMM with an ``mr × nr`` register tile: per k step
    the tile issues ``mr·nr/W`` FMAs (2 ports), ``mr + nr/W`` loads (2 ports), and is bounded by the
    FMA latency (4) of each accumulator chain; padded rows/columns are computed too."""
    w = VECTOR_WIDTH[isa]
    nvec = nr // w
    per_k = max(mr * nvec / 2, (mr + nvec) / 2, 4.0) + 0.5   # + loop overhead
    return _round_up(M, mr) / mr * _round_up(N, nr) / nr * K * per_k


def candidate_configs(isa: str, M: int | None = None, N: int | None = None, K: int | None = None, *,
                      caches: CacheSizes | None = None) -> list[TileConfig]:
    """A few hardware-aligned tile configurations for a batched ``[M, K] · [K, N]`` GEMM (TSCompiler
    §5.1's hardware-aligned initial population). ``None`` marks a dynamic extent (sized as
    :data:`DYNAMIC_HINT`).

    1. register tiles from :data:`BATCHED_TILES` (``nr`` a whole number of vectors, accumulators
       within the register file), ranked by :func:`_tile_cycles` at the (hinted) sizes — padding
       waste and load/FMA balance;
    2. ``kc``: the ``kc × nr`` B micro-panel and the ``mr × kc`` A micro-panel fill at most half of
       L1 (so the B panel stays in L1 while every A panel of the block streams past it), rounded to
       8; attention's K (head dim 64, or the sequence for P·V) usually takes one or a few steps;
    3. ``mc``: 8 register tiles (fewer when M is short), so a block's packed A stays in L2; ``nc``:
       the whole N up to 256 columns (QKᵀ's N is the sequence: a packed B block of ``K × nc`` floats
       stays in L2), and a variant with half that for more parallel tasks at small batch.
    """
    if isa not in VECTOR_WIDTH:
        raise TileConfigError(f"unknown ISA {isa!r}; expected one of {sorted(VECTOR_WIDTH)}")
    caches = caches or host_caches()
    Mh, Nh, Kh = (DYNAMIC_HINT if x is None else max(1, int(x)) for x in (M, N, K))
    tiles = sorted(BATCHED_TILES[isa], key=lambda t: _tile_cycles(isa, t[0], t[1], Mh, Nh, Kh))
    out: list[TileConfig] = []
    for mr, nr in tiles:
        kc_cap = max(8, (caches.l1 // 2) // (4 * (nr + mr)) // 8 * 8)
        kc = Kh if Kh <= kc_cap else kc_cap
        mc = mr * max(1, min(8, -(-Mh // mr)))
        n_pad = _round_up(Nh, nr)
        nc = min(n_pad, _round_up(256, nr))
        for width in (nc, _round_up(max(nr, nc // 2), nr)):
            cfg = TileConfig(mr=mr, nr=nr, mc=mc, nc=width, kc=kc)
            try:
                cfg.validate(isa)
            except TileConfigError:
                continue
            if cfg not in out:
                out.append(cfg)
    return out


def default_config(isa: str, M=None, N=None, K=None) -> TileConfig:
    return candidate_configs(isa, M, N, K)[0]


# ============================================================================ generator
class _Generator(GroupGenerator):
    """The elementwise generator, emitting separate code *fragments* (A's element, B's element, the
    epilogue) that share names, constant arrays and symbols. In the epilogue the MatMul's value at the
    element being computed is ``acc``; reading it anywhere else is refused."""

    reports_index_errors = False

    def __init__(self, plan: Plan, group: Group, heavy: Op):
        super().__init__(plan, group)
        self.heavy = heavy
        self.expect = None            # flat heavy index the epilogue may read (None: operands)
        self.probe: list | None = None
        self.loads: list | None = None

    def begin(self) -> None:
        self.root = _Block()
        self.stack = [self.root]
        self.where, self.var_block = {}, {}
        self.loads = []

    def lines(self, depth: int) -> list[str]:
        return self.root.render(depth)

    def _value(self, e: Expr, idx) -> str:
        if isinstance(e, Input) and self.loads is not None:
            self.loads.append(self.ctx.simplify(linearize(idx, self.shape(e))))
        return super()._value(e, idx)

    def heavy_value(self, e: Op, idx) -> str:
        if e is not self.heavy:
            self.fail("a second heavy op after the MatMul (row reductions are not fused into a batched GEMM)", e)
        if self.probe is not None:
            self.probe.append(tuple(idx))
            return "acc"
        if self.expect is None:
            self.fail("the MatMul's result feeds its own operands", e)
        if not self.reads_here(idx, self.expect):
            self.fail(f"the epilogue reads the MatMul at [{', '.join(map(str, idx))}], not at the element it "
                      f"stores", e)
        return "acc"

    def reads_here(self, idx, want) -> bool:
        """Whether the MatMul index ``idx`` is the element ``want`` (component-wise, else flat)."""
        idx = tuple(self.ctx.simplify(x) for x in idx)
        if len(idx) == len(want) and all(same(a, b) for a, b in zip(idx, want)):
            return True
        shape = self.shape(self.heavy)
        return same(self.ctx.collapse(self.ctx.simplify(linearize(idx, shape))),
                    self.ctx.collapse(self.ctx.simplify(linearize(want, shape))))


def _is_one(d) -> bool:
    return bool(sympy.sympify(d) == 1)


def _input_names(e: Expr) -> set[str]:
    return {x.name for x in walk([e]) if isinstance(x, Input)}


def _unit_stride(loads, var) -> bool:
    """Whether every recorded input offset that depends on ``var`` advances by exactly 1 with it."""
    hit = False
    for off in loads:
        if var not in off.free_symbols:
            continue
        hit = True
        if sympy.expand(off.xreplace({var: var + 1}) - off) != 1:
            return False
    return hit


_LIBS: dict[str, ctypes.CDLL] = {}


class BatchedGemmAnalysis:
    """The analysis step of the batched-gemm family: the MatMul's batch count NB and M, N, K
    (symbolic), its operand expressions (views and prologue ops), epilogue ops and output shapes —
    independent of tile configuration and target. Raises :class:`UnsupportedOperatorError`
    ("group <name>: <why>") when the group is not the family's."""

    family = "batched-gemm"

    def __init__(self, plan: Plan, group: Group):
        self.plan, self.group = plan, group
        with refusals_name_group(self.group.name):
            self._analyze()

    def signature(self) -> str:
        """Identity for tuning records (see :func:`~tscomp.codegen.native.structural_signature`)."""
        return sha256_text(f"batched-gemm NB={self.NB} M={self.M} N={self.N} K={self.K} "
                           f"{structural_signature(self.group)}")[:16]

    def extents(self) -> dict:
        return {"NB": str(self.NB), "M": str(self.M), "N": str(self.N), "K": str(self.K)}

    def static_extents(self) -> tuple[int | None, int | None, int | None]:
        """M, N, K as ints where static, None where dynamic (the search space's view)."""
        return tuple(int(x) if sympy.sympify(x).is_Integer else None for x in (self.M, self.N, self.K))

    def heuristic_configs(self, isa: str) -> list[TileConfig]:
        return candidate_configs(isa, *self.hints)

    def _fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {why}")

    def _analyze(self) -> None:
        g, graph = self.group, self.plan.graph
        pro, heavy, epi = gemm_parts(g)
        h = heavy[0]
        if h.op_type != "MatMul":
            self._fail(f"backbone {h.op_type} is not a MatMul (the batched kernel implements MatMul only)")
        if len({o.node for o in heavy}) > 1:
            others = ", ".join(sorted({o.op_type for o in heavy[1:]}))
            self._fail(f"stitched heavy ops after the MatMul ({others}): row-reduction epilogues are not fused "
                       f"into the batched GEMM kernel")
        a, b = h.args[0], h.args[1]
        if len(a.shape) < 2 or len(b.shape) < 2:
            self._fail(f"MatMul {h.node!r} with a rank-{min(len(a.shape), len(b.shape))} operand (matrix-vector "
                       f"products are not batched GEMMs)")
        for t, what in ((a, "A operand"), (b, "B operand"), (h, "MatMul result")):
            if np.dtype(t.dtype) != np.float32:
                self._fail(f"{what} is {np.dtype(t.dtype)}, only float32 batched GEMMs are generated")
        b_inputs = _input_names(b)
        constant_b = all(graph.values[n].const is not None for n in b_inputs if n in graph.values) and \
            all(n in graph.values for n in b_inputs)
        if constant_b and all(_is_one(d) for d in b.shape[:-2]):
            self._fail(f"MatMul {h.node!r}: B operand is a constant weight, [K, N] (CompiledGemmGroup prepacks it; "
                       f"a batched constant, [heads, K, N], is read here like an activation)")
        symtab = graph.symbols
        canon = lambda s: tuple(symtab.canon(d) for d in s)   # noqa: E731
        self.hshape, self.ashape, self.bshape = canon(h.shape), canon(a.shape), canon(b.shape)
        self.M, self.N = self.hshape[-2], self.hshape[-1]
        self.K = self.ashape[-1]
        if not same(self.bshape[-2], self.K):
            self._fail(f"MatMul {h.node!r}: reduction dims {self.K} and {self.bshape[-2]} differ")
        self.NB = numel(self.hshape[:-2])
        self.heavy, self.pro, self.epi = h, pro, epi

        def hint(x):
            x = sympy.sympify(x)
            if x.is_Integer:
                return int(x)
            hi = symtab.bounds(x)[1]
            return None if not math.isfinite(hi) else max(1, min(int(hi), DYNAMIC_HINT))
        self.hints = (hint(self.M), hint(self.N), hint(self.K))

        # outputs: element-for-element functions of the MatMul (reshapes of its leading dims)
        self.out_shapes = {}
        for name, e in g.outputs.items():
            shape = canon(e.shape)
            if c_type(e.dtype) is None:
                self._fail(f"output {name} is {np.dtype(e.dtype)} (no C type)")
            if not shape or not same(shape[-1], self.N) or not same(numel(shape[:-1]), self.NB * self.M):
                self._fail(f"output {name} of shape [{', '.join(map(str, shape))}] is not the MatMul's element "
                           f"space [{', '.join(map(str, self.hshape))}] up to a reshape of its leading dims")
            self.out_shapes[name] = shape

    def shape_of(self, e: Expr) -> tuple:
        symtab = self.plan.graph.symbols
        return tuple(symtab.canon(d) for d in e.shape)

    def pro_of(self, k: int) -> list[Op]:
        feeds = {id(x) for x in walk([self.heavy.args[k]])}
        return [o for o in self.pro if id(o) in feeds]


class CompiledBatchedGemmGroup(BatchedGemmAnalysis, PicklableKernel):
    """The source and executor steps of the batched-gemm family: an analysis extended with one tile
    configuration and ISA; constructing it generates the C text (pure: nothing is compiled),
    :func:`build_batched_gemm_group` builds and binds it.

    ``run(env, binding)`` has :meth:`tscomp.codegen.cpu_groups.CompiledGroup.run`'s contract: ``env``
    holds (at least) the group's inputs, ``binding`` the shape symbols by name; it returns every
    output of the group."""

    # the graph (weights included) is not needed to run: sizes come from the symbol table
    TRANSIENT = {"fn": None, "_sizes": dict, "plan": None}
    family = "batched-gemm"

    def __init__(self, analysis: BatchedGemmAnalysis, cfg: TileConfig, isa: str):
        self.__dict__.update(analysis.__dict__)      # the analysis' facts, shared (not copied deeply)
        self.fn = None
        self._sizes: dict = {}
        self.symtab = self.plan.graph.symbols
        with refusals_name_group(self.group.name):
            self.isa = isa
            if self.isa not in ISA_RANK:
                self._fail(f"unknown ISA {self.isa!r}")
            self.cfg = cfg.validate(self.isa)
            self.func = "tscomp_" + re.sub(r"\W", "_", self.group.name) + f"_{self.isa}_{self.cfg.slug()}"
            self.source = self._generate()
        self._input_shapes()

    def resources(self) -> dict[str, int]:
        return {"vector_accumulators": self.cfg.accumulators(self.isa)}

    # ------------------------------------------------------------------ code generation
    def _generate(self) -> str:
        g, h = self.group, self.heavy
        cfg, isa = self.cfg, self.isa
        gen = _Generator(self.plan, g, h)
        ctx = gen.ctx
        vb = ctx.var("ts_b", self.NB)
        vi = ctx.var("ts_i", self.M)
        vj = ctx.var("ts_j", self.N)
        vk = ctx.var("ts_k", self.K)
        hb = self.hshape[:-2]
        bidx = delinearize(vb, hb, ctx) if hb else ()

        def operand(e: Expr, idx):
            full = tuple(bidx) + tuple(idx)
            src = broadcast_index(full, self.hshape[:-2] + tuple(self.shape_of(e)[-2:]), self.shape_of(e))
            gen.begin()
            v = gen.value(e, src)
            return v, gen.lines(0), gen.loads

        a_val, a_lines, a_loads = operand(h.args[0], (vi, vk))
        b_val, b_lines, b_loads = operand(h.args[1], (vk, vj))
        # packing loop orders: the inner loop along the input's unit-stride axis
        self.a_inner = "m" if _unit_stride(a_loads, vi) and not _unit_stride(a_loads, vk) else "k"
        self.b_inner = "k" if _unit_stride(b_loads, vk) and not _unit_stride(b_loads, vj) else "n"

        # epilogue: probe which MatMul elements each output reads, then generate the stores
        heavy_idx = tuple(bidx) + (vi, vj)
        out_idx = {}
        for name, e in g.outputs.items():
            shape = self.out_shapes[name]
            idx = tuple(ctx.simplify(x) for x in reshape_index(heavy_idx, self.hshape, shape, ctx))
            out_idx[name] = idx
            gen.begin()
            gen.probe = []
            gen.value(e, idx)
            for p in gen.probe:
                if not gen.reads_here(p, heavy_idx):
                    self._fail(f"output {name} reads the MatMul at [{', '.join(map(str, p))}] while storing its "
                               f"element [{', '.join(map(str, heavy_idx))}] (a view between the MatMul and the "
                               f"output)")
            gen.probe = None
        gen.begin()
        gen.expect = heavy_idx
        stores = []
        self.out_c = {name: f"out{k}" for k, name in enumerate(g.outputs)}
        for name, e in g.outputs.items():
            v = gen.value(e, out_idx[name])
            stores.append(f"{self.out_c[name]}[(ts_b * ts_M + ts_i) * ts_N + ts_j] = {v};")
        epi_lines = gen.lines(0)

        # kernel parameters: inputs the code reads, outputs, sizes, shape symbols
        text = "\n".join(a_lines + b_lines + epi_lines + stores + gen.decls + gen.statics)
        self.arg_roles: list[tuple[str, str, object]] = []
        params = []
        dtypes = {x.name: np.dtype(x.dtype) for x in walk(g.outputs.values()) if isinstance(x, Input)}
        for name, cname in gen.in_c.items():
            if re.search(rf"\b{cname}\[", text):
                dt = dtypes.get(name, np.dtype(self.plan.graph.values[name].dtype))
                params.append(f"const {gen.ctype(dt)}* restrict {cname}")
                self.arg_roles.append(("input", name, dt))
        for name, e in g.outputs.items():
            params.append(f"{gen.ctype(e.dtype)}* restrict {self.out_c[name]}")
            self.arg_roles.append(("output", name, np.dtype(e.dtype)))
        params += ["int64_t ts_NB", "int64_t ts_M", "int64_t ts_N", "int64_t ts_K"]
        self.syms = sorted((s for s in gen.pr.used if s not in ctx.upper_bounds), key=lambda s: s.name)
        for s in self.syms:
            params.append(f"int64_t {c_symbol_name(s.name)}")
            self.arg_roles.append(("symbol", s.name, s))

        L: list[str] = []
        emit = L.append
        emit(self._header(gen))
        emit(PRELUDE)
        emit("#include <omp.h>\n#include <string.h>" + ("\n#include <immintrin.h>" if isa != "scalar" else "") + "\n")
        emit(math_helpers(text))
        emit(f"#define TS_MR {cfg.mr}\n#define TS_NR {cfg.nr}\n#define TS_MC {cfg.mc}\n"
             f"#define TS_NC {cfg.nc}\n#define TS_KC {cfg.kc}\n")
        emit("static inline int64_t ts_min64(int64_t a, int64_t b) { return a < b ? a : b; }\n")
        emit(WORKSPACE_C)
        for s in gen.statics:
            emit(s)
        _emit_micro_kernel(emit, cfg, isa)
        ind = lambda lines, n: "\n".join(" " * (4 * n) + ln if ln.strip() else "" for ln in lines)  # noqa: E731
        decls = "\n".join("    " + d for d in gen.decls)
        if self.a_inner == "k":
            pack_a = f"""            for (int64_t ts_r = 0; ts_r < ts_mv; ++ts_r) {{   /* rows of the block, k contiguous */
                const int64_t ts_i = ts_m0 + ts_r;
                float* restrict ts_dst = ts_apack + ts_r * ts_K;
                #pragma omp simd
                for (int64_t ts_k = 0; ts_k < ts_K; ++ts_k) {{
{ind(a_lines, 5)}
                    ts_dst[ts_k] = {a_val};
                }}
            }}"""
        else:
            pack_a = f"""            for (int64_t ts_k = 0; ts_k < ts_K; ++ts_k) {{   /* A's input has unit stride along m */
                float* restrict ts_dst = ts_apack + ts_k;
                #pragma omp simd
                for (int64_t ts_r = 0; ts_r < ts_mv; ++ts_r) {{
                    const int64_t ts_i = ts_m0 + ts_r;
{ind(a_lines, 5)}
                    ts_dst[ts_r * ts_K] = {a_val};
                }}
            }}"""
        if self.b_inner == "n":
            pack_b = f"""                for (int64_t ts_p = 0; ts_p * TS_NR < ts_nw; ++ts_p) {{   /* NR-column panels, k-major */
                    const int64_t ts_cv = ts_min64(TS_NR, ts_nw - ts_p * TS_NR);
                    for (int64_t ts_k = 0; ts_k < ts_K; ++ts_k) {{
                        float* restrict ts_dst = ts_bpack + (ts_p * ts_K + ts_k) * TS_NR;
                        #pragma omp simd
                        for (int64_t ts_c = 0; ts_c < ts_cv; ++ts_c) {{
                            const int64_t ts_j = ts_j0 + ts_p * TS_NR + ts_c;
{ind(b_lines, 7)}
                            ts_dst[ts_c] = {b_val};
                        }}
                        for (int64_t ts_c = ts_cv; ts_c < TS_NR; ++ts_c) ts_dst[ts_c] = 0.0f;   /* local padding */
                    }}
                }}"""
        else:
            pack_b = f"""                for (int64_t ts_c = 0; ts_c < ts_nwp; ++ts_c) {{   /* B's input has unit stride along k */
                    float* restrict ts_dst = ts_bpack + (ts_c / TS_NR) * ts_K * TS_NR + ts_c % TS_NR;
                    if (ts_c >= ts_nw) {{   /* local padding: zero columns past N */
                        for (int64_t ts_k = 0; ts_k < ts_K; ++ts_k) ts_dst[ts_k * TS_NR] = 0.0f;
                        continue;
                    }}
                    const int64_t ts_j = ts_j0 + ts_c;
                    #pragma omp simd
                    for (int64_t ts_k = 0; ts_k < ts_K; ++ts_k) {{
{ind(b_lines, 6)}
                        ts_dst[ts_k * TS_NR] = {b_val};
                    }}
                }}"""
        epilogue = f"""                        for (int64_t ts_r = 0; ts_r < ts_rows; ++ts_r) {{
                            const int64_t ts_i = ts_i0 + ts_r;
                            #pragma omp simd
                            for (int64_t ts_c = 0; ts_c < ts_nv; ++ts_c) {{
                                const int64_t ts_j = ts_jj + ts_c;
                                const float acc = ts_tile[ts_r * TS_NR + ts_c];
{ind(epi_lines, 8)}
{ind(stores, 8)}
                            }}
                        }}"""
        emit(f"""/* Macro-kernel: tasks = NB x ceil(N / NC) x ceil(M / MC) blocks (M block fastest), handed out in
 * dynamic chunks of consecutive tasks; each task packs its A rows (prologue fused), packs B's panels unless the
 * thread already holds them, walks K in steps of KC, and stores every finished register tile through
 * the fused epilogue. */
void {self.func}({', '.join(params)})
{{
    if (ts_NB <= 0 || ts_M <= 0 || ts_N <= 0) return;
{decls}
    const int64_t ts_n_mb = (ts_M + TS_MC - 1) / TS_MC, ts_n_nb = (ts_N + TS_NC - 1) / TS_NC;
    const int64_t ts_n_kb = ts_K > 0 ? (ts_K + TS_KC - 1) / TS_KC : 1;
    const int64_t ts_n_tasks = ts_NB * ts_n_nb * ts_n_mb;
    const int64_t ts_kalloc = ts_K > 0 ? ts_K : 1;
    /* dynamic chunks of up to one (batch, N block)'s M blocks: a chunk packs B once, and a core that
     * another process holds does not stall the others (no static split to wait for) */
    const int64_t ts_chunk_cap = ts_n_tasks / (4 * (int64_t)omp_get_max_threads());
    const int ts_chunk = (int)(ts_chunk_cap < 1 ? 1 : ts_chunk_cap < ts_n_mb ? ts_chunk_cap : ts_n_mb);
    #pragma omp parallel if (ts_n_tasks > 1 && ts_NB * ts_M * ts_N * (ts_K + 1) > 65536)
    {{
{carve_c([("float", "ts_cbuf", "ts_n_kb > 1 ? TS_MC * TS_NC : 0"), ("float", "ts_apack", "TS_MC * ts_kalloc"),
          ("float", "ts_bpack", "TS_NC * ts_kalloc")])}        if (ts_n_kb <= 1) ts_cbuf = NULL;   /* one K step: tiles go to the output from the register tile */
        float ts_tile[TS_MR * TS_NR] __attribute__((aligned(64)));
        int64_t ts_held = -1;   /* the (batch, N block) whose B panels ts_bpack holds */
        #pragma omp for schedule(dynamic, ts_chunk)
        for (int64_t ts_t = 0; ts_t < ts_n_tasks; ++ts_t) {{
            const int64_t ts_b = ts_t / (ts_n_nb * ts_n_mb);
            const int64_t ts_nb = (ts_t / ts_n_mb) % ts_n_nb, ts_mb = ts_t % ts_n_mb;
            const int64_t ts_m0 = ts_mb * TS_MC, ts_mv = ts_min64(TS_MC, ts_M - ts_m0);
            const int64_t ts_j0 = ts_nb * TS_NC, ts_nw = ts_min64(TS_NC, ts_N - ts_j0);
            const int64_t ts_nwp = (ts_nw + TS_NR - 1) / TS_NR * TS_NR;
            /* pack A[b, m0:m0+mv, :] row-major; prologue: {', '.join(o.op_type for o in self.pro_of(0)) or 'views only'} */
{pack_a}
            const int64_t ts_mvp = (ts_mv + TS_MR - 1) / TS_MR * TS_MR;
            if (ts_mvp > ts_mv)   /* local padding: zero rows past the block */
                memset(ts_apack + ts_mv * ts_K, 0, sizeof(float) * (ts_mvp - ts_mv) * ts_K);
            if (ts_held != ts_t / ts_n_mb) {{
                /* pack B[b, :, j0:j0+nw] into NR-column panels; prologue: {', '.join(o.op_type for o in self.pro_of(1)) or 'views only'} */
{pack_b}
                ts_held = ts_t / ts_n_mb;
            }}
            for (int64_t ts_kb = 0; ts_kb < ts_n_kb; ++ts_kb) {{
                const int64_t ts_k0 = ts_kb * TS_KC, ts_kl = ts_min64(TS_KC, ts_K - ts_k0);
                const int ts_first = ts_kb == 0, ts_last = ts_kb == ts_n_kb - 1;
                for (int64_t ts_jp = 0; ts_jp * TS_NR < ts_nw; ++ts_jp) {{
                    const int64_t ts_jj = ts_j0 + ts_jp * TS_NR, ts_nv = ts_min64(TS_NR, ts_N - ts_jj);
                    const float* ts_bp = ts_bpack + ts_jp * ts_K * TS_NR + ts_k0 * TS_NR;
                    for (int64_t ts_ip = 0; ts_ip * TS_MR < ts_mv; ++ts_ip) {{
                        const int64_t ts_i0 = ts_m0 + ts_ip * TS_MR, ts_rows = ts_min64(TS_MR, ts_mv - ts_ip * TS_MR);
                        float* ts_ct = ts_cbuf ? ts_cbuf + (ts_jp * (TS_MC / TS_MR) + ts_ip) * (TS_MR * TS_NR) : ts_tile;
                        ts_micro_kernel(ts_kl, ts_apack + ts_ip * TS_MR * ts_K + ts_k0, ts_K, ts_bp, ts_ct,
                                        ts_first, ts_last, ts_tile);
                        if (!ts_last) continue;
                        /* fused epilogue ({' + '.join(o.op_type for o in self.epi) or 'store'}) on the valid part, then the single store */
{epilogue}
                    }}
                }}
            }}
        }}
    }}
}}
""")
        return "\n".join(L)

    def _header(self, gen: _Generator) -> str:
        g, cfg = self.group, self.cfg
        h = self.heavy
        views = [e for e in walk(g.outputs.values()) if isinstance(e, View)]
        lines = [
            f"tscomp batched GEMM macro-kernel `{self.func}` for fused group {g.name} (generated; do not edit)",
            "",
            f"  C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]   (MatMul {h.node})",
            f"  batch b < NB = {self.NB} (flattened [{', '.join(map(str, self.hshape[:-2]))}]), "
            f"M = {self.M}, N = {self.N}, K = {self.K}: int64_t arguments",
            f"prologue A: {', '.join(f'{o.op_type} ({o.node})' for o in self.pro_of(0)) or '-'}; "
            f"packed with the inner loop along {self.a_inner}",
            f"prologue B: {', '.join(f'{o.op_type} ({o.node})' for o in self.pro_of(1)) or '-'}; "
            f"packed with the inner loop along {self.b_inner}",
            f"epilogue:   {', '.join(f'{o.op_type} ({o.node})' for o in self.epi) or '-'} (acc = C[b, m, n])",
        ]
        if views:
            lines.append(f"views (index maps): {', '.join(v.op.describe() for v in views)}")
        for role, name, info in self.arg_roles:
            if role == "input":
                lines.append(f"input  {gen.in_c[name]} = {name}: {info}")
            elif role == "output":
                lines.append(f"output {self.out_c[name]} = {name}: {info} "
                             f"[{', '.join(map(str, self.out_shapes[name]))}], element (b*M + m)*N + n")
        lines.append(f"shape symbols: {', '.join(s.name for s in self.syms) or '-'}")
        lines += [
            f"ISA: {self.isa}; tiles: {cfg.describe()}",
            f"  (TSCompiler 5.1: one OpenMP task per <T_Mb, T_Nb> = <{cfg.mc}, {cfg.nc}> block of one batch entry,",
            f"   K in steps of T_Kb = {cfg.kc}; <T_Mi, T_Ni> = <{cfg.mr}, {cfg.nr}> accumulators in registers)",
            "padding: local padding (DietCode 4.1): packed A rows past M and B columns past N are zero;",
            "  only the packing loads and the final stores are guarded; the FMA loop never tests bounds.",
            "locals of the macro-kernel are prefixed ts_ so they never clash with shape symbols.",
        ]
        return "/*\n" + "\n".join((" * " + ln.replace("*/", "* /")).rstrip() for ln in lines) + "\n */"

    # ------------------------------------------------------------------ build / pickling
    def _build(self) -> None:
        path = build_library(self.source, self.func)
        lib = _LIBS.get(str(path))
        if lib is None:
            lib = _LIBS[str(path)] = load_library(path)
        self._bind_function(lib)

    def _bind_function(self, lib: ctypes.CDLL) -> None:
        fn = getattr(lib, self.func)
        fn.restype = None
        argtypes = []
        for role, _, _ in self.arg_roles:
            if role == "symbol":
                continue
            argtypes.append(ctypes.c_void_p)
        argtypes += [ctypes.c_int64] * (4 + len(self.syms))
        fn.argtypes = argtypes
        self.fn = fn

    # ------------------------------------------------------------------ run
    def _evaluate(self, binding: Mapping[str, int]):
        key = binding_key(binding)
        got = self._sizes.get(key)
        if got is not None:
            return got
        symtab = self.symtab
        b = dict(binding)
        ev = lambda x: int(symtab.evaluate(x, b))   # noqa: E731
        NB, M, N, K = ev(self.NB), ev(self.M), ev(self.N), ev(self.K)
        outs = {name: tuple(ev(d) for d in shape) for name, shape in self.out_shapes.items()}
        ins = {name: tuple(ev(d) for d in shape) for name, shape in self._input_shapes().items()}
        syms = tuple(ev(s) for s in self.syms)
        cfg = self.cfg
        tasks = NB * -(-M // cfg.mc) * -(-N // cfg.nc)
        got = self._sizes[key] = (NB, M, N, K, outs, ins, syms, tasks)
        return got

    def _input_shapes(self) -> dict:
        """Symbolic shape of each input argument (found once: the expression walk is not per call)."""
        shapes = self.__dict__.get("_in_shapes")
        if shapes is None:
            found = {x.name: x.shape for x in walk(self.group.outputs.values()) if isinstance(x, Input)}
            shapes = self._in_shapes = {name: found.get(name, self.plan.graph.values[name].shape if name in
                                                        self.plan.graph.values else ())
                                        for role, name, _ in self.arg_roles if role == "input"}
        return shapes

    def tasks(self, binding: Mapping[str, int]) -> int:
        """Parallel tile tasks the kernel runs at ``binding`` (the wave model's block count); only
        the three extents it needs are evaluated (the runtime asks every variant at a new shape)."""
        symtab, b = self.symtab, dict(binding)
        NB, M, N = (int(symtab.evaluate(x, b)) for x in (self.NB, self.M, self.N))
        return NB * -(-M // self.cfg.mc) * -(-N // self.cfg.nc)

    def native_call(self) -> NativeCall:
        """Operands and outputs by name, then NB, M, N, K and the epilogue's shape symbols."""
        tensors = [NativeArg("tensor", name, dtype=np.dtype(dt).name) for role, name, dt in self.arg_roles
                   if role != "symbol"]
        ints = [NativeArg("int", expr=e) for e in (self.NB, self.M, self.N, self.K, *self.syms)]
        return NativeCall(self.func, (*tensors, *ints), guard=self.NB * self.M * self.N)

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]:
        NB, M, N, K, outs, ins, syms, _ = self._evaluate(binding)
        if self.fn is None:
            self._build()
        outputs = {name: np.empty(shape, dt) for (role, name, dt) in self.arg_roles if role == "output"
                   for shape in (outs[name],)}
        keep, args = [], []
        for role, name, dt in self.arg_roles:
            if role == "input":
                arr = np.asarray(env[name])
                if arr.dtype != dt:
                    raise ExecutionError(f"group {self.group.name}: input {name!r} is {arr.dtype}, expected {dt}")
                if arr.shape != ins[name]:
                    raise ExecutionError(f"group {self.group.name}: input {name!r} has shape {arr.shape}, "
                                         f"expected {ins[name]}")
                arr = np.ascontiguousarray(arr)
                keep.append(arr)
                args.append(arr.ctypes.data)
            elif role == "output":
                args.append(outputs[name].ctypes.data)
        if NB > 0 and M > 0 and N > 0:
            self.fn(*args, NB, M, N, K, *syms)
        return outputs

    __call__ = run


def build_batched_gemm_group(analysis: BatchedGemmAnalysis, cfg: TileConfig, isa: str) -> CompiledBatchedGemmGroup:
    """The build step: source → shared library (cached by content) → bound executor."""
    if ISA_RANK.get(isa, 99) > ISA_RANK[host_isa()]:
        raise UnsupportedOperatorError(f"group {analysis.group.name}: ISA {isa} requested but this host only "
                                       f"supports {host_isa()}")
    kernel = CompiledBatchedGemmGroup(analysis, cfg, isa)
    kernel._build()
    return kernel


def compile_batched_gemm_group(plan: Plan, group: Group, cfg: TileConfig | None = None, *,
                               isa: str | None = None) -> CompiledBatchedGemmGroup:
    """Analysis, source and build in one call (the heuristic's first configuration if no ``cfg``)."""
    isa = isa or host_isa()
    analysis = BatchedGemmAnalysis(plan, group)
    return build_batched_gemm_group(analysis, cfg or default_config(isa, *analysis.hints), isa)


# ============================================================================ micro-kernel
def _emit_micro_kernel(emit, cfg: TileConfig, isa: str) -> None:
    MR, NR = cfg.mr, cfg.nr
    emit(f"""/* Micro-kernel: an MR x NR = {MR} x {NR} tile of accumulators over kl steps of k.
 *   ap: packed A rows (row r at ap + r*lda, k contiguous); bp: packed B panel (k-major, NR per k);
 *   ct: partial sums of this tile (MR*NR floats) read unless first; the result goes to tile when
 *   last, else back to ct. No bounds tests: padded rows/columns are zero (local padding). */
static inline __attribute__((always_inline)) void ts_micro_kernel(
    int64_t kl, const float* restrict ap, int64_t lda, const float* restrict bp, float* ct,
    int first, int last, float* tile)
{{""")
    if isa == "scalar":
        emit("""    float acc_t[TS_MR][TS_NR];
    for (int r = 0; r < TS_MR; ++r)
        for (int c = 0; c < TS_NR; ++c)
            acc_t[r][c] = first ? 0.0f : ct[r * TS_NR + c];
    for (int64_t k = 0; k < kl; ++k)
        for (int r = 0; r < TS_MR; ++r) {
            const float x = ap[r * lda + k];
            for (int c = 0; c < TS_NR; ++c)
                acc_t[r][c] = fmaf(x, bp[k * TS_NR + c], acc_t[r][c]);
        }
    float* dst = last ? tile : ct;
    for (int r = 0; r < TS_MR; ++r)
        for (int c = 0; c < TS_NR; ++c)
            dst[r * TS_NR + c] = acc_t[r][c];
}
""")
        return
    v = _Vec(isa)
    W = v.width
    nvec = NR // W
    accs = emit_accumulators(emit, v, MR, NR)
    for r in range(MR):
        emit(f"    const float* restrict a{r} = ap + {r} * lda;")
    emit("    for (int64_t k = 0; k < kl; ++k) {  /* FMA loop: no bounds tests (local padding) */")
    emit("        const float* restrict bk = bp + k * TS_NR;")
    emit_fma_step(emit, v, accs, [f"bk + {c * W}" for c in range(nvec)], lambda r: f"a{r}[k]")
    emit("    }")
    emit("    float* dst = last ? tile : ct;")
    for r, row in enumerate(accs):
        emit("    " + " ".join(v.store(f"dst + {r * NR + c * W}", a) for c, a in enumerate(row)))
    emit("}\n")


__all__ = ["BATCHED_TILES", "BatchedGemmAnalysis", "CompiledBatchedGemmGroup", "build_batched_gemm_group",
           "candidate_configs", "compile_batched_gemm_group", "default_config"]
