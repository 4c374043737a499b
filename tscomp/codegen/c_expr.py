"""Index arithmetic of generated C: where one element of a fused expression lives in memory.

A fused group reads its materialized inputs through chains of views (reshape /
permute / expand / slice, :mod:`tscomp.graph.views`) and numpy broadcasting of op
arguments; none of these is ever materialized (TSCompiler §4.2, "reshapes and
transposes ... absorbed"). Code generation needs, for an element of a node at a
multi-index, the multi-index of the element it reads in the node's source — a tuple
of SymPy integer expressions over loop variables and shape symbols. This module:

* composes the index maps (:func:`view_index`, :func:`broadcast_index`,
  :func:`reshape_index` — reshape splits both shapes into chunks of equal extent
  products, so a reshape that only splits or merges axes costs no division);
* simplifies ``floor`` / ``Mod`` using the loop variables' ranges
  (:class:`IndexContext`), so composed reshapes cancel
  (``(b*L + l) // L`` is ``b`` when ``0 <= l < L``);
* prints them as C over ``int64_t`` (:func:`c_index`): ``floor(a/b)`` of
  non-negative operands becomes ``a / b``, ``Mod`` becomes ``%``, anything whose
  sign is not evident goes through the ``ts_floordiv``/``ts_mod`` helpers of
  :data:`PRELUDE`; and element literals (:func:`c_literal`).

Slice starts follow ONNX clamping; a start whose clamped value the symbol ranges
decide is resolved here, otherwise the clamping becomes run-time C (``Piecewise``/
``Min``/``Max`` printed as ternaries and helpers).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import re
from typing import Sequence

import numpy as np
import sympy

from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.symbols import FloorSqrt, SymbolTable, fold_nested_rounding, numel, same
from tscomp.graph.views import ViewOp

Index = tuple[sympy.Expr, ...]

#: helpers generated index code may call (all int64_t)
PRELUDE = """\
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

/* floor division and Python-style modulo, for operands whose sign is not known statically */
static inline int64_t ts_floordiv(int64_t a, int64_t b)
{ int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t ts_mod(int64_t a, int64_t b)
{ int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t ts_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t ts_max(int64_t a, int64_t b) { return a > b ? a : b; }
/* floor(sqrt(n)) exactly (a shape symbol's integer square root: a token grid's side) */
static inline int64_t ts_isqrt(int64_t n)
{ if (n <= 0) return 0; int64_t r = (int64_t)sqrt((double)n); while (r * r > n) --r; while ((r + 1) * (r + 1) <= n) ++r; return r; }

/* Data-dependent indices (Gather*, embedding lookups) are range-checked. A kernel with an error
 * record (int64_t[4]: check id + 1, value, flat position, extent) defines TSCOMP_ERR_RECORD as
 * its parameter before this prelude; the first failing thread records itself there and the
 * lookup reads element 0 instead, so nothing is read out of bounds and the kernel returns 1.
 * A kernel without a record traps (a clean abort, never an out-of-bounds read). */
#ifndef TSCOMP_ERR_RECORD
#define TSCOMP_ERR_RECORD ((int64_t *)0)
#endif
__attribute__((noinline, cold))
static void ts_index_fail(int64_t *err, int64_t check, int64_t value, int64_t pos, int64_t extent)
{
    if (!err) __builtin_trap();
    int64_t none = 0;
    if (__atomic_compare_exchange_n(&err[0], &none, check + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        err[1] = value; err[2] = pos; err[3] = extent;
    }
}
/* ``v`` counted from the end when negative (ONNX Gather semantics), checked against [0, extent) */
static inline int64_t ts_index(int64_t v, int64_t extent, int64_t check, int64_t pos, int64_t *err)
{
    const int64_t g = v < 0 ? v + extent : v;
    if (__builtin_expect((uint64_t)g >= (uint64_t)extent, 0)) { ts_index_fail(err, check, v, pos, extent); return 0; }
    return g;
}
"""

#: erf(x) for float as x·P(x²)/Q(x²) on [-4, 4] (float erf is ±1 beyond); the coefficients
#: are those of XLA's/Eigen's ErfImpl32. Plain arithmetic, so an `omp simd` loop vectorizes it.
ERF_HELPER = """/* erf for float: rational approximation on [-4, 4], |error| < 5e-7; vectorizable. */
#pragma omp declare simd notinbranch
static inline float tscomp_erff(float x)
{
    x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);  /* NaN passes through */
    const float x2 = x * x;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return x * p / q;
}
"""


#: ``ts_expf``: a vectorizable expf for kernels that call it (Softmax, LogSumExp); ``ts_expf_core``
#: its polynomial without the special cases, for helpers that clamp their argument first
EXP_HELPER = """\
/* e^x for x in [-87, 88.72] (no special values): Cephes' range reduction and degree-7 polynomial,
   relative error ~2e-7 */
#pragma omp declare simd notinbranch
static inline float ts_expf_core(float xc)
{
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   /* round to nearest */
    float r = fmaf(n, -0.693359375f, xc);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r + 1.0f);
    union { int32_t i; float f; } scale = { .i = ((int32_t)n + 126) << 23 };   /* 2^(n-1) */
    return p * scale.f * 2.0f;
}
/* expf that vectorizes in `omp simd` loops (libm's does not without -ffast-math): the core above,
   NaN and overflow as expf, 0 below -87 (where expf's results are subnormal, < 1.7e-38) */
#pragma omp declare simd notinbranch
static inline float ts_expf(float x)
{
    float xc = x < -87.0f ? -87.0f : x;          /* selects, not fminf/fmaxf: those stay libm calls */
    xc = xc > 88.72283f ? 88.72283f : xc;        /* ln(FLT_MAX): expf overflows past it */
    const float y = ts_expf_core(xc);
    return x != x ? x : (x < -87.0f ? 0.0f : (x > 88.72283f ? INFINITY : y));
}
"""


#: ``ts_sigmoidf``: the logistic function for float (the registry's Sigmoid, so SiLU's x * sigmoid(x)).
#: Clamping the argument to [-87, 87] first makes ``ts_expf``'s three special-case selects unneeded:
#: a third less work per element (a 16->96 1x1 Conv + SiLU at 112x112 of EfficientNet-B0 spent more
#: time in its sigmoid than in its GEMM)
SIGMOID_HELPER = """\
/* 1 / (1 + e^-x) for float, vectorizable: relative error < 3e-7; at |x| > 87 the clamped argument's
   value (1 or 1.6e-38, within 2e-38 of the exact one); NaN passes through */
#pragma omp declare simd notinbranch
static inline float ts_sigmoidf(float x)
{
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 87.0f ? 87.0f : xc;
    return 1.0f / (1.0f + ts_expf_core(-xc));
}
"""


#: ``tanhf`` for float, vectorizable: the registry's templates (Tanh, GELU's tanh form) call
#: ``tanhf``; a source that does gets this helper and ``tanhf`` is redirected to it (CPU C only; the
#: SIMT dialects keep their own tanh)
TANH_HELPER = """\
/* tanhf that vectorizes in `omp simd` loops (libm's tanhf is a scalar call): Eigen's rational
   approximation x*P(x^2)/Q(x^2) on [-7.905, 7.905] (+-1 in float beyond), |error| < 4e-7 on [-20, 20],
   x itself below 4e-4; NaN passes through */
#pragma omp declare simd notinbranch
static inline float ts_tanhf(float x)
{
    const float c = 7.90531110763549805f;
    const float xc = x < -c ? -c : (x > c ? c : x);
    const float x2 = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    const float y = xc * p / q;
    return fabsf(x) < 0.0004f ? x : y;   /* not (x < 0 ? -x : x) < c: GCC made that a select of two
                                               comparisons, which kept whole loops from vectorizing */
}
#define tanhf(x) ts_tanhf(x)
"""


#: the registry's templates (Sigmoid, SiLU's x * sigmoid(x), Exp, Softplus) call ``expf``: libm's is a
#: scalar call that keeps the whole loop scalar (GCC vectorizes libm only under -ffast-math), so a
#: source that calls it gets :data:`EXP_HELPER` and ``expf`` is redirected to ``ts_expf`` (CPU C only;
#: the SIMT dialects keep their own exp). A 1x1 Conv + SiLU of MobileViT (32 x 48 x 48 outputs) ran
#: 130 us with the libm call.
EXPF_REDIRECT = "#define expf(x) ts_expf(x)\n"


QUOTIENT_HELPER = """\
/* x / s for a constant s, given r = 1/s rounded: the product corrected twice by the exact FMA
   remainder x - q*s (Markstein's iteration), equal to the division for every |x| >= 2^-92 (checked
   over every float whose quotient is below 7e4 in magnitude and 2^28 spread ones, for 24 scales
   from 1e-9 to 60: benchmarks/quotient_exhaustive.py), within 2 ulp below that, where the
   remainder underflows; infinities, NaN and a zero's sign as the division. A vector division
   issues at about a tenth of the FMA rate, and QuantizeLinear divides every element of a QDQ
   model's activations by its scale */
#pragma omp declare simd uniform(s, r) notinbranch
static inline float ts_quotient(float x, float s, float r)
{
    const float q0 = x * r;
    const float q1 = fmaf(fmaf(-q0, s, x), r, q0);
    const float q2 = fmaf(fmaf(-q1, s, x), r, q1);
    /* the product where it is exact already (0 keeps its sign) or not finite (an infinite x made
       the remainder NaN); written without `q2 != q2`, which kept GCC from vectorizing the loops
       this is inlined into */
    return (q0 == 0.0f || !(fabsf(q0) <= 3.40282347e38f)) ? q0 : q2;
}
"""


def math_helpers(code: str) -> str:
    """The vectorizable math helpers ``code`` calls (each defined once per source)."""
    calls_expf = re.search(r"\bexpf\(", code) is not None
    sigmoid = "ts_sigmoidf(" in code
    return (EXP_HELPER if calls_expf or sigmoid or "ts_expf(" in code else "") + \
        (EXPF_REDIRECT if calls_expf else "") + (SIGMOID_HELPER if sigmoid else "") + \
        (ERF_HELPER if "tscomp_erff(" in code else "") + (TANH_HELPER if re.search(r"\btanhf\(", code) else "") + \
        (QUOTIENT_HELPER if "ts_quotient(" in code else "")

_C_KEYWORDS = set("""auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef union unsigned void
volatile while _Bool _Complex _Imaginary main errno assert exp log sqrt floor ceil pow fmin fmax abs fabs erf tanh
isnan isinf isfinite malloc free INFINITY NAN scale""".split())


def index_var(name: str) -> sympy.Symbol:
    """A loop (or gathered) index variable: a non-negative integer."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


#: names the GEMM macro-kernel declares where its epilogue expressions (shape symbols among them)
#: are evaluated -- kernel and micro-kernel parameters, locals, macros -- and C keywords
GEMM_KERNEL_NAMES = frozenset({
    "X", "Wp", "Y", "M", "N", "K", "NP", "MR", "NR", "MC", "NC", "KC", "N_NBLOCKS", "N_KBLOCKS",
    "acc", "i", "j", "r", "c", "k", "x", "tile", "yrow", "acc_t", "xp", "wp", "wn", "ct", "first", "last",
    "i0", "j0", "mv", "nv", "kl", "wk", "xk", "y", "lane", "t", "nb", "mb", "m0", "nw", "wblock", "pull", "stream_log2",
    "kb", "k0", "jp", "wpanel", "wnext", "jj", "ip", "xpack", "cbuf", "n_mblocks", "n_tasks", "mc",
    "nc", "nth", "n_nblocks", "panels", "parts", "omp_get_max_threads", "row_tiles", "want", "tiles_per",
    "tiles_extra", "BALANCE_TASKS_PER_THREAD", "block_tiles", "TALL_ROWS",
    "min_i64", "pack_x", "ts_bf16_row", "micro_kernel", "micro_kernel_tail", "rows", "row_pass", "a_prologue", "Xa", "tscomp_erff",
    "int", "float", "double", "char", "void", "const", "restrict", "return", "if", "else", "for",
    "while", "do", "static", "inline", "sizeof", "int64_t", "int32_t",
})


def c_symbol_name(name: str) -> str:
    """C name of a shape symbol: its own name unless that could clash with C or with the generated
    locals and parameters (short letters + digits such as ``i0``, ``t12``, ``mean0``, ``in3``; the
    GEMM kernel's ``M``, ``N``, ``K``, ``tile``, ...)."""
    if name in _C_KEYWORDS or name in GEMM_KERNEL_NAMES or re.fullmatch(r"[a-z]{1,5}\d+", name) \
            or name.startswith(("ts_", "sym_")):
        return "sym_" + name
    return name




def strides(shape: Sequence) -> list[sympy.Expr]:
    """Row-major strides (in elements) of a symbolic shape."""
    out, acc = [], sympy.Integer(1)
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return out[::-1]


def linearize(idx: Index, shape: Sequence) -> sympy.Expr:
    return sympy.Add(*[i * s for i, s in zip(idx, strides(shape)) if i != 0])


class IndexContext:
    """Ranges of index variables (inclusive upper bounds) and the symbol table's ranges, used to
    simplify ``floor``/``Mod`` and to decide slice clamping."""

    def __init__(self, symbols: SymbolTable | None = None):
        self.symbols = symbols
        self.upper_bounds: dict[sympy.Symbol, sympy.Expr] = {}

    def var(self, name: str, extent) -> sympy.Symbol:
        v = index_var(name)
        self.upper_bounds[v] = sympy.sympify(extent) - 1
        return v

    # ------------------------------------------------------------ facts
    def nonneg(self, e) -> bool:
        """True if ``e >= 0`` follows from its form (index variables and shape symbols are >= 0)."""
        e = sympy.sympify(e)
        if e.is_Number:
            return e >= 0
        if e.is_Symbol:
            return bool(e.is_nonnegative) or e in self.upper_bounds
        if isinstance(e, (sympy.Add, sympy.Mul)):
            return all(self.nonneg(a) for a in e.args)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            return self.nonneg(e.args[0])
        if isinstance(e, sympy.Mod):
            return self.nonneg(e.args[1]) and self.positive(e.args[1])
        if isinstance(e, sympy.Pow):   # a power of a non-negative base, or a reciprocal of a positive one
            return e.exp.is_Integer and (e.exp > 0 and self.nonneg(e.base) or e.exp < 0 and self.positive(e.base))
        if isinstance(e, (sympy.Min, sympy.Max)):
            return all(self.nonneg(a) for a in e.args)
        return False

    def positive(self, e) -> bool:
        e = sympy.sympify(e)
        if e.is_Number:
            return e > 0
        if e.is_positive:
            return True
        return self.symbols is not None and not e.free_symbols & set(self.upper_bounds) \
            and self.symbols.bounds(e)[0] > 0

    def upper(self, e) -> sympy.Expr | None:
        """A symbolic upper bound of a non-negative index expression, or None."""
        e = sympy.sympify(e)
        if e.is_Number:
            return e
        if e.is_Symbol:
            return self.upper_bounds.get(e, e if e.is_nonnegative else None)
        if isinstance(e, sympy.Add):
            parts = []
            for t in e.args:
                c, m = t.as_coeff_Mul()
                if c < 0:  # c * m with m >= 0 is at most 0
                    if not self.nonneg(m):
                        return None
                    continue
                u = self.upper(t)
                if u is None:
                    return None
                parts.append(u)
            return sympy.Add(*parts)
        if isinstance(e, sympy.Mul):
            parts = []
            for f in e.args:
                u = self.upper(f) if self.nonneg(f) else None
                if u is None:
                    return None
                parts.append(u)
            return sympy.Mul(*parts)
        if isinstance(e, sympy.Mod):
            return e.args[1] - 1 if self.positive(e.args[1]) else None
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            u = self.upper(num)
            if u is None or not self.positive(den):
                return None
            whole = sympy.cancel((u + 1) / den)
            if sympy.fraction(whole)[1] == 1:   # u + 1 = whole * den: floor(u / den) = whole - 1
                return sympy.expand(whole - 1)
            return sympy.floor(u / den)
        return None

    def prove_le(self, a, b) -> bool:
        """``a <= b`` for every value of the variables and symbols in range."""
        diff = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
        if diff.is_Number:
            return diff >= 0
        if self.nonneg(diff):
            return True
        if self.symbols is not None and not diff.free_symbols & set(self.upper_bounds):
            return self.symbols.prove_le(0, diff)
        return False

    def below(self, e, bound) -> bool:
        """``0 <= e < bound`` everywhere."""
        if not self.nonneg(e):
            return False
        u = self.upper(e)
        return u is not None and self.prove_le(u, sympy.sympify(bound) - 1)

    def collapse(self, off) -> sympy.Expr:
        """A flat offset delinearized and linearized again, back to its flat form, over any number
        of axes: ``W*floor(i/W) + Mod(i, W)`` is ``i``, and so is ``Mod(i, W) + W*Mod(floor(i/W), H)
        + H*W*floor(i/(H*W))`` (a [B*H*W] row index viewed as [B, H, W] and flattened again), since
        ``floor(floor(i/W)/H)`` is ``floor(i/(H*W))`` for positive ``W`` and ``H`` -- which the
        symbol ranges decide when the extents are expressions (``floor(height/4)``). Returned only
        when shorter than ``off``: the fused families compare where an epilogue reads with where it
        stores, and print the result."""
        off = sympy.sympify(off)
        if not off.has(sympy.Mod):
            return off
        flat = self.without_mods(off)
        return flat if sympy.count_ops(flat) < sympy.count_ops(off) else off

    def without_mods(self, off) -> sympy.Expr:
        """``off`` with every ``Mod(a, b)`` written ``a - b*floor(a/b)``, nested floors folded and
        whole multiples taken out of the floors: one canonical form, to compare two index expressions
        by (``Mod(i, H*W)`` and ``W*floor(Mod(i, H*W)/W) + Mod(i, W)`` are both ``i - H*W*floor(i/(H*W))``)."""
        flat = sympy.sympify(off).replace(sympy.Mod, lambda a, b: a - b * sympy.floor(a / b))
        flat = sympy.expand(flat.replace(lambda x: isinstance(x, sympy.floor) and x.args[0].has(sympy.floor),
                                         lambda f: fold_nested_rounding(f, self.positive)))
        return sympy.expand(self.simplify(flat))   # the floors the Mods became, with whole multiples taken out

    # ------------------------------------------------------------ simplification
    def simplify(self, e) -> sympy.Expr:
        e = sympy.sympify(e)
        if e.is_Atom:
            return e
        args = [self.simplify(a) for a in e.args]
        if isinstance(e, sympy.floor):
            return self._floor(args[0])
        if isinstance(e, sympy.Mod):
            return self._mod(*args)
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(e)
        e = e.func(*args) if args != list(e.args) else e
        return self._recombine(e) if isinstance(e, sympy.Add) else e

    @staticmethod
    def _recombine(e: sympy.Add) -> sympy.Expr:
        """``k*a*floor(x/a) + k*Mod(x, a)`` is ``k*x`` (a flat index split and joined again; ``k = -1``:
        a channel ``c`` less its block and lane, ``c - 4*floor(c/4) - Mod(c, 4)``, is 0)."""
        terms = list(e.args)
        for t in list(terms):
            k, m = t.as_coeff_Mul()
            if isinstance(m, sympy.Mod) and t in terms:
                x, a = m.args
                whole = k * a * sympy.floor(x / a)
                match = next((u for u in terms if u is not t and (u == whole or sympy.expand(u - whole) == 0)), None)
                if match is not None:
                    terms.remove(t)
                    terms.remove(match)
                    terms.append(k * x)
        return sympy.Add(*terms) if len(terms) != len(e.args) else e

    def _floor(self, arg) -> sympy.Expr:
        num, den = sympy.fraction(sympy.together(arg))
        if den == 1:
            return num
        quotient, rest = [], []   # num = den * sum(quotient) + sum(rest)
        for t in sympy.Add.make_args(sympy.expand(num)):
            q = sympy.cancel(t / den)
            if sympy.fraction(q)[1] == 1:
                quotient.append(q)
            else:
                rest.append(t)
        q, r = sympy.Add(*quotient), sympy.Add(*rest)
        if r != 0 and not den.is_Number:
            q2, r = _divide_out(r, den)
            q = q + q2
            quotient = quotient or q2 != 0
        if r == 0 or self.below(r, den):
            return q
        scaled = self._small_remainder(r, den)
        if scaled is not None and self.positive(scaled[1]):   # floor((c*A + s)/(c*B)), 0 <= s < c: floor(A/B)
            return q + self._floor(scaled[0] / scaled[1])
        return q + sympy.floor(r / den) if quotient else sympy.floor(num / den)

    def _small_remainder(self, a, m) -> tuple | None:
        """``(A, B, s, c)`` where ``a = c*A + s`` and ``m = c*B`` for an integer ``c > 1`` dividing
        ``m``'s coefficient, ``A`` integer-valued and ``0 <= s < c`` in every binding: a flat index
        whose trailing axis of extent ``c`` a view keeps (a row kernel's ``16*row + r0``, ``r0 < 16``)
        then divides as its row alone -- ``floor(a/m) = floor(A/B)``, ``Mod(a, m) = c*Mod(A, B) + s``
        -- and the row's divisions leave the innermost loop. None when no such ``c``."""
        coeff, _ = sympy.sympify(m).as_coeff_Mul()
        if not coeff.is_Integer or coeff <= 1:
            return self._symbolic_small_remainder(a, m)
        terms = sympy.Add.make_args(sympy.expand(a))
        for c in sorted(sympy.divisors(int(coeff)), reverse=True)[:-1]:
            whole = [t for t in terms if t.as_coeff_Mul()[0].is_Integer and t.as_coeff_Mul()[0] % c == 0]
            small = sympy.Add(*[t for t in terms if t not in whole])
            if whole and small != 0 and self.below(small, c):
                return sympy.expand(sympy.Add(*whole) / c), sympy.expand(m / c), small, sympy.Integer(c)
        return self._symbolic_small_remainder(a, m)

    def _symbolic_small_remainder(self, a, m) -> tuple | None:
        """:meth:`_small_remainder` where ``c`` is a symbolic factor of ``m``: an image's position
        count ``P = (ceiling(H/4) - 1)*(ceiling(W/4) - 1)``, when ``a = c*P + p`` (channel ``c``,
        position ``p < P``) is divided by ``4*P`` (GroupNorm's [N, groups, C/groups * P] view of a
        Conv's [N, C, P]): ``floor(a / (4*P))`` is ``floor(c / 4)``. The expanded polynomial's upper
        bound is too loose to show ``c*P + p < 4*P*(c//4 + 1)``; dividing by ``P`` first is exact.
        Candidates: products of ``m``'s non-numeric factors, most factors first."""
        m = sympy.sympify(m)
        if m.is_Number or not sympy.sympify(a).free_symbols & set(self.upper_bounds):
            return None
        try:
            _, factors = sympy.factor_list(m)
        except (sympy.PolynomialError, sympy.polys.polyerrors.GeneratorsError):
            return None
        symbolic = [f for f, k in factors for _ in range(k) if not f.is_Number]
        for size in range(len(symbolic), 0, -1):
            for chosen in itertools.combinations(symbolic, size):
                # positive factor by factor: the expanded product's interval is too loose
                if not all(self.positive(f) for f in chosen):
                    continue
                c = sympy.expand(sympy.Mul(*chosen))
                whole, small = _divide_out(sympy.expand(a), c)
                if whole == 0 or small == 0 or not self.below(small, c):
                    continue
                b = sympy.cancel(m / c)
                if sympy.fraction(b)[1] == 1:
                    return sympy.expand(whole), sympy.expand(b), small, c
        return None

    def _mod(self, a, m) -> sympy.Expr:
        e = sympy.Mod(a, m)
        if not isinstance(e, sympy.Mod):
            return e
        a, m = e.args
        if self.below(a, m):
            return a
        scaled = self._small_remainder(a, m)
        if scaled is not None and self.nonneg(scaled[0]) and self.positive(scaled[1]):
            big, small_m, small, c = scaled
            return c * self._mod(big, small_m) + small
        # drop multiples of m that SymPy keeps (symbolic m): a = k*m + r
        keep = [t for t in sympy.Add.make_args(sympy.expand(a)) if sympy.fraction(sympy.cancel(t / m))[1] != 1]
        r = sympy.Add(*keep)
        if r == a and not m.is_Number:   # a multiple spread over terms (k*W + k = k*(W + 1)): divide
            k, rest = _divide_out(sympy.expand(a), m)
            if k != 0:
                r = rest
        if r != a:
            r = self._recombine(r) if isinstance(r, sympy.Add) else r
            return r if self.below(r, m) else sympy.Mod(r, m)
        return e

    def _piecewise(self, e: sympy.Piecewise) -> sympy.Expr:
        pieces = []
        for value, cond in e.args:
            value = self.simplify(value)
            decided = self.decide(cond)
            if decided is False:
                continue
            if decided is True or cond is sympy.true:
                if not pieces:
                    return value
                pieces.append((value, True))
                break
            pieces.append((value, cond))
        return sympy.Piecewise(*pieces) if pieces else e

    def decide(self, cond) -> bool | None:
        """Decide a relation over shape symbols with the symbol table, or None."""
        if cond in (sympy.true, True):
            return True
        if cond in (sympy.false, False):
            return False
        if self.symbols is None or not isinstance(cond, sympy.core.relational.Relational):
            return None
        if cond.free_symbols & set(self.upper_bounds):
            return None
        rel = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Eq: "==", sympy.Ne: "!="}.get(type(cond))
        return None if rel is None else self.symbols.decide(rel, cond.lhs, cond.rhs)


# ---------------------------------------------------------------------------- index maps
def broadcast_index(idx: Index, out_shape: Sequence, src_shape: Sequence) -> Index:
    """numpy broadcasting: the element of a ``src_shape`` operand read at ``idx`` of ``out_shape``
    (right-aligned; size-1 source dims read index 0; a symbolic source dim that may be 1 at run
    time while the output's is not becomes a run-time choice)."""
    lead = len(out_shape) - len(src_shape)
    if lead < 0:
        raise ValueError(f"cannot broadcast {tuple(src_shape)} to {tuple(out_shape)}")
    out = []
    for j, d in enumerate(src_shape):
        i, o = idx[lead + j], out_shape[lead + j]
        if d == 1 or o == 1:
            out.append(sympy.Integer(0))
        elif same(d, o):
            out.append(i)
        else:
            out.append(sympy.Piecewise((sympy.Integer(0), sympy.Eq(d, 1)), (i, True)))
    return tuple(out)


def _chunks(a: Sequence, b: Sequence) -> list[tuple[list[int], list[int]]] | None:
    """Split two shapes of equal element count into consecutive groups of axes with equal extent
    products (size-1 axes join the group before them), or None when the products do not line up
    symbolically."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        ga, gb = [], []
        pa, pb = sympy.Integer(1), sympy.Integer(1)
        if i < len(a):
            ga.append(i)
            pa, i = pa * a[i], i + 1
        if j < len(b):
            gb.append(j)
            pb, j = pb * b[j], j + 1
        while not same(pa, pb):
            grow_a = (pa.is_Number and pb.is_Number and pa < pb) or _divides_more(pa, pb)
            grow_b = (pa.is_Number and pb.is_Number and pb < pa) or _divides_more(pb, pa)
            if grow_a and i < len(a):
                ga.append(i)
                pa, i = pa * a[i], i + 1
            elif grow_b and j < len(b):
                gb.append(j)
                pb, j = pb * b[j], j + 1
            else:
                return None
        while i < len(a) and a[i] == 1:
            ga.append(i)
            i += 1
        while j < len(b) and b[j] == 1:
            gb.append(j)
            j += 1
        groups.append((ga, gb))
    return groups


def _divides_more(small, big) -> bool:
    """``big`` is a strict symbolic multiple of ``small`` (so ``small``'s side must take more axes)."""
    if same(small, big):
        return False
    q = sympy.cancel(sympy.sympify(big) / small)
    return sympy.fraction(q)[1] == 1


def delinearize(flat, shape: Sequence, ctx: IndexContext) -> Index:
    out = []
    for d, s in zip(shape, strides(shape)):
        if d == 1:
            out.append(sympy.Integer(0))
            continue
        q = ctx.simplify(sympy.floor(flat / s)) if s != 1 else flat
        out.append(ctx.simplify(sympy.Mod(q, d)) if not same(s * d, numel(shape)) else q)
    return tuple(out)


def reshape_index(idx: Index, out_shape: Sequence, src_shape: Sequence, ctx: IndexContext) -> Index:
    """The source multi-index of a row-major reshape from ``src_shape`` to ``out_shape``."""
    groups = _chunks(out_shape, src_shape)
    if groups is None:
        groups = [(list(range(len(out_shape))), list(range(len(src_shape))))]
    src = [sympy.Integer(0)] * len(src_shape)
    for go, gs in groups:
        if not gs:
            continue
        sub_out = [out_shape[k] for k in go]
        sub_src = [src_shape[k] for k in gs]
        flat = ctx.simplify(linearize(tuple(idx[k] for k in go), sub_out)) if go else sympy.Integer(0)
        for k, v in zip(gs, delinearize(flat, sub_src, ctx)):
            src[k] = v
    return tuple(src)


def slice_start(dim, start, stop, step, ctx: IndexContext) -> sympy.Expr:
    """The first source index an ONNX slice reads on an axis of size ``dim`` (negative starts count
    from the end, then clamp to [0, dim] for positive steps, [0, dim - 1] for negative ones), decided
    from the symbol ranges where possible, else left to run time (Piecewise / Min / Max)."""
    dim, start, step = (sympy.sympify(x) for x in (dim, start, step))
    neg = bool(start < 0) if start.is_Number else ctx.decide(sympy.Lt(start, 0))
    if neg is None:
        s = sympy.Piecewise((start + dim, sympy.Lt(start, 0)), (start, True))
    else:
        s = start + dim if neg else start
    if not ctx.prove_le(0, s):
        s = sympy.Max(s, 0)
    hi = dim if step > 0 else dim - 1
    if not ctx.prove_le(s, hi):
        s = sympy.Min(s, hi)
    return ctx.simplify(s)


def view_index(idx: Index, op: ViewOp, src_shape: Sequence, ctx: IndexContext) -> Index:
    """The multi-index of ``op``'s source element read at ``idx`` of its output."""
    if op.kind == "reshape":
        return reshape_index(idx, op.shape, src_shape, ctx)
    if op.kind == "permute":
        src = [sympy.Integer(0)] * len(op.perm)
        for k, p in enumerate(op.perm):
            src[p] = idx[k]
        return tuple(src)
    if op.kind == "expand":
        return broadcast_index(idx, op.shape, src_shape)
    if op.kind == "slice":
        src = list(idx)
        for axis, start, stop, step in op.slices:
            axis = int(axis) % len(src_shape)
            step = sympy.sympify(step)
            if not step.is_Integer:
                raise UnsupportedOperatorError(f"slice with a run-time step {step} is not supported by code generation")
            first = slice_start(src_shape[axis], start, stop, step, ctx)
            src[axis] = ctx.simplify(first + step * idx[axis])
        return tuple(src)
    raise UnsupportedOperatorError(f"view kind {op.kind!r} is not supported by code generation")


def landing_index(reads: Index, target: Index, ovars: Index, extents: dict, ctx: IndexContext, fail) -> Index:
    """Where element ``target`` of a tensor lands in an output that is a permutation of it: the
    output's multi-index as expressions of ``target``, given ``reads`` -- the tensor's index that
    output element ``ovars`` reads (its views applied to the output's axis variables; an axis of
    extent 1 is the integer 0 in ``ovars``). Every component of ``reads`` must be a mixed-radix
    number over distinct output axes or *digits* of them (a reshape and transpose of the axes: an
    output axis the tensor splits, GroupNorm's channel c read as (c // 4, c % 4), is two digits,
    ``floor(c / 4)`` and ``Mod(c, 4)``), so each output axis is a floor/mod of one component of
    ``target``, or a digit combination of two; anything else calls ``fail(why)``. A kernel computes
    element ``target`` and stores it there (a scattered store; its loads unchanged)."""
    free = {v for v in ovars if isinstance(v, sympy.Symbol)}
    reads, extents, splits = _split_digits(reads, free, dict(extents), fail)
    free = (free - set(splits)) | {d for pair in splits.values() for d in pair}
    solved: dict = {}
    for ht, H in zip(reads, target):
        ht = sympy.expand(ht)
        used = [v for v in free if ht.has(v)]
        coeff = {v: ht.coeff(v) for v in used}
        if any(c.free_symbols & free for c in coeff.values()) or \
                sympy.expand(ht - sum(c * v for v, c in coeff.items())) != 0:
            fail(f"index {ht} is not a linear combination of the output's axes")
        scale = sympy.Integer(1)
        chain = []
        while coeff:      # least significant first: coefficient 1, then 1 * its extent, ...
            v = next((v for v, c in coeff.items() if same(c, scale)), None)
            if v is None:
                fail(f"index {ht} is not a mixed-radix number over the output's axes")
            chain.append((v, scale))
            scale = scale * extents[v]
            del coeff[v]
        for k, (v, c) in enumerate(chain):
            q = H if c == 1 else sympy.floor(H / c)
            solved[v] = q if k == len(chain) - 1 else sympy.Mod(q, extents[v])
    if set(solved) != free:
        fail(f"output axes {sorted(str(v) for v in free - set(solved))} do not follow from the element")
    for v, (hi, lo) in splits.items():        # a split axis: its high digit times the low one's radix, plus it
        solved[v] = solved.pop(hi) * extents[lo] + solved.pop(lo)
    return tuple(ctx.simplify(solved[v]) if isinstance(v, sympy.Symbol) else v for v in ovars)


def _split_digits(reads: Index, free: set, extents: dict, fail) -> tuple[Index, dict, dict]:
    """``reads`` with every ``floor(v / c)`` and ``Mod(v, c)`` of an output axis ``v`` (``c`` a
    constant) replaced by a digit variable: (reads, extents with the digits', {v: (high digit, low
    digit)}). An axis that appears as a digit must appear as both digits of one radix and nowhere
    else, or the landing is not a permutation this solver can invert (``fail``)."""
    digits: dict = {}        # (v, c) -> {"hi": atom, "lo": atom}
    for ht in reads:
        for atom in sympy.expand(ht).atoms(sympy.floor, sympy.Mod):
            if isinstance(atom, sympy.Mod):
                v, c = atom.args
                kind = "lo"
            else:
                v, c = sympy.fraction(sympy.together(atom.args[0]))
                kind = "hi"
            if v in free and c.is_Integer and c > 1:
                digits.setdefault((v, c), {})[kind] = atom
    if not digits:
        return reads, extents, {}
    subs, splits = {}, {}
    for (v, c), atoms in digits.items():
        if set(atoms) != {"hi", "lo"} or v in splits:
            fail(f"output axis {v} is read as {', '.join(map(str, atoms.values()))}: not both digits of one radix")
        hi, lo = sympy.Dummy(f"{v}_hi", integer=True), sympy.Dummy(f"{v}_lo", integer=True)
        subs[atoms["hi"]], subs[atoms["lo"]] = hi, lo
        extents[hi], extents[lo] = sympy.ceiling(extents[v] / c), c
        splits[v] = (hi, lo)
    reads = tuple(sympy.expand(ht).xreplace(subs) for ht in reads)
    if any(ht.has(v) for ht in reads for v in splits):
        fail(f"output axes {sorted(map(str, splits))} are read both whole and as digits")
    return reads, extents, splits


def _divide_out(r, den) -> tuple:
    """``r = den * q + rest`` with ``q`` integer-valued, by polynomial division in ``r``'s floor and
    Mod terms first, then the symbols: terms that are a multiple of ``den`` only together
    (``w*floor(x/(w+1)) + floor(x/(w+1))`` is ``(w+1)*floor(x/(w+1))``, what a view's index
    composed with its inverse leaves). ``(0, r)`` when nothing divides out."""
    atoms = sorted(r.atoms(sympy.floor, sympy.ceiling, sympy.Mod) | den.atoms(sympy.floor, sympy.ceiling, sympy.Mod),
                   key=sympy.default_sort_key)
    gens = atoms + sorted(r.free_symbols | den.free_symbols, key=sympy.default_sort_key)

    def integral(q) -> bool:
        return q != 0 and all(c.is_Integer for c in sympy.Poly(q, *gens).coeffs())
    # a full multivariate reduction over the integers first: sympy.div divides recursively in the
    # first generator and stops at a leading coefficient that does not divide exactly
    # (4*floor(c/4)*(h - 1) + Mod(c, 4)*(h - 1) + s over h - 1 left the floor's multiple in the
    # remainder); over the rationals, c*P + 64*n*P + p over 64*P gives c/64 + n
    for divide in (lambda: _reduce(r, den, gens), lambda: sympy.div(r, den, *gens)):
        try:
            q, rest = divide()
        except (sympy.PolynomialError, sympy.polys.polyerrors.GeneratorsError):
            continue
        if integral(q):
            return q, sympy.expand(rest)
    return sympy.Integer(0), r


def _reduce(r, den, gens) -> tuple:
    (q,), rest = sympy.reduced(r, [den], *gens, domain=sympy.ZZ)
    return q, rest


def compose(idx: Index, chain: Sequence[tuple[ViewOp, Sequence]], ctx: IndexContext) -> Index:
    """Apply a view chain, outermost first: ``chain`` lists (view, its source shape) from the
    element read back towards the materialized tensor."""
    for op, src_shape in chain:
        idx = tuple(ctx.simplify(i) for i in view_index(idx, op, src_shape, ctx))
    return idx


# ---------------------------------------------------------------------------- printing
_ADD, _MUL, _ATOM = 1, 2, 3


class CPrinter:
    """SymPy integer expressions -> C over int64_t.

    With ``hoist`` (a callable that declares ``const int64_t <name> = <C text>;`` at function scope
    and returns the name) and the set of ``shape_symbols``, every floor, ceiling and Mod of shape
    symbols alone (``floor((height - 3)/4)``: a strided Conv's output height) prints as that name.
    Inside a loop such a term is invariant, but GCC cannot always see it through ``ts_floordiv``'s
    branches: an output index holding one defeated the vectorizer of every loop it appeared in."""

    def __init__(self, ctx: IndexContext | None = None, names: dict | None = None, *,
                 hoist=None, shape_symbols: frozenset = frozenset()):
        self.ctx = ctx or IndexContext()
        self.names = names or {}
        self.used: set[sympy.Symbol] = set()
        self.hoist = hoist
        self.shape_symbols = shape_symbols
        self.hoisted: dict[sympy.Expr, str] = {}

    def __call__(self, e) -> str:
        return self.p(sympy.sympify(e), 0)

    def p(self, e, prec: int) -> str:
        text, own = self._p(e)
        return f"({text})" if own < prec else text

    def _hoistable(self, e) -> bool:
        return (self.hoist is not None and isinstance(e, (sympy.floor, sympy.ceiling, sympy.Mod))
                and bool(e.free_symbols) and e.free_symbols <= self.shape_symbols)

    def _p(self, e) -> tuple[str, int]:
        if self._hoistable(e):
            if e not in self.hoisted:
                hoist, self.hoist = self.hoist, None      # the definition itself prints in full
                try:
                    text = self(e)
                finally:
                    self.hoist = hoist
                self.hoisted[e] = hoist(text)
            return self.hoisted[e], _ATOM
        if e.is_Integer:
            v = int(e)
            text = str(v) if -2**31 < v < 2**31 else f"INT64_C({v})"
            return text, (_ATOM if v >= 0 else _ADD)
        if e.is_Symbol:
            self.used.add(e)
            if e in self.names:
                return self.names[e], _ATOM
            return (e.name if e in self.ctx.upper_bounds else c_symbol_name(e.name)), _ATOM
        if e.is_Rational:
            raise UnsupportedOperatorError(f"index expression with a fraction: {e}")
        if isinstance(e, sympy.Add):
            terms = sorted(e.as_ordered_terms(), key=lambda t: t.is_Number)
            out = ""
            for k, t in enumerate(terms):
                c, m = t.as_coeff_Mul()
                if k and c.is_Number and c < 0:
                    out += " - " + self.p(-t, _MUL)
                else:
                    out += (" + " if k else "") + self.p(t, _ADD)
            return out, _ADD
        if isinstance(e, sympy.Mul):
            c, rest = e.as_coeff_Mul()
            if c == -1:
                return "-" + self.p(rest, _ATOM), _ADD
            factors = []
            for f in sympy.Mul.make_args(e):
                if isinstance(f, sympy.Pow) and f.exp.is_Integer and f.exp < 0:
                    raise UnsupportedOperatorError(f"index expression with a fraction: {e}")
                atom = isinstance(f, (sympy.Add, sympy.floor, sympy.ceiling, sympy.Mod))
                factors.append(self.p(f, _ATOM if atom else _MUL))
            return "*".join(factors), _MUL
        if isinstance(e, sympy.Pow):
            if e.exp.is_Integer and e.exp > 0:
                b = self.p(e.base, _ATOM)
                return "*".join([b] * int(e.exp)), _MUL
            raise UnsupportedOperatorError(f"index expression with a non-integer power: {e}")
        if isinstance(e, FloorSqrt):
            return f"ts_isqrt({self(e.args[0])})", _ATOM
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if den == 1:
                return self._p(num)
            if isinstance(e, sympy.ceiling):
                num = num + den - 1
            if self.ctx.nonneg(num) and self.ctx.positive(den):
                return f"{self.p(num, _MUL)} / {self.p(den, _ATOM)}", _MUL
            return f"ts_floordiv({self(num)}, {self(den)})", _ATOM
        if isinstance(e, sympy.Mod):
            a, m = e.args
            if self.ctx.nonneg(a) and self.ctx.positive(m):
                return f"{self.p(a, _ATOM)} % {self.p(m, _ATOM)}", _MUL
            return f"ts_mod({self(a)}, {self(m)})", _ATOM
        if isinstance(e, (sympy.Min, sympy.Max)):
            fn = "ts_min" if isinstance(e, sympy.Min) else "ts_max"
            args = list(e.args)
            out = self(args[0])
            for a in args[1:]:
                out = f"{fn}({out}, {self(a)})"
            return out, _ATOM
        if isinstance(e, sympy.Piecewise):
            *pieces, (last, cond) = e.args
            out = self(last) if cond in (True, sympy.true) else None
            if out is None:
                raise UnsupportedOperatorError(f"piecewise index without a default: {e}")
            for value, cond in reversed(pieces):
                out = f"({self.cond(cond)} ? {self(value)} : {out})"
            return out, _ATOM
        raise UnsupportedOperatorError(f"index expression {e} ({type(e).__name__}) has no C form")

    def cond(self, c) -> str:
        ops = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
               sympy.GreaterThan: ">=", sympy.Eq: "==", sympy.Ne: "!="}
        if type(c) in ops:
            return f"{self.p(c.lhs, _ADD)} {ops[type(c)]} {self.p(c.rhs, _ADD)}"
        if isinstance(c, sympy.And):
            return " && ".join(f"({self.cond(a)})" for a in c.args)
        if isinstance(c, sympy.Or):
            return " || ".join(f"({self.cond(a)})" for a in c.args)
        raise UnsupportedOperatorError(f"condition {c} has no C form")


def c_index(e, ctx: IndexContext | None = None, names: dict | None = None) -> str:
    """One index expression as C (int64_t arithmetic)."""
    return CPrinter(ctx, names)(e)


def c_literal(value, dtype) -> str:
    """A scalar of ``dtype`` as a C literal."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "1" if bool(value) else "0"
    if dtype.kind == "f":
        v = float(np.asarray(value, dtype=dtype))
        if math.isnan(v):
            return "NAN"
        if math.isinf(v):
            return "INFINITY" if v > 0 else "-INFINITY"
        text = str(np.float32(v)) if dtype == np.float32 else repr(v)  # shortest round-trip form
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if dtype == np.float32 else "")
    v = int(value)
    if dtype.kind == "u":
        return f"{v}u" if v < 2**32 else f"UINT64_C({v})"
    if -2**31 < v < 2**31:
        return str(v) if v >= 0 else f"({v})"
    if v == -2**63:
        return "INT64_MIN"
    return f"INT64_C({v})"


__all__ = ["CPrinter", "ERF_HELPER", "EXP_HELPER", "SIGMOID_HELPER", "math_helpers", "IndexContext", "PRELUDE", "broadcast_index", "c_index", "c_literal",
           "c_symbol_name",
           "compose", "delinearize", "index_var", "linearize", "reshape_index", "slice_start", "strides",
           "view_index"]
