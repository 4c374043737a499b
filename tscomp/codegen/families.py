"""Macro-kernel families for the CPU target, as data: which family compiles which fused group,
and which tile-configuration variants it builds (TSCompiler §5: one parameterized macro-kernel
per group and configuration; §6: the runtime picks among the variants per shape).

A family is tried on a group when the group's kind is one it serves; it either returns built
kernel variants or raises :class:`~tscomp.errors.UnsupportedOperatorError` saying why it does
not apply (the TVM dlight idea: a rule answers "here is a schedule" or "not mine"). The first
family that accepts wins; a group no family accepts runs on the numpy fallback
(:class:`~tscomp.codegen.interpreted.InterpretedGroup`) carrying every family's reason.

Every kernel object, whatever its family, offers the same small contract to the runtime:
``run(env, binding) -> outputs``, ``tasks(binding)`` (parallel tile tasks, for the wave model),
``func``/``source`` (entry point and C text; ``None`` for the fallback), ``cfg`` (tile config or
``None``), ``_bind_function(lib)`` (re-attach the entry point from the artifact's library after
unpickling).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tscomp.codegen.interpreted import InterpretedGroup
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.plan import Group, Plan


#: tile-configuration variants compiled per GEMM group. On BERT-base, 4 ran 2-10% faster than 3 at
#: L = 39..300 in one side-by-side comparison (the two sets were timed at different moments, so part
#: of that is measurement noise); compile time grows by about a third
DEFAULT_VARIANTS = 4


@dataclass(frozen=True)
class KernelFamily:
    name: str
    kinds: tuple[str, ...]                                   # group kinds it may accept
    variants: Callable[[Plan, Group, str, int], list]        # (plan, group, isa, max_variants) -> kernels


def _gemm(plan: Plan, group: Group, isa: str, max_variants: int) -> list:
    from tscomp.codegen.cpu_gemm_group import CompiledGemmGroup, candidate_configs_for
    first = CompiledGemmGroup(plan, group, isa=isa)
    out = [first]
    for cfg in candidate_configs_for(first, isa, limit=max_variants + 1):
        if cfg != first.cfg and len(out) < max_variants:
            out.append(CompiledGemmGroup(plan, group, cfg, isa=isa))
    return out


def _batched_gemm(plan: Plan, group: Group, isa: str, max_variants: int) -> list:
    from tscomp.codegen.cpu_batched_gemm import CompiledBatchedGemmGroup
    first = CompiledBatchedGemmGroup(plan, group, isa=isa)
    out = [first]
    for cfg in CompiledBatchedGemmGroup.candidate_configs(plan, group, isa=isa):
        if cfg != first.cfg and len(out) < max_variants:
            out.append(CompiledBatchedGemmGroup(plan, group, cfg, isa=isa))
    return out


def _row_or_elementwise(plan: Plan, group: Group, isa: str, max_variants: int) -> list:
    from tscomp.codegen.cpu_groups import CompiledGroup
    return [CompiledGroup.build(plan, group)]


FAMILIES: tuple[KernelFamily, ...] = (
    KernelFamily("gemm", ("gemm",), _gemm),
    KernelFamily("batched-gemm", ("gemm",), _batched_gemm),
    KernelFamily("row-or-elementwise", ("elementwise", "reduce"), _row_or_elementwise),
)


def kernels_for_group(plan: Plan, group: Group, *, isa: str, max_variants: int = DEFAULT_VARIANTS) -> list:
    """Built kernel variants for ``group`` from the first family that accepts it, else the numpy
    fallback with the reasons."""
    reasons = []
    for fam in FAMILIES:
        if group.kind not in fam.kinds:
            continue
        try:
            kernels = fam.variants(plan, group, isa, max_variants)
        except UnsupportedOperatorError as exc:
            reasons.append(f"{fam.name}: {exc}")
            continue
        unique = {}
        for k in kernels:   # two requested configs may come out as one kernel (e.g. N blocking forced)
            k.family = fam.name
            unique.setdefault(k.func, k)
        return list(unique.values())
    if not reasons:
        reasons.append(f"no CPU macro-kernel family for {group.kind} groups")
    return [InterpretedGroup(plan, group, reasons)]


__all__ = ["DEFAULT_VARIANTS", "FAMILIES", "KernelFamily", "kernels_for_group"]
