"""SIMT kernels for elementwise/injective groups and row-reduction groups (Softmax, LayerNorm,
Reduce*; TSCompiler §4.2's fused groups without a GEMM backbone).

The CPU group generator (:class:`~tscomp.codegen.cpu_groups.GroupGenerator`) already lowers a group
from the expression IR to C statements over index variables; only its *loop structure* is
target-specific. :class:`SimtGroupGenerator` overrides exactly that:

* ``elements`` — every axis of the output collapsed into one flat index walked by a grid-stride
  loop (``for (f = global id; f < total; f += global size)``), the axis indices delinearized from
  it: one element per thread per step, coalesced along the innermost axis;
* ``rows`` — one thread per row (grid-stride over the rows), the row statistics and the row's
  output computed by that thread with the serial ``row`` loops;
* a Softmax row buffer is a slice of a global scratch argument (one row per row index), not a
  ``malloc``; constant tables become ``TS_CONSTANT`` file-scope tables.

One thread per row is the simple mapping (correct for any row length; a warp-shuffle / block
reduction per row is the faster one and is not generated yet).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.c_expr import c_symbol_name, strides
from tscomp.codegen.cpu_groups import CompiledGroup, GroupGenerator, KernelArg, KernelSource, _Block
from tscomp.codegen.kernel import KernelBase
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.codegen.simt.gemm import check_identifiers
from tscomp.codegen.simt.launch import Buffer, Launch, device_array, grid_stride_launch, input_buffer, output_buffer, scalar
from tscomp.codegen.simt.program import SimtProgram
from tscomp.errors import ExecutionError
from tscomp.graph.fusion.expr import Input, walk
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.symbols import numel

BLOCK = 256
MAX_BLOCKS = 4096

_CT = {"const": "TS_GLOBAL const {t}* TS_RESTRICT {n}", "out": "TS_GLOBAL {t}* TS_RESTRICT {n}"}


class SimtGroupGenerator(GroupGenerator):
    """The CPU group generator with grid-stride SIMT loops instead of OpenMP loop nests."""

    def __init__(self, plan: Plan, group: Group, coop: bool = True):
        super().__init__(plan, group)
        #: reduce groups: one work-group per row, its threads striding the row, partial results
        #: combined by a shared-memory tree (``coop``); else one thread per row
        self.coop = coop and group.kind == "reduce"
        self.red_types: dict[str, str] = {}     # C type -> shared reduction array
        self.flat_count = 0
        self.scratch_len = None          # row length of the Softmax row buffers
        self.rows_flat: str | None = None
        self.rows_expr = sympy.Integer(1)

    def loops(self, shape, stem: str, mode: str, *, reductions: tuple[str, ...] = (), work=None,
              sequential: bool = False, **_):
        """(Serial "row" loops are always in order, so ``sequential`` holds; a cooperative row cannot
        keep an order and falls back to one thread per row.)"""
        dims = list(shape)
        axes = [k for k, d in enumerate(dims) if d != 1]
        idx = [sympy.Integer(0)] * len(dims)
        for k in axes:
            idx[k] = self.ctx.var(f"{stem}{k}", dims[k])
        if mode == "row" and self.coop:
            if sequential:
                raise _NotCooperative()
            return self._coop_row(dims, axes, idx, reductions)
        if mode == "row":   # inside one thread: serial loops
            if not axes:
                self.push(_Block([("{", 0)], [("}", 0)]))
                return tuple(idx), self.pop
            head = [(f"for (int64_t {idx[k]} = 0; {idx[k]} < {self.c(dims[k])}; ++{idx[k]}) {{", n)
                    for n, k in enumerate(axes)]
            tail = [("}", n) for n in reversed(range(len(axes)))]
            self.push(_Block(head, tail), [idx[k] for k in axes])
            return tuple(idx), self.pop
        # "elements" / "rows": one grid-stride loop over the flattened axes (cooperative rows: one
        # work-group per row, the loop uniform over the group so its barriers are reached by all)
        f = f"f{self.flat_count}"
        self.flat_count += 1
        sub = [dims[k] for k in axes]
        total = self.c(numel(sub)) if axes else "1"
        if mode == "rows" and self.coop:
            head = [(f"for (int64_t {f} = TS_BLOCK(0); {f} < {total}; {f} += TS_NBLOCKS(0)) {{", 0)]
        else:
            head = [(f"for (int64_t {f} = TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0); {f} < {total}; "
                     f"{f} += TS_NBLOCKS(0) * TS_NTHREADS(0)) {{", 0)]
        for k, s in zip(axes, strides(sub)):
            q = f if s == 1 else f"{f} / ({self.c(s)})"
            expr = q if k == axes[0] else f"({q}) % ({self.c(dims[k])})"
            head.append((f"const int64_t {idx[k]} = {expr};", 1))
        self.push(_Block(head, [("}", 0)]), [idx[k] for k in axes])
        if mode == "rows":
            self.rows_flat = f
            self.rows_expr = numel(sub) if axes else sympy.Integer(1)
        return tuple(idx), self.pop

    def _coop_row(self, dims, axes, idx, reductions):
        """The row's elements strided over the work-group's threads; on close, each reduction
        variable (``op:var``) is combined over the group (tree in shared memory, barriers)."""
        if not axes:
            self.push(_Block([("{", 0)], [("}", 0)]))
            return tuple(idx), self.pop
        specs = []
        for red in reductions:
            op, var = red.split(":")
            specs.append((op, var, self._decl_type(var)))
        fr = f"fr{self.flat_count}"
        self.flat_count += 1
        sub = [dims[k] for k in axes]
        head = [(f"for (int64_t {fr} = TS_THREAD(0); {fr} < {self.c(numel(sub))}; {fr} += TS_NTHREADS(0)) {{", 0)]
        for k, st in zip(axes, strides(sub)):
            q = fr if st == 1 else f"{fr} / ({self.c(st)})"
            head.append((f"const int64_t {idx[k]} = {q if k == axes[0] else f'({q}) % ({self.c(dims[k])})'};", 1))
        self.push(_Block(head, [("}", 0)]), [idx[k] for k in axes])

        def close():
            self.pop()
            for op, var, ct in specs:
                arr = self.red_types.setdefault(ct, f"ts_red{len(self.red_types)}")
                comb = {"+": "{a} + {b}", "*": "{a} * {b}", "|": "{a} | {b}", "max": "({b} > {a} ? {b} : {a})",
                        "min": "({b} < {a} ? {b} : {a})"}[op].format(a=f"{arr}[ts_t]", b=f"{arr}[ts_t + ts_o]")
                self.emit(f"{{   /* {var}: {op}-reduction over the work-group */")
                self.emit(f"    const int64_t ts_t = TS_THREAD(0);")
                self.emit(f"    {arr}[ts_t] = {var};")
                self.emit("    TS_BARRIER();")
                self.emit(f"    for (int64_t ts_o = TS_NTHREADS(0) / 2; ts_o > 0; ts_o /= 2) {{")
                self.emit(f"        if (ts_t < ts_o) {arr}[ts_t] = {comb};")
                self.emit("        TS_BARRIER();")
                self.emit("    }")
                self.emit(f"    {var} = {arr}[0];")
                self.emit("    TS_BARRIER();")
                self.emit("}")
        return tuple(idx), close

    def _decl_type(self, var: str) -> str:
        pat = re.compile(rf"^\s*([A-Za-z_][\w ]*?) {re.escape(var)} = ")
        for block in reversed(self.stack):
            for item in block.items:
                if isinstance(item, str):
                    m = pat.match(item)
                    if m:
                        return m.group(1)
        self.fail(f"cannot find the declaration of reduction variable {var}")

    def scratch_row(self, ctype: str) -> str:
        name = self.fresh("row")
        self.scratch.append((name, ctype))
        return name

    def allocate_scratch(self, block: _Block, row_len, work) -> None:
        """Each row's buffer: row ``f`` of a global scratch argument ``<name>_buf``."""
        self.scratch_len = row_len
        decls = [f"TS_GLOBAL {ct}* TS_RESTRICT {name} = {name}_buf + {self.rows_flat} * ({self.c(row_len)});"
                 for name, ct in self.scratch]
        block.items[:0] = decls

    def generate_simt(self, kernel: str) -> "SimtGroupSource":
        g = self.group
        for e in g.outputs.values():
            self.ctype(e.dtype)
        notes = self.gen_reduce() if g.kind == "reduce" else self.gen_elementwise()
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
            params.append(_CT["const"].format(t=self.ctype(dtype), n=self.in_c[name]))
        for name, e in g.outputs.items():
            args.append(KernelArg("output", name, self.out_c[name], np.dtype(e.dtype), self.shape(e)))
            params.append(_CT["out"].format(t=self.ctype(e.dtype), n=self.out_c[name]))
        for name, ct in self.scratch:
            params.append(f"TS_GLOBAL {ct}* TS_RESTRICT {name}_buf")
        syms = sorted((s for s in self.pr.used if s not in self.ctx.upper_bounds), key=lambda s: s.name)
        for s in syms:
            cname = c_symbol_name(s.name)
            args.append(KernelArg("symbol", s.name, cname, symbol=s))
            params.append(f"const int64_t {cname}")
        if self.index_checks:
            params.append("TS_GLOBAL int64_t* TS_RESTRICT tscomp_err")
        header = self.header(notes, args) + "\n"
        lines = ["    " + d for d in self.decls] + self.root.render(1)
        tables, lines = hoist_statics(lines)
        stables, _ = hoist_statics(self.statics)
        body_lines = [*dict.fromkeys(stables + tables)]
        if self.index_checks:
            body_lines.append("#define TSCOMP_ERR_RECORD tscomp_err")
        shared = [f"    TS_SHARED {ct} {arr}[{BLOCK}];   /* work-group reductions */" for ct, arr in self.red_types.items()]
        body_lines += [f"TS_KERNEL void {kernel}({', '.join(params)})", "{", *shared, *lines, "}", ""]
        body = "\n".join(body_lines)
        check_identifiers(body)
        src = KernelSource(g.name, g.kind, kernel, body, args, list(self.index_checks))
        header = header.replace("tscomp kernel for", "tscomp SIMT kernel for")
        if self.coop:
            header = header.replace(" */", f" * mapping: one work-group ({BLOCK} threads) per row, tree reductions in shared memory\n */", 1) \
                if header.rstrip().endswith("*/") else header
        return SimtGroupSource(SimtProgram(header, body), src, [(n, ct) for n, ct in self.scratch], self.scratch_len,
                               self.coop, self.rows_expr)



class _NotCooperative(Exception):
    """A row loop that must run in order (ArgMax/ArgMin): use one thread per row."""


@dataclass
class SimtGroupSource:
    program: SimtProgram
    info: KernelSource
    scratch: list = field(default_factory=list)
    scratch_len: object = None
    coop: bool = False        # one work-group per row (else one thread per row)
    rows: object = 1          # number of rows (symbolic)
    one_group: bool = False   # the whole kernel is one work-group (an index kernel's serial section)


def simt_group_source(plan: Plan, group: Group) -> SimtGroupSource:
    """The analysis + source step of the SIMT row/elementwise family (UnsupportedOperatorError: not mine)."""
    name = "tscomp_simt_" + re.sub(r"\W", "_", group.name)
    try:
        return SimtGroupGenerator(plan, group).generate_simt(name)
    except _NotCooperative:
        return SimtGroupGenerator(plan, group, coop=False).generate_simt(name)


_NP = {"float": np.float32, "double": np.float64, "int64_t": np.int64, "int32_t": np.int32, "int16_t": np.int16,
       "int8_t": np.int8, "uint64_t": np.uint64, "uint32_t": np.uint32, "uint16_t": np.uint16, "uint8_t": np.uint8}


class SimtGroup(KernelBase):
    """Executor of a SIMT row/elementwise group kernel (the :class:`~tscomp.codegen.kernel.Kernel` contract)."""

    family = "simt-row-or-elementwise"
    target = "cuda"

    _bind = CompiledGroup._bind
    _names = CompiledGroup._names
    _size_functions = CompiledGroup._size_functions
    _sizes_at = CompiledGroup._sizes_at
    index_error = CompiledGroup.index_error

    def __init__(self, src: SimtGroupSource, device: str | None = None):
        self.src = src
        self.source_info = src.info
        self.group = src.info.group
        self.func = src.info.func
        self.program = src.program
        self.source = src.program.cuda
        self.device = device
        self._sizes: dict = {}
        self.ptxas: dict = {}

    def tasks(self, binding: Mapping[str, int]) -> int:
        return 1

    def resources(self) -> dict[str, int]:
        out = {"threads": BLOCK, "shared_bytes": 0}
        for arch, res in sorted(self.ptxas.items()):
            r = res.get(self.func)
            if r is not None:
                out[f"{arch}_registers"] = r.registers
                out[f"{arch}_spill_bytes"] = r.spill_stores + r.spill_loads
        return out

    def launches(self, env, binding):
        launches, outputs, err, sizes = self._launches(env, binding)
        return launches, {n: b.array for n, b in outputs.items()}, err, sizes

    def _launches(self, env, binding):
        """(launches, output Buffers, the index-error Buffer or None, argument sizes); inputs may be
        device values of a plan run (DeviceArray)."""
        sizes = self._sizes_at(env, binding)
        args, outputs, total = [], {}, 1
        for a, want in zip(self.source_info.args, sizes):
            if a.role == "input":
                arr = env[a.name] if isinstance(env[a.name], np.ndarray) else np.asarray(env[a.name])
                if arr.shape != want:
                    raise ExecutionError(f"group {self.group}: input {a.name!r} has shape {arr.shape}, "
                                         f"expected {want}")
                args.append(input_buffer(arr, a.dtype))
            elif a.role == "output":
                b = output_buffer(want, a.dtype)
                outputs[a.name] = b
                args.append(b)
                total = max(total, int(np.prod(want)))
        subs = {a.symbol: sympy.Integer(v) for a, v in zip(self.source_info.args, sizes) if a.role == "symbol"}
        subs.update(self._bind(env, binding))
        pos = sum(1 for a in self.source_info.args if a.role != "symbol")
        for name, ct in self.src.scratch:
            n = int(np.prod(outputs_first_shape(outputs))) if outputs else 1
            rows_len = int(sympy.sympify(self.src.scratch_len).xreplace(subs))
            rows = max(1, n // max(1, rows_len))
            args.insert(pos, Buffer(np.empty(rows * rows_len + 1, _NP[ct]), upload=False))
            pos += 1
        for a, v in zip(self.source_info.args, sizes):
            if a.role == "symbol":
                args.append(scalar(v))
        err = None
        if self.source_info.checks_indices:
            err = Buffer(np.zeros(4, np.int64), upload=True, download=True)
            args.append(err)
        if getattr(self.src, "one_group", False):
            launch = Launch(self.func, (1, 1, 1), (BLOCK, 1, 1), args)
        elif self.src.coop:   # one work-group per row: rows = the smallest output (a row statistic or rows x len)
            rows = int(sympy.sympify(self.src.rows).xreplace(subs))
            launch = Launch(self.func, (max(1, min(rows, MAX_BLOCKS)), 1, 1), (BLOCK, 1, 1), args)
        else:
            launch = grid_stride_launch(self.func, total, args, block=BLOCK, max_blocks=MAX_BLOCKS)
        return [launch], outputs, err, sizes

    def run_in(self, session, env, binding):
        """Inside a plan run's device session: outputs stay on the device (DeviceArray); an index
        check reads its error record back at once."""
        launches, outputs, err, sizes = self._launches(env, binding)
        self.program.run_in(session, launches, session.device.name, getattr(self, "cubin", None))
        if err is not None:
            session.fetch(err)
            if err.array[0]:
                raise self.index_error(err.array, sizes)
        return {n: device_array(b) for n, b in outputs.items()}

    def run(self, env, binding, out=None):
        launches, outputs, err, sizes = self.launches(env, binding)
        self.program.run(launches, self.device, getattr(self, "cubin", None))
        if err is not None and err.array[0]:
            raise self.index_error(err.array, sizes)
        return outputs

    __call__ = run


def outputs_first_shape(outputs) -> tuple:
    """The largest output's shape (a row group's full-row output: rows x row length)."""
    return max((b.array.shape for b in outputs.values()), key=lambda s: int(np.prod(s)))


__all__ = ["SimtGroup", "SimtGroupGenerator", "SimtGroupSource", "simt_group_source"]
