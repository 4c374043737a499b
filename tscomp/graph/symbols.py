"""Shape symbols, their ranges, and the constraints between them.

A *symbol* is a named dynamic dimension (``batch``, ``sequence``, ``L``) with an
inclusive integer range. Shapes are tuples of SymPy integer expressions over
symbols. This module owns three things:

* the symbol table (names, ranges, where each symbol came from);
* range-aware simplification: ``Min(512, sequence)`` becomes ``sequence`` once
  ``sequence <= 512`` is known — computed by interval arithmetic over the ranges
  (queries that never change the table: :meth:`SymbolTable.bounds`,
  :meth:`SymbolTable.prove_le`, :meth:`SymbolTable.simplify`);
* *unification* (TSCompiler §4.1, ``InferSibSymShape``): when an operator's
  semantics force two dimensions equal (MatMul's reduction dims, a broadcast of
  two symbolic dims, Concat's non-axis dims) the table records the constraint
  and, where it can, rewrites one symbol in terms of the other or tightens a
  range. Only :meth:`SymbolTable.unify` and :meth:`SymbolTable.new_symbol` add
  facts; everything else is a pure query — the split TorchInductor's
  ``sizevars`` makes between guarding and non-guarding queries.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any, Iterable

import sympy

from tscomp.errors import ShapeError

#: Upper bound used when neither the user nor the model bounds a symbol: no
#: tensor dimension can exceed what a signed 32-bit index addresses.
DEFAULT_MAX = 2**31 - 1

Expr = sympy.Expr

_RESERVED = {"E", "I", "N", "O", "Q", "S", "beta", "gamma", "lambda", "pi", "zeta", "oo", "nan"}


class FloorSqrt(sympy.Function):
    """``floor(sqrt(n))`` of a non-negative integer ``n``, kept as one integer-valued node. A model
    that reshapes its tokens back into a square grid computes ``int(sqrt(tokens))`` (DPT, Depth
    Anything): as ``floor(sqrt(floor(h/16)) * sqrt(floor(w/16)))`` (SymPy splits the root of a
    product of positives) it has no exact integer form; as ``FloorSqrt(floor(h/16) * floor(w/16))``
    it evaluates exactly (``math.isqrt``) in Python and in C (``ts_isqrt``)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, n):
        if n.is_Integer and n >= 0:
            return sympy.Integer(math.isqrt(int(n)))
        return None


def floor_of_root(x: Expr) -> Expr | None:
    """``floor(x)`` for a non-negative ``x`` made of square roots (``c * sqrt(a) * sqrt(b)``, a sum
    under one root) as :class:`FloorSqrt` of an integer expression, or None when ``x`` is not one:
    with ``x**2 = num / den`` (``num`` integer-valued, ``den`` a positive integer),
    ``floor(x) = floor(sqrt(num * den) / den) = floor(FloorSqrt(num * den) / den)``."""
    if not any(p.exp == sympy.Rational(1, 2) for p in x.atoms(sympy.Pow)):
        return None
    square = sympy.expand(x ** 2)
    if any(not (p.exp.is_Integer and p.exp >= 0) for p in square.atoms(sympy.Pow)):
        return None
    num, den = sympy.fraction(sympy.together(square))
    if not (den.is_Integer and den > 0 and num.is_integer):
        return None
    root = FloorSqrt(sympy.expand(num * den))
    return root if den == 1 else sympy.floor(root / den)


def sanitize_symbol_name(raw: str) -> str:
    """Turn an ONNX dim_param (``'batch_size'``, ``'s0 + 1'``, ``'1d'``) into a valid identifier."""
    name = re.sub(r"[^0-9a-zA-Z_]", "_", raw.strip())
    name = re.sub(r"_+", "_", name).strip("_") or "dim"
    if name[0].isdigit():
        name = "d_" + name
    if name in _RESERVED:
        name = name + "_"
    return name


def make_symbol(name: str, min: int = 1) -> sympy.Symbol:
    """Dimension symbols are integers, positive unless their range holds 0 (an empty KV cache, a
    data-dependent count): SymPy uses the sign when simplifying, so it must not assume more."""
    if min >= 1:
        return sympy.Symbol(name, integer=True, positive=True)
    return sympy.Symbol(name, integer=True, nonnegative=True)


@dataclass
class SymbolInfo:
    symbol: sympy.Symbol
    min: int
    max: int
    origin: str  # "user" | "dim_param" | "input" (unnamed input axis) | "fresh" | "data-dependent"
    note: str = ""  # where the symbol came from, for reports
    user_bounded: bool = False  # the user's --dim declared this range

    @property
    def name(self) -> str:
        return self.symbol.name


@dataclass
class Constraint:
    lhs: Expr
    rhs: Expr
    reason: str
    relation: str = "=="  # "==", "<=" or "in" (membership in a FiniteSet)

    def __str__(self) -> str:
        return f"{self.lhs} {self.relation} {self.rhs}  ({self.reason})"


@dataclass
class SymbolTable:
    infos: dict[str, SymbolInfo] = field(default_factory=dict)
    constraints: list[Constraint] = field(default_factory=list)
    #: symbol -> expression it was unified into (always fully resolved)
    substitution: dict[sympy.Symbol, Expr] = field(default_factory=dict)
    _fresh_counter: int = 0
    #: canonical expression -> compiled evaluator (see :meth:`evaluate`)
    _compiled: dict = field(default_factory=dict, repr=False, compare=False)

    # ----------------------------------------------------------------- adding facts
    def new_symbol(self, name: str, *, origin: str, min: int = 1, max: int = DEFAULT_MAX,
                   note: str = "", user_bounded: bool = False) -> sympy.Symbol:
        name = sanitize_symbol_name(name)
        if name in self.infos:
            raise ValueError(f"symbol {name!r} already exists")
        sym = make_symbol(name, min)
        self.infos[name] = SymbolInfo(sym, min, max, origin, note, user_bounded)
        return sym

    def fresh_symbol(self, stem: str, *, origin: str = "fresh", note: str = "") -> sympy.Symbol:
        """A new symbol for a dimension nothing else determines (``unk_3``, ``nonzero_0``)."""
        while True:
            name = f"{sanitize_symbol_name(stem)}_{self._fresh_counter}"
            self._fresh_counter += 1
            if name not in self.infos:
                return self.new_symbol(name, origin=origin, min=0 if origin == "data-dependent" else 1,
                                       note=note)

    def get(self, name: str) -> SymbolInfo:
        return self.infos[name]

    def symbol(self, name: str) -> sympy.Symbol:
        return self.infos[name].symbol

    def live_symbols(self) -> list[SymbolInfo]:
        """Symbols not rewritten away by unification."""
        return [i for i in self.infos.values() if i.symbol not in self.substitution]

    def unify(self, a: Expr, b: Expr, reason: str) -> Expr:
        """Record that ``a == b`` must hold; return the canonical form of both.

        Raises ShapeError when the two provably differ.
        """
        a, b = self.canon(a), self.canon(b)
        if a == b or sympy.expand(a - b) == 0:
            return a
        if a.is_Integer and b.is_Integer:
            raise ShapeError(f"{reason}: dimension {a} != {b}")
        for x, y in ((a, b), (b, a)):  # (an identity's interval always holds 0: safe before simplify)
            if self._bounds_exclude_equal(x, y):
                raise ShapeError(f"{reason}: dimension {x} can never equal {y} "
                                 f"(ranges {self.bounds(x)} vs {self.bounds(y)})")
        if sympy.simplify(a - b) == 0:
            return a
        merged = self._unify_symbol(a, b, reason) or self._unify_min_max(a, b, reason)
        if merged is not None:
            return merged
        self.constraints.append(Constraint(a, b, reason))
        return a

    def tighten(self, sym: sympy.Symbol, lo: int | None, hi: int | None, reason: str) -> None:
        info = self.infos[sym.name]
        new_lo = info.min if lo is None else max(info.min, lo)
        new_hi = info.max if hi is None else min(info.max, hi)
        if new_lo > new_hi:
            raise ShapeError(f"{reason}: {sym} would need range [{new_lo}, {new_hi}], which is empty")
        if info.user_bounded and (new_lo, new_hi) != (info.min, info.max):
            raise ShapeError(
                f"{reason}: the model only supports {sym} in [{new_lo}, {new_hi}], "
                f"but --dim declares [{info.min}, {info.max}]")
        if (new_lo, new_hi) != (info.min, info.max):
            self.constraints.append(Constraint(sym, sympy.Integer(new_hi), reason, "<=")
                                    if new_hi != info.max else
                                    Constraint(sympy.Integer(new_lo), sym, reason, "<="))
        info.min, info.max = new_lo, new_hi

    def _unify_symbol(self, a: Expr, b: Expr, reason: str) -> Expr | None:
        """Rewrite a bare symbol into the other side; prefer keeping named symbols."""
        candidates = [(x, y) for x, y in ((a, b), (b, a))
                      if isinstance(x, sympy.Symbol) and x not in y.free_symbols]
        if not candidates:
            return None
        # Eliminate the least meaningful symbol: fresh before dim_param before user.
        rank = {"fresh": 0, "data-dependent": 1, "input": 2, "dim_param": 2, "user": 3}
        candidates.sort(key=lambda xy: (rank[self.infos[xy[0].name].origin]
                                        if isinstance(xy[1], sympy.Symbol) else 0))
        gone, kept = candidates[0]
        info = self.infos[gone.name]
        if isinstance(kept, sympy.Symbol):
            kept_info = self.infos[kept.name]
            if info.origin == "fresh" and kept_info.min < info.min:
                raise ShapeError(
                    f"{reason}: {kept} may be {kept_info.min} (range [{kept_info.min}, {kept_info.max}]) but must "
                    f"equal {gone} ({info.note or 'an unknown dim'}), which tscomp cannot show may be "
                    f"{kept_info.min} (a Reshape target that may be 0 reads as 'copy the input's dim' in ONNX); "
                    f"declare {kept} from {info.min}")
            if info.user_bounded and not kept_info.user_bounded:
                kept_info.user_bounded = True
                kept_info.min, kept_info.max = info.min, info.max
            self.tighten(kept, info.min, info.max, reason)
        else:
            lo, hi = self.bounds(kept)
            if lo > info.max or hi < info.min:
                raise ShapeError(f"{reason}: {gone} in [{info.min}, {info.max}] cannot equal {kept}")
        self._substitute(gone, kept)
        self.constraints.append(Constraint(gone, kept, reason))
        return kept

    def _unify_min_max(self, a: Expr, b: Expr, reason: str) -> Expr | None:
        """``Min(c, s) == s`` means ``s <= c``; ``Max(c, s) == s`` means ``s >= c``."""
        for x, y in ((a, b), (b, a)):
            if isinstance(x, (sympy.Min, sympy.Max)) and y in x.args and len(x.args) == 2:
                other = x.args[0] if x.args[1] == y else x.args[1]
                if isinstance(y, sympy.Symbol) and other.is_Integer:
                    if isinstance(x, sympy.Min):
                        self.tighten(y, None, int(other), reason)
                    else:
                        self.tighten(y, int(other), None, reason)
                    return self.canon(y)
        return None

    def _substitute(self, gone: sympy.Symbol, kept: Expr) -> None:
        for k, v in self.substitution.items():
            self.substitution[k] = v.xreplace({gone: kept})
        self.substitution[gone] = kept

    # ------------------------------------------------------------- pure queries
    def canon(self, expr) -> Expr:
        """Apply unification results and range-aware simplification."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return expr
        if self.substitution:
            expr = expr.xreplace(self.substitution)
        return self.simplify(expr)

    def simplify(self, expr: Expr) -> Expr:
        """Resolve Min/Max whose outcome the symbol ranges decide, put integer ``Mod`` in the form
        that lets padding arithmetic cancel (:meth:`_resolve_mod`), and fold nested floor or ceiling
        divisions into one (:func:`fold_nested_rounding`; a floor around a ceiling or the reverse by
        :func:`align_mixed_rounding`)."""
        if expr.has(sympy.floor, sympy.ceiling):
            expr = fold_roundings(expr)
            expr = expr.replace(lambda e: isinstance(e, (sympy.floor, sympy.ceiling)), integer_part_outside)
        if expr.has(sympy.Mod):
            expr = expr.replace(lambda e: isinstance(e, sympy.Mod), self._resolve_mod)
        if not expr.has(sympy.Min, sympy.Max):
            return expr
        return expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), self._resolve_min_max)

    def _resolve_mod(self, e: Expr) -> Expr:
        """``Mod(a, m)`` for a positive integer ``m`` (floored, as ONNX integer Mod and SymPy):

        * ``a`` when the ranges prove ``0 <= a < m``;
        * ``m*ceiling(b/m) - b`` when ``a`` is ``-b`` up to multiples of ``m`` -- the pad amount
          ``(m - H % m) % m`` that exporters emit (SymPy writes it ``Mod(6*H, 7)``) becomes
          ``7*ceiling(H/7) - H``, so the padded extent ``H + pad`` is ``7*ceiling(H/7)`` and the
          window count ``(H + pad) // 7`` is ``ceiling(H/7)`` exactly;
        * else unchanged (``Mod(H, 7)``; :func:`_interval` knows it lies in [0, 6]).
        """
        a, m = e.args
        if not (m.is_Integer and int(m) > 0 and a.is_integer):
            return e
        lo, hi = self.bounds(a)
        if lo >= 0 and hi < int(m):
            return a
        centred = _centred_residue(a, int(m))
        if centred is not None and centred.could_extract_minus_sign():
            return m * sympy.ceiling(-centred / m) + centred
        return e

    def _resolve_min_max(self, e: Expr) -> Expr:
        # y "beats" x when it is provably the Min (or Max) of the two everywhere.
        beats = ((lambda y, x: self.prove_le(y, x)) if isinstance(e, sympy.Min)
                 else (lambda y, x: self.prove_le(x, y)))
        keep: list[Expr] = []
        for x in e.args:
            if any(beats(y, x) for y in keep):
                continue
            keep = [y for y in keep if not beats(x, y)] + [x]
        return type(e)(*keep) if len(keep) > 1 else keep[0]

    def bounds(self, expr) -> tuple[float, float]:
        """Conservative (lo, hi) of ``expr`` over the symbol ranges (interval arithmetic)."""
        return _interval(sympy.sympify(expr), self._symbol_range)

    def _symbol_range(self, sym: sympy.Symbol) -> tuple[float, float]:
        info = self.infos.get(sym.name)
        if info is None:
            return (-math.inf, math.inf)
        return (info.min, info.max)

    def prove_le(self, a, b) -> bool:
        """True only if ``a <= b`` holds for every binding in range."""
        diff = sympy.sympify(b) - sympy.sympify(a)
        if diff.is_number:
            return bool(diff >= 0)
        return self.bounds(diff)[0] >= 0

    def prove_eq(self, a, b) -> bool:
        a, b = self.canon(a), self.canon(b)
        if a == b:
            return True
        diff = sympy.expand(a - b)
        if diff == 0:
            return True
        if diff.is_number or self._bounds_exclude_equal(a, b):
            return False  # cheap refutation first: sympy.simplify costs ~0.1 s on floor/ceiling terms
        return sympy.simplify(diff) == 0

    def decide(self, rel: str, a, b) -> bool | None:
        """Decide ``a <rel> b`` (==, !=, <, <=, >, >=) over all bindings, or None if it depends."""
        a, b = self.canon(a), self.canon(b)
        if rel in (">", ">="):
            a, b, rel = b, a, {">": "<", ">=": "<="}[rel]
        if rel in ("==", "!="):
            if self.prove_eq(a, b):
                return rel == "=="
            if a.is_number and b.is_number or self._bounds_exclude_equal(a, b):
                return rel == "!="
            return None
        strict = rel == "<"
        lo, hi = self.bounds(sympy.sympify(b) - sympy.sympify(a))
        if (lo > 0) or (lo >= 0 and not strict):
            return True
        if (hi <= 0 and strict) or hi < 0:
            return False
        return None

    def _bounds_exclude_equal(self, a, b) -> bool:
        lo, hi = self.bounds(sympy.sympify(a) - sympy.sympify(b))
        return lo > 0 or hi < 0

    def decidable_relations(self, bound) -> list[Constraint]:
        """The recorded relations (``==``, ``<=``, ``in``) whose every symbol is in ``bound`` (names):
        those a binding of them alone decides."""
        out = []
        for c in self.constraints:
            if c.relation not in ("==", "<=", "in"):
                continue
            sides = (c.lhs,) if c.relation == "in" else (c.lhs, c.rhs)
            if all(s.name in bound for side in sides for s in self.canon(side).free_symbols):
                out.append(c)
        return out

    def relation_at(self, c: Constraint, binding: dict[str, int]) -> tuple[bool, Any, Any]:
        """(whether relation ``c`` holds at ``binding``, its left side's value, its right side's)."""
        lhs = self.evaluate(c.lhs, binding)
        rhs = c.rhs if c.relation == "in" else self.evaluate(c.rhs, binding)
        held = lhs == rhs if c.relation == "==" else lhs <= rhs if c.relation == "<=" else lhs in rhs
        return bool(held), lhs, rhs

    def evaluate(self, expr, binding: dict[str, int]):
        """Value of ``expr`` at a concrete binding of symbol names to ints.

        The canonical expression is compiled once into exact Python arithmetic (ints and
        Fractions, :func:`compile_int_expr`), so the runtime's per-shape decisions cost
        microseconds, not a SymPy substitution each."""
        if isinstance(expr, (int, float)):
            return expr
        cache = self.__dict__.setdefault("_compiled", {})
        # the table only grows (symbols, constraints, substitutions), so their counts version it
        key = (expr, len(self.infos), len(self.constraints), len(self.substitution))
        fn = cache.get(key)
        if fn is None:
            expr = self.canon(expr)
            fn = cache.get(expr)
            if fn is None:
                fn = cache[expr] = compile_int_expr(expr)
            cache[key] = fn
        try:
            return fn(binding)
        except KeyError:
            missing = sorted(s.name for s in self.canon(expr).free_symbols if s.name not in binding)
            raise ShapeError(f"cannot evaluate {expr}: no value for symbol(s) {', '.join(missing)}") from None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_compiled"] = {}       # closures do not pickle; they are rebuilt on demand
        return state

    def describe(self) -> list[str]:
        lines = []
        for info in self.live_symbols():
            lines.append(f"{info.name}: [{info.min}, {info.max}]  ({info.origin}"
                         + (f"; {info.note}" if info.note else "") + ")")
        return lines


def integer_part_outside(e: Expr) -> Expr:
    """``floor(y + c)`` -> ``floor(y + (c - n)) + n`` with ``n = floor(c)`` for a rational constant
    ``c`` (likewise ``ceiling``): one form for every integer shift, so ``floor(S/20 - 3/2) + 1``
    (a conv's output length plus one) and ``floor(S/20 - 1/2)`` (the same length computed by the
    exporter another way) are the same expression, ``floor(S/20 + 1/2) - 1``."""
    arg = sympy.expand(e.args[0])
    c, rest = arg.as_coeff_Add()
    if not c.is_Rational or rest == 0:
        return e
    n = sympy.floor(c)
    if n == 0:
        return e
    return type(e)(rest + (c - n)) + n


def fold_nested_rounding(e: Expr, positive=lambda b: b.is_Number and b > 0) -> Expr:
    """``floor((floor(y) + n) / b)`` -> ``floor((y + n) / b)`` for a positive integer ``b`` and an
    integer-valued ``n`` (likewise ``ceiling`` inside ``ceiling``): true for every real ``y``, since
    ``floor(y) + n = floor(y + n)`` and ``floor(floor(z) / b) = floor(z / b)``. Two strided layers
    in a row (a stride-5 then a stride-2 convolution) give ``floor(floor(S/5)/2)`` on one path and
    ``floor(S/10)`` on another (the exporter's own shape arithmetic); only one form lets a Reshape's
    -1 or an Add's broadcast see that the two are the same size. ``positive(b)`` says whether an
    integer-valued ``b`` is positive: a literal by default; index simplification asks the symbol
    ranges (``floor(height/4)`` as the divisor)."""
    rounding = type(e)
    arg = sympy.expand(e.args[0])
    for inner, b in _roundings_over_integers(arg, rounding, positive):
        rest = sympy.expand(arg - inner / b)
        if rest.has(inner) or not sympy.expand(rest * b).is_integer:
            continue
        return rounding(sympy.expand(inner.args[0] / b + rest))
    return e


def _roundings_over_integers(arg: Expr, kind, positive):
    """``(inner, b)`` for each rounding ``inner`` of ``kind`` that ``arg`` holds as ``inner / b``, ``b``
    a positive integer."""
    for inner in arg.atoms(kind):
        k = arg.coeff(inner)
        if k == 0:
            continue
        b = 1 / k
        if b.is_integer and positive(b):
            yield inner, b


def fold_roundings(expr: Expr, positive=lambda b: b.is_Number and b > 0) -> Expr:
    """Nested floor/ceiling divisions folded into one, innermost first, until none folds further
    (aligning a mixed pair can leave a same-kind pair for the enclosing rounding)."""
    def fold(e):
        e = fold_nested_rounding(e, positive) if e.args[0].has(type(e)) else e
        mixed = isinstance(e, (sympy.floor, sympy.ceiling)) and \
            e.args[0].has(sympy.ceiling if isinstance(e, sympy.floor) else sympy.floor)
        return align_mixed_rounding(e, positive) if mixed else e
    for _ in range(8):
        folded = expr.replace(lambda e: isinstance(e, (sympy.floor, sympy.ceiling))
                              and e.args[0].has(sympy.floor, sympy.ceiling), fold)
        if folded == expr:
            break
        expr = folded
    return expr


def align_mixed_rounding(e: Expr, positive=lambda b: b.is_Number and b > 0) -> Expr:
    """``ceiling(u / b)`` -> ``floor((u + b - 1) / b)`` (and ``floor(u / b)`` -> ``ceiling((u - b +
    1) / b)``) when the integer-valued ``u`` holds a rounding of the other kind, then folds the two
    (:func:`fold_nested_rounding`); ``b`` a positive integer. Both identities hold for every integer
    ``u``. SAME-padded strided layers mix the kinds: ``ceiling(floor(ceiling(H/2)/2 + 1/2)/2 + 1/2) - 1``
    (a SAME 3x3 stride-2 conv's output after a pool) and ``floor(ceiling(H/2)/4 + 1/4)`` (the same
    length on a residual branch) are one value, and only one form lets a Reshape's view of one
    read the other's buffer without division (GroupNorm's reshape back onto the residual's shape)."""
    rounding = type(e)
    other = sympy.ceiling if rounding is sympy.floor else sympy.floor
    arg = sympy.expand(e.args[0])
    for _, b in _roundings_over_integers(arg, other, positive):
        u = sympy.expand(arg * b)
        if not u.is_integer:
            continue
        shift = b - 1 if rounding is sympy.ceiling else 1 - b
        return fold_nested_rounding(other(sympy.expand((u + shift) / b)), positive)
    return e


def _evaluator_names() -> dict[str, object]:
    """The names a generated evaluator's code may call (:func:`_py` adds its rational constants)."""
    return {"floor": math.floor, "ceil": math.ceil, "Fraction": Fraction, "isqrt": math.isqrt}


def compile_int_expr(expr: Expr):
    """``expr`` as a Python function of a binding dict (symbol name -> int) with exact integer and
    rational arithmetic: what ``int(expr.xreplace(...))`` gives, ~100x faster (one generated
    lambda, no SymPy at call time). Node types it does not know fall back to SymPy substitution."""
    consts = _evaluator_names()
    try:
        code = _py(sympy.sympify(expr), consts)
    except NotImplementedError:
        return _substituting(sympy.sympify(expr))
    fn = eval(f"lambda b: {code}", consts)  # noqa: S307 - generated from a SymPy tree, names are quoted

    def evaluate(binding):
        v = fn(binding)
        return v if isinstance(v, int) else int(v) if v == int(v) else v
    return evaluate


def compile_int_tuple(exprs):
    """``exprs`` as one Python function of a binding returning the tuple of their values (a
    tensor's shape per request: one generated lambda instead of a call per extent). Where an
    expression needs rational arithmetic or SymPy, each element goes through
    :func:`compile_int_expr`."""
    consts = _evaluator_names()
    try:
        codes = [_py(sympy.sympify(e), consts) for e in exprs]
    except NotImplementedError:
        codes = None
    if codes is None or any(isinstance(v, Fraction) for v in consts.values()):
        fns = [compile_int_expr(e) for e in exprs]
        return lambda binding: tuple(int(f(binding)) for f in fns)
    # integer nodes only (+, *, non-negative powers, %, min/max/floor/ceil/abs of ints): ints out
    return eval(f"lambda b: ({''.join(c + ', ' for c in codes)})", consts)  # noqa: S307 - generated from SymPy trees


def _py(e: Expr, consts: dict) -> str:
    """Python source for ``e`` (ints and Fractions only)."""
    if e.is_Integer:
        return f"({int(e)})"
    if e.is_Rational:
        name = f"q{len(consts)}"
        consts[name] = Fraction(int(e.p), int(e.q))
        return name
    if isinstance(e, sympy.Symbol):
        return f"b[{e.name!r}]"
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        over = _integer_over_integer(e.args[0])
        if over is not None:        # floor(n / d) as n // d: integer arithmetic, no Fractions per call
            num, den = _py(over[0], consts), over[1]
            return f"({num} // {den})" if isinstance(e, sympy.floor) else f"(-((-{num}) // {den}))"
    args = [_py(a, consts) for a in e.args]
    if e.is_Add:
        return "(" + " + ".join(args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(args) + ")"
    if e.is_Pow and e.exp.is_Integer and int(e.exp) >= 0:
        return f"({args[0]} ** {int(e.exp)})"
    if isinstance(e, sympy.Mod):
        return f"({args[0]} % {args[1]})"      # Python's % floors, as sympy.Mod does
    if isinstance(e, FloorSqrt):
        return f"isqrt(int({args[0]}))"
    named = {sympy.Min: "min", sympy.Max: "max", sympy.floor: "floor", sympy.ceiling: "ceil", sympy.Abs: "abs"}
    for kind, fn in named.items():
        if isinstance(e, kind):
            return f"{fn}({', '.join(args)})"
    raise NotImplementedError(type(e).__name__)


def _integer_over_integer(u: Expr) -> tuple[Expr, int] | None:
    """``(n, d)`` with ``u == n / d``, ``n`` an integer-valued expression whose own Python code
    needs no Fractions (integer coefficients) and ``d`` a positive integer; None otherwise."""
    num, den = sympy.fraction(sympy.together(u))
    num = sympy.expand(num)
    if not (den.is_Integer and int(den) > 0 and num.is_integer):
        return None
    if any(a.is_Rational and not a.is_Integer for a in sympy.preorder_traversal(num)):
        return None
    return num, int(den)


def _substituting(e: Expr):
    syms = sorted(e.free_symbols, key=lambda s: s.name)

    def evaluate(b):
        v = e.xreplace({s: sympy.Integer(b[s.name]) for s in syms})
        if not v.is_number:
            raise KeyError(str(v))
        return int(v) if v.is_Integer else v
    return evaluate


def _centred_residue(a: Expr, m: int) -> Expr | None:
    """``a`` with every integer coefficient (and the constant) moved into (-m/2, m/2] by adding
    multiples of ``m`` -- the same residue mod ``m``; None when ``a`` is not a sum of integer
    multiples of integer-valued terms."""
    terms = []
    for term in sympy.Add.make_args(sympy.expand(a)):
        c, rest = term.as_coeff_Mul()
        if not c.is_Integer or not rest.is_integer:
            return None
        c = int(c) % m
        if c > m // 2:
            c -= m
        terms.append(c * rest)
    return sympy.Add(*terms)


def _rounding_gap(u: Expr) -> float:
    """Sup of ``ceiling(u) - u`` (and of ``u - floor(u)``): ``(q-1)/q`` when ``u`` is an integer-valued
    expression over the integer ``q``, else 1."""
    num, den = sympy.fraction(sympy.together(u))
    if den.is_Integer and int(den) > 0 and num.is_integer:
        return (int(den) - 1) / int(den)
    return 1.0


def _rounding_pair_interval(expr: Expr, symbol_range) -> tuple[float, float] | None:
    """An Add with a term ``c*floor(u)`` (or ``c*ceiling(u)``): bound it as ``c*(floor(u) - u)``,
    which lies in ``c*[-gap, 0]``, plus the rest ``expr - c*floor(u) + c*u``. Interval arithmetic
    alone loses the correlation in ``7*ceiling(H/7) - H`` (it would say [7 - max H, 7*ceiling(max H/7)
    - 1]); this keeps it exact: [0, 6]."""
    for term in expr.args:
        c, r = term.as_coeff_Mul()
        if not isinstance(r, (sympy.floor, sympy.ceiling)):
            continue
        u = r.args[0]
        rest = sympy.expand(expr - term + c * u)
        if rest.has(r):
            continue
        gap = _rounding_gap(u)
        frac = (0.0, gap) if isinstance(r, sympy.ceiling) else (-gap, 0.0)
        lo, hi = _mul_interval((float(c), float(c)), frac)
        rlo, rhi = _interval(rest, symbol_range)
        return (lo + rlo, hi + rhi)
    return None


def _interval(expr: Expr, symbol_range) -> tuple[float, float]:
    """Interval arithmetic over a SymPy expression tree (conservative)."""
    if expr.is_Number:
        v = float(expr)
        return (v, v)
    if isinstance(expr, sympy.Symbol):
        return symbol_range(expr)
    args = [_interval(a, symbol_range) for a in expr.args]
    if expr.is_Add:
        lo, hi = (sum(a[0] for a in args), sum(a[1] for a in args))
        if expr.has(sympy.floor, sympy.ceiling):
            pair = _rounding_pair_interval(expr, symbol_range)
            if pair is not None:
                lo, hi = max(lo, pair[0]), min(hi, pair[1])
        return (lo, hi)
    if expr.is_Mul:
        lo, hi = args[0]
        for a in args[1:]:
            lo, hi = _mul_interval((lo, hi), a)
        return (lo, hi)
    if isinstance(expr, FloorSqrt):
        lo, hi = args[0]
        return (math.isqrt(max(0, math.floor(lo))) if math.isfinite(lo) else 0.0,
                math.isqrt(math.floor(hi)) if math.isfinite(hi) and hi >= 0 else math.inf)
    if isinstance(expr, sympy.floor):
        return (math.floor(args[0][0]) if math.isfinite(args[0][0]) else args[0][0],
                math.floor(args[0][1]) if math.isfinite(args[0][1]) else args[0][1])
    if isinstance(expr, sympy.ceiling):
        return (math.ceil(args[0][0]) if math.isfinite(args[0][0]) else args[0][0],
                math.ceil(args[0][1]) if math.isfinite(args[0][1]) else args[0][1])
    if isinstance(expr, sympy.Min):
        return (min(a[0] for a in args), min(a[1] for a in args))
    if isinstance(expr, sympy.Max):
        return (max(a[0] for a in args), max(a[1] for a in args))
    if isinstance(expr, sympy.Abs):
        lo, hi = args[0]
        if lo >= 0:
            return (lo, hi)
        if hi <= 0:
            return (-hi, -lo)
        return (0.0, max(-lo, hi))
    if isinstance(expr, sympy.Mod):  # floored: the sign of the divisor
        (alo, ahi), (mlo, mhi) = args
        if mlo > 0:
            return (0.0, min(mhi - 1, ahi) if alo >= 0 else mhi - 1)
        if mhi < 0:
            return (mlo + 1, 0.0)
        return (-math.inf, math.inf)
    if expr.is_Pow:
        (blo, bhi), (elo, ehi) = args
        if elo == ehi and blo > 0:
            e = elo
            vals = [blo ** e, bhi ** e] if math.isfinite(bhi) or e < 0 else [blo ** e, math.inf]
            if e < 0 and not math.isfinite(bhi):
                vals = [0.0, blo ** e]
            return (min(vals), max(vals))
        if elo == ehi and float(elo).is_integer() and elo > 0 and int(elo) % 2 == 0:
            m = max(abs(blo), abs(bhi))
            return (0.0 if blo <= 0 <= bhi else min(blo ** elo, bhi ** elo), m ** elo)
    return (-math.inf, math.inf)


def _mul_interval(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    prods = []
    for x in a:
        for y in b:
            if (x == 0 and math.isinf(y)) or (y == 0 and math.isinf(x)):
                prods.append(0.0)
            else:
                prods.append(x * y)
    return (min(prods), max(prods))


def numel(shape) -> Expr:
    """Element count of a symbolic shape."""
    return sympy.Mul(*shape) if len(shape) else sympy.Integer(1)


def same(a, b) -> bool:
    """Structural equality of two expressions after expansion (no range facts; None equals
    nothing)."""
    if a is None or b is None:
        return False
    a, b = sympy.sympify(a), sympy.sympify(b)
    return a == b or sympy.expand(a - b) == 0


def as_expr(v) -> Expr:
    """Coerce an int / numpy integer / float / SymPy object to a SymPy expression (a finite float
    as the exact rational it holds)."""
    if isinstance(v, sympy.Basic):
        return v
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, bool):
        return sympy.Integer(int(v))
    if isinstance(v, int):
        return sympy.Integer(v)
    if isinstance(v, float):
        if v.is_integer():
            return sympy.Integer(int(v))
        # the float's exact binary value as a rational: shape arithmetic stays exact. A Float
        # exponent made Pow(36, 0.5) a binary approximation, so DPT's token grid side
        # trunc(sqrt(6 * 6 patches)) came out as floor(2.449... * 2.449...) = 5
        return sympy.Rational(v) if math.isfinite(v) else sympy.Float(v)
    return sympy.sympify(v)


def shape_str(shape: Iterable) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
