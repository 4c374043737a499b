"""Index arithmetic of generated C: view chains composed into source indices, checked against
numpy's own views at awkward sizes (1, primes), both evaluated in Python and printed as C."""
import ctypes

import numpy as np
import pytest
import sympy

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.c_expr import (PRELUDE, IndexContext, broadcast_index, c_index, c_literal, compose,
                                   linearize, reshape_index)
from tscomp.graph import views
from tscomp.graph.symbols import SymbolTable

SYMS = SymbolTable()
B = SYMS.new_symbol("batch", origin="user", min=1, max=8)
L = SYMS.new_symbol("sequence", origin="user", min=1, max=64)
H = SYMS.new_symbol("height", origin="user", min=8, max=64)
W = SYMS.new_symbol("width", origin="user", min=8, max=64)
HP, WP = sympy.floor(H / 8), sympy.floor(W / 8)


def _chain(src_shape, steps):
    """[(ViewOp, its source shape)] from a source shape and a list of step constructors."""
    out, shape = [], tuple(src_shape)
    for step in steps:
        op = step(shape)
        out.append((op, shape))
        shape = op.shape
    return out, shape


def _slice_shape(shape, axis, start, stop, step, binding):
    """The symbolic extent of a sliced axis is not needed by the index map; tests use the
    concrete one (numpy's) at the binding."""
    dims = list(shape)
    n = _ev(shape[axis], binding)
    dims[axis] = sympy.Integer(len(range(n)[views.onnx_slice(n, _ev(start, binding), _ev(stop, binding), step)]))
    return tuple(dims)


def _ev(e, binding):
    return int(sympy.sympify(e).xreplace({s: sympy.Integer(v) for s, v in binding.items()}))


def CASES(binding):
    return {
        # split the hidden axis into heads, move heads forward, merge batch and heads
        "heads": ((B, L, 12), [lambda s: views.reshape((B, L, 3, 4)), lambda s: views.permute((0, 2, 1, 3), s),
                               lambda s: views.reshape((B * 3, L, 4))]),
        "expand": ((1, L, 1), [lambda s: views.expand((B, L, 5))]),
        "unsqueeze-expand": ((L,), [lambda s: views.reshape((1, L)), lambda s: views.expand((B, L))]),
        "negative-start": ((B, L, 7), [lambda s: views.slice_view(_slice_shape(s, 2, -3, 100, 1, binding),
                                                                   [(2, -3, 100, 1)])]),
        "step2-symbolic-stop": ((L, 6), [lambda s: views.slice_view(_slice_shape(s, 0, 1, L, 2, binding),
                                                                     [(0, 1, L, 2)]),
                                         lambda s: views.permute((1, 0), s)]),
        "reverse": ((L, 5), [lambda s: views.slice_view(_slice_shape(s, 1, -1, -100, -1, binding),
                                                         [(1, -1, -100, -1)])]),
        # start L - 2 is negative when L = 1: clamped at run time
        "symbolic-start": ((L + 3, 2), [lambda s: views.slice_view(_slice_shape(s, 0, L - 2, L + 3, 1, binding),
                                                                    [(0, L - 2, L + 3, 1)])]),
        "merge-split-ones": ((B, 1, L), [lambda s: views.reshape((B * L,)), lambda s: views.reshape((B, L, 1, 1)),
                                         lambda s: views.permute((2, 0, 3, 1), s)]),
        "unaligned": ((6, 4), [lambda s: views.reshape((4, 6)), lambda s: views.reshape((2, 12)),
                               lambda s: views.permute((1, 0), s)]),
        "patches": ((1, 16, HP, WP), [lambda s: views.permute((0, 2, 3, 1), s),
                                      lambda s: views.reshape((1, HP * WP, 16))]),
        "slice-of-reshape": ((B, L * 3), [lambda s: views.reshape((B, L, 3)),
                                          lambda s: views.slice_view(_slice_shape(s, 2, 1, 3, 1, binding),
                                                                     [(2, 1, 3, 1)]),
                                          lambda s: views.reshape((B, L * 2))]),
    }


BINDINGS = [{B: 1, L: 1, H: 8, W: 8}, {B: 3, L: 7, H: 37, W: 61}, {B: 2, L: 13, H: 17, W: 8}]


def _numpy_view(src_shape, chain, binding):
    ev = lambda e: _ev(e, binding)  # noqa: E731
    arr = np.arange(int(np.prod([ev(d) for d in src_shape]))).reshape([ev(d) for d in src_shape])
    for op, _ in chain:
        arr = views.apply_view(arr, op, ev)
    return arr


def _symbolic_offsets(src_shape, chain, out_shape):
    """Flat source offset of every output element, as one SymPy expression over loop variables."""
    ctx = IndexContext(SYMS)
    idx = tuple(ctx.var(f"i{k}", d) if d != 1 else sympy.Integer(0) for k, d in enumerate(out_shape))
    src = compose(idx, list(reversed(chain)), ctx)  # from the element read back to the tensor
    return ctx, idx, ctx.simplify(linearize(src, src_shape))


@pytest.mark.parametrize("binding", BINDINGS, ids=lambda b: "-".join(f"{k}{v}" for k, v in b.items()))
@pytest.mark.parametrize("case", list(CASES(BINDINGS[0])))
def test_view_chain_indices_match_numpy(case, binding):
    src_shape, steps = CASES(binding)[case]
    chain, out_shape = _chain(src_shape, steps)
    want = _numpy_view(src_shape, chain, binding)
    ctx, idx, offset = _symbolic_offsets(src_shape, chain, out_shape)
    concrete = offset.xreplace({s: sympy.Integer(v) for s, v in binding.items()})
    loop_vars = [v for v in idx if isinstance(v, sympy.Symbol)]
    fn = sympy.lambdify(loop_vars, concrete, modules="numpy")
    grids = np.meshgrid(*[np.arange(n) for n, v in zip(want.shape, idx) if isinstance(v, sympy.Symbol)],
                        indexing="ij")
    got = np.broadcast_to(np.asarray(fn(*grids)), [n for n, v in zip(want.shape, idx) if isinstance(v, sympy.Symbol)])
    assert np.array_equal(got.reshape(want.shape), want), f"{case}: offset {offset}"


def test_composed_reshapes_cancel_without_division():
    ctx = IndexContext(SYMS)
    i0, i3 = ctx.var("i0", B), ctx.var("i3", L)
    # (batch, 1, 1, sequence, 1) -> (batch*sequence,) -> (batch, 1, 1, sequence)
    flat = reshape_index((i0, 0, 0, i3), (B, 1, 1, L), (B * L,), ctx)
    back = reshape_index(flat, (B * L,), (B, 1, 1, L, 1), ctx)
    assert back == (i0, 0, 0, i3, 0)
    assert c_index(linearize(back, (B, 1, 1, L, 1)), ctx) == "i0*sequence + i3"


def test_a_flat_index_split_into_floored_extents_and_joined_again_collapses():
    """GroupNorm's reshapes: r over [16 * H4 * W4] split into [16, H4, W4] and flattened again, with
    H4 = floor(height/4) -- positive only by the symbol ranges -- reads offset r itself."""
    table = SymbolTable()
    height = table.new_symbol("height", origin="dim_param", min=32, max=96)
    width = table.new_symbol("width", origin="dim_param", min=32, max=96)
    ctx = IndexContext(table)
    h4, w4 = sympy.floor(height / 4), sympy.floor(width / 4)
    r = ctx.var("r", 16 * h4 * w4)
    split = reshape_index((r,), (16 * h4 * w4,), (16, h4, w4), ctx)
    off = ctx.simplify(linearize(split, (16, h4, w4)))
    assert off != r                          # the plain simplification keeps the floors and Mods
    assert ctx.collapse(off) == r
    # whole multiples of a symbolic divisor that only add up to one: (w4+1)*q inside a floor
    q = sympy.floor(r / (w4 + 1))
    assert ctx.simplify(sympy.floor((r + q * w4 + q) / (w4 + 1))) == 2 * q


def test_a_row_split_into_runs_of_a_symbolic_size_indexes_each_run_without_division():
    """GroupNorm's row of 16 * H4 * W4 split into 16 runs of H4 * W4 (q * S + s): the channel,
    floor(r / S), is the run q; the position inside a channel's [H4, W4] image comes back without
    the run (a multiple of the modulus spread over terms), since s // W4 < H4."""
    table = SymbolTable()
    height = table.new_symbol("height", origin="dim_param", min=32, max=96)
    width = table.new_symbol("width", origin="dim_param", min=32, max=96)
    ctx = IndexContext(table)
    h4, w4 = sympy.floor(height / 4) + 1, sympy.floor(width / 4) + 1
    S = h4 * w4
    q, s = ctx.var("q", 16), ctx.var("s", S)
    r = q * S + s
    assert ctx.simplify(sympy.floor(r / S)) == q
    assert ctx.nonneg(s / w4) and ctx.upper(sympy.floor(s / w4)) == sympy.expand(h4 - 1)
    assert ctx.simplify(sympy.Mod(sympy.expand(q * h4) + sympy.floor(s / w4), h4)) == sympy.floor(s / w4)


@pytest.mark.parametrize("channels,groups,side", [(32, 8, "ceiling(S/4) - 1"), (64, 8, "ceiling(S/8 + 1/2) - 1"),
                                                  (6, 3, "floor(S/3)")])
def test_a_conv_output_viewed_as_groupnorm_groups_and_back_indexes_without_division(channels, groups, side):
    """A Conv's [N, 32, A, B] output (A, B lengths of SAME-padded strided layers) viewed as
    GroupNorm's [N, 8, 4*A*B] and back: the channel's group is floor(c/4) and the way back is the
    identity, although the divisor 4*A*B is a symbolic product (the expanded polynomial's upper bound
    alone cannot show c*A*B + p < 4*A*B*(floor(c/4) + 1))."""
    from tscomp.codegen.c_expr import delinearize
    table = SymbolTable()
    height = table.new_symbol("height", origin="dim_param", min=32, max=96)
    width = table.new_symbol("width", origin="dim_param", min=32, max=96)
    batch = table.new_symbol("batch", origin="dim_param", min=1, max=2)
    ctx = IndexContext(table)
    a, b = (sympy.sympify(side, locals={"S": s}) for s in (height, width))
    positions, per_group = sympy.expand(a * b), channels // groups
    n, c, p = ctx.var("n", batch), ctx.var("c", channels), ctx.var("p", positions)
    flat = ctx.simplify(linearize((n, c) + tuple(delinearize(p, (a, b), ctx)), (batch, channels, a, b)))
    grouped_shape = (batch, groups, per_group * positions)
    grouped = delinearize(flat, grouped_shape, ctx)
    assert grouped[:2] == (n, sympy.floor(c / per_group))
    back = [ctx.simplify(x) for x in reshape_index(grouped, grouped_shape, (batch, channels, a, b), ctx)]
    assert back == [n, c, sympy.floor(p / b), sympy.Mod(p, b)]
    assert "ts_" not in "".join(c_index(x, ctx) for x in back)


def test_split_axes_index_by_division_and_modulo():
    ctx = IndexContext(SYMS)
    j = ctx.var("j", B * L)
    src = reshape_index((j, 0), (B * L, 1), (B, L), ctx)
    assert [c_index(x, ctx) for x in src] == ["j / sequence", "j % sequence"]


def test_broadcast_reads_index_zero_of_size_one_axes():
    ctx = IndexContext(SYMS)
    i = tuple(ctx.var(f"i{k}", d) for k, d in enumerate((B, 4, L, L)))
    assert broadcast_index(i, (B, 4, L, L), (B, 1, 1, L)) == (i[0], 0, 0, i[3])
    assert broadcast_index(i, (B, 4, L, L), (L,)) == (i[3],)


def test_printer_uses_helpers_only_when_signs_are_unknown():
    ctx = IndexContext(SYMS)
    i = ctx.var("i", L)
    assert c_index(sympy.floor((i + 3) / 4), ctx) == "(i + 3) / 4"
    assert c_index(sympy.Mod(i, 5), ctx) == "i % 5"
    assert c_index(sympy.floor((i - 3) / 4), ctx) == "ts_floordiv(i - 3, 4)"
    assert c_index(sympy.Mod(i - 3, 4), ctx) == "(i + 1) % 4"  # SymPy shifts a numeric modulus's operand
    assert c_index(sympy.Mod(i - 3, L), ctx) == "ts_mod(i - 3, sequence)"
    assert c_index(sympy.Min(i, 4), ctx) in ("ts_min(4, i)", "ts_min(i, 4)")
    assert c_index(HP * WP + 1, ctx) == "(height / 8)*(width / 8) + 1"



def test_a_printer_with_hoist_names_sizes_of_shape_symbols_once_and_keeps_loop_terms_inline():
    """floor/ceiling/Mod of shape symbols alone print as one declared constant each (a loop index
    through ts_floordiv kept GCC from vectorizing every loop it appeared in); terms with a loop index
    stay in place."""
    from tscomp.codegen.c_expr import CPrinter
    ctx = IndexContext(SYMS)
    i = ctx.var("i", L)
    declared = []

    def hoist(text):
        declared.append(text)
        return f"sz{len(declared) - 1}"

    pr = CPrinter(ctx, hoist=hoist, shape_symbols=frozenset({B, L, H, W}))
    oh = sympy.floor((H - 3) / 4) + 1
    assert pr(i * oh * (sympy.floor((W - 3) / 4) + 1) + sympy.Mod(i - 3, L)) == \
        "i*(sz0 + 1)*(sz1 + 1) + ts_mod(i - 3, sequence)"
    assert pr(2 * oh) == "2*sz0 + 2"              # the same size again: no second declaration
    assert declared == ["ts_floordiv(height - 3, 4)", "ts_floordiv(width - 3, 4)"]
    assert pr.used >= {H, W, L, i}                  # the sizes' symbols are still the kernel's parameters

def test_literals():
    assert c_literal(0.5, np.float32) == "0.5f"
    assert c_literal(1e-12, np.float32) == "1e-12f"
    assert c_literal(2, np.float32) == "2.0f"
    assert c_literal(float("-inf"), np.float32) == "-INFINITY"
    assert c_literal(float("nan"), np.float64) == "NAN"
    assert c_literal(-3, np.int64) == "(-3)"
    assert c_literal(-2**63, np.int64) == "INT64_MIN"
    assert c_literal(True, np.bool_) == "1"


def test_printed_c_computes_the_same_offsets(tmp_path):
    """Every chain printed as one C function per case, compiled once, evaluated at every output
    position against numpy."""
    binding = BINDINGS[1]
    cases = CASES(binding)
    funcs, meta = [], []
    for n, (case, (src_shape, steps)) in enumerate(cases.items()):
        chain, out_shape = _chain(src_shape, steps)
        ctx, idx, offset = _symbolic_offsets(src_shape, chain, out_shape)
        params = ", ".join(f"int64_t {s.name}" for s in (B, L, H, W))
        loops = []
        for k, v in enumerate(idx):
            if isinstance(v, sympy.Symbol):
                loops.append(f"for (int64_t {v} = 0; {v} < {c_index(out_shape[k], ctx)}; ++{v})")
        body = f"out[n++] = {c_index(offset, ctx)};"
        funcs.append(f"int64_t f{n}(int64_t *out, {params}) {{\n    int64_t n = 0;\n    "
                     + " ".join(loops) + f"\n        {body}\n    return n;\n}}")
        meta.append((case, src_shape, chain))
    lib = load_library(build_library(PRELUDE + "\n" + "\n".join(funcs), "test_c_expr_offsets", out_dir=tmp_path))
    for n, (case, src_shape, chain) in enumerate(meta):
        want = _numpy_view(src_shape, chain, binding)
        buf = np.zeros(max(want.size, 1), dtype=np.int64)
        fn = getattr(lib, f"f{n}")
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 4
        count = fn(buf.ctypes.data, *(binding[s] for s in (B, L, H, W)))
        assert count == want.size, case
        assert np.array_equal(buf[:count], want.reshape(-1)), case


def test_landing_index_inverts_an_output_axis_split_into_two_digits():
    # an output [C=8, L] read as rows [2, 4, L]: channel c is (c // 4, c % 4); the landing of row
    # element (g, r, l) is channel 4 g + r
    from tscomp.codegen.c_expr import landing_index
    ctx = IndexContext()
    c, l = sympy.symbols("c l", integer=True, nonnegative=True)
    g, r, t = sympy.symbols("g r t", integer=True, nonnegative=True)
    L = sympy.Symbol("L", integer=True, positive=True)
    reads = (sympy.floor(c / 4), sympy.Mod(c, 4), l)
    def fail(why):
        raise ValueError(why)
    where = landing_index(reads, (g, r, t), (c, l), {c: sympy.Integer(8), l: L}, ctx, fail)
    assert where == (4 * g + r, t)
    # a digit without its partner is refused, not guessed
    with pytest.raises(ValueError, match="both digits"):
        landing_index((sympy.floor(c / 4), l), (g, t), (c, l), {c: sympy.Integer(8), l: L}, ctx, fail)
