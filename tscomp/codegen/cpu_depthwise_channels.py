"""The channel-blocked strategy of the ``conv-depthwise`` family: SIMD lanes along the channels.

The direct depthwise kernel (:func:`tscomp.codegen.cpu_conv.depthwise_source`) vectorizes along
the output positions of one channel. That is the right axis for a wide image at stride 1; it is the
wrong one where a late stage has a few positions per channel and many channels (MobileNetV2's
960-channel 3x3 at 5x5: a 16-float vector row holds 5 useful outputs, and the per-channel setup --
planes, copies, one epilogue call -- costs more than its 225 FMAs), and where a stride of 2 makes
every input row a de-interleaving gather. onnxruntime and oneDNN run depthwise convolutions on a
channel-blocked layout (NCHWc); tscomp's tensors stay NCHW, so this strategy blocks locally: a task
(image, block of ``lanes`` channels, block of output rows) transposes the input rows it reads into
a zero-padded ``[row][column][lane]`` buffer (``lanes x lanes`` blocks transposed in registers),
computes every output position as KH x KW vector FMAs over the block's channels -- any stride and
dilation is just an address -- and transposes the finished rows back into the channel-major tile
the fused epilogue reads.

Which strategy serves which shape is the runtime's choice (TSCompiler §6): both are variants of one
group, measured side by side at the dispatch sample shapes (:func:`tscomp.compiler.measure_for_dispatch`)
and picked per shape by the wave model, whose task classes :func:`channel_block_classes` gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tscomp.codegen.cpu_gemm import _Vec
from tscomp.codegen.tile_config import VECTOR_WIDTH, TileConfigError

#: output positions one pass of the compute loop accumulates in registers: each weight vector loaded
#: (or kept) once serves this many FMAs
POSITIONS_PER_PASS = 4
#: tasks per thread the row blocking aims at when the channel blocks alone are too few
TASKS_PER_THREAD = 4


@dataclass(frozen=True)
class DepthwiseChannelBlocks:
    """The channel-blocked depthwise configuration: ``lanes`` channels per task (one vector), and
    ``budget_floats``, the per-task buffer (blocked input rows, output rows in both layouts) the
    row blocking keeps within (a quarter of L2)."""

    lanes: int
    budget_floats: int

    def validate(self, isa: str, **_) -> "DepthwiseChannelBlocks":
        if VECTOR_WIDTH.get(isa, 1) < 8 or self.lanes != VECTOR_WIDTH[isa]:
            raise TileConfigError(f"{self.describe()}: the channel-blocked depthwise kernel takes one {isa} "
                                  f"vector of channels ({VECTOR_WIDTH.get(isa)} lanes), and none on a scalar ISA")
        if self.budget_floats < 1:
            raise TileConfigError(f"{self.describe()}: budget_floats must be positive")
        return self

    def describe(self) -> str:
        return (f"channel blocks of {self.lanes} (SIMD lanes along the channels), "
                f"{self.budget_floats * 4 // 1024} KiB task buffer")

    def slug(self) -> str:
        return f"cb{self.lanes}"


def channel_blocks_config(isa: str, l2_bytes: int) -> DepthwiseChannelBlocks | None:
    """The configuration for ``isa`` (None where the ISA has no vectors to block channels into)."""
    if VECTOR_WIDTH.get(isa, 1) < 8:
        return None
    return DepthwiseChannelBlocks(VECTOR_WIDTH[isa], l2_bytes // 4 // 4)


def _ceil_div(a, b):
    return -(-a // b)


def channel_block_rows(cfg: DepthwiseChannelBlocks, geo, NB, OC: int, OH, OW, threads: int):
    """Output rows per task (the kernel computes the same rule in C): as many as keep the task's
    blocked input rows (``(R - 1) SH + (KH - 1) DH + 1`` rows of ``WP`` columns) and its output rows
    (twice: position-major, then channel-major) within the budget, and few enough that the tasks
    number ``TASKS_PER_THREAD`` per thread where the images and channel blocks alone do not.
    Scalars or numpy arrays (the dispatch grid)."""
    L = cfg.lanes
    row = ((OW - 1) * geo.sw + (geo.kw - 1) * geo.dw + 1) * L
    kr = (geo.kh - 1) * geo.dh + 1
    fit = (cfg.budget_floats - (kr - geo.sh) * row) // (geo.sh * row + 2 * OW * L)
    blocks = NB * _ceil_div(OC, L)
    want = _ceil_div(TASKS_PER_THREAD * threads, np.maximum(blocks, 1))
    balanced = _ceil_div(OH, np.maximum(want, 1))
    return np.maximum(1, np.minimum(np.minimum(OH, fit), balanced))


def channel_block_classes(cfg: DepthwiseChannelBlocks, geo, NB, OC: int, OH, OW, threads: int) -> list[tuple]:
    """The wave model's task classes: per image and channel block, the row blocks (the last one
    partial); a task's work is its outputs x taps (one vector of channels each)."""
    rows = channel_block_rows(cfg, geo, NB, OC, OH, OW, threads)
    n_rb = _ceil_div(OH, rows)
    taps = geo.kh * geo.kw * OW
    per_block = NB * _ceil_div(OC, cfg.lanes)
    return [(per_block * (n_rb - 1), rows * taps), (per_block, (OH - (n_rb - 1) * rows) * taps)]


def prepack_channel_blocks(W: np.ndarray, lanes: int) -> np.ndarray:
    """W[OC, 1, *k] -> [ceil(OC / lanes)][taps][lanes]: one vector of the block's channels per tap,
    lanes past OC zero."""
    OC = W.shape[0]
    taps = int(np.prod(W.shape[1:]))
    n_cb = _ceil_div(OC, lanes)
    blocks = np.zeros((n_cb * lanes, taps), np.float32)
    blocks[:OC] = W.reshape(OC, taps)
    out = blocks.reshape(n_cb, lanes, taps).transpose(0, 2, 1)
    raw = np.empty(out.size * 4 + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    flat = raw[off:off + out.size * 4].view(np.float32)
    flat[:] = out.reshape(-1)
    return flat


# ---------------------------------------------------------------------------- the transpose
def transpose_block_c(isa: str) -> str:
    """C of two transposes of a ``lanes x lanes`` block, ``dst[j * ldd + v] = src[v][off + j]``,
    and of ``ts_transpose_matrix`` built on them (:func:`_transpose_matrix_c`):
    ``ts_transpose_block`` (the whole block) and ``ts_transpose_block_part`` (the columns
    ``j < w`` of the source rows ``v < h``: masked loads never touch ``src[v][off + w..]`` nor
    ``src[v]`` for ``v >= h``; ``w`` rows of ``dst`` are stored, each with its lanes ``v < h``
    only). The partial form serves a row or a position count that is not a whole number of vectors
    (a 14-wide image row, the last positions of a tile), which a scalar loop transposed one float
    at a time (MobileNetV2's 576-channel stride-2 depthwise at 14x14: 25.5 us, 15.9 us with it).

    The coarse part of the transpose is done by the loads: register ``4I + k`` takes, in its 128-bit
    lane J, the 4 floats of row ``4J + k`` at columns ``4I .. 4I + 3`` (a load port op, where a
    lane-crossing shuffle per register and stage would queue on the shuffle unit: 1.3x faster than
    four butterfly stages of two-source permutes on Zen 4); then each group of 4 registers is one
    4x4 transpose within every 128-bit lane (unpack by floats, then by pairs), which leaves register
    ``4I + k`` holding column ``4I + k`` over all rows."""
    return "\n".join([_transpose_c(isa, partial=False), _transpose_c(isa, partial=True), _transpose_matrix_c(isa)])


def _transpose_matrix_c(isa: str) -> str:
    """C of ``ts_transpose_matrix``: any matrix whose rows are ``stride`` floats apart transposed
    a block at a time, the whole-block transpose inside, the partial one at the edges -- the loop
    every caller (a task's tile back to channel-major, a blocked input's column gather, a tile into
    a blocked output) would otherwise write around the two."""
    L = VECTOR_WIDTH[isa]
    return f"""/* dst[j * ldd + p] = src[p * stride + j] for p < rows, j < cols, {L} x {L} blocks at a time */
static inline void ts_transpose_matrix(const float* restrict src, int64_t stride, int64_t rows, int64_t cols,
                                       float* restrict dst, int64_t ldd)
{{
    const float* r[{L}];
    for (int64_t p = 0; p < rows; p += {L}) {{
        const int64_t h = rows - p < {L} ? rows - p : {L};
        for (int64_t v = 0; v < h; ++v) r[v] = src + (p + v) * stride;
        for (int64_t j = 0; j < cols; j += {L}) {{
            const int64_t w = cols - j < {L} ? cols - j : {L};
            if (h == {L} && w == {L}) ts_transpose_block(r, j, dst + j * ldd + p, ldd);
            else ts_transpose_block_part(r, j, dst + j * ldd + p, ldd, w, h);
        }}
    }}
}}"""


def _transpose_c(isa: str, partial: bool) -> str:
    """One transpose function (see :func:`transpose_block_c`)."""
    L = VECTOR_WIDTH[isa]
    v = _Vec(isa)
    p = {"avx512": "_mm512", "avx2": "_mm256"}[isa]
    pd = {"avx512": "__m512d", "avx2": "__m256d"}[isa]
    ins = "_mm512_insertf32x4" if isa == "avx512" else "_mm256_insertf128_ps"
    name = "ts_transpose_block" + ("_part" if partial else "")
    lines = [f"/* dst[j * ldd + v] = src[v][off + j], v, j < {L}" + (", j < w, v < h only" if partial else "") + " */",
             f"static inline __attribute__((always_inline)) void {name}("
             f"const float* const* restrict src, int64_t off, float* restrict dst, int64_t ldd"
             + (", int64_t w, int64_t h" if partial else "") + ")", "{"]
    rows = "src"
    if partial:      # rows past h read row 0 (a valid address: those lanes are never stored)
        rows = "s"
        lines.append(f"    const float* s[{L}];")
        lines += [f"    s[{r}] = src[{r} < h ? {r} : 0];" for r in range(L)]
        for I in range(L // 4):          # the columns 4I..4I+3 that exist
            if isa == "avx512":
                lines.append(f"    const __mmask8 m{I} = (__mmask8)(w >= {4 * I + 4} ? 0xF : w > {4 * I} ? "
                             f"(1u << (w - {4 * I})) - 1 : 0);")
            else:
                lines.append(f"    const __m128i m{I} = _mm_cmpgt_epi32(_mm_set1_epi32((int)(w - {4 * I})), "
                             f"_mm_setr_epi32(0, 1, 2, 3));")
        if isa == "avx512":
            lines.append("    const __mmask16 hm = (__mmask16)((1u << h) - 1);")
        else:
            lines.append("    const __m256i hm = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)h), "
                         "_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));")

    def load(row: int, col: int) -> str:
        ptr = f"{rows}[{row}] + off + {col}"
        if not partial:
            return f"_mm_loadu_ps({ptr})"
        if isa == "avx512":       # masked-off lanes are not read (no fault past the row's end)
            return f"_mm_maskz_loadu_ps(m{col // 4}, {ptr})"
        return f"_mm_maskload_ps({ptr}, m{col // 4})"

    for I in range(L // 4):
        for k in range(4):
            r = f"r{4 * I + k}"
            lines.append(f"    {v.type} {r} = {p}_castps128_ps{L * 32}({load(k, 4 * I)});")
            for J in range(1, L // 4):
                lines.append(f"    {r} = {ins}({r}, {load(4 * J + k, 4 * I)}, {J});")
    for I in range(L // 4):
        a, b, c, d = (f"r{4 * I + k}" for k in range(4))
        lines += [f"    {{   /* columns {4 * I}..{4 * I + 3}: a 4x4 transpose in every 128-bit lane */",
                  f"        const {v.type} t0 = {p}_unpacklo_ps({a}, {b}), t1 = {p}_unpackhi_ps({a}, {b});",
                  f"        const {v.type} t2 = {p}_unpacklo_ps({c}, {d}), t3 = {p}_unpackhi_ps({c}, {d});"]
        for k, (op, x, y) in enumerate((("lo", 0, 2), ("hi", 0, 2), ("lo", 1, 3), ("hi", 1, 3))):
            lines.append(f"        r{4 * I + k} = {p}_castpd_ps({p}_unpack{op}_pd(({pd})t{x}, ({pd})t{y}));")
        lines.append("    }")
    for j in range(L):
        if not partial:
            lines.append(f"    {v.store(f'dst + {j} * ldd', f'r{j}')}")
        elif isa == "avx512":
            lines.append(f"    if (w > {j}) _mm512_mask_storeu_ps(dst + {j} * ldd, hm, r{j});")
        else:
            lines.append(f"    if (w > {j}) _mm256_maskstore_ps(dst + {j} * ldd, hm, r{j});")
    lines.append("}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the kernel
def _compute_pass(v: _Vec, geo, positions: int, row: str = "ROW") -> list[str]:
    """One pass over ``positions`` consecutive outputs of a row: every tap's weight vector times the
    block's input vector at that tap, accumulated in registers and stored position-major (``row``:
    the C name of the input row stride)."""
    L = v.width
    out = [f"const float* restrict xp = xr + ow * {geo.sw * L};"]
    out += [f"{v.type} a{j} = {v.zero()};" for j in range(positions)]
    for kh in range(geo.kh):
        for kw in range(geo.kw):
            t = kh * geo.kw + kw
            for j in range(positions):
                off = f"{kh * geo.dh} * {row} + {(kw * geo.dw + j * geo.sw) * L}" if kh else \
                    f"{(kw * geo.dw + j * geo.sw) * L}"
                out.append(f"a{j} = {v.fma(f'w{t}', v.load(f'xp + {off}'), f'a{j}')};")
    out += [v.store(f"o + (ow + {j}) * {L}", f"a{j}") for j in range(positions)]
    return out


def channel_blocked_source(analysis, cfg: DepthwiseChannelBlocks, isa: str) -> str:
    """The source step of the channel-blocked depthwise variant (pure): C text."""
    from tscomp.codegen.cpu_conv import (_epi_params, _prologue_call, _runtime_params, c_defines, conv_func_name,
                                         direct_kernel_preamble)
    a, geo = analysis, analysis.geo
    cfg.validate(isa)
    v, L = _Vec(isa), cfg.lanes
    taps = geo.kh * geo.kw
    name = conv_func_name(a, cfg, isa)
    params, names, pro_names = _epi_params(a)
    P = POSITIONS_PER_PASS
    weights = "\n".join(f"            const {v.type} w{t} = {v.load(f'wb + {t * L}')};" for t in range(taps))
    full = "\n".join("                    " + s for s in _compute_pass(v, geo, P))
    single = "\n".join("                    " + s for s in _compute_pass(v, geo, 1))
    header = a.header("direct depthwise, channel-blocked",
                      f"{cfg.describe()}; one OpenMP task per (image, block of {L} channels, block of output "
                      f"rows); the input rows " + ("read in place from the channel-blocked input (the border one position "
                                                    "at a time)" if a.x_lanes else
                                                    "transposed into [row][column][channel] blocks")
                      + f", {P} output positions x {geo.kh}x{geo.kw} taps per pass as {isa} FMAs, "
                      + ("the fused epilogue storing each row channel-blocked" if a.y_lanes else
                         "the rows transposed back for the fused epilogue"))
    defines = c_defines(C_IN=a.C, OCG=a.OCg, OC=a.OC, KH=geo.kh, KW=geo.kw, SH=geo.sh, SW=geo.sw, DH=geo.dh, DW=geo.dw,
                        LANES=L, BUDGET=cfg.budget_floats, TASKS_PER_THREAD=TASKS_PER_THREAD)
    gather = _gather_rows(a.x_lanes)
    finish = _finish_block(a.y_lanes, names)
    after_row = _row_epilogue(a.y_lanes, names)
    if a.x_lanes:
        direct_full = "\n".join("                        " + s for s in _compute_pass(v, geo, P, "ROWD"))
        direct_single = "\n".join("                        " + s for s in _compute_pass(v, geo, 1, "ROWD"))
        compute = _direct_rows(P, direct_full, direct_single, after_row)
    else:
        compute = _padded_rows(P, full, single, after_row)
    return "\n".join([header, *direct_kernel_preamble(a, defines, transpose_block_c(isa)),
                      _border_position_c(v) if a.x_lanes else "", f"""
/* Channel-blocked depthwise macro-kernel: output channel oc reads input channel oc / OCG. Per task, xb
 * holds the IR input rows its outputs read as [row][padded column][lane] (WP columns: input column
 * c - PL, zero outside the image), ob the finished outputs position-major, tile the same outputs
 * channel-major for the epilogue. */
void {name}({_runtime_params()}{params})
{{
    const int64_t P = OH * OW;
    if (NB <= 0 || P <= 0) return;{_prologue_call(a, pro_names)}
    const int64_t WP = (OW - 1) * TS_SW + (TS_KW - 1) * TS_DW + 1, ROW = WP * TS_LANES;
    const int64_t KR = (TS_KH - 1) * TS_DH + 1;
    /* output rows per task (channel_block_rows in Python computes the same) */
    const int64_t fit = (TS_BUDGET - (KR - TS_SH) * ROW) / (TS_SH * ROW + 2 * OW * TS_LANES);
    const int64_t n_cb = (TS_OC + TS_LANES - 1) / TS_LANES, blocks = NB * n_cb;
    const int64_t want = (TS_TASKS_PER_THREAD * omp_get_max_threads() + blocks - 1) / blocks;
    const int64_t rows = max_i64(1, min_i64(min_i64(OH, fit), (OH + want - 1) / want));
    const int64_t n_rb = (OH + rows - 1) / rows, n_tasks = blocks * n_rb;
    const int64_t IRMAX = (rows - 1) * TS_SH + KR;
    #pragma omp parallel if (n_tasks > 1)
    {{
        float* restrict xb = tscomp_thread_workspace((size_t)(IRMAX * ROW + 2 * rows * OW * TS_LANES));
        float* restrict ob = xb + IRMAX * ROW;
        float* restrict tile = ob + rows * OW * TS_LANES;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; ++t) {{
            const int64_t rb = t % n_rb, cblk = (t / n_rb) % n_cb, n = t / (n_rb * n_cb);
            const int64_t oh0 = rb * rows, R = min_i64(OH, oh0 + rows) - oh0, c0 = cblk * TS_LANES;
            const int64_t CV = min_i64(TS_LANES, TS_OC - c0), IR = (R - 1) * TS_SH + KR;
{gather}
            const float* restrict wb = Wp + cblk * (TS_KH * TS_KW * TS_LANES);
{weights}
{compute}
{finish}
        }}
    }}
}}
"""])


def _row_epilogue(y_lanes: int, names: str) -> str:
    """C after each output row: a channel-blocked output's fused epilogue runs on the row just
    computed (still in L1), not on the whole block afterwards; an NCHW one waits for the block."""
    if not y_lanes:
        return ""
    return f"""
                conv_epilogue(o, TS_LANES, n, cblk, 0, (oh0 + r) * OW, CV, OW{names});   /* stored channel-blocked */"""


def _padded_rows(P: int, full: str, single: str, after_row: str = "") -> str:
    """C computing a task's output rows from its zero-padded rows ``xb``."""
    return f"""            for (int64_t r = 0; r < R; ++r) {{
                const float* restrict xr = xb + r * TS_SH * ROW;   /* the first input row output row r reads */
                float* restrict o = ob + r * OW * TS_LANES;
                int64_t ow = 0;
                for (; ow + {P} <= OW; ow += {P}) {{
{full}
                }}
                for (; ow < OW; ++ow) {{
{single}
                }}{after_row}
            }}"""


def _direct_rows(P: int, full: str, single: str, after_row: str = "") -> str:
    """C computing a task's output rows straight from a channel-blocked input, whose rows are the
    [column][lane] rows the passes read: the positions whose taps all fall inside the image run the
    register passes on the input itself; the image's border (a padded row, the first and last
    columns) sums its in-image taps one position at a time. Nothing is copied."""
    return f"""            const float* restrict xblk = X + (n * n_cb + cblk) * H * W * TS_LANES;
            const int64_t ROWD = W * TS_LANES;
            /* output columns whose taps are all inside the image: ow_lo <= ow < ow_hi */
            const int64_t ow_lo = min_i64(OW, (PL + TS_SW - 1) / TS_SW);
            const int64_t last = W - 1 + PL - (TS_KW - 1) * TS_DW;
            const int64_t ow_hi = last < 0 ? ow_lo : max_i64(ow_lo, min_i64(OW, last / TS_SW + 1));
            for (int64_t r = 0; r < R; ++r) {{
                const int64_t ih0 = (oh0 + r) * TS_SH - PT;
                float* restrict o = ob + r * OW * TS_LANES;
                int64_t ow = 0;
                if (ih0 < 0 || ih0 + (TS_KH - 1) * TS_DH >= H) {{   /* a row of the border */
                    for (; ow < OW; ++ow) ts_border_position(xblk, H, W, wb, ih0, ow * TS_SW - PL, o + ow * TS_LANES);
                }} else {{
                    for (; ow < ow_lo; ++ow) ts_border_position(xblk, H, W, wb, ih0, ow * TS_SW - PL, o + ow * TS_LANES);
                    const float* restrict xr = xblk + (ih0 * W - PL) * TS_LANES;   /* column -PL of row ih0 */
                    for (; ow + {P} <= ow_hi; ow += {P}) {{
{full}
                    }}
                    for (; ow < ow_hi; ++ow) {{
{single}
                    }}
                    for (; ow < OW; ++ow) ts_border_position(xblk, H, W, wb, ih0, ow * TS_SW - PL, o + ow * TS_LANES);
                }}{after_row}
            }}"""


def _border_position_c(v: _Vec) -> str:
    """C of one output position at the image's border: its taps inside the image, summed."""
    return f"""/* One output position whose window leaves the image (its top-left tap at row ih0, column iw0):
 * the taps inside the image, summed; the padding's taps contribute nothing. */
static inline void ts_border_position(const float* restrict xblk, int64_t H, int64_t W, const float* restrict wb,
                                      int64_t ih0, int64_t iw0, float* restrict o)
{{
    {v.type} acc = {v.zero()};
    for (int64_t kh = 0; kh < TS_KH; ++kh) {{
        const int64_t ih = ih0 + kh * TS_DH;
        if (ih < 0 || ih >= H) continue;
        for (int64_t kw = 0; kw < TS_KW; ++kw) {{
            const int64_t iw = iw0 + kw * TS_DW;
            if (iw < 0 || iw >= W) continue;
            acc = {v.fma(v.load("wb + (kh * TS_KW + kw) * TS_LANES"), v.load("xblk + (ih * W + iw) * TS_LANES"), "acc")};
        }}
    }}
    {v.store("o", "acc")}
}}
"""


def _gather_rows(x_lanes: int) -> str:
    """C of a task's input rows into ``xb`` ([row][padded column][lane]), transposed from NCHW; none
    from a channel-blocked input, whose rows the passes read directly (:func:`_direct_rows`)."""
    if x_lanes:
        return ""
    return """            /* the input rows, transposed; lanes past OC read the last channel (their weights are 0) */
            const float* src[TS_LANES];
            for (int64_t l = 0; l < TS_LANES; ++l)
                src[l] = X + (n * TS_C_IN + min_i64(c0 + l, TS_OC - 1) / TS_OCG) * H * W;
            const int64_t c_lo = min_i64(WP, PL), c_hi = max_i64(c_lo, min_i64(WP, PL + W));
            for (int64_t r = 0; r < IR; ++r) {
                float* restrict dst = xb + r * ROW;
                const int64_t ih = oh0 * TS_SH - PT + r;
                if (ih < 0 || ih >= H) {
                    memset(dst, 0, (size_t)ROW * sizeof(float));
                    continue;
                }
                memset(dst, 0, (size_t)(c_lo * TS_LANES) * sizeof(float));
                memset(dst + c_hi * TS_LANES, 0, (size_t)((WP - c_hi) * TS_LANES) * sizeof(float));
                const int64_t base = ih * W - PL;
                int64_t c = c_lo;
                for (; c + TS_LANES <= c_hi; c += TS_LANES)
                    ts_transpose_block(src, base + c, dst + c * TS_LANES, TS_LANES);
                if (c < c_hi)       /* the last columns: masked loads, no read past the row */
                    ts_transpose_block_part(src, base + c, dst + c * TS_LANES, TS_LANES, c_hi - c, TS_LANES);
            }"""


def _finish_block(y_lanes: int, names: str) -> str:
    """C of a task's finished outputs (``ob``, position-major) through the fused epilogue: straight
    into a channel-blocked output, or transposed to channel-major first for an NCHW one."""
    if y_lanes:
        return "            /* the fused epilogue ran after each row (_row_epilogue) */"
    return f"""            /* back to channel-major: tile[l][p] = ob[p][l], then the fused epilogue over the block */
            const int64_t F = R * OW;
            ts_transpose_matrix(ob, TS_LANES, F, TS_LANES, tile, F);
            conv_epilogue(tile, F, n, c0, oh0 * OW, CV, F{names});"""


__all__ = ["DepthwiseChannelBlocks", "POSITIONS_PER_PASS", "channel_block_classes", "channel_block_rows",
           "channel_blocked_source", "channel_blocks_config", "prepack_channel_blocks", "transpose_block_c"]
