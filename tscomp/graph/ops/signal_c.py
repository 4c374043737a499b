"""The DFT's native kernel: a mixed-radix FFT, with Bluestein's algorithm where the length has a
large prime factor, in double precision (FNet's token mixing, a spectrogram front end: no group
of such a model runs on the numpy fallback, and its requests stay on the C request path).

The writer (:func:`dft_c`, attached to the ``DFT`` registry entry at the bottom of this module)
reproduces the entry's numpy ``reference`` (:func:`tscomp.graph.ops.signal.dft_ref`): ONNX's layout
(the last axis holds the real part, or the real and imaginary parts), the transform along ``axis``
with ``dft_length`` zero padding or truncating each signal, ``onesided`` forward (RFFT: the
``floor(n/2) + 1`` non-redundant frequencies of a real signal) and inverse (IRFFT: the real signal
of a Hermitian spectrum), and the ``1/n`` scale of an inverse. The transform length may be a shape
expression (the sequence length): the plan -- the length's factors and twiddle tables, for
Bluestein the chirp and the transformed convolution kernel -- is built once per call, then every
signal (``outer x inner`` of them) is gathered into a contiguous work line, transformed and
scattered, signals in parallel, each wholly on one thread (the result does not depend on the
thread count).

The FFT is the textbook recursive decimation in time (Cooley-Tukey, any radix): a length
``n = p m`` transform is ``p`` transforms of length ``m`` over the strided sub-signals, combined by
``m`` butterflies of radix ``p`` (radix 2 and 4 written out, any other radix up to
:data:`MAX_RADIX` as a direct ``p``-point DFT); lengths with a larger prime factor go through
Bluestein's chirp-z identity ``jk = (j^2 + k^2 - (k - j)^2) / 2``, a circular convolution of a
power-of-two length ``M >= 2n - 1``. Chirp phases are reduced ``j^2 mod 2n`` in integers, so the
largest lengths keep full double precision. Inverse transforms conjugate before and after a forward
one.
"""
from __future__ import annotations

import numpy as np

from tscomp.graph.ops.registry import attach
from tscomp.graph.ops.signal import _axis_in_range, _kind

#: the largest prime factor the mixed-radix FFT handles with a direct butterfly (O(n p)); a length
#: with a larger one goes through Bluestein (three power-of-two FFTs of about 2n to 4n points)
MAX_RADIX = 31

#: signals transformed together, one per SIMD lane of doubles (8: one AVX-512 register per part)
LANES = 8

#: the FFT library every DFT kernel carries (static functions: one copy per kernel object)
FFT_C = r"""
#include <omp.h>
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
typedef struct { double re, im; } ts_cplx;
/* TS_V complex numbers, one per signal: the transforms of TS_V signals run in SIMD lanes */
typedef struct { double re[TS_V], im[TS_V]; } ts_vc;

static inline void ts_vc_mul(ts_vc *d, const ts_vc *s, ts_cplx w) {     /* d = s w, per lane */
    for (int v = 0; v < TS_V; ++v) {
        const double re = s->re[v], im = s->im[v];
        d->re[v] = re * w.re - im * w.im;
        d->im[v] = re * w.im + im * w.re;
    }
}

/* n's factors, fours first, then twos, threes, then the other odd primes ascending; their count */
static int ts_fft_factors(int64_t n, int64_t *f) {
    int k = 0;
    while (n % 4 == 0) { f[k++] = 4; n /= 4; }
    while (n % 2 == 0) { f[k++] = 2; n /= 2; }
    for (int64_t p = 3; p * p <= n; p += 2)
        while (n % p == 0) { f[k++] = p; n /= p; }
    if (n > 1) f[k++] = n;
    return k;
}

/* radix p > 5: Y[r] = sum_q t_q w_p^{q r} over the p values y[0], y[m], ..., y[(p - 1) m] */
static __attribute__((noinline)) void ts_butterfly_any(ts_vc *y, int64_t m, int64_t p, const ts_cplx *tw,
                                                       int64_t step) {
    ts_vc t[TS_FFT_MAX_RADIX];
    for (int64_t q = 0; q < p; ++q) t[q] = y[q * m];
    for (int64_t r = 0; r < p; ++r) {
        ts_vc s = t[0], u;
        for (int64_t q = 1; q < p; ++q) {
            ts_vc_mul(&u, &t[q], tw[((q * r) % p) * step]);
            for (int v = 0; v < TS_V; ++v) { s.re[v] += u.re[v]; s.im[v] += u.im[v]; }
        }
        y[r * m] = s;
    }
}

/* the radix-p butterfly of output k: y[k + q m] (q < p) twiddled by w_n^{q k}, then combined */
static inline void ts_butterfly(ts_vc *y, int64_t m, int64_t p, int64_t k, const ts_cplx *tw, int64_t tstep) {
    if (k)
        for (int64_t q = 1; q < p; ++q) ts_vc_mul(&y[q * m], &y[q * m], tw[q * k * tstep]);
    if (p == 2) {
        for (int v = 0; v < TS_V; ++v) {
            const double a_re = y[0].re[v], a_im = y[0].im[v], b_re = y[m].re[v], b_im = y[m].im[v];
            y[0].re[v] = a_re + b_re; y[0].im[v] = a_im + b_im;
            y[m].re[v] = a_re - b_re; y[m].im[v] = a_im - b_im;
        }
    } else if (p == 4) {                 /* w_4 = -i */
        for (int v = 0; v < TS_V; ++v) {
            const double a_re = y[0].re[v] + y[2 * m].re[v], a_im = y[0].im[v] + y[2 * m].im[v];
            const double b_re = y[0].re[v] - y[2 * m].re[v], b_im = y[0].im[v] - y[2 * m].im[v];
            const double c_re = y[m].re[v] + y[3 * m].re[v], c_im = y[m].im[v] + y[3 * m].im[v];
            const double d_re = y[m].re[v] - y[3 * m].re[v], d_im = y[m].im[v] - y[3 * m].im[v];
            y[0].re[v] = a_re + c_re;         y[0].im[v] = a_im + c_im;
            y[m].re[v] = b_re + d_im;         y[m].im[v] = b_im - d_re;
            y[2 * m].re[v] = a_re - c_re;     y[2 * m].im[v] = a_im - c_im;
            y[3 * m].re[v] = b_re - d_im;     y[3 * m].im[v] = b_im + d_re;
        }
    } else if (p == 3) {                 /* w_3 = -1/2 - i sqrt(3)/2 */
        const double h = 0.86602540378443864676;
        for (int v = 0; v < TS_V; ++v) {
            const double s_re = y[m].re[v] + y[2 * m].re[v], s_im = y[m].im[v] + y[2 * m].im[v];
            const double d_re = y[m].re[v] - y[2 * m].re[v], d_im = y[m].im[v] - y[2 * m].im[v];
            const double c_re = y[0].re[v] - 0.5 * s_re, c_im = y[0].im[v] - 0.5 * s_im;
            y[0].re[v] += s_re;               y[0].im[v] += s_im;
            y[m].re[v] = c_re + h * d_im;     y[m].im[v] = c_im - h * d_re;
            y[2 * m].re[v] = c_re - h * d_im; y[2 * m].im[v] = c_im + h * d_re;
        }
    } else {
        ts_butterfly_any(y, m, p, tw, m * tstep);
    }
}

/* y[0, n) = DFT_n of x[0], x[stride], ..., x[(n - 1) stride] (n > 1), decimation in time;
   tw[j] = e^{-2 pi i j / N} with N = n tstep */
static void ts_fft_rec(const ts_vc *x, int64_t stride, ts_vc *y, int64_t n, const int64_t *f,
                       const ts_cplx *tw, int64_t tstep) {
    const int64_t p = f[0], m = n / p;
    if (m > 1)        /* the sub-signals x[q + p j'] transformed into y[q m, (q + 1) m) */
        for (int64_t q = 0; q < p; ++q) ts_fft_rec(x + q * stride, stride * p, y + q * m, m, f + 1, tw, tstep * p);
    else
        for (int64_t q = 0; q < p; ++q) y[q] = x[q * stride];
    for (int64_t k = 0; k < m; ++k) ts_butterfly(y + k, m, p, k, tw, tstep);
}

/* the plan of a length-n DFT: factors and twiddles, or Bluestein's (power-of-two M) tables */
typedef struct {
    int64_t n, M, f[64], fM[64];
    ts_cplx *tw, *chirp, *kernel;
} ts_dft_plan;

static int64_t ts_dft_largest_factor(int64_t n) {
    int64_t f[64], largest = 1;
    const int k = ts_fft_factors(n, f);
    for (int i = 0; i < k; ++i) largest = f[i] > largest ? f[i] : largest;
    return largest;
}

/* Bluestein's convolution length for n (0: the mixed-radix FFT serves n itself) */
static int64_t ts_dft_bluestein_length(int64_t n) {
    if (n < 1 || ts_dft_largest_factor(n) <= TS_FFT_MAX_RADIX) return 0;
    int64_t M = 1;
    while (M < 2 * n - 1) M *= 2;
    return M;
}

/* the plan's tables (complex numbers) and one thread's work lines (lane bundles) */
static int64_t ts_dft_table_size(int64_t n) { int64_t M = ts_dft_bluestein_length(n); return M ? M + n + M : n; }
static int64_t ts_dft_work_size(int64_t n) { return 2 * n + 2 * ts_dft_bluestein_length(n); }

static void ts_twiddles(ts_cplx *tw, int64_t N) {
    for (int64_t j = 0; j < N; ++j) {
        const double a = -2.0 * M_PI * (double)j / (double)N;
        tw[j].re = cos(a); tw[j].im = sin(a);
    }
}

static void ts_dft_plan_init(ts_dft_plan *P, int64_t n, ts_cplx *tables) {
    P->n = n;
    P->M = ts_dft_bluestein_length(n);
    P->tw = tables;
    if (!P->M) {
        ts_fft_factors(n, P->f);
        ts_twiddles(P->tw, n);
        return;
    }
    const int64_t M = P->M;
    ts_fft_factors(M, P->fM);
    ts_twiddles(P->tw, M);
    P->chirp = tables + M;               /* c_j = e^{-pi i j^2 / n}, the phase reduced mod 2n exactly */
    P->kernel = tables + M + n;          /* FFT_M of b: b_d = conj(c_|d|) for |d| < n, circularly */
    for (int64_t j = 0; j < n; ++j) {
        const int64_t j2 = (int64_t)((__int128)j * j % (2 * n));
        const double a = -M_PI * (double)j2 / (double)n;
        P->chirp[j].re = cos(a); P->chirp[j].im = sin(a);
    }
    ts_vc *b = (ts_vc *)malloc(sizeof(ts_vc) * (size_t)M * 2);   /* lane 0 carries b */
    for (int64_t d = 0; d < M; ++d) for (int v = 0; v < TS_V; ++v) { b[d].re[v] = 0.0; b[d].im[v] = 0.0; }
    for (int64_t d = 0; d < n; ++d) {
        b[d].re[0] = P->chirp[d].re; b[d].im[0] = -P->chirp[d].im;
        if (d) b[M - d] = b[d];
    }
    ts_fft_rec(b, 1, b + M, M, P->fM, P->tw, 1);
    for (int64_t d = 0; d < M; ++d) { P->kernel[d].re = b[M + d].re[0]; P->kernel[d].im = b[M + d].im[0]; }
    free(b);
}

/* y = DFT_n(x) for TS_V contiguous signals; work: 2 M bundles (Bluestein) */
static void ts_dft_lines(const ts_dft_plan *P, const ts_vc *x, ts_vc *y, ts_vc *work) {
    const int64_t n = P->n, M = P->M;
    if (n == 1) { y[0] = x[0]; return; }
    if (!M) { ts_fft_rec(x, 1, y, n, P->f, P->tw, 1); return; }
    ts_vc *a = work, *A = work + M;
    for (int64_t j = 0; j < n; ++j) ts_vc_mul(&a[j], &x[j], P->chirp[j]);
    for (int64_t j = n; j < M; ++j) for (int v = 0; v < TS_V; ++v) { a[j].re[v] = 0.0; a[j].im[v] = 0.0; }
    ts_fft_rec(a, 1, A, M, P->fM, P->tw, 1);
    for (int64_t j = 0; j < M; ++j) {     /* the product, conjugated: the inverse FFT as a forward one */
        ts_vc_mul(&A[j], &A[j], P->kernel[j]);
        for (int v = 0; v < TS_V; ++v) A[j].im[v] = -A[j].im[v];
    }
    ts_fft_rec(A, 1, a, M, P->fM, P->tw, 1);
    const double inv = 1.0 / (double)M;
    for (int64_t k = 0; k < n; ++k) {
        for (int v = 0; v < TS_V; ++v) { a[k].re[v] *= inv; a[k].im[v] *= -inv; }
        ts_vc_mul(&y[k], &a[k], P->chirp[k]);
    }
}
""".replace("TS_FFT_MAX_RADIX", str(MAX_RADIX)).replace("TS_V", str(LANES))


def dft_c(w) -> None:
    """``DFT`` (opsets 17 and 20) as described in the module docstring; refused (numpy fallback,
    naming why) where the axis or ``dft_length`` is known only at run time, or for an element type
    other than float32/float64."""
    x, y = w.arg(0), w.out(0)
    if x.dtype not in (np.float32, np.float64):
        w.fail(f"elements of {x.dtype}: the C kernel transforms float32 and float64")
    rank = len(x.shape)
    axis = _given_axis(w)
    a = _axis_in_range(axis, rank, w.fail)
    inverse, onesided = bool(w.attr("inverse", 0)), bool(w.attr("onesided", 0))
    n = _transform_length(w, x.shape[a], inverse, onesided)
    parts, out_parts = int(x.shape[-1]), (1 if inverse and onesided else 2)
    outer, inner = w.numel(x.shape[:a]), w.numel(x.shape[a + 1:rank - 1])
    n_in, n_out = w.c(x.shape[a]), w.c(y.shape[a])
    tables = w.scratch("dft_tables", "ts_cplx", f"ts_dft_table_size({n})")
    work = w.scratch("dft_work", "ts_vc", f"(int64_t)omp_get_max_threads() * ts_dft_work_size({n})")
    w.statics.append(FFT_C)
    w.emit(f"/* {_kind(inverse, onesided)} along axis {a}: [{outer}] x [{n_in} -> {n_out}] x [{inner}] signals "
           f"of {parts} part(s), transform length {n}, {LANES} signals at a time */")
    w.emit(f"const int64_t n = {n}, n_in = {n_in}, n_out = {n_out}, inner = {inner}, lines = ({outer}) * inner;")
    w.emit("if (n >= 1) {")
    w.emit("ts_dft_plan plan;")
    w.emit(f"ts_dft_plan_init(&plan, n, {tables});")
    w.emit("const int64_t per_thread = ts_dft_work_size(n);")
    w.parallel_for([("bundle", f"(lines + {LANES - 1}) / {LANES}")], work="lines * n * 16")
    w.emit(f"    ts_vc *xs = {work} + (int64_t)omp_get_thread_num() * per_thread, *ys = xs + n, *wk = ys + n;")
    w.emit(f"    int64_t src[{LANES}], dst[{LANES}];     /* each lane's signal: its first element in and out */")
    w.emit(f"    const int64_t first = bundle * {LANES}, used = lines - first < {LANES} ? lines - first : {LANES};")
    w.emit(f"    for (int v = 0; v < {LANES}; ++v) {{")
    w.emit("        const int64_t line = first + (v < used ? v : 0), o = line / inner, q = line % inner;")
    w.emit("        src[v] = o * n_in * inner + q; dst[v] = o * n_out * inner + q;")
    w.emit("    }")
    _gather(w, x, parts, inverse, onesided)
    w.emit("    ts_dft_lines(&plan, xs, ys, wk);")
    scale = "(1.0 / (double)n)" if inverse else "1.0"
    w.emit("    for (int64_t k = 0; k < n_out; ++k)")
    w.emit("        for (int v = 0; v < used; ++v) {")
    w.emit(f"            {y.at(f'(dst[v] + k * inner) * {out_parts}')} = ({y.ctype})(ys[k].re[v] * {scale});")
    if out_parts == 2:    # an inverse's conjugated output: its imaginary part changes sign
        sign = "-" if inverse else ""
        w.emit(f"            {y.at(f'(dst[v] + k * inner) * 2 + 1')} = ({y.ctype})({sign}ys[k].im[v] * {scale});")
    w.emit("        }")
    w.emit("}")
    w.emit("}")


def _given_axis(w) -> int:
    if w.opset >= 20:
        if not w.has_arg(2):
            return -2
        given = w.const_ints(2)
        if given is None:
            w.fail("axis (input 2) known only at run time")
        return given[0]
    return int(w.attr("axis", 1))


def _transform_length(w, extent, inverse: bool, onesided: bool) -> str:
    """The transform length as C: ``dft_length`` (a number or a shape expression), else the
    signal's extent (an IRFFT: ``2 (m - 1)`` for ``m`` frequencies)."""
    if w.has_arg(1):
        given = w.const_exprs(1)
        if given is None or len(given) != 1:
            w.fail("dft_length (input 1) known only at run time")
        return w.c(given[0])
    return w.c(2 * (extent - 1)) if inverse and onesided else w.c(extent)


def _gather(w, x, parts: int, inverse: bool, onesided: bool) -> None:
    """The bundle's signals into ``xs[0, n)``, complex, zero padded or truncated to ``n`` (an
    IRFFT: the Hermitian spectrum from its first ``n/2 + 1`` frequencies); an inverse's conjugated.
    Lanes past the last signal repeat the bundle's first (computed, never stored)."""
    def elem(j: str, part: int) -> str:
        return f"(double){x.at(f'(src[v] + ({j}) * inner) * {parts} + {part}')}"
    sign = "-" if inverse else ""
    im = (lambda j: f"{sign}{elem(j, 1)}") if parts == 2 else (lambda j: "0.0")
    top = "n / 2 + 1" if inverse and onesided else "n"    # an IRFFT's later half: conjugates
    w.emit(f"    for (int64_t j = 0; j < {top}; ++j)")
    w.emit(f"        for (int v = 0; v < {LANES}; ++v) {{")
    w.emit(f"            if (j < n_in) {{ xs[j].re[v] = {elem('j', 0)}; xs[j].im[v] = {im('j')}; }}")
    w.emit("            else { xs[j].re[v] = 0.0; xs[j].im[v] = 0.0; }")
    w.emit("        }")
    if inverse and onesided:
        w.emit("    for (int64_t k = n / 2 + 1; k < n; ++k)")
        w.emit(f"        for (int v = 0; v < {LANES}; ++v) {{ xs[k].re[v] = xs[n - k].re[v]; "
               f"xs[k].im[v] = -xs[n - k].im[v]; }}")


attach("DFT", c_kernel=dft_c)

__all__ = ["FFT_C", "LANES", "MAX_RADIX", "dft_c"]
