"""The ``conv-transpose`` family: ConvTranspose (1-D and 2-D) as a native macro-kernel with the fused
epilogue of the Conv families.

ONNX defines ``y[n, m, oh, ow] = b[m] + sum x[n, c, ih, iw] * w[c, m, kh, kw]`` over the input
pixels and taps with ``oh = ih * SH + kh * DH - PT`` (and likewise along the width): every input
pixel scatters a ``KH x KW`` patch of weights into the output. Decoders use it to upsample (UNet's
and SAM's 2x2 stride-2 layers, DPT's 4x4 stride-4 and 2x2 stride-2 reassembly, HiFi-GAN's 1-D
upsamplers, whose taps overlap). It ran on the numpy fallback before.

The kernel is output-stationary per task (image, channel group, block of output channels, block of
output rows): the task's outputs start at zero in a position-major accumulator ``[position][channel
block]``; for each output row, each tap whose input row exists (``(oh + PT - kh DH) % SH == 0``),
each input column that lands inside the row, the block's output channels accumulate
``x[c, ih, iw] * w[c, m-vector, kh, kw]`` over the group's input channels -- one broadcast and a
vector FMA per channel vector, the channel vectors held in registers across the reduction. The
finished rows are transposed into the channel-major tile the fused epilogue (bias, activation,
residual) reads, exactly as a Conv's. No tuning axis: one variant.
"""
from __future__ import annotations

import numpy as np
import sympy

from tscomp.codegen.build import get_num_threads
from tscomp.codegen.cpu_conv import (CompiledConv, _ConvBase, _epi_params, _prologue_call, _runtime_params, c_defines,
                                     conv_func_name, direct_kernel_preamble)
from tscomp.codegen.cpu_depthwise_channels import transpose_block_c
from tscomp.codegen.cpu_gemm import _Vec
from tscomp.codegen.tile_config import VECTOR_WIDTH

#: channel vectors one task accumulates in registers (the rest of the output channels are other tasks)
MAX_CHANNEL_VECTORS = 8
#: output positions one task aims at (its accumulator rows stay in L2)
TASK_POSITIONS = 2048
#: tasks per thread the row blocking aims at when the images and channel blocks alone are too few
TASKS_PER_THREAD = 4


class ConvTransposeAnalysis(_ConvBase):
    """The analysis step of the ``conv-transpose`` family: W[C, OC / group, *kernel]."""

    family = "conv-transpose"
    HEAVY_OP = "ConvTranspose"

    def _output_channels(self, W: np.ndarray) -> int:
        return int(W.shape[1]) * int(self.heavy.attrs.get("group", 1))

    def _weight_matches(self, W: np.ndarray) -> bool:
        return int(W.shape[0]) == self.C

    def _check_strategy(self) -> None:
        pass         # every window: explicit pads, or pads the output size implies (pad_begin)

    def channel_blocks(self, isa: str) -> tuple[int, int]:
        """(vectors per channel block, blocks) of the group's OCg output channels under ``isa``."""
        nvec = -(-self.OCg // VECTOR_WIDTH[isa])
        n_mb = -(-nvec // MAX_CHANNEL_VECTORS)
        return -(-nvec // n_mb), n_mb

    def pad_begin(self, i: int, size, out):
        """The padding cropped off the start of spatial axis ``i`` (ints or expressions): the
        ``pads`` attribute, or where the output size decides it (``auto_pad`` SAME, an explicit
        ``output_shape``) the spec's split of ``stride (size - 1) + output_padding + span - out``
        (the larger half at the end for SAME_UPPER), as the reference computes it."""
        w, attrs = self.win, self.heavy.attrs
        if w.auto_pad == "VALID":
            return 0
        if w.auto_pad not in ("SAME_UPPER", "SAME_LOWER") and (attrs.get("pads") is not None
                                                               or attrs.get("output_shape") is None):
            return w.pads[i]
        extra = list(attrs.get("output_padding") or [0] * w.rank)[i]
        total = w.strides[i] * (size - 1) + extra + w.span(i) - out
        half = total // 2 if isinstance(total, int) else sympy.floor(total / 2)
        return half if w.auto_pad == "SAME_UPPER" else total - half

    def runtime_sizes(self, xshape, out_spatial) -> tuple:
        """(H, W, OH, OW, PT, PL) of the kernel at concrete sizes or as expressions (a 1-D op as
        H = OH = 1)."""
        if self.geo.rank == 1:
            return 1, xshape[2], 1, out_spatial[0], 0, self.pad_begin(0, xshape[2], out_spatial[0])
        return (xshape[2], xshape[3], out_spatial[0], out_spatial[1], self.pad_begin(0, xshape[2], out_spatial[0]),
                self.pad_begin(1, xshape[3], out_spatial[1]))


def prepack_conv_transpose(W: np.ndarray, G: int, lanes: int, mb: int, n_mb: int) -> np.ndarray:
    """W[C, OCg, *k] -> [group][channel block][tap][input channel of the group][mb * lanes], output
    channels past OCg zero."""
    C, OCg = W.shape[:2]
    taps = int(np.prod(W.shape[2:]))
    Cg, width = C // G, mb * lanes
    padded = np.zeros((G, Cg, n_mb * width, taps), np.float32)
    padded[:, :, :OCg] = W.reshape(G, Cg, OCg, taps)
    blocks = padded.reshape(G, Cg, n_mb, width, taps).transpose(0, 2, 4, 1, 3)
    raw = np.empty(blocks.size * 4 + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + blocks.size * 4].view(np.float32)
    out[:] = blocks.reshape(-1)
    return out


def conv_transpose_source(a: ConvTransposeAnalysis, isa: str) -> str:
    """The source step (pure): C text of the kernel under ``isa`` (AVX2 or AVX-512)."""
    geo = a.geo
    v, L = _Vec(isa), VECTOR_WIDTH[isa]
    mb, n_mb = a.channel_blocks(isa)
    name = conv_func_name(a, None, isa)
    params, names, pro_names = _epi_params(a)
    accs = range(mb)
    load = "\n".join(f"                            {v.type} a{j} = {v.load(f'ap + {j * L}')};" for j in accs)
    fmas = "\n".join(f"                                a{j} = {v.fma('xv', v.load(f'wc + {j * L}'), f'a{j}')};"
                     for j in accs)
    store = "\n".join(f"                            {v.store(f'ap + {j * L}', f'a{j}')}" for j in accs)
    header = a.header("ConvTranspose, direct", f"one OpenMP task per (image, group, block of {mb} x {L} output "
                      f"channels, block of output rows); per input pixel a tap lands on, {mb} {isa} channel "
                      f"vectors accumulate over the group's {a.Cg} input channels; rows transposed for the "
                      f"fused epilogue")
    defines = c_defines(C_IN=a.C, CG=a.Cg, OCG=a.OCg, G=a.G, KH=geo.kh, KW=geo.kw, SH=geo.sh, SW=geo.sw, DH=geo.dh,
                        DW=geo.dw, MBL=mb * L, NMB=n_mb, TASK_POSITIONS=TASK_POSITIONS, TASKS_PER_THREAD=TASKS_PER_THREAD)
    return "\n".join([header, *direct_kernel_preamble(a, defines, transpose_block_c(isa)), f"""
/* Output-stationary ConvTranspose: y[n, m, oh, ow] += x[n, c, ih, iw] * w[c, m, kh, kw] wherever
 * oh = ih * SH + kh * DH - PT and ow = iw * SW + kw * DW - PL. Wp is packed
 * [group][channel block][kh][kw][input channel][MBL]; acc holds a task's outputs position-major. */
void {name}({_runtime_params()}{params})
{{
    const int64_t P = OH * OW;
    if (NB <= 0 || P <= 0) return;{_prologue_call(a, pro_names)}
    const int64_t blocks = NB * TS_G * TS_NMB;
    const int64_t want = (TS_TASKS_PER_THREAD * omp_get_max_threads() + blocks - 1) / blocks;
    const int64_t rows = max_i64(1, min_i64(min_i64(OH, TS_TASK_POSITIONS / max_i64(OW, 1)), (OH + want - 1) / want));
    const int64_t n_rb = (OH + rows - 1) / rows, n_tasks = blocks * n_rb;
    #pragma omp parallel if (n_tasks > 1)
    {{
        float* restrict acc = tscomp_thread_workspace((size_t)(2 * rows * OW * TS_MBL));
        float* restrict tile = acc + rows * OW * TS_MBL;
        #pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < n_tasks; ++t) {{
            const int64_t rb = t % n_rb, cb = (t / n_rb) % TS_NMB, g = (t / (n_rb * TS_NMB)) % TS_G;
            const int64_t n = t / (n_rb * TS_NMB * TS_G);
            const int64_t oh0 = rb * rows, R = min_i64(OH, oh0 + rows) - oh0, F = R * OW;
            const int64_t m0 = cb * TS_MBL, mv = min_i64(TS_MBL, TS_OCG - m0);
            const float* restrict wg = Wp + (g * TS_NMB + cb) * (TS_KH * TS_KW * TS_CG * TS_MBL);
            memset(acc, 0, (size_t)(F * TS_MBL) * sizeof(float));
            for (int64_t r = 0; r < R; ++r) {{
                const int64_t oh = oh0 + r;
                for (int64_t kh = 0; kh < TS_KH; ++kh) {{
                    const int64_t num = oh + PT - kh * TS_DH;
                    if (num < 0 || num % TS_SH) continue;
                    const int64_t ih = num / TS_SH;
                    if (ih >= H) continue;
                    const float* restrict xr = X + ((n * TS_C_IN + g * TS_CG) * H + ih) * W;
                    for (int64_t kw = 0; kw < TS_KW; ++kw) {{
                        /* input columns whose output ow = iw * SW + kw * DW - PL is in [0, OW) */
                        const int64_t off = kw * TS_DW - PL;
                        const int64_t iw_lo = max_i64(0, -ts_floordiv(off, TS_SW));
                        const int64_t iw_hi = min_i64(W, ts_floordiv(OW - 1 - off, TS_SW) + 1);
                        const float* restrict wk = wg + (kh * TS_KW + kw) * (TS_CG * TS_MBL);
                        for (int64_t iw = iw_lo; iw < iw_hi; ++iw) {{
                            float* restrict ap = acc + (r * OW + iw * TS_SW + off) * TS_MBL;
{load}
                            for (int64_t c = 0; c < TS_CG; ++c) {{
                                const {v.type} xv = {v.set1('xr[c * H * W + iw]')};
                                const float* restrict wc = wk + c * TS_MBL;
{fmas}
                            }}
{store}
                        }}
                    }}
                }}
            }}
            /* back to channel-major (tile[m][p] = acc[p][m]), then the fused epilogue */
            ts_transpose_matrix(acc, TS_MBL, F, TS_MBL, tile, F);
            conv_epilogue(tile, F, n, g * TS_OCG + m0, oh0 * OW, mv, F{names});
        }}
    }}
}}
"""])


def conv_transpose_rows(NB: int, G: int, n_mb: int, OH: int, OW: int, threads: int) -> int:
    """Output rows per task (the kernel computes the same rule in C): about ``TASK_POSITIONS``
    positions, and few enough rows that the tasks number ``TASKS_PER_THREAD`` per thread where the
    images, groups and channel blocks alone do not."""
    blocks = NB * G * n_mb
    want = -(-TASKS_PER_THREAD * threads // blocks)
    return max(1, min(OH, TASK_POSITIONS // max(OW, 1), -(-OH // want)))


class CompiledConvTranspose(CompiledConv):
    """The executor step: the built kernel; ``run`` and the native call as a Conv's, with the
    output sizes the ConvTranspose's own (not the Conv's window formula)."""

    def __init__(self, analysis: ConvTransposeAnalysis, isa: str):
        if VECTOR_WIDTH.get(isa, 1) < 8:
            analysis._fail(f"ConvTranspose kernels need AVX2 or AVX-512 ({isa} has no float vectors)")
        super().__init__(analysis, None, isa, l1_bytes=0)      # no L1 blocking: its tasks size by positions

    def _source(self) -> str:
        return conv_transpose_source(self.analysis, self.isa)

    def weight_layout(self) -> tuple:
        return ("transpose-blocks", self.analysis.G, VECTOR_WIDTH[self.isa], *self.analysis.channel_blocks(self.isa))

    def pack_weight(self, W: np.ndarray) -> np.ndarray:
        _, G, lanes, mb, n_mb = self.weight_layout()
        return prepack_conv_transpose(W, G, lanes, mb, n_mb)

    def sizes_at(self, xshape: tuple[int, ...], ev) -> tuple[int, ...]:
        a = self.analysis
        return a.runtime_sizes(xshape, tuple(ev(d) for d in a.out_shape[2:])) + (0, 0)

    def size_exprs(self) -> tuple:
        a = self.analysis
        return a.runtime_sizes(a.x_shape, a.out_shape[2:])

    def tasks(self, binding) -> int:
        xshape, (H, W, OH, OW, *_), *_ = self._ints(binding)
        a = self.analysis
        _, n_mb = a.channel_blocks(self.isa)
        rows = conv_transpose_rows(xshape[0], a.G, n_mb, OH, OW, get_num_threads())
        return xshape[0] * a.G * n_mb * -(-OH // rows)


__all__ = ["CompiledConvTranspose", "ConvTransposeAnalysis", "conv_transpose_rows", "conv_transpose_source", "prepack_conv_transpose"]
