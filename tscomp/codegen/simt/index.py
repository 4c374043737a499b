"""SIMT kernels for groups of one opaque index operator (Resize, CumSum, Range, ConstantOfShape,
ArgMax/ArgMin, ScatterElements/ScatterND, Pad, Trilu, OneHot, EyeLike): the CUDA target's
counterpart of the CPU index family (:mod:`tscomp.codegen.cpu_index`; TSCompiler §4.2 leaves such
operators unfused, one group each, and §5 still gives every group a macro-kernel).

The op knowledge is the registry's: each op's ``c_kernel`` writer (:mod:`tscomp.graph.ops.c_kernels`)
runs unchanged through :class:`SimtIndexWriter`, which renders the writer's loop-structure calls —
the only target-specific part of its output — in the SIMT vocabulary of :mod:`.dialect`:

* ``parallel_for`` (independent iterations, OpenMP on the CPU): one grid-stride loop over the
  collapsed iteration space, the loop variables delinearized from the flat index;
* ``serial`` (statements that must run once, in order, after every earlier loop: a scatter's
  updates after its copy): the kernel runs as *one* work-group, its parallel loops strided over
  that group's threads, and the section runs on thread 0 between two ``TS_BARRIER_GLOBAL()``
  (a grid has no barrier; one block does);
* ``index_table`` (a table of a function of one output index, built once per call on the CPU:
  Resize's taps): nothing is tabulated; ``table_row`` computes the row a thread needs, from the
  same fill statements, into private arrays of the writer's compile-time bound (``max_width``);
  a table whose width only run time knows (antialiased downscaling by a run-time factor) is
  refused, naming why, and that group runs on the numpy fallback.

Shapes enter as ``int64_t`` kernel arguments; the calling convention (inputs, outputs, symbols,
error record) and the executor are the row/elementwise family's (:class:`~.groups.SimtGroup`).
"""
from __future__ import annotations

import re

from tscomp.codegen.cpu_groups import KernelSource
from tscomp.codegen.cpu_index import IndexKernelWriter, IndexTable, _header, kernel_args, write_index_op
from tscomp.codegen.native import refusals_name_group
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.codegen.simt.gemm import check_identifiers
from tscomp.codegen.simt.groups import BLOCK, SimtGroup, SimtGroupSource
from tscomp.codegen.simt.program import SimtProgram
from tscomp.graph.fusion.plan import Group, Plan


class SimtIndexWriter(IndexKernelWriter):
    """The registry writers' target: the C writer with SIMT loop structure."""

    def __init__(self, plan: Plan, group: Group, op):
        super().__init__(plan, group, op)
        self.one_group = False      # a serial section: the kernel runs as one work-group
        self.flat_count = 0

    def _view_copy(self, a, i: int, ct: str, shape):
        self.fail(f"input {i} is read through a view ({a.op.describe()}): the SIMT index kernels gather "
                  f"group inputs only (no device-side buffer to gather a view into)")

    def scratch(self, name: str, ctype: str, count: str) -> str:
        self.fail("needs a per-call work buffer, which the SIMT index kernels do not allocate yet")

    def parallel_for(self, loops, *, work=None, min_work=0, simd=False, brace=True) -> None:
        if len(loops) == 1:
            v, n = loops[0]
            self.emit(f"for (int64_t {v} = ts_first; {v} < {n}; {v} += ts_step){' {' if brace else ''}")
            return
        if not brace:
            raise ValueError("a collapsed parallel_for needs a braced body (its indices are declared in it)")
        f = f"ts_f{self.flat_count}"
        self.flat_count += 1
        extents = [n for _, n in loops]
        self.emit(f"for (int64_t {f} = ts_first; {f} < {' * '.join(f'({n})' for n in extents)}; {f} += ts_step) {{")
        for k, (v, n) in enumerate(loops):
            inner = extents[k + 1:]
            q = f"{f} / ({' * '.join(f'({e})' for e in inner)})" if inner else f
            self.emit(f"    const int64_t {v} = {q if k == 0 else f'({q}) % ({n})'};")

    def serial(self):
        return _SerialSection(self)

    def index_table(self, stem, rows, width, max_width, columns, head, body) -> IndexTable:
        if max_width is None:
            self.fail(f"table {stem} has {width} entries per row, known only at run time (a SIMT thread computes "
                      f"its row into private arrays of a compile-time size)")
        return IndexTable(stem, rows, width, int(max_width), tuple(columns), tuple(head), tuple(body))

    def table_row(self, table: IndexTable, row: str, indent: str = "    ") -> None:
        table.row = row
        for arr, ct, _ in table.columns:
            self.emit(f"{indent}{ct} ts_{arr}[{table.max_width}];")
        self.emit(f"{indent}{{   /* table {table.stem}: row {row}, computed by this thread (<= {table.max_width} "
                  f"entries) */")
        self.emit(f"{indent}    const int64_t i = {row};")
        for line in table.head:
            self.emit(f"{indent}    {line}")
        for arr, ct, ptr in table.columns:
            self.emit(f"{indent}    {ct} *{ptr} = ts_{arr};")
        for line in table.body:
            self.emit(f"{indent}    {line}")
        self.emit(f"{indent}}}")

    def table_at(self, table: IndexTable, column: str, j: str) -> str:
        return f"ts_{column}[{j}]"

    def free_table(self, table: IndexTable) -> None:
        pass


class _SerialSection:
    def __init__(self, w: SimtIndexWriter):
        self.w = w

    def __enter__(self):
        self.w.one_group = True
        self.w.emit("TS_BARRIER_GLOBAL();   /* every earlier loop done (one work-group) */")
        self.w.emit("if (TS_THREAD(0) == 0) {   /* serial section: one thread, in order */")
        return self

    def __exit__(self, *exc):
        self.w.emit("}")
        self.w.emit("TS_BARRIER_GLOBAL();")
        return False


class SimtIndexGroup(SimtGroup):
    """Executor of a SIMT index kernel (the row/elementwise executor's launch and marshalling)."""

    family = "simt-index"


def simt_index_source(plan: Plan, group: Group) -> SimtGroupSource:
    """Analysis + source of the SIMT index family (UnsupportedOperatorError: not mine, because ...)."""
    with refusals_name_group(group.name):
        w = write_index_op(plan, group, SimtIndexWriter)
        return _render(w)


def _render(w: SimtIndexWriter) -> SimtGroupSource:
    g = w.group
    func = "tscomp_simt_" + re.sub(r"\W", "_", g.name)
    args = kernel_args(w)
    params = [f"TS_GLOBAL const {w._ctype(a.dtype)}* TS_RESTRICT {a.cname}" if a.role == "input" else
              f"TS_GLOBAL {w._ctype(a.dtype)}* TS_RESTRICT {a.cname}" if a.role == "output" else
              f"const int64_t {a.cname}" for a in args]
    if w.index_checks:
        params.append("TS_GLOBAL int64_t* TS_RESTRICT tscomp_err")
    if w.one_group:
        mapping = (f"mapping: one work-group ({BLOCK} threads) strides the parallel loops; the serial section "
                   f"runs on thread 0 between work-group barriers")
        first, step = "TS_THREAD(0)", "TS_NTHREADS(0)"
    else:
        mapping = "mapping: each parallel loop nest is one grid-stride loop over its collapsed iterations"
        first, step = "TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0)", "TS_NBLOCKS(0) * TS_NTHREADS(0)"
    header = _header(w, args).replace("tscomp index kernel for group", "tscomp SIMT index kernel for group", 1)
    header = header[:-len("\n */")] + f"\n * {mapping}\n */\n"
    tables, _ = hoist_statics(w.statics)
    lines = [*dict.fromkeys(tables)]
    if w.index_checks:
        lines.append("#define TSCOMP_ERR_RECORD tscomp_err")
    lines += [f"TS_KERNEL void {func}({', '.join(params)})", "{",
              f"    const int64_t ts_first = {first}, ts_step = {step};",
              *("    " + line for line in w.decls + w.lines), "}", ""]
    body = "\n".join(lines)
    check_identifiers(body)
    info = KernelSource(g.name, g.kind, func, body, args, list(w.index_checks))
    return SimtGroupSource(SimtProgram(header, body), info, one_group=w.one_group)


__all__ = ["SimtIndexGroup", "SimtIndexWriter", "simt_index_source"]
