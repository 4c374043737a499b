"""Winograd F(2x2, 3x3): a second strategy of the ``conv`` family for 3x3 stride-1 Convs.

A 3x3 Conv computes each 2x2 block of outputs ("tile") from a 4x4 block of its input with 16
multiplications per (input, output) channel pair in the Winograd domain instead of 36 directly
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):

    Y = Aᵀ [ (G g Gᵀ) ⊙ (Bᵀ d B) ] A          (g: 3x3 filter, d: 4x4 input tile)

Summed over the input channels, the element-wise products become 16 GEMMs, one per position e of
the 4x4 Winograd domain: M[e] = U[e] · V[e], U[e] [OC, C] the transformed weights (packed at
load), V[e] [C, tiles] the transformed input. 2.25x fewer multiply-adds than the implicit GEMM's
(ResNet-50's 3x3 layers are about half its work); the transforms are additions only, and in fp32
the result differs from the direct sum by a few units in the last place of the largest terms.

The macro-kernel, per image: (1) every input channel's tiles are transformed into V (parallel over
channels; a shared buffer, since every task reads all channels of its tiles); (2) tasks of
``mc`` output channels x a block of whole tile rows run the 16 GEMMs with the implicit GEMM's
row-vector micro-kernel (lanes along the output channels, tiles broadcast: ``mr x nr``), keep the
16 partial results per (channel, tile) in a per-thread stage as the micro-kernel holds them
(position-major: no transposes), transform them back to 2x2 outputs along the channels in vectors
and hand whole output rows to the group's fused epilogue. A tile past the image's edge computes
values nobody stores (local padding: no bounds tests in the GEMMs).

The dispatch measures this strategy beside the tuned implicit-GEMM tiles at every sample shape and
picks per shape (TSCompiler §6): small images, few channels, or a fused layout it does not take
(channel-blocked tensors) keep the implicit GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tscomp.codegen.register_operands import held_operand
from tscomp.codegen.tile_config import MAX_ACCUMULATORS, VECTOR_WIDTH, TileConfigError
from tscomp.codegen.workspace import WORKSPACE_C, thread_workspace_c

#: the transforms of F(2x2, 3x3): input Bᵀ (4x4), filter G (4x3), output Aᵀ (2x4)
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G_MATRIX = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)

#: the 4x4 Winograd domain's positions, each one GEMM
DOMAIN = 16
#: floats of transformed input (V) one call keeps: a bigger image is transformed a chunk of tile rows
#: at a time (8 MiB: every layer of a 256-pixel ResNet-50 in one chunk; a 2048-pixel image's first
#: stage would otherwise need ~1 GiB)
V_FLOATS = 2 << 20


@dataclass(frozen=True)
class WinogradConfig:
    """The Winograd strategy's blocking: register tile ``mr`` output channels (whole vectors) x
    ``nr`` tiles; tasks of ``mc`` output channels x whole tile rows of about ``tiles`` tiles."""

    mr: int
    nr: int
    mc: int
    tiles: int

    def validate(self, isa: str, **_) -> "WinogradConfig":
        lanes = VECTOR_WIDTH.get(isa, 1)
        if lanes < 8:
            raise TileConfigError(f"{self.describe()}: the Winograd kernel needs SIMD vectors ({isa} has none)")
        if self.mr % lanes or self.mc % self.mr or min(self.nr, self.tiles) < 1:
            raise TileConfigError(f"{self.describe()}: mr must be whole {isa} vectors, mc a multiple of mr, "
                                  f"nr and tiles positive")
        if self.accumulators(isa) > MAX_ACCUMULATORS[isa]:
            raise TileConfigError(f"{self.describe()}: {self.accumulators(isa)} accumulators exceed the "
                                  f"{MAX_ACCUMULATORS[isa]} of {isa}")
        return self

    def accumulators(self, isa: str) -> int:
        return self.mr * self.nr // VECTOR_WIDTH[isa]

    def describe(self) -> str:
        return (f"Winograd F(2x2,3x3): register tile {self.mr} channels x {self.nr} tiles (vectors along the "
                f"channels), blocks of {self.mc} channels x ~{self.tiles} tiles")

    def slug(self) -> str:
        return f"wino{self.mr}x{self.nr}_b{self.mc}x{self.tiles}"


def winograd_applies(analysis) -> bool:
    """Whether a ``conv`` analysis is a Conv this strategy computes: a 3x3 window at stride 1 and
    dilation 1, one channel group, 2-D, every tensor in NCHW (no channel-blocked layout)."""
    a, geo = analysis, analysis.geo
    return (getattr(a, "family", None) == "conv" and len(a.out_shape) == 4 and a.G == 1
            and (geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw) == (3, 3, 1, 1, 1, 1)
            and not (a.x_lanes or a.y_lanes or a.blocked_operands))


#: channels a Conv needs on both sides before the transforms' passes pay for the GEMMs they save
MIN_CHANNELS = 16


def winograd_configs(isa: str, analysis) -> list[WinogradConfig]:
    """The strategy's configurations for ``analysis`` (empty where it does not apply): two vectors of
    channels x 8 tiles (AVX-512: 32 x 8, 16 accumulators; fewer tiles where the register file is
    smaller) in tasks of 64 channels x ~32 tiles; where OC is not whole two-vector tiles, one vector
    of channels."""
    lanes = VECTOR_WIDTH.get(isa, 1)
    if lanes < 8 or not winograd_applies(analysis) or min(analysis.OC, analysis.Cg) < MIN_CHANNELS:
        return []
    mr = 2 * lanes if analysis.OC % (2 * lanes) == 0 else lanes
    vectors = mr // lanes
    # the most tiles (up to 8) whose k step still holds an operand in registers (register_operands:
    # AVX2's 2 vectors x 7 tiles = 14 accumulators left neither the 2 weight vectors nor the 7
    # broadcasts room, so GCC folded the loads into the FMAs; 2 x 6 holds the vectors, ~3% faster
    # over 9 sizes of a 256-channel 3x3 Conv on a Zen 3)
    nr = max(n for n in range(1, 9) if n * vectors <= MAX_ACCUMULATORS[isa]
             and held_operand(isa, n * vectors, vectors, n) is not None)
    return [WinogradConfig(mr=mr, nr=nr, mc=max(mr, 64 // mr * mr), tiles=32).validate(isa)]


def transformed_weight(W: np.ndarray) -> np.ndarray:
    """U[e, oc, c] = (G g Gᵀ)[e // 4, e % 4] for each filter g = W[oc, c] (3x3), in float64 then
    rounded once. Packed as the implicit GEMM packs a grouped Conv's weight, the 16 domain positions
    as its groups (:meth:`~tscomp.codegen.cpu_conv.CompiledConv.pack_weight`): MR-row panels of each
    U[e], k-major -- the row-vector micro-kernel's layout."""
    U = np.einsum("ik,ockl,jl->ijoc", G_MATRIX, W.astype(np.float64), G_MATRIX)
    return U.reshape(DOMAIN, W.shape[0], W.shape[1]).astype(np.float32)


def tile_grid(OH, OW, OC, cfg: WinogradConfig):
    """(tile rows, tile columns, tile-row blocks, rows per block, channel blocks) of one image, as
    the macro-kernel computes them (works on ints and on numpy arrays): blocks of about
    ``cfg.tiles`` tiles of whole rows, balanced."""
    TH, TW = -(-OH // 2), -(-OW // 2)
    want = np.maximum(1, -(-cfg.tiles // np.maximum(TW, 1)))
    n_tb = -(-TH // want)
    rows = -(-TH // np.maximum(n_tb, 1))
    return TH, TW, n_tb, rows, -(-OC // cfg.mc)


def winograd_classes(k, ev, threads: int):
    """The wave model's task classes: per image, channel blocks x tile-row blocks (the last one
    partial); a task's work = its channels x its tiles (padded to the register tile) x 16 x C."""
    a, cfg = k.analysis, k.cfg
    n = ev(a.x_shape[0])
    OH, OW = ev(a.out_shape[2]), ev(a.out_shape[3])
    TH, TW, n_tb, rows, n_ob = tile_grid(OH, OW, a.OC, cfg)
    last = TH - (n_tb - 1) * rows

    def work(r):
        return cfg.mc * (-(-(r * TW) // cfg.nr) * cfg.nr) * DOMAIN * a.Cg

    return [(n * n_ob * (n_tb - 1), work(rows)), (n * n_ob, work(last))]


def _transform_c() -> str:
    return """/* Input transform of one channel's tile rows [ty_a, ty_b): V[e][t] = (Bᵀ d B)[e / 4][e % 4] for the
 * tiles t = (ty - ty_a) * TW + tx,
 * d the 4x4 input block at (2ty - PT, 2tx - PL), zero outside the image. Per tile row, the four input
 * rows are split into their even and odd padded columns (re[q] = row[2q - PL], ro[q] = row[2q + 1 - PL]),
 * so tile tx's columns are re[tx], ro[tx], re[tx + 1], ro[tx + 1]: Bᵀ along the rows and B along the
 * columns are then unit-stride vector arithmetic. ``ldv``: floats between the planes of consecutive e;
 * ``rows``: 16 (TW + 1) floats of scratch. */
static void input_transform(const float* restrict xc, int64_t H, int64_t W, int64_t PT, int64_t PL,
                            int64_t ty_a, int64_t ty_b, int64_t TW, int64_t ldv, float* restrict vc,
                            float* restrict rows)
{
    const int64_t WQ = TW + 1;                 /* even (or odd) columns a tile row reads */
    float* restrict ue = rows + 8 * WQ;        /* Bᵀ d's rows, even and odd columns */
    float* restrict uo = ue + 4 * WQ;
    for (int64_t ty = ty_a; ty < ty_b; ++ty) {
        for (int64_t i = 0; i < 4; ++i) {
            float* restrict re = rows + 2 * i * WQ;
            float* restrict ro = re + WQ;
            const int64_t ih = 2 * ty - PT + i;
            if (ih < 0 || ih >= H) {
                for (int64_t q = 0; q < WQ; ++q) re[q] = ro[q] = 0.0f;
                continue;
            }
            const float* restrict src = xc + ih * W;
            for (int64_t odd = 0; odd < 2; ++odd) {   /* column 2q + odd - PL, inside for q in [lo, hi) */
                float* restrict dst = odd ? ro : re;
                const int64_t lo = min_i64(WQ, max_i64(0, (PL - odd + 1) / 2));
                const int64_t top = W - 1 + PL - odd, hi = max_i64(lo, min_i64(WQ, top >= 0 ? top / 2 + 1 : 0));
                const float* restrict from = src + odd - PL;
                for (int64_t q = 0; q < lo; ++q) dst[q] = 0.0f;
                for (int64_t q = lo; q < hi; ++q) dst[q] = from[2 * q];
                for (int64_t q = hi; q < WQ; ++q) dst[q] = 0.0f;
            }
        }
        for (int64_t half = 0; half < 2; ++half) {   /* Bᵀ along the rows: even columns, then odd */
            const float* restrict r0 = rows + half * WQ;
            const float* restrict r1 = r0 + 2 * WQ;
            const float* restrict r2 = r0 + 4 * WQ;
            const float* restrict r3 = r0 + 6 * WQ;
            float* restrict u = half ? uo : ue;
            for (int64_t q = 0; q < WQ; ++q) {
                u[q] = r0[q] - r2[q];
                u[WQ + q] = r1[q] + r2[q];
                u[2 * WQ + q] = r2[q] - r1[q];
                u[3 * WQ + q] = r1[q] - r3[q];
            }
        }
        for (int64_t i = 0; i < 4; ++i) {            /* B along each tile's columns a, b, c, d */
            const float* restrict e0 = ue + i * WQ;
            const float* restrict o0 = uo + i * WQ;
            float* restrict d0 = vc + (i * 4) * ldv + (ty - ty_a) * TW;
            float* restrict d1 = d0 + ldv;
            float* restrict d2 = d1 + ldv;
            float* restrict d3 = d2 + ldv;
            for (int64_t tx = 0; tx < TW; ++tx) {
                d0[tx] = e0[tx] - e0[tx + 1];
                d1[tx] = o0[tx] + e0[tx + 1];
                d2[tx] = e0[tx + 1] - o0[tx];
                d3[tx] = o0[tx] - o0[tx + 1];
            }
        }
    }
}

/* Output transform of one register panel's tiles [0, TW * nty): the 16 domain values of tile t are the
 * MR-channel rows m[e * lde + t * MR + r] (position-major, as the micro-kernel stored them), so y = Aᵀ m A
 * runs along the channels in vectors; the 2x2 outputs inside the image go to the channel-major rows
 * y[r * ldy + (2 * ty + dy) * OW + 2 * tx + dx] of the task's first output row, for the mv valid channels. */
static void output_transform(const float* restrict m, int64_t lde, int64_t TW, int64_t nty, int64_t oh0,
                             int64_t OH, int64_t OW, int64_t mv, float* restrict y, int64_t ldy)
{
    for (int64_t ty = 0; ty < nty; ++ty) {
        const int64_t rows = min_i64(2, OH - oh0 - 2 * ty);
        for (int64_t tx = 0; tx < TW; ++tx) {
            const float* restrict mt = m + (ty * TW + tx) * MR;
            float o00[MR], o01[MR], o10[MR], o11[MR];
            for (int64_t r = 0; r < MR; ++r) {
                float s0[4], s1[4];
                for (int64_t k = 0; k < 4; ++k) {
                    const float a = mt[k * lde + r], b = mt[(4 + k) * lde + r];
                    const float c = mt[(8 + k) * lde + r], d = mt[(12 + k) * lde + r];
                    s0[k] = a + b + c;
                    s1[k] = b - c - d;
                }
                o00[r] = s0[0] + s0[1] + s0[2];
                o01[r] = s0[1] - s0[2] - s0[3];
                o10[r] = s1[0] + s1[1] + s1[2];
                o11[r] = s1[1] - s1[2] - s1[3];
            }
            const int64_t p = 2 * ty * OW + 2 * tx, two = 2 * tx + 1 < OW;
            for (int64_t r = 0; r < mv; ++r) {
                float* restrict yr = y + r * ldy + p;
                yr[0] = o00[r];
                if (two) yr[1] = o01[r];
                if (rows > 1) {
                    yr[OW] = o10[r];
                    if (two) yr[OW + 1] = o11[r];
                }
            }
        }
    }
}
"""


def winograd_source(analysis, cfg: WinogradConfig, isa: str) -> str:
    """The source step of the Winograd strategy (pure): C text of its macro-kernel."""
    from tscomp.codegen.cpu_conv import (PRELUDE, _emit_micro_kernel, _epi_params, _prologue_call, _runtime_params,
                                         c_defines, conv_func_name, ts_macros)

    a = analysis
    if not winograd_applies(a):
        raise TileConfigError(f"group {a.group.name}: the Winograd strategy takes 3x3 stride-1 NCHW Convs only")
    cfg = cfg.validate(isa)
    name = conv_func_name(a, cfg, isa)
    params, names, pro_names = _epi_params(a)
    L: list[str] = [a.header("Winograd F(2x2,3x3)", f"{cfg.describe()} on {isa}; 16 GEMMs [OC={a.OC}] x "
                                                     f"[C={a.Cg}] x [tiles] per task"),
                    PRELUDE, "#include <string.h>", "#include <omp.h>", "#include <immintrin.h>",
                    c_defines(C_IN=a.Cg, OC=a.OC, MR=cfg.mr, NR=cfg.nr, MC=cfg.mc, TILES=cfg.tiles,
                              N_OCP=-(-a.OC // cfg.mr), V_FLOATS=V_FLOATS),
                    "static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }",
                    "static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }",
                    WORKSPACE_C, thread_workspace_c("tscomp_winograd_workspace"), a.math, a.statics or "",
                    a.epilogue_c, a.prologue_c, ts_macros(_transform_c())]
    _emit_micro_kernel(lambda text: L.append(ts_macros(text)), isa, cfg.mr, cfg.nr, column_vectors=False,
                       position_major=True)
    L.append(ts_macros(f"""/* Macro-kernel, per image and chunk of tile rows (V within V_FLOATS): the input transform of every
 * channel into V[16][C][TP] (shared), then tasks of MC channels x a block of whole tile rows: 16 GEMMs
 * into the thread's stage M[16][MC / MR][NBP][MR], the output transform into whole output rows, the
 * fused epilogue. */
void {name}({_runtime_params()}{params})
{{
    if (NB <= 0 || OH <= 0 || OW <= 0) return;{_prologue_call(a, pro_names)}
    const int64_t TH = (OH + 1) / 2, TW = (OW + 1) / 2;
    /* tile-row blocks of about TILES tiles, balanced (the Python wave model's tile_grid: the same rule) */
    const int64_t want = max_i64(1, (TILES + TW - 1) / TW);
    const int64_t n_tb = (TH + want - 1) / want, rows = (TH + n_tb - 1) / n_tb;
    const int64_t n_ob = (OC + MC - 1) / MC;
    const int64_t NBP = (rows * TW + NR - 1) / NR * NR;       /* a block's tiles, padded to the register tile */
    /* blocks per chunk: V holds them all where it fits V_FLOATS (every layer of a 256-pixel ResNet) */
    const int64_t chunk = min_i64(n_tb, max_i64(1, (V_FLOATS / (16 * C_IN) - NR) / (rows * TW)));
    const int64_t TP = chunk * rows * TW + NR;                /* V's row: the last register tile reads past */
    float* V = tscomp_winograd_workspace((size_t)(16 * C_IN * TP));
    for (int64_t n = 0; n < NB; ++n) {{
        const float* xn = X + n * C_IN * H * W;
        for (int64_t b0 = 0; b0 < n_tb; b0 += chunk) {{
            const int64_t b1 = min_i64(n_tb, b0 + chunk), ty_a = b0 * rows, ty_b = min_i64(TH, b1 * rows);
            const int64_t Tc = (ty_b - ty_a) * TW, n_tasks = n_ob * (b1 - b0);
            #pragma omp parallel
            {{
                float* scratch = tscomp_thread_workspace((size_t)(16 * (TW + 1)));
                #pragma omp for schedule(static)
                for (int64_t c = 0; c < C_IN; ++c) {{
                    input_transform(xn + c * H * W, H, W, PT, PL, ty_a, ty_b, TW, C_IN * TP, V + c * TP, scratch);
                    for (int64_t e = 0; e < 16; ++e)
                        for (int64_t t = Tc; t < Tc + NR; ++t) V[(e * C_IN + c) * TP + t] = 0.0f;
                }}
            }}
            #pragma omp parallel if (n_tasks > 1)
            {{
                float* M = tscomp_thread_workspace((size_t)(16 * MC * NBP + MC * 2 * rows * OW));
                float* Y = M + 16 * MC * NBP;
                #pragma omp for schedule(dynamic, 1)
                for (int64_t task = 0; task < n_tasks; ++task) {{
                    const int64_t ob = task % n_ob, tb = b0 + task / n_ob;
                    const int64_t oc0 = ob * MC, mv = min_i64(MC, OC - oc0);
                    const int64_t ty0 = tb * rows, nty = min_i64(rows, TH - ty0), nt = nty * TW;
                    const int64_t t0 = (ty0 - ty_a) * TW;          /* the block's first tile in the chunk */
                    /* M[e][ip][t][MR]: each register tile lands position-major, as the micro-kernel keeps it */
                    for (int64_t e = 0; e < 16; ++e) {{
                        const float* ve = V + e * C_IN * TP + t0;
                        for (int64_t jp = 0; jp * NR < nt; ++jp)
                            for (int64_t ip = 0; ip * MR < mv; ++ip) {{
                                const float* ap = Wp + ((e * N_OCP + oc0 / MR + ip) * (int64_t)C_IN) * MR;
                                micro_kernel(C_IN, ap, ve + jp * NR, TP, NULL, 1, 1,
                                             M + ((e * (MC / MR) + ip) * NBP + jp * NR) * MR);
                            }}
                    }}
                    const int64_t oh0 = 2 * ty0, noh = min_i64(OH - oh0, 2 * nty);
                    for (int64_t ip = 0; ip * MR < mv; ++ip)
                        output_transform(M + ip * NBP * MR, MC * NBP, TW, nty, oh0, OH, OW,
                                         min_i64(MR, mv - ip * MR), Y + ip * MR * noh * OW, noh * OW);
                    conv_epilogue(Y, noh * OW, n, oc0, oh0 * OW, mv, noh * OW{names});
                }}
            }}
        }}
    }}
}}
"""))
    return "\n".join(L)


__all__ = ["WinogradConfig", "tile_grid", "transformed_weight", "winograd_applies",
           "winograd_classes", "winograd_configs", "winograd_source"]
