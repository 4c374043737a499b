"""The SIMT kernel families (the CUDA target's counterpart of :mod:`tscomp.codegen.families`): which
family compiles which fused group, from the same target-neutral analyses as the CPU families, and a
whole-Plan executor on a SIMT device (DESIGN.md "Kernel family", "runtime": opencl | cuda).

    simt-gemm                 constant-weight MatMul/Gemm + fused epilogue (+ row pass)
    simt-batched-gemm         two activation operands (QKᵀ, PV), prologue while staging
    simt-conv                 Conv as an implicit GEMM, im2col gathered while staging
    simt-row-or-elementwise   elementwise/injective groups and row reductions
    simt-index                one opaque index op (Resize, CumSum, Range, Pad, Scatter*, ...) from
                              the op's registry writer (:mod:`.index`)

A group none accepts runs on the numpy fallback with every family's reason (the same rule as the
CPU target). :func:`simt_kernels` builds nothing but text; :func:`build_cuda` compiles every
kernel with nvcc for the requested architectures and records ptxas resources on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from tscomp.codegen.interpreted import InterpretedGroup
from tscomp.codegen.simt.launch import Buffer, DeviceArray, DeviceValueError, device_array
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.plan import Group, Plan


@dataclass(frozen=True)
class SimtFamily:
    name: str
    kinds: tuple[str, ...]
    build: Callable[[Plan, Group, object], object]     # (plan, group, tile or None) -> SIMT executor


def _gemm(plan, group, tile):
    from tscomp.codegen.cpu_gemm_group import GemmGroupAnalysis
    from tscomp.codegen.simt.gemm_group import SimtGemmGroup, heuristic_tiles
    return SimtGemmGroup(GemmGroupAnalysis(plan, group), tile or heuristic_tiles(None)[0])


def _batched(plan, group, tile):
    from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis
    from tscomp.codegen.simt.batched import DEFAULT_TILE, SimtBatchedGemm
    return SimtBatchedGemm(BatchedGemmAnalysis(plan, group), tile or DEFAULT_TILE)


def _conv(plan, group, tile):
    from tscomp.codegen.cpu_conv import ConvAnalysis
    from tscomp.codegen.simt.conv import DEFAULT_TILE, SimtConv
    return SimtConv(ConvAnalysis(plan, group), tile or DEFAULT_TILE)


def _rows(plan, group, tile):
    from tscomp.codegen.simt.groups import SimtGroup, simt_group_source
    return SimtGroup(simt_group_source(plan, group))


def _index(plan, group, tile):
    from tscomp.codegen.simt.index import SimtIndexGroup, simt_index_source
    return SimtIndexGroup(simt_index_source(plan, group))


SIMT_FAMILIES: tuple[SimtFamily, ...] = (
    SimtFamily("simt-gemm", ("gemm",), _gemm),
    SimtFamily("simt-batched-gemm", ("gemm",), _batched),
    SimtFamily("simt-conv", ("gemm",), _conv),
    SimtFamily("simt-row-or-elementwise", ("elementwise", "reduce"), _rows),
    SimtFamily("simt-index", ("opaque", "reduce"), _index),
)


def simt_kernel_for_group(plan: Plan, group: Group, tile=None, device: str | None = None):
    """The first SIMT family's executor for ``group``, else the numpy fallback with every reason."""
    reasons = []
    for fam in SIMT_FAMILIES:
        if group.kind not in fam.kinds:
            continue
        try:
            k = fam.build(plan, group, tile)
            k.device = device
            return k
        except UnsupportedOperatorError as exc:
            reasons.append(f"{fam.name}: {exc}")
    if not reasons:
        reasons.append(f"no SIMT macro-kernel family for {group.kind} groups")
    return InterpretedGroup(plan, group, reasons)


def simt_kernels(plan: Plan, device: str | None = None) -> dict[str, object]:
    return {g.name: simt_kernel_for_group(plan, g, device=device) for g in plan.groups}


def build_cuda(kernels: Mapping[str, object], archs=("sm_80", "sm_90")) -> dict[str, dict]:
    """nvcc every SIMT kernel for ``archs``: {group: {arch: {kernel: resources}}} (also stored on
    each kernel's ``ptxas``); raises :class:`~tscomp.codegen.nvcc.NvccError` on a failed build."""
    from tscomp.codegen.nvcc import compile_cubin
    out = {}
    for name, k in kernels.items():
        if k.target != "cuda":
            continue
        for arch in archs:
            b = compile_cubin(k.source, arch)
            k.ptxas[arch] = b.resources
            out.setdefault(name, {})[arch] = {kn: r.to_json() for kn, r in b.resources.items()}
    return out


def choose_variant(variants: list, binding: Mapping[str, int]):
    """The wave model's pick among a group's compiled variants (TSCompiler §6): for SIMT GEMMs timed
    on a GPU at compile time, their measured times interpolated at the concrete M; else the
    analytic cost (waves × single-block time, registers from ptxas) at M; else the first."""
    if len(variants) == 1:
        return variants[0]
    from tscomp.schedule.gpu_space import gemm_cost
    from tscomp.schedule.target import cuda
    if all(getattr(k, "measured_ms", None) for k in variants):
        from tscomp.schedule.gpu_measure import estimate_ms
        M = int(variants[0].symtab.evaluate(variants[0].M, dict(binding)))
        return min(variants, key=lambda k: estimate_ms(k.measured_ms, M))

    def cost(k):
        arch = getattr(k, "wave_arch", None) or "sm_80"
        res = k.ptxas.get(arch, {}).get(k.func)
        M = int(k.symtab.evaluate(k.M, dict(binding)))
        return gemm_cost(cuda(arch).spec, k.cfg, M, k.K, k.N, res.registers if res else None)
    return min(variants, key=cost)


class SimtPlanRunner:
    """Runs a Plan group by group with SIMT kernels on a device (the numpy fallback where a group has
    none); ``kernels`` maps a group to its kernel or its list of variants (picked per shape by
    :func:`choose_variant`); ``families_run`` records which family ran each group, ``variants_run``
    which kernel."""

    def __init__(self, plan: Plan, kernels: Mapping[str, object] | None = None, device: str | None = None):
        from tscomp.runtime.device_opencl import default_device_name
        device = default_device_name() if device is None else device
        self.device = device
        self.last_transfers: dict = {}
        self._constants: dict = {}
        self.plan = plan
        kernels = dict(kernels) if kernels is not None else simt_kernels(plan, device)
        self.variants = {g: (list(k) if isinstance(k, (list, tuple)) else [k]) for g, k in kernels.items()}
        self.kernels = {g: v[0] for g, v in self.variants.items()}
        for vs in self.variants.values():
            for k in vs:
                if k.target == "cuda":
                    k.device = device
        self.families_run: dict[str, str] = {}
        self.variants_run: dict[str, set] = {}

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference, inside one device session: a group whose kernel can run there (``run_in``)
        leaves its outputs on the device for the next; graph constants are resident device values
        (uploaded once); values a host step needs (the numpy fallback, a kernel without ``run_in``,
        an input it would convert) and the graph's outputs are read back. ``last_transfers``:
        the run's uploads and downloads."""
        from tscomp.graph.reference import bind_symbols, materialize
        from tscomp.runtime.device_opencl import device as get_device
        graph = self.plan.graph
        binding = bind_symbols(graph, inputs)
        env = dict(inputs)
        last_use = self._last_use()
        with get_device(self.device).session() as session:
            for i, g in enumerate(self.plan.groups):
                for name in g.inputs:
                    if name not in env:
                        v = graph.values[name]
                        env[name] = self._constant(name, v.const) if v.const is not None else \
                            materialize(graph, v, binding)
                k = choose_variant(self.variants[g.name], binding)
                env.update(self._run_group(session, k, {n: env[n] for n in g.inputs}, binding))
                for n in g.inputs:          # device values no later group reads: their memory is reused
                    v = env.get(n)
                    if last_use.get(n) == i and isinstance(v, DeviceArray) and v.buffer is not None \
                            and not v.buffer.resident:
                        session.release(v.buffer)
                        del env[n]
                self.families_run[g.name] = k.family
                self.variants_run.setdefault(g.name, set()).add(k.func)
            out = {}
            for name in graph.outputs:
                v = env[name] if name in env else materialize(graph, graph.values[name], binding)
                out[name] = _on_host(session, v)
            self.last_transfers = dict(session.stats)
        return out

    def _last_use(self) -> dict[str, int]:
        """Value name -> the index of the last group reading it (graph outputs: never released)."""
        last = self.__dict__.get("_last")
        if last is None:
            last = {n: i for i, g in enumerate(self.plan.groups) for n in g.inputs}
            for n in self.plan.graph.outputs:
                last[n] = len(self.plan.groups)
            self._last = last
        return last

    def _constant(self, name: str, const: np.ndarray):
        """A graph constant as a resident device value (uploaded once per device; its host contents
        valid too), the same array object every call."""
        held = self._constants.get(name)
        if held is None:
            arr = np.ascontiguousarray(const)
            held = self._constants[name] = device_array(Buffer(arr, resident=True)) if arr.size else arr
        return held

    def _run_group(self, session, k, ins: dict, binding) -> dict:
        if getattr(k, "run_in", None) is not None and getattr(k, "target", None) == "cuda":
            try:
                return k.run_in(session, ins, binding)
            except DeviceValueError:    # an input it would convert or move on the host: run it there
                session.stats["host_steps"] += 1
        return k.run({n: _on_host(session, v) for n, v in ins.items()}, binding)


def _on_host(session, v):
    """A plain host array of ``v``: a device value is read back first (once per buffer per run)."""
    if isinstance(v, DeviceArray) and v.buffer is not None:
        if id(v.buffer) not in session.fetched:
            session.fetch(v.buffer)
        return np.asarray(v)
    return v


__all__ = ["SIMT_FAMILIES", "SimtFamily", "SimtPlanRunner", "choose_variant", "build_cuda", "simt_kernel_for_group", "simt_kernels"]
