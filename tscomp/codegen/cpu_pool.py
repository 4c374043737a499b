"""Pooling groups compiled to native CPU kernels: pooling as reductions (TSCompiler §4.2: reductions
are the second kind of group backbone; their fused prologue/epilogue run inside the reduction's
loop nest, §5.3).

* **windowed pools** — ``MaxPool`` (one output) and ``AveragePool`` (``count_include_pad`` either
  way), 1-D and 2-D, strides, dilations, explicit/asymmetric pads or ``auto_pad``, ``ceil_mode``;
  the fusion stage keeps them as one-op groups. The window is resolved per call at the concrete
  input size with the reference's own rule (:meth:`tscomp.graph.ops.nn.Window.geometry`: SAME pads,
  ceil mode's output lengths), so one kernel serves every (symbolic) spatial size. One OpenMP task
  per (image, channel, output row); per row every kernel tap is one pass over the output columns
  whose tap lies in the image (a contiguous pass at stride 1), so no bounds test sits in the inner
  loop; the average's divisor per column is the count of taps in the image, or in the image plus
  the declared padding (``count_include_pad``), taps in ceil mode's extra padding never counting.
* **global pools** — ``GlobalAveragePool`` / ``GlobalMaxPool`` groups (kind "reduce") with whatever
  the fusion stage fused around them: per (image, channel) row one ``simd`` reduction over the
  spatial positions, evaluating the fused prologue on the fly, then the epilogue on the pooled
  value, stored once — generated from the group's expression IR by the elementwise generator of
  :mod:`tscomp.codegen.cpu_groups`.

Anything else (MaxPool's Indices output, LpPool, a 3-D pool, non-float32 data) is refused with the
group and the reason, and runs on the numpy fallback.
"""
from __future__ import annotations

import ctypes
import re
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.c_expr import PRELUDE, c_symbol_name, delinearize, math_helpers
from tscomp.codegen.cpu_conv import (INPUT_C_TYPES, Geometry2D, c_defines, output_buffers, param_of, strip_views,
                                     ts_macros, window_of)
from tscomp.codegen.cpu_groups import PARALLEL_MIN_ELEMENTS, GroupGenerator, _Block
from tscomp.codegen.kernel import NativeArg, NativeCall, args_by_role
from tscomp.codegen.native import PicklableKernel, binding_key, refusals_name_group, sha256_text, structural_signature
from tscomp.codegen.workspace import WORKSPACE_C
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Input, Op, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.symbols import numel, same
from tscomp.graph.views import apply_view

WINDOWED = ("MaxPool", "AveragePool")
GLOBAL = ("GlobalAveragePool", "GlobalMaxPool")


class _GlobalPoolGenerator(GroupGenerator):
    """The row loop of a global pool: rows (ts_n, ts_c), the pooled value ``ts_res`` (every name it
    defines starts with ``ts_``: no shape symbol can take such a name)."""

    def __init__(self, plan: Plan, group: Group, heavy: Op):
        super().__init__(plan, group)
        self.heavy = heavy
        xshape = self.shape(heavy.args[0])
        self.xshape = xshape
        self.N, self.C, self.spatial = xshape[0], xshape[1], xshape[2:]
        self.S = numel(self.spatial)
        self.n = self.ctx.var("ts_n", self.N)
        self.ch = self.ctx.var("ts_c", self.C)
        self.sp = self.ctx.var("ts_s", self.S)
        self.in_rows = False

    def heavy_value(self, e: Op, idx) -> str:
        if e.node != self.heavy.node:
            self.fail("a second reduction in a global pooling group", e)
        if not self.in_rows:
            self.fail(f"the {e.op_type} result is read inside its own reduction", e)
        # the row compared whole: with a batch of one, composed views may name it (0, c + C*n)
        row = self.ctx.simplify(idx[0] * self.C + idx[1])
        if not all(i == 0 for i in idx[2:]) or not same(row, self.ctx.simplify(self.n * self.C + self.ch)):
            self.fail(f"the epilogue reads the {e.op_type} result at {idx}, not at its own row", e)
        return "ts_res"

    def generate(self, func: str) -> tuple[str, list[tuple]]:
        g, op = self.group, self.heavy.op_type
        is_max = op == "GlobalMaxPool"
        rows = _Block([(f"#pragma omp parallel for collapse(2) schedule(static) if(parallel: "
                        f"{self.c(self.N * self.C * self.S)} > {PARALLEL_MIN_ELEMENTS})", 0),
                       (f"for (int64_t ts_n = 0; ts_n < {self.c(self.N)}; ++ts_n) {{", 0),
                       (f"for (int64_t ts_c = 0; ts_c < {self.c(self.C)}; ++ts_c) {{", 1)], [("}", 1), ("}", 0)])
        self.push(rows, [self.n, self.ch])
        self.emit(f"float ts_acc = {'-INFINITY' if is_max else '0.0f'};")
        red = "max:ts_acc" if is_max else "+:ts_acc"
        inner = _Block([(f"#pragma omp simd reduction({red})", 0),
                        (f"for (int64_t ts_s = 0; ts_s < {self.c(self.S)}; ++ts_s) {{", 0)], [("}", 0)])
        self.push(inner, [self.sp])
        pos = delinearize(self.sp, self.spatial, self.ctx)
        v = self.value(self.heavy.args[0], (self.n, self.ch) + tuple(pos))
        self.emit(f"ts_acc = {'ts_acc > ' + v + ' ? ts_acc : ' + v if is_max else 'ts_acc + ' + v};")
        self.pop()
        self.emit(f"const float ts_res = {'ts_acc' if is_max else f'ts_acc / (float)({self.c(self.S)})'};  /* {op} */")
        self.where["ts_res"] = rows
        self.in_rows = True
        rows_numel = self.N * self.C
        for name, e in g.outputs.items():
            oshape = self.shape(e)
            if np.dtype(e.dtype) != np.float32:
                self.fail(f"output {name} is {np.dtype(e.dtype)}, only float32 outputs")
            if not sympy.simplify(numel(oshape) - rows_numel) == 0:
                self.fail(f"output {name} of shape {list(oshape)} is not one value per (image, channel)")
            flat = self.n * self.C + self.ch
            oidx = delinearize(flat, oshape, self.ctx)
            val = self.value(e, oidx)
            self.emit(f"{self.out_c[name]}[{self.c(flat)}] = {val};")
        self.pop()
        if self.index_checks or self.scratch:
            self.fail("a data-dependent index or a row buffer in a global pooling group")
        body = "\n".join(["    " + d for d in self.decls] + self.root.render(1))
        args: list[tuple] = []
        for iname, cname in self.in_c.items():
            if re.search(rf"\b{cname}\[", body + "\n".join(self.statics)):
                dt = np.dtype(self._input_dtype(iname))
                if dt.type not in INPUT_C_TYPES:
                    self.fail(f"input {iname} of type {dt}")
                args.append(("input", iname, cname, dt))
        for name in g.outputs:
            args.append(("output", name, self.out_c[name], np.dtype(np.float32)))
        for s in sorted((s for s in self.pr.used if s not in self.ctx.upper_bounds), key=lambda s: s.name):
            args.append(("symbol", s.name, c_symbol_name(s.name), s))
        statics = "\n".join(self.statics)
        text = "\n".join([PRELUDE, math_helpers(statics + body), statics,
                          f"void {func}({', '.join(param_of(a) for a in args)})", "{", body, "}", ""])
        return text, args

    def _input_dtype(self, name):
        for e in (x for x in walk(self.group.outputs.values()) if isinstance(x, Input) and x.name == name):
            return e.dtype
        return self.plan.graph.values[name].dtype


class PoolAnalysis:
    """The analysis step of the ``pool`` family (windowed pools in one-op groups, global pools in
    reduce groups); raises :class:`UnsupportedOperatorError` ("group <name>: <why>") otherwise."""

    family = "pool"

    def __init__(self, plan: Plan, group: Group):
        self.plan, self.group = plan, group
        self.symtab = plan.graph.symbols
        with refusals_name_group(group.name):
            self._analyze()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "plan"}

    def _fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {why}")

    def _analyze(self) -> None:
        g = self.group
        heavy = [o for o in g.ops() if o.op_type in WINDOWED + GLOBAL]
        if not heavy:
            ops = ", ".join(sorted({o.op_type for o in g.ops()})) or "-"
            self._fail(f"no MaxPool/AveragePool/GlobalAveragePool/GlobalMaxPool in the {g.kind} group ({ops})")
        if len({o.node for o in heavy}) > 1:
            self._fail("several pooling ops in one group")
        h = heavy[0]
        self.heavy = h
        self.op_type = h.op_type
        if np.dtype(h.dtype) != np.float32 or np.dtype(h.args[0].dtype) != np.float32:
            self._fail(f"{h.op_type} {h.node!r} on {np.dtype(h.args[0].dtype)}: only float32 pools")
        xshape = tuple(self.symtab.canon(d) for d in h.args[0].shape)
        if len(xshape) not in (3, 4):
            self._fail(f"{h.op_type} {h.node!r}: input of rank {len(xshape)} (only 1-D and 2-D pooling; a 3-D "
                       f"pool is compiled as two 2-D ones when the graph stage can rewrite it: explicit or VALID padding, "
                       f"or SAME with a temporal stride of 1)")
        if not xshape[1].is_Integer:
            self._fail(f"{h.op_type} {h.node!r}: symbolic channel count {xshape[1]}")
        self.x_shape = xshape
        self.C = int(xshape[1])
        self.out_shapes = {n: tuple(self.symtab.canon(d) for d in e.shape) for n, e in g.outputs.items()}
        if h.op_type in GLOBAL:
            self.windowed = False
            gen = _GlobalPoolGenerator(self.plan, g, h)
            self.source_body, self.arg_roles = gen.generate("POOL_FUNC")
            return
        self.windowed = True
        if h.num_outputs > 1:
            self._fail(f"MaxPool {h.node!r} with the Indices output (not compiled)")
        (name, out), = g.outputs.items() if len(g.outputs) == 1 else self._fail("a pool group with several outputs")
        if out is not h:
            self._fail(f"{h.op_type} {h.node!r}: the group computes more than the pool")
        src, self.x_chain = strip_views(h.args[0])
        if not isinstance(src, Input):
            self._fail(f"{h.op_type} {h.node!r}: its input is computed in the group")
        self.x_input, self.y_output = src.name, name
        kernel = h.attrs.get("kernel_shape")
        if kernel is None:
            self._fail(f"{h.op_type} {h.node!r}: no kernel_shape")
        self.win = window_of(h, [int(k) for k in np.asarray(kernel).reshape(-1)])
        if self.win.rank != len(xshape) - 2:
            self._fail(f"{h.op_type} {h.node!r}: kernel_shape of rank {self.win.rank} for a rank-{len(xshape)} input")
        self.geo = Geometry2D.of(self.win)
        self.include_pad = bool(int(h.attrs.get("count_include_pad", 0)))
        self.arg_roles = []

    def signature(self) -> str:
        return sha256_text(f"pool {structural_signature(self.group)}")[:16]

    def header(self) -> str:
        g, h = self.group, self.heavy
        lines = [f"tscomp pooling group {g.name}: {h.op_type} ({h.node})",
                 f"ONNX ops: {', '.join(f'{o.op_type} ({o.node})' for o in g.ops())}",
                 f"input [{', '.join(map(str, self.x_shape))}]"]
        if self.windowed:
            w = self.win
            lines.append(f"kernel={list(w.kernel)} strides={list(w.strides)} dilations={list(w.dilations)} "
                         f"pads={list(w.pads)} auto_pad={w.auto_pad} ceil_mode={int(w.ceil_mode)}"
                         + (f" count_include_pad={int(self.include_pad)}" if h.op_type == "AveragePool" else ""))
            lines.append("one OpenMP task per (image, channel, output row); taps as passes over the in-image columns")
        else:
            lines.append("one OpenMP task per (image, channel) row block; simd reduction over the positions; "
                         "prologue/epilogue fused")
        return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */\n"


def pool_func_name(analysis: PoolAnalysis, isa: str) -> str:
    return "tscomp_" + re.sub(r"\W", "_", analysis.group.name) + f"_pool_{isa}"


def _combine(is_max: bool, a: str, b: str) -> str:
    """C for two window values combined: their max, or their sum."""
    return f"({a} > {b} ? {a} : {b})" if is_max else f"({a} + {b})"


def windowed_source(a: PoolAnalysis, name: str) -> str:
    """The windowed pool as two separable passes per output row: the in-image kernel rows combined
    column by column into one row ``v`` (contiguous loads, whatever the stride), then the kernel
    columns combined along ``v`` -- unrolled over the KW taps for the columns whose every tap lies in
    the image, tap by tap for the few border columns. Max and sum are both separable, so this is the
    same window as KH x KW taps read from the input (a 3x3/2 MaxPool read 9 strided passes per
    output row; here 3 contiguous row passes and one unrolled column pass); the average's divisor
    is unchanged (taps in the image, or in image + padding)."""
    is_max = a.op_type == "MaxPool"
    geo = a.geo
    init = "-INFINITY" if is_max else "0.0f"
    if is_max:
        finish = "y[q] = acc[q];"
    elif a.include_pad:
        finish = "y[q] = acc[q] / ((float)hin * (float)cin[q]);"   # exact: small integer counts
    else:
        finish = "y[q] = acc[q] / ((float)hv * (float)cv[q]);"
    interior = "v[q * SW + off0]"
    for kw in range(1, geo.kw):
        interior = _combine(is_max, interior, f"v[q * SW + off0 + {kw * geo.dw}]")
    return a.header() + PRELUDE + c_defines(C_IN=a.C, KH=geo.kh, KW=geo.kw, SH=geo.sh, SW=geo.sw, DH=geo.dh,
                                            DW=geo.dw) + ts_macros(f"""
static inline int64_t min_i64(int64_t a, int64_t b) {{ return a < b ? a : b; }}
{WORKSPACE_C}
static inline int64_t max_i64(int64_t a, int64_t b) {{ return a > b ? a : b; }}

/* columns q of an output row whose tap at offset `off` (iw = q*SW + off) lies in [lo_w, hi_w) */
static inline void tap_columns(int64_t off, int64_t lo_w, int64_t hi_w, int64_t OW, int64_t* a, int64_t* b)
{{
    const int64_t d0 = lo_w - off, d1 = hi_w - 1 - off;
    const int64_t lo = d0 <= 0 ? 0 : (d0 + SW - 1) / SW;
    const int64_t hi = d1 < 0 ? 0 : min_i64(OW, d1 / SW + 1);
    *a = min_i64(lo, OW);
    *b = max_i64(*a, hi);
}}

void {name}(const float* restrict X, float* restrict Y, int64_t NB, int64_t H, int64_t W, int64_t OH, int64_t OW,
            int64_t PT, int64_t PL, int64_t PB, int64_t PR)
{{
    const int64_t n_rows = NB * C_IN * OH;
    if (n_rows <= 0 || OW <= 0) return;
    const int64_t off0 = -PL;   /* kernel column 0's offset: tap kw reads v[q * SW + off0 + kw * DW] */
    #pragma omp parallel if (n_rows * OW * KH * KW > {PARALLEL_MIN_ELEMENTS})
    {{
        /* acc [OW], then cv and cin (int32 [OW] each: AVX2 converts int32, not int64, to float in
         * vectors, so the averaging loop vectorizes), then the combined row v [W] */
        float* acc = tscomp_thread_workspace((size_t)(3 * OW + W));
        int32_t* cv = (int32_t*)(acc + OW);
        int32_t* cin = cv + OW;
        float* restrict v = (float*)(cin + OW);
        /* per column: taps in the image (cv) and in the image plus the declared padding (cin); the
         * columns [qa, qb) have every tap in the image */
        int64_t qa = 0, qb = OW;
        for (int64_t q = 0; q < OW; ++q) {{ cv[q] = 0; cin[q] = 0; }}
        for (int64_t kw = 0; kw < KW; ++kw) {{
            int64_t a, b;
            tap_columns(kw * DW - PL, 0, W, OW, &a, &b);
            for (int64_t q = a; q < b; ++q) cv[q] += 1;
            qa = max_i64(qa, a);
            qb = min_i64(qb, b);
            tap_columns(kw * DW - PL, -PL, W + PR, OW, &a, &b);
            for (int64_t q = a; q < b; ++q) cin[q] += 1;
        }}
        if (qb < qa) qb = qa;
        (void)cin; (void)cv;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < n_rows; ++r) {{
            const int64_t oh = r % OH, nc = r / OH;
            const float* restrict src = X + nc * H * W;
            float* restrict y = Y + r * OW;
            int64_t hv = 0, hin = 0;
            /* pass 1: the kernel rows in the image, combined column by column into v */
            for (int64_t kh = 0; kh < KH; ++kh) {{
                const int64_t ih = oh * SH - PT + kh * DH;
                hin += ih >= -PT && ih < H + PB;
                if (ih < 0 || ih >= H) continue;
                const float* restrict row = src + ih * W;
                if (hv++ == 0) {{
                    #pragma omp simd
                    for (int64_t w = 0; w < W; ++w) v[w] = row[w];
                }} else {{
                    #pragma omp simd
                    for (int64_t w = 0; w < W; ++w) v[w] = {_combine(is_max, "v[w]", "row[w]")};
                }}
            }}
            /* pass 2: the kernel columns along v (no kernel row in the image: the empty window) */
            if (hv == 0) {{
                for (int64_t q = 0; q < OW; ++q) acc[q] = {init};
            }} else {{
                #pragma omp simd
                for (int64_t q = qa; q < qb; ++q) acc[q] = {interior};
                for (int64_t i = 0; i < qa + OW - qb; ++i) {{   /* the border columns [0, qa) and [qb, OW) */
                    const int64_t q = i < qa ? i : qb + (i - qa);
                    float m = {init};
                    for (int64_t kw = 0; kw < KW; ++kw) {{
                        const int64_t iw = q * SW + off0 + kw * DW;
                        if (iw >= 0 && iw < W) m = {_combine(is_max, "m", "v[iw]")};
                    }}
                    acc[q] = m;
                }}
            }}
            (void)hv; (void)hin;
            #pragma omp simd
            for (int64_t q = 0; q < OW; ++q) {finish}
        }}
    }}
}}
""")


class CompiledPool(PicklableKernel):
    """The executor step of the ``pool`` family (nothing compiled until linked)."""

    TRANSIENT = {"fn": None, "_memo": dict}
    takes_out = True          # writes into the runtime's arena views when given
    family = "pool"

    def __init__(self, analysis: PoolAnalysis, isa: str):
        self.analysis = analysis
        self.group = analysis.group
        self.symtab = analysis.symtab
        self.isa = isa
        self.func = pool_func_name(analysis, isa)
        if analysis.windowed:
            self.source = windowed_source(analysis, self.func)
        else:
            self.source = analysis.header() + analysis.source_body.replace("POOL_FUNC", self.func)
        self._memo: dict = {}
        self.fn = None

    def _bind_function(self, lib) -> None:
        fn = getattr(lib, self.func)
        fn.restype = None
        if self.analysis.windowed:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 9
        else:
            fn.argtypes = [ctypes.c_int64 if role == "symbol" else ctypes.c_void_p
                           for role, *_ in self.analysis.arg_roles]
        self.fn = fn

    def _ints(self, binding):
        key = binding_key(binding)
        hit = self._memo.get(key)
        if hit is None:
            a, plain = self.analysis, dict(binding)

            def ev(x) -> int:
                return int(self.symtab.evaluate(x, plain))

            xshape = tuple(ev(d) for d in a.x_shape)
            geo = a.geo.runtime(a.win, xshape[2:]) if a.windowed else None
            shapes = {n: tuple(ev(d) for d in s) for n, s in a.out_shapes.items()}
            syms = [ev(info) for role, _, _, info in a.arg_roles if role == "symbol"]
            hit = self._memo[key] = (xshape, geo, shapes, syms, ev)
            if len(self._memo) > 4096:
                self._memo.clear()
        return hit

    def tasks(self, binding: Mapping[str, int]) -> int:
        return 1

    def native_call(self) -> NativeCall:
        """The global pool's arguments by role; a windowed pool resolves its window in Python."""
        a = self.analysis
        if a.windowed:
            x = NativeArg("view", a.x_input, views=tuple(reversed(a.x_chain))) if a.x_chain else \
                NativeArg("tensor", a.x_input, dtype="float32")
            geo = a.geo.runtime_expr(a.win, a.x_shape[2:])
            return NativeCall(self.func, (x, NativeArg("tensor", a.y_output, dtype="float32"),
                                          *[NativeArg("int", expr=e) for e in (a.x_shape[0], *geo)]))
        return NativeCall(self.func, args_by_role((role, name, info) for role, name, _, info in a.arg_roles))

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if self.fn is None:
            self._bind_function(load_library(build_library(self.source, self.func)))
        a = self.analysis
        xshape, geo, shapes, syms, ev = self._ints(binding)
        outputs = output_buffers(self.group.name, shapes, out)
        if a.windowed:
            x = np.asarray(env[a.x_input])
            for v in a.x_chain:
                x = apply_view(x, v.op, ev)
            if x.shape != xshape or x.dtype != np.float32:
                raise ExecutionError(f"group {self.group.name}: pool input {a.x_input!r} is {x.dtype}{list(x.shape)}, "
                                     f"expected float32{list(xshape)}")
            x = np.ascontiguousarray(x)
            H, W, OH, OW, PT, PL, PB, PR = geo
            self.fn(x.ctypes.data, outputs[a.y_output].ctypes.data, xshape[0], H, W, OH, OW, PT, PL, PB, PR)
            return outputs
        keep, call = [], []
        sym_values = iter(syms)
        for role, name, _, info in a.arg_roles:
            if role == "input":
                arr = np.asarray(env[name])
                if arr.dtype != info or not arr.flags.c_contiguous:
                    arr = np.ascontiguousarray(arr, dtype=info)
                keep.append(arr)
                call.append(arr.ctypes.data)
            elif role == "output":
                call.append(outputs[name].ctypes.data)
            else:
                call.append(next(sym_values))
        self.fn(*call)
        return outputs

    __call__ = run


__all__ = ["CompiledPool", "GLOBAL", "PoolAnalysis", "WINDOWED", "windowed_source"]
