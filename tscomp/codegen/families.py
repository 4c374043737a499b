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
from tscomp.codegen.tile_config import REGISTER_TILES, candidate_configs
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.plan import Group, Plan


@dataclass(frozen=True)
class KernelFamily:
    name: str
    kinds: tuple[str, ...]                                   # group kinds it may accept
    variants: Callable[[Plan, Group, str, int], list]        # (plan, group, isa, max_variants) -> kernels


def _gemm_variant_configs(isa: str, K: int, N: int, max_variants: int) -> list:
    """A spread of the hardware-aligned candidates: the large-M default, the same register tile
    with N cut finer (more tasks for mid-size M), and the first small-M tile (M of a few rows).
    Measuring all ~15 candidates per group is the tuner's job (schedule/), not the compiler's."""
    cands = candidate_configs(isa, K, N)
    small = {tuple(t) for t in REGISTER_TILES[isa]["small"]}
    large_m = [c for c in cands if (c.mr, c.nr) not in small]
    small_m = [c for c in cands if (c.mr, c.nr) in small]
    picks: list = []

    def add(cfg):
        if cfg not in picks:
            picks.append(cfg)

    if large_m:
        add(large_m[0])
        add(min((c for c in large_m if (c.mr, c.nr) == (large_m[0].mr, large_m[0].nr)), key=lambda c: c.nc))
    if small_m:
        add(small_m[0])
    for c in cands:
        add(c)
    return picks[:max(1, max_variants)]


def _gemm(plan: Plan, group: Group, isa: str, max_variants: int) -> list:
    from tscomp.codegen.cpu_gemm_group import CompiledGemmGroup
    first = CompiledGemmGroup(plan, group, isa=isa)
    out = [first]
    for cfg in _gemm_variant_configs(isa, first.K, first.N, max_variants):
        if cfg != first.cfg and len(out) < max_variants:
            out.append(CompiledGemmGroup(plan, group, cfg, isa=isa))
    return out


def _batched_gemm(plan: Plan, group: Group, isa: str, max_variants: int) -> list:
    try:
        from tscomp.codegen.cpu_batched_gemm import CompiledBatchedGemmGroup
    except ImportError as exc:  # pragma: no cover - the family is optional while it is being built
        raise UnsupportedOperatorError(f"group {group.name}: batched GEMM family unavailable ({exc})")
    first = CompiledBatchedGemmGroup(plan, group, isa=isa)
    out = [first]
    configs = getattr(first, "variant_configs", lambda n: [])(max_variants)
    for cfg in configs:
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


def kernels_for_group(plan: Plan, group: Group, *, isa: str, max_variants: int = 3) -> list:
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


__all__ = ["FAMILIES", "KernelFamily", "kernels_for_group"]
