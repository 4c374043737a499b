"""The native host program (issue 10, "a native executor"): the whole Plan as one generated C
function, so that a request costs one native call whatever its shape.

For a compiled model, :func:`generate_host_program` writes C that, given the symbol values of a
call (``sym[]``), a table of tensor pointers (``t[]``: inputs, outputs, constants, prepacked
weights) and one arena:

- places every intermediate in the arena by the *symbolic buffer plan*
  (:mod:`tscomp.runtime.symbolic_buffers`: offsets are integer expressions of the symbols, decided
  at compile time), writes the shape-valued tensors (``Shape`` outputs) there, and
- runs the groups in Plan order: per group it picks the kernel variant from the dispatch table
  made over the symbol ranges (:mod:`tscomp.runtime.dispatch`; the wave model's decision,
  DietCode §4.2's exported dispatcher) and calls that variant's entry point with arguments
  computed from the symbols (:meth:`~tscomp.codegen.kernel.Kernel.native_call`).

Kernels are called through a table of function pointers (``fn[]``) filled at load from the
artifact's library, so the host program is a separate, small translation unit. A step whose
kernel cannot be described natively (the numpy fallback, a Conv whose window is resolved in
Python) splits the program into *segments*: ``tscomp_host_run(s, ...)`` runs native segment s and
the runtime runs the Python step between two segments (:class:`HostProgram.order`).

C entry points (``sym``: the live symbols in :attr:`HostProgram.symbols` order)::

    int64_t tscomp_host_arena_bytes(const int64_t *sym);
    int tscomp_host_run(int segment, const ts_call *call);   /* see CALL_STRUCT */
    int tscomp_host_output_dims(int k, const int64_t *sym, int64_t *dims);

``tscomp_host_run`` returns 0; or ``step + 1`` after a kernel reported an index error (its record
in ``err[0..3]``, the variant in ``err[4]``); or -1 when the arena is smaller than the call needs
(the size in ``err[5]``: the caller grows it and calls again). Segment 0 places the arena first.
``tscomp_host_output_dims`` writes graph output k's shape to ``dims`` and returns its rank (-1: the
shape is not an expression of the symbols here), so that the native request path allocates the
outputs without evaluating a shape in Python.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import sympy

from tscomp.codegen.c_expr import PRELUDE, CPrinter, IndexContext, compose, linearize
from tscomp.codegen.kernel import NativeArg, NativeCall, NotNativeError
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.symbols import numel
from tscomp.runtime.binding import checkable_relations
from tscomp.runtime.dispatch import dispatch_key
from tscomp.runtime.symbolic_buffers import SymbolicLifetime, plan_buffers_symbolic

#: C types of tensor elements the host program writes (shape-valued tensors) or copies (views)
C_TYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "int8": "int8_t",
           "uint8": "uint8_t", "bool": "uint8_t", "float16": "uint16_t", "bfloat16": "uint16_t"}


#: what one call passes (a struct, so that the caller builds it once per thread and a call
#: marshals two arguments); mirrored by :class:`tscomp.runtime.native_executor.CallStruct`
CALL_STRUCT = """\
typedef struct {
    const int64_t *sym;             /* the live symbols' values */
    void **t;                       /* the pointer table */
    char *arena;                    /* intermediates (64-byte aligned) ... */
    int64_t arena_bytes;            /* ... of this many bytes */
    void *const *fn;                /* kernel entry points */
    const uint8_t *const *tables;   /* dispatch table per group (or NULL) */
    const int32_t *picks;           /* fixed variant per group, or -1: use the table */
    int64_t *err;                   /* [0..3] a kernel's error record, [4] its variant, [5] arena bytes needed */
    double *trace;                  /* NULL, or (profile()) per step the omp_get_wtime() it ended at; */
                                    /* [number of steps]: when the segment started */
} ts_call;
"""


@dataclass
class Slot:
    """One entry of the pointer table ``t[]``."""
    name: str
    kind: str          # input | output | const | packed | arena
    group: str = ""    # packed: the owning group
    variant: int = -1  # packed: the owning variant


@dataclass
class HostStep:
    group: str
    index: int                   # position in the Plan
    native: bool
    segment: int = -1            # native steps: the segment they run in
    reason: str = ""             # Python steps: why
    variants: int = 1


@dataclass
class HostProgram:
    source: str
    symbols: tuple[str, ...]
    slots: list[Slot]
    functions: list[tuple[str, int]]          # fn[] entries: (group, variant)
    steps: list[HostStep]
    order: list[tuple[str, int]]              # ("native", segment) | ("python", step index)
    groups: list[str]                          # tables[] / picks[] index -> group
    arena_tensors: dict[str, int] = field(default_factory=dict)   # tensor -> slot, placed in the arena
    keys: dict[str, object] = field(default_factory=dict)          # group -> dispatch key its table must have

    @functools.cached_property
    def slot_of(self) -> dict[str, int]:
        return {s.name: k for k, s in enumerate(self.slots) if s.kind != "packed"}

    def describe(self) -> str:
        native = sum(s.native for s in self.steps)
        return (f"host program: {len(self.steps)} steps, {native} native in "
                f"{sum(1 for kind, _ in self.order if kind == 'native')} segment(s), "
                f"{len(self.steps) - native} from Python")


class _Writer:
    """Builds the C text of one host program."""

    def __init__(self, plan, kernels: dict[str, list]):
        self.plan, self.graph = plan, plan.graph
        self.symtab = plan.graph.symbols
        self.infos = self.symtab.live_symbols()
        self.symbols = tuple(i.name for i in self.infos)
        self.kernels = kernels
        self.slots: list[Slot] = []
        self.slot_index: dict[str, int] = {}
        self.functions: list[tuple[str, int]] = []
        self.lifetimes: dict[str, list] = {}          # arena tensor -> [nbytes, first, last]
        self.keys: dict[str, object] = {}             # group -> its dispatch key (None: picks[] decides)
        self._printed: dict = {}

    # ------------------------------------------------------------ expressions
    def c(self, expr, ctx: IndexContext | None = None) -> str:
        """An integer expression of the live symbols (and ``ctx``'s loop variables) as C (memoized:
        a model's layers repeat the same sizes)."""
        if ctx is None:
            key = sympy.sympify(expr)
            got = self._printed.get(key)
            if got is None:
                got = self._printed[key] = self._c(key, None)
            return got
        return self._c(expr, ctx)

    def _c(self, expr, ctx: IndexContext | None, printer: CPrinter | None = None) -> str:
        """``expr`` as C through ``printer`` (a fresh one by default), its symbols read from ``sym[]``."""
        expr = self.symtab.canon(sympy.sympify(expr))
        ctx = ctx or IndexContext(self.symtab)
        printer = printer or CPrinter(ctx)
        for s in expr.free_symbols:
            if s in ctx.upper_bounds:
                continue
            if s.name not in self.symbols:
                raise NotNativeError(f"size {expr} uses {s.name}, which the inputs' shapes do not bind")
            printer.names[s] = f"sym[{self.symbols.index(s.name)}]"
        try:
            return printer(expr)
        except UnsupportedOperatorError as exc:
            raise NotNativeError(str(exc)) from None

    # ------------------------------------------------------------ slots
    def slot(self, name: str, kind: str, **kw) -> int:
        key = name if kind != "packed" else f"{name}#packed"
        k = self.slot_index.get(key)
        if k is None:
            k = self.slot_index[key] = len(self.slots)
            self.slots.append(Slot(name, kind, **kw))
        return k

    def tensor_slot(self, name: str, step: int) -> int:
        """The slot of a tensor a step reads or writes; arena tensors extend their lifetime."""
        graph = self.graph
        if name in graph.inputs:
            return self.slot(name, "input")
        if name in graph.outputs:
            return self.slot(name, "output")
        v = graph.values[name]
        if v.const is not None:
            return self.slot(name, "const")
        self.arena(name, numel(v.shape) * np.dtype(v.dtype).itemsize, 0 if v.symdata is not None else step, step)
        return self.slot_index[name]

    def arena(self, name: str, nbytes, first: int, last: int) -> int:
        k = self.slot(name, "arena")
        life = self.lifetimes.get(name)
        if life is None:
            self.lifetimes[name] = [self.symtab.canon(sympy.sympify(nbytes)), first, last]
        else:
            life[1], life[2] = min(life[1], first), max(life[2], last)
        return k

    # ------------------------------------------------------------ dispatch
    def variant_choice(self, group: str, variants) -> str:
        """C for the variant a multi-variant group runs: ``picks[g]`` when the runtime fixed it,
        else its dispatch table indexed by the group's key (clamped: a bound is never exceeded in
        range, and a wrong index must not read outside the table)."""
        g = self.groups.index(group)
        key = dispatch_key(variants, self.symtab)
        self.keys[group] = key
        if key is None:
            return f"picks[{g}]"
        terms = [f"ts_min(ts_max({self.c(e)} - {lo}, 0){f' / {step}' if step > 1 else ''}, {n - 1}) * INT64_C({st})"
                 for e, lo, n, step, st in zip(key.exprs, key.mins, key.extents, key.steps, key.strides())]
        return f"(picks[{g}] >= 0 ? picks[{g}] : (int)tables[{g}][{' + '.join(terms) or '0'}])"

    # ------------------------------------------------------------ calls
    def call(self, step: int, group: str, v: int, kernel, nc: NativeCall, prep: list[str]) -> str:
        """``fn[k](args...)`` for one variant; its view copies go to ``prep``."""
        params, values = [], []
        for j, a in enumerate(nc.args):
            p, val = self.argument(step, group, v, kernel, j, a, prep)
            params.append(p)
            values.append(val)
        fk = len(self.functions)
        self.functions.append((group, v))
        ret = "int" if nc.checked else "void"
        return f"(({ret} (*)({', '.join(params)}))fn[{fk}])({', '.join(values)})"

    def argument(self, step, group, v, kernel, j, a: NativeArg, prep: list[str]) -> tuple[str, str]:
        if a.kind == "int":
            return "int64_t", self.c(a.expr)
        if a.kind == "error":
            return "int64_t*", "err"
        if a.kind == "packed":
            if getattr(kernel, "packed", None) is None:
                raise NotNativeError(f"group {group}: variant {v} has no packed weight")
            return "const void*", f"t[{self.slot(group + f'/v{v}', 'packed', group=group, variant=v)}]"
        if a.kind == "scratch":
            return "void*", f"t[{self.arena(f'{group}/v{v}/scratch{j}', a.expr, step, step)}]"
        if a.kind in ("tensor", "view"):
            have = np.dtype(self.graph.values[a.name].dtype)
            if have.name != a.dtype:
                raise NotNativeError(f"group {group}: tensor {a.name} is {have}, the kernel takes {a.dtype}")
            if a.kind == "tensor" or all(x.op.kind == "reshape" for x in a.views):   # reshapes: same memory
                return "void*", f"t[{self.tensor_slot(a.name, step)}]"
            return "void*", f"t[{self.view_copy(step, group, v, j, a, prep)}]"
        raise NotNativeError(f"group {group}: argument kind {a.kind!r}")

    def view_copy(self, step, group, v, j, a: NativeArg, prep: list[str]) -> int:
        """A contiguous copy of tensor ``a.name`` read through ``a.views`` (outermost first), as a
        parallel loop nest over the view's shape with the composed index map."""
        canon = self.symtab.canon
        outer = a.views[0]
        shape = tuple(canon(d) for d in outer.shape)
        ctx = IndexContext(self.symtab)
        idx = tuple(ctx.var(f"i{k}", d) for k, d in enumerate(shape))
        # back from the consumer's index to the source tensor's
        cur = compose(idx, [(view.op.canonical(canon), [canon(d) for d in view.src.shape]) for view in a.views], ctx)
        src_shape = [canon(d) for d in self.graph.values[a.name].shape]
        ctype = C_TYPES.get(a.dtype)
        if ctype is None:
            raise NotNativeError(f"group {group}: a view of {a.dtype} data")
        itemsize = np.dtype(a.dtype).itemsize if a.dtype != "bfloat16" else 2
        dst = self.arena(f"{group}/v{v}/view{j}", numel(shape) * itemsize, step, step)
        src = self.tensor_slot(a.name, step)
        ops = ", ".join(x.op.describe() for x in a.views)
        sizes: list[str] = []
        c = self._block_printer(ctx, sizes)
        src_off = ctx.simplify(linearize(cur, src_shape))
        body = f"ts_dst[{c(linearize(idx, shape))}] = ts_src[{c(src_off)}];"
        loops = self._copy_loops(idx, shape, src_off, c)
        prep.append(f"/* contiguous copy of {a.name} read through {ops} */")
        prep.append("{")
        prep += ["    " + line for line in sizes]
        prep.append(f"    const {ctype} *ts_src = (const {ctype}*)t[{src}];")
        prep.append(f"    {ctype} *ts_dst = ({ctype}*)t[{dst}];")
        prep += ["    " + line for line in loops]
        prep.append(f"    {'    ' * sum(line.lstrip().startswith('for ') for line in loops)}{body}")
        prep.append("}")
        return dst

    def _block_printer(self, ctx: IndexContext, sizes: list[str]):
        """:meth:`_c` for one copy block, each floor/Mod of symbols alone declared once in ``sizes``
        (kept out of the loops, where it defeats the vectorizer)."""
        def hoist(text: str) -> str:
            sizes.append(f"const int64_t ts_sz{len(sizes)} = {text};")
            return f"ts_sz{len(sizes) - 1}"

        bound = frozenset(i.symbol for i in self.symtab.live_symbols() if i.symbol.name in self.symbols)
        printer = CPrinter(ctx, hoist=hoist, shape_symbols=bound)
        return lambda expr: self._c(expr, ctx, printer)

    @staticmethod
    def _copy_loops(idx, shape, src_off, c) -> list[str]:
        """The loop nest of a view copy. A transpose (the source's unit-stride axis is not the
        copy's last) walks 16 x 16 tiles of those two axes, so reads and writes both stay within 16
        cache lines (a plain nest reads the source at the stride of a whole row per element: the
        channels-last -> NCHW copy before each of SegFormer's Convs took a third of its kernels'
        time)."""
        last = len(idx) - 1
        unit = [k for k, i in enumerate(idx)
                if k != last and sympy.simplify(src_off.subs(i, i + 1) - src_off) == 1]
        lines = []
        if not unit or sympy.simplify(src_off.subs(idx[last], idx[last] + 1) - src_off) == 1:
            if len(idx) > 1:
                lines.append(f"#pragma omp parallel for collapse({min(2, len(idx))}) schedule(static)")
            for k, (i, d) in enumerate(zip(idx, shape)):
                lines.append(f"{'    ' * k}for (int64_t {i} = 0; {i} < {c(d)}; ++{i})")
            return lines
        a, T = unit[-1], VIEW_COPY_TILE
        outer = [k for k in range(len(idx)) if k not in (a, last)]
        order = [(f"{idx[k]}", "0", c(shape[k]), "1") for k in outer]
        order += [(f"{idx[a]}_t", "0", c(shape[a]), str(T)), (f"{idx[last]}_t", "0", c(shape[last]), str(T))]
        order += [(f"{idx[a]}", f"{idx[a]}_t", f"ts_min({idx[a]}_t + {T}, {c(shape[a])})", "1"),
                  (f"{idx[last]}", f"{idx[last]}_t", f"ts_min({idx[last]}_t + {T}, {c(shape[last])})", "1")]
        lines.append(f"#pragma omp parallel for collapse(2) schedule(static)   /* {T} x {T} tiles of a transpose */")
        for depth, (v, lo, hi, step) in enumerate(order):
            inc = f"++{v}" if step == "1" else f"{v} += {step}"
            lines.append(f"{'    ' * depth}for (int64_t {v} = {lo}; {v} < {hi}; {inc})")
        return lines


#: the side of the square tiles a transposing view copy walks (16 floats: one cache line)
VIEW_COPY_TILE = 16


def _step_block(w: _Writer, step: int, group, variants) -> list[str]:
    """The C of one native step (raises :class:`NotNativeError` if a variant cannot be called)."""
    calls = [k.native_call() for k in variants]
    for k in variants:
        if getattr(k, "fn", None) is None:
            raise NotNativeError(f"group {group.name}: kernel {k.func} is not bound to a library")
    body = [f"/* step {step}: group {group.name} ({variants[0].family}), {len(variants)} variant(s) */", "{"]
    cases = []
    for v, (k, nc) in enumerate(zip(variants, calls)):
        prep: list[str] = []
        call = w.call(step, group.name, v, k, nc, prep)
        stmt = [f"if ({call}) {{ err[4] = {v}; return {step + 1}; }}" if nc.checked else f"{call};"]
        if nc.guard is not None:       # an empty extent: nothing to compute (the kernels assume >= 1)
            stmt = [f"if ({w.c(nc.guard)} > 0) {{"] + ["    " + ln for ln in prep + stmt] + ["}"]
        else:
            stmt = prep + stmt
        cases.append(stmt)
    if len(cases) == 1:
        body += ["    " + ln for ln in cases[0]]
    else:
        body.append(f"    switch ({w.variant_choice(group.name, variants)}) {{")
        for v, stmt in enumerate(cases):
            body.append(f"    case {v}:")
            body += ["        " + ln for ln in stmt]
            body.append("        break;")
        body.append("    }")
    body.append(f"    if (call->trace) call->trace[{step}] = omp_get_wtime();   /* profile(): the step's end */")
    body.append("}")
    return body


def _place_block(w: _Writer) -> list[str]:
    """``ts_place``: arena offsets from the symbolic buffer plan; shape-valued tensors written."""
    lifetimes = [SymbolicLifetime(name, nbytes, first, last) for name, (nbytes, first, last) in w.lifetimes.items()]
    plan = plan_buffers_symbolic(lifetimes, w.symtab)
    lines = ["/* arena placement: the symbolic buffer plan (offsets are expressions of the symbols) */",
             "static int64_t ts_place(const int64_t *sym, void **t, char *ts_arena)", "{"]
    lines += plan.c_statements(list(w.symbols))
    lines.append("    if (ts_arena) {")
    for k, name in enumerate(plan.order):
        lines.append(f"        t[{w.slot_index[name]}] = ts_arena + o{k};")
    for name in plan.order:
        v = w.graph.values.get(name)
        if v is None or v.symdata is None:
            continue
        ctype = C_TYPES.get(np.dtype(v.dtype).name)
        if ctype is None:
            raise NotNativeError(f"shape-valued tensor {name} of type {np.dtype(v.dtype)}")
        for j, e in enumerate(np.asarray(v.symdata).reshape(-1)):
            lines.append(f"        (({ctype}*)t[{w.slot_index[name]}])[{j}] = ({ctype})({w.c(e)});   /* {name} */")
    lines += ["    }", "    return arena;", "}"]
    return lines


def generate_host_program(plan, kernels: dict[str, list], name: str = "model") -> HostProgram:
    """The host program of a compiled model (``kernels``: group -> variants, Plan order)."""
    w = _Writer(plan, kernels)
    w.groups = [g.name for g in plan.groups]
    steps, blocks = [], []
    for k, g in enumerate(plan.groups):
        variants = kernels[g.name]
        saved = (len(w.slots), dict(w.slot_index), len(w.functions), {n: list(x) for n, x in w.lifetimes.items()})
        try:
            block = _step_block(w, k, g, variants)
            steps.append(HostStep(g.name, k, True, variants=len(variants)))
            blocks.append(block)
        except NotNativeError as exc:
            n_slots, w.slot_index, n_fn, w.lifetimes = saved   # undo what the failed step recorded
            del w.slots[n_slots:], w.functions[n_fn:]
            for name in g.inputs:
                if name in w.graph.values:
                    w.tensor_slot(name, k)
            for name in g.outputs:
                w.tensor_slot(name, k)
            steps.append(HostStep(g.name, k, False, reason=str(exc), variants=len(variants)))
            blocks.append(None)
    order, segments, current = [], [], None
    for s, block in zip(steps, blocks):
        if s.native:
            if current is None:
                current = []
                segments.append(current)
                order.append(("native", len(segments) - 1))
            s.segment = len(segments) - 1
            current.append(block)
        else:
            if not segments:       # segment 0 places the arena: it always runs first
                segments.append([])
                order.append(("native", 0))
            current = None
            order.append(("python", s.index))
    if not segments:
        segments.append([])
        order.append(("native", 0))
    source = _source(w, name, steps, segments)
    return HostProgram(source, w.symbols, w.slots, w.functions, steps, order, w.groups,
                       {n: w.slot_index[n] for n in w.lifetimes}, dict(w.keys))


def program_for(model) -> HostProgram:
    """The host program of a :class:`~tscomp.compiler.CompiledModel` (named for its source model,
    so the compiler and the runtime generate the same text)."""
    from pathlib import Path

    return generate_host_program(model.plan, model.kernels, Path(model.source_model).name or "model")


def _source(w: _Writer, name: str, steps, segments) -> str:
    infos = w.infos
    native = sum(s.native for s in steps)
    head = [
        "/*",
        f" * tscomp host program for {name} (generated; do not edit)",
        f" * {len(steps)} groups in Plan order: {native} called from here in {len(segments)} segment(s), "
        f"{len(steps) - native} run from Python",
        " * symbols: " + (", ".join(f"sym[{k}] = {i.name} in [{i.min}, {i.max}]" for k, i in enumerate(infos)) or "-"),
        f" * pointer table t[]: {len(w.slots)} entries; kernel entry points fn[]: {len(w.functions)}",
        " * variant choice: picks[g] when >= 0, else the dispatch table tables[g] over the group's key extents",
        " */",
    ]
    for s in steps:
        if not s.native:
            head.insert(-1, f" *   step {s.index} ({s.group}) runs from Python: {s.reason}"[:300])
    lines = head + [PRELUDE, "#include <stddef.h>", "#include <omp.h>", "", CALL_STRUCT]
    lines += _place_block(w)
    lines += ["", "int64_t tscomp_host_arena_bytes(const int64_t *sym)", "{",
              "    return ts_place(sym, NULL, NULL);", "}", ""]
    lines += ["int tscomp_host_run(int segment, const ts_call *call)", "{",
              "    const int64_t *sym = call->sym;",
              "    void **t = call->t;",
              "    void *const *fn = call->fn;",
              "    const uint8_t *const *tables = call->tables;",
              "    const int32_t *picks = call->picks;",
              "    int64_t *err = call->err;",
              "    (void)tables; (void)picks; (void)err; (void)fn; (void)t;",
              "    if (segment == 0) {",
              "        const int64_t need = ts_place(sym, NULL, NULL);",
              "        if (need > call->arena_bytes) { err[5] = need; return -1; }   /* the caller grows it */",
              "        ts_place(sym, t, call->arena);",
              "    }",
              "    switch (segment) {"]
    for k, seg in enumerate(segments):
        lines.append(f"    case {k}: {{")
        lines.append(f"        if (call->trace) call->trace[{len(steps)}] = omp_get_wtime();")
        for block in seg:
            lines += ["        " + ln for ln in block]
        lines.append("        return 0; }")
    lines += ["    }", "    return 0;", "}", ""]
    lines += _output_dims_block(w)
    lines += _relations_block(w)
    return "\n".join(lines)


def _relations_block(w: _Writer) -> list[str]:
    """``tscomp_host_relations``: the relations between symbols the model needs and the compiler
    could not prove, which the inputs' shapes decide (:func:`~tscomp.runtime.binding.checkable_relations`),
    checked in C per request. ``tscomp_host_relations_count`` is how many it checks, or -1 when one
    cannot be printed here (a membership test): then the runtime checks them in Python."""
    relations = checkable_relations(w.graph)
    checks = []
    for k, c in enumerate(relations):
        try:
            if c.relation not in ("==", "<="):
                raise NotNativeError(f"relation {c.relation}")
            checks.append(f"    if (!(({w.c(c.lhs)}) {c.relation} ({w.c(c.rhs)}))) return {k + 1};   "
                          f"/* {' '.join(c.reason[:100].split()).replace('*/', '* /')} */")
        except NotNativeError:
            checks = None
            break
    lines = ["/* relations the model needs between the symbols: 0 when all hold, else 1 + the first that fails */",
             f"const int tscomp_host_relations_count = {len(relations) if checks is not None else -1};",
             "int tscomp_host_relations(const int64_t *sym)", "{", "    (void)sym;"]
    lines += checks or []
    lines += ["    return 0;", "}", ""]
    return lines


def _output_dims_block(w: _Writer) -> list[str]:
    """``tscomp_host_output_dims``: each graph output's shape from the symbols (-1 for an output whose
    shape cannot be printed here: its caller allocates it another way)."""
    lines = ["/* graph output k's shape -> dims[]; returns its rank, or -1 */",
             "int tscomp_host_output_dims(int k, const int64_t *sym, int64_t *dims)", "{",
             "    (void)sym; (void)dims;", "    switch (k) {"]
    for k, name in enumerate(w.graph.outputs):
        try:
            dims = [w.c(w.symtab.canon(d)) for d in w.graph.values[name].shape]
        except NotNativeError:
            continue
        sets = " ".join(f"dims[{j}] = {d};" for j, d in enumerate(dims))
        lines.append(f"    case {k}: {sets}{' ' if sets else ''}return {len(dims)};   /* {name} */")
    lines += ["    }", "    return -1;", "}", ""]
    return lines


__all__ = ["HostProgram", "HostStep", "Slot", "generate_host_program", "program_for"]
