"""SIMT GEMM macro-kernel with a constant weight and a fused epilogue (TSCompiler §5.1 tiling
hierarchy, §5.4 asynchronous double buffering; DietCode §4.1 local padding).

``Y[M, N] = epilogue(A[M, K] · W[K, N])`` with K and N static and M a run-time argument:

* one block per ⟨T_Mb, T_Nb⟩ output tile (grid x: M blocks, grid y: N blocks);
* the K loop stages ⟨T_Mb, T_Kb⟩ of A (transposed, k-major, one padding column against bank
  conflicts) and ⟨T_Kb, T_Nb⟩ of W in shared memory; out-of-range elements are *zero-filled
  while staging* (local padding), so the inner product has no bounds checks;
* warps own ⟨T_Mw, T_Nw⟩ sub-tiles, each thread a ⟨T_Mi, T_Ni⟩ register tile of accumulators;
* staging path selected by macro in the one source: ``TS_ASYNC_COPY`` (CUDA sm_80+, when the
  configuration asks for it) double-buffers with ``__pipeline_memcpy_async`` (cp.async, zero-fill
  for the padding) so the next tile's copy overlaps this tile's math; otherwise (OpenCL, older
  architectures) plain loads, one buffer;
* the fused epilogue (the expression IR's C statements over ``acc``, ``i``, ``j``: bias, GELU,
  residual, masks, column-range side outputs) runs on the registers; the single store is the only
  guarded access;
* a fused row reduction (LayerNorm after the residual add) is a second kernel in the same
  program, ``<name>_rows``, one thread per row over the finished Y (the CPU row pass's statements).

Everything here is text: :func:`gemm_body` is pure (the analytic ranking may call it freely).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tscomp.codegen.simt.config import WARP, SimtTile
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.errors import UnsupportedOperatorError

_PTR = {"const float*": "TS_GLOBAL const float* TS_RESTRICT", "float*": "TS_GLOBAL float* TS_RESTRICT",
        "const int64_t*": "TS_GLOBAL const int64_t* TS_RESTRICT", "const int32_t*": "TS_GLOBAL const int32_t* TS_RESTRICT",
        "int64_t": "const int64_t", "float": "const float"}


@dataclass(frozen=True)
class SimtEpilogue:
    """What the GEMM kernel fuses, in the CPU epilogue's terms (:class:`~tscomp.codegen.cpu_gemm.Epilogue`):
    ``expr`` (float over ``acc``, ``i``, ``j``), ``body`` statements run first, ``args``
    (name, C type), ``tables`` file-scope constant tables, ``row_pass`` statements over rows
    ``[m0, m0 + mv)`` of Y, ``label``/``row_label`` for the header."""
    expr: str = "acc"
    body: str = ""
    args: tuple = ()
    tables: tuple = ()
    row_pass: str = ""
    label: str = "store"
    row_label: str = ""

    @classmethod
    def from_cpu(cls, epi, a_staged: bool = False) -> "SimtEpilogue":
        """From a CPU :class:`~tscomp.codegen.cpu_gemm.Epilogue` (None: a plain store). Its A prologue
        (a CPU pre-pass) is refused unless the caller computes A while staging (``a_staged``)."""
        if epi is None:
            return cls()
        if epi.a_prologue.strip() and not a_staged:
            raise UnsupportedOperatorError("an A operand computed in the group (prologue) needs A staged from the "
                                           "expression IR")
        tables, _ = hoist_statics(epi.prelude.splitlines())
        btables, body = hoist_statics(epi.body.splitlines())
        rtables, rows = hoist_statics(epi.row_pass.splitlines())
        rows = [line for line in rows if not line.strip().startswith("#pragma omp")]
        for text in body + rows:
            if "malloc(" in text:
                raise UnsupportedOperatorError("an epilogue that allocates a row buffer")
        return cls(epi.expr, "\n".join(body), tuple((a.name, a.ctype) for a in epi.args),
                   tuple(dict.fromkeys(tables + btables + rtables)), "\n".join(rows), epi.label, epi.row_label)

    def params(self) -> str:
        out = []
        for name, ctype in self.args:
            if ctype not in _PTR:
                raise UnsupportedOperatorError(f"epilogue argument {name} of C type {ctype}")
            out.append(f", {_PTR[ctype]} {name}")
        return "".join(out)


def _indent(text: str, n: int) -> str:
    pad = " " * n
    return "\n".join(pad + line if line.strip() else line for line in text.splitlines())


@dataclass(frozen=True)
class AOperand:
    """A computed while staging: ``lines`` (statements over ``ts_i``, ``ts_k``) then ``value``; the
    fused prologue ops and views of the expression IR, so nothing is materialized before the GEMM."""
    lines: tuple
    value: str
    params: str = ""          # extra kernel parameters (", TS_GLOBAL const float* ... in0")
    decls: tuple = ()         # kernel-scope declarations (symbolic constant arrays)
    label: str = ""


def _stage(t: SimtTile, K: int, N: int, buf: str, k0: str, copy: str, a_op: AOperand | None = None) -> str:
    """Statements staging A[m0:m0+T_Mb, k0:k0+T_Kb] (k-major) and W[k0:k0+T_Kb, n0:n0+T_Nb] into
    shared buffer ``buf``, zero-filling what lies outside (local padding). ``copy`` is "plain" or
    "async" (cp.async with zero-fill; the source address is clamped into the tensor). With
    ``a_op`` each A element is computed from the expression IR (plain stores in both paths).
    Positions inside the tile are 32-bit (the tile is small); the W tile moves 16 bytes at a time
    where N is a multiple of 4 (rows 16-byte aligned, and a 4-column group lies wholly inside or
    outside N), which quarters its copies and their index arithmetic."""
    nt = t.threads
    a_ok = "gm < M" + ("" if K % t.bk == 0 else " && gk < K_")
    b_ok = " && ".join(c for c in ("" if K % t.bk == 0 else "gk < K_", "" if N % t.bn == 0 else "gn < N_") if c) or "1"
    vec = 4 if N % 4 == 0 and t.bn % 4 == 0 else 1
    if copy == "plain":
        a_st = f"As[{buf}][c][r] = ({a_ok}) ? A[gm * K_ + gk] : 0.0f;"
        b_st = (f"if ({b_ok}) TS_COPY4(&Bs[{buf}][c][r], &W[gk * N_ + gn]); else TS_ZERO4(&Bs[{buf}][c][r]);"
                if vec == 4 else f"Bs[{buf}][c][r] = ({b_ok}) ? W[gk * N_ + gn] : 0.0f;")
    else:
        a_st = f"TS_COPY_ASYNC(&As[{buf}][c][r], &A[({a_ok}) ? gm * K_ + gk : 0], {a_ok});"
        b_st = f"TS_COPY_ASYNC{16 if vec == 4 else ''}(&Bs[{buf}][c][r], &W[({b_ok}) ? gk * N_ + gn : 0], {b_ok});"
    if a_op is not None:
        a_st = f"""float v = 0.0f;   /* A computed while staging ({a_op.label}); zero outside (local padding) */
    if ({a_ok}) {{
        const int64_t ts_i = gm, ts_k = gk;
{_indent(chr(10).join(a_op.lines), 8)}
        v = {a_op.value};
    }}
    As[{buf}][c][r] = v;"""
    groups = t.bn // vec
    return f"""for (int e = (int)tid; e < {t.bm * t.bk}; e += {nt}) {{   /* A tile, coalesced along k */
    const int r = e / {t.bk}, c = e % {t.bk};
    const int64_t gm = m0 + r, gk = {k0} + c;
    {a_st}
}}
for (int e = (int)tid; e < {t.bk * groups}; e += {nt}) {{   /* W tile, coalesced along n{", 4 floats at a time" if vec == 4 else ""} */
    const int c = e / {groups}, r = (e % {groups}){" * 4" if vec == 4 else ""};
    const int64_t gk = {k0} + c, gn = n0 + r;
    {b_st}
}}"""


def _compute(t: SimtTile, buf: str) -> str:
    return f"""#pragma unroll
for (int kk = 0; kk < {t.bk}; ++kk) {{
    float a[{t.tm}], b[{t.tn}];
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r) a[r] = As[{buf}][kk][tr + r];
#pragma unroll
    for (int s = 0; s < {t.tn}; ++s) b[s] = Bs[{buf}][kk][tc + s];
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r)
#pragma unroll
        for (int s = 0; s < {t.tn}; ++s) c[r][s] = fmaf(a[r], b[s], c[r][s]);
}}"""


def _compute_mma(t: SimtTile, buf: str) -> str:
    """The warp's tensor-core inner product over one staged K tile (wmma m16n16k8, TF32): A is
    k-major in shared memory (col-major for wmma, leading dim T_Mb + 4), W row-major (T_Nb)."""
    fm, fn = t.wm // 16, t.wn // 16
    return f"""for (int kk = 0; kk < {t.bk}; kk += 8) {{
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::col_major> fa[{fm}];
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major> fb[{fn}];
#pragma unroll
    for (int x = 0; x < {fm}; ++x) {{
        nvcuda::wmma::load_matrix_sync(fa[x], &As[{buf}][kk][wr + x * 16], {t.bm + t.a_pad});
#pragma unroll
        for (int q = 0; q < fa[x].num_elements; ++q) fa[x].x[q] = nvcuda::wmma::__float_to_tf32(fa[x].x[q]);
    }}
#pragma unroll
    for (int y = 0; y < {fn}; ++y) {{
        nvcuda::wmma::load_matrix_sync(fb[y], &Bs[{buf}][kk][wc + y * 16], {t.bn});
#pragma unroll
        for (int q = 0; q < fb[y].num_elements; ++q) fb[y].x[q] = nvcuda::wmma::__float_to_tf32(fb[y].x[q]);
    }}
#pragma unroll
    for (int x = 0; x < {fm}; ++x)
#pragma unroll
        for (int y = 0; y < {fn}; ++y) nvcuda::wmma::mma_sync(fc[x][y], fa[x], fb[y], fc[x][y]);
}}"""


def _inner(t: SimtTile, buf: str) -> str:
    if not t.mma:
        return _compute(t, buf)
    return "#if TS_MMA\n" + _compute_mma(t, buf) + "\n#else\n" + _compute(t, buf) + "\n#endif"


def _mma_setup(t: SimtTile) -> str:
    fm, fn = t.wm // 16, t.wn // 16
    return f"""#if TS_MMA
    /* tensor cores: this warp's accumulators, fragment by fragment over its warp tile */
    const int wr = (int)((warp / {t.bn // t.wn}) * {t.wm}), wc = (int)((warp % {t.bn // t.wn}) * {t.wn});
    nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> fc[{fm}][{fn}];
#pragma unroll
    for (int x = 0; x < {fm}; ++x)
#pragma unroll
        for (int y = 0; y < {fn}; ++y) nvcuda::wmma::fill_fragment(fc[x][y], 0.0f);
    __shared__ float Fs[{t.warps}][16][16];   /* one fragment of each warp, on its way to the lanes' registers */
#endif"""


def _mma_gather(t: SimtTile) -> str:
    """Each warp stores its fragments one at a time; every lane copies the elements of its own
    register tile (which lies inside its warp's tile) into ``c``, so the epilogue is shared."""
    fm, fn = t.wm // 16, t.wn // 16
    return f"""#if TS_MMA
#pragma unroll
    for (int x = 0; x < {fm}; ++x)
#pragma unroll
        for (int y = 0; y < {fn}; ++y) {{
            nvcuda::wmma::store_matrix_sync(&Fs[warp][0][0], fc[x][y], 16, nvcuda::wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int r = 0; r < {t.tm}; ++r)
#pragma unroll
                for (int s = 0; s < {t.tn}; ++s) {{
                    const int fr = tr + r - wr - x * 16, fcol = tc + s - wc - y * 16;
                    if (fr >= 0 && fr < 16 && fcol >= 0 && fcol < 16) c[r][s] = Fs[warp][fr][fcol];
                }}
            __syncwarp();
        }}
#endif"""


def gemm_body(name: str, t: SimtTile, K: int, N: int, epi: SimtEpilogue | None = None, *,
              y_arg: str = "Y", a_op: AOperand | None = None) -> str:
    """The dialect-neutral SIMT text of the GEMM macro-kernel ``name`` (and ``name_rows`` when the
    epilogue has a row pass)."""
    t = t.validate()
    epi = epi or SimtEpilogue()
    kt = -(-K // t.bk)
    lanes_n = t.wn // t.tn
    warps_n = t.bn // t.wn
    names = {n for n, _ in epi.args}
    consts = "".join(f"const int64_t {v} = {val}; " for v, val in (("N", N), ("K", K)) if v not in names)
    elem = f"""{{
    const float acc = c[r][s];
    {consts}
{_indent(epi.body, 4)}
    Y[i * N_ + j] = {epi.expr};
}}"""
    plain = f"""for (int64_t k0 = 0; k0 < K_; k0 += {t.bk}) {{
{_indent(_stage(t, K, N, "0", "k0", "plain", a_op), 4)}
    TS_BARRIER();
{_indent(_inner(t, "0"), 4)}
    TS_BARRIER();
}}"""
    staging = plain
    if t.async_copy:
        staging = f"""#if TS_ASYNC_COPY
/* cp.async double buffering: the copy of tile kt+1 overlaps the math on tile kt */
{_stage(t, K, N, "0", "0", "async", a_op)}
TS_COPY_COMMIT();
for (int64_t kt = 0; kt < {kt}; ++kt) {{
    const int cur = (int)(kt & 1);
    if (kt + 1 < {kt}) {{
        const int64_t k1 = (kt + 1) * {t.bk};
        const int nxt = cur ^ 1;
{_indent(_stage(t, K, N, "nxt", "k1", "async", a_op), 8)}
    }}
    TS_COPY_COMMIT();
    TS_COPY_WAIT(1);
    TS_BARRIER();
{_indent(_inner(t, "cur"), 4)}
    TS_BARRIER();
}}
#else
/* plain staging (OpenCL, architectures without cp.async) */
{plain}
#endif"""
    tables = "\n".join(epi.tables) + ("\n" if epi.tables else "")
    # launch bounds: ptxas must keep t.threads launchable (a 1024-thread tile otherwise got 65-80 registers)
    text = f"""{tables}TS_KERNEL void TS_LAUNCH_BOUNDS({t.threads}) {name}(TS_GLOBAL const float* TS_RESTRICT A, TS_GLOBAL const float* TS_RESTRICT W,
        TS_GLOBAL float* TS_RESTRICT {y_arg}, const int64_t M{epi.params()}{a_op.params if a_op else ""})
{{
    const int64_t K_ = {K}, N_ = {N};
{_indent(chr(10).join(a_op.decls), 4) if a_op else ""}
    TS_SHARED TS_ALIGN16 float As[{t.stages}][{t.bk}][{t.bm + t.a_pad}];   /* A tile, k-major, zero-padded */
    TS_SHARED TS_ALIGN16 float Bs[{t.stages}][{t.bk}][{t.bn}];   /* W tile, zero-padded */
    const int64_t tid = TS_THREAD(0);
    const int64_t m0 = TS_BLOCK(0) * {t.bm}, n0 = TS_BLOCK(1) * {t.bn};
    const int64_t warp = tid / {WARP}, lane = tid % {WARP};
    /* this thread's register tile inside the block tile: warp tile, then lane */
    const int tr = (int)((warp / {warps_n}) * {t.wm} + (lane / {lanes_n}) * {t.tm});
    const int tc = (int)((warp % {warps_n}) * {t.wn} + (lane % {lanes_n}) * {t.tn});
    float c[{t.tm}][{t.tn}];
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r)
#pragma unroll
        for (int s = 0; s < {t.tn}; ++s) c[r][s] = 0.0f;
{_mma_setup(t) if t.mma else ""}
{_indent(staging, 4)}
{_mma_gather(t) if t.mma else ""}
    /* fused epilogue ({epi.label}) on the registers; the one guarded store */
#pragma unroll
    for (int r = 0; r < {t.tm}; ++r) {{
        const int64_t i = m0 + tr + r;
        if (i >= M) break;
#pragma unroll
        for (int s = 0; s < {t.tn}; ++s) {{
            const int64_t j = n0 + tc + s;
            if (j < N_)
{_indent(elem, 12)}
        }}
    }}
}}
"""
    text = text.replace("Y[i * N_ + j]", f"{y_arg}[i * N_ + j]")
    if epi.row_pass.strip():
        text += f"""
/* row pass ({epi.row_label or 'row reduction'}): one thread per finished row of Y */
TS_KERNEL void {name}_rows(TS_GLOBAL float* TS_RESTRICT Y, const int64_t M{epi.params()})
{{
    const int64_t m0 = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0);
    if (m0 >= M) return;
    const int64_t mv = 1;
{_indent(epi.row_pass, 4)}
}}
"""
    return text


def check_identifiers(text: str) -> None:
    """Refuse C the SIMT dialects cannot take (OpenMP pragmas, heap allocation, traps)."""
    for bad in ("#pragma omp", "malloc(", "__builtin_trap", "__atomic"):
        if bad in text:
            raise UnsupportedOperatorError(f"SIMT text contains {bad!r}")


_FUNC = re.compile(r"\W")


def kernel_name(group_name: str, t: SimtTile) -> str:
    return "tscomp_simt_" + _FUNC.sub("_", group_name) + "_" + t.slug()


__all__ = ["AOperand", "SimtEpilogue", "check_identifiers", "gemm_body", "kernel_name"]
