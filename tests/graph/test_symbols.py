"""SymbolTable: range-aware simplification, unification, decisions."""
import math

import pytest
import sympy

from tscomp.errors import ShapeError
from tscomp.graph.symbols import SymbolTable, sanitize_symbol_name


def table(**ranges):
    t = SymbolTable()
    syms = [t.new_symbol(name, origin="dim_param", min=lo, max=hi) for name, (lo, hi) in ranges.items()]
    return t, syms


def test_sanitize_turns_dim_params_into_identifiers():
    assert sanitize_symbol_name("batch_size") == "batch_size"
    assert sanitize_symbol_name("s0 + 1") == "s0_1"
    assert sanitize_symbol_name("1d") == "d_1d"
    assert sanitize_symbol_name("N") == "N_"  # would clash with sympy's N()


def test_min_with_constant_resolves_when_range_decides_it():
    t, (L,) = table(L=(1, 512))
    assert t.canon(sympy.Min(512, L)) == L
    assert t.canon(sympy.Max(1, L)) == L
    t2, (L2,) = table(L=(1, 1024))
    assert t2.canon(sympy.Min(512, L2)) == sympy.Min(512, L2)


def test_bounds_use_interval_arithmetic_over_ranges():
    t, (B, L) = table(B=(1, 8), L=(1, 512))
    assert t.bounds(B * L + 1) == (2, 8 * 512 + 1)
    assert t.bounds(sympy.floor(L / 16)) == (0, 32)
    assert t.prove_le(L, 512) and not t.prove_le(L, 511)


def test_unify_rewrites_fresh_symbol_into_named_one():
    t, (L,) = table(L=(1, 512))
    u = t.fresh_symbol("unk")
    assert t.unify(u, L, "test") == L
    assert t.canon(u + 1) == L + 1
    assert any("test" in str(c) for c in t.constraints)


def test_a_symbol_that_may_be_zero_is_not_assumed_positive():
    t, (past, L) = table(past=(0, 511), L=(1, 64))
    assert past.is_nonnegative and past.is_positive is None
    assert L.is_positive
    assert t.canon(sympy.Max(1, L)) == L
    assert t.canon(sympy.Max(1, past)) == sympy.Max(1, past)    # past = 0 picks 1
    assert t.bounds(past + L) == (1, 575)


def test_a_zero_capable_dim_equal_to_an_unknown_dim_is_refused_by_name():
    t = SymbolTable()
    L = t.new_symbol("L", origin="user", min=0, max=32, user_bounded=True)
    u = t.fresh_symbol("reshape", note="unknown dim from Reshape node 'r'")
    with pytest.raises(ShapeError, match="L may be 0 .* must equal reshape_0 \\(unknown dim from Reshape node 'r'\\)"
                                         ".*declare L from 1"):
        t.unify(L, u, "broadcast")


def test_unify_min_constrains_symbol_range():
    t, (L,) = table(L=(1, 2**31 - 1))
    t.unify(L, sympy.Min(512, L), "embedding add")
    assert t.get("L").max == 512
    assert t.canon(sympy.Min(512, L)) == L


def test_unify_refuses_narrowing_a_user_declared_range():
    t = SymbolTable()
    L = t.new_symbol("L", origin="user", min=1, max=1024, user_bounded=True)
    with pytest.raises(ShapeError, match="only supports L in \\[1, 512\\]"):
        t.unify(L, sympy.Min(512, L), "embedding add")


def test_unify_of_different_constants_is_an_error():
    t = SymbolTable()
    with pytest.raises(ShapeError, match="64 != 32"):
        t.unify(sympy.Integer(64), sympy.Integer(32), "MatMul node 'mm'")


def test_unify_of_symbol_with_out_of_range_constant_is_an_error():
    t, (L,) = table(L=(1, 16))
    with pytest.raises(ShapeError):
        t.unify(L, sympy.Integer(32), "Concat")


def test_decide_answers_only_what_holds_for_every_binding():
    t, (L,) = table(L=(1, 512))
    assert t.decide("==", L, -1) is False
    assert t.decide("<", L, 600) is True
    assert t.decide("==", L, 7) is None
    assert t.decide(">=", L, 1) is True


def test_evaluate_substitutes_a_binding_exactly():
    t, (H, W) = table(H=(16, 448), W=(16, 448))
    expr = sympy.floor(H / 16) * sympy.floor(W / 16) + 1
    assert t.evaluate(expr, {"H": 224, "W": 100}) == 14 * 6 + 1


def test_compiled_evaluation_equals_sympy_substitution():
    """SymbolTable.evaluate runs compiled closures; they must agree with SymPy exactly."""
    import random

    import sympy

    from tscomp.graph.symbols import compile_int_expr
    a, b = sympy.symbols("a b", integer=True, positive=True)
    exprs = [a * b + 3, (a + 1) * (b - 2) ** 2, sympy.floor((a - 16) / 16) + 1, sympy.ceiling(a / 3) * b,
             sympy.Mod(a * 7 - b, 5), sympy.Min(a, 512) * sympy.Max(b, 3), sympy.floor(a * b / 7) - a,
             sympy.Rational(1, 2) * a * (a + 1), abs(a - b)]
    rng = random.Random(0)
    for e in exprs:
        fn = compile_int_expr(e)
        for _ in range(50):
            binding = {"a": rng.randint(1, 1000), "b": rng.randint(1, 1000)}
            want = e.xreplace({a: binding["a"], b: binding["b"]})
            assert fn(binding) == want, (e, binding)


def test_a_compiled_shape_tuple_equals_its_extents_evaluated_one_by_one():
    """compile_int_tuple (an output's shape per request) gives the ints SymPy gives, with and
    without extents that need rational arithmetic."""
    import random

    import sympy

    from tscomp.graph.symbols import compile_int_tuple
    a, b = sympy.symbols("a b", integer=True, positive=True)
    integral = [a, b * 4, sympy.Integer(128), a * b + 3, sympy.Min(a, 512) * sympy.Max(b, 3), sympy.Mod(a * 7 - b, 5)]
    rational = integral + [sympy.floor((a - 16) / 16) + 1, sympy.Rational(1, 2) * a * (a + 1)]
    rng = random.Random(1)
    for exprs in (integral, rational, []):
        fn = compile_int_tuple(exprs)
        for _ in range(30):
            binding = {"a": rng.randint(1, 1000), "b": rng.randint(1, 1000)}
            got = fn(binding)
            want = tuple(int(e.xreplace({a: binding["a"], b: binding["b"]})) for e in exprs)
            assert got == want and all(type(v) is int for v in got), (exprs, binding)


def test_floor_and_ceiling_of_an_integer_over_an_integer_evaluate_without_fractions():
    """A conv output size floor((H + 2p - k) / s) + 1 is floor division in the generated code (no
    Fraction per request), negative numerators included, and agrees with SymPy."""
    import random

    import sympy

    from tscomp.graph import symbols
    a, b = sympy.symbols("a b", integer=True, positive=True)
    exprs = [sympy.floor((a - 300) / 7) + 1, sympy.ceiling((a - 300) / 7), sympy.floor(a / 3 + 2 * b / 5),
             sympy.ceiling(a / 32) * sympy.floor((b + 7) / 8)]
    consts = symbols._evaluator_names()
    assert all("//" in symbols._py(e, consts) for e in exprs[:3])
    assert not any(isinstance(v, symbols.Fraction) for v in consts.values())
    fn = symbols.compile_int_tuple(exprs)
    rng = random.Random(2)
    for _ in range(200):
        binding = {"a": rng.randint(1, 1000), "b": rng.randint(1, 1000)}
        assert fn(binding) == tuple(int(e.xreplace({a: binding["a"], b: binding["b"]})) for e in exprs), binding


def test_nested_floor_and_ceiling_divisions_fold_into_one():
    # two strided layers give floor(floor(S/5)/2); the exporter's own arithmetic writes floor(S/10)
    t, (S, B) = table(S=(400, 16000), B=(1, 4))
    assert t.canon(sympy.floor(sympy.floor(S / 5) / 2) - 1) == sympy.floor(S / 10) - 1
    assert t.canon(sympy.floor((sympy.floor((S - 10) / 5) + 1 - 3) / 2) + 1) == sympy.floor(S / 10) - 1
    assert t.canon(sympy.ceiling(sympy.ceiling(S / 4) / 4)) == sympy.ceiling(S / 16)
    assert t.canon(sympy.floor((sympy.floor(S / 3) + B) / 2)) == sympy.floor((S + 3 * B) / 6)
    assert t.decide("==", B * (sympy.floor(sympy.floor(S / 5) / 2) - 1), B * (sympy.floor(S / 10) - 1))


@pytest.mark.parametrize("expr", ["floor(ceiling(S/3)/2)", "ceiling(floor(S/3)/2)",
                                  "ceiling(floor(ceiling(S/2)/2 + 1/2)/2 + 1/2) - 1", "floor(ceiling(S/2)/4 + 1/4)",
                                  "floor((ceiling(S/7) + 2*S)/3)"])
def test_mixed_floor_and_ceiling_divisions_fold_into_one_exact_rounding(expr):
    # ceiling(u/b) = floor((u + b - 1)/b) for an integer u: the outer rounding takes the inner's kind
    t, (H,) = table(H=(1, 300))
    e = sympy.sympify(expr, locals={"S": H})
    folded = t.canon(e)
    assert len(folded.atoms(sympy.floor, sympy.ceiling)) == 1, folded
    for h in range(1, 301):
        assert t.evaluate(folded, {"H": h}) == int(e.subs(H, h)), (h, folded)


def test_same_padded_strided_lengths_reached_two_ways_are_one_expression():
    # a SAME conv's output after a pool vs the same length on a residual branch (BiT's SAME padding)
    t, (H,) = table(H=(1, 300))
    a = sympy.sympify("ceiling(floor(ceiling(S/2)/2 + 1/2)/2 + 1/2) - 1", locals={"S": H})
    b = sympy.sympify("floor(ceiling(S/2)/4 + 1/4)", locals={"S": H})
    assert t.canon(a) == t.canon(b)


@pytest.mark.parametrize("expr", ["floor(2*floor(S/3)/3)", "floor(floor(S/3)/2 + 1/4)", "ceiling(floor(S/3)/2 + 1/4)"])
def test_nested_rounding_that_does_not_fold_stays_as_written(expr):
    # a non-unit numerator or a fractional offset: the identity does not hold
    t, (H,) = table(H=(1, 100))
    e = sympy.sympify(expr, locals={"S": H})
    assert t.canon(e) == e
    for h in range(1, 101):          # and the folded forms that do apply are exact at every S
        assert t.evaluate(t.canon(sympy.floor(sympy.floor(H / 5) / 2)), {"H": h}) == h // 10


def test_a_float_constant_is_its_exact_rational_so_shape_arithmetic_stays_exact():
    from tscomp.graph.symbols import as_expr
    import numpy as np
    assert as_expr(np.float32(0.5)) == sympy.Rational(1, 2)
    assert as_expr(0.1) == sympy.Rational(0.1) and as_expr(3.0) == 3
    assert as_expr(float("inf")).is_infinite


def test_floor_of_a_product_of_square_roots_is_an_exact_integer_square_root():
    """int(sqrt(floor(h/16) * floor(w/16))), as SymPy splits it into sqrt(a) * sqrt(b): exact where
    the float product of the two roots is not (sqrt(6) * sqrt(6) = 5.999...)."""
    from tscomp.codegen.c_expr import c_index
    from tscomp.graph.symbols import FloorSqrt, compile_int_expr, floor_of_root
    h, w = sympy.symbols("height width", integer=True, positive=True)
    a, b = sympy.floor(h / 16), sympy.floor(w / 16)
    root = floor_of_root(sympy.sqrt(a * b))
    assert root == FloorSqrt(a * b)
    evaluate = compile_int_expr(root)
    for hh, ww in [(96, 96), (64, 144), (16, 16), (96, 112), (2000, 2000)]:
        want = math.isqrt((hh // 16) * (ww // 16))
        assert evaluate({"height": hh, "width": ww}) == want == root.subs({h: hh, w: ww})
    scaled = compile_int_expr(floor_of_root(sympy.Rational(3, 2) * sympy.sqrt(a)))    # floor(3 sqrt(a) / 2)
    assert [scaled({"height": 16 * k, "width": 16}) for k in range(1, 40)] == \
        [math.isqrt(9 * k) // 2 for k in range(1, 40)]
    assert floor_of_root(a / 2) is None                  # no root: the caller's plain floor
    assert "ts_isqrt(" in c_index(root)


def test_floor_sqrt_bounds_follow_the_ranges():
    from tscomp.graph.symbols import FloorSqrt, SymbolTable
    t = SymbolTable()
    n = t.new_symbol("n", origin="user", min=10, max=99)
    assert t.bounds(FloorSqrt(n)) == (3, 9)
