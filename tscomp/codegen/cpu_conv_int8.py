"""The implicit-GEMM Conv on int8 instructions: a quantized model's Conv of two integer operands
(:func:`tscomp.graph.quantized_arithmetic._dequantized_conv`: the activation's integer part, which
spans at most 256 values, and an int8 weight) with VPDPBUSD, exact int32 sums.

The same macro-kernel as the fp32 one (:func:`tscomp.codegen.cpu_conv.conv_source`, lanes along the
positions) with three changes, the GEMM's int8 mode (:mod:`tscomp.codegen.cpu_gemm`) transposed:

* the weight panels hold **s8 quads**: per MR-row panel, k-major in steps of 4, each row's four k
  values one 32-bit lane (``packed[g][panel][k / 4][r]``, K padded to a multiple of 4 with zeros),
  followed by every output channel's int32 correction ``XLO * sum_k W[oc, k]``;
* each gathered column block (floats holding integers in [XLO, XLO + 255]; the image's zero padding
  is the integer 0, which the range includes) is turned into **u8 quads**: row ``q`` of the quad
  block holds, per position, the bytes ``X - XLO`` of rows 4q .. 4q + 3 (:data:`PACK_QUADS_C`) --
  a 1x1 Conv's straight from X, whose channel rows are the block's rows, and a Conv with phase
  planes straight from them (no float block first: that gather, a copy, and its conversion cost
  a large share of the VPDPBUSD work they feed where OC is small);
* the register tile accumulates in int32 (``acc += u8 quads x broadcast s8 quad``), starts from the
  correction (so the sum is that of ``X``, not of ``X - XLO``), keeps int32 partial sums between K
  steps, and converts once to float before the unchanged fp32 epilogue (the scales, the bias).

The sums are exact (|X| <= 255, |W| <= 128: K up to 65536 stays inside int32), where fp32 FMAs on
the same integers round every partial sum past 2^24 -- onnxruntime's int8 Conv adds in int32 too.
"""
from __future__ import annotations

import numpy as np

from tscomp.codegen.cpu_gemm import INT8_K_QUAD, INT8_MAX_K, int8_weight_fits

#: the quantized activation's values a byte holds: X - XLO in [0, 255]
BYTE_VALUES = 256


def conv_int8_x_offset(x_range: tuple[int, int] | None, W: np.ndarray, K: int) -> int | None:
    """XLO, the value the gathered bytes are offset by, where a Conv fits VPDPBUSD's unsigned x
    signed bytes: the input's recorded integer range and 0 (the padding) within 256 values, the
    weight integers in [-128, 127], K inside int32's reach; else None."""
    if x_range is None or K > INT8_MAX_K or not int8_weight_fits(W):
        return None
    lo, hi = min(int(x_range[0]), 0), max(int(x_range[1]), 0)
    return lo if hi - lo < BYTE_VALUES else None


def prepack_conv_weight_int8(W: np.ndarray, G: int, mr: int, x_offset: int) -> np.ndarray:
    """W[OC, Cg, *k] (integers in [-128, 127]) -> per group g, MR-row panels of W_g[OCg, K] as s8
    quads (``[g][panel][k / 4][r][k % 4]``, K and the rows past OCg zero-padded), then the int32
    corrections ``x_offset * sum_k W[oc, k]`` per padded row (``[g][panel * MR + r]``); one
    64-byte-aligned buffer of 32-bit words (a quad or a correction each, as the int8 GEMM's)."""
    OC = W.shape[0]
    OCg = OC // G
    K = int(np.prod(W.shape[1:]))
    n_ocp = -(-OCg // mr)
    kq = -(-K // INT8_K_QUAD)
    Wg = np.zeros((G, n_ocp * mr, kq * INT8_K_QUAD), np.int8)
    Wg[:, :OCg, :K] = W.reshape(G, OCg, K).astype(np.int8)
    quads = Wg.reshape(G, n_ocp, mr, kq, INT8_K_QUAD).transpose(0, 1, 3, 2, 4)
    corrections = (np.int64(x_offset) * Wg.astype(np.int64).sum(axis=2)).astype(np.int32)
    panel_bytes, corr_bytes = quads.size, corrections.size * 4
    raw = np.empty(panel_bytes + corr_bytes + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + panel_bytes + corr_bytes]
    out[:panel_bytes] = quads.reshape(-1).view(np.uint8)
    out[panel_bytes:] = corrections.reshape(-1).view(np.uint8)
    return out.view(np.int32)


#: the gathered column block as u8 quads (TS_ names: the Conv template's constants)
PACK_QUADS_C = """/* Lanes [off, off + 16) of up to four rows of floats holding integers in [XLO, XLO + 255] as byte
 * quads: lane j holds the bytes row[i][off + j] - XLO, i = 0 .. rows - 1, lowest byte first (exact
 * conversions); the bytes of rows past `rows` and the lanes outside m are 0. */
static inline __m512i ts_u8_quad(const float* const* row, int64_t rows, int64_t off, __mmask16 m)
{
    const __m512i lo = _mm512_set1_epi32(XLO);
    __m512i quad = _mm512_setzero_si512();
    for (int64_t i = 0; i < rows; ++i) {
        const __m512i u = _mm512_maskz_sub_epi32(m, _mm512_cvtps_epi32(_mm512_maskz_loadu_ps(m, row[i] + off)), lo);
        quad = _mm512_or_si512(quad, _mm512_sllv_epi32(u, _mm512_set1_epi32((int)(8 * i))));
    }
    return quad;
}

/* The first n of 16 lanes. */
static inline __mmask16 ts_lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : n > 0 ? (__mmask16)((1u << n) - 1u) : (__mmask16)0;
}

/* Rows [0, kl) of the gathered column block bp as byte quads: bq[q * ldb + j] holds the bytes
 * bp[4q + i][j] - XLO for i = 0..3; a last quad's rows past kl are 0 (their weights are 0 too). */
static void pack_quads(const float* restrict bp, int64_t ldb, int64_t kl, uint32_t* restrict bq)
{
    for (int64_t q = 0; 4 * q < kl; ++q) {
        const int64_t rows = min_i64(4, kl - 4 * q);
        const float* row[4] = {0, 0, 0, 0};
        for (int64_t i = 0; i < rows; ++i) row[i] = bp + (4 * q + i) * ldb;
        for (int64_t j = 0; j < ldb; j += 16)
            _mm512_storeu_si512((void*)(bq + q * ldb + j), ts_u8_quad(row, rows, j, (__mmask16)0xFFFF));
    }
}

/* A 1x1, stride-1, unpadded Conv's u8 quads straight from X (row k of the column block is input
 * channel k0 + k, contiguous along the positions: no gathered float block first):
 * bq[q * ldb + j] holds the bytes X[k0 + 4q + i][p0 + j] - XLO, i = 0..3; positions past nv and
 * rows past kl are 0. */
static void pack_quads_pointwise(const float* restrict xg, int64_t HW, int64_t p0, int64_t nv, int64_t ldb,
                                 int64_t k0, int64_t kl, uint32_t* restrict bq)
{
    for (int64_t q = 0; 4 * q < kl; ++q) {
        const int64_t rows = min_i64(4, kl - 4 * q);
        const float* row[4] = {0, 0, 0, 0};
        for (int64_t i = 0; i < rows; ++i) row[i] = xg + (k0 + 4 * q + i) * HW + p0;
        for (int64_t j = 0; j < ldb; j += 16)
            _mm512_storeu_si512((void*)(bq + q * ldb + j), ts_u8_quad(row, rows, j, ts_lanes(nv - j)));
    }
}

/* pack_b_phased's rows, four at a time, as u8 quads straight from a task's phase planes (no float
 * block first): row k = (c, kh, kw) of output row oh is plane row (c, oh*SH + kh*DH - r0) of phase
 * (kw*DW) % SW from column ow + (kw*DW) / SW on; bq[q * ldb + j] holds the bytes of rows 4q .. 4q + 3
 * minus XLO (the planes' zero padding is the integer 0); positions past nv and rows past kl are 0. */
static void pack_quads_phased(const float* restrict xp, int64_t r0, int64_t HR, int64_t WQ, int64_t OW, int64_t p0,
                              int64_t nv, int64_t ldb, int64_t k0, int64_t kl, uint32_t* restrict bq)
{
    int64_t c = k0 / (KH * KW), r = k0 % (KH * KW);
    int64_t kh = r / KW, kw = r % KW;
    const int64_t oh_first = p0 / OW, ow_first = p0 % OW;
    for (int64_t q = 0; 4 * q < kl; ++q) {
        const int64_t rows = min_i64(4, kl - 4 * q);
        const float* plane[4] = {0, 0, 0, 0};
        int64_t tap_row[4] = {0, 0, 0, 0};
        for (int64_t i = 0; i < rows; ++i) {
            plane[i] = xp + (c * HR * SW + (kw * DW) % SW) * WQ + (kw * DW) / SW;
            tap_row[i] = kh * DH - r0;
            if (++kw == KW) { kw = 0; if (++kh == KH) { kh = 0; ++c; } }
        }
        uint32_t* restrict dst = bq + q * ldb;
        int64_t j = 0, oh = oh_first, ow = ow_first;
        while (j < nv) {
            const int64_t seg = min_i64(OW - ow, nv - j);
            const float* row[4] = {0, 0, 0, 0};       /* this output row's segment in each plane */
            for (int64_t i = 0; i < rows; ++i) row[i] = plane[i] + (oh * SH + tap_row[i]) * SW * WQ + ow;
            for (int64_t t = 0; t < seg; t += 16) {
                const __mmask16 m = ts_lanes(seg - t);
                _mm512_mask_storeu_epi32((void*)(dst + j + t), m, ts_u8_quad(row, rows, t, m));
            }
            j += seg;
            ow = 0;
            ++oh;
        }
        for (; j < ldb; ++j) dst[j] = 0;
    }
}

/* acc += the four u8 x s8 products of each 32-bit lane of x and w (VPDPBUSD; assembly, as in the
 * GEMM kernels: GCC 12 copies every accumulator around the intrinsic) */
static inline __attribute__((always_inline)) __m512i ts_dpbusd(__m512i acc, __m512i x, __m512i w)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
    return acc;
}
"""


def emit_int8_micro_kernel(emit, MR: int, NR: int) -> None:
    """``micro_kernel_int8``: an MR x NR tile (output channels x positions, NR a multiple of 16)
    over ceil(kl / 4) quad steps, int32 accumulators (the corrections first), int32 partial sums in
    ``ct`` between K steps, the finished tile converted to float into ``tile``."""
    nvec = NR // 16
    accs = [[f"c{r}_{c}" for c in range(nvec)] for r in range(MR)]
    emit(f"""/* Micro-kernel (int8): an MR x NR tile over ceil(kl / 4) quad steps, lanes along the positions:
 * per step NR/16 vectors of u8 quads times MR broadcast s8 weight quads (VPDPBUSD).
 *   ap: s8 weight panel (quad-major, MR per quad); bq: u8 quad block (quad row q at bq + q*ldb);
 *   corr: the MR rows' corrections XLO * sum_k W; ct: int32 partial sums (MR*NR) between K steps;
 *   last: the finished tile, as float, goes to `tile` (MR x NR). */
static inline __attribute__((always_inline)) void micro_kernel_int8(
    int64_t kl, const uint32_t* restrict ap, const uint32_t* restrict bq, int64_t ldb, const int32_t* restrict corr,
    int32_t* restrict ct, int first, int last, float* restrict tile)
{{
    __m512i {", ".join(a for row in accs for a in row)};
    if (first) {{""")
    _per_accumulator(emit, "        ", accs, lambda r, c, a: f"{a} = _mm512_set1_epi32(corr[{r}]);")
    emit("    } else {")
    _per_accumulator(emit, "        ", accs,
                     lambda r, c, a: f"{a} = _mm512_loadu_si512((const void*)(ct + {r * NR + c * 16}));")
    emit("    }")
    emit("    const int64_t kq = (kl + 3) / 4;")
    emit("    for (int64_t q = 0; q < kq; ++q) {  /* VPDPBUSD loop: no bounds tests (local padding) */")
    emit("        const uint32_t* restrict bk = bq + q * ldb;")
    emit("        const uint32_t* restrict ak = ap + q * MR;")
    for c in range(nvec):
        emit(f"        const __m512i x{c} = _mm512_loadu_si512((const void*)(bk + {c * 16}));")
    for r, row in enumerate(accs):
        emit(f"        {{ const __m512i w = _mm512_set1_epi32((int)ak[{r}]); "
             + " ".join(f"{a} = ts_dpbusd({a}, x{c}, w);" for c, a in enumerate(row)) + " }")
    emit("    }")
    emit("    if (!last) {")
    _per_accumulator(emit, "        ", accs, lambda r, c, a: f"_mm512_storeu_si512((void*)(ct + {r * NR + c * 16}), {a});")
    emit("        return;")
    emit("    }")
    _per_accumulator(emit, "    ", accs,
                     lambda r, c, a: f"_mm512_storeu_ps(tile + {r * NR + c * 16}, _mm512_cvtepi32_ps({a}));")
    emit("}\n")


def _per_accumulator(emit, indent: str, accs: list[list[str]], statement) -> None:
    """One line per tile row: ``statement(row, column vector, accumulator)`` for each of its accumulators."""
    for r, row in enumerate(accs):
        emit(indent + " ".join(statement(r, c, a) for c, a in enumerate(row)))


__all__ = ["PACK_QUADS_C", "conv_int8_x_offset", "emit_int8_micro_kernel", "prepack_conv_weight_int8"]
