"""C kernels (OpenMP) for the fused groups that are not GEMMs: elementwise/injective groups and
row reductions with their fused prologue and epilogue. TSCompiler §4.2 forms these groups
(reduce-level fusion, stitch fusion into multi-Reduce groups); as in its §5.3 loop fusion, every
statement fused around the heavy op runs inside the heavy op's loop nest, so only group inputs and
outputs touch memory. Shapes enter as ``int64_t`` arguments: one kernel serves every binding.

:func:`generate_group` turns one :class:`~tscomp.graph.fusion.plan.Group` of the Plan into C
from its expression IR (:mod:`tscomp.graph.fusion.expr`); the numpy interpreter
(:func:`tscomp.graph.fusion.interpret.evaluate_group`) is the semantics it reproduces.

* **elementwise** groups: one OpenMP loop nest per distinct output shape (outer axes collapsed
  and split across threads in static blocks, the innermost axis a ``simd`` loop); every output
  element is computed from the expression with common subexpressions in locals. Views and
  numpy broadcasting are index maps (:mod:`tscomp.codegen.c_expr`), elementwise ops are their
  registry entry's ``c_expr`` template, Gather/GatherElements/GatherND are indirect loads
  (negative indices count from the end), Concat selects its source by index range, Tile reads
  its input at the index modulo the input's shape.
* **index checks**: every data-dependent index is range-checked where it is loaded (``ts_index``
  of the prelude: the check sits with the index's definition, so an embedding row's index is
  checked once per row, outside the vector loop over the row). A kernel with checks returns
  ``int`` and takes an error record (``int64_t[4]``: check id + 1, value, flat position, extent)
  the first failing thread fills; the failing lookup reads element 0 instead, so no input
  reaches an out-of-bounds read. :class:`CompiledGroup` turns a failure into
  :class:`~tscomp.errors.IndexOutOfRangeError` naming the node, the index input, the value, its
  position and the valid range, as onnxruntime does. :attr:`GroupGenerator.index_checks` lists
  what a generator emitted, so the GEMM families built on it can see them.
* **reduce** groups whose heavy ops reduce *trailing* axes (Softmax/LogSoftmax, LayerNormalization,
  ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp with or without keepdims,
  ArgMax/ArgMin: one in-order pass keeping the first or last extreme), several
  of them stitched over the same rows (a decomposed LayerNorm: mean, then the centred variance):
  one parallel loop over the rows; per row, one pass per statistic over the row, evaluating the
  fused prologue on the fly; then one pass that applies the epilogue and stores. Softmax subtracts
  the row maximum; LayerNorm is two-pass (mean, then centred variance), as the references are;
  accumulation is in the element type (float).

Anything else (GEMM/opaque groups, reductions over leading axes, ops without a C template, views
whose parameters need run-time data) raises :class:`UnsupportedOperatorError` naming the group and
the op, so the runtime can fall back to another kernel. :class:`CompiledGroup` builds a kernel
with :mod:`tscomp.codegen.build`, loads it with ctypes and runs it on numpy arrays.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import re
from collections import Counter
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.kernel import NativeArg, NativeCall
from tscomp.codegen.native import PicklableKernel, binding_key, refusals_name_group
from tscomp.codegen.c_expr import (PRELUDE, CPrinter, math_helpers, IndexContext, broadcast_index, c_literal,
                                   c_symbol_name, delinearize, landing_index, linearize, view_index)
from tscomp.errors import ExecutionError, IndexOutOfRangeError, ShapeError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Const, Expr, Input, Op, View, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops import registry
from tscomp.graph.ops.nn import REDUCTIONS
from tscomp.graph.ops.registry import CTypes, c_type
from tscomp.graph.shape_propagation import reduced_axes, trailing_row_axes
from tscomp.graph.symbols import compile_int_expr, numel, same, shape_str

#: normalizing reductions the row kernel implements (besides the Reduce* family)
ROW_KERNEL_OPS = ("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization", "ArgMax", "ArgMin")

#: arg reductions: the comparison that makes a new element the row's extreme
ARG_OPS = {"ArgMax": ">", "ArgMin": "<"}

#: loop nests over fewer elements than this run on one thread (no OpenMP fork/join)
PARALLEL_MIN_ELEMENTS = 1 << 15
#: an elementwise nest whose innermost axis may be shorter than this joins trailing axes into one
#: simd loop where every read stays a unit-stride run (:meth:`GroupGenerator.flat_trailing_axes`)
SHORT_INNER_AXIS = 64
#: ... until the joined run is at least this long
LONG_SIMD_RUN = 256

#: heavy ops a row kernel implements, by how they reduce
ROW_OPS = (*ROW_KERNEL_OPS, *REDUCTIONS)


@dataclass
class KernelArg:
    role: str                 # "input" | "output" | "symbol"
    name: str                 # tensor name (inputs/outputs) or symbol name
    cname: str                # the C parameter
    dtype: np.dtype | None = None
    shape: tuple = ()         # symbolic shape (tensors)
    symbol: sympy.Symbol | None = None


@dataclass(frozen=True)
class IndexCheck:
    """One data-dependent index a kernel range-checks: the ONNX node and its index input, and the
    index tensor's symbolic shape (to turn a flat position back into a multi-index)."""
    node: str
    op_type: str
    input: str
    shape: tuple
    #: a count (a sequence length), valid in [0, extent - 1], rather than an index
    count: bool = False

    def error(self, value: int, pos: int, extent: int, shape: tuple[int, ...] | None = None) -> IndexOutOfRangeError:
        where = f"at {tuple(int(i) for i in np.unravel_index(pos, shape))} " if shape and 0 <= pos < int(np.prod(shape)) \
            else f"at flat position {pos} "
        if self.count:
            return IndexOutOfRangeError(
                f"{self.op_type} node {self.node!r}: input {self.input!r} has value {value} {where}outside the "
                f"valid range [0, {extent - 1}]", node=self.node, input=self.input, value=value, extent=extent)
        return IndexOutOfRangeError(
            f"{self.op_type} node {self.node!r}: index input {self.input!r} has value {value} {where}"
            f"outside the valid range [{-extent}, {extent - 1}] (indices element out of data bounds)",
            node=self.node, input=self.input, value=value, extent=extent)


@dataclass
class KernelSource:
    """Generated C for one group: the source text, its entry point and its parameters in order
    (inputs as ``const T*``, outputs as ``T*``, then the shape symbols as ``int64_t``)."""
    group: str
    kind: str                 # "elementwise" | "reduce"
    func: str
    source: str
    args: list[KernelArg]
    index_checks: list[IndexCheck] = dataclasses.field(default_factory=list)   # error record if any

    @property
    def checks_indices(self) -> bool:
        """Whether the kernel takes an error record (last argument) and returns a status."""
        return bool(self.index_checks)

    @property
    def inputs(self) -> list[KernelArg]:
        return [a for a in self.args if a.role == "input"]

    @property
    def outputs(self) -> list[KernelArg]:
        return [a for a in self.args if a.role == "output"]

    @property
    def symbols(self) -> list[KernelArg]:
        return [a for a in self.args if a.role == "symbol"]


def generate_group(plan: Plan, group: Group) -> KernelSource:
    """C source of ``group``'s kernel; :class:`UnsupportedOperatorError` when it has no CPU
    kernel here (the runtime falls back)."""
    if group.kind not in ("elementwise", "reduce"):
        raise UnsupportedOperatorError(f"group {group.name}: {group.kind} groups are not generated here "
                                       f"(backbone {group.backbone or '-'})")
    with refusals_name_group(group.name):
        return GroupGenerator(plan, group).generate()


# ============================================================================ generator
@dataclass
class _Row:
    """The row structure of a reduce kernel: the iteration space splits into outer axes (one row
    per outer index) and the trailing reduced axes."""
    space: tuple
    k: int                    # first reduced axis
    outer: tuple              # the current row's outer index (loop variables, 0 for size-1 axes)


class _Block:
    """A C block under construction: its opening/closing lines and body items (lines or blocks).
    Values are defined in the outermost open block where everything they read is defined (loop
    invariants move out of loops); a *barrier* block (a Concat branch) keeps what it computes
    inside, since its loads are only valid under its condition."""

    def __init__(self, head=(), tail=(), barrier: bool = False):
        self.head, self.tail = list(head), list(tail)   # (line, extra indent) pairs
        self.items: list = []
        self.cache: dict = {}
        self.barrier = barrier
        self.open: _Block | None = None

    def add(self, item) -> None:
        if self.open is not None:   # before the loop being filled, so it is defined there
            self.items.insert(self.items.index(self.open), item)
        else:
            self.items.append(item)

    def render(self, depth: int) -> list[str]:
        out = ["    " * (depth + d) + line for line, d in self.head]
        inner = depth + (max((d for _, d in self.head), default=-1) + 1 if self.head else 0)
        for item in self.items:
            out += item.render(inner) if isinstance(item, _Block) else ["    " * inner + item if item else ""]
        out += ["    " * (depth + d) + line for line, d in self.tail]
        return out


class GroupGenerator:
    def __init__(self, plan: Plan, group: Group):
        self.plan, self.group = plan, group
        self.nodes = {n.name: n for n in plan.graph.nodes}
        self.symtab = plan.graph.symbols
        self.ctx = IndexContext(self.symtab)
        self.decls: list[str] = []      # function-scope declarations (symbolic constant arrays, hoisted sizes)
        self.pr = CPrinter(self.ctx, hoist=self._declare_size,
                           shape_symbols=frozenset(i.symbol for i in self.symtab.infos.values()))
        self.root = _Block()
        self.stack: list[_Block] = [self.root]
        self.statics: list[str] = []    # file-scope constant arrays
        self.arrays: dict[int, str] = {}
        self.where: dict[str, _Block] = {}          # local -> block that defines it
        self.var_block: dict[sympy.Symbol, _Block] = {}
        self.counter = Counter()
        #: names of constant arrays (k0, k1, ...); generators whose arrays share one file scope
        #: (a GEMM group's row pass and A prologue) take different stems
        self.const_stem = "k"
        self.canon_cache: dict = {}
        self.in_c = {name: f"in{k}" for k, name in enumerate(group.inputs)}
        self.out_c = {name: f"out{k}" for k, name in enumerate(group.outputs)}
        self.row: _Row | None = None
        self.stats: dict[str, dict[str, str]] = {}   # ONNX node of a heavy op -> its row statistics
        self.scratch: list[tuple[str, str]] = []     # per-thread row buffers (name, C type)
        #: every data-dependent index emitted, in check-id order: the C calls ``ts_index`` with the
        #: error record ``TSCOMP_ERR_RECORD`` (the ``tscomp_err`` parameter where the kernel defines
        #: it before the prelude, as :meth:`generate` does; a null pointer, so a trap, otherwise)
        self.index_checks: list[IndexCheck] = []
        #: the flat variable of the row loop open now, the divisors it is read through (``floor(r /
        #: S)``: a per-channel constant of a row spanning channels), and the split a second pass makes
        self.row_flat: sympy.Symbol | None = None
        self.row_divisors: list[sympy.Expr] = []
        self.row_split: sympy.Expr | None = None

    #: whether the generated kernel carries the ``tscomp_err`` record a checked gather reports to
    #: (the GEMM families' prologue/epilogue generators do not: they refuse data-dependent indices)
    reports_index_errors = True

    # ------------------------------------------------------------------ helpers
    def fail(self, what: str, e: Expr | None = None):
        where = f"{e.op_type} node {e.node!r}: " if isinstance(e, Op) else ""
        raise UnsupportedOperatorError(f"group {self.group.name}: {where}{what}")

    def canon(self, d) -> sympy.Expr:
        if d not in self.canon_cache:
            self.canon_cache[d] = self.symtab.canon(d)
        return self.canon_cache[d]

    def shape(self, e_or_shape) -> tuple:
        dims = e_or_shape.shape if isinstance(e_or_shape, Expr) else e_or_shape
        return tuple(self.canon(d) for d in dims)

    def ctype(self, dtype, e: Expr | None = None) -> str:
        t = c_type(dtype)
        if t is None:
            self.fail(f"element type {np.dtype(dtype)} has no C kernel type", e)
        return t

    def c(self, e) -> str:
        if self.row_flat is not None and isinstance(e, sympy.Basic) and e.has(self.row_flat):
            self._note_row_divisors(e)
        return self.pr(e)

    def _note_row_divisors(self, e: sympy.Expr) -> None:
        for f in e.atoms(sympy.floor):
            num, den = sympy.fraction(sympy.together(f.args[0]))
            if num == self.row_flat and not den.has(self.row_flat) and not den.is_Number:
                self.row_divisors.append(den)

    def _declare_size(self, text: str) -> str:
        """A function-scope constant for a size of shape symbols alone (the printer's ``hoist``)."""
        name = self.fresh("ts_sz")
        self.decls.append(f"const int64_t {name} = {text};")
        return name

    def fresh(self, stem: str) -> str:
        self.counter[stem] += 1
        return f"{stem}{self.counter[stem] - 1}"

    def emit(self, line: str = "") -> None:
        """A statement at the current position (the innermost open block)."""
        self.stack[-1].add(line)

    def local(self, name: str) -> str:
        """Record that ``name`` is defined in the innermost open block."""
        self.where[name] = self.stack[-1]
        return name

    def define(self, ctype: str, expr: str, deps=(), index=(), stem: str = "t", note: str = "") -> str:
        """``const ctype name = expr;`` in the outermost open block where the locals ``deps`` and
        the index variables of the expressions ``index`` are all defined."""
        level = max((k for k, b in enumerate(self.stack) if b.barrier), default=0)
        for d in deps:
            b = self.where.get(d)
            if b is not None:
                level = max(level, self.stack.index(b))
        for e in index:
            for s in sympy.sympify(e).free_symbols:
                b = self.var_block.get(s)
                if b is not None:
                    level = max(level, self.stack.index(b))
        name = self.fresh(stem)
        self.stack[level].add(f"const {ctype} {name} = {expr};" + (f"  /* {note} */" if note else ""))
        self.where[name] = self.stack[level]
        return name

    def push(self, block: _Block, variables=()) -> None:
        self.stack[-1].add(block)
        self.stack[-1].open = block
        self.stack.append(block)
        for v in variables:
            self.var_block[v] = block

    def pop(self) -> None:
        self.stack.pop()
        self.stack[-1].open = None

    @contextlib.contextmanager
    def branch(self, head: str):
        self.push(_Block([(head + " {", 0)], [("}", 0)], barrier=True))
        try:
            yield
        finally:
            self.pop()

    def loops(self, shape, stem: str, mode: str, *, reductions: tuple[str, ...] = (), work=None,
              sequential: bool = False, reads=()):
        """Open a loop nest over the non-1 axes of ``shape``; returns (index tuple, closer).

        ``mode`` "elements": the outer axes collapsed into one parallel loop (static blocks), the
        innermost a simd loop -- or, given the expressions the body ``reads`` at the nest's index,
        several trailing axes as one flat simd loop (:meth:`flat_trailing_axes`); "rows": every
        axis collapsed into one parallel loop (the body holds the row loops); "row": one simd loop
        nest (with ``reductions`` over the whole nest)."""
        dims = list(shape)
        axes = [k for k, d in enumerate(dims) if d != 1]
        idx = [sympy.Integer(0)] * len(dims)
        for k in axes:
            idx[k] = self.ctx.var(f"{stem}{k}", dims[k])
        cond = f" if(parallel: {self.c(work if work is not None else numel(dims))} > {PARALLEL_MIN_ELEMENTS})"
        joined = self.flat_trailing_axes(dims, axes, reads, idx, stem) if mode == "elements" and reads else 1
        par = axes[:-joined] if mode == "elements" else axes if mode == "rows" else []
        simd = axes[len(par):] if mode != "rows" else []
        if not axes:
            self.push(_Block([("{", 0)], [("}", 0)]))
            return tuple(idx), self.pop
        nests = []   # (pragma, axes) per block: the collapsed parallel loops, then the simd loop(s)
        if mode == "row" and simd and not sequential:
            return self._flat_row_loop(dims, simd, idx, stem, reductions)
        # joined trailing axes: one flat loop, each axis's index delinearized from it (the reads
        # collapse back to the flat index)
        simd_extent = numel([dims[k] for k in simd])
        flat = self.ctx.var(f"{stem}flat", simd_extent) if joined > 1 else None
        if mode == "elements" and not par:
            nests.append((f"#pragma omp parallel for simd schedule(static){cond}", simd))
        else:
            if par:
                collapse = f" collapse({len(par)})" if len(par) > 1 else ""
                nests.append((f"#pragma omp parallel for{collapse} schedule(static){cond}", par))
            if simd:
                collapse = f" collapse({len(simd)})" if len(simd) > 1 and flat is None else ""
                nests.append((f"#pragma omp simd{collapse}{''.join(f' reduction({r})' for r in reductions)}"
                              if not sequential else "/* in order: an arg reduction keeps the first/last index */",
                              simd))
        for pragma, nest in nests:
            bounds = [(flat, simd_extent)] if flat is not None and nest is simd else [(idx[k], dims[k]) for k in nest]
            head = [(pragma, 0)] + [(f"for (int64_t {v} = 0; {v} < {self.c(d)}; ++{v}) {{", n)
                                    for n, (v, d) in enumerate(bounds)]
            tail = [("}", n) for n in reversed(range(len(bounds)))]
            self.push(_Block(head, tail), [v for v, _ in bounds])
        if flat is not None:
            for k, part in zip(simd, delinearize(flat, [dims[k] for k in simd], self.ctx)):
                idx[k] = part

        def close():
            for _ in nests:
                self.pop()
        return tuple(idx), close

    def flat_trailing_axes(self, dims, axes, reads, idx, stem: str) -> int:
        """How many trailing axes of an elementwise nest run as one flat simd loop: 1 unless the
        innermost axis may be shorter than :data:`SHORT_INNER_AXIS` (a CNN's [N, C, 7, 7]: a simd
        loop of 7 is all remainder, and a chain of divisions -- QuantizeLinear's -- runs at its
        latency, not its throughput); then as many as keep every read of ``reads`` a unit-stride
        run of the flat index (no division or modulo of it: a per-channel scale stays outside),
        until the run is at least :data:`LONG_SIMD_RUN` long."""
        if len(axes) < 2 or self.symtab.bounds(dims[axes[-1]])[0] >= SHORT_INNER_AXIS:
            return 1
        joined = 1
        for k in range(2, len(axes) + 1):
            if not self._reads_unit_stride(dims, axes[-k:], reads, idx, stem):
                break
            joined = k
            if self.symtab.bounds(numel([dims[a] for a in axes[-k:]]))[0] >= LONG_SIMD_RUN:
                break
        return joined

    def _reads_unit_stride(self, dims, flat_axes, reads, idx, stem: str) -> bool:
        """Whether every leaf read of ``reads`` (inputs, constant arrays), with ``flat_axes`` of the
        nest's index ``idx`` delinearized from one flat index, addresses memory without dividing it."""
        extents = [dims[a] for a in flat_axes]
        flat = self.ctx.var(f"{stem}flat", numel(extents))
        idx = list(idx)
        for a, part in zip(flat_axes, delinearize(flat, extents, self.ctx)):
            idx[a] = part
        offsets: list = []
        if not all(self._leaf_offsets(e, tuple(idx), offsets) for e in reads):
            return False
        return not any(a.has(flat) for off in offsets for a in sympy.sympify(off).atoms(sympy.floor, sympy.Mod))

    def _leaf_offsets(self, e: Expr, idx, out: list) -> bool:
        """Append the offsets at which ``e`` read at ``idx`` reads its inputs and constant arrays
        (as :meth:`_value` would address them); False through anything not read at its own element
        (a gather, a heavy op)."""
        idx = tuple(self.ctx.simplify(sympy.sympify(i)) for i in idx)
        if isinstance(e, Input):
            out.append(self.ctx.collapse(self.ctx.simplify(linearize(idx, self.shape(e)))))
            return True
        if isinstance(e, Const):
            val = np.asarray(e.value)
            if val.size > 1:
                out.append(self.ctx.simplify(linearize(idx[len(idx) - val.ndim:], val.shape)))
            return True
        if isinstance(e, View):
            return self._leaf_offsets(e.src, view_index(idx, self.canon_view(e), self.shape(e.src), self.ctx), out)
        if not isinstance(e, Op) or e.heavy or e.op_type in self._GATHERING:
            return False
        shape = self.shape(e)
        return all(a is None or self._leaf_offsets(a, broadcast_index(idx, shape, self.shape(a)), out) for a in e.args)

    def _flat_row_loop(self, dims, axes, idx, stem: str, reductions):
        """A row over its trailing axes (one or several) as one flat simd loop, each axis's index
        delinearized from it: reads contiguous over the row linearize back to the flat index
        (:meth:`IndexContext.collapse`), so a ReduceMean over [H, W] streams its row as one vector
        loop (a ``collapse(2)`` simd nest ran 4-11x slower: GCC vectorizes it poorly). With
        ``row_split`` set (:meth:`generate`'s second pass), an outer loop over runs of that many
        elements, each run one flat simd loop."""
        extents = [dims[k] for k in axes]
        n = numel(extents)
        pragma = f"#pragma omp simd{''.join(f' reduction({r})' for r in reductions)}"
        parts = self._row_split_count(n)
        if parts is None:
            flat = self.ctx.var(f"{stem}f" if len(axes) > 1 else f"{stem}{axes[0]}", n)
            self.row_flat = flat
            self.push(_Block([(pragma, 0), (f"for (int64_t {flat} = 0; {flat} < {self.c(n)}; ++{flat}) {{", 0)],
                             [("}", 0)]), [flat])
            close = self.pop
        else:   # `parts` runs of row_split elements, each one flat simd loop
            q, s = self.ctx.var(f"{stem}q", parts), self.ctx.var(f"{stem}s", self.row_split)
            self.push(_Block([(f"for (int64_t {q} = 0; {q} < {self.c(parts)}; ++{q}) {{", 0)], [("}", 0)]), [q])
            self.push(_Block([(pragma, 0), (f"for (int64_t {s} = 0; {s} < {self.c(self.row_split)}; ++{s}) {{", 0)],
                             [("}", 0)]), [s])
            flat = q * self.row_split + s

            def close():
                self.pop()
                self.pop()
        for k, part in zip(axes, delinearize(flat, extents, self.ctx)):
            idx[k] = part
        return tuple(idx), close

    def _row_split_count(self, n) -> sympy.Expr | None:
        """How many runs of ``row_split`` elements a row of ``n`` has (None: no split, or ``n`` is
        not a whole multiple of it)."""
        if self.row_split is None:
            return None
        count = sympy.cancel(sympy.sympify(n) / self.row_split)
        return count if sympy.fraction(count)[1] == 1 else None

    # ------------------------------------------------------------------ element values
    def value(self, e: Expr, idx) -> str:
        """A C identifier or literal holding the element of ``e`` at multi-index ``idx``."""
        idx = tuple(self.ctx.simplify(sympy.sympify(i)) for i in idx)
        key = (id(e), idx)
        for block in reversed(self.stack):
            if key in block.cache:
                return block.cache[key]
        out = self._value(e, idx)
        self.where.get(out, self.root).cache[key] = out
        return out

    def _value(self, e: Expr, idx) -> str:
        if isinstance(e, Input):
            # a flat index split by one view and joined by another (GroupNorm's reshapes around its
            # norm) collapses back: one unit-stride load, not a division per element
            off = self.ctx.collapse(self.ctx.simplify(linearize(idx, self.shape(e))))
            return self.define(self.ctype(e.dtype, e), f"{self.in_c[e.name]}[{self.c(off)}]", index=[off], stem="x")
        if isinstance(e, Const):
            return self.const_value(e, idx)
        if isinstance(e, View):
            op = self.canon_view(e)
            return self.value(e.src, view_index(idx, op, self.shape(e.src), self.ctx))
        if isinstance(e, Op):
            if e.heavy:
                return self.heavy_value(e, idx)
            if e.op_type == "Gather":
                return self.gather(e, idx)
            if e.op_type == "Concat":
                return self.concat(e, idx)
            if e.op_type == "GatherND":
                return self.gather_nd(e, idx)
            if e.op_type == "GatherElements":
                return self.gather_elements(e, idx)
            if e.op_type == "Tile":
                return self.tile(e, idx)
            return self.elementwise(e, idx)
        self.fail(f"expression node {type(e).__name__} is not supported")

    def canon_view(self, e: View):
        return e.op.canonical(self.canon)

    def const_value(self, e: Const, idx) -> str:
        val = np.asarray(e.value)
        ct = self.ctype(e.dtype, e)
        if e.symbolic:
            flat = [self.canon(x) for x in val.reshape(-1)]
            for x in flat:
                if not sympy.sympify(x).is_integer:
                    self.fail(f"symbolic constant {e.name} = {x} is not an integer expression")
            if val.size == 1:
                return f"(({ct})({self.c(flat[0])}))"
            if id(e) not in self.arrays:
                name = self.fresh(self.const_stem)
                self.arrays[id(e)] = name
                self.decls.append(f"const {ct} {name}[{val.size}] = {{{', '.join(self.c(x) for x in flat)}}};"
                                  f"  /* {e.name} */")
            off = linearize(idx[len(idx) - val.ndim:], val.shape)
            return self.define(ct, f"{self.arrays[id(e)]}[{self.c(off)}]", index=[off], stem="c")
        if val.size == 1:
            return c_literal(val.reshape(-1)[0], e.dtype)
        if id(e) not in self.arrays:
            name = self.fresh(self.const_stem)
            self.arrays[id(e)] = name
            body = ", ".join(c_literal(v, e.dtype) for v in val.reshape(-1))
            self.statics.append(f"static const {ct} {name}[{val.size}] = {{{body}}};  /* {e.name} */")
        # a Const's array may carry fewer leading dims than its symbolic shape
        off = linearize(idx[len(idx) - val.ndim:], val.shape)
        return self.define(ct, f"{self.arrays[id(e)]}[{self.c(off)}]", index=[off], stem="c")

    def elementwise(self, e: Op, idx) -> str:
        opdef = registry.lookup(e.op_type, e.domain, e.opset, e.node)
        if opdef.c_expr is None:
            self.fail(f"{opdef.fusion.value} op has no C template (OpDef.c_expr)", e)
        if e.num_outputs != 1 or e.output_index != 0:
            self.fail(f"output {e.output_index} of {e.num_outputs} is not supported", e)
        out_shape = self.shape(e)
        args = []
        for a in e.args:
            if a is None:
                args.append(None)
                continue
            a_shape = self.shape(a)
            if len(a_shape) > len(out_shape):
                self.fail(f"argument of shape {shape_str(a_shape)} does not broadcast to {shape_str(out_shape)}", e)
            args.append(self.value(a, broadcast_index(idx, out_shape, a_shape)))
        types = CTypes(np.dtype(e.dtype), tuple(np.dtype(a.dtype) if a is not None else None for a in e.args))
        expr = opdef.c_expr(args, dict(e.attrs), types)
        if expr is None:
            self.fail(f"no C form for element types {', '.join(str(t) for t in types.args)} -> {types.out}", e)
        if expr in args:
            return expr
        return self.define(self.ctype(e.dtype, e), expr, deps=[a for a in args if a], note=e.op_type)

    def gathered(self, e: Op, ind: Expr, ind_idx, dim):
        """The index variable an indirect load uses: the element of ``ind`` at ``ind_idx``, counted
        from the end of an axis of extent ``dim`` when negative (ONNX Gather semantics)."""
        if isinstance(ind, Const) and np.asarray(ind.value).size == 1:
            k = sympy.sympify(self.canon(np.asarray(ind.value).reshape(-1)[0]))
            decided = bool(k < 0) if k.is_Number else self.ctx.decide(sympy.Lt(k, 0))
            if decided is None:
                self.fail("an index whose sign is not known at compile time", e)
            return k + dim if decided else k
        if np.dtype(ind.dtype).kind not in "iu":
            self.fail(f"indices of type {ind.dtype}", e)
        key = ("gather", id(e), tuple(ind_idx))
        for block in reversed(self.stack):
            if key in block.cache:
                return block.cache[key]
        if not self.reports_index_errors:
            # a bad index must raise, never read out of bounds: only kernels with an error record may
            # contain a checked gather; elsewhere the group is refused and runs on a path that checks
            self.fail("a data-dependent index inside a kernel without an error record (a GEMM's "
                      "prologue/epilogue)", e)
        kv = self.value(ind, ind_idx)
        node = self.nodes.get(e.node)
        check = len(self.index_checks)
        self.index_checks.append(IndexCheck(e.node, e.op_type, node.inputs[1] if node else ind.name, self.shape(ind)))
        pos = self.ctx.simplify(linearize(ind_idx, self.shape(ind)))
        g = self.define("int64_t", f"ts_index((int64_t){kv}, {self.c(dim)}, {check}, {self.c(pos)}, TSCOMP_ERR_RECORD)",
                        deps=[kv], index=[dim, pos], stem="g", note=f"{e.op_type} {e.node}, checked")
        pos = self.ctx.var(g, dim)
        self.var_block[pos] = self.where[g]
        self.where[g].cache[key] = pos
        return pos

    def gather(self, e: Op, idx) -> str:
        data, ind = e.args
        d_shape = self.shape(data)
        axis = int(e.attrs.get("axis", 0)) % max(len(d_shape), 1)
        q = len(self.shape(ind))
        pos = self.gathered(e, ind, tuple(idx[axis:axis + q]), d_shape[axis])
        return self.value(data, tuple(idx[:axis]) + (pos,) + tuple(idx[axis + q:]))

    def gather_elements(self, e: Op, idx) -> str:
        data, ind = e.args
        d_shape = self.shape(data)
        axis = int(e.attrs.get("axis", 0)) % max(len(d_shape), 1)
        pos = self.gathered(e, ind, tuple(idx), d_shape[axis])
        return self.value(data, tuple(idx[:axis]) + (pos,) + tuple(idx[axis + 1:]))

    def gather_nd(self, e: Op, idx) -> str:
        data, ind = e.args
        d_shape, i_shape = self.shape(data), self.shape(ind)
        b = int(e.attrs.get("batch_dims", 0))
        k = i_shape[-1]
        if not k.is_Integer:
            self.fail("indices with a symbolic last dim", e)
        q = len(i_shape) - 1
        pos = tuple(self.gathered(e, ind, tuple(idx[:q]) + (sympy.Integer(j),), d_shape[b + j]) for j in range(int(k)))
        return self.value(data, tuple(idx[:b]) + pos + tuple(idx[q:]))

    def tile(self, e: Op, idx) -> str:
        """Tile: element ``idx`` of the repeated tensor is element ``idx mod shape`` of its input."""
        d_shape = self.shape(e.args[0])
        if len(d_shape) != len(idx):
            self.fail(f"input of rank {len(d_shape)} for an output of rank {len(idx)}", e)
        src = tuple(sympy.Integer(0) if d == 1 else self.ctx.simplify(sympy.Mod(i, d)) for i, d in zip(idx, d_shape))
        return self.value(e.args[0], src)

    def concat(self, e: Op, idx) -> str:
        out_shape = self.shape(e)
        axis = int(e.attrs.get("axis", 1 if e.opset < 4 else 0)) % len(out_shape)
        parts, off = [], sympy.Integer(0)
        for a in e.args:
            if a is None:
                continue
            n = self.shape(a)[axis]
            if n != 0:
                parts.append((a, off, off + n))
            off = off + n
        i = idx[axis]
        if len(parts) == 1:
            a, lo, _ = parts[0]
            return self.value(a, idx[:axis] + (self.ctx.simplify(i - lo),) + idx[axis + 1:])
        # statically known position (an index that is a number, or ranges that decide it)
        for a, lo, hi in parts:
            if self.ctx.prove_le(lo, i) and self.ctx.prove_le(i + 1, hi):
                return self.value(a, idx[:axis] + (self.ctx.simplify(i - lo),) + idx[axis + 1:])
        t = self.local(self.fresh("t"))
        self.emit(f"{self.ctype(e.dtype, e)} {t};  /* Concat {e.node} */")
        for n, (a, lo, hi) in enumerate(parts):
            last = n == len(parts) - 1
            head = "else" if last else f"if ({self.c(i)} < {self.c(hi)})"
            if n and not last:
                head = "else " + head
            with self.branch(head):
                j = i
                if lo != 0:  # a variable of its own, whose range [0, extent) simplifies what it indexes
                    name = self.define("int64_t", self.c(i - lo), index=[i - lo], stem="j")
                    j = self.ctx.var(name, hi - lo)
                    self.var_block[j] = self.where[name]
                v = self.value(a, idx[:axis] + (j,) + idx[axis + 1:])
                self.emit(f"{t} = {v};")
        return t

    # ------------------------------------------------------------------ reductions
    def row_start(self, h: Op) -> int:
        """The first reduced axis of a heavy op whose reduction covers the trailing axes. The
        axes are the op's registry ``reduced_axes`` (what the fusion stage stitched on)."""
        rank = len(self.shape(h.args[0]))
        if h.op_type not in ROW_KERNEL_OPS and h.op_type not in REDUCTIONS:
            self.fail("reduction is not implemented by the row kernel", h)
        if h.op_type == "LayerNormalization" and int(h.attrs.get("stash_type", 1)) != 1:
            self.fail("stash_type other than float", h)
        axes = reduced_axes(self.plan.graph, self.nodes[h.node])
        if axes is None:
            self.fail("reduction axes known only at run time", h)
        if not axes:
            self.fail("noop_with_empty_axes", h)
        rows = trailing_row_axes(self.shape(h.args[0]), axes)
        if rows is None:
            self.fail(f"reduces axes {sorted(axes)} of a rank-{rank} tensor; only trailing axes are supported", h)
        return rank - len(rows)

    def common_rows(self, reductions: list[Op]) -> tuple[tuple, int]:
        """The iteration space and first reduced axis shared by stitched row reductions (refused
        when an op is not a row op or they reduce different rows)."""
        for h in reductions:
            if h.op_type not in ROW_OPS:
                self.fail("reduction is not implemented by the row kernel", h)
        space = self.shape(reductions[0].args[0])
        k = self.row_start(reductions[0])
        for h in reductions[1:]:
            s = self.shape(h.args[0])
            if len(s) != len(space) or not all(same(a, b) for a, b in zip(s, space)) or self.row_start(h) != k:
                self.fail(f"stitched reduction over other rows ({shape_str(s)} vs {shape_str(space)})", h)
        return space, k

    def split_row_outputs(self, outputs, space, k, scatter: bool = False) -> tuple[list[str], list[str], list[str]]:
        """Outputs of a row kernel: full rows (shape ``space``), row statistics (``space`` with the
        reduced axes dropped or kept as 1) and, with ``scatter``, rows stored permuted (views of
        a ``space``-shaped value: :meth:`store_scattered`); anything else is refused."""
        full, stat, scattered = [], [], []
        stat_shapes = (space[:k] + (sympy.Integer(1),) * (len(space) - k), space[:k])
        for name, e in outputs.items():
            shape = self.shape(e)
            if len(shape) == len(space) and all(same(a, b) for a, b in zip(shape, space)):
                full.append(name)
            elif any(len(shape) == len(s) and all(same(a, b) for a, b in zip(shape, s)) for s in stat_shapes):
                stat.append(name)
            elif scatter and self._reads_through_views(e):
                scattered.append(name)
            else:
                self.fail(f"output {name} of shape {shape_str(shape)} is neither a row {shape_str(space)} "
                          f"nor a row statistic" + (" nor a view of rows" if scatter else ""))
        return full, stat, scattered

    @staticmethod
    def _reads_through_views(e: Expr) -> bool:
        """Whether ``e`` reads anything through a view: a candidate for a scattered store
        (:meth:`store_scattered` decides, or refuses)."""
        return any(isinstance(x, View) for x in walk([e]))

    #: ops whose operands are not read at their own (broadcast) element: no landing index is
    #: solved through them
    _GATHERING = ("Gather", "Concat", "GatherND", "GatherElements", "Tile")

    def _row_reads(self, e: Expr, idx, out: list) -> bool:
        """Append the row-space index at which ``e`` read at ``idx`` reads the rows: at the first
        value of the row space's shape on each path (the rows' input, a full-row result, anything
        computed from them), or a row statistic's row. False when something in between is not read
        at its own element (a gather)."""
        space, k = self.row.space, self.row.k
        shape = self.shape(e)
        if len(shape) == len(space) and all(same(a, b) for a, b in zip(shape, space)):
            out.append(tuple(idx))
            return True
        if isinstance(e, View):
            src_idx = view_index(idx, self.canon_view(e), self.shape(e.src), self.ctx)
            return self._row_reads(e.src, tuple(self.ctx.simplify(i) for i in src_idx), out)
        if isinstance(e, (Const, Input)):
            return True         # a weight or table broadcast over the rows
        if not isinstance(e, Op):
            return False
        if e.heavy:             # a row statistic (keepdims or not): its row only
            out.append(tuple(idx[:k]) + (None,) * (len(space) - k))
            return True
        if e.op_type in self._GATHERING:
            return False
        return all(a is None or self._row_reads(a, broadcast_index(idx, shape, self.shape(a)), out) for a in e.args)

    def store_scattered(self, name: str, e: Expr, full_idx) -> None:
        """Store output ``name`` where row element ``full_idx`` lands in it: an output in another
        layout than the rows, reading them through views -- a normalized query or key ([B, L,
        heads, D] rows) transposed into heads ([B, heads, L, D]) and scaled on the way out. Which
        row element each output element reads is probed (every read of a row value must agree),
        the landing index solved from it (:func:`landing_index`), and the output read at the
        landing index must read exactly ``full_idx`` again, so a wrong inverse is refused, never
        miscompiled."""
        shape = self.shape(e)
        if not same(numel(shape), numel(self.row.space)):
            self.fail(f"output {name} of shape {shape_str(shape)} has another element count than the rows")
        ovars = tuple(self.ctx.var(self.fresh(f"o{a}_"), d) if d != 1 else sympy.Integer(0)
                      for a, d in enumerate(shape))
        target = tuple(self.ctx.simplify(i) for i in full_idx)
        reads = self._agreed_row_read(name, e, ovars)
        where = landing_index(reads, target, ovars, dict(zip(ovars, shape)), self.ctx,
                              lambda why: self.fail(f"output {name}: {why}"))
        back = self._agreed_row_read(name, e, where)
        if not all(same(self.ctx.without_mods(a), self.ctx.without_mods(b)) for a, b in zip(back, target)):
            self.fail(f"output {name}: its element read at the solved index is not the row element stored")
        v = self.value(e, where)
        off = self.ctx.collapse(self.ctx.simplify(linearize(where, shape)))
        in_order = same(off, self.ctx.collapse(self.ctx.simplify(linearize(target, self.row.space))))
        note = "the rows, reshaped" if in_order else "scattered: the rows in another layout"
        self.emit(f"{self.out_c[name]}[{self.c(off)}] = {v};  /* {note} */")

    def _agreed_row_read(self, name: str, e: Expr, idx) -> tuple:
        reads: list = []
        if not self._row_reads(e, idx, reads) or not reads:
            self.fail(f"output {name}: no row element it reads at its own element (a gather, or no row value)")
        merged = []
        for axis in range(len(self.row.space)):
            seen = {r[axis] for r in reads if r[axis] is not None}
            if len(seen) != 1:
                self.fail(f"output {name} reads {len(seen) or 'no'} different row positions on axis {axis}")
            merged.append(seen.pop())
        return tuple(merged)

    def row_idx(self, idx) -> tuple:
        return tuple(self.row.outer) + tuple(idx[self.row.k:])

    def check_row(self, h: Op, idx) -> None:
        for a, b in zip(idx[:self.row.k], self.row.outer):
            if not same(a, b):
                self.fail("reads a row statistic of another row (a view between the reduction and its consumer)", h)

    def stat_loop(self, reductions: tuple[str, ...] = (), sequential: bool = False):
        return self.loops(self.row.space[self.row.k:], "r", "row", reductions=reductions, sequential=sequential)

    def full_idx(self, ridx) -> tuple:
        return tuple(self.row.outer) + tuple(ridx)

    def emit_stats(self, h: Op) -> None:
        x = h.args[0]
        dt = np.dtype(x.dtype)
        ct = self.ctype(dt, h)
        f = "f" if dt == np.float32 else ""
        n = self.c(numel(self.row.space[self.row.k:]))
        op = h.op_type
        st: dict[str, str] = {}
        self.emit(f"/* {op} {h.node}: row statistics */")
        if op in ("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization") and dt.kind != "f":
            self.fail(f"{op} of {dt}", h)
        if op in ("Softmax", "LogSoftmax", "ReduceLogSumExp"):
            exp = "ts_expf" if f else "exp"   # ts_expf vectorizes (PRELUDE)
            m, s = self.fresh("mx"), self.fresh("sum")
            self.emit(f"{ct} {m} = -INFINITY;")
            self.local(m)   # values computed from the maximum stay in this row (a 1-element row has no loop to pin them)
            ridx, close = self.stat_loop((f"max:{m}",))
            xv = self.value(x, self.full_idx(ridx))
            self.emit(f"{m} = {xv} > {m} ? {xv} : {m};")
            close()
            if op == "ReduceLogSumExp":  # reference: a non-finite maximum shifts by 0
                self.emit(f"if (!isfinite({m})) {m} = 0;")
            self.emit(f"{ct} {s} = 0;")
            ridx, close = self.stat_loop((f"+:{s}",))
            xv = self.value(x, self.full_idx(ridx))
            if op == "Softmax":  # keep exp(x - max) in a per-thread row buffer for the output pass
                st["row"] = self.scratch_row(ct)
                ev = self.define(ct, f"{exp}({xv} - {m})", deps=[xv, m], stem="e")
                self.emit(f"{st['row']}[{self.c(linearize(ridx, self.row.space[self.row.k:]))}] = {ev};")
                self.emit(f"{s} += {ev};")
            else:
                self.emit(f"{s} += {exp}({xv} - {m});")
            close()
            st.update(max=m, sum=s)
            if op == "Softmax":
                st["inv"] = self.fresh("inv")
                self.emit(f"const {ct} {st['inv']} = 1 / {s};")
            if op == "LogSoftmax":
                st["logsum"] = self.fresh("lse")
                self.emit(f"const {ct} {st['logsum']} = log{f}({s});")
            if op == "ReduceLogSumExp":
                st["result"] = self.fresh("red")
                self.emit(f"const {ct} {st['result']} = log{f}({s}) + {m};")
        elif op in ARG_OPS:
            # one pass in order; NaN counts as the extreme (numpy): the first NaN, or the last with
            # select_last_index
            rel = ARG_OPS[op]
            best, arg = self.fresh("best"), self.fresh("arg")
            last = bool(h.attrs.get("select_last_index", 0))
            self.emit(f"{ct} {best} = 0;")
            self.emit(f"int64_t {arg} = -1;")
            ridx, close = self.stat_loop(sequential=True)
            xv = self.value(x, self.full_idx(ridx))
            pos = self.c(linearize(ridx, self.row.space[self.row.k:]))
            take = f"{xv} {rel} {best} || {xv} == {best} || {xv} != {xv}" if last else \
                f"{xv} {rel} {best} || ({xv} != {xv} && {best} == {best})"
            self.emit(f"if ({arg} < 0 || {take}) {{ {best} = {xv}; {arg} = {pos}; }}")
            close()
            st["result"] = self.fresh("red")
            self.emit(f"const int64_t {st['result']} = {arg} < 0 ? 0 : {arg};")
        elif op in ("LayerNormalization", "InstanceNormalization"):
            s, q = self.fresh("sum"), self.fresh("sq")
            mean, inv = self.fresh("mean"), self.fresh("rstd")
            eps = c_literal(float(h.attrs.get("epsilon", 1e-5)), dt)
            self.emit(f"{ct} {s} = 0;")
            ridx, close = self.stat_loop((f"+:{s}",))
            self.emit(f"{s} += {self.value(x, self.full_idx(ridx))};")
            close()
            self.emit(f"const {ct} {mean} = {s} / ({ct})({n});")
            self.emit(f"{ct} {q} = 0;")
            ridx, close = self.stat_loop((f"+:{q}",))
            xv = self.value(x, self.full_idx(ridx))
            d = self.fresh("d")
            self.emit(f"const {ct} {d} = {xv} - {mean};")
            self.emit(f"{q} += {d} * {d};")
            close()
            self.emit(f"const {ct} {inv} = 1 / sqrt{f}({q} / ({ct})({n}) + {eps});")
            st.update(mean=mean, rstd=inv)
        else:  # Reduce*
            if dt.kind not in "fiu":
                self.fail(f"{op} of {dt}", h)
            acc_t = ct if dt.kind == "f" else ("uint64_t" if dt.kind == "u" else "int64_t")
            acc = self.fresh("acc")
            if op in ("ReduceMax", "ReduceMin"):
                big = {"f": "INFINITY", "i": "INT64_MAX", "u": "UINT64_MAX"}[dt.kind]
                init = ("-" + big if dt.kind == "f" else "INT64_MIN") if op == "ReduceMax" else big
                if op == "ReduceMax" and dt.kind == "u":
                    init = "0"
                kind, rel = ("max", ">") if op == "ReduceMax" else ("min", "<")
                self.emit(f"{acc_t} {acc} = {init};")
                reds = (f"{kind}:{acc}",)
                nan = None
                if dt.kind == "f":  # numpy's maximum/minimum propagate NaN
                    nan = self.fresh("nan")
                    self.emit(f"int {nan} = 0;")
                    reds += (f"|:{nan}",)
                ridx, close = self.stat_loop(reds)
                xv = self.value(x, self.full_idx(ridx))
                self.emit(f"{acc} = {xv} {rel} {acc} ? {xv} : {acc};")
                if nan:
                    self.emit(f"{nan} |= {xv} != {xv};")
                close()
                result = f"({nan} ? NAN : {acc})" if nan else acc
            else:
                form = REDUCTIONS[op].c          # the registry entry's C form
                if form is None:
                    self.fail("reduction is not implemented by the row kernel", h)
                self.emit(f"{acc_t} {acc} = {form.init};")
                ridx, close = self.stat_loop((f"{form.omp}:{acc}",))
                xv = self.value(x, self.full_idx(ridx))
                self.emit(form.update.format(a=acc, x=xv))
                close()
                if dt.kind == "f" or "{f}" not in form.result:
                    result = form.result.format(a=acc, n=n, t=acc_t, f=f)
                else:       # an integer sqrt/log goes through double (the reference's)
                    result = f"({acc_t}){form.result.format(a=f'(double){acc}', n=n, t=acc_t, f='')}"
            st["result"] = self.fresh("red")
            self.emit(f"const {ct} {st['result']} = {result};")
        for key, name in st.items():
            if key != "row":
                self.local(name)
        self.stats[h.node] = st

    def scratch_row(self, ctype: str) -> str:
        """A per-thread buffer holding one row (allocated around the row loop, see below)."""
        name = self.fresh("row")
        self.scratch.append((name, ctype))
        return name

    def allocate_scratch(self, block: _Block, row_len, work) -> None:
        """Turn the row loop's ``parallel for`` into a parallel region that allocates each
        thread's row buffers once, around an ``omp for`` over the rows."""
        decls = [f"{ct} *restrict {name} = malloc(sizeof({ct}) * ({self.c(row_len)}));" for name, ct in self.scratch]
        frees = [f"free({name});" for name, _ in self.scratch]
        if block.head and block.head[0][0].startswith("#pragma omp parallel for"):
            pragma = block.head[0][0]
            cond = pragma[pragma.index(" if("):] if " if(" in pragma else ""
            loop = pragma.replace("#pragma omp parallel for", "#pragma omp for").replace(cond, "")
            block.head = ([(f"#pragma omp parallel{cond}", 0), ("{", 0)] + [(d, 1) for d in decls] + [(loop, 1)]
                          + [(line, d + 1) for line, d in block.head[1:]])
            block.tail = [(line, d + 1) for line, d in block.tail] + [(f, 1) for f in frees] + [("}", 0)]
        else:  # a single row: no parallel loop
            block.items[:0] = decls
            block.tail[:0] = [(f, 1) for f in frees]

    def heavy_value(self, e: Op, idx) -> str:
        if self.row is None or e.node not in self.stats:
            self.fail("a reduction outside the group's row structure", e)
        self.check_row(e, idx)
        st = self.stats[e.node]
        op = e.op_type
        if op in REDUCTIONS or op in ARG_OPS:
            return st["result"]
        ct = self.ctype(e.dtype, e)
        if op == "LayerNormalization":
            if e.output_index == 1:
                return st["mean"]
            if e.output_index == 2:
                return st["rstd"]
        if op == "Softmax":
            off = linearize(idx[self.row.k:], self.row.space[self.row.k:])
            return self.define(ct, f"{st['row']}[{self.c(off)}] * {st['inv']}", deps=[st["inv"]], index=[off],
                               note=op)
        xv = self.value(e.args[0], self.row_idx(idx))
        deps = [xv, *st.values()]
        if op == "LogSoftmax":
            expr = f"{xv} - {st['max']} - {st['logsum']}"
        else:  # LayerNormalization / InstanceNormalization output 0: ((x - mean) * rstd) * scale + bias
            shape = self.shape(e)

            def affine_index(arg):   # LayerNorm's scale spans the row; InstanceNorm's is per channel
                return (idx[1],) if op == "InstanceNormalization" else broadcast_index(idx, shape, self.shape(arg))
            scale = self.value(e.args[1], affine_index(e.args[1]))
            expr = f"(({xv} - {st['mean']}) * {st['rstd']}) * {scale}"
            deps.append(scale)
            if len(e.args) > 2 and e.args[2] is not None:
                bias = self.value(e.args[2], affine_index(e.args[2]))
                expr += f" + {bias}"
                deps.append(bias)
        return self.define(ct, expr, deps=deps, note=op)

    # ------------------------------------------------------------------ kernels
    def store(self, name: str, e: Expr, idx, shape) -> None:
        v = self.value(e, idx)
        off = self.ctx.collapse(self.ctx.simplify(linearize(idx, shape)))   # a flat nest's index joins back
        self.emit(f"{self.out_c[name]}[{self.c(off)}] = {v};")

    def gen_elementwise(self) -> list[str]:
        heavy = [o for o in self.group.ops() if o.heavy]
        if heavy:
            self.fail(f"heavy op {heavy[0].op_type} in an elementwise group", heavy[0])
        by_shape: list[tuple[tuple, list[str]]] = []
        for name, e in self.group.outputs.items():
            shape = self.shape(e)
            for s, names in by_shape:
                if len(s) == len(shape) and all(same(a, b) for a, b in zip(s, shape)):
                    names.append(name)
                    break
            else:
                by_shape.append((shape, [name]))
        notes = []
        for shape, names in by_shape:
            self.emit(f"/* {', '.join(self.out_c[n] for n in names)}: one element per iteration over "
                      f"[{', '.join(str(d) for d in shape)}] */")
            idx, close = self.loops(shape, "i", "elements", reads=[self.group.outputs[n] for n in names])
            for name in names:
                self.store(name, self.group.outputs[name], idx, shape)
            close()
            notes.append(f"[{', '.join(str(d) for d in shape)}] -> {', '.join(self.out_c[n] for n in names)}")
        return notes

    def gen_reduce(self) -> list[str]:
        heavy, seen = [], set()
        for e in walk(self.group.outputs.values()):
            if isinstance(e, Op) and e.heavy and e.node not in seen:
                seen.add(e.node)
                heavy.append(e)
        if not heavy:
            self.fail("reduce group without a reduction")
        space, k = self.common_rows(heavy)
        full, stat, scattered = self.split_row_outputs(self.group.outputs, space, k, scatter=True)
        outer_shape = space[:k]
        self.emit(f"/* one row per index of [{', '.join(str(d) for d in outer_shape)}], "
                  f"{len(space) - k} reduced trailing axes [{', '.join(str(d) for d in space[k:])}] */")
        oidx, close_rows = self.loops(outer_shape, "o", "rows", work=numel(space))
        rows_block = self.stack[-1]
        self.row = _Row(space, k, oidx)
        for h in heavy:
            self.emit_stats(h)
        for name in stat:
            e = self.group.outputs[name]
            shape = self.shape(e)
            sidx = tuple(oidx) + (sympy.Integer(0),) * (len(shape) - k)
            self.store(name, e, sidx, shape)
        if full or scattered:
            self.emit(f"/* {', '.join(self.out_c[n] for n in full + scattered)}: the row, epilogue applied */")
            ridx, close = self.stat_loop()
            for name in full:
                self.store(name, self.group.outputs[name], self.full_idx(ridx), space)
            for name in scattered:
                self.store_scattered(name, self.group.outputs[name], self.full_idx(ridx))
            close()
        close_rows()
        if self.scratch:
            self.allocate_scratch(rows_block, numel(space[k:]), numel(space))
        return [f"rows [{', '.join(str(d) for d in outer_shape)}] x reduced [{', '.join(str(d) for d in space[k:])}]"
                f" ({', '.join(f'{h.op_type}' for h in heavy)})"]

    def generate(self) -> KernelSource:
        first = self._generate()
        if self.group.kind != "reduce" or not self.row_divisors:
            return first
        # a row read through floor(r / S) (GroupNorm's per-channel scale over a row of C*H*W: a
        # division per element, which does not vectorize): generated again, the row split into runs
        # of S, where the same read is the run's index
        split = GroupGenerator(self.plan, self.group)
        split.row_split = max(set(self.row_divisors), key=sympy.count_ops)
        try:
            return split._generate()
        except UnsupportedOperatorError:
            return first

    def _generate(self) -> KernelSource:
        g = self.group
        for name, e in list(g.outputs.items()):
            self.ctype(e.dtype)
        notes = self.gen_reduce() if g.kind == "reduce" else self.gen_elementwise()
        func = "tscomp_" + re.sub(r"\W", "_", g.name)
        args: list[KernelArg] = []
        params = []
        inputs = {e.name: e for e in walk(g.outputs.values()) if isinstance(e, Input)}
        for name in g.inputs:
            e = inputs.get(name)
            if e is None:
                v = self.plan.graph.values[name]
                dtype, shape = np.dtype(v.dtype), self.shape(v.shape)
            else:
                dtype, shape = np.dtype(e.dtype), self.shape(e)
            args.append(KernelArg("input", name, self.in_c[name], dtype, shape))
            params.append(f"const {self.ctype(dtype)}* restrict {self.in_c[name]}")
        for name, e in g.outputs.items():
            args.append(KernelArg("output", name, self.out_c[name], np.dtype(e.dtype), self.shape(e)))
            params.append(f"{self.ctype(e.dtype)}* restrict {self.out_c[name]}")
        syms = sorted((s for s in self.pr.used if s not in self.ctx.upper_bounds), key=lambda s: s.name)
        for s in syms:
            cname = c_symbol_name(s.name)
            args.append(KernelArg("symbol", s.name, cname, symbol=s))
            params.append(f"int64_t {cname}")
        header = self.header(notes, args)
        body = "\n".join(["    " + d for d in self.decls] + self.root.render(1))
        statics = self.statics + [""] if self.statics else []
        prelude = PRELUDE + math_helpers("\n".join(self.statics) + body)
        if self.index_checks:   # an error record, and a status: 0 ok, 1 an index out of range
            prelude = "#define TSCOMP_ERR_RECORD tscomp_err\n" + prelude
            params.append("int64_t* restrict tscomp_err")
            signature, ret = f"int {func}({', '.join(params)})", ["    return tscomp_err[0] != 0;"]
        else:
            signature, ret = f"void {func}({', '.join(params)})", []
        source = "\n".join([header, prelude, *statics, signature, "{", body, *ret, "}", ""])
        return KernelSource(g.name, g.kind, func, source, args, list(self.index_checks))

    def header(self, notes, args) -> str:
        g = self.group
        pro, heavy, epi = g.prologue_epilogue()
        ops = [o for o in g.ops()]
        lines = [f"tscomp kernel for fused group {g.name} [{g.kind}]",
                 f"ONNX ops: {', '.join(f'{o.op_type} ({o.node})' for o in ops) or '-'}"]
        views = [e for e in walk(g.outputs.values()) if isinstance(e, View)]
        if views:
            lines.append(f"views (index maps): {', '.join(v.op.describe() for v in views)}")
        if heavy:
            lines.append(f"prologue: {', '.join(o.op_type for o in pro) or '-'}; "
                         f"heavy: {', '.join(o.op_type for o in heavy)}; "
                         f"epilogue: {', '.join(o.op_type for o in epi) or '-'}")
        lines.append(f"iteration space: {'; '.join(notes)}")
        for a in args:
            if a.role == "symbol":
                continue
            lines.append(f"{a.role} {a.cname} = {a.name}: {a.dtype} [{', '.join(str(d) for d in a.shape)}]")
        syms = [a.name for a in args if a.role == "symbol"]
        lines.append(f"shape symbols (int64_t arguments): {', '.join(syms) or '-'}")
        for k, chk in enumerate(self.index_checks):
            lines.append(f"index check {k}: {chk.op_type} {chk.node}, input {chk.input}")
        if self.index_checks:
            lines.append("error record (last argument): int64_t[4]; returns 1 when an index is out of range")
        return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */"


# ============================================================================ running
_LIBS: dict[str, ctypes.CDLL] = {}


class CompiledGroup(PicklableKernel):
    """A generated group kernel built into a shared library and callable on numpy arrays."""

    TRANSIENT = {"fn": None, "_sizes": dict, "_size_fns": None}
    family = "row-or-elementwise"
    takes_out = True          # writes into the runtime's arena views when given
    cfg = None                # one loop nest per group: no tile configuration to choose

    def __init__(self, source: KernelSource, *, out_dir=None):
        self.source_info = source
        self.group = source.group
        self.func = source.func
        self.source = source.source
        self._sizes: dict[tuple, tuple] = {}
        path = build_library(source.source, source.func, out_dir=out_dir)
        lib = _LIBS.get(str(path))
        if lib is None:
            lib = _LIBS[str(path)] = load_library(path)
        self._bind_function(lib)

    @classmethod
    def build(cls, plan: Plan, group: Group, **kw) -> "CompiledGroup":
        return cls(generate_group(plan, group), **kw)

    def _bind_function(self, lib: ctypes.CDLL) -> None:
        self.fn = getattr(lib, self.func)
        checked = getattr(self.source_info, "checks_indices", False)
        self.fn.restype = ctypes.c_int if checked else None
        self.fn.argtypes = [ctypes.c_int64 if a.role == "symbol" else ctypes.c_void_p for a in self.source_info.args] \
            + [ctypes.c_void_p] * checked   # the error record

    def tasks(self, binding: Mapping[str, int]) -> int:
        return 1              # static OpenMP schedule over the whole space: one launch

    def _names(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, int]:
        """Symbol name -> value: ``binding``, plus the symbols only the inputs' shapes determine."""
        names = dict(binding)
        for a in self.source_info.inputs:
            arr = env.get(a.name)
            if arr is None:
                continue
            for d, n in zip(a.shape, np.shape(arr)):
                if isinstance(d, sympy.Symbol):
                    names.setdefault(d.name, int(n))
        return names

    def _bind(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[sympy.Symbol, sympy.Integer]:
        """The symbols the kernel's arguments use, as a SymPy substitution (for code that still
        substitutes: the SIMT executor's scratch length)."""
        names = self._names(env, binding)
        syms = {s for a in self.source_info.args for d in a.shape for s in sympy.sympify(d).free_symbols}
        syms |= {a.symbol for a in self.source_info.symbols}
        missing = sorted(s.name for s in syms if s.name not in names)
        if missing:
            raise ExecutionError(f"group {self.source_info.group}: no value for shape symbol {', '.join(missing)}")
        return {s: sympy.Integer(names[s.name]) for s in syms}

    def _size_functions(self) -> tuple:
        """Per argument: its value (symbols) or the tuple of its extents (tensors) as compiled integer
        expressions of a binding (:func:`~tscomp.graph.symbols.compile_int_expr`: a generated
        lambda, no SymPy per call: a new shape's first call costs microseconds, not a substitution
        per extent); built once per kernel, not pickled."""
        fns = self.__dict__.get("_size_fns")
        if fns is None:
            fns = self._size_fns = tuple(
                compile_int_expr(a.symbol) if a.role == "symbol" else
                tuple(compile_int_expr(sympy.sympify(d)) for d in a.shape)
                for a in self.source_info.args)
        return fns

    def _sizes_at(self, env, binding) -> tuple:
        """Per argument: its concrete shape (tensors) or value (symbols); memoized per binding."""
        key = binding_key(binding)
        sizes = self._sizes.get(key)
        if sizes is None:
            names = self._names(env, binding)
            try:
                sizes = tuple(int(f(names)) if not isinstance(f, tuple) else tuple(int(g(names)) for g in f)
                              for f in self._size_functions())
            except (KeyError, ShapeError) as exc:
                self._bind(env, binding)          # raises, naming the symbols neither gives
                raise ExecutionError(f"group {self.source_info.group}: cannot size its arguments: {exc}") from None
            if len(names) == len(binding):  # nothing read from the inputs: safe to reuse per binding
                self._sizes[key] = sizes
        return sizes

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run on ``env`` (at least the group's inputs) with the symbols of ``binding`` (those only
        the inputs' shapes determine are read from them); outputs are allocated from their symbolic
        shapes, or written into the C-contiguous arrays of ``out`` where given."""
        sizes = self._sizes_at(env, binding)
        keep, call = [], []
        outputs = {}
        for a, want in zip(self.source_info.args, sizes):
            if a.role == "input":
                arr = np.asarray(env[a.name])
                if arr.shape != want:
                    raise ExecutionError(f"group {self.group}: input {a.name!r} has shape {arr.shape}, "
                                         f"expected {want}")
                if arr.dtype != a.dtype:
                    raise ExecutionError(f"group {self.group}: input {a.name!r} has dtype {arr.dtype}, "
                                         f"expected {a.dtype}")
                arr = np.ascontiguousarray(arr)
                keep.append(arr)
                call.append(arr.ctypes.data)
            elif a.role == "output":
                arr = (out or {}).get(a.name)
                if arr is None:
                    arr = np.empty(want, dtype=a.dtype)
                elif arr.shape != want or arr.dtype != a.dtype or not arr.flags.c_contiguous:
                    raise ExecutionError(f"group {self.group}: output buffer {a.name!r} is "
                                         f"{arr.dtype}{list(arr.shape)}, expected a C-contiguous {a.dtype}{list(want)}")
                outputs[a.name] = arr
                call.append(arr.ctypes.data)
            else:
                call.append(want)
        if not getattr(self.source_info, "checks_indices", False):
            self.fn(*call)
            return outputs
        err = np.zeros(4, dtype=np.int64)     # per call: concurrent calls never share a record
        if self.fn(*call, err.ctypes.data):
            raise self.index_error(err, sizes)
        return outputs

    def native_call(self) -> NativeCall:
        """Tensors by name, symbols as expressions, the error record last when indices are checked."""
        args = [NativeArg("int", expr=a.symbol) if a.role == "symbol" else NativeArg("tensor", a.name, dtype=np.dtype(a.dtype).name)
                for a in self.source_info.args]
        checked = self.source_info.checks_indices
        return NativeCall(self.func, tuple(args) + ((NativeArg("error"),) if checked else ()), checked=checked)

    def index_error(self, err: np.ndarray, sizes: tuple) -> IndexOutOfRangeError:
        """The exception for a failed call's error record (check id + 1, value, position, extent)."""
        check = self.source_info.index_checks[int(err[0]) - 1]
        shape = None
        with contextlib.suppress(Exception):
            subs = {a.symbol: sympy.Integer(v) for a, v in zip(self.source_info.args, sizes) if a.role == "symbol"}
            for a, v in zip(self.source_info.args, sizes):
                if a.role != "symbol":
                    for d, n in zip(a.shape, v):
                        if isinstance(d, sympy.Symbol):
                            subs.setdefault(d, sympy.Integer(n))
            shape = tuple(int(sympy.sympify(d).xreplace(subs)) for d in check.shape)
        return check.error(int(err[1]), int(err[2]), int(err[3]), shape)


__all__ = ["CompiledGroup", "IndexCheck", "KernelArg", "KernelSource", "PARALLEL_MIN_ELEMENTS", "generate_group"]
