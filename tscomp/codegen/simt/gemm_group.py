"""The SIMT gemm family's source and executor steps: a fused gemm group's target-neutral analysis
(:class:`~tscomp.codegen.cpu_gemm_group.GemmGroupAnalysis`, shared with the CPU family) + a
:class:`~.config.SimtTile` → one SIMT program (:mod:`.gemm`) rendered as CUDA and OpenCL, and the
executor that launches it on a SIMT device (TSCompiler §5.1 tiles, §6 grid = blocks of the shape).

The weight is stored unpacked ([K, N] row-major float32: the kernel stages it tile by tile); the
A operand through views that are not the identity on memory is made contiguous on the host, as the
CPU family does. ``run(env, binding)`` executes on ``self.device`` (``$TSCOMP_SIMT_DEVICE``, else ``"opencl"``; the
runtime may set ``"cuda"``)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Mapping

import numpy as np

from tscomp.codegen.kernel import KernelBase
from tscomp.codegen.simt.config import SimtTile
from tscomp.codegen.simt.dialect import hoist_statics
from tscomp.codegen.simt.gemm import AOperand, SimtEpilogue, check_identifiers, gemm_body, kernel_name
from tscomp.codegen.simt.launch import (Buffer, Launch, ceil_div, device_array, input_buffer, output_buffer,
                                        resident_buffer, scalar)
from tscomp.codegen.simt.program import SessionRun, SimtProgram, header_comment
from tscomp.errors import ExecutionError, UnsupportedOperatorError
from tscomp.graph.views import apply_view

ROW_BLOCK = 64


def a_operand(analysis) -> tuple[AOperand, list]:
    """A's element at (ts_i, ts_k) from the expression IR (fused prologue ops, views of the input),
    and the extra kernel arguments it reads (inputs, shape symbols) beyond the epilogue's."""
    from tscomp.codegen.c_expr import c_symbol_name, delinearize
    from tscomp.codegen.cpu_groups import GroupGenerator
    from tscomp.graph.fusion.expr import Input, walk
    g, h = analysis.group, analysis.heavy
    gen = GroupGenerator(analysis.plan, g)
    gen.reports_index_errors = False
    a = h.args[0]
    ashape = gen.shape(a)
    vi, vk = gen.ctx.var("ts_i", analysis.M), gen.ctx.var("ts_k", analysis.K)
    val = gen.value(a, tuple(delinearize(vi, ashape[:-1], gen.ctx)) + (vk,))
    lines = [ln for ln in gen.root.render(0) if ln.strip()]
    tables, decls = hoist_statics(list(gen.decls))
    stables, _ = hoist_statics(list(gen.statics))
    text = "\n".join(lines + decls)
    taken = {n for n, _ in (SimtEpilogue.from_cpu(analysis.epilogue, a_staged=True).args)}
    dtypes = {x.name: np.dtype(x.dtype) for x in walk([a]) if isinstance(x, Input)}
    params, roles = [], []
    for name, cname in gen.in_c.items():
        if re.search(rf"\b{cname}\[", text) and cname not in taken:
            dt = dtypes.get(name, np.dtype(analysis.plan.graph.values[name].dtype))
            params.append(f", TS_GLOBAL const {gen.ctype(dt)}* TS_RESTRICT {cname}")
            roles.append(("input", name, dt))
    for sym in sorted((x for x in gen.pr.used if x not in gen.ctx.upper_bounds), key=lambda x: x.name):
        if c_symbol_name(sym.name) not in taken:
            params.append(f", const int64_t {c_symbol_name(sym.name)}")
            roles.append(("symbol", sym.name, sym))
    # the A generator's constant tables (k0, k1, ...) must not clash with the epilogue's: rename them
    ren = lambda x: re.sub(r"\bk(\d+)\b", r"ka\1", x)    # noqa: E731
    lines, decls = [ren(x) for x in lines], [ren(x) for x in decls]
    tables, stables, val = [ren(x) for x in tables], [ren(x) for x in stables], ren(val)
    pro = [o.op_type for o in g.prologue_epilogue()[0]]
    label = ("prologue " + ", ".join(pro)) if pro else "views of " + str(analysis.a_input)
    return AOperand(tuple(lines), val, "".join(params), tuple(decls), label), list(dict.fromkeys(tables + stables)), roles


def gemm_program(analysis, t: SimtTile) -> SimtProgram:
    """The source step (pure): the SIMT program of ``analysis`` under ``t``. A is read directly when
    it is a group input in row-major order, else computed while staging (prologue ops, views)."""
    t = t.validate()
    name = kernel_name(analysis.group.name, t)
    staged = bool(analysis.a_prologue or not analysis.a_identity)
    epi = SimtEpilogue.from_cpu(analysis.epilogue, a_staged=staged)
    a_op = None
    if staged:
        a_op, tables, _ = a_operand(analysis)
        epi = replace(epi, tables=tuple(dict.fromkeys(tuple(epi.tables) + tuple(tables))))
    body = gemm_body(name, t, analysis.K, analysis.N, epi, a_op=a_op)
    check_identifiers(body)
    lines = analysis.header(_CpuLabel(t)).strip().strip("/*").strip().splitlines()
    lines = [ln.lstrip(" *") for ln in lines if ln.strip(" *")]
    lines.append("SIMT: local padding while staging (zero-filled out-of-bounds loads), one guarded store; "
                 + ("cp.async double buffering under TS_ASYNC_COPY (sm_80+), plain staging otherwise"
                    if t.async_copy else "plain staging"))
    if epi.row_pass.strip():
        lines.append(f"row pass kernel {name}_rows: one thread per row ({epi.row_label})")
    if t.mma:
        lines.append("tensor cores: wmma m16n16k8 TF32 (inputs rounded to a 10-bit mantissa, fp32 accumulation) "
                     "under TS_MMA (sm_80+); the SIMT inner product otherwise")
    defines = {**({"TS_WANT_ASYNC": 1} if t.async_copy else {}), **({"TS_WANT_MMA": 1} if t.mma else {})}
    return SimtProgram(header_comment(lines), body, defines)


class _CpuLabel:
    """Lets the shared analysis' header print the SIMT tile configuration."""

    def __init__(self, t: SimtTile):
        self.t = t

    def describe(self) -> str:
        return "SIMT " + self.t.describe()


class SimtGemmGroup(KernelBase, SessionRun):
    """Executor of one SIMT gemm-group kernel (the :class:`~tscomp.codegen.kernel.Kernel` contract)."""

    family = "simt-gemm"
    target = "cuda"
    takes_out = False

    def __init__(self, analysis, t: SimtTile, device: str | None = None):
        self.analysis = analysis
        self.group = analysis.group
        self.symtab = analysis.symtab
        try:
            self.cfg = t.validate()
            self.program = gemm_program(analysis, self.cfg)
        except UnsupportedOperatorError as exc:
            raise UnsupportedOperatorError(f"group {analysis.group.name}: {exc}") from None
        self.func = kernel_name(analysis.group.name, self.cfg)
        self.source = self.program.cuda
        self.K, self.N, self.M = analysis.K, analysis.N, analysis.M
        self.weight_name = analysis.weight_name
        self.packed = np.ascontiguousarray(analysis.W, dtype=np.float32)
        self.has_row_pass = analysis.has_row_pass
        self.device = device
        self.a_staged = bool(analysis.a_prologue or not analysis.a_identity)
        self.a_roles = a_operand(analysis)[2] if self.a_staged else []
        self.ptxas: dict = {}          # arch -> {kernel: resources}, filled by the CUDA build
        self.paths_run: set[str] = set()

    # ------------------------------------------------------------------ what the schedule/runtime read
    def resources(self) -> dict[str, int]:
        out = {"threads": self.cfg.threads, "shared_bytes": self.cfg.shared_bytes()}
        for arch, res in sorted(self.ptxas.items()):
            r = res.get(self.func)
            if r is not None:
                out[f"{arch}_registers"] = r.registers
                out[f"{arch}_shared_bytes"] = r.shared_bytes
                out[f"{arch}_spill_bytes"] = r.spill_stores + r.spill_loads
        return out

    def blocks(self, M: int) -> tuple[int, int]:
        return ceil_div(M, self.cfg.bm), ceil_div(self.N, self.cfg.bn)

    def tasks(self, binding: Mapping[str, int]) -> int:
        gm, gn = self.blocks(int(self.symtab.evaluate(self.M, dict(binding))))
        return gm * gn

    # ------------------------------------------------------------------ launch
    def _launches(self, env, binding):
        """(launches, output Buffers): the grid from M and the tile, the arguments in kernel order;
        inputs may be device values of a plan run (DeviceArray). ``launches`` (SessionRun) gives the
        outputs as host arrays."""
        an, plain = self.analysis, dict(binding)

        def ev(x) -> int:
            return int(self.symtab.evaluate(x, plain))

        M = ev(self.M)
        if self.a_staged:      # computed while staging from the inputs passed after the epilogue's
            A = input_buffer(np.zeros(1, np.float32), np.float32)
        else:
            a = np.asanyarray(env[an.a_input])   # a device value stays one: its views here keep the layout
            for v in an.a_chain:
                a = apply_view(a, v.op, ev)
            if a.dtype != np.float32:
                raise ExecutionError(f"group {self.group.name}: A operand {an.a_input!r} is {a.dtype}, "
                                     f"expected float32")
            A = input_buffer(a.reshape(M, self.K), np.float32)
        outputs = {name: output_buffer(tuple(ev(d) for d in shape), np.float32)
                   for name, shape in an.out_shapes.items()}
        Y = outputs[an.y_output] if an.y_output is not None else Buffer(np.empty((M, self.N), np.float32), False)
        extra = []
        for role, name, info in an.arg_roles:
            if role == "input":
                extra.append(input_buffer(env[name], info))
            elif role == "output":
                extra.append(outputs[name])
            else:
                extra.append(scalar(ev(info)))
        a_extra = [input_buffer(env[name], info) if role == "input" else scalar(ev(info))
                   for role, name, info in self.a_roles]
        gm, gn = self.blocks(M)
        launches = [Launch(self.func, (gm, gn, 1), (self.cfg.threads, 1, 1),
                           [A, resident_buffer(self.packed, np.float32), Y, scalar(M), *extra, *a_extra])]
        if self.has_row_pass:
            Y.download = True
            launches.append(Launch(self.func + "_rows", (ceil_div(M, ROW_BLOCK), 1, 1), (ROW_BLOCK, 1, 1),
                                   [Y, scalar(M), *extra]))
        return launches, outputs

    def run_in(self, session, env, binding) -> dict[str, np.ndarray]:
        """Inside a plan run's device session: outputs stay on the device (DeviceArray)."""
        launches, outputs = self._launches(env, binding)
        self.program.run_in(session, launches, session.device.name, getattr(self, "cubin", None))
        self._note_path(session.device.name)
        return {name: device_array(b) for name, b in outputs.items()}

    def _note_path(self, ran_on: str) -> None:
        # the cp.async staging is compiled in for sm_80+ only (OpenCL renders the plain path)
        self.__dict__.setdefault("paths_run", set()).add("async" if self.cfg.async_copy and ran_on == "cuda" else "plain")

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]:
        launches, outputs = self.launches(env, binding)
        self._note_path(self.program.run(launches, self.device, getattr(self, "cubin", None)))
        return outputs

    __call__ = run


def heuristic_tiles(analysis, target=None, limit: int = 2) -> list[SimtTile]:
    """A large-M tile and a small-M tile (the analytic ranking of :mod:`tscomp.schedule.gpu_space`
    replaces this where the schedule stage runs)."""
    async_ok = target is None or getattr(getattr(target, "spec", None), "cp_async", True)
    tiles = [SimtTile(64, 64, 16, 32, 32, 4, 8, async_copy=async_ok), SimtTile(32, 64, 16, 16, 32, 2, 8)]
    return tiles[:limit]


def build_simt_gemm(analysis, t: SimtTile) -> SimtGemmGroup:
    try:
        return SimtGemmGroup(analysis, t)
    except UnsupportedOperatorError as exc:
        raise UnsupportedOperatorError(f"group {analysis.group.name}: {exc}") from None


__all__ = ["SimtGemmGroup", "build_simt_gemm", "gemm_program", "heuristic_tiles"]
