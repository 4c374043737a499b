"""Fused "gemm" groups of the Plan compiled to the CPU GEMM macro-kernel (:mod:`tscomp.codegen.cpu_gemm`).

Accepted groups: one heavy op, a ``MatMul`` (A of rank >= 2) or ``Gemm`` (``transA=0``; ``transB``,
``alpha``, ``beta``·C handled), whose B operand is a graph constant 2-D weight [K, N] (prepacked at
compile time), whose A operand is a group input read directly or through views (no prologue ops),
and whose epilogue is elementwise. The GEMM's output space is treated as the matrix [M, N]
(M = product of its leading dims, dynamic) and every group output must be an elementwise function
of that space: an output of shape [..., N] whose leading dims multiply to M and whose element
(i, j) reads the GEMM at (i, j) (reshapes of the leading dims allowed), or a column range of it
([..., n] read at (i, j0 + jo): a Split/Slice of the fused QKV result).

The epilogue C is generated from the expression IR by the elementwise generator of
:mod:`tscomp.codegen.cpu_groups` (registry ``c_expr`` templates, index composition of
:mod:`tscomp.codegen.c_expr`): ``acc`` stands for the MatMul's value at (i, j), other epilogue
inputs (bias [N], residual [batch, sequence, N], masks) are loads indexed from (i, j) through their
composed index maps, shape symbols become ``int64_t`` kernel arguments. The first full-space output
is the kernel's ``Y``; further outputs are extra stores inside the epilogue (column-range outputs
under a ``j`` range test); without a full-space output ``Y`` is a scratch [M, N] buffer.

A operand through views that are not the identity on memory (e.g. permute + reshape of an attention
result) is materialized contiguously with numpy before the call (a copy).

Everything else raises :class:`UnsupportedOperatorError` naming the group and the reason (Conv,
batched GEMMs with two activation operands, prologue ops, row-reduction epilogues, outputs outside
the GEMM's space, non-float32 tensors).
"""
from __future__ import annotations

import ctypes
import re
from typing import Mapping

import numpy as np
import sympy

from tscomp.codegen.build import build_library, host_isa, load_library
from tscomp.codegen.c_expr import EXP_HELPER, PRELUDE, broadcast_index, c_literal, c_symbol_name, delinearize, linearize
from tscomp.codegen.cpu_gemm import ARG_TYPES, Epilogue, EpilogueArg, GemmError, generate_gemm, prepack_weights
from tscomp.codegen.cpu_groups import GroupGenerator
from tscomp.codegen.tile_config import TileConfig, default_config
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.fusion.expr import Expr, Input, Op, View
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.graph.symbols import numel, same
from tscomp.graph.views import apply_view


class _EpilogueGenerator(GroupGenerator):
    """The elementwise generator with the GEMM's value at (i, j) as ``acc``."""

    def __init__(self, plan: Plan, group: Group, heavy: Op, M, N: int):
        super().__init__(plan, group)
        self.heavy = heavy
        self.i = self.ctx.var("i", M)
        self.j = self.ctx.var("j", N)
        self.M = M
        self.probe: list | None = None    # probe mode: record where the heavy op is read

    def heavy_value(self, e: Op, idx) -> str:
        if e is not self.heavy:
            self.fail("a second heavy op in the epilogue (row reductions are not fused into a GEMM)", e)
        hshape = self.shape(e)
        if self.probe is not None:
            self.probe.append(tuple(idx))
            return "acc"
        lead = self.ctx.simplify(linearize(tuple(idx[:-1]), hshape[:-1])) if len(hshape) > 1 else sympy.Integer(0)
        col = self.ctx.simplify(idx[-1])
        if not (same(lead, self.i) and same(col, self.j)):
            self.fail(f"the epilogue reads the GEMM result at ({lead}, {col}), not at the element it "
                      f"computes (i, j)", e)
        if e.op_type == "Gemm":
            alpha = float(e.attrs.get("alpha", 1.0))
            beta = float(e.attrs.get("beta", 1.0))
            expr = "acc" if alpha == 1.0 else f"(acc * {c_literal(alpha, np.float32)})"
            if len(e.args) > 2 and e.args[2] is not None and beta != 0.0:
                c = self.value(e.args[2], broadcast_index(tuple(idx), hshape, self.shape(e.args[2])))
                cterm = c if beta == 1.0 else f"({c_literal(beta, np.float32)} * {c})"
                return self.define("float", f"{expr} + {cterm}", deps=[c], note="Gemm alpha/beta*C")
            return expr
        return "acc"


def _strip_views(e: Expr):
    chain = []
    while isinstance(e, View):
        chain.append(e)
        e = e.src
    return e, chain


_LIBS: dict[str, ctypes.CDLL] = {}


class CompiledGemmGroup:
    """A gemm group compiled to the CPU macro-kernel with its generated epilogue.

    ``run(env, binding)`` has :meth:`tscomp.codegen.cpu_groups.CompiledGroup.run`'s contract:
    ``env`` holds (at least) the group's inputs, ``binding`` the shape symbols by name."""

    def __init__(self, plan: Plan, group: Group, cfg: TileConfig | None = None, *, isa: str | None = None):
        self.plan, self.group = plan, group
        try:
            self._analyze()
            self._build(cfg, isa)
        except UnsupportedOperatorError as exc:
            msg = str(exc)
            raise UnsupportedOperatorError(msg if msg.startswith(f"group {group.name}") else
                                           f"group {group.name}: {msg}") from None
        except GemmError as exc:
            raise UnsupportedOperatorError(f"group {group.name}: {exc}") from None

    # ------------------------------------------------------------------ analysis
    def _fail(self, why: str):
        raise UnsupportedOperatorError(f"group {self.group.name}: {why}")

    def _analyze(self) -> None:
        g, graph = self.group, self.plan.graph
        if g.kind != "gemm":
            self._fail(f"{g.kind} group is not a GEMM group")
        pro, heavy, epi = g.prologue_epilogue()
        if not heavy:
            self._fail("no heavy op")
        h = heavy[0]
        if h.op_type not in ("MatMul", "Gemm"):
            self._fail(f"backbone {h.op_type} is not a MatMul/Gemm (no CPU GEMM lowering for it yet)")
        if len({o.node for o in heavy}) > 1:
            others = ", ".join(sorted({o.op_type for o in heavy[1:]}))
            self._fail(f"stitched heavy ops after the GEMM ({others}): row-reduction epilogues are not fused "
                       f"into the GEMM kernel")
        if h.op_type == "Gemm" and int(h.attrs.get("transA", 0)):
            self._fail("Gemm with transA=1")
        if h.num_outputs != 1:
            self._fail(f"{h.op_type} with {h.num_outputs} outputs")
        a, b = h.args[0], h.args[1]
        a_src, a_chain = _strip_views(a)
        b_src, b_chain = _strip_views(b)
        const = graph.values[b_src.name].const if isinstance(b_src, Input) and b_src.name in graph.values else None
        if b_chain or const is None:
            self._fail(f"{h.op_type} {h.node!r}: B operand is not a constant weight (a batched GEMM with two "
                       f"activation operands)")
        if pro:
            self._fail(f"prologue ops ({', '.join(o.op_type for o in pro)}) before the GEMM are not supported")
        W = np.asarray(const)
        if W.ndim != 2:
            self._fail(f"{h.op_type} {h.node!r}: weight of rank {W.ndim} (only 2-D [K, N])")
        if h.op_type == "Gemm" and int(h.attrs.get("transB", 0)):
            W = W.T
        if not isinstance(a_src, Input):
            self._fail(f"{h.op_type} {h.node!r}: A operand is computed in the group (prologue)")
        if len(a.shape) < 2:
            self._fail(f"{h.op_type} {h.node!r}: A operand of rank {len(a.shape)}")
        for t, what in ((a, "A"), (h, "GEMM result")):
            if np.dtype(t.dtype) != np.float32:
                self._fail(f"{what} is {np.dtype(t.dtype)}, only float32 GEMMs are generated")
        if W.dtype != np.float32:
            self._fail(f"weight is {W.dtype}, only float32")
        self.W = np.ascontiguousarray(W, dtype=np.float32)
        self.K, self.N = (int(d) for d in self.W.shape)
        symtab = graph.symbols
        hshape = tuple(symtab.canon(d) for d in h.shape)
        ashape = tuple(symtab.canon(d) for d in a.shape)
        if not same(ashape[-1], self.K) or not same(hshape[-1], self.N):
            self._fail(f"shapes A {ashape} / result {hshape} do not match the weight [{self.K}, {self.N}]")
        self.heavy = h
        self.M = numel(hshape[:-1])
        self.a_input, self.a_chain = a_src.name, list(reversed(a_chain))   # innermost view first
        self.a_identity = self._is_identity_view(a_src, a_chain)
        self._gen_epilogue()

    def _is_identity_view(self, src: Input, chain) -> bool:
        """Whether the A view chain reads its source's memory in row-major order (no copy needed)."""
        if not chain:
            return True
        gen = GroupGenerator(self.plan, self.group)
        shape = gen.shape(chain[0])
        idx = tuple(gen.ctx.var(f"a{k}", d) for k, d in enumerate(shape))
        e, cur = chain[0], idx
        from tscomp.codegen.c_expr import view_index
        while isinstance(e, View):
            cur = tuple(gen.ctx.simplify(x) for x in view_index(cur, gen.canon_view(e), gen.shape(e.src), gen.ctx))
            e = e.src
        flat_src = gen.ctx.simplify(linearize(cur, gen.shape(src)))
        flat_out = gen.ctx.simplify(linearize(idx, shape))
        return same(flat_src, flat_out)

    def _output_mode(self, name: str, e: Expr) -> tuple[str, int]:
        """("full", 0) or ("cols", j0) for an output of the GEMM space, else refuse."""
        symtab = self.plan.graph.symbols
        shape = tuple(symtab.canon(d) for d in e.shape)
        if np.dtype(e.dtype) != np.float32:
            self._fail(f"output {name} is {np.dtype(e.dtype)}, only float32 outputs")
        if not shape or not same(numel(shape[:-1]), self.M):
            self._fail(f"output {name} of shape {list(shape)} is not in the GEMM's [M={self.M}, N={self.N}] space")
        n = shape[-1]
        if not n.is_Integer:
            self._fail(f"output {name}: symbolic last dim {n}")
        gen = _EpilogueGenerator(self.plan, self.group, self.heavy, self.M, self.N)
        gen.probe = []
        jo = gen.ctx.var("jo", n)
        gen.value(e, delinearize(gen.i, shape[:-1], gen.ctx) + (jo,))
        offsets = set()
        for idx in gen.probe:
            c = sympy.expand(gen.ctx.simplify(idx[-1]) - jo)
            if not c.is_Integer:
                self._fail(f"output {name} reads GEMM column {idx[-1]} at its column jo: not a column range")
            offsets.add(int(c))
        if len(offsets) > 1:
            self._fail(f"output {name} reads the GEMM at several column offsets {sorted(offsets)}")
        j0 = offsets.pop() if offsets else 0
        if j0 < 0 or j0 + int(n) > self.N:
            self._fail(f"output {name}: columns [{j0}, {j0 + int(n)}) outside [0, {self.N})")
        return ("full" if j0 == 0 and int(n) == self.N else "cols"), j0

    def _gen_epilogue(self) -> None:
        g = self.group
        modes = {name: self._output_mode(name, e) for name, e in g.outputs.items()}
        self.y_output = next((n for n, (m, _) in modes.items() if m == "full"), None)
        gen = _EpilogueGenerator(self.plan, g, self.heavy, self.M, self.N)
        symtab = self.plan.graph.symbols
        self.out_c = {name: f"out{k}" for k, name in enumerate(g.outputs)}
        self.out_shapes = {name: tuple(symtab.canon(d) for d in e.shape) for name, e in g.outputs.items()}

        def idx_of(name, j_expr):
            shape = self.out_shapes[name]
            return delinearize(gen.i, shape[:-1], gen.ctx) + (j_expr,)

        final = "acc"
        if self.y_output is not None:
            final = gen.value(g.outputs[self.y_output], idx_of(self.y_output, gen.j))
        for name, (mode, j0) in modes.items():
            if name == self.y_output:
                continue
            n = int(self.out_shapes[name][-1])
            if mode == "full":
                v = gen.value(g.outputs[name], idx_of(name, gen.j))
                gen.emit(f"{self.out_c[name]}[i * {n} + j] = {v};")
            else:
                with gen.branch(f"if (j >= {j0} && j < {j0 + n})"):
                    v = gen.value(g.outputs[name], idx_of(name, gen.j - j0))
                    gen.emit(f"{self.out_c[name]}[i * {n} + (j - {j0})] = {v};")
        body = [line.strip() for line in gen.root.render(0)]
        stmts = [s for s in (*gen.statics, *gen.decls, *body) if s.strip()]
        text = "\n".join(stmts)
        # the epilogue's arguments: inputs it loads, side outputs it stores, shape symbols it uses
        args: list[EpilogueArg] = []
        self.arg_roles: list[tuple[str, str, object]] = []
        for name, cname in gen.in_c.items():
            if re.search(rf"\b{cname}\[", text):
                dt = np.dtype(self._input_dtype(name))
                ctype = {np.float32: "const float*", np.int64: "const int64_t*", np.int32: "const int32_t*"}.get(dt.type)
                if ctype is None:
                    self._fail(f"epilogue input {name} of type {dt} cannot be passed to the GEMM kernel")
                args.append(EpilogueArg(cname, ctype))
                self.arg_roles.append(("input", name, dt))
        for name, cname in self.out_c.items():
            if name != self.y_output:
                args.append(EpilogueArg(cname, "float*"))
                self.arg_roles.append(("output", name, np.dtype(np.float32)))
        syms = sorted((s for s in gen.pr.used if s not in gen.ctx.upper_bounds), key=lambda s: s.name)
        for s in syms:
            args.append(EpilogueArg(c_symbol_name(s.name), "int64_t"))
            self.arg_roles.append(("symbol", s.name, s))
        if not stmts and final == "acc" and not args:
            self.epilogue = None
        else:
            _, _, epi = g.prologue_epilogue()
            label = " + ".join(o.op_type for o in epi) or "store"
            prelude = PRELUDE + (EXP_HELPER if "ts_expf(" in text + final else "")
            self.epilogue = Epilogue(final, tuple(args), label, body=text, prelude=prelude)
        self.helpers = "ts_" in text or "ts_" in final

    def _input_dtype(self, name):
        for e in (x for x in self._walk_inputs() if x.name == name):
            return e.dtype
        return self.plan.graph.values[name].dtype

    def _walk_inputs(self):
        from tscomp.graph.fusion.expr import walk
        return [e for e in walk(self.group.outputs.values()) if isinstance(e, Input)]

    # ------------------------------------------------------------------ build
    def _build(self, cfg: TileConfig | None, isa: str | None) -> None:
        self.isa = isa or host_isa()
        self.cfg = (cfg or default_config(self.isa, self.K, self.N)).validate(self.isa)
        self.func = "tscomp_" + re.sub(r"\W", "_", self.group.name) + f"_{self.isa}_{self.cfg.slug()}"
        src = generate_gemm(self.cfg, self.K, self.N, self.isa, self.epilogue, name=self.func)
        self.source = src
        path = build_library(src, self.func)
        lib = _LIBS.get(str(path))
        if lib is None:
            lib = _LIBS[str(path)] = load_library(path)
        fn = getattr(lib, self.func)
        fn.restype = None
        extra_types = [ARG_TYPES[a.ctype][0] for a in (self.epilogue.args if self.epilogue else ())]
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, *extra_types]
        self.fn = fn
        self.packed = prepack_weights(self.W, self.cfg)

    # ------------------------------------------------------------------ run
    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]:
        symtab = self.plan.graph.symbols
        binding = dict(binding)

        def ev(x) -> int:
            return int(symtab.evaluate(x, binding))

        a = np.asarray(env[self.a_input])
        for v in self.a_chain:
            a = apply_view(a, v.op, ev)
        M = ev(self.M)
        if a.dtype != np.float32:
            raise ExecutionError(f"group {self.group.name}: A operand {self.a_input!r} is {a.dtype}, expected float32")
        X = np.ascontiguousarray(a.reshape(M, self.K))
        outputs = {name: np.empty(tuple(ev(d) for d in shape), np.float32) for name, shape in self.out_shapes.items()}
        Y = outputs[self.y_output] if self.y_output is not None else np.empty((M, self.N), np.float32)
        keep, extra = [X, Y], []
        for role, name, info in self.arg_roles:
            if role == "input":
                arr = np.ascontiguousarray(np.asarray(env[name]), dtype=info)
                keep.append(arr)
                extra.append(arr.ctypes.data)
            elif role == "output":
                extra.append(outputs[name].ctypes.data)
            else:
                extra.append(ev(info))
        if M > 0:
            self.fn(X.ctypes.data, self.packed.ctypes.data, Y.ctypes.data, M, *extra)
        return outputs

    __call__ = run


__all__ = ["CompiledGemmGroup"]
