"""The buffer plan decided once, symbolically (issue 10, "symbolic buffer plan"; TorchInductor and
BladeDISC plan memory over symbolic sizes, onnxruntime plans per concrete shape).

Every tensor that crosses between groups has a size that is an expression of the shape symbols
and a lifetime (the step that writes it, the last step that reads it) that does not depend on the
shape at all. :func:`plan_buffers_symbolic` decides the *placement* once, at load or compile time:
tensors whose lifetimes do not overlap share a slot (greedy, largest at the top of the ranges
first), and the slots are stacked, so every offset is

    offset(t) = max(0, max over u in below(t) of offset(u) + size(u))

with ``below(t)`` the members of the slot under t's. That holds for every binding in the ranges
(two live tensors are in different slots, and slots never overlap, whatever the sizes come to), so
per shape nothing is decided: the offsets are a fixed sequence of integer expressions, evaluated in
order — in Python with compiled expressions (:meth:`SymbolicBufferPlan.evaluate`), or as C
(:meth:`SymbolicBufferPlan.c_source`) by a native host program.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from tscomp.graph.symbols import SymbolTable, compile_int_expr
from tscomp.runtime.buffers import ALIGN, BufferPlan


@dataclass(frozen=True)
class SymbolicLifetime:
    name: str
    nbytes: sympy.Expr
    first: int
    last: int


@dataclass
class SymbolicBufferPlan:
    order: list[str]                      # placement order (each offset reads only earlier ones)
    sizes: dict[str, sympy.Expr]          # aligned bytes
    below: dict[str, tuple[str, ...]]     # the tensors each sits directly above
    _fns: dict | None = None

    def _compiled(self) -> dict:
        if self._fns is None:
            self._fns = {name: compile_int_expr(self.sizes[name]) for name in self.order}
        return self._fns

    def evaluate(self, binding: dict[str, int]) -> BufferPlan:
        """Concrete offsets and arena size at ``binding`` (symbol name -> int)."""
        fns = self._compiled()
        offsets: dict[str, int] = {}
        ends: dict[str, int] = {}
        arena = 0
        naive = 0
        for name in self.order:
            off = max((ends[u] for u in self.below[name]), default=0)
            size = int(fns[name](binding))
            offsets[name] = off
            ends[name] = off + size
            arena = max(arena, off + size)
            naive += size
        return BufferPlan(offsets, arena, naive)

    def c_source(self, func: str = "tscomp_buffer_plan", symbol_names: list[str] | None = None) -> str:
        """C: ``int64_t <func>(const int64_t *sym, int64_t *offsets)`` fills the offsets in
        :attr:`order` and returns the arena size; ``sym`` holds the symbols in ``symbol_names``
        order."""
        syms = symbol_names or sorted({s.name for e in self.sizes.values() for s in e.free_symbols})
        lines = [f"/* symbolic buffer plan: {len(self.order)} tensors, placed in this order */",
                 f"int64_t {func}(const int64_t *sym, int64_t *offsets)", "{"]
        lines += self.c_statements(syms)
        lines += [f"    offsets[{k}] = o{k};" for k in range(len(self.order))]
        lines += ["    return arena;", "}"]
        return "\n".join(lines) + "\n"

    def c_statements(self, symbol_names: list[str], indent: str = "    ") -> list[str]:
        """C statements declaring ``o<k>`` (offset) and ``e<k>`` (bytes) of the k-th tensor of
        :attr:`order` and ``arena`` (the total), from ``sym[]`` in ``symbol_names`` order."""
        from tscomp.codegen.c_expr import c_index

        index_of = {n: k for k, n in enumerate(symbol_names)}
        lines = [f"{indent}int64_t arena = 0;"]
        index = {name: k for k, name in enumerate(self.order)}
        for k, name in enumerate(self.order):
            size = self.sizes[name]
            names = {s: f"sym[{index_of[s.name]}]" for s in size.free_symbols}
            lines.append(f"{indent}int64_t o{k} = 0;   /* {name} */")
            for u in self.below[name]:
                j = index[u]
                lines.append(f"{indent}o{k} = ts_max(o{k}, o{j} + e{j});")
            lines.append(f"{indent}const int64_t e{k} = {c_index(size, names=names)};")
            lines.append(f"{indent}arena = ts_max(arena, o{k} + e{k});")
        return lines


def _aligned(nbytes: sympy.Expr) -> sympy.Expr:
    return ALIGN * sympy.ceiling(sympy.Max(1, nbytes) / ALIGN)


def plan_buffers_symbolic(lifetimes: list[SymbolicLifetime], symtab: SymbolTable) -> SymbolicBufferPlan:
    """Slots, then stacking: tensors (largest at the top of the ranges first) go into the first
    *slot* with room for them -- at the slot's base when no member there is live at the same time,
    or directly above a member, provided that no member live at the same time overlaps them and
    that they end below the slot's first (largest) member, both *proven* for every binding in the
    ranges (:meth:`~tscomp.graph.symbols.SymbolTable.prove_le`: QKᵀ's 1536·B·L bytes and an
    attention output's 512·B·L fit under an FFN activation's 2048·B·L). Slots sit one above the
    other. Valid at every binding by construction; tensors of the same kind in successive layers
    share one slot."""
    def top(lt: SymbolicLifetime) -> float:
        return float(symtab.bounds(lt.nbytes)[1])

    sizes = {lt.name: _aligned(lt.nbytes) for lt in lifetimes}
    proofs: dict[tuple, bool] = {}

    def le(a, b) -> bool:
        key = (a, b)
        if key not in proofs:
            proofs[key] = symtab.prove_le(a, b)
        return proofs[key]

    def overlap_in_time(u: SymbolicLifetime, t: SymbolicLifetime) -> bool:
        return not (u.last < t.first or t.last < u.first)

    ordered = sorted(lifetimes, key=lambda t: (-top(t), t.first, t.name))
    slots: list[list[SymbolicLifetime]] = []
    rel: dict[str, sympy.Expr] = {}                  # offset within its slot
    anchor: dict[str, str | None] = {}               # the member it sits on (None: the slot's base)

    def fits(slot: list[SymbolicLifetime], lt: SymbolicLifetime, at: sympy.Expr) -> bool:
        end = at + sizes[lt.name]
        if at != 0 and not le(end, sizes[slot[0].name]):
            return False
        return all(le(rel[u.name] + sizes[u.name], at) or le(end, rel[u.name])
                   for u in slot if overlap_in_time(u, lt))

    for lt in ordered:
        for slot in slots:
            candidates = [(None, sympy.Integer(0))] + [(u.name, rel[u.name] + sizes[u.name]) for u in slot]
            spot = next(((a, at) for a, at in candidates if fits(slot, lt, at)), None)
            if spot is not None:
                slot.append(lt)
                anchor[lt.name], rel[lt.name] = spot
                break
        else:
            slots.append([lt])
            anchor[lt.name], rel[lt.name] = None, sympy.Integer(0)
    order, below = [], {}
    previous: tuple[str, ...] = ()
    for slot in slots:
        for lt in slot:
            order.append(lt.name)
            # at the slot's base: above every member of the slot below (the top of the stack so far)
            below[lt.name] = previous if anchor[lt.name] is None else (anchor[lt.name],)
        previous = tuple(lt.name for lt in slot)
    return SymbolicBufferPlan(order, sizes, below)


__all__ = ["SymbolicBufferPlan", "SymbolicLifetime", "plan_buffers_symbolic"]
