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

**On AMX int8 tiles** (``isa="amx"``, where the CPU's tiles do int8): TDPBUSD multiplies the bytes
of an *unsigned* A tile (16 rows x 64) by a *signed* B tile (16 quad rows x 16 columns) -- the
Conv's operands are the other way round (u8 activations, s8 weights) and the column block's quads
are already B's layout. So A is the weight rows as ``W + 128`` (:func:`prepack_conv_weight_int8_amx`,
K zero-padded to 64) and B the quad block with each byte's top bit flipped, ``U - 128`` with
``U = X - XLO`` (:data:`QUADS_TO_S8_C`, which also sums each position's bytes), and
``W . X = (W + 128) . (U - 128) + [(XLO + 128) * sum_k W + 128^2 K] - 128 * sum_k U``: the bracket
per output channel (stored after the weight rows), the last term per position, both added when the
int32 tile is converted (:func:`emit_int8_amx_micro_kernel`). The zero padding of the weight rows
makes the padded K columns contribute nothing whatever the quad block holds there. Intermediate
sums may wrap in int32; the final one fits, so it is exact (bit-identical to the VPDPBUSD kernel).
"""
from __future__ import annotations

import numpy as np

from tscomp.codegen.cpu_gemm import INT8_K_QUAD, INT8_MAX_K, emit_amx_tile_steps, int8_weight_fits

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




# ---------------------------------------------------------------------------- AMX int8 tiles
#: K depth of one AMX int8 tile step (64 bytes per tile row): the AMX weight rows and the quad
#: block's rows per K block are padded to it
AMX_INT8_K = 64


def amx_k_padded(K: int) -> int:
    """K rounded up to a whole AMX int8 tile step: the bytes of one packed weight row."""
    return -(-K // AMX_INT8_K) * AMX_INT8_K


def prepack_conv_weight_int8_amx(W: np.ndarray, G: int, mr: int, x_offset: int) -> np.ndarray:
    """W[OC, Cg, *k] (integers in [-128, 127]) -> the AMX A operand: per group g, MR-row panels of
    W_g[OCg, K] as **unsigned** bytes ``W + 128`` (TDPBUSD multiplies u8 A rows by s8 B quads; the
    activation quads are the signed bytes ``X - XLO - 128``), row-major, each row K padded to 64 with
    zeros (``[g][panel][r][KP]``); then per padded row the int32 correction
    ``(XLO + 128) * sum_k W[oc, k] + 128 * 128 * K`` (wrapping as the int32 tiles do): with
    ``U = X - XLO``, ``W . X = (W + 128) . (U - 128) + that - 128 * sum_k U[k, p]``, the last term per
    position (the kernel sums each column block's bytes while it converts them)."""
    OC = W.shape[0]
    OCg = OC // G
    K = int(np.prod(W.shape[1:]))
    n_ocp = -(-OCg // mr)
    KP = amx_k_padded(K)
    Wg = np.zeros((G, n_ocp * mr, K), np.int64)
    Wg[:, :OCg] = W.reshape(G, OCg, K).astype(np.int64)
    rows = np.zeros((G, n_ocp * mr, KP), np.uint8)
    rows[:, :OCg, :K] = (Wg[:, :OCg] + 128).astype(np.uint8)     # padded rows stay 0 (never stored)
    corrections = ((np.int64(x_offset) + 128) * Wg.sum(axis=2) + 128 * 128 * K) % (1 << 32)
    rows_bytes, corr = rows.size, corrections.astype(np.uint32).view(np.int32)
    raw = np.empty(rows_bytes + corr.size * 4 + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + rows_bytes + corr.size * 4]
    out[:rows_bytes] = rows.reshape(-1)
    out[rows_bytes:] = corr.reshape(-1).view(np.uint8)
    return out.view(np.int32)


#: the quad block made signed for TDPBUSD's B operand, and its column sums (TS_ names: template constants)
QUADS_TO_S8_C = """/* The u8 quad block bq (rows [0, kq), kq = ceil(kl / 4), of ldb lanes) as the signed bytes U - 128
 * (each byte's top bit flipped) for TDPBUSD's B tiles, rows [kq, KQB) zero; usum[j] gets (kb == 0) or
 * adds the sum of the bytes U of position j over the rows (VPDPBUSD by ones). */
static void quads_to_s8(uint32_t* restrict bq, int64_t ldb, int64_t kl, int32_t* restrict usum, int first)
{
    const int64_t kq = (kl + 3) / 4, kqb = (kl + AMX_K - 1) / AMX_K * (AMX_K / 4);
    const __m512i ones = _mm512_set1_epi8(1), flip = _mm512_set1_epi32((int)0x80808080u);
    for (int64_t j = 0; j < ldb; j += 16) {
        __m512i s = first ? _mm512_setzero_si512() : _mm512_loadu_si512((const void*)(usum + j));
        for (int64_t q = 0; q < kq; ++q) {
            const __m512i v = _mm512_loadu_si512((const void*)(bq + q * ldb + j));
            s = _mm512_dpbusd_epi32(s, v, ones);
            _mm512_storeu_si512((void*)(bq + q * ldb + j), _mm512_xor_si512(v, flip));
        }
        for (int64_t q = kq; q < kqb; ++q)
            _mm512_storeu_si512((void*)(bq + q * ldb + j), _mm512_setzero_si512());
        _mm512_storeu_si512((void*)(usum + j), s);
    }
}
"""


def emit_int8_amx_micro_kernel(emit, MR: int, NR: int, tile_registers: int = 8) -> None:
    """``micro_kernel_int8_amx``: an MR x NR tile (output channels x positions; both multiples of
    16, (MR/16) x (NR/16) <= 4 accumulator tiles) on the AMX unit: per 64-deep K step the MR/16 A
    tiles (weight rows ``W + 128``) and each B tile (16 quad rows x 16 positions of the signed quad
    block) multiplied by TDPBUSD into int32 accumulators; int32 partial sums in ``ct`` between K
    steps; the finished tile converted to float into ``tile`` with the channel corrections and
    -128 x the positions' byte sums."""
    n_a, n_b = MR // 16, NR // 16
    n_c = n_a * n_b
    if MR % 16 or NR % 16 or n_c > 4 or n_c + n_a + 1 > tile_registers:
        raise ValueError(f"an AMX int8 Conv tile is whole 16x16 tiles, at most 4 accumulators; got {MR}x{NR}")
    acc = [[a * n_b + b for b in range(n_b)] for a in range(n_a)]
    b_regs = list(range(n_c + n_a, tile_registers))
    emit(f"""/* Micro-kernel (int8, AMX): an MR x NR tile = {n_a} x {n_b} int32 accumulator tiles of 16x16 over ceil(kl / 64)
 * TDPBUSD steps: A = 16 weight rows of 64 u8 (W + 128), B = 16 quad rows x 16 positions of s8 (U - 128).
 *   ap: the panel's weight rows at column k0 (row stride KPAD bytes); bq: the quad block at this tile's
 *   first position (row stride ldb lanes); corr: the MR rows' corrections; usum: the positions' byte sums;
 *   ct: int32 partial sums (MR*NR) between K steps; last: the finished tile, as float, to `tile`. */
static inline __attribute__((always_inline)) void micro_kernel_int8_amx(
    int64_t kl, const uint8_t* restrict ap, const uint32_t* restrict bq, int64_t ldb, const int32_t* restrict corr,
    const int32_t* restrict usum, int32_t* restrict ct, int first, int last, float* restrict tile)
{{
    const int64_t ks = (kl + 63) / 64;
    if (first) {{
        {" ".join(f"_tile_zero({t});" for row in acc for t in row)}
    }} else {{""")
    for a, row in enumerate(acc):
        emit("        " + " ".join(f"_tile_loadd({t}, ct + {a * 16 * NR + b * 16}, NR * 4);" for b, t in enumerate(row)))
    emit("    }")
    emit_amx_tile_steps(emit, acc, b_regs, "_tile_dpbusd", "no bounds tests (rows and steps zero-padded)",
                        lambda a: (f"ap + {a * 16} * KPAD + s * 64", "KPAD"),
                        lambda b: (f"bq + s * 16 * ldb + {b * 16}", "ldb * 4"))
    emit("    if (!last) {")
    for a, row in enumerate(acc):
        emit("        " + " ".join(f"_tile_stored({t}, ct + {a * 16 * NR + b * 16}, NR * 4);" for b, t in enumerate(row)))
    emit("        return;")
    emit("    }")
    for a, row in enumerate(acc):
        emit("    " + " ".join(f"_tile_stored({t}, tile + {a * 16 * NR + b * 16}, NR * 4);" for b, t in enumerate(row)))
    emit("""    for (int r = 0; r < MR; ++r) {   /* exact int32 sums (wrapping as the tiles do) to float, once */
        const __m512i cr = _mm512_set1_epi32(corr[r]);
        for (int c = 0; c < NR; c += 16) {
            float* t = tile + r * NR + c;
            const __m512i u = _mm512_slli_epi32(_mm512_loadu_si512((const void*)(usum + c)), 7);
            _mm512_store_ps(t, _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_add_epi32(_mm512_load_si512((const void*)t), cr), u)));
        }
    }
}
""")


__all__ = ["AMX_INT8_K", "PACK_QUADS_C", "QUADS_TO_S8_C", "amx_k_padded", "conv_int8_x_offset", "emit_int8_amx_micro_kernel",
           "emit_int8_micro_kernel", "prepack_conv_weight_int8", "prepack_conv_weight_int8_amx"]
