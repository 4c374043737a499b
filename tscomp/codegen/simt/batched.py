"""SIMT batched GEMM with two activation operands (attention's Q·Kᵀ and P·V, any transposition;
TSCompiler §5.1 tiles, DietCode §4.1 local padding), from the batched family's target-neutral
analysis (:class:`~tscomp.codegen.cpu_batched_gemm.BatchedGemmAnalysis`).

``C[b, m, n] = Σ_k A[b, m, k] · B[b, k, n]`` with NB, M, N, K all run-time arguments. A and B are
expressions of group inputs (views of the fused QKV tensor, the 1/√d scales, the IsNaN/Where on the
softmax result): each staged element is computed from the expression IR *while staging* (the fused
prologue), zero outside the tile (local padding); the block tile lives in shared memory, the
thread's register tile accumulates, the epilogue (head merge reshape, scales) runs on the registers
before the one guarded store. Grid: x = M blocks × N blocks, y = NB.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from tscomp.codegen.c_expr import broadcast_index, c_symbol_name, delinearize, reshape_index
from tscomp.codegen.cpu_batched_gemm import _Generator
from tscomp.codegen.kernel import KernelBase
from tscomp.codegen.simt.config import WARP, SimtTile
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.codegen.simt.gemm import _compute, _indent, check_identifiers
from tscomp.codegen.simt.launch import Launch, ceil_div, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SessionRun, SimtProgram, header_comment
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.expr import Input, walk

DEFAULT_TILE = SimtTile(32, 32, 8, 16, 16, 2, 4)


def batched_program(an, t: SimtTile) -> tuple[SimtProgram, str, list]:
    """(program, kernel name, argument roles) of the batched group ``an`` under tile ``t`` (pure)."""
    t = t.validate()
    g, h = an.group, an.heavy
    gen = _Generator(an.plan, g, h)
    ctx = gen.ctx
    vb, vi, vj, vk = (ctx.var(n, e) for n, e in (("ts_b", an.NB), ("ts_i", an.M), ("ts_j", an.N), ("ts_k", an.K)))
    hb = an.hshape[:-2]
    bidx = delinearize(vb, hb, ctx) if hb else ()

    def operand(e, idx):
        full = tuple(bidx) + tuple(idx)
        src = broadcast_index(full, an.hshape[:-2] + tuple(an.shape_of(e)[-2:]), an.shape_of(e))
        gen.begin()
        v = gen.value(e, src)
        return v, gen.lines(0)

    a_val, a_lines = operand(h.args[0], (vi, vk))
    b_val, b_lines = operand(h.args[1], (vk, vj))
    heavy_idx = tuple(bidx) + (vi, vj)
    out_idx = {}
    for name, e in g.outputs.items():
        shape = an.out_shapes[name]
        idx = tuple(ctx.simplify(x) for x in reshape_index(heavy_idx, an.hshape, shape, ctx))
        out_idx[name] = idx
        gen.begin()
        gen.probe = []
        gen.value(e, idx)
        for p in gen.probe:
            if not gen.reads_here(p, heavy_idx):
                raise UnsupportedOperatorError(f"group {g.name}: output {name} reads the MatMul elsewhere than at "
                                               f"the element it stores")
        gen.probe = None
    gen.begin()
    gen.expect = heavy_idx
    out_c = {name: f"out{k}" for k, name in enumerate(g.outputs)}
    stores = [f"{out_c[n]}[(ts_b * ts_M + ts_i) * ts_N + ts_j] = {gen.value(e, out_idx[n])};"
              for n, e in g.outputs.items()]
    epi_lines = gen.lines(0)
    text = "\n".join(a_lines + b_lines + epi_lines + stores + gen.decls + gen.statics)
    roles, params = [], []
    dtypes = {x.name: np.dtype(x.dtype) for x in walk(g.outputs.values()) if isinstance(x, Input)}
    for name, cname in gen.in_c.items():
        if re.search(rf"\b{cname}\[", text):
            dt = dtypes.get(name, np.dtype(an.plan.graph.values[name].dtype))
            params.append(f"TS_GLOBAL const {gen.ctype(dt)}* TS_RESTRICT {cname}")
            roles.append(("input", name, dt))
    for name, e in g.outputs.items():
        params.append(f"TS_GLOBAL {gen.ctype(e.dtype)}* TS_RESTRICT {out_c[name]}")
        roles.append(("output", name, np.dtype(e.dtype)))
    params += ["const int64_t ts_NB", "const int64_t ts_M", "const int64_t ts_N", "const int64_t ts_K"]
    for s in sorted((s for s in gen.pr.used if s not in ctx.upper_bounds), key=lambda s: s.name):
        params.append(f"const int64_t {c_symbol_name(s.name)}")
        roles.append(("symbol", s.name, s))
    tables, decls = hoist_statics(list(gen.statics) + list(gen.decls))
    name = "tscomp_simt_" + re.sub(r"\W", "_", g.name) + "_" + t.slug()
    nt = t.threads
    body = "\n".join(tables) + f"""
TS_KERNEL void {name}({', '.join(params)})
{{
{_indent(chr(10).join(decls), 4)}
    TS_SHARED TS_ALIGN16 float As[1][{t.bk}][{t.bm + t.a_pad}];   /* A tile, k-major, prologue applied, zero-padded */
    TS_SHARED TS_ALIGN16 float Bs[1][{t.bk}][{t.bn}];            /* B tile, prologue applied, zero-padded */
    const int64_t tid = TS_THREAD(0);
    const int64_t n_mb = (ts_M + {t.bm - 1}) / {t.bm};
    const int64_t ts_b = TS_BLOCK(1);
    const int64_t m0 = (TS_BLOCK(0) % n_mb) * {t.bm}, n0 = (TS_BLOCK(0) / n_mb) * {t.bn};
    const int64_t warp = tid / {WARP}, lane = tid % {WARP};
    const int tr = (int)((warp / {t.bn // t.wn}) * {t.wm} + (lane / {t.wn // t.tn}) * {t.tm});
    const int tc = (int)((warp % {t.bn // t.wn}) * {t.wn} + (lane % {t.wn // t.tn}) * {t.tn});
    float c[{t.tm}][{t.tn}];
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r)
#pragma unroll
        for (int s = 0; s < {t.tn}; ++s) c[r][s] = 0.0f;
    for (int64_t k0 = 0; k0 < ts_K; k0 += {t.bk}) {{
        for (int64_t e = tid; e < {t.bm * t.bk}; e += {nt}) {{   /* stage A (prologue fused) */
            const int64_t r = e / {t.bk}, cc = e % {t.bk};
            const int64_t ts_i = m0 + r, ts_k = k0 + cc;
            float v = 0.0f;
            if (ts_i < ts_M && ts_k < ts_K) {{
{_indent(chr(10).join(a_lines), 16)}
                v = {a_val};
            }}
            As[0][cc][r] = v;
        }}
        for (int64_t e = tid; e < {t.bk * t.bn}; e += {nt}) {{   /* stage B (prologue fused) */
            const int64_t cc = e / {t.bn}, r = e % {t.bn};
            const int64_t ts_k = k0 + cc, ts_j = n0 + r;
            float v = 0.0f;
            if (ts_j < ts_N && ts_k < ts_K) {{
{_indent(chr(10).join(b_lines), 16)}
                v = {b_val};
            }}
            Bs[0][cc][r] = v;
        }}
        TS_BARRIER();
{_indent(_compute(t, "0"), 8)}
        TS_BARRIER();
    }}
    /* fused epilogue ({' + '.join(o.op_type for o in an.epi) or 'store'}); the one guarded store */
    for (int r = 0; r < {t.tm}; ++r) {{
        const int64_t ts_i = m0 + tr + r;
        if (ts_i >= ts_M) break;
        for (int s = 0; s < {t.tn}; ++s) {{
            const int64_t ts_j = n0 + tc + s;
            if (ts_j >= ts_N) break;
            const float acc = c[r][s];
{_indent(chr(10).join(epi_lines + stores), 12)}
        }}
    }}
}}
"""
    check_identifiers(body)
    lines = [f"tscomp SIMT batched GEMM for fused group {g.name}",
             f"ONNX ops: {', '.join(f'{o.op_type} ({o.node})' for o in g.ops())}",
             f"C[NB={an.NB}, M={an.M}, N={an.N}] = A[.., K={an.K}] . B; prologue (while staging): "
             f"{', '.join(o.op_type for o in an.pro) or 'views only'}; epilogue: "
             f"{', '.join(o.op_type for o in an.epi) or '-'}",
             f"tile config: SIMT {t.describe()}; local padding while staging, one guarded store"]
    return SimtProgram(header_comment(lines), body), name, roles


class SimtBatchedGemm(KernelBase, SessionRun):
    family = "simt-batched-gemm"
    target = "cuda"

    def __init__(self, analysis, t: SimtTile = DEFAULT_TILE, device: str | None = None):
        self.analysis = analysis
        self.group = analysis.group
        self.symtab = analysis.plan.graph.symbols
        try:
            self.cfg = t.validate()
            self.program, self.func, self.arg_roles = batched_program(analysis, self.cfg)
        except UnsupportedOperatorError as exc:
            msg = str(exc)
            raise UnsupportedOperatorError(msg if msg.startswith("group ") else f"group {self.group.name}: {msg}") \
                from None
        self.source = self.program.cuda
        self.device = device
        self.ptxas: dict = {}

    def resources(self) -> dict[str, int]:
        return {"threads": self.cfg.threads, "shared_bytes": self.cfg.shared_bytes()}

    def _ev(self, binding):
        plain = dict(binding)
        return lambda x: int(self.symtab.evaluate(x, plain))

    def tasks(self, binding: Mapping[str, int]) -> int:
        ev, an = self._ev(binding), self.analysis
        return ceil_div(ev(an.M), self.cfg.bm) * ceil_div(ev(an.N), self.cfg.bn) * ev(an.NB)

    def _launches(self, env, binding):
        ev, an = self._ev(binding), self.analysis
        NB, M, N, K = (ev(x) for x in (an.NB, an.M, an.N, an.K))
        outputs, args = {}, []
        for role, name, info in self.arg_roles:
            if role == "input":
                args.append(input_buffer(env[name], info))
            elif role == "output":
                outputs[name] = output_buffer(tuple(ev(d) for d in an.out_shapes[name]), info)
                args.append(outputs[name])
        args += [scalar(NB), scalar(M), scalar(N), scalar(K)]
        args += [scalar(ev(info)) for role, _, info in self.arg_roles if role == "symbol"]
        grid = (ceil_div(M, self.cfg.bm) * ceil_div(N, self.cfg.bn), NB, 1)
        return [Launch(self.func, grid, (self.cfg.threads, 1, 1), args)], outputs


__all__ = ["DEFAULT_TILE", "SimtBatchedGemm", "batched_program"]
