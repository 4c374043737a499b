"""SIMT Conv as an implicit GEMM (TSCompiler §4.2: Conv as a backbone; §5.1 tiles; DietCode §4.1
local padding), from the conv family's target-neutral analysis
(:class:`~tscomp.codegen.cpu_conv.ConvAnalysis`).

Per image n and channel group g: ``Y_g[OCg, P] = W_g[OCg, K] · col[K, P]`` with K = Cg·KH·KW
(static) and P = OH·OW (dynamic). The weight tile is staged from the constant [OC, K] matrix, the
im2col tile is *gathered while staging* straight from the NCHW input (k → channel and tap, p →
output position; taps outside the image, the padding, and anything past K or P are zero-filled), so
the inner product has no bounds checks. The fused epilogue (the Conv bias, BatchNorm as an affine,
activations, residuals: the conv family's per-element IR, over ``ts_n``, ``ts_c``, ``ts_p``,
``ts_acc``) runs on the registers before the one guarded store. Grid: x = OC blocks × P blocks,
y = N·G. Input and output sizes and pads (SAME resolved per shape) are run-time arguments.
"""
from __future__ import annotations

import re

import numpy as np

from tscomp.codegen.c_expr import c_symbol_name, delinearize
from tscomp.codegen.cpu_conv import TileEpilogue
from tscomp.codegen.kernel import KernelBase
from tscomp.codegen.simt.config import WARP, SimtTile
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.codegen.simt.gemm import _compute, _indent, check_identifiers
from tscomp.codegen.simt.launch import Launch, ceil_div, input_buffer, output_buffer, resident_buffer, scalar
from tscomp.codegen.simt.program import SessionRun, SimtProgram, header_comment
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.symbols import same
from tscomp.graph.views import apply_view

DEFAULT_TILE = SimtTile(32, 64, 8, 16, 32, 2, 8)
_CT = {np.float32: "float", np.int64: "int64_t", np.int32: "int32_t", np.uint8: "uint8_t", np.float64: "double"}


def _epilogue(an):
    """(statements over ts_n, ts_c, ts_p, ts_acc; tables; params; roles) of the fused epilogue."""
    gen = TileEpilogue(an.plan, an.group, an.heavy, an.out_shape, an.bias)
    gen.where["ts_acc"] = gen.root
    for oname, e in an.group.outputs.items():
        oshape = gen.shape(e)
        if len(oshape) == len(gen.hshape) and all(same(a, b) for a, b in zip(oshape, gen.hshape)):
            oidx = (gen.n, gen.ch) + tuple(gen.pos)
        else:
            oidx = delinearize(gen.flat, oshape, gen.ctx)
        v = gen.value(e, oidx)
        gen.emit(f"{gen.out_c[oname]}[{gen.c(gen.flat)}] = {v};")
    if gen.index_checks or gen.scratch:
        raise UnsupportedOperatorError("a Gather or a row buffer in a convolution epilogue")
    lines = [ln for ln in gen.root.render(0) if ln.strip()]
    tables, decls = hoist_statics(list(gen.decls) + list(gen.statics))
    text = "\n".join(lines + decls)
    params, roles = [], []
    for oname in an.group.outputs:
        params.append(f"TS_GLOBAL float* TS_RESTRICT {gen.out_c[oname]}")
        roles.append(("output", oname, np.dtype(np.float32)))
    for iname, cname in gen.in_c.items():
        if re.search(rf"\b{cname}\[", text + "\n".join(tables)):
            dt = np.dtype(gen._input_dtype(iname))
            if dt.type not in _CT:
                raise UnsupportedOperatorError(f"epilogue input {iname} of type {dt}")
            params.append(f"TS_GLOBAL const {_CT[dt.type]}* TS_RESTRICT {cname}")
            roles.append(("input", iname, dt))
    for s in sorted((s for s in gen.pr.used if s not in gen.ctx.upper_bounds), key=lambda s: s.name):
        params.append(f"const int64_t {c_symbol_name(s.name)}")
        roles.append(("symbol", s.name, s))
    return lines, decls, tables, params, roles


def conv_program(an, t: SimtTile) -> tuple[SimtProgram, str, list]:
    """(program, kernel name, argument roles) of the conv group ``an`` under ``t`` (pure)."""
    t = t.validate()
    if an.prologue:
        raise UnsupportedOperatorError("a prologue computing the Conv input is not staged by the SIMT conv yet")
    g = an.geo
    lines, decls, tables, params, roles = _epilogue(an)
    name = "tscomp_simt_" + re.sub(r"\W", "_", an.group.name) + "_" + t.slug()
    K, KHW = an.Cg * g.kh * g.kw, g.kh * g.kw
    nt = t.threads
    body = "\n".join(tables) + f"""
TS_KERNEL void {name}(TS_GLOBAL const float* TS_RESTRICT X, TS_GLOBAL const float* TS_RESTRICT Wt,
        const int64_t ts_N, const int64_t ts_H, const int64_t ts_W, const int64_t ts_OH, const int64_t ts_OW,
        const int64_t ts_PT, const int64_t ts_PL{''.join(', ' + p for p in params)})
{{
{_indent(chr(10).join(decls), 4)}
    TS_SHARED TS_ALIGN16 float As[1][{t.bk}][{t.bm + t.a_pad}];   /* weight tile [oc, k], k-major */
    TS_SHARED TS_ALIGN16 float Bs[1][{t.bk}][{t.bn}];            /* im2col tile [k, p], gathered, zero-padded */
    const int64_t tid = TS_THREAD(0);
    const int64_t ts_P = ts_OH * ts_OW;
    const int64_t n_mb = {ceil_div(an.OCg, t.bm)};
    const int64_t ts_n = TS_BLOCK(1) / {an.G}, ts_g = TS_BLOCK(1) % {an.G};
    const int64_t m0 = (TS_BLOCK(0) % n_mb) * {t.bm}, n0 = (TS_BLOCK(0) / n_mb) * {t.bn};
    const int64_t warp = tid / {WARP}, lane = tid % {WARP};
    const int tr = (int)((warp / {t.bn // t.wn}) * {t.wm} + (lane / {t.wn // t.tn}) * {t.tm});
    const int tc = (int)((warp % {t.bn // t.wn}) * {t.wn} + (lane % {t.wn // t.tn}) * {t.tn});
    TS_GLOBAL const float* Xg = X + (ts_n * {an.C} + ts_g * {an.Cg}) * ts_H * ts_W;
    float c[{t.tm}][{t.tn}];
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r)
#pragma unroll
        for (int s = 0; s < {t.tn}; ++s) c[r][s] = 0.0f;
    for (int64_t k0 = 0; k0 < {K}; k0 += {t.bk}) {{
        for (int64_t e = tid; e < {t.bm * t.bk}; e += {nt}) {{   /* weight tile */
            const int64_t r = e / {t.bk}, cc = e % {t.bk};
            const int64_t oc = m0 + r, k = k0 + cc;
            As[0][cc][r] = (oc < {an.OCg} && k < {K}) ? Wt[(ts_g * {an.OCg} + oc) * {K} + k] : 0.0f;
        }}
        for (int64_t e = tid; e < {t.bk * t.bn}; e += {nt}) {{   /* im2col tile, gathered from X */
            const int64_t cc = e / {t.bn}, r = e % {t.bn};
            const int64_t k = k0 + cc, p = n0 + r;
            float v = 0.0f;
            if (k < {K} && p < ts_P) {{
                const int64_t ch = k / {KHW}, kh = (k / {g.kw}) % {g.kh}, kw = k % {g.kw};
                const int64_t ih = (p / ts_OW) * {g.sh} - ts_PT + kh * {g.dh};
                const int64_t iw = (p % ts_OW) * {g.sw} - ts_PL + kw * {g.dw};
                if (ih >= 0 && ih < ts_H && iw >= 0 && iw < ts_W) v = Xg[(ch * ts_H + ih) * ts_W + iw];
            }}
            Bs[0][cc][r] = v;
        }}
        TS_BARRIER();
{_indent(_compute(t, "0"), 8)}
        TS_BARRIER();
    }}
    /* fused epilogue ({', '.join(an.fused) or 'store'}); the one guarded store */
    for (int r = 0; r < {t.tm}; ++r) {{
        const int64_t oc = m0 + tr + r;
        if (oc >= {an.OCg}) break;
        for (int s = 0; s < {t.tn}; ++s) {{
            const int64_t ts_p = n0 + tc + s;
            if (ts_p >= ts_P) break;
            const int64_t ts_c = ts_g * {an.OCg} + oc;
            const float ts_acc = c[r][s];
{_indent(chr(10).join(lines), 12)}
        }}
    }}
}}
"""
    check_identifiers(body)
    head = [f"tscomp SIMT implicit-GEMM Conv for fused group {an.group.name}",
            f"ONNX ops: {', '.join(f'{o.op_type} ({o.node})' for o in an.group.ops())}",
            f"Conv {an.heavy.node}: X [{', '.join(map(str, an.x_shape))}] * W {list(an.W.shape)}, group={an.G}, "
            f"kernel=({g.kh}, {g.kw}), strides=({g.sh}, {g.sw}), dilations=({g.dh}, {g.dw}); "
            f"per (n, g): [OCg={an.OCg}] x [K={K}] . col[K, P=OH*OW]",
            f"fused epilogue: {', '.join(an.fused) or 'store'}",
            f"tile config: SIMT {t.describe()}; im2col gathered while staging, padding zero-filled, one guarded store"]
    return SimtProgram(header_comment(head), body), name, roles


class SimtConv(KernelBase, SessionRun):
    family = "simt-conv"
    target = "cuda"

    def __init__(self, analysis, t: SimtTile = DEFAULT_TILE, device: str | None = None):
        self.analysis = analysis
        self.group = analysis.group
        self.symtab = analysis.symtab
        try:
            self.cfg = t.validate()
            self.program, self.func, self.arg_roles = conv_program(analysis, self.cfg)
        except UnsupportedOperatorError as exc:
            msg = str(exc)
            raise UnsupportedOperatorError(msg if msg.startswith("group ") else f"group {self.group.name}: {msg}") \
                from None
        self.source = self.program.cuda
        self.weight_name = analysis.weight_name
        self.packed = np.ascontiguousarray(analysis.W.reshape(analysis.OC, -1), dtype=np.float32)
        self.device = device
        self.ptxas: dict = {}

    def resources(self) -> dict[str, int]:
        return {"threads": self.cfg.threads, "shared_bytes": self.cfg.shared_bytes()}

    def _geometry(self, env, binding):
        an = self.analysis
        plain = dict(binding)
        ev = lambda x: int(self.symtab.evaluate(x, plain))   # noqa: E731
        x = np.asanyarray(env[an.x_input])   # a device value stays one; a view that moves data is refused later
        for v in an.x_chain:
            x = apply_view(x, v.op, ev)
        if x.dtype != np.float32:
            raise ExecutionError(f"group {self.group.name}: Conv input {an.x_input!r} is {x.dtype}, expected float32")
        H, W, OH, OW, pt, pl, _, _ = an.geo.runtime(an.win, tuple(x.shape[2:]))
        return x, ev, int(x.shape[0]), H, W, OH, OW, pt, pl

    def tasks(self, binding) -> int:
        an = self.analysis
        plain = dict(binding)
        P = int(np.prod([int(self.symtab.evaluate(d, plain)) for d in an.out_shape[2:]]))
        N = int(self.symtab.evaluate(an.out_shape[0], plain))
        return ceil_div(an.OCg, self.cfg.bm) * ceil_div(P, self.cfg.bn) * N * an.G

    def _launches(self, env, binding):
        an = self.analysis
        x, ev, N, H, W, OH, OW, pt, pl = self._geometry(env, binding)
        outputs, args = {}, []
        for role, name, info in self.arg_roles:
            if role == "output":
                outputs[name] = output_buffer(tuple(ev(d) for d in an.out_shapes[name]), info)
                args.append(outputs[name])
            elif role == "input":
                args.append(input_buffer(env[name], info))
            else:
                args.append(scalar(ev(info)))
        grid = (ceil_div(an.OCg, self.cfg.bm) * ceil_div(OH * OW, self.cfg.bn), N * an.G, 1)
        head = [input_buffer(x, np.float32), resident_buffer(self.packed, np.float32), scalar(N), scalar(H), scalar(W),
                scalar(OH), scalar(OW), scalar(pt), scalar(pl)]
        return [Launch(self.func, grid, (self.cfg.threads, 1, 1), head + args)], outputs


__all__ = ["DEFAULT_TILE", "SimtConv", "conv_program"]
