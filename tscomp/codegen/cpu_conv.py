"""Convolution groups compiled to CPU macro-kernels: Conv as an implicit GEMM (TSCompiler §4.2 treats
Conv as a backbone; Fig. 7/8 fuse pad + conv + bias + ReLU into one kernel).

What is accepted. A "gemm" group whose backbone is an ONNX ``Conv`` (1-D or 2-D, NCHW as exported;
strides, dilations, explicit pads — asymmetric included — or ``auto_pad`` SAME/VALID, ``group`` any
divisor of the channels) with a constant weight (read directly, through views, or folded into a
Const), an input tensor read directly or through views, symbolic batch and spatial sizes, and an
epilogue of elementwise ops fused after it (the Conv's own bias, ``BatchNormalization`` as a
per-channel affine, Relu/GELU and any op with a registry C template, a residual Add, masks).

Two strategies (two families of :mod:`tscomp.codegen.families`):

* **implicit GEMM** (:class:`ConvAnalysis`, family ``conv``). Per image n and channel group g the
  convolution is ``Y_g[OCg, P] = W_g[OCg, K] · col[K, P]`` with ``K = Cg·KH·KW`` (static) and
  ``P = OH·OW`` (dynamic). The weight is the A operand, prepacked at compile time into ``mr``-row
  panels (k-major; rows past OCg zero: DietCode §4.1 local padding), so the output tile is
  ``[oc, p]`` and NCHW stores are contiguous along p. The im2col matrix is never materialized:
  each task gathers the ``kc × nc`` slice of ``col`` it needs straight from the NCHW input into a
  per-thread block (``pack_b``: per k = (c, kh, kw), the covered output rows are copied as row
  segments — a contiguous copy at stride 1 — with the out-of-image taps and the columns past P
  zero-filled, so the FMA loop has no bounds tests; 1x1/stride-1/unpadded convs copy whole
  channel rows). Where the taps overlap (a kernel wider than its stride along an axis: every input
  element is gathered several times), a task first lays the input rows its positions read out as
  zero-padded *phase planes* in a per-thread buffer, as the depthwise kernel does, so every row
  segment of the gather is a plain copy with no bounds or stride arithmetic (a 7x7 stride-2 stem's
  kernel 0.90x the time, a 3x3 stride-1 0.89x, same tiles). Tiles are TSCompiler §5.1's: block
  ⟨T_Mb = mc output channels, T_Nb = nc positions, T_Kb = kc⟩; one OpenMP task covers (n, g, a position block) and a run of channel
  blocks that all consume each gathered column block (the whole OCg, cut into balanced runs only
  when there are fewer other tasks than threads, or when a few position blocks' register tiles do
  not divide among the threads and each run keeps :data:`MIN_RUN_CHANNELS`; a few position blocks
  are cut into a multiple of the thread count; the blocks share the position tiles evenly,
  :func:`position_block_tiles`); register tile ⟨T_Mi, T_Ni⟩ = ``mr × nr`` accumulators (AVX-512 / AVX2 FMA
  intrinsics by the target's ISA, portable C for ``scalar``), partial sums between K steps in a
  per-thread buffer. Outputs go straight into the runtime's arena views (``takes_out``).
  The SIMD lanes run along the positions (``TileConfig.vector_axis`` 1: ``nr`` a whole number of
  vectors, each weight broadcast) or, for the few positions of a late stage of a small image,
  along the channels (``vector_axis`` 0: ``mr`` whole vectors loaded from the same weight panels,
  each gathered position broadcast, the weights prefetched ahead; the finished tile is transposed
  into the [channel, position] tile the epilogue reads). Both are points of one search space
  (:mod:`tscomp.schedule.conv_space`); the runtime picks per shape. A unit-stride Conv with taps is
  also offered as *padded-plane* tiles (``TileConfig.planes``, :func:`plane_configs`, beside
  Winograd as a strategy): no gather at all -- per K step a task lays the step's channels out as
  zero-padded planes of its output rows' input rows (one per stride phase), the positions run
  along the padded width ``WQ = OW + KW - 1``, so every row k of the im2col matrix is one run of
  the planes at a constant offset the micro-kernel reads in place; each row's ``KW - 1`` padding
  columns are computed and dropped when the tile is stored (:data:`PLANES_C`).
* **direct depthwise** (:class:`DepthwiseAnalysis`, family ``conv-depthwise``): one input channel
  per group (``group = C``, channel multiplier allowed), where the GEMM would have K = KH·KW and
  one row. A task (image, block of channels, block of output rows sized for L1) copies each
  channel's input rows into SH x SW zero-padded *phase planes*, so that every tap at every stride
  and dilation reads unit-stride at a constant offset; a task's output positions are then one flat
  vectorized run (plane rows of whole vectors; the extra columns are computed and dropped), with
  the taps unrolled -- for kernels with more taps than vector registers (a 7x7), one pass per kernel
  column over blocks of 4 output rows, loading each input row once for all of them.

The fused epilogue (both strategies) is generated from the group's expression IR by the elementwise
generator of :mod:`tscomp.codegen.cpu_groups` (:class:`TileEpilogue`): per finished tile of
``[oc, p]`` values it computes every group output at (n, oc, p) — the Conv result (with its bias)
is ``ts_acc``, other inputs are loads indexed from (n, oc, p) through their index maps — and stores
each output once. Group outputs must be the Conv's output space ([N, OC, *spatial] or any view
with the same element order). Elementwise prologue ops fused before the Conv (an input
normalization) are generated the same way into one parallel pass that writes the Conv's input into
a scratch before the tiles start (one extra write and read of X; not fused into the gather).
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.build import build_library, get_num_threads, load_library
from tscomp.codegen.c_expr import (PRELUDE, c_literal, c_symbol_name, delinearize, landing_index, linearize,
                                   math_helpers)
from tscomp.codegen.cpu_conv_int8 import (AMX_INT8_K, PACK_QUADS_C, QUADS_TO_S8_C, amx_k_padded, conv_int8_x_offset,
                                          emit_int8_amx_micro_kernel, emit_int8_micro_kernel, prepack_conv_weight_int8,
                                          prepack_conv_weight_int8_amx)
from tscomp.codegen.cpu_gemm import INT8_K_QUAD, _Vec, emit_accumulators, emit_fma_step
from tscomp.codegen.cpu_groups import GroupGenerator, _Block
from tscomp.codegen.kernel import NativeArg, NativeCall, args_by_role
from tscomp.codegen.native import (PicklableKernel, backbone_op, binding_key, first_input_integer_range, gemm_parts,
                                   refusals_name_group, sha256_text, structural_signature)
from tscomp.codegen.tile_config import (BALANCE_TASKS_PER_THREAD, MAX_ACCUMULATORS, VECTOR_WIDTH, CacheSizes, TileConfig,
                                        TileConfigError, evened_count, host_caches)
from tscomp.codegen.workspace import WORKSPACE_C, thread_workspace_c
from tscomp.codegen.cpu_conv_winograd import DOMAIN, WinogradConfig, tile_grid, transformed_weight, winograd_source
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Const, Expr, Input, Op, View, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops.nn import Window
from tscomp.graph.symbols import numel, same
from tscomp.graph.views import apply_view

#: element types a Conv or pool kernel reads its inputs as (a quantized or float16 tensor its
#: prologue converts)
INPUT_C_TYPES = {np.float32: "float", np.int64: "int64_t", np.int32: "int32_t", np.bool_: "uint8_t",
                 np.uint8: "uint8_t", np.int8: "int8_t", np.uint16: "uint16_t", np.int16: "int16_t",
                 np.float16: "_Float16"}


def strip_views(e: Expr):
    """(source, views innermost first) of an expression read through views."""
    chain = []
    while isinstance(e, View):
        chain.append(e)
        e = e.src
    return e, list(reversed(chain))


def constant_of(plan: Plan, e: Expr, what: str, fail) -> tuple[np.ndarray, str]:
    """The value of a constant operand read directly, through static views, or folded into a Const,
    and the name of the graph constant it comes from."""
    src, chain = strip_views(e)
    const = None
    if isinstance(src, Input) and src.name in plan.graph.values:
        const = plan.graph.values[src.name].const
    elif isinstance(src, Const) and not src.symbolic:
        const = src.value
    if const is None:
        fail(f"{what} is not a constant (a convolution with a computed weight is not compiled)")

    def static(d) -> int:
        d = sympy.sympify(d)
        if not d.is_Integer:
            fail(f"{what} is viewed with the symbolic size {d}")
        return int(d)

    arr = np.asarray(const)
    for v in chain:
        arr = apply_view(arr, v.op, static)
    return np.ascontiguousarray(arr), getattr(src, "name", "")


def window_of(op: Op, kernel) -> Window:
    return Window.from_attrs(op.attrs, kernel)


@dataclass(frozen=True)
class Geometry2D:
    """The window of a 1-D or 2-D Conv/pool as a 2-D one (a 1-D op has H = 1, KH = 1)."""
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    rank: int              # spatial rank of the ONNX op (1 or 2)

    @staticmethod
    def of(win: Window) -> "Geometry2D":
        if win.rank == 1:
            return Geometry2D(1, win.kernel[0], 1, win.strides[0], 1, win.dilations[0], 1)
        return Geometry2D(win.kernel[0], win.kernel[1], win.strides[0], win.strides[1], win.dilations[0],
                          win.dilations[1], 2)

    def runtime(self, win: Window, spatial: tuple[int, ...]) -> tuple[int, ...]:
        """(H, W, OH, OW, pad_top, pad_left, pad_bottom, pad_right) at concrete input sizes: SAME pads
        resolved, ceil mode's output lengths (:meth:`Window.geometry`, the reference's own rule)."""
        geo = [win.geometry(i, int(s)) for i, s in enumerate(spatial)]
        if self.rank == 1:
            (b, e, _, o), = geo
            return 1, int(spatial[0]), 1, o, 0, b, 0, e
        (bt, et, _, oh), (bl, el, _, ow) = geo
        return int(spatial[0]), int(spatial[1]), oh, ow, bt, bl, et, el

    def runtime_expr(self, win: Window, spatial: tuple) -> tuple:
        """:meth:`runtime` as expressions of symbolic input sizes (for the native host program)."""
        geo = [win.geometry_expr(i, s) for i, s in enumerate(spatial)]
        if self.rank == 1:
            (b, e, _, o), = geo
            return 1, spatial[0], 1, o, 0, b, 0, e
        (bt, et, _, oh), (bl, el, _, ow) = geo
        return spatial[0], spatial[1], oh, ow, bt, bl, et, el


#: compile-time constants of the generated kernels; spelled TS_<name> in the C so that no shape
#: symbol of the epilogue (a model dim called ``G`` or ``KH``) can collide with them
MACROS = ("C_IN", "CG", "OCG", "G", "OC", "KH", "KW", "SH", "SW", "DH", "DW", "KDIM", "MR", "NR", "MC", "NC", "KC",
          "N_KBLOCKS", "N_OCP", "L1_FLOATS", "BALANCE_TASKS_PER_THREAD", "COLUMN_VECTORS", "LANES", "TILES", "V_FLOATS",
          "XLO", "KQALL", "KPAD", "AMX_K", "MIN_RUN_CHANNELS")
_MACRO_RE = re.compile(r"\b(" + "|".join(MACROS) + r")\b")


#: a second per-thread buffer (:mod:`tscomp.codegen.workspace`), for the phase planes a Conv task
#: gathers from (beside its packed block, which is in the shared one)
PHASE_WORKSPACE_C = thread_workspace_c("tscomp_phase_workspace")


def phase_planes_pay(geo) -> bool:
    """Whether the gather reads the input from phase planes (:func:`_emit_pack_b`): where the taps
    overlap (a kernel wider than its stride along either axis), so every input element is gathered
    more than once and one pass that pads and de-interleaves the input turns each of those gathers
    into a plain copy. A 1x1 stride-2 Conv reads a quarter of its input once: it gathers in place."""
    return geo.kw * geo.dw > geo.sw or geo.kh * geo.dh > geo.sh


def c_defines(**values) -> str:
    return "".join(f"#define TS_{k} {v}\n" for k, v in values.items())


def ts_macros(text: str) -> str:
    """A C template with its compile-time constants spelled TS_<name> (see :data:`MACROS`)."""
    return _MACRO_RE.sub(r"TS_\1", text)


# ============================================================================ the fused epilogue
class TileEpilogue(GroupGenerator):
    """The elementwise generator over one finished tile of a channel-major backbone result:
    rows are output channels ``ts_c`` (``ts_ch0 + ts_er``), columns flat output positions ``ts_p``
    (``ts_p0 + ts_ec``) of image ``ts_n``; the backbone's value there is ``ts_acc`` (+ the Conv
    bias). Every name it defines starts with ``ts_`` (no shape symbol can take such a name).

    :meth:`generate_function` returns the C of ``static inline void <name>(const float* ts_tile,
    int64_t ts_ldt, int64_t ts_n, int64_t ts_ch0, int64_t ts_p0, int64_t ts_mv, int64_t ts_nv, <args>)`` and the
    argument list (outputs, inputs, shape symbols) it needs."""

    def __init__(self, plan: Plan, group: Group, heavy: Op, out_shape: tuple, bias: Expr | None = None,
                 blocked_inputs: Mapping[str, int] | None = None):
        super().__init__(plan, group)
        #: epilogue operands stored channel-blocked (name -> lanes): a residual another Conv wrote blocked
        self.blocked_inputs = dict(blocked_inputs or {})
        self.lanes = 0
        self.heavy = heavy
        self.hshape = self.shape(out_shape)
        self.N, self.C = self.hshape[0], self.hshape[1]
        self.spatial = self.hshape[2:]
        self.P = numel(self.spatial)
        self.bias = bias
        self.n = self.ctx.var("ts_n", self.N)
        self.ch = self.ctx.var("ts_c", self.C)
        self.p = self.ctx.var("ts_p", self.P)
        self.pos = delinearize(self.p, self.spatial, self.ctx)
        self.flat = self.ctx.simplify(linearize((self.n, self.ch) + tuple(self.pos), self.hshape))
        self.probe: list | None = None
        #: loads of channel-blocked operands emitted (the in-place form declines them: strided there)
        self.blocked_reads = 0

    # ------------------------------------------------------------------ the backbone's value
    def heavy_value(self, e: Op, idx) -> str:
        if e is not self.heavy and not (isinstance(e, Op) and e.node == self.heavy.node):
            self.fail(f"a second heavy op ({e.op_type}) read by the epilogue", e)
        if self.probe is not None:          # probing where an output reads the backbone
            self.probe.append(tuple(self.ctx.simplify(i) for i in idx))
            return "ts_acc"
        off = self.ctx.simplify(linearize(tuple(idx), self.hshape))
        if not self._same_element(off, self.flat):
            self.fail(f"the epilogue reads the {e.op_type} result at offset {off}, not at the element it "
                      f"computes ({self.flat})", e)
        if self.bias is None:
            return "ts_acc"
        b = self.value(self.bias, (self.ch,))
        return self.define("float", f"ts_acc + {b}", deps=["ts_acc", b], note=f"{e.op_type} bias")

    def _value(self, e: Expr, idx) -> str:
        if isinstance(e, Op) and e.op_type == "BatchNormalization" and not e.heavy:
            return self.batch_norm(e, idx)
        if isinstance(e, Input) and e.name in self.blocked_inputs:
            return self.blocked_load(e, idx)
        return super()._value(e, idx)

    def blocked_load(self, e: Input, idx) -> str:
        """An operand stored channel-blocked, element (n, c, *spatial) at ``((n * C/L + c / L) * P +
        p) * L + c % L``. Read at the very element the tile computes in the blocked form, that is
        the tile's own lane (``ts_cb``, ``ts_l0 + ts_el``): a unit-stride load along the lanes;
        anywhere else, the division and remainder spelled out."""
        L = self.blocked_inputs[e.name]
        self.blocked_reads += 1
        shape = self.shape(e)
        C, P = shape[1], numel(shape[2:])
        n, c, pos = idx[0], idx[1], tuple(idx[2:])
        p = self.ctx.simplify(linearize(pos, shape[2:]))
        if self.lanes == L and same(c, self.ch) and same(p, self.ctx.simplify(self.p)) and \
                all(same(a, b) for a, b in zip(shape, self.hshape)):
            off = f"(({self.c(n)} * {int(C) // L} + ts_cb) * ({self.c(P)}) + ts_p) * {L} + ts_l0 + ts_el"
            return self.define(self.ctype(e.dtype, e), f"{self.in_c[e.name]}[{off}]", index=[n, c, p], stem="x",
                               note="channel-blocked operand")
        off = self.ctx.simplify(((n * (C // L) + sympy.floor(c / L)) * P + p) * L + sympy.Mod(c, L))
        return self.define(self.ctype(e.dtype, e), f"{self.in_c[e.name]}[{self.c(off)}]", index=[off], stem="x",
                           note="channel-blocked operand")

    def batch_norm(self, e: Op, idx) -> str:
        """Inference BatchNormalization as a per-channel affine: (x - mean)·(scale/√(var+ε)) + B;
        the factor depends on the channel only, so it is computed once per tile row."""
        if len(idx) < 2:
            self.fail("BatchNormalization of rank < 2", e)
        x = self.value(e.args[0], idx)
        c = (idx[1],)
        scale, bias, mean, var = (self.value(a, c) for a in e.args[1:5])
        eps = float(e.attrs.get("epsilon", 1e-5))
        factor = self.define("float", f"{scale} / sqrtf({var} + {c_literal(eps, np.float32)})", deps=[scale, var],
                             note="BatchNormalization scale/sqrt(var+eps)")
        return self.define("float", f"({x} - {mean}) * {factor} + {bias}", deps=[x, mean, factor, bias],
                           note="BatchNormalization")

    # ------------------------------------------------------------------ outputs in another layout
    def _probe_reads(self, e: Expr, idx) -> set | None:
        """The backbone indices output expression ``e`` reads at ``idx`` (a throwaway generator;
        None when it cannot be generated at all)."""
        probe = TileEpilogue(self.plan, self.group, self.heavy, self.hshape, self.bias, self.blocked_inputs)
        probe.probe = []
        try:
            probe.value(e, idx)
        except UnsupportedOperatorError:
            return None
        return set(probe.probe)

    def _reads_backbone_at(self, e: Expr, idx, flat) -> bool:
        reads = self._probe_reads(e, idx)
        return reads is not None and all(
            self._same_element(self.ctx.simplify(linearize(r, self.hshape)), flat) for r in reads)

    def _same_element(self, a, b) -> bool:
        """Whether two flat offsets name the same element of the backbone's result, an axis of
        extent 1 counted as 0 (a 1-channel depth head whose output drops the channel axis reads
        the Conv at n*P + p, which is (n*1 + c)*P + p at c = 0)."""
        fixed = {v: sympy.Integer(0) for v, extent in ((self.ch, self.C), (self.n, self.N))
                 if same(extent, 1)}
        return same(self.ctx.collapse(a.xreplace(fixed)), self.ctx.collapse(b.xreplace(fixed)))

    def _landing(self, oname: str, e: Expr, oshape) -> tuple:
        """Where the backbone's element (n, c, p) lands in output ``oname``, a permutation of its
        space: SegFormer's Mix-FFN flattens and transposes the depthwise Conv's NCHW result to
        [N, H*W, C] before its GELU. Solved from the backbone index each output element reads
        (:func:`landing_index`); :meth:`heavy_value` then checks that the output read there reads
        exactly (n, c, p)."""
        ovars = tuple(self.ctx.var(f"ts_o{a}", d) if d != 1 else sympy.Integer(0) for a, d in enumerate(oshape))
        reads = self._probe_reads(e, ovars)
        if not reads or len(reads) != 1:
            self.fail(f"output {oname} reads the {self.heavy.op_type} result at "
                      f"{len(reads) if reads else 'no'} elements per output element")
        (read,) = reads
        # in [N, C, P] coordinates: the spatial axes of the read joined into one flat position
        flat_pos = self.ctx.collapse(self.ctx.simplify(linearize(read[2:], self.spatial)))
        return landing_index(read[:2] + (flat_pos,), (self.n, self.ch, self.p), ovars, dict(zip(ovars, oshape)), self.ctx,
                             lambda why: self.fail(f"output {oname}: {self.heavy.op_type} {why}"))

    # ------------------------------------------------------------------ the function
    def generate_function(self, name: str, outputs: Mapping[str, Expr],
                          lanes: int = 0) -> tuple[str, list[tuple], str]:
        """(C text, [(role, name, C parameter, dtype/symbol)], file-scope statics); ``scattered``
        then says whether an output is stored in another layout than [N, OC, positions].

        ``lanes`` > 0: the *channel-blocked* form (:mod:`tscomp.codegen.channel_blocking`). The tile
        is position-major (``ts_tile[p * ts_ldt + l]``, a run of ``ts_mv`` channels of one block of
        ``lanes``, from lane ``ts_l0`` of block ``ts_cb`` on), the lanes are the simd loop, and the
        one output -- the backbone's own [N, OC, *spatial] -- is stored channel-blocked,
        ``((n * OC/lanes + c / lanes) * P + p) * lanes + c % lanes``: whole vectors, no transpose."""
        self.scattered = False
        if lanes:
            return self._generate_blocked(name, outputs, lanes)
        cols = self._channel_major_loops()
        self.emit("const float ts_acc = ts_tile[ts_er * ts_ldt + ts_ec];")
        self.where["ts_acc"] = cols
        for oname, e in outputs.items():
            oshape = self.shape(e)
            if not same(numel(oshape), numel(self.hshape)):
                self.fail(f"output {oname} of shape {list(oshape)} is not in the {self.heavy.op_type}'s output "
                          f"space {list(self.hshape)}")
            off = self.flat
            if len(oshape) == len(self.hshape) and all(same(a, b) for a, b in zip(oshape, self.hshape)):
                oidx = (self.n, self.ch) + tuple(self.pos)
            else:
                oidx = delinearize(self.flat, oshape, self.ctx)
                if not self._reads_backbone_at(e, oidx, self.flat):
                    oidx = self._landing(oname, e, oshape)
                    off = self.ctx.simplify(linearize(oidx, oshape))
            v = self.value(e, oidx)
            self.scattered |= off is not self.flat
            note = "" if off is self.flat else "  /* scattered: the output is a permutation of the backbone's */"
            self.emit(f"{self.out_c[oname]}[{self.c(off)}] = {v};{note}")
        self.pop()
        self.pop()
        return self._function_text(name, outputs, "int64_t ts_ch0")

    def _channel_major_loops(self) -> _Block:
        """Open the loops over a channel-major tile: its rows, output channels ``ts_c``, then the
        simd loop over its columns, positions ``ts_p`` (returned)."""
        rows = _Block([("for (int64_t ts_er = 0; ts_er < ts_mv; ++ts_er) {", 0)], [("}", 0)])
        self.push(rows, [self.ch])
        self.emit("const int64_t ts_c = ts_ch0 + ts_er;")
        cols = _Block([("#pragma omp simd", 0), ("for (int64_t ts_ec = 0; ts_ec < ts_nv; ++ts_ec) {", 0)], [("}", 0)])
        self.push(cols, [self.p])
        self.emit("const int64_t ts_p = ts_p0 + ts_ec;")
        return cols

    def _own_output(self, outputs: Mapping[str, Expr]) -> tuple[str, Expr]:
        """The one output a channel-blocked store writes: the Conv's own [N, OC, *spatial]."""
        if len(outputs) != 1:
            self.fail("a channel-blocked Conv output must be the group's only output")
        (oname, e), = outputs.items()
        if not all(same(a, b) for a, b in zip(self.shape(e), self.hshape)) or len(self.shape(e)) != len(self.hshape):
            self.fail(f"output {oname} is not the Conv's own output space: it cannot be stored channel-blocked")
        return oname, e

    def _generate_blocked(self, name: str, outputs: Mapping[str, Expr], lanes: int) -> tuple[str, list[tuple], str]:
        """The channel-blocked form of :meth:`generate_function`."""
        self.lanes = lanes
        oname, e = self._own_output(outputs)
        if not (self.C.is_Integer and int(self.C) % lanes == 0):
            self.fail(f"{self.C} output channels are not whole blocks of {lanes}")
        self.emit("const int64_t ts_ch0 = ts_cb * " + str(lanes) + " + ts_l0;")
        cols = _Block([("for (int64_t ts_ec = 0; ts_ec < ts_nv; ++ts_ec) {", 0)], [("}", 0)])
        self.push(cols, [self.p])
        self.emit("const int64_t ts_p = ts_p0 + ts_ec;")
        block = f"(ts_n * {int(self.C) // lanes} + ts_cb) * ({self.c(self.P)})"
        self.emit(f"float* restrict ts_o = {self.out_c[oname]} + (({block} + ts_p) * {lanes} + ts_l0);")
        lane = _Block([("#pragma omp simd", 0), ("for (int64_t ts_el = 0; ts_el < ts_mv; ++ts_el) {", 0)], [("}", 0)])
        self.push(lane, [self.ch])
        self.emit("const int64_t ts_c = ts_ch0 + ts_el;")
        self.emit("const float ts_acc = ts_tile[ts_ec * ts_ldt + ts_el];")
        self.where["ts_acc"] = lane
        v = self.value(e, (self.n, self.ch) + tuple(self.pos))
        self.emit(f"ts_o[ts_el] = {v};  /* channel-blocked: lane c % {lanes} of block c / {lanes} */")
        self.pop()
        self.pop()
        return self._function_text(name, outputs, "int64_t ts_cb, int64_t ts_l0")

    def generate_blocked_in_place(self, name: str, outputs: Mapping[str, Expr],
                                  lanes: int) -> tuple[str, list[tuple], str] | None:
        """The channel-blocked store from a *channel-major* tile (a column-vector register tile,
        ``ts_tile[c * ts_ldt + p]``, channels ``ts_ch0 ..``): the fused math in place on the tile, the
        positions the simd loop (whole vectors whatever the tile's channel count: the blocked form
        runs a column tile's 8 channels per position, half an AVX-512 vector, and its SiLU cost
        twice what it does here), then each run of channels within one block transposed straight
        into the output. None when the epilogue reads a channel-blocked operand: along the
        positions of one channel that is a stride-``lanes`` gather, where the blocked form loads
        whole vectors."""
        self.lanes = 0
        oname, e = self._own_output(outputs)
        cols = self._channel_major_loops()
        self.emit("float* restrict ts_a = ts_tile + ts_er * ts_ldt + ts_ec;")
        self.emit("const float ts_acc = *ts_a;")
        self.where["ts_acc"] = cols
        v = self.value(e, (self.n, self.ch) + tuple(self.pos))
        self.emit(f"*ts_a = {v};  /* in place: stored channel-blocked below */")
        self.pop()
        self.pop()
        if self.blocked_reads:
            return None
        block = f"ts_n * {int(self.C) // lanes} + ts_c / {lanes}"
        store = f"""for (int64_t ts_er = 0; ts_er < ts_mv; ) {{   /* runs of channels within one block of {lanes} */
    const int64_t ts_c = ts_ch0 + ts_er, ts_l = ts_c % {lanes};
    const int64_t ts_w = {lanes} - ts_l < ts_mv - ts_er ? {lanes} - ts_l : ts_mv - ts_er;
    ts_transpose_matrix(ts_tile + ts_er * ts_ldt, ts_ldt, ts_w, ts_nv,
                        {self.out_c[oname]} + ((({block}) * ({self.c(self.P)}) + ts_p0) * {lanes} + ts_l), {lanes});
    ts_er += ts_w;
}}"""
        for line in store.splitlines():
            self.emit(line)
        return self._function_text(name, outputs, "int64_t ts_ch0", tile="float* restrict")

    def _function_text(self, name: str, outputs: Mapping[str, Expr], channel_params: str,
                       tile: str = "const float* restrict") -> tuple[str, list[tuple], str]:
        if self.index_checks:
            self.fail("a data-dependent index (Gather) in a convolution epilogue is not supported")
        if self.scratch:
            self.fail("a row op that needs a row buffer in a convolution epilogue")
        body = "\n".join(["    " + d for d in self.decls] + self.root.render(1))
        args: list[tuple] = []
        for oname in outputs:
            args.append(("output", oname, self.out_c[oname], np.dtype(np.float32)))
        for iname, cname in self.in_c.items():
            if re.search(rf"\b{cname}\[", body + "\n".join(self.statics)):
                dt = np.dtype(self._input_dtype(iname))
                if dt.type not in INPUT_C_TYPES:
                    self.fail(f"epilogue input {iname} of type {dt}")
                args.append(("input", iname, cname, dt))
        syms = sorted((s for s in self.pr.used if s not in self.ctx.upper_bounds), key=lambda s: s.name)
        for s in syms:
            args.append(("symbol", s.name, c_symbol_name(s.name), s))
        params = "".join(f", {param_of(a)}" for a in args)
        text = (f"static inline __attribute__((always_inline)) void {name}({tile} ts_tile, "
                f"int64_t ts_ldt, int64_t ts_n, {channel_params}, int64_t ts_p0, int64_t ts_mv, int64_t ts_nv{params})\n"
                f"{{\n{body}\n}}\n")
        return text, args, "\n".join(self.statics)

    def _input_dtype(self, name):
        for e in (x for x in walk(self.group.outputs.values()) if isinstance(x, Input) and x.name == name):
            return e.dtype
        return self.plan.graph.values[name].dtype


def param_of(arg: tuple) -> str:
    role, _, cname, info = arg
    if role == "output":
        return f"float* restrict {cname}"
    if role == "input":
        return f"const {INPUT_C_TYPES[np.dtype(info).type]}* restrict {cname}"
    return f"int64_t {cname}"


# ============================================================================ analysis
class _ConvBase:
    """What both Conv strategies read from a group: the Conv, its input (through views), the
    constant weight, the window, the channel groups, the fused epilogue."""

    family = "conv"
    #: the ONNX op the group's backbone must be
    HEAVY_OP = "Conv"

    def __init__(self, plan: Plan, group: Group):
        self.plan, self.group = plan, group
        self.symtab = plan.graph.symbols
        with refusals_name_group(group.name):
            self._analyze()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("plan", "W")}

    def _fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {why}")

    def _analyze(self) -> None:
        g = self.group
        pro, heavy, epi = gemm_parts(g)
        h = backbone_op(heavy)
        if h.op_type != self.HEAVY_OP:
            self._fail(f"backbone {h.op_type} is not a {self.HEAVY_OP}")
        if any(o.node != h.node for o in heavy):
            self._fail(f"a second heavy op in the Conv group ({', '.join(sorted({o.op_type for o in heavy}))})")
        self.heavy = h
        self.prologue = [o.op_type for o in pro]
        x, w = h.args[0], h.args[1]
        for t, what in ((x, "input X"), (h, "output")):
            if np.dtype(t.dtype) != np.float32:
                self._fail(f"Conv {h.node!r}: {what} is {np.dtype(t.dtype)}, only float32 convolutions")
        xsrc, self.x_chain = strip_views(x)
        if pro:          # X computed by the fused prologue into a scratch, one pass before the tiles
            self.x_input, self.x_chain = None, []
        elif not isinstance(xsrc, Input):
            self._fail(f"Conv {h.node!r}: input X is computed in the group")
        else:
            self.x_input = xsrc.name
        self.x_shape = tuple(self.symtab.canon(d) for d in x.shape)
        if len(self.x_shape) not in (3, 4):
            self._fail(f"Conv {h.node!r}: input of rank {len(self.x_shape)} (only 1-D and 2-D convolutions; "
                       f"a 3-D one is compiled as 2-D when the graph stage can rewrite it: a constant weight, "
                       f"explicit or VALID padding, or SAME with a temporal stride of 1)")
        W, self.weight_name = constant_of(self.plan, w, f"Conv {h.node!r}: weight", self._fail)
        if W.dtype != np.float32:
            self._fail(f"Conv {h.node!r}: weight is {W.dtype}, only float32")
        self.W = W
        if W.ndim != len(self.x_shape):
            self._fail(f"Conv {h.node!r}: weight of rank {W.ndim} for an input of rank {len(self.x_shape)}")
        self.win = window_of(h, list(W.shape[2:]))
        self.geo = Geometry2D.of(self.win)
        self.G = int(h.attrs.get("group", 1))
        if not self.x_shape[1].is_Integer:
            self._fail(f"Conv {h.node!r}: symbolic channel count {self.x_shape[1]}")
        self.C = int(self.x_shape[1])
        self.OC = self._output_channels(W)
        self.Cg, self.OCg = self.C // self.G, self.OC // self.G
        if self.Cg * self.G != self.C or self.OCg * self.G != self.OC or not self._weight_matches(W):
            self._fail(f"{self.HEAVY_OP} {h.node!r}: weight {list(W.shape)} does not match C={self.C}, "
                       f"group={self.G}")
        self.bias = h.args[2] if len(h.args) > 2 and h.args[2] is not None else None
        self.out_shape = tuple(self.symtab.canon(d) for d in h.shape)
        self.out_shapes = {n: tuple(self.symtab.canon(d) for d in e.shape) for n, e in g.outputs.items()}
        for n, e in g.outputs.items():
            if np.dtype(e.dtype) != np.float32:
                self._fail(f"output {n} is {np.dtype(e.dtype)}, only float32 outputs")
        self._check_strategy()
        self._gen_epilogue()

    def _output_channels(self, W: np.ndarray) -> int:
        return int(W.shape[0])                      # Conv: W[OC, C / group, *kernel]

    def _weight_matches(self, W: np.ndarray) -> bool:
        return int(W.shape[1]) == self.Cg

    def _check_strategy(self) -> None:
        raise NotImplementedError

    #: lanes of the channel-blocked layout X is read in / the output is stored in (0: NCHW); set by
    #: :mod:`tscomp.codegen.channel_blocking` through :meth:`read_blocked` and :meth:`store_blocked`
    x_lanes = 0
    y_lanes = 0

    #: epilogue operands stored channel-blocked: ((name, lanes), ...)
    blocked_operands: tuple = ()

    def read_blocked(self, lanes: int) -> None:
        """X is stored channel-blocked in blocks of ``lanes`` channels (its producer writes it so)."""
        self.x_lanes = lanes

    def read_blocked_operand(self, name: str, lanes: int) -> None:
        """Epilogue operand ``name`` is stored channel-blocked (``lanes`` 0: NCHW again); the
        epilogue is regenerated."""
        self.blocked_operands = tuple((n, k) for n, k in self.blocked_operands if n != name) + \
            (((name, lanes),) if lanes else ())
        self._gen_epilogue()

    def store_blocked(self, lanes: int) -> None:
        """Store the output channel-blocked in blocks of ``lanes`` channels (the epilogue regenerated)."""
        self.y_lanes = lanes
        self._gen_epilogue()

    def layout_slug(self) -> str:
        """The function-name suffix of the blocked layouts ("" for NCHW in and out)."""
        return ((f"_xb{self.x_lanes}" if self.x_lanes else "") + (f"_yb{self.y_lanes}" if self.y_lanes else "")
                + ("_rb" if self.blocked_operands else ""))

    def _gen_epilogue(self) -> None:
        gen = TileEpilogue(self.plan, self.group, self.heavy, self.out_shape, self.bias, dict(self.blocked_operands))
        self.epilogue_c, epi_args, self.statics = gen.generate_function("conv_epilogue", self.group.outputs,
                                                                        lanes=self.y_lanes)
        self.scattered_store = gen.scattered
        self.epilogue_in_place_c = self._in_place_epilogue(epi_args)
        pro_args, self.prologue_c = [], ""
        if self.prologue:
            self.prologue_c, pro_args, statics = x_prologue_function(self.plan, self.group, self.heavy.args[0],
                                                                     self.x_shape, gen.counter)
            self.statics = "\n".join(t for t in (self.statics, statics) if t)
        # one argument list for both: the macro-kernel takes the union, each function its own part
        self.arg_roles = list(epi_args) + [a for a in pro_args if a[:2] not in {b[:2] for b in epi_args}]
        keys = [a[:2] for a in self.arg_roles]
        self.epi_args = [keys.index(a[:2]) for a in epi_args]
        self.pro_args = [keys.index(a[:2]) for a in pro_args]
        self.math = math_helpers(self.epilogue_c + self.epilogue_in_place_c + self.prologue_c + self.statics)
        _, _, epi = self.group.prologue_epilogue()
        self.fused = ["bias"] * (self.bias is not None) + [o.op_type for o in epi]

    def _in_place_epilogue(self, epi_args: list) -> str:
        """C of ``conv_epilogue_in_place`` (:meth:`TileEpilogue.generate_blocked_in_place`), the
        store of a column-vector tile into a channel-blocked output; "" where the output is NCHW or
        that form does not apply (it then goes through the blocked form, transposed first)."""
        if not self.y_lanes:
            return ""
        gen = TileEpilogue(self.plan, self.group, self.heavy, self.out_shape, self.bias, dict(self.blocked_operands))
        gen.const_stem = "kp"       # its constant arrays beside the blocked form's (k0, k1, ..)
        made = gen.generate_blocked_in_place("conv_epilogue_in_place", self.group.outputs, self.y_lanes)
        if made is None or made[1] != epi_args:     # the macro-kernel passes the blocked form's arguments
            return ""
        text, _, statics = made
        return (statics + "\n" if statics else "") + text

    # ------------------------------------------------------------------ what the schedule stage reads
    def signature(self) -> str:
        return sha256_text(f"{self.family} C={self.C} OC={self.OC} G={self.G} {self.win} "
                           f"{structural_signature(self.group)}")[:16]

    def extents(self) -> dict:
        return {"OCg": self.OCg, "K": self.Cg * self.geo.kh * self.geo.kw, "P": str(numel(self.out_shape[2:])),
                "G": self.G}

    def header(self, strategy: str, tiles: str) -> str:
        g, w = self.group, self.win
        lines = [f"tscomp fused Conv group {g.name} ({strategy})",
                 f"ONNX ops: {', '.join(f'{o.op_type} ({o.node})' for o in g.ops())}",
                 f"Conv {self.heavy.node}: X [{', '.join(map(str, self.x_shape))}] * W {list(self.W.shape)} -> "
                 f"[{', '.join(map(str, self.out_shape))}], group={self.G}, kernel={list(w.kernel)}, "
                 f"strides={list(w.strides)}, dilations={list(w.dilations)}, pads={list(w.pads)}, "
                 f"auto_pad={w.auto_pad}",
                 f"fused epilogue: {', '.join(self.fused) or 'store'}",
                 "fused prologue: " + (", ".join(self.prologue) + " (X computed into a scratch first)"
                                       if self.prologue else "-"),
                 f"tiles: {tiles}"]
        for role, name, cname, _ in self.arg_roles:
            if role != "symbol":
                lines.append(f"{role} {cname} = {name}")
        return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */\n"


class ConvAnalysis(_ConvBase):
    """The analysis step of the ``conv`` (implicit GEMM) family."""

    family = "conv"

    def _check_strategy(self) -> None:
        if self.Cg == 1 and self.G > 1:
            self._fail(f"depthwise Conv (group={self.G}, one input channel per group): the conv-depthwise "
                       f"family takes it")
        self.K = self.Cg * self.geo.kh * self.geo.kw
        w = self.win
        self.pointwise = (self.geo.kh == self.geo.kw == 1 and self.geo.sh == self.geo.sw == 1
                          and w.auto_pad in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
                          and (w.auto_pad != "NOTSET" or not any(w.pads)))
        self.phased = not self.pointwise and phase_planes_pay(self.geo)
        self.int8_x_offset = conv_int8_x_offset(first_input_integer_range(self.plan, self.heavy), self.W, self.K)

    def heuristic_configs(self, isa: str, limit: int | None = 4, caches: CacheSizes | None = None) -> list[TileConfig]:
        """The first ``limit`` hardware-aligned tiles (None: all of them)."""
        return conv_candidate_configs(isa, self.OCg, self.K, caches=caches)[:limit]


class DepthwiseAnalysis(_ConvBase):
    """The analysis step of the ``conv-depthwise`` (direct) family."""

    family = "conv-depthwise"

    def _check_strategy(self) -> None:
        if not (self.Cg == 1 and self.G > 1):
            self._fail(f"not a depthwise Conv (group={self.G}, {self.Cg} input channels per group)")


# ============================================================================ tile configurations
#: register tiles (rows = output channels, columns = output positions) per ISA, best first
CONV_TILES = {
    "avx512": [(8, 32), (6, 64), (4, 48), (12, 32), (14, 32)],
    "avx2": [(6, 16), (4, 24), (3, 32), (2, 32)],
    "scalar": [(4, 8), (2, 8)],
    # AMX int8 (TDPBUSD): whole 16x16 tiles, at most 4 accumulators (rows = channels, columns = positions)
    "amx": [(32, 32), (16, 64), (16, 32), (32, 16)],
}
#: a one-vector-wide register tile for few output positions (a 7x7 late stage: 49 positions pad to
#: 56 columns of 8, not 64 of 16), with more channel rows to keep enough FMA chains
NARROW_TILES = {"avx512": (14, 16), "avx2": (12, 8), "scalar": (4, 4), "amx": (32, 16)}
#: row-vector register tiles (channels in whole vectors x broadcast positions, ``vector_axis`` 0), best
#: first: where a late stage has a few positions (2x2 of a small image), a column tile computes
#: mostly padding and broadcasts every weight from memory; these pad only to NR positions and load
#: the weights as vectors (ResNet-50's 3x3 convs at 4 positions: ~16 GFLOP/s as 14x16 column tiles)
ROW_VECTOR_TILES = {"avx512": [(64, 4), (48, 8), (32, 12)], "avx2": [(24, 4), (16, 6)], "scalar": [], "amx": []}
#: k steps ahead a row-vector micro-kernel prefetches its weight panel into L1. Each weight is used
#: for only NR positions, so the weights stream from memory at a few FMAs per byte; ResNet-50's
#: 512-channel 3x3 conv at 2x2 and 7x7 positions, caches flushed before each call: 10-15% faster
#: at 16-64 steps ahead than without
ROW_VECTOR_PREFETCH_K = 32
#: output channels a run of channel blocks keeps when a column-vector Conv's few position blocks
#: are also cut by channel (every run gathers the column block again: its cost per FMA grows as
#: the run's channels shrink). ResNet-50's 1x1 1024->512 conv at 14x14 (7 position tiles), C
#: harness, 2 threads: 2 runs of 256 channels 946 -> 874 us; a 128-channel conv keeps one run
MIN_RUN_CHANNELS = 128


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _k_step(K: int, cap: int) -> int:
    """A K step of at most ``cap`` (rounded down to 8, at least 8): all of K if it fits, else K in
    balanced steps rounded up to 8."""
    cap = max(8, cap // 8 * 8)
    return min(K, K if K <= cap else _round_up(-(-K // -(-K // cap)), 8))


def _channel_block(OCg: int, mr: int) -> int:
    """Output channels per block: OCg in balanced blocks of at most ~96, whole register tiles."""
    return _round_up(-(-OCg // -(-OCg // 96)), mr)


def _conv_tile(mr: int, nr: int, OCg: int, K: int, caches: CacheSizes, narrow: bool,
               vector_axis: int = 1) -> TileConfig:
    if vector_axis == 0:
        return _row_vector_tile(mr, nr, OCg, K, caches)
    kc = _k_step(K, (caches.l1 // 2) // (4 * (nr + mr)))
    mc = _channel_block(OCg, mr)
    nc_cap = max(nr, (caches.l2 // 4) // (4 * kc) // nr * nr)
    nc = min(nc_cap, _round_up(64 if narrow else 256, nr))
    return TileConfig(mr=mr, nr=nr, mc=mc, nc=max(nr, nc), kc=kc, vector_axis=vector_axis)


def _row_vector_tile(mr: int, nr: int, OCg: int, K: int, caches: CacheSizes) -> TileConfig:
    """A row-vector tile's blocks: the weights stream through once per position block (nothing of
    them stays in L1), so only the ``kc × nr`` column panel must stay in L1 (half of it) and the
    gathered ``kc × nc`` block in a quarter of L2: deep K steps (few partial-sum round trips, long
    sequential weight runs); up to 4 register tiles of channels per block, and at least two blocks
    where OCg has two register tiles (a few positions give one position block: the channel blocks are
    the threads' work); 64 positions per block."""
    nc = _round_up(64, nr)
    kc = _k_step(K, min((caches.l1 // 2) // (4 * nr), (caches.l2 // 4) // (4 * nc)))
    mc = max(mr, min(4 * mr, _round_up(-(-OCg // 2), mr)))
    return TileConfig(mr=mr, nr=nr, mc=mc, nc=nc, kc=kc, vector_axis=0)


def conv_candidate_configs(isa: str, OCg: int, K: int, *, caches: CacheSizes | None = None) -> list[TileConfig]:
    """Hardware-aligned tiles for an implicit-GEMM Conv ``[OCg, K] · [K, P]`` (TSCompiler §5.1's
    hardware-aligned population), best first: register tiles from :data:`CONV_TILES`, those whose
    rows divide OCg first (no padded channel rows); ``kc`` so that a ``kc × nr`` column panel and an
    ``mr × kc`` weight panel fill half of L1; ``mc``: OCg cut into balanced blocks of at most ~96 channels (more tasks
    for the late stages' small P); ``nc`` positions so the gathered ``kc × nc`` block stays within a
    quarter of L2. Order (an untuned compile keeps the first few): the first tile and the widest
    other one (most position vectors: 6x64 on AVX-512, the tuner's most frequent pick on ResNet-50)
    with wide (256) position blocks for big images, the first row-vector tile
    (:data:`ROW_VECTOR_TILES`, where OCg fills its vectors) for a late stage's few positions, the
    first tile with narrow (64) position blocks (more tasks for small images), the one-vector
    :data:`NARROW_TILES` tile, then the other tiles, the other row-vector tiles last."""
    if isa not in VECTOR_WIDTH:
        raise TileConfigError(f"unknown ISA {isa!r}; expected one of {sorted(VECTOR_WIDTH)}")
    caches = caches or host_caches()
    tiles = [t for t in CONV_TILES[isa] if t[0] * t[1] // VECTOR_WIDTH[isa] <= MAX_ACCUMULATORS[isa]]
    tiles.sort(key=lambda t: OCg % t[0] != 0)   # tiles whose rows divide OCg first (stable: keeps the order)
    rows = [t for t in ROW_VECTOR_TILES[isa] if t[0] <= _round_up(OCg, VECTOR_WIDTH[isa])]
    widest = max(tiles[1:], key=lambda t: (t[1], t[0]), default=tiles[0])   # most position vectors, then rows
    order = [(tiles[0], False, 1), (widest, False, 1)] + [(t, True, 0) for t in rows[:1]]
    order += [(tiles[0], True, 1), (NARROW_TILES[isa], True, 1)]
    order += [(t, narrow, 1) for t in tiles[1:] for narrow in (False, True)]
    order += [(t, True, 0) for t in rows[1:]]
    out: list[TileConfig] = []
    for (mr, nr), narrow, axis in order:
        cfg = _conv_tile(mr, nr, OCg, K, caches, narrow, axis)
        try:
            cfg.validate(isa, row_vectors=True)
        except TileConfigError:
            continue
        if cfg not in out:
            out.append(cfg)
    return out


#: the padded-planes strategy's register tile per ISA (rows = output channels, columns = positions):
#: on the development Xeon (AVX-512), ResNet-50's 64->64 3x3 conv at 56x56 in a C harness, 2 threads:
#: 8x48 883 us, 6x64 941, 8x32 931 (the gathered 6x64 tiles: 953-980)
PLANE_TILES = {"avx512": (8, 48), "avx2": (6, 16)}


def plane_configs(isa: str, analysis, caches: CacheSizes | None = None) -> list[TileConfig]:
    """The padded-planes strategy (``TileConfig.planes``) for a unit-stride Conv with taps (empty for a
    1x1, whose gather is a plain copy, a strided Conv, and where the ISA has no such tile): the
    register tiles read the task's zero-padded input planes in place, with no im2col gather (which
    costs a 64-channel 3x3 conv ~13% of its time), computing the ``KW - 1`` padding columns of every
    output row and dropping them (4% at 56 columns, 29% at 7): the dispatch weighs it against the
    gathering tiles per shape. The kernel takes any stride (one plane per stride phase), but where
    the taps are strided the gather is cheaper per FMA and the planes were 4-5% slower (ResNet-50's
    stride-2 3x3 convs, C harness), so they are not offered there. ``kc``: the planes' rows a K step reads (each input row serves the KW taps of
    a kernel row) and its weight slice fill L1; ``mc`` as the gathering tiles'; 4 tiles of positions
    per block."""
    geo = analysis.geo
    if isa not in PLANE_TILES or analysis.pointwise or geo.kh * geo.kw == 1 or geo.sh * geo.sw != 1:
        return []
    caches = caches or host_caches()
    mr, nr = PLANE_TILES[isa]
    kc = _k_step(analysis.K, caches.l1 // (4 * (mr + (nr + geo.kw * geo.dw) // geo.kw)))
    return [TileConfig(mr=mr, nr=nr, mc=_channel_block(analysis.OCg, mr), nc=4 * nr, kc=kc, planes=True).validate(isa)]


# ============================================================================ source

def position_block_tiles(P, n_pb, nr: int) -> list[tuple]:
    """``[(count, register tiles)]`` of the ``n_pb`` position blocks of a Conv call (ints or numpy
    arrays): the macro-kernel gives block ``pb`` the tiles ``[pb * T / n_pb, (pb + 1) * T / n_pb)`` of the
    ``T = ceil(P / nr)`` tiles, so blocks differ by at most one tile (the larger ones last)."""
    tiles = -(-P // nr)
    n_pb = np.maximum(n_pb, 1)
    small, larger = tiles // n_pb, tiles % n_pb
    return [(n_pb - larger, small), (larger, small + 1)]


def conv_task_grid(P, images, n_ob, cfg: TileConfig, threads: int) -> tuple:
    """(position blocks, channel-block runs) of an implicit-GEMM Conv call (``images`` = batch x
    groups, ``n_ob`` channel blocks of ``cfg.mc``), as the macro-kernel computes them (ints, or numpy
    arrays over a grid of shapes for the dispatch): ceil(P / nc) position blocks; a few tasks that do
    not divide among the threads are evened out -- column vectors cut P finer, row vectors (whose
    tasks each stream their channels' weights: cutting P would stream them once per block) cut the
    channel blocks into runs. Tasks = images x blocks x runs. The blocks share the ceil(P / nr)
    register tiles of positions evenly (:func:`position_block_tiles`). ``(0, 0)`` where P or
    ``images`` is 0. The one rule of the kernel's C task grid (``_TASK_GRID_C``), the runtime's task
    count and the wave model's task classes."""
    P, images, n_ob = np.asarray(P), np.asarray(images), np.asarray(n_ob)
    empty = (P <= 0) | (images <= 0)
    P, images = np.maximum(P, 1), np.maximum(images, 1)
    p_tiles = -(-P // cfg.nr)
    n_pb = -(-P // cfg.nc)
    few = images * n_pb < BALANCE_TASKS_PER_THREAD * threads
    if cfg.vector_axis == 1:
        n_pb = np.where(few & ((images * n_pb) % threads != 0), evened_count(n_pb, images, threads, p_tiles), n_pb)
    base = images * n_pb
    few = base < BALANCE_TASKS_PER_THREAD * threads
    runs = np.where(base >= threads, 1, np.minimum(n_ob, -(-threads // base)))
    if cfg.vector_axis == 1:    # a few blocks whose tiles do not divide: channel runs of MIN_RUN_CHANNELS or more
        finer = np.minimum(np.minimum(n_ob, -(-BALANCE_TASKS_PER_THREAD * threads // base)),
                           n_ob * cfg.mc // MIN_RUN_CHANNELS)
        runs = np.where(few & ((images * p_tiles) % threads != 0), np.maximum(runs, finer), runs)
    else:                       # the fewest runs that make the tasks a multiple of the threads (if any)
        even = threads // np.gcd(base, threads)
        uneven = (base < threads) | (few & (base % threads != 0))
        runs = np.where(uneven & (even <= n_ob), even, runs)
    obt = -(-n_ob // np.maximum(runs, 1))
    n_pb, n_obt = np.where(empty, 0, n_pb), np.where(empty, 0, -(-n_ob // np.maximum(obt, 1)))
    return (int(n_pb), int(n_obt)) if n_pb.ndim == 0 else (n_pb, n_obt)


def conv_func_name(analysis: _ConvBase, cfg: TileConfig | None, isa: str, precision: str = "fp32") -> str:
    tail = cfg.slug() if cfg is not None else "direct"
    suffix = "" if precision == "fp32" else f"_{precision}"
    return "tscomp_" + re.sub(r"\W", "_", analysis.group.name) + f"_conv_{isa}_{tail}{analysis.layout_slug()}{suffix}"


#: the precisions of the implicit-GEMM Conv: fp32, or int8 for a quantized model's integer operands
CONV_PRECISIONS = ("fp32", "int8")


def conv_precision(analysis, cfg, isa: str, precision: str) -> str:
    """The precision a Conv kernel under ``cfg`` computes in when ``precision`` is asked for: int8
    only for implicit-GEMM tiles with the lanes along the positions on AVX-512 (VPDPBUSD) and
    operands that fit it; every other configuration of the group (Winograd, row vectors, the
    depthwise kernels) stays fp32 -- the dispatch measures them side by side per shape."""
    fits = (isinstance(cfg, TileConfig) and cfg.vector_axis == 1 and not cfg.planes and isa in ("avx512", "amx")
            and getattr(analysis, "int8_x_offset", None) is not None)
    return precision if precision == "fp32" or fits else "fp32"


def check_conv_precision(analysis, cfg: TileConfig, isa: str, precision: str) -> str:
    """``precision`` if the implicit-GEMM Conv generator can emit it for ``cfg``; else
    :class:`UnsupportedOperatorError` saying why."""
    if precision not in CONV_PRECISIONS:
        raise UnsupportedOperatorError(f"group {analysis.group.name}: Conv precision {precision!r} (the conv family "
                                       f"computes in {' or '.join(CONV_PRECISIONS)})")
    if conv_precision(analysis, cfg, isa, precision) != precision:
        raise UnsupportedOperatorError(
            f"group {analysis.group.name}: an int8 Conv needs AVX-512 (VPDPBUSD) or AMX, lanes along the positions "
            f"and integer operands that fit u8 x s8 (X and 0 within 256 values, W in [-128, 127]); here isa={isa}, "
            f"vector_axis={cfg.vector_axis}, X offset {getattr(analysis, 'int8_x_offset', None)}")
    return precision


def _runtime_params() -> str:
    return ("const float* restrict X, const float* restrict Wp, int64_t NB, int64_t H, int64_t W, int64_t OH, "
            "int64_t OW, int64_t PT, int64_t PL")


def _epi_params(analysis) -> tuple[str, str, str]:
    """The epilogue's and prologue's arguments as parameters of a macro-kernel, named ``ts_e<k>``
    there (no shape symbol can shadow a macro-kernel local); the argument lists passing them on to
    the epilogue and to the prologue."""
    renamed = [(role, name, f"ts_e{k}", info) for k, (role, name, _, info) in enumerate(analysis.arg_roles)]
    params = "".join(f", {param_of(a)}" for a in renamed)
    epi = "".join(f", ts_e{k}" for k in analysis.epi_args)
    pro = "".join(f", ts_e{k}" for k in analysis.pro_args)
    return params, epi, pro


def direct_kernel_preamble(analysis, defines: str, *extra: str) -> list[str]:
    """The C a direct Conv-family kernel (channel-blocked depthwise, ConvTranspose) starts with
    after its header comment: includes, its compile-time constants, helpers, the per-thread
    workspace, then the group's math helpers, statics, fused epilogue and prologue, and ``extra``."""
    return [PRELUDE, "#include <string.h>", "#include <omp.h>", "#include <immintrin.h>", defines,
            "static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }",
            "static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }",
            WORKSPACE_C, analysis.math, analysis.statics or "", analysis.epilogue_c, analysis.prologue_c, *extra]


def _prologue_call(analysis, pro_names: str) -> str:
    if not analysis.prologue_c:
        return ""
    return f"\n    x_prologue((float*)X{pro_names});  /* X is the caller's scratch: the prologue computes it */"


def x_prologue_function(plan: Plan, group: Group, x: Expr, xshape: tuple, counter) -> tuple[str, list[tuple], str]:
    """``static void x_prologue(float* ts_xa, <args>)``: the Conv's input computed by the fused prologue
    (one parallel elementwise pass over [N, C, *spatial]) into the scratch the gather then reads."""
    gen = GroupGenerator(plan, group)
    gen.counter = counter            # one namespace with the epilogue's generated names
    if np.dtype(x.dtype) != np.float32:
        gen.fail(f"the Conv input is {np.dtype(x.dtype)}, only float32")
    gen.out_c = {"(X)": "ts_xa"}
    idx, close = gen.loops(xshape, "a", "elements", reads=[x])
    gen.store("(X)", x, idx, xshape)
    close()
    if gen.index_checks or gen.scratch:
        gen.fail("a data-dependent index or a row buffer in a Conv prologue")
    body = "\n".join(["    " + d for d in gen.decls] + gen.root.render(1))
    args: list[tuple] = []
    for iname, cname in gen.in_c.items():
        if re.search(rf"\b{cname}\[", body + "\n".join(gen.statics)):
            dt = np.dtype(plan.graph.values[iname].dtype)
            if dt.type not in INPUT_C_TYPES:
                gen.fail(f"prologue input {iname} of type {dt}")
            args.append(("input", iname, cname, dt))
    for sym in sorted((s for s in gen.pr.used if s not in gen.ctx.upper_bounds), key=lambda s: s.name):
        args.append(("symbol", sym.name, c_symbol_name(sym.name), sym))
    params = "".join(f", {param_of(a)}" for a in args)
    return f"static void x_prologue(float* restrict ts_xa{params})\n{{\n{body}\n}}\n", args, "\n".join(gen.statics)


#: NEXT_PANEL_PREFETCH. A channel tile's weights are one k-slice of its panel, and consecutive tiles'
#: slices lie a whole panel (K x MR floats) apart, so every micro-kernel call starts a new stream the
#: hardware prefetchers take a while to follow: a late-stage Conv whose 9.4 MB of weights arrive from
#: memory (ResNet-50's 3x3 512 -> 512 at 7x7) ran at 102 GFLOP/s, and at 152 with the column-vector
#: micro-kernel pulling the next tile's slice into L2 while it runs (one line per k step's weights:
#: by its last k step the next call's weights are there)
_MICRO_PARAMS = """int64_t kl, const float* restrict ap, const float* restrict bp, int64_t ldb, float* restrict ct,
    int first, int last, float* restrict tile"""
#: the planes form's: row k of the column operand at ``bp + koff[k]`` (PLANES_C)
_MICRO_PARAMS_PLANES = _MICRO_PARAMS.replace("int64_t ldb", "const int64_t* restrict koff")


def _emit_micro_kernel(emit, isa: str, MR: int, NR: int, column_vectors: bool = True,
                       position_major: bool = False, direct_lanes: int = 0, planes: bool = False) -> None:
    lanes = ("the SIMD lanes along the positions: per k, NR/W column vectors times MR broadcast weights"
             if column_vectors or isa == "scalar" else
             "the SIMD lanes along the channels: per k, MR/W weight vectors times NR broadcast positions")
    rows = "padded input planes (row k at bp + koff[k])" if planes else "gathered column block (row k at bp + k*ldb)"
    emit(f"""/* Micro-kernel: an MR x NR tile (output channels x positions) over kl steps of k, {lanes}.
 *   ap: prepacked weight panel (k-major, MR per k); bp: {rows};
 *   ct: partial sums (MR*NR) between K steps; last: the finished tile goes to `tile` (MR x NR). */
static inline __attribute__((always_inline)) void micro_kernel(
    {_MICRO_PARAMS_PLANES if planes else _MICRO_PARAMS})
{{""")
    row_k = "bp + koff[k]" if planes else "bp + k * ldb"
    if isa == "scalar":
        emit("""    float acc_t[MR][NR];
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c)
            acc_t[r][c] = first ? 0.0f : ct[r * NR + c];
    for (int64_t k = 0; k < kl; ++k) {
        const float* restrict bk = ROW_K;
        const float* restrict ak = ap + k * MR;
        for (int r = 0; r < MR; ++r)
            for (int c = 0; c < NR; ++c)
                acc_t[r][c] = fmaf(ak[r], bk[c], acc_t[r][c]);
    }
    float* restrict dst = last ? tile : ct;
    for (int r = 0; r < MR; ++r)
        for (int c = 0; c < NR; ++c)
            dst[r * NR + c] = acc_t[r][c];
}
""".replace("ROW_K", row_k))
        return
    v = _Vec(isa)
    W = v.width
    if not column_vectors:
        _emit_row_vector_body(emit, v, MR, NR, position_major=position_major, direct_lanes=direct_lanes)
        _emit_row_vector_tails(emit, v, MR, NR, position_major, direct_lanes)
        return
    _emit_column_vector_body(emit, v, MR, NR, NR // W, row_k)
    _emit_column_vector_tails(emit, v, MR, NR, planes)


def _emit_column_vector_body(emit, v: _Vec, MR: int, NR: int, vectors: int, row_k: str) -> None:
    """The micro-kernel's body with the lanes along the positions: ``vectors`` column vectors of the
    tile's NR positions (fewer than NR / W: a narrow kernel for the last, partial position tile,
    whose rows keep the tile's NR-float stride; its other columns are not written)."""
    W = v.width
    accs = emit_accumulators(emit, v, MR, vectors * W, stride=NR)
    emit("    for (int64_t k = 0; k < kl; ++k) {  /* FMA loop: no bounds tests (local padding) */")
    emit(f"        const float* restrict bk = {row_k};")
    emit("        const float* restrict ak = ap + k * MR;")
    for line in range(0, MR * 4, 64):
        emit(f"        _mm_prefetch((const char*)(ak + (int64_t)KDIM * MR) + {line}, _MM_HINT_T1);"
             + ("   /* the next channel tile's weights, the same k (NEXT_PANEL_PREFETCH) */" if not line else ""))
    emit_fma_step(emit, v, accs, [f"bk + {c * W}" for c in range(vectors)], lambda r: f"ak[{r}]")
    emit("    }")
    emit("    float* restrict dst = last ? tile : ct;")
    for r, row in enumerate(accs):
        emit("    " + " ".join(v.store(f"dst + {r * NR + c * W}", a) for c, a in enumerate(row)))
    emit("}\n")


def _emit_column_vector_tails(emit, v: _Vec, MR: int, NR: int, planes: bool) -> None:
    """Narrow column-vector kernels for a last position tile of at most NR - W positions, and
    ``micro_kernel_tail`` choosing the one of ceil(positions / W) vectors (FTuner's combination of
    tile sizes, as the row-vector and GEMM row tails): P = 196 under 64-position tiles computes 3
    tiles and one vector of 16, not a fourth tile of 60 zero-padded positions (23% of the FMAs)."""
    W = v.width
    if NR // W < 2:
        return
    params = _MICRO_PARAMS_PLANES if planes else _MICRO_PARAMS
    row_k = "bp + koff[k]" if planes else "bp + k * ldb"
    args = "kl, ap, bp, " + ("koff" if planes else "ldb") + ", ct, first, last, tile"
    for n in range(1, NR // W):
        emit(f"""/* Narrow micro-kernel: the last position tile holds at most {n * W} of NR = {NR} positions. */
static __attribute__((noinline)) void micro_kernel_v{n}(
    {params})
{{""")
        _emit_column_vector_body(emit, v, MR, NR, n, row_k)
    _emit_tail_dispatch(emit, params, args, f"(positions + {W - 1}) / {W}",
                        [(n, f"micro_kernel_v{n}") for n in range(1, NR // W)],
                        f"0 < positions <= NR - {W} valid): the kernel of ceil(positions / {W}) vectors")


def _emit_tail_dispatch(emit, params: str, args: str, selector: str, kernels: list[tuple[int, str]],
                        what: str) -> None:
    """C: ``micro_kernel_tail(positions, ...)``, the last position tile's call, switching on
    ``selector`` (an expression of ``positions``) to the tail kernel of that case."""
    cases = "\n".join(f"        case {n}: {fn}({args}); return;" for n, fn in kernels)
    emit(f"""/* The last position tile ({what}. */
static __attribute__((noinline)) void micro_kernel_tail(int64_t positions, {params})
{{
    switch ({selector}) {{
{cases}
        default: __builtin_unreachable();
    }}
}}
""")


def column_tail_granule(cfg: TileConfig, isa: str, precision: str = "fp32") -> int:
    """Positions the last position tile of a call is computed in multiples of: the vector width
    for fp32 SIMD column-vector tiles (:func:`_emit_column_vector_tails`), 1 for row-vector tiles
    (a tail kernel of the exact width), the whole register tile otherwise (int8, scalar)."""
    if isa == "scalar" or precision != "fp32":
        return cfg.nr
    return 1 if cfg.vector_axis == 0 else min(_Vec(isa).width, cfg.nr)


def _tail_call(cfg: TileConfig, isa: str, full: str, positions: str) -> str:
    """C: ``full`` (a micro_kernel call) for a position tile of more than NR - granule positions,
    ``micro_kernel_tail`` with the same arguments for a last, narrower one (row-vector tiles: any
    partial tile; fp32 SIMD column vectors: one of fewer vectors); ``full`` alone where the tiles
    have no tail kernels (:func:`column_tail_granule`)."""
    granule = column_tail_granule(cfg, isa)
    if granule >= cfg.nr:
        return full
    tail = full.replace("micro_kernel(", f"micro_kernel_tail({positions}, ")
    return f"if ({positions} > NR - {granule}) {full}\n                            else {tail}"


def _emit_row_vector_body(emit, v: _Vec, MR: int, NR: int, positions: int | None = None,
                          position_major: bool = False, direct_lanes: int = 0) -> None:
    """The micro-kernel's body with the lanes along the tile's rows (channels): the weight panel's k
    row is MR/W vectors, each of the NR gathered positions a broadcast (a late stage's few positions
    waste no padded lanes, and the weights stream as whole vectors). The accumulators hold the tile
    transposed (position-major); the finished tile is transposed back through a stack buffer.
    ``positions`` < NR: the body of a tail kernel computing only that many positions (the tile keeps
    its NR-position rows; the other columns are not written). ``position_major``: the finished tile
    stays position-major (``tile[j * MR + r]``: a channel-blocked output's epilogue reads it so).
    ``direct_lanes``: ``bp`` is the channel-blocked input itself (no gathered column block): k's
    position j is ``bp[(k / lanes) * ldb + k % lanes + j * lanes]``, ``ldb`` the block stride."""
    W = v.width
    npos = NR if positions is None else positions
    if positions is None:
        emit(f"#define ROW_VECTOR_PREFETCH_K {ROW_VECTOR_PREFETCH_K}   /* k steps ahead the weight panel is fetched */")
    accs = emit_accumulators(emit, v, npos, MR)     # accs[j][c]: position j, channels [c*W, c*W + W)
    emit("    for (int64_t k = 0; k < kl; ++k) {  /* FMA loop: no bounds tests (local padding) */")
    if direct_lanes:
        emit(f"        const float* restrict bk = bp + (k / {direct_lanes}) * ldb + k % {direct_lanes};"
             "   /* the blocked input's k */")
    else:
        emit("        const float* restrict bk = bp + k * ldb;")
    emit("        const float* restrict ak = ap + k * MR;")
    prefetch = tuple(f"_mm_prefetch((const char*)(ak + ROW_VECTOR_PREFETCH_K * MR) + {line}, _MM_HINT_T0);"
                     for line in range(0, MR * 4, 64))
    stride = direct_lanes or 1
    emit_fma_step(emit, v, accs, [f"ak + {c * W}" for c in range(MR // W)], lambda j: f"bk[{j * stride}]",
                  after_loads=prefetch)
    emit("    }")
    emit("    if (!last) {")
    for j, row in enumerate(accs):
        emit("        " + " ".join(v.store(f"ct + {j * MR + c * W}", a) for c, a in enumerate(row)))
    emit("        return;")
    emit("    }")
    if position_major:
        for j, row in enumerate(accs):
            emit("    " + " ".join(v.store(f"tile + {j * MR + c * W}", a) for c, a in enumerate(row)))
        emit("}\n")
        return
    emit(f"    float tt[{npos} * MR] __attribute__((aligned(64)));   /* position-major: tt[j * MR + r] */")
    for j, row in enumerate(accs):
        emit("    " + " ".join(v.store(f"tt + {j * MR + c * W}", a) for c, a in enumerate(row)))
    emit("    for (int r = 0; r < MR; ++r)")
    emit(f"        for (int j = 0; j < {npos}; ++j)")
    emit("            tile[r * NR + j] = tt[j * MR + r];")
    emit("}\n")


def _emit_row_vector_tails(emit, v: _Vec, MR: int, NR: int, position_major: bool = False,
                           direct_lanes: int = 0) -> None:
    """Row-vector kernels for a last position tile of 1 .. NR-1 positions, and ``micro_kernel_tail``
    choosing one (FTuner's combination of tile sizes, as the GEMM's row tails): P = 49 under a
    12-position tile runs four tiles and a 1-position kernel, not a fifth 12-position tile on
    zero-padded columns (each position is a broadcast and a vector FMA per k, so a padded one costs
    as much as a real one)."""
    for n in range(1, NR):
        emit(f"""/* Position-tail micro-kernel: the last tile holds {n} of NR = {NR} positions. */
static __attribute__((noinline)) void micro_kernel_{n}(
    {_MICRO_PARAMS})
{{""")
        _emit_row_vector_body(emit, v, MR, NR, positions=n, position_major=position_major,
                              direct_lanes=direct_lanes)
    _emit_tail_dispatch(emit, _MICRO_PARAMS, "kl, ap, bp, ldb, ct, first, last, tile", "positions",
                        [(n, f"micro_kernel_{n}") for n in range(1, NR)],
                        "0 < positions < NR valid): the kernel of exactly that width")


def _emit_pack_b(emit, pointwise: bool, phased: bool = False, x_lanes: int = 0) -> None:
    if x_lanes:
        if not pointwise:
            raise UnsupportedOperatorError("a channel-blocked input is gathered by 1x1 convolutions only")
        emit("""/* Gather rows [k0, k0 + kl) x positions [p0, p0 + nv) of the implicit im2col matrix into
 * bp[k * ldb + j] from a channel-blocked X (1x1 kernel, stride 1, no padding): channel k at position
 * p is lane k % LANES of row p of block k / LANES, so each run of channels within one block is a
 * register transpose of [position][lane] rows; columns nv..ldb are zero (local padding). */
static void pack_b(const float* restrict xg, int64_t H, int64_t W, int64_t OW, int64_t PT, int64_t PL,
                   int64_t p0, int64_t nv, int64_t ldb, int64_t k0, int64_t kl, float* restrict bp)
{
    (void)OW; (void)PT; (void)PL;
    const int64_t HW = H * W;
    for (int64_t k = 0; k < kl; ) {
        const int64_t c = k0 + k, l0 = c % LANES, w = min_i64(LANES - l0, kl - k);
        /* block c / LANES from lane l0: [position][lane] rows, LANES floats apart */
        ts_transpose_matrix(xg + ((c / LANES) * HW + p0) * LANES + l0, LANES, nv, w, bp + k * ldb, ldb);
        for (int64_t v = 0; v < w; ++v)
            for (int64_t j = nv; j < ldb; ++j) bp[(k + v) * ldb + j] = 0.0f;
        k += w;
    }
}
""")
        return
    if pointwise:
        emit("""/* Gather rows [k0, k0 + kl) x positions [p0, p0 + nv) of the implicit im2col matrix into
 * bp[k * ldb + j] (1x1 kernel, stride 1, no padding: row k is input channel k, contiguous);
 * columns nv..ldb are zero (local padding). */
static void pack_b(const float* restrict xg, int64_t H, int64_t W, int64_t OW, int64_t PT, int64_t PL,
                   int64_t p0, int64_t nv, int64_t ldb, int64_t k0, int64_t kl, float* restrict bp)
{
    (void)OW; (void)PT; (void)PL;
    const int64_t HW = H * W;
    for (int64_t k = 0; k < kl; ++k) {
        const float* restrict src = xg + (k0 + k) * HW + p0;
        float* restrict dst = bp + k * ldb;
        for (int64_t j = 0; j < nv; ++j) dst[j] = src[j];
        for (int64_t j = nv; j < ldb; ++j) dst[j] = 0.0f;
    }
}
""")
        return
    emit("""/* Gather rows [k0, k0 + kl) x positions [p0, p0 + nv) of the implicit im2col matrix into
 * bp[k * ldb + j]: row k = (c, kh, kw) reads X[c, oh*SH - PT + kh*DH, ow*SW - PL + kw*DW]. The
 * positions are walked as output-row segments; per segment the in-image columns are one strided
 * copy (contiguous at SW = 1) and the taps on the padding are zero, as are columns nv..ldb
 * (local padding: the micro-kernel never tests bounds). */
static void pack_b(const float* restrict xg, int64_t H, int64_t W, int64_t OW, int64_t PT, int64_t PL,
                   int64_t p0, int64_t nv, int64_t ldb, int64_t k0, int64_t kl, float* restrict bp)
{
    int64_t c = k0 / (KH * KW), r = k0 % (KH * KW);
    int64_t kh = r / KW, kw = r % KW;
    const int64_t oh_first = p0 / OW, ow_first = p0 % OW;
    for (int64_t k = 0; k < kl; ++k) {
        const float* restrict src = xg + c * H * W;
        float* restrict dst = bp + k * ldb;
        const int64_t off = kw * DW - PL;          /* iw = ow * SW + off */
        /* output columns whose tap is inside the image: lo <= ow < hi */
        const int64_t lo = off >= 0 ? 0 : (-off + SW - 1) / SW;
        const int64_t hi = W - 1 - off >= 0 ? (W - 1 - off) / SW + 1 : 0;
        int64_t j = 0, oh = oh_first, ow = ow_first;
        while (j < nv) {
            const int64_t seg = min_i64(OW - ow, nv - j);
            const int64_t ih = oh * SH - PT + kh * DH;
            float* restrict d = dst + j;           /* d[q]: output column ow + q */
            if (ih < 0 || ih >= H) {
                for (int64_t q = 0; q < seg; ++q) d[q] = 0.0f;
            } else {
                const float* restrict row = src + ih * W;
                const int64_t a = max_i64(0, min_i64(lo - ow, seg)), b = max_i64(a, min_i64(hi - ow, seg));
                const int64_t base = ow * SW + off;   /* >= 0 for q >= a */
                for (int64_t q = 0; q < a; ++q) d[q] = 0.0f;
                for (int64_t q = a; q < b; ++q) d[q] = row[base + q * SW];
                for (int64_t q = b; q < seg; ++q) d[q] = 0.0f;
            }
            j += seg;
            ow = 0;
            ++oh;
        }
        for (; j < ldb; ++j) dst[j] = 0.0f;
        if (++kw == KW) { kw = 0; if (++kh == KH) { kh = 0; ++c; } }
    }
}
""")
    if phased:
        emit(PHASE_WORKSPACE_C)
        emit(PADDED_PHASE_C)
        emit("""/* Phase planes of one channel's zero-padded input row: dst[ph * WQ + q] = Xpad[hp, q*SW + ph] for
 * ph < SW, q < WQ, where Xpad is the channel plane ``xc`` with PT rows and PL columns of zeros before it
 * (and zeros past it). Plane ph then holds, contiguous, every input column a tap of phase ph reads
 * along an output row: the gather below is plain copies. */
static void phase_row(const float* restrict xc, int64_t H, int64_t W, int64_t PT, int64_t PL, int64_t WQ,
                      int64_t hp, float* restrict dst)
{
    const int64_t ih = hp - PT;
    const float* src = ih < 0 || ih >= H ? NULL : xc + ih * W;
    for (int64_t ph = 0; ph < SW; ++ph)
        padded_phase(src, W, PL, WQ, ph, dst + ph * WQ);
}

/* A task's phase planes: for each of the group's CG channels, padded rows [r0, r0 + HR) (the rows its
 * output rows' taps read), each as SW phases of WQ columns. Built by the task itself, so the gather
 * reads what this core just wrote. */
static void build_phases(const float* restrict xg, int64_t H, int64_t W, int64_t PT, int64_t PL, int64_t WQ,
                         int64_t r0, int64_t HR, float* restrict xp)
{
    for (int64_t c = 0; c < CG; ++c)
        for (int64_t r = 0; r < HR; ++r)
            phase_row(xg + c * H * W, H, W, PT, PL, WQ, r0 + r, xp + (c * HR + r) * SW * WQ);
}

/* pack_b's rows gathered from a task's phase planes: row k = (c, kh, kw) of output row oh is plane row
 * (c, oh*SH + kh*DH - r0) of phase (kw*DW) % SW from column ow + (kw*DW) / SW on. */
static void pack_b_phased(const float* restrict xp, int64_t r0, int64_t HR, int64_t WQ, int64_t OW, int64_t p0,
                          int64_t nv, int64_t ldb, int64_t k0, int64_t kl, float* restrict bp)
{
    int64_t c = k0 / (KH * KW), r = k0 % (KH * KW);
    int64_t kh = r / KW, kw = r % KW;
    const int64_t oh_first = p0 / OW, ow_first = p0 % OW;
    for (int64_t k = 0; k < kl; ++k) {
        const float* restrict plane = xp + (c * HR * SW + (kw * DW) % SW) * WQ + (kw * DW) / SW;
        float* restrict dst = bp + k * ldb;
        int64_t j = 0, oh = oh_first, ow = ow_first;
        while (j < nv) {
            const int64_t seg = min_i64(OW - ow, nv - j);
            const float* restrict src = plane + (oh * SH + kh * DH - r0) * SW * WQ + ow;
            for (int64_t q = 0; q < seg; ++q) dst[j + q] = src[q];
            j += seg;
            ow = 0;
            ++oh;
        }
        for (; j < ldb; ++j) dst[j] = 0.0f;
        if (++kw == KW) { kw = 0; if (++kh == KH) { kh = 0; ++c; } }
    }
}
""")


#: C, the task grid of an implicit-GEMM Conv call over POSITIONS positions (P; a planes kernel's PJ):
#: position blocks, the widest block ``ncw``, channel-block runs (conv_task_grid in Python: the same
#: rule); it ends with ``n_obt`` runs of ``obt`` channel blocks
_TASK_GRID_C = """    /* position blocks: ceil(P / NC) of them, balanced in whole register tiles of NR positions (P =
     * 784 at NC = 256, NR = 64: 13 tiles as 3 + 3 + 3 + 4, not 4 + 4 + 4 + 1: on 2 threads the
     * second gets 7 tiles, not 8 against 5). A few tasks that do not divide among the threads (5
     * over 2: one thread idle a fifth of the time) are evened out: column vectors cut P into a
     * multiple of the thread count; row vectors, whose tasks each stream their channel blocks'
     * weights, cut the channels into runs instead (conv_task_grid in Python: the same rule) */
    const int64_t nth = omp_get_max_threads(), n_ob = (OCG + MC - 1) / MC;
    const int64_t p_tiles = (P + NR - 1) / NR;
    int64_t n_pb = (P + NC - 1) / NC;
    const int uneven = NB * G * n_pb < BALANCE_TASKS_PER_THREAD * nth && (NB * G * n_pb) % nth;
    if (COLUMN_VECTORS && uneven)
        for (int64_t want = n_pb + 1; want <= p_tiles; ++want)
            if ((NB * G * want) % nth == 0) { n_pb = want; break; }
    const int64_t ncw = (p_tiles + n_pb - 1) / n_pb * NR;     /* the widest block */
    /* channel blocks per task: all of them (the column block is gathered once per K step for every
     * channel block), cut into balanced runs only when there are fewer other tasks than threads
     * (row vectors: or when those tasks do not divide among the threads) */
    const int64_t base = NB * G * n_pb;
    int64_t runs = base >= nth ? 1 : min_i64(n_ob, (nth + base - 1) / base);
    /* column vectors, a few blocks whose position tiles do not divide among the threads (7 tiles
     * over 2: 4 against 3): their channel blocks in runs too, as long as each run keeps
     * MIN_RUN_CHANNELS channels to share its gathered column block */
    if (COLUMN_VECTORS && base < BALANCE_TASKS_PER_THREAD * nth && (NB * G * p_tiles) % nth)
        runs = max_i64(runs, min_i64(min_i64(n_ob, (BALANCE_TASKS_PER_THREAD * nth + base - 1) / base),
                                     n_ob * MC / MIN_RUN_CHANNELS));
    if (!COLUMN_VECTORS && (base < nth || (base < BALANCE_TASKS_PER_THREAD * nth && base % nth)))
        for (int64_t r = 1; r <= n_ob; ++r)
            if (base * r >= nth && (base * r) % nth == 0) { runs = r; break; }
    const int64_t obt = (n_ob + runs - 1) / runs;
    const int64_t n_obt = (n_ob + obt - 1) / obt;
"""


def _task_grid_c(positions: str) -> str:
    return re.sub(r"\bP\b", positions, _TASK_GRID_C)


#: C: one stride phase of a zero-padded input row (the phase-plane gather's rows, the padded planes)
PADDED_PHASE_C = """/* One stride phase of a zero-padded input row: d[q] = Xpad[row, q*SW + ph] for q < WQ, where ``src`` is
 * the input row (NULL: a row of the padding) with PL columns of zeros before it and zeros past it. */
static void padded_phase(const float* restrict src, int64_t W, int64_t PL, int64_t WQ, int64_t ph, float* restrict d)
{
    const int64_t shift = PL - ph;                 /* iw = q * SW - shift */
    const int64_t lo = src ? min_i64(WQ, shift > 0 ? (shift + SW - 1) / SW : 0) : WQ;
    const int64_t hi = src ? max_i64(lo, min_i64(WQ, W - 1 + shift >= 0 ? (W - 1 + shift) / SW + 1 : 0)) : WQ;
    for (int64_t q = 0; q < lo; ++q) d[q] = 0.0f;
    for (int64_t q = lo; q < hi; ++q) d[q] = src[q * SW - shift];
    for (int64_t q = hi; q < WQ; ++q) d[q] = 0.0f;
}
"""

#: PLANES_C: a task's zero-padded input planes, the column operand of the padded-planes tiles
PLANES_C = PADDED_PHASE_C + """
/* A task's zero-padded input planes. Plane (c, rp, cp) holds, for the output rows oh0 .. oh0 + HRQ - 1,
 * the padded input row (oh0 + rr) * SH + rp at the columns q * SW + cp, q < WQ. Tap (kh, kw) of output
 * position (oh, ow) is then element (oh - oh0 + kh*DH/SH) * WQ + ow + kw*DW/SW of plane
 * (c, kh*DH % SH, kw*DW % SW): along J = oh * WQ + ow every row k of the implicit im2col matrix is one
 * run of the planes at the constant offset koff[k], read in place by the micro-kernel (no gather). A task
 * builds the planes of one K step's channels at a time (all of a 256-channel conv's would not stay in L2). */
static void build_planes(const float* restrict xg, int64_t c_first, int64_t channels, int64_t H, int64_t W,
                         int64_t PT, int64_t PL, int64_t WQ, int64_t HRQ, int64_t oh0, float* restrict xp)
{
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t rp = 0; rp < SH; ++rp)
            for (int64_t cp = 0; cp < SW; ++cp) {
                float* plane = xp + ((c * SH + rp) * SW + cp) * HRQ * WQ;
                const float* xc = xg + (c_first + c) * H * W;
                for (int64_t rr = 0; rr < HRQ; ++rr) {
                    const int64_t ih = (oh0 + rr) * SH + rp - PT;
                    padded_phase(ih < 0 || ih >= H ? NULL : xc + ih * W, W, PL, WQ, cp, plane + rr * WQ);
                }
            }
}

/* koff[k]: where row k = (c, kh, kw) of the implicit im2col matrix starts in the planes of its K step
 * (which hold the step's channels, from the first one it reads) */
static void plane_offsets(int64_t HRQ, int64_t WQ, int64_t* restrict koff)
{
    for (int64_t k = 0; k < KDIM; ++k) {
        const int64_t c = k / (KH * KW) - k / KC * KC / (KH * KW), kh = (k / KW) % KH, kw = k % KW;
        koff[k] = ((c * SH + kh * DH % SH) * SW + kw * DW % SW) * HRQ * WQ + kh * DH / SH * WQ + kw * DW / SW;
    }
}
"""


def plane_positions(OH, OW, geo):
    """Positions a padded-planes Conv call computes (ints or numpy arrays): its output rows laid
    along the padded width ``WQ = OW + (KW - 1) * DW // SW``, the last row's dropped columns not
    computed -- ``(OH - 1) * WQ + OW``."""
    return (OH - 1) * (OW + (geo.kw - 1) * geo.dw // geo.sw) + OW


#: C: the fp32 register tile's weight panel ``ap`` (before its micro-kernel call, gathering or planes)
FP32_PANEL_C = "const float* ap = Wp + ((g * N_OCP + oc0 / MR + ip) * (int64_t)KDIM + k0) * MR;\n" + " " * 28
#: C (the planes kernel): a finished tile stored a row segment at a time, the columns past OW dropped
PLANES_STORE_C = """                            {   /* the tile's columns J as row segments of the output, those past OW dropped */
                                const int64_t jt = J0 + jp * NR, jend = min_i64(jt + NR, J0 + nvb);
                                for (int64_t j = jt; j < jend; ) {
                                    const int64_t oh = j / WQ, ow = j - oh * WQ;
                                    if (ow >= OW) { j += WQ - ow; continue; }
                                    const int64_t len = min_i64(OW - ow, jend - j);
                                    conv_epilogue(tile + (j - jt), NR, n, g * OCG + oc0 + ip * MR, oh * OW + ow,
                                                  min_i64(MR, mvb - ip * MR), lenNAMES);
                                    j += len;
                                }
                            }"""


def _first_last(single: bool) -> str:
    """C: the micro-kernel's (first, last) K-step flags."""
    return "1, 1" if single else "kb == 0, kb == N_KBLOCKS - 1"


def _channel_tile_loops(single: bool, micro_call: str, store: str) -> str:
    """C: one K step of a task over its channel blocks' register tiles -- ``micro_call`` per tile
    (partial sums ``ct`` in the task's buffer between K steps), ``store`` after the last step."""
    return f"""                for (int64_t ob = ob_first; ob < ob_end; ++ob) {{
                    const int64_t oc0 = ob * MC, mvb = min_i64(MC, OCG - oc0);
                    float* cb = {'NULL' if single else 'cbuf + (ob - ob_first) * (MC * ncw)'};
                    for (int64_t jp = 0; jp * NR < nvb; ++jp) {{
                        for (int64_t ip = 0; ip * MR < mvb; ++ip) {{
                            float* ct = {'NULL' if single else 'cb + (jp * (MC / MR) + ip) * (MR * NR)'};
                            {micro_call}
                            if ({'1' if single else 'kb == N_KBLOCKS - 1'})
{store}
                        }}
                    }}
                }}"""


def _emit_planes_kernel(emit, a, cfg: TileConfig, isa: str, name: str, params: str, names: str, pro_names: str,
                        n_kb: int) -> None:
    """The padded-planes form of the macro-kernel (``cfg.planes``): per task, the input rows its
    positions read as zero-padded planes (:data:`PLANES_C`), the register tiles reading them in place
    at a per-k offset; the positions run along the padded width and each finished tile is stored a
    row segment at a time, the columns past OW dropped."""
    emit(PHASE_WORKSPACE_C)
    emit(PLANES_C)
    _emit_micro_kernel(emit, isa, cfg.mr, cfg.nr, True, planes=True)
    single = n_kb == 1
    store = PLANES_STORE_C.replace("NAMES", names)
    emit(f"""/* Macro-kernel: tasks = NB x G x position blocks (PJ = (OH - 1) * WQ + OW positions along the padded
 * width, balanced in register tiles) x runs of channel blocks; each walks K in N_KBLOCKS steps of KC,
 * building the planes of the step's channels, every MR x NR tile of its channel blocks reading them in place. */
void {name}({_runtime_params()}{params})
{{
    const int64_t P = OH * OW;
    if (NB <= 0 || P <= 0) return;{_prologue_call(a, pro_names)}
    const int64_t WQ = OW + (KW - 1) * DW / SW, PJ = (OH - 1) * WQ + OW;
{_task_grid_c('PJ')}    const int64_t n_tasks = base * n_obt;
    /* plane rows per task: its block's output rows, the taps' rows below them, and one more that the
     * dropped columns of its last row read into; the planes end in WQ + NR zeros for the last one's */
    const int64_t HRQ = (ncw + WQ - 2) / WQ + 1 + (KH - 1) * DH / SH + 1;
    const int64_t step_channels = min_i64(CG, (KC - 1) / (KH * KW) + 2);   /* the most a K step reads */
    const size_t plane_floats = (size_t)step_channels * SH * SW * HRQ * WQ, slack = (size_t)(WQ + NR);
    const size_t koff_at = (plane_floats + slack + 15) / 16 * 16;
    #pragma omp parallel if (n_tasks > 1)
    {{
        float* xp = tscomp_phase_workspace(koff_at + 2 * (size_t)KDIM);
        int64_t* koff = (int64_t*)(xp + koff_at);
        for (size_t q = plane_floats; q < plane_floats + slack; ++q) xp[q] = 0.0f;
        plane_offsets(HRQ, WQ, koff);
        float* cbuf = {'NULL' if single else 'tscomp_thread_workspace((size_t)(obt * MC * ncw))'};
        float tile[MR * NR] __attribute__((aligned(64)));
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; ++t) {{
            const int64_t og = t % n_obt, pb = (t / n_obt) % n_pb, g = (t / (n_obt * n_pb)) % G;
            const int64_t n = t / (n_obt * n_pb * G);
            const int64_t J0 = pb * p_tiles / n_pb * NR, nvb = min_i64((pb + 1) * p_tiles / n_pb * NR, PJ) - J0;
            const int64_t ob_first = og * obt, ob_end = min_i64(n_ob, ob_first + obt);
            const int64_t oh0 = J0 / WQ;
            const float* xg = X + (n * C_IN + g * CG) * H * W;
            const float* xb = xp + (J0 - oh0 * WQ);
            for (int64_t kb = 0; kb < N_KBLOCKS; ++kb) {{
                const int64_t k0 = kb * KC, kl = min_i64(KC, KDIM - k0);
                const int64_t c_first = k0 / (KH * KW), c_end = (k0 + kl - 1) / (KH * KW) + 1;
                build_planes(xg, c_first, c_end - c_first, H, W, PT, PL, WQ, HRQ, oh0, xp);
{_channel_tile_loops(single, FP32_PANEL_C + _tail_call(cfg, isa, f"micro_kernel(kl, ap, xb + jp * NR, koff + k0, ct, {_first_last(single)}, tile);", "nvb - jp * NR"), store)}
            }}
        }}
    }}
}}
""")


def conv_source(analysis: ConvAnalysis, cfg: TileConfig, isa: str, precision: str = "fp32") -> str:
    """The source step of the ``conv`` family (pure): C text of the implicit-GEMM macro-kernel; with
    ``precision="int8"`` its VPDPBUSD form (:mod:`tscomp.codegen.cpu_conv_int8`)."""
    cfg = cfg.validate(isa, row_vectors=True)
    a, geo = analysis, analysis.geo
    int8 = check_conv_precision(analysis, cfg, isa, precision) == "int8"
    amx = int8 and isa == "amx"       # the int8 tiles on AMX (TDPBUSD), not VPDPBUSD
    name = conv_func_name(a, cfg, isa, precision)
    MR, NR, MC, NC = cfg.mr, cfg.nr, cfg.mc, cfg.nc
    # int8: whole quads per K step (AMX: whole 64-deep tile steps)
    KC = min(_round_up(cfg.kc, AMX_INT8_K if amx else INT8_K_QUAD) if int8 else cfg.kc, a.K)
    n_kb = -(-a.K // KC)
    n_ocp = -(-a.OCg // MR)
    params, names, pro_names = _epi_params(a)
    L: list[str] = []
    emit = L.append

    def emit_t(text: str) -> None:   # a template: its constants spelled TS_<name>
        L.append(ts_macros(text))

    direct = reads_blocks_in_place(a, cfg, KC)
    if cfg.planes and (int8 or a.x_lanes or a.y_lanes or isa == "scalar"):
        raise UnsupportedOperatorError(
            f"group {a.group.name}: the padded-planes Conv tiles are fp32 SIMD over NCHW tensors (here "
            f"precision {precision}, isa {isa}, X lanes {a.x_lanes}, output lanes {a.y_lanes})")
    emit(a.header("implicit GEMM", f"{cfg.describe()} on {isa}; K = Cg*KH*KW = {a.K} in {n_kb} step(s) of {KC}; "
                  f"one OpenMP task per (image, group, {NC}-position block, run of {MC}-channel blocks)"
                  + _layout_words(a, direct)
                  + (f"; int8 on AMX tiles: u8 weight rows W + 128 x s8 quads of X - ({a.int8_x_offset}) - 128, TDPBUSD, "
                     f"exact int32 sums corrected per channel and per position" if amx else
                     f"; int8: s8 weight quads x u8 quads of X - ({a.int8_x_offset}), VPDPBUSD, exact int32 sums"
                     if int8 else "")))
    emit(PRELUDE)
    emit("#include <string.h>")
    emit("#include <omp.h>")
    if isa != "scalar":
        emit("#include <immintrin.h>")
    emit(c_defines(C_IN=a.C, CG=a.Cg, OCG=a.OCg, G=a.G, OC=a.OC, KH=geo.kh, KW=geo.kw, SH=geo.sh, SW=geo.sw,
                   DH=geo.dh, DW=geo.dw, KDIM=a.K, MR=MR, NR=NR, MC=MC, NC=NC, KC=KC, N_KBLOCKS=n_kb,
                   N_OCP=n_ocp, BALANCE_TASKS_PER_THREAD=BALANCE_TASKS_PER_THREAD, MIN_RUN_CHANNELS=MIN_RUN_CHANNELS,
                   COLUMN_VECTORS=cfg.vector_axis, LANES=max(a.x_lanes, a.y_lanes, 1),
                   **(dict(XLO=a.int8_x_offset, KQALL=-(-a.K // INT8_K_QUAD)) if int8 else {}),
                   **(dict(KPAD=amx_k_padded(a.K), AMX_K=AMX_INT8_K) if amx else {})))
    emit("static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }")
    emit("static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }")
    emit(WORKSPACE_C)
    emit(a.math)
    if a.statics:
        emit(a.statics)
    if a.x_lanes or a.y_lanes:
        from tscomp.codegen.cpu_depthwise_channels import transpose_block_c
        emit(transpose_block_c("avx512" if amx else isa))     # (AMX kernels: AVX-512 around the tiles)
    emit(a.epilogue_c)
    if a.epilogue_in_place_c and cfg.vector_axis != 0:
        emit(a.epilogue_in_place_c)
    emit(a.prologue_c)
    if cfg.planes:
        _emit_planes_kernel(emit_t, a, cfg, isa, name, params, names, pro_names, n_kb)
        return "\n".join(L)
    _emit_pack_b(emit_t, a.pointwise, a.phased, a.x_lanes)
    if amx:
        from tscomp.codegen.cpu_gemm import _emit_amx_setup
        _emit_amx_setup(emit, None)
        emit_t(PACK_QUADS_C)
        emit_t(QUADS_TO_S8_C)
        emit_int8_amx_micro_kernel(emit_t, MR, NR)
    elif int8:
        emit_t(PACK_QUADS_C)
        emit_int8_micro_kernel(emit_t, MR, NR)
    else:
        _emit_micro_kernel(emit_t, isa, MR, NR, cfg.vector_axis == 1, position_major=bool(a.y_lanes),
                           direct_lanes=a.x_lanes if direct else 0)
    single = n_kb == 1
    # int8: the quad block (ceil(KC / 4) rows of ncw lanes) after the gathered block, partial sums after it
    # (AMX: ceil(KC / 64) x 16 rows, then the positions' byte sums, ncw int32)
    quads = "(KC + 63) / 64 * 16 * ncw + ncw + " if amx else "(KC + 3) / 4 * ncw + " if int8 else ""
    partials = "0" if single else "obt * MC * ncw"
    emit_t(f"""/* Macro-kernel: tasks = NB x G x ceil(P / NC) x (groups of obt channel blocks of MC); each walks K in
 * N_KBLOCKS steps of KC, gathering the column block once per step and sweeping every MR x NR tile of
 * its channel blocks with it. */
void {name}({_runtime_params()}{params})
{{
    const int64_t P = OH * OW;
    if (NB <= 0 || P <= 0) return;{_prologue_call(a, pro_names)}
{_task_grid_c('P')}    const int64_t n_tasks = base * n_obt;{_phase_setup(a)}
    #pragma omp parallel if (n_tasks > 1)
    {{{_phase_build(a)}{_amx_tiles_on(amx)}
        float* bpack = tscomp_thread_workspace((size_t)(KC * ncw + {quads}{partials}));{_quad_block(int8, amx)}
        float* cbuf = {'NULL' if single else f'bpack + KC * ncw + {quads}0'};
        float tile[MR * NR] __attribute__((aligned(64)));{_stage_declaration(a)}
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; ++t) {{
            const int64_t og = t % n_obt, pb = (t / n_obt) % n_pb, g = (t / (n_obt * n_pb)) % G;
            const int64_t n = t / (n_obt * n_pb * G);
            /* block pb: register tiles [pb * p_tiles / n_pb, (pb + 1) * p_tiles / n_pb) */
            const int64_t p0 = pb * p_tiles / n_pb * NR, nvb = min_i64((pb + 1) * p_tiles / n_pb * NR, P) - p0;
            const int64_t ldb = (nvb + NR - 1) / NR * NR;
            const int64_t ob_first = og * obt, ob_end = min_i64(n_ob, ob_first + obt);
            const float* xg = X + (n * C_IN + g * CG) * H * W;{_task_phases(a)}
            for (int64_t kb = 0; kb < N_KBLOCKS; ++kb) {{
                const int64_t k0 = kb * KC, kl = min_i64(KC, KDIM - k0);
                {_gather_call(a, direct, int8)}{_signed_quads_call(amx)}
{_channel_tile_loops(single, _micro_kernel_call(cfg, isa, _first_last(single), direct, int8, amx),
                      _tile_epilogue_call(a, cfg, names))}
            }}
        }}{_amx_tiles_off(amx)}
    }}
}}
""")
    return "\n".join(L)


def _stage_declaration(a) -> str:
    """C: the per-thread position-major staging tile a channel-blocked output is stored through."""
    if not a.y_lanes:
        return ""
    return "\n        float stage[(NR + LANES - 1) / LANES * LANES * LANES] __attribute__((aligned(64)));"


def _tile_epilogue_call(a, cfg: TileConfig, names: str) -> str:
    """C: a finished tile through the fused epilogue -- a channel-major one (MR x NR) into an NCHW
    output directly; into a channel-blocked output, a row-vector tile (position-major already, whole
    blocks of LANES channels: MR and the channel offsets are multiples of it) one block at a time, a
    column-vector tile per run of channels within one block, its rows transposed to position-major
    first (masked at the edges)."""
    ind = " " * 32
    if a.y_lanes and cfg.vector_axis == 0:
        return f"""{ind}{{
{ind}    const int64_t ych = g * OCG + oc0 + ip * MR, ymv = min_i64(MR, mvb - ip * MR);
{ind}    for (int64_t yc = 0; yc < ymv; yc += LANES)
{ind}        conv_epilogue(tile + yc, MR, n, (ych + yc) / LANES, 0, p0 + jp * NR, min_i64(LANES, ymv - yc),
{ind}                      min_i64(NR, nvb - jp * NR){names});
{ind}}}"""
    if not a.y_lanes or a.epilogue_in_place_c:
        fn = "conv_epilogue_in_place" if a.y_lanes else "conv_epilogue"
        return (f"{ind}{fn}(tile, NR, n, g * OCG + oc0 + ip * MR, p0 + jp * NR,\n"
                f"{ind}              min_i64(MR, mvb - ip * MR), min_i64(NR, nvb - jp * NR){names});")
    return f"""{ind}{{
{ind}    const int64_t ych = g * OCG + oc0 + ip * MR, ymv = min_i64(MR, mvb - ip * MR);
{ind}    const int64_t ynv = min_i64(NR, nvb - jp * NR);
{ind}    for (int64_t yc = 0; yc < ymv; ) {{
{ind}        const int64_t cc = ych + yc, l0 = cc % LANES, w = min_i64(LANES - l0, ymv - yc);
{ind}        ts_transpose_matrix(tile + yc * NR, NR, w, ynv, stage, LANES);   /* stage[p][v] = tile[yc + v][p] */
{ind}        conv_epilogue(stage, LANES, n, cc / LANES, l0, p0 + jp * NR, w, ynv{names});
{ind}        yc += w;
{ind}    }}
{ind}}}"""


def _quad_block(int8: bool, amx: bool = False) -> str:
    """C (int8): this thread's u8 quad block, after its gathered column block (AMX: then the
    positions' byte sums)."""
    if amx:
        return ("\n        uint32_t* bq = (uint32_t*)(bpack + KC * ncw);"
                "\n        int32_t* usum = (int32_t*)(bq + (KC + 63) / 64 * 16 * ncw);")
    return "\n        uint32_t* bq = (uint32_t*)(bpack + KC * ncw);" if int8 else ""


def _amx_tiles_on(amx: bool) -> str:
    """C (AMX): each thread configures its tile registers as it enters the parallel region."""
    return "\n        amx_configure();   /* this thread's tile registers: 16 rows x 64 bytes each */" if amx else ""


def _amx_tiles_off(amx: bool) -> str:
    return "\n        _tile_release();" if amx else ""


def _signed_quads_call(amx: bool) -> str:
    """C (AMX): the gathered u8 quads made the signed B operand, their per-position sums kept."""
    return "\n                quads_to_s8(bq, ldb, kl, usum, kb == 0);" if amx else ""


def _gather_call(a, direct: bool, int8: bool) -> str:
    """C: the gather of one K step (:func:`_pack_call`); int8: into u8 quads -- the gathered float
    block converted, or a plain 1x1 Conv's channel rows read straight from X."""
    if not int8:
        return _pack_call(a, direct)
    if a.pointwise and not a.x_lanes:
        return "pack_quads_pointwise(xg, H * W, p0, nvb, ldb, k0, kl, bq);"
    gathered = "{ pack_b(xg, H, W, OW, PT, PL, p0, nvb, ldb, k0, kl, bpack); pack_quads(bpack, ldb, kl, bq); }"
    if a.phased:
        return f"if (xp) pack_quads_phased(xp, r0, HR, WQ, OW, p0, nvb, ldb, k0, kl, bq);\n                else {gathered}"
    return gathered


def _micro_kernel_call(cfg: TileConfig, isa: str, first_last: str, direct: bool = False, int8: bool = False,
                       amx: bool = False) -> str:
    """The macro-kernel's call of the register tile at position tile jp (its weight panel ``ap``
    first): a last, partial position tile runs its tail kernel (:func:`_tail_call`; row-vector
    tiles: the exact width, so no position past the image is read where the tiles read a blocked
    input in place); int8 tiles read the quad panel, the quad block and the panel's corrections."""
    if amx:        # the panel's weight rows at column k0; the corrections after every group's rows
        panel = "(g * N_OCP + oc0 / MR + ip)"
        return (f"const uint8_t* ap = (const uint8_t*)Wp + {panel} * MR * (int64_t)KPAD + k0;\n"
                f"                            const int32_t* corr = (const int32_t*)((const uint8_t*)Wp + (int64_t)G * N_OCP * MR"
                f" * KPAD) + {panel} * MR;\n"
                f"                            micro_kernel_int8_amx(kl, ap, bq + jp * NR, ldb, corr, usum + jp * NR, "
                f"(int32_t*)ct, {first_last}, tile);")
    if int8:
        panel = "(g * N_OCP + oc0 / MR + ip)"
        return (f"const uint32_t* ap = (const uint32_t*)Wp + ({panel} * (int64_t)KQALL + k0 / 4) * MR;\n"
                f"                            const int32_t* corr = (const int32_t*)Wp + (int64_t)G * N_OCP * KQALL * MR"
                f" + {panel} * MR;\n"
                f"                            micro_kernel_int8(kl, ap, bq + jp * NR, ldb, corr, (int32_t*)ct, "
                f"{first_last}, tile);")
    b, ld = ("xk + jp * NR * LANES", "H * W * LANES") if direct else ("bpack + jp * NR", "ldb")
    return FP32_PANEL_C + _tail_call(cfg, isa, f"micro_kernel(kl, ap, {b}, {ld}, ct, {first_last}, tile);", "nvb - jp * NR")


def _phase_setup(a) -> str:
    """Before the parallel region (phased Convs): the plane width and the most padded rows a
    position block's taps read, which size each thread's phase-plane buffer."""
    if not a.phased:
        return ""
    return """
    /* phase planes (build_phases): their columns, and the padded rows one position block's taps read */
    const int64_t WQ = OW + (KW - 1) * DW / SW;
    const int64_t HR_MAX = (ncw + OW - 2) / OW * SH + (KH - 1) * DH + 1;"""


def _phase_build(a) -> str:
    """At the top of the parallel region: this thread's phase-plane buffer."""
    if not a.phased:
        return ""
    return """
        float* xp = tscomp_phase_workspace((size_t)(CG * HR_MAX * SW * WQ));  /* NULL: gather in place */"""


def _layout_words(a, direct: bool) -> str:
    """The header's words on the channel-blocked layouts (tscomp/codegen/channel_blocking.py)."""
    words = []
    if a.x_lanes:
        words.append(f"X channel-blocked by {a.x_lanes} ({'read in place' if direct else 'gathered by transposes'})")
    if a.y_lanes:
        words.append(f"output stored channel-blocked by {a.y_lanes}")
    if a.blocked_operands:
        words.append("channel-blocked epilogue operands " + ", ".join(n for n, _ in a.blocked_operands))
    return "; " + "; ".join(words) if words else ""


def reads_blocks_in_place(a, cfg: TileConfig, KC: int) -> bool:
    """Whether a 1x1 Conv's row-vector tiles broadcast straight from its channel-blocked input (no
    gathered column block): each K step must start at a whole block."""
    return bool(a.x_lanes) and a.pointwise and cfg.vector_axis == 0 and (KC % a.x_lanes == 0 or KC >= a.K)


def _pack_call(a, direct: bool = False) -> str:
    """The gather of one K step: from the task's phase planes, or in place; none where the tiles
    read a channel-blocked input directly (``xk``: the step's first block at the task's positions)."""
    if direct:
        return "const float* xk = xg + (k0 / LANES) * H * W * LANES + p0 * LANES;   /* read in place */"
    plain = "pack_b(xg, H, W, OW, PT, PL, p0, nvb, ldb, k0, kl, bpack);"
    if not a.phased:
        return plain
    return ("if (xp) pack_b_phased(xp, r0, HR, WQ, OW, p0, nvb, ldb, k0, kl, bpack);\n"
            f"                else {plain}")


def _task_phases(a) -> str:
    """Per task, before its K steps: the phase planes of the rows its position block reads."""
    if not a.phased:
        return ""
    return """
            /* this block's output rows oh0..oh1 read padded rows r0 .. r0 + HR - 1 */
            const int64_t oh0 = p0 / OW, oh1 = (p0 + nvb - 1) / OW;
            const int64_t r0 = oh0 * SH, HR = (oh1 - oh0) * SH + (KH - 1) * DH + 1;
            if (xp) build_phases(xg, H, W, PT, PL, WQ, r0, HR, xp);"""


#: outputs one depthwise task aims at (rows of one channel, or whole channels of a small image)
DEPTHWISE_TASK_OUTPUTS = 4096
#: a kernel with more taps than this keeps only one kernel column's weights in registers at a time
#: (a 7x7's 49 broadcast weights do not fit 32 vector registers beside accumulators and inputs)
DEPTHWISE_REGISTER_TAPS = 16
#: output rows one kernel-column pass accumulates together
DEPTHWISE_ROW_BLOCK = 4
#: channels per task when the epilogue stores channels-last: one 64-byte line of floats
DEPTHWISE_LINE_CHANNELS = 16


def depthwise_l1_floats(l1_bytes: int) -> int:
    """The floats of a task's accumulator rows and phase planes: 3/4 of L1, the rest for the
    weights, the epilogue's operands and the stack."""
    return l1_bytes * 3 // 4 // 4


def depthwise_row_width(OW: int, geo: Geometry2D, isa: str) -> int:
    """PWS, the phase planes' and accumulators' row: OW plus the widest tap's column offset,
    rounded up to whole vectors (a pass over one row then has no scalar remainder)."""
    return _round_up(OW + max(t[3] for t in _depthwise_taps(geo)), VECTOR_WIDTH[isa])


def depthwise_blocks(OC: int, OH: int, OW: int, geo: Geometry2D, l1_bytes: int, isa: str,
                     scattered: bool = False) -> tuple[int, int]:
    """(output rows, channels) one depthwise task covers: about DEPTHWISE_TASK_OUTPUTS outputs and
    no more rows than keep its accumulators and phase planes in L1; whole channels grouped when a
    channel is smaller than that, but at least 8 channel blocks per image so that 2+ threads
    balance. An epilogue that stores channels-last (``scattered``: SegFormer's Mix-FFN) takes
    DEPTHWISE_LINE_CHANNELS channels per task whatever the rows, so each output cache line is
    written whole by one task, not a float at a time by 16 tasks on both cores. The kernel computes
    the same rule in C (``depthwise_source``)."""
    TR, PWS = max(t[2] for t in _depthwise_taps(geo)), depthwise_row_width(OW, geo, isa)
    fit = depthwise_l1_floats(l1_bytes) // (PWS * (1 + geo.sh * geo.sw)) - TR - 1
    rows = max(1, min(OH, DEPTHWISE_TASK_OUTPUTS // max(OW, 1), fit))
    if scattered:   # and few enough rows that those lines stay in L1 while the channels fill them
        lines = depthwise_l1_floats(l1_bytes) // 2 // (DEPTHWISE_LINE_CHANNELS * max(OW, 1))
        return max(1, min(rows, lines)), min(OC, DEPTHWISE_LINE_CHANNELS)
    if rows < OH:
        return rows, 1
    return rows, max(1, min(DEPTHWISE_TASK_OUTPUTS // max(OH * OW, 1), OC // 8))


def _depthwise_taps(geo: Geometry2D) -> list[tuple[int, int, int, int]]:
    """Per tap (kh, kw): (weight index, phase plane, plane row offset, plane column offset). With the
    padded input split into SH x SW phase planes (plane (a, b) holds padded rows a, a + SH, ... and
    columns b, b + SW, ...), output (oh, ow)'s tap reads plane ((kh DH) % SH, (kw DW) % SW) at row
    oh + (kh DH) // SH and column ow + (kw DW) // SW: unit stride in ow at every stride."""
    taps = []
    for kh in range(geo.kh):
        for kw in range(geo.kw):
            rh, rw = kh * geo.dh, kw * geo.dw
            taps.append((kh * geo.kw + kw, (rh % geo.sh) * geo.sw + rw % geo.sw, rh // geo.sh, rw // geo.sw))
    return taps


def _depthwise_tap_loop(geo: Geometry2D, start: str) -> str:
    """The unrolled tap sum of flat output positions [start, F): a pointer per (plane, row offset),
    so the taps of one kernel row differ only in a constant displacement."""
    taps = _depthwise_taps(geo)
    rows = sorted({(plane, dr) for _, plane, dr, _ in taps})
    ptr = {key: f"q{i}" for i, key in enumerate(rows)}
    lines = [f"                const float* restrict {ptr[(plane, dr)]} = planes + {plane} * PLANE + {dr} * PWS;"
             for plane, dr in rows]
    lines += [f"                const float w{t} = wk[{t}];" for t, *_ in taps]
    lines.append("                #pragma omp simd")
    lines.append(f"                for (int64_t f = {start}; f < F; ++f)")
    t, plane, dr, dc = taps[0]
    terms = f"w{t} * {ptr[(plane, dr)]}[f + {dc}]"
    for t, plane, dr, dc in taps[1:]:     # fused multiply-adds: ISO C (-std=c11) contracts none itself
        terms = f"fmaf(w{t}, {ptr[(plane, dr)]}[f + {dc}], {terms})"
    lines.append(f"                    acc[f] = {terms};")
    return "\n".join(lines)


def _depthwise_column_passes(geo: Geometry2D) -> str:
    """For kernels with more taps than registers: blocks of DEPTHWISE_ROW_BLOCK output rows, one
    vectorized pass per kernel column, with only that column's KH weights live. Each input row a
    pass reads is loaded once for every output row of the block that uses it (a 7x7 loads 10 input
    vectors for 28 FMAs, where one tap sum per position loads 49 inputs and 49 spilled weights for
    49 FMAs); the block's rows accumulate in ``acc`` between passes. Rows past the last whole block
    take the flat tap sum."""
    RB = DEPTHWISE_ROW_BLOCK
    taps = _depthwise_taps(geo)
    ind = " " * 24
    lines = ["                int64_t r0 = 0;",
             f"                for (; r0 + {RB} <= R; r0 += {RB}) {{"]
    for kw in range(geo.kw):
        column = [taps[kh * geo.kw + kw] for kh in range(geo.kh)]
        lines.append(f"                    {{   /* kernel column {kw} */")
        lines += [f"{ind}const float w{t} = wk[{t}];" for t, *_ in column]
        lines += [f"{ind}#pragma omp simd", f"{ind}for (int64_t f = 0; f < PWS; ++f) {{"]
        lines += [f"{ind}    float a{r} = {'0.0f' if kw == 0 else f'acc[(r0 + {r}) * PWS + f]'};" for r in range(RB)]
        loaded: dict[tuple, str] = {}
        for t, plane, dr, dc in column:
            for r in range(RB):
                key = (plane, r + dr, dc)
                if key not in loaded:
                    loaded[key] = f"x{len(loaded)}"
                    lines.append(f"{ind}    const float {loaded[key]} = planes[{plane} * PLANE + (r0 + {r + dr}) * PWS + f + {dc}];")
                lines.append(f"{ind}    a{r} = fmaf(w{t}, {loaded[key]}, a{r});")
        lines += [f"{ind}    acc[(r0 + {r}) * PWS + f] = a{r};" for r in range(RB)]
        lines += [f"{ind}}}", "                    }"]
    lines.append("                }")
    lines.append(_depthwise_tap_loop(geo, "r0 * PWS"))
    return "\n".join(lines)


def depthwise_source(analysis: DepthwiseAnalysis, isa: str, l1_bytes: int) -> str:
    """The source step of the ``conv-depthwise`` family (pure): C text of the direct kernel."""
    a, geo = analysis, analysis.geo
    name = conv_func_name(a, None, isa)
    params, names, pro_names = _epi_params(a)
    taps = _depthwise_taps(geo)
    TR, TC = max(t[2] for t in taps), max(t[3] for t in taps)
    rows_cap = f"min_i64(min_i64(OH, {DEPTHWISE_TASK_OUTPUTS} / OW), fit)"
    if a.scattered_store:   # a channels-last store: the output lines a task fills stay in L1
        rows_cap = f"min_i64({rows_cap}, L1_FLOATS / 2 / ({DEPTHWISE_LINE_CHANNELS} * OW))"
    L: list[str] = []
    emit = L.append

    def emit_t(text: str) -> None:   # a template: its constants spelled TS_<name>
        L.append(ts_macros(text))

    emit(a.header("direct depthwise", f"one OpenMP task per (image, block of channels, block of output rows); "
                  f"the input in {geo.sh * geo.sw} zero-padded phase plane(s), the {geo.kh}x{geo.kw} taps "
                  f"unrolled over a flat run of output positions, vectorized ({isa})"))
    emit(PRELUDE)
    emit(c_defines(C_IN=a.C, OCG=a.OCg, OC=a.OC, KH=geo.kh, KW=geo.kw, SH=geo.sh, SW=geo.sw, DH=geo.dh,
                   DW=geo.dw, L1_FLOATS=depthwise_l1_floats(l1_bytes)))
    emit("static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }")
    emit("static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }")
    emit("static inline int64_t ceil_div_i64(int64_t a, int64_t b) { return -ts_floordiv(-a, b); }")
    emit("#include <string.h>")
    emit(WORKSPACE_C)
    emit(a.math)
    if a.statics:
        emit(a.statics)
    emit(a.epilogue_c)
    emit(a.prologue_c)
    emit_t(f"""/* Direct depthwise macro-kernel: output channel oc reads input channel oc / OCG. A task (image,
 * block of channels, block of output rows) copies, per channel, the input rows its outputs read into
 * SH x SW zero-padded phase planes (plane (a, b): padded rows a + SH r, columns b + SW c), so every
 * tap of output (oh, ow) reads its plane at (oh + row offset) * PWS + ow + column offset (offsets at
 * most {TR} and {TC}): with plane rows PWS >= OW + {TC} wide, a task's output positions are one flat run
 * f = oh * PWS + ow (the extra columns of each row are computed and dropped), vectorized with the
 * KH x KW taps unrolled, whatever the stride and dilation. The rows are then packed OW apart for one
 * pass of the fused epilogue. */
void {name}({_runtime_params()}{params})
{{
    const int64_t P = OH * OW;
    if (NB <= 0 || P <= 0) return;{_prologue_call(a, pro_names)}
    /* output rows and channels per task (depthwise_blocks in Python computes the same): about
     * {DEPTHWISE_TASK_OUTPUTS} outputs, and the accumulators and planes in L1 */
    const int64_t PWS = (OW + {TC} + {VECTOR_WIDTH[isa] - 1}) / {VECTOR_WIDTH[isa]} * {VECTOR_WIDTH[isa]};   /* whole vectors */
    const int64_t fit = L1_FLOATS / (PWS * (1 + SH * SW)) - {TR} - 1;
    const int64_t rows = max_i64(1, {rows_cap});
    const int64_t cb = {f"min_i64(OC, {DEPTHWISE_LINE_CHANNELS});   /* a channels-last store: whole output lines per task */"
                        if a.scattered_store else
                        f"rows < OH ? 1 : max_i64(1, min_i64({DEPTHWISE_TASK_OUTPUTS} / P, OC / 8));"}
    const int64_t n_rb = (OH + rows - 1) / rows, n_cb = (OC + cb - 1) / cb;
    const int64_t n_tasks = NB * n_cb * n_rb;
    const int64_t PR = rows + {TR} + 1, PLANE = PR * PWS;
    #pragma omp parallel if (n_tasks > 1)
    {{
        float* restrict acc = tscomp_thread_workspace((size_t)(rows * PWS + SH * SW * PLANE));
        float* restrict planes = acc + rows * PWS;
        #pragma omp for schedule(dynamic, 2)
        for (int64_t t = 0; t < n_tasks; ++t) {{
            const int64_t rb = t % n_rb, cblk = (t / n_rb) % n_cb, n = t / (n_rb * n_cb);
            const int64_t oh0 = rb * rows, R = min_i64(OH, oh0 + rows) - oh0, F = R * PWS;
            /* padding (columns outside the input, rows outside the image, the overhang row) is the
             * same for every channel of the task: zeroed once, then each channel copies its rows */
            const int64_t NRW = R + {TR} + 1;
            for (int64_t pl = 0; pl < SH * SW; ++pl)
                memset(planes + pl * PLANE, 0, (size_t)(NRW * PWS) * sizeof(float));
            for (int64_t oc = cblk * cb; oc < min_i64(OC, (cblk + 1) * cb); ++oc) {{
                const float* restrict src = X + (n * C_IN + oc / OCG) * H * W;
                const float* restrict wk = Wp + oc * (KH * KW);
                for (int64_t pr = 0; pr < SH; ++pr)
                    for (int64_t pc = 0; pc < SW; ++pc) {{
                        float* restrict plane = planes + (pr * SW + pc) * PLANE;
                        /* plane column c holds input column c * SW + pc - PL */
                        const int64_t c_lo = min_i64(PWS, max_i64(0, ceil_div_i64(PL - pc, SW)));
                        const int64_t c_hi = max_i64(c_lo, min_i64(PWS, ceil_div_i64(W + PL - pc, SW)));
                        for (int64_t r = 0; r < NRW - 1; ++r) {{
                            const int64_t ih = oh0 * SH - PT + r * SH + pr;
                            if (ih < 0 || ih >= H) continue;
                            const float* restrict srow = src + ih * W + pc - PL;
                            float* restrict prow = plane + r * PWS;
                            if (SW == 1)
                                memcpy(prow + c_lo, srow + c_lo, (size_t)(c_hi - c_lo) * sizeof(float));
                            else
                                for (int64_t c = c_lo; c < c_hi; ++c) prow[c] = srow[c * SW];
                        }}
                    }}
{_depthwise_column_passes(geo) if geo.kh * geo.kw > DEPTHWISE_REGISTER_TAPS else _depthwise_tap_loop(geo, "0")}
                /* rows packed to OW apart (dropping the extra columns), then one long epilogue pass */
                for (int64_t r = 1; r < R && PWS != OW; ++r)
                    memmove(acc + r * OW, acc + r * PWS, (size_t)OW * sizeof(float));
                conv_epilogue(acc, R * OW, n, oc, oh0 * OW, 1, R * OW{names});
            }}
        }}
    }}
}}
""")
    return "\n".join(L)


# ============================================================================ prepacking
def _aligned(n: int) -> np.ndarray:
    raw = np.empty(n * 4 + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n * 4].view(np.float32)


def prepack_conv_weight(W: np.ndarray, G: int, mr: int) -> np.ndarray:
    """W[OC, Cg, *k] -> per group g, MR-row panels of W_g[OCg, K] (K = Cg·prod(k), row-major over
    (c, kh, kw), the order the column gather walks), each k-major: packed[g][panel][k][r]; rows past
    OCg are zero (local padding)."""
    OC = W.shape[0]
    OCg = OC // G
    K = int(np.prod(W.shape[1:]))
    n_ocp = -(-OCg // mr)
    Wg = np.zeros((G, n_ocp * mr, K), np.float32)
    Wg[:, :OCg] = W.reshape(G, OCg, K)
    panels = Wg.reshape(G, n_ocp, mr, K).transpose(0, 1, 3, 2)
    out = _aligned(panels.size)
    out[:] = panels.reshape(-1)
    return out


# ============================================================================ executor
def to_channel_blocks(x: np.ndarray, lanes: int) -> np.ndarray:
    """NCHW -> the channel-blocked storage of the same shape and size: element (n, c, p) at
    ``((n * C/lanes + c / lanes) * P + p) * lanes + c % lanes`` (:mod:`tscomp.codegen.channel_blocking`)."""
    N, C = x.shape[:2]
    blocks = np.ascontiguousarray(x, np.float32).reshape(N, C // lanes, lanes, -1).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(blocks).reshape(x.shape)


def from_channel_blocks(b: np.ndarray, lanes: int) -> np.ndarray:
    """The inverse of :func:`to_channel_blocks`."""
    N, C = b.shape[:2]
    return np.ascontiguousarray(b.reshape(N, C // lanes, -1, lanes).transpose(0, 1, 3, 2)).reshape(b.shape)


def output_buffers(group: str, shapes: Mapping[str, tuple], out: Mapping[str, np.ndarray] | None) -> dict:
    """Every output's array: the runtime's arena view where given (checked), else a new one."""
    outputs = {}
    for name, shape in shapes.items():
        arr = (out or {}).get(name)
        if arr is None:
            arr = np.empty(shape, np.float32)
        elif arr.shape != shape or arr.dtype != np.float32 or not arr.flags.c_contiguous:
            raise ExecutionError(f"group {group}: output buffer {name!r} is {arr.dtype}{list(arr.shape)}, "
                                 f"expected a C-contiguous float32{list(shape)}")
        outputs[name] = arr
    return outputs


class CompiledConv(PicklableKernel):
    """The executor step of both Conv families: a built macro-kernel under one configuration.

    ``run(env, binding)`` reads the input through its views, resolves the window at the input's
    concrete size (SAME pads, output lengths), evaluates the shape symbols the epilogue uses and
    returns every group output. Constructing one compiles nothing (:func:`tscomp.codegen.families.
    link_native` builds and binds)."""

    TRANSIENT = {"fn": None, "_memo": dict}
    takes_out = True          # writes into the runtime's arena views when given

    def __init__(self, analysis: _ConvBase, cfg: TileConfig | None, isa: str, l1_bytes: int | None = None,
                 precision: str = "fp32"):
        self.analysis = analysis
        self.l1_bytes = host_caches().l1 if l1_bytes is None else l1_bytes
        self.family = analysis.family
        self.group = analysis.group
        self.symtab = analysis.symtab
        self.isa = isa
        self.cfg = cfg.validate(isa, row_vectors=True) if cfg is not None else None
        #: int8: the implicit-GEMM tiles on VPDPBUSD (cpu_conv_int8), X packed as the bytes X - x_offset
        self.precision = conv_precision(analysis, self.cfg, isa, precision)
        self.x_offset = analysis.int8_x_offset if self.precision == "int8" else 0
        self.func = conv_func_name(analysis, self.cfg, isa, self.precision)
        self.source, self.packed = self._build()
        self.weight_name = analysis.weight_name
        self.task_model = 2          # samples recorded with task classes (runtime.wave.CLASSES_SINCE)
        self._memo: dict = {}
        self.fn = None

    def _build(self) -> tuple[str, np.ndarray]:
        """(C source, packed weight) of this configuration's macro-kernel."""
        return self._source(), self.pack_weight(self.analysis.W)

    def _source(self) -> str:
        a, cfg, isa = self.analysis, self.cfg, self.isa
        if isinstance(cfg, TileConfig):
            return conv_source(a, cfg, isa, self.precision)
        if isinstance(cfg, WinogradConfig):
            return winograd_source(a, cfg, isa)
        if cfg is not None:      # the channel-blocked depthwise strategy
            from tscomp.codegen.cpu_depthwise_channels import channel_blocked_source
            return channel_blocked_source(a, cfg, isa)
        return depthwise_source(a, isa, self.l1_bytes)

    def weight_layout(self) -> tuple:
        """What this kernel's packed weight depends on besides the raw weight: variants that agree
        share one packed copy (the artifact stores the raw weight, :mod:`tscomp.runtime.packing`
        packs it at load)."""
        if self.precision == "int8":
            return ("int8-amx-rows" if self.isa == "amx" else "int8-panels"), self.analysis.G, self.cfg.mr, self.x_offset
        if isinstance(self.cfg, TileConfig):
            return "panels", self.analysis.G, self.cfg.mr
        if isinstance(self.cfg, WinogradConfig):
            return "winograd", self.cfg.mr
        if self.cfg is not None:
            return "channel-blocks", self.cfg.lanes
        return "rows",

    def pack_weight(self, W: np.ndarray) -> np.ndarray:
        """The raw weight W[OC, C / G, *kernel] in this kernel's layout (:meth:`weight_layout`)."""
        if self.precision == "int8":
            pack = prepack_conv_weight_int8_amx if self.isa == "amx" else prepack_conv_weight_int8
            return pack(W, self.analysis.G, self.cfg.mr, self.x_offset)
        if isinstance(self.cfg, TileConfig):
            return prepack_conv_weight(W, self.analysis.G, self.cfg.mr)
        if isinstance(self.cfg, WinogradConfig):    # U[e] [OC, C] panels, the 16 positions e as groups
            return prepack_conv_weight(transformed_weight(W).reshape(-1, W.shape[1]), DOMAIN, self.cfg.mr)
        if self.cfg is not None:
            from tscomp.codegen.cpu_depthwise_channels import prepack_channel_blocks
            return prepack_channel_blocks(W, self.cfg.lanes)
        flat = np.ascontiguousarray(W.reshape(W.shape[0], -1), np.float32)
        packed = _aligned(flat.size)
        packed[:] = flat.reshape(-1)
        return packed

    def resources(self) -> dict[str, int]:
        out = {"packed_weight_bytes": int(self.packed.nbytes)}
        if isinstance(self.cfg, (TileConfig, WinogradConfig)):
            out["vector_accumulators"] = self.cfg.accumulators(self.isa)
        return out

    def _bind_function(self, lib) -> None:
        fn = getattr(lib, self.func)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 7 + \
            [ctypes.c_int64 if role == "symbol" else ctypes.c_void_p for role, *_ in self.analysis.arg_roles]
        self.fn = fn

    def _ints(self, binding: Mapping[str, int]):
        key = binding_key(binding)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        a = self.analysis
        plain = dict(binding)

        def ev(x) -> int:
            return int(self.symtab.evaluate(x, plain))

        xshape = tuple(ev(d) for d in a.x_shape)
        geo = self.sizes_at(xshape, ev)
        shapes = {n: tuple(ev(d) for d in s) for n, s in a.out_shapes.items()}
        syms = [ev(info) for role, _, _, info in a.arg_roles if role == "symbol"]
        hit = (xshape, geo, shapes, syms, ev)
        if len(self._memo) > 4096:
            self._memo.clear()
        self._memo[key] = hit
        return hit

    def sizes_at(self, xshape: tuple[int, ...], ev) -> tuple[int, ...]:
        """(H, W, OH, OW, PT, PL, PB, PR) at a concrete input shape (``ev`` evaluates a size);
        :meth:`size_exprs` is the same as expressions."""
        a = self.analysis
        return a.geo.runtime(a.win, xshape[2:])

    def tasks(self, binding: Mapping[str, int]) -> int:
        xshape, (H, W, OH, OW, *_), *_ = self._ints(binding)
        a = self.analysis
        if self.cfg is None:
            rows, cb = depthwise_blocks(a.OC, OH, OW, a.geo, self.l1_bytes, self.isa, a.scattered_store)
            return xshape[0] * -(-a.OC // cb) * -(-OH // rows)
        if isinstance(self.cfg, WinogradConfig):
            *_, n_tb, _, n_ob = tile_grid(OH, OW, a.OC, self.cfg)
            return xshape[0] * n_tb * n_ob
        if not isinstance(self.cfg, TileConfig):
            from tscomp.codegen.cpu_depthwise_channels import channel_block_rows
            rows = int(channel_block_rows(self.cfg, a.geo, xshape[0], a.OC, OH, OW, get_num_threads()))
            return xshape[0] * -(-a.OC // self.cfg.lanes) * -(-OH // rows)
        images = xshape[0] * a.G                                  # the kernel's own rule (conv_source)
        positions = plane_positions(OH, OW, a.geo) if self.cfg.planes else OH * OW
        n_pb, n_obt = conv_task_grid(positions, images, -(-a.OCg // self.cfg.mc), self.cfg, get_num_threads())
        return images * n_pb * n_obt

    def size_exprs(self) -> tuple:
        """(H, W, OH, OW, PT, PL) of the kernel as expressions of the symbols (the host program's)."""
        a = self.analysis
        return a.geo.runtime_expr(a.win, a.x_shape[2:])[:6]

    def native_call(self) -> NativeCall:
        """X (its input, a contiguous copy through its views, or scratch the prologue fills), the
        packed weight, N, H, W, OH, OW and the top/left pads as expressions, then the epilogue's."""
        a = self.analysis
        if a.x_input is None:
            x = NativeArg("scratch", expr=numel(a.x_shape) * 4)
        else:
            x = NativeArg("view", a.x_input, views=tuple(reversed(a.x_chain))) if a.x_chain else \
                NativeArg("tensor", a.x_input, dtype="float32")
        ints = [NativeArg("int", expr=e) for e in (a.x_shape[0], *self.size_exprs())]
        extra = args_by_role((role, name, info) for role, name, _, info in a.arg_roles)
        return NativeCall(self.func, (x, NativeArg("packed"), *ints, *extra))

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The group's outputs from ``env``'s tensors, all in NCHW: a channel-blocked input is
        blocked before the call and a channel-blocked output unblocked after it (the host program
        passes the arena's blocked tensors as they are)."""
        a = self.analysis
        if not (a.x_lanes or a.y_lanes or a.blocked_operands):
            return self.run_stored(env, binding, out)
        given = env
        env = {**env, **{name: to_channel_blocks(np.asarray(env[name]), lanes) for name, lanes in a.blocked_operands}}
        if a.x_lanes:
            env[a.x_input] = to_channel_blocks(self._input(given, None, None), a.x_lanes)
        if not a.y_lanes:
            return self.run_stored(env, binding, out)
        stored = self.run_stored(env, binding)
        outputs = output_buffers(self.group.name, {k: v.shape for k, v in stored.items()}, out)
        for k, v in stored.items():
            outputs[k][...] = from_channel_blocks(v, a.y_lanes)
        return outputs

    def run_stored(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int],
                   out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """:meth:`run` on tensors in the layouts the kernel stores them in (channel-blocked where
        the analysis says so): what the host program does, and what a timing of random inputs runs."""
        if self.fn is None:
            self._bind_function(load_library(build_library(self.source, self.func)))
        a = self.analysis
        xshape, (H, W, OH, OW, PT, PL, _, _), shapes, syms, ev = self._ints(binding)
        if a.x_input is None:
            x = np.empty(xshape, np.float32)          # the kernel's prologue fills it
        else:
            x = self._input(env, ev, xshape)
        outputs = output_buffers(self.group.name, shapes, out)
        keep, extra = [x], []
        sym_values = iter(syms)
        for role, name, _, info in a.arg_roles:
            if role == "output":
                extra.append(outputs[name].ctypes.data)
            elif role == "input":
                arr = np.asarray(env[name])
                if arr.dtype != info or not arr.flags.c_contiguous:
                    arr = np.ascontiguousarray(arr, dtype=info)
                keep.append(arr)
                extra.append(arr.ctypes.data)
            else:
                extra.append(next(sym_values))
        self.fn(x.ctypes.data, self.packed.ctypes.data, xshape[0], H, W, OH, OW, PT, PL, *extra)
        return outputs

    def _input(self, env, ev, xshape) -> np.ndarray:
        """X through its views, checked against ``xshape`` (None: not checked; a blocked X has none)."""
        a = self.analysis
        x = np.asarray(env[a.x_input])
        for v in a.x_chain:
            x = apply_view(x, v.op, ev)
        if x.dtype != np.float32:
            raise ExecutionError(f"group {self.group.name}: Conv input {a.x_input!r} is {x.dtype}, expected float32")
        if xshape is not None and x.shape != xshape:
            raise ExecutionError(f"group {self.group.name}: Conv input {a.x_input!r} has shape {x.shape}, "
                                 f"expected {xshape}")
        return np.ascontiguousarray(x)

    __call__ = run


__all__ = ["CONV_TILES", "CompiledConv", "ConvAnalysis", "DepthwiseAnalysis", "TileEpilogue", "conv_candidate_configs",
           "conv_source", "depthwise_source", "prepack_conv_weight"]
