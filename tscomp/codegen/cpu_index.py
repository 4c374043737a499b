"""The "index" kernel family: native C kernels for groups of one opaque index operator (CumSum,
Range, ConstantOfShape, ArgMax/ArgMin, ScatterElements/ScatterND, ...), so that no group of a
supported model runs on the numpy fallback (issue 11; TSCompiler §4.2 leaves such operators
unfused, each a group of its own, and §5 still gives every group a macro-kernel).

Family steps (DESIGN.md, "Kernel family"):

* **analysis** (:func:`analyze_index_group`) — the group must be one op whose registry entry has
  a :attr:`~tscomp.graph.ops.registry.OpDef.c_kernel` (op knowledge stays in the registry:
  :mod:`tscomp.graph.ops.c_kernels`), reading group inputs or baked constants (no views), with
  outputs of resolved (possibly symbolic) shape. Anything else: :class:`UnsupportedOperatorError`
  ("not mine, because ...").
* **source** — the op's writer fills the body through :class:`IndexKernelWriter`; the result is a
  :class:`~tscomp.codegen.cpu_groups.KernelSource` with the row/elementwise kernels' calling
  convention (inputs ``const T*``, outputs ``T*``, shape symbols ``int64_t``, and the error record
  when an index is checked), and a header naming the op, its operands and the iteration space.
* **build / executor** — :class:`~tscomp.codegen.cpu_groups.CompiledGroup` (the same contract,
  including :class:`~tscomp.errors.IndexOutOfRangeError` from the error record).

Groups that read only shape values (a Range over the sequence length) would run once per shape
at planning time anyway; they get the native kernel too when the op has one.
"""
from __future__ import annotations

import re

import numpy as np
import sympy

from tscomp.codegen.c_expr import (PRELUDE, CPrinter, IndexContext, c_literal, c_symbol_name, compose, delinearize,
                                   linearize, math_helpers)
from tscomp.codegen.cpu_groups import CompiledGroup, IndexCheck, KernelArg, KernelSource
from tscomp.codegen.native import refusals_name_group
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.expr import Const, Input, Op, View, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.ops import registry
from tscomp.graph.ops.registry import c_type
from tscomp.graph.symbols import numel

#: loops over fewer elements than this run on one thread
PARALLEL_MIN = 1 << 15


class Operand:
    """One input or output of the op as the writer sees it: C element type, symbolic shape, and
    ``at(off)``, the C lvalue/rvalue of its element at a flat offset (a C expression)."""

    def __init__(self, dtype, shape, ctype: str, base: str, const: np.ndarray | None = None):
        self.dtype, self.shape, self.ctype, self.base, self.const = np.dtype(dtype), shape, ctype, base, const

    def at(self, off: str) -> str:
        if self.const is not None and self.const.size == 1:
            return self.base                  # a scalar constant: its literal
        return f"{self.base}[{off}]"


class IndexKernelWriter:
    """What a registry ``c_kernel`` writes through (see :mod:`tscomp.graph.ops.c_kernels`)."""

    def __init__(self, plan: Plan, group: Group, op: Op):
        self.plan, self.group, self.op = plan, group, op
        self.symtab = plan.graph.symbols
        self.ctx = IndexContext(self.symtab)
        self.pr = CPrinter(self.ctx)
        self.node = next(n for n in plan.graph.nodes if n.name == op.node)
        self.op_type = op.op_type
        self.lines: list[str] = []
        self.decls: list[str] = []
        self.statics: list[str] = []
        self.index_checks: list[IndexCheck] = []
        self.in_c = {name: f"in{k}" for k, name in enumerate(group.inputs)}
        self.out_c = {name: f"out{k}" for k, name in enumerate(group.outputs)}
        self._consts: dict[int, Operand] = {}
        self._views: dict[int, Operand] = {}
        self.cleanup: list[str] = []       # statements before the function returns (view buffers freed)

    # ------------------------------------------------------------------ what writers call
    def fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {self.op_type} node {self.op.node!r}: {why}")

    def attr(self, key: str, default=None):
        return self.op.attrs.get(key, default)

    def canon(self, d) -> sympy.Expr:
        return self.symtab.canon(d)

    def c(self, e) -> str:
        """A shape expression (SymPy, int) as C; its symbols become kernel arguments."""
        return self.pr(self.canon(sympy.sympify(e)))

    def numel(self, shape) -> str:
        return self.c(numel(tuple(shape)))

    def literal(self, value, dtype) -> str:
        return c_literal(value, dtype)

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def parallel(self, work: str, min_work: int = PARALLEL_MIN) -> str:
        """The OpenMP ``if`` clause of a loop over ``work`` elements."""
        return f" if(parallel: ({work}) > {min_work})"

    # ------------------------------------------------------------------ loop structure
    # The only target-specific part of a writer's output; the SIMT writer
    # (:class:`tscomp.codegen.simt.index.SimtIndexWriter`) renders the same calls as grid-stride
    # loops, a one-thread serial section and per-thread table rows.
    def parallel_for(self, loops, *, work: str | None = None, min_work: int = PARALLEL_MIN, simd: bool = False,
                     brace: bool = True) -> None:
        """Open a loop nest whose iterations are independent: ``loops`` is ``[(var, extent), ...]``
        (C), outermost first, collapsed into one parallel iteration space; ``work`` the element
        count that decides whether threads are worth it (default: the extent of a single loop).
        With ``brace`` the writer closes the nest with one ``}``; without, one statement follows."""
        if work is None:
            if len(loops) != 1:
                raise ValueError("parallel_for over several loops needs its work count")
            work = loops[0][1]
        collapse = f" collapse({len(loops)})" if len(loops) > 1 else ""
        self.emit(f"#pragma omp parallel for{' simd' if simd else ''}{collapse} schedule(static)"
                  f"{self.parallel(work, min_work)}")
        for k, (v, n) in enumerate(loops):
            opener = " {" if brace and k == len(loops) - 1 else ""
            self.emit(f"for (int64_t {v} = 0; {v} < {n}; ++{v}){opener}")

    def serial(self):
        """A section whose statements must run once, in order, after every earlier loop (a scatter
        after its copy): plain sequential code here."""
        return _NoSection()

    def index_table(self, stem: str, rows: str, width: str, max_width: int | None, columns, head, body) -> "IndexTable":
        """A table of a function of one index ``i`` in ``[0, rows)``: per row ``width`` entries of
        each column ``(array, ctype, row pointer)``; ``head`` then ``body`` (C lines over ``i``)
        fill one row through its row pointers. Here: built once per call into ``malloc``'d arrays
        (freed by :meth:`free_table`). ``max_width`` bounds ``width`` when the compiler knows a
        bound (the SIMT writer computes each thread's row into private arrays of that size)."""
        for arr, ct, _ in columns:
            self.emit(f"{ct} *{arr} = malloc(sizeof({ct}) * ({rows}) * {width});")
        self.emit(f"for (int64_t i = 0; i < {rows}; ++i) {{")
        for line in head:
            self.emit("    " + line)
        for arr, ct, ptr in columns:
            self.emit(f"    {ct} *{ptr} = {arr} + i * {width};")
        for line in body:
            self.emit("    " + line)
        self.emit("}")
        return IndexTable(stem, rows, width, max_width, tuple(columns), tuple(head), tuple(body))

    def table_row(self, table: "IndexTable", row: str, indent: str = "    ") -> None:
        """Make row ``row`` of ``table`` readable through :meth:`IndexTable.at` (here: nothing to do)."""
        table.row = row

    def table_at(self, table: "IndexTable", column: str, j: str) -> str:
        """Entry ``j`` of the current row (:meth:`table_row`) of ``column`` (C rvalue)."""
        return f"{column}[{table.row} * {table.width} + {j}]"

    def free_table(self, table: "IndexTable") -> None:
        self.emit(" ".join(f"free({arr});" for arr, _, _ in table.columns))

    def scratch(self, name: str, ctype: str, count: str) -> str:
        """A per-call work buffer of ``count`` elements (C expression), freed before the kernel
        returns: ``malloc``'d here (the SIMT writer has no device-side allocation and refuses)."""
        self.decls.append(f"{ctype} *{name} = ({ctype} *)malloc(sizeof({ctype}) * (size_t)({count}) + 64);")
        self.cleanup.append(f"free({name});")
        return name

    def count_check(self, value: str, limit: str, input_slot: int, pos: str) -> str:
        """A data-dependent count read from input ``input_slot`` (a sequence length), checked to lie
        in ``[0, limit]``; out of it, the error record names node, input, value and position and the
        count reads 0. ``pos`` is its flat position in that input (C)."""
        a = self.op.args[input_slot]
        check = len(self.index_checks)
        self.index_checks.append(IndexCheck(self.op.node, self.op_type, self.node.inputs[input_slot],
                                            tuple(self.canon(d) for d in a.shape), count=True))
        return (f"((uint64_t)({value}) <= (uint64_t)({limit}) ? (int64_t)({value}) : "
                f"(ts_index_fail(TSCOMP_ERR_RECORD, {check}, (int64_t)({value}), {pos}, ({limit}) + 1), (int64_t)0))")

    def const_ints(self, i: int) -> list[int] | None:
        """Input ``i``'s values when the compiler knows them as integers, else None."""
        a = self.op.args[i] if i < len(self.op.args) else None
        if a is None:
            return None
        value = a.value if isinstance(a, Const) else self.plan.graph.values[a.name].const \
            if isinstance(a, Input) and a.name in self.plan.graph.values else None
        if value is None:
            return None
        flat = [sympy.sympify(self.canon(v)) if not isinstance(v, (int, np.integer)) else v
                for v in np.asarray(value).reshape(-1)]
        if not all(isinstance(v, (int, np.integer)) or v.is_Integer for v in flat):
            return None
        return [int(v) for v in flat]

    @property
    def opset(self) -> int:
        return self.op.opset

    def reduced_axes(self) -> list[int] | None:
        """The axes the op reduces (:func:`tscomp.graph.shape_propagation.reduced_axes`)."""
        from tscomp.graph.shape_propagation import reduced_axes
        return reduced_axes(self.plan.graph, self.node)

    def has_arg(self, i: int) -> bool:
        return i < len(self.op.args) and self.op.args[i] is not None

    def const_exprs(self, i: int) -> list | None:
        """Input ``i``'s values as integer shape expressions (numbers or over symbols: pads computed
        from the input shape), or None when only run time knows them."""
        a = self.op.args[i] if i < len(self.op.args) else None
        value = a.value if isinstance(a, Const) else self.plan.graph.values[a.name].const \
            if isinstance(a, Input) and a.name in self.plan.graph.values else None
        if value is None:
            return None
        flat = [self.canon(sympy.sympify(v)) for v in np.asarray(value).reshape(-1)]
        return flat if all(v.is_integer for v in flat) else None

    def const_floats(self, i: int) -> list[float] | None:
        """Input ``i``'s values when the compiler knows them as numbers, else None."""
        a = self.op.args[i] if i < len(self.op.args) else None
        if a is None:
            return None
        value = a.value if isinstance(a, Const) and not a.symbolic else self.plan.graph.values[a.name].const \
            if isinstance(a, Input) and a.name in self.plan.graph.values else None
        return None if value is None else [float(v) for v in np.asarray(value).reshape(-1)]

    def arg(self, i: int) -> Operand:
        a = self.op.args[i] if i < len(self.op.args) else None
        if a is None:
            self.fail(f"input {i} is missing")
        ct = self._ctype(a.dtype)
        shape = tuple(self.canon(d) for d in a.shape)
        if isinstance(a, Input):
            return Operand(a.dtype, shape, ct, self.in_c[a.name])
        if isinstance(a, Const):
            if id(a) not in self._consts:
                self._consts[id(a)] = self._const(a, ct, shape)
            return self._consts[id(a)]
        if isinstance(a, View):
            if id(a) not in self._views:
                self._views[id(a)] = self._view_copy(a, i, ct, shape)
            return self._views[id(a)]
        self.fail(f"input {i} is read through {type(a).__name__} (a fused op); only group inputs, views of "
                  f"them and constants")

    def _view_copy(self, a: View, i: int, ct: str, shape) -> Operand:
        """A view of a group input (a Slice, Reshape or Transpose the fusion absorbed into the op's
        group: MobileBERT's shifted copies of the embedding, Swin's window padding after a reshape)
        gathered into a contiguous buffer before the op, so every writer indexes it flat. Its index
        map is divided out once per element here, in one parallel pass. A view of a constant (the
        dynamo exporter's initial LSTM state: zeros expanded over the batch) reads the constant: a
        single value is that value everywhere, a larger one is gathered from its static array."""
        chain, src = [], a
        while isinstance(src, View):
            chain.append((src.op.canonical(self.canon), tuple(self.canon(d) for d in src.src.shape)))
            src = src.src
        if isinstance(src, Const) and not src.symbolic:
            const = self._const(src, ct, tuple(self.canon(d) for d in src.shape))
            if np.asarray(src.value).size == 1:
                return Operand(a.dtype, shape, ct, const.base, np.asarray(src.value))
            data = const.base
        elif isinstance(src, Input):
            data = self.in_c[src.name]
        else:
            self.fail(f"input {i} is a view of {type(src).__name__}, not of a group input or constant")
        name = f"view{len(self._views)}"
        n = self.numel(shape)
        # rows of the last axis when its extent is a constant: the row's coordinates (and their
        # divisions) once per row, the elements of a row in one vectorizable loop
        inner = shape[-1] if shape and shape[-1].is_Integer and int(shape[-1]) > 1 else sympy.Integer(1)
        q = self.ctx.var(f"{name}_q", numel(shape) / inner)
        r = self.ctx.var(f"{name}_r", inner)
        flat = q * inner + r if inner != 1 else q
        source = compose(delinearize(flat, shape, self.ctx), chain, self.ctx)
        off = self.ctx.collapse(self.ctx.simplify(linearize(source, tuple(self.canon(d) for d in src.shape))))
        self.decls += [f"/* input {i}: {a.op.describe()} of {src.name or 'a constant'}, gathered contiguous */",
                       f"{ct}* {name} = ({ct}*)malloc(sizeof({ct}) * (size_t)({n}) + 1);",
                       f"#pragma omp parallel for schedule(static){self.parallel(n)}"]
        if inner != 1:
            self.decls += [f"for (int64_t {q} = 0; {q} < ({n}) / {inner}; ++{q})",
                           "    #pragma omp simd",
                           f"    for (int64_t {r} = 0; {r} < {inner}; ++{r}) "
                           f"{name}[{q} * {inner} + {r}] = {data}[{self.pr(off)}];"]
        else:
            self.decls.append(f"for (int64_t {q} = 0; {q} < {n}; ++{q}) {name}[{q}] = {data}[{self.pr(off)}];")
        self.cleanup.append(f"free({name});")
        return Operand(a.dtype, shape, ct, name)

    def out(self, k: int = 0) -> Operand:
        for name, e in self.group.outputs.items():
            if self._is_output(e, k):
                return Operand(e.dtype, tuple(self.canon(d) for d in e.shape), self._ctype(e.dtype), self.out_c[name])
        self.fail(f"output {k} is not a group output")

    def has_out(self, k: int) -> bool:
        """Whether the op's output ``k`` is read by anything (an unread output is not stored: TopK's
        indices where only its values are used)."""
        return any(self._is_output(e, k) for e in self.group.outputs.values())

    def _is_output(self, e, k: int) -> bool:
        return e is self.op and k == 0 or (isinstance(e, Op) and e.node == self.op.node and e.output_index == k)

    def index(self, value: str, extent: str, input_slot: int, pos: str) -> str:
        """A data-dependent index read from input ``input_slot``, negative counting from the end,
        range-checked against ``extent``; ``pos`` is its flat position in that input (C)."""
        a = self.op.args[input_slot]
        check = len(self.index_checks)
        self.index_checks.append(IndexCheck(self.op.node, self.op_type, self.node.inputs[input_slot],
                                            tuple(self.canon(d) for d in a.shape)))
        return f"ts_index((int64_t)({value}), {extent}, {check}, {pos}, TSCOMP_ERR_RECORD)"

    # ------------------------------------------------------------------ internals
    def _ctype(self, dtype) -> str:
        t = c_type(dtype)
        if t is None:
            self.fail(f"element type {np.dtype(dtype)} has no C kernel type")
        return t

    def _const(self, a: Const, ct: str, shape) -> Operand:
        val = np.asarray(a.value)
        name = f"k{len(self._consts)}"
        if a.symbolic:
            flat = [self.canon(x) for x in val.reshape(-1)]
            if not all(sympy.sympify(x).is_integer for x in flat):
                self.fail(f"symbolic constant {a.name} is not an integer expression")
            items = [f"({ct})({self.c(x)})" for x in flat]
            if val.size == 1:
                return Operand(a.dtype, shape, ct, items[0], val)
            self.decls.append(f"const {ct} {name}[{val.size}] = {{{', '.join(items)}}};  /* {a.name} */")
        else:
            items = [c_literal(v, a.dtype) for v in val.reshape(-1)]
            if val.size == 1:
                return Operand(a.dtype, shape, ct, f"(({ct}){items[0]})", val)
            self.statics.append(f"static const {ct} {name}[{val.size}] = {{{', '.join(items)}}};  /* {a.name} */")
        return Operand(a.dtype, shape, ct, name, val)


class _NoSection:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class IndexTable:
    """A writer's per-index table (:meth:`IndexKernelWriter.index_table`)."""

    def __init__(self, stem, rows, width, max_width, columns, head, body):
        self.stem, self.rows, self.width, self.max_width = stem, rows, width, max_width
        self.columns, self.head, self.body = columns, head, body
        self.row = "i"


def _the_op(plan: Plan, group: Group) -> Op:
    ops = [e for e in walk(group.outputs.values()) if isinstance(e, Op)]
    nodes = {o.node for o in ops}
    if len(nodes) != 1:
        raise UnsupportedOperatorError(f"group {group.name}: {len(nodes)} ops (the index family compiles groups of "
                                       f"one opaque op)")
    return ops[0]


def write_index_op(plan: Plan, group: Group, writer=IndexKernelWriter) -> IndexKernelWriter:
    """Run the group's one op's registry writer (``OpDef.c_kernel``) through a ``writer`` (this
    module's C one or the SIMT one); "not mine" as :class:`UnsupportedOperatorError` naming the group."""
    with refusals_name_group(group.name):
        op = _the_op(plan, group)
        node = next(n for n in plan.graph.nodes if n.name == op.node)
        opdef = registry.lookup(node.op_type, node.domain, plan.graph.opset_of(node), node.name)
        if opdef.c_kernel is None:
            raise UnsupportedOperatorError(f"{op.op_type} node {op.node!r}: no C kernel for this op "
                                           f"(OpDef.c_kernel)")
        w = writer(plan, group, op)
        opdef.c_kernel(w)
        return w


def analyze_index_group(plan: Plan, group: Group) -> KernelSource:
    """Analysis and source at once (one loop nest per op, nothing to configure)."""
    with refusals_name_group(group.name):
        return _source(write_index_op(plan, group))


def kernel_args(w: IndexKernelWriter) -> list[KernelArg]:
    """The kernel's parameters after its writer ran: group inputs, group outputs, then the shape
    symbols the body prints (the calling convention of every row/elementwise/index kernel)."""
    g = w.group
    args = []
    inputs = {e.name: e for e in walk(g.outputs.values()) if isinstance(e, Input)}
    for name in g.inputs:
        e = inputs.get(name)
        v = e if e is not None else w.plan.graph.values[name]
        dtype, shape = np.dtype(v.dtype), tuple(w.canon(d) for d in v.shape)
        args.append(KernelArg("input", name, w.in_c[name], dtype, shape))
    for name, e in g.outputs.items():
        args.append(KernelArg("output", name, w.out_c[name], np.dtype(e.dtype), tuple(w.canon(d) for d in e.shape)))
    for s in sorted((s for s in w.pr.used if s not in w.ctx.upper_bounds), key=lambda s: s.name):
        args.append(KernelArg("symbol", s.name, c_symbol_name(s.name), symbol=s))
    return args


def _source(w: IndexKernelWriter) -> KernelSource:
    g = w.group
    func = "tscomp_" + re.sub(r"\W", "_", g.name)
    args = kernel_args(w)
    params = [f"const {w._ctype(a.dtype)}* restrict {a.cname}" if a.role == "input" else
              f"{w._ctype(a.dtype)}* restrict {a.cname}" if a.role == "output" else f"int64_t {a.cname}"
              for a in args]
    prelude = PRELUDE + math_helpers("\n".join(w.statics + w.lines))   # vectorizable expf/tanhf if called
    if w.index_checks:
        prelude = "#define TSCOMP_ERR_RECORD tscomp_err\n" + prelude
        params.append("int64_t* restrict tscomp_err")
        signature, ret = f"int {func}({', '.join(params)})", ["    return tscomp_err[0] != 0;"]
    else:
        signature, ret = f"void {func}({', '.join(params)})", []
    header = _header(w, args)
    body = ["    " + line for line in w.decls + w.lines + w.cleanup]
    source = "\n".join([header, prelude, *w.statics, signature, "{", *body, *ret, "}", ""])
    return KernelSource(g.name, g.kind, func, source, args, list(w.index_checks))


def _header(w: IndexKernelWriter, args) -> str:
    attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(w.op.attrs.items()) if not isinstance(v, bytes))
    lines = [f"tscomp index kernel for group {w.group.name} [{w.group.kind}]",
             f"ONNX op: {w.op_type} ({w.op.node}){' ' + attrs if attrs else ''}",
             "no tile configuration (one loop nest per op)"]
    for a in args:
        if a.role != "symbol":
            lines.append(f"{a.role} {a.cname} = {a.name}: {a.dtype} [{', '.join(str(d) for d in a.shape)}]")
    lines.append(f"shape symbols (int64_t arguments): {', '.join(a.name for a in args if a.role == 'symbol') or '-'}")
    for k, chk in enumerate(w.index_checks):
        lines.append(f"index check {k}: {chk.op_type} {chk.node}, input {chk.input}")
    return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */"


def link_index_kernel(source: KernelSource) -> CompiledGroup:
    """Build and bind (the object cache is by content)."""
    kernel = CompiledGroup(source)
    kernel.family = "index"
    return kernel


__all__ = ["IndexKernelWriter", "IndexTable", "Operand", "analyze_index_group", "kernel_args", "link_index_kernel",
           "write_index_op"]
