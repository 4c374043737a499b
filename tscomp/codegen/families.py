"""Macro-kernel families, as data: which family compiles which fused group, and the four steps
each family is made of (DESIGN.md, "Kernel family"; TSCompiler §5: one parameterized macro-kernel
per group and configuration; §6: the runtime picks among the variants per shape).

    analysis   (plan, group) -> analysis            target-neutral facts; raises "not mine, because ..."
    space      (analysis, target) -> DiscreteSpace   the configurations worth searching (None: none)
    source     (analysis, config, target) -> kernel  the executor with its C text, nothing compiled
    link       (kernel) -> kernel                    compile (cached by content), load, bind

A family is tried on a group when the group's kind is one it serves; the first whose analysis
accepts wins (the TVM dlight idea: a rule answers "here is a schedule" or "not mine"). A group no
family accepts runs on the numpy fallback (:class:`~tscomp.codegen.interpreted.InterpretedGroup`)
carrying every family's reason. Every executor satisfies :class:`~tscomp.codegen.kernel.Kernel`.

Precision (issue 13) is a field of the :class:`~tscomp.schedule.target.Target` each step is handed:
the ``gemm`` family (constant weights) generates, builds and packs bf16 kernels when
``target.precision == "bf16"``, and on a CPU with AMX tiles (``target.gemm_isa == "amx"``) so does the
fused ``attention`` family (QKᵀ and P·V on the tiles, the softmax in fp32); every other family
(batched GEMMs of two activations, Conv, rows, elementwise, pooling) stays fp32 at any precision
(:func:`bf16_families`). Independently of ``--precision``, a quantized model's GEMMs and
implicit-GEMM Convs of small-integer operands run on int8 instructions where the CPU has them
(:func:`gemm_target`, :func:`conv_target`).

``attention`` groups (QKᵀ → softmax → P·V merged by :mod:`tscomp.graph.fusion.attention`) are the
attention family's alone; one it refuses is split back into its parts before families are chosen
again (:func:`tscomp.compiler.choose_families`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tscomp.codegen.interpreted import InterpretedGroup
from tscomp.errors import UnsupportedOperatorError
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.schedule.target import CpuSpec, Target

#: tile-configuration variants kept per GEMM group. On BERT-base, 4 ran 2-10% faster than 3 at
#: L = 39..300 in one side-by-side comparison (the two sets were timed at different moments, so part
#: of that is measurement noise); compile time grows by about a third
DEFAULT_VARIANTS = 4
#: the families whose kernels honour ``Target.precision == "bf16"`` (the attention family only on AMX
#: tiles, see :func:`bf16_families`); the others compute in fp32
BF16_FAMILIES = ("gemm", "attention")


def bf16_families(target: Target) -> tuple[str, ...]:
    """The families that compute in bf16 for ``target`` at ``--precision bf16``: the constant-weight
    GEMMs everywhere (VDPBF16PS or AMX), the fused attention where the GEMMs run on AMX tiles (with
    VDPBF16PS only, below the fp32 FMA rate on some CPUs, bf16 attention would not pay)."""
    return BF16_FAMILIES if target.precision == "bf16" and target.gemm_isa == "amx" else ("gemm",)   # (int8 tiles: GEMMs only)


@dataclass(frozen=True)
class KernelFamily:
    name: str
    kinds: tuple[str, ...]                                      # group kinds it may accept
    analyze: Callable[[Plan, Group], Any]
    executor: Callable[[Any, Any, Target], Any]                 # unbuilt kernel: .func, .source
    link: Callable[[Any], Any]                                  # build and bind it
    heuristic: Callable[[Any, Target, int], list]               # configurations without tuning
    space: Callable[[Any, Target], Any] | None = None           # None: nothing to tune
    #: configurations of the family's other algorithms for a group (a 3x3 Conv's Winograd kernel):
    #: never tuned, they join every schedule of the group and the dispatch measures them per shape
    strategies: Callable[[Any, Target], list] | None = None

    @property
    def tunable(self) -> bool:
        return self.space is not None

    def source(self, analysis, config, target: Target) -> str:
        """C text of ``analysis`` under ``config`` (pure: nothing is compiled)."""
        return self.executor(analysis, config, target).source

    def build(self, analysis, config, target: Target):
        return self.link(self.executor(analysis, config, target))


def link_native(kernel):
    """Compile a kernel's source (object cache by content), load it, bind its entry point."""
    from tscomp.codegen.build import build_library, load_library

    path = str(build_library(kernel.source, kernel.func))
    lib = _LIBS.get(path)
    if lib is None:
        lib = _LIBS[path] = load_library(path)
    kernel._bind_function(lib)
    return kernel


_LIBS: dict = {}


# ---------------------------------------------------------------------------- gemm (constant weight)
def _gemm_analyze(plan, group):
    from tscomp.codegen.cpu_gemm_group import GemmGroupAnalysis
    return GemmGroupAnalysis(plan, group)


def gemm_target(analysis, target: Target) -> Target:
    """The target a GEMM group is generated for: ``target``, except that a group whose operands are
    all small integers (a quantized model's MatMulInteger or QDQ MatMul, computed in float) runs its
    inner products on integer or bf16 instructions where the CPU has them: int8 (VPDPBUSD, or AMX's
    TDPBUSD where the tiles have int8; exact int32 sums, four times the fp32 rate) where A spans at
    most 256 values and W fits a signed byte, else
    bf16 (every product and sum what fp32 gives, at twice the rate)."""
    order = (("int8", getattr(analysis, "int8_x_offset", None) is not None),
             ("bf16", getattr(analysis, "exact_in_bf16", False)))
    spec = target.spec
    if getattr(spec, "amx", False) and not getattr(spec, "amx_int8", False):
        # AMX's bf16 tiles multiply at several times VPDPBUSD's rate (measured before on a Sapphire
        # Rapids): bf16 first on a CPU whose tiles do bf16 only. Where they do int8 too (TDPBUSD, twice
        # the bf16 tiles' rate on half the weight bytes), int8 stays first: Target.gemm_isa puts it there
        order = order[::-1]
    return _integer_operand_target(target, order)


def _integer_operand_target(target: Target, order) -> Target:
    """``target`` at the first precision of ``order`` ((precision, the operands fit it), ...) that
    the CPU runs; ``target`` itself where it asks for another precision than fp32 or none fits."""
    from tscomp.schedule.target import TargetError
    if target.precision != "fp32":
        return target
    for precision in (p for p, fits in order if fits):
        try:
            return target.with_precision(precision)
        except TargetError:        # this CPU lacks the instructions: the next, or fp32 as asked
            continue
    return target


def _gemm_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_gemm_group import CompiledGemmGroup, gemm_group_source
    target = gemm_target(analysis, target)
    isa = target.gemm_isa          # bf16 on a CPU with AMX: the tile unit
    l1 = target.spec.l1 if isinstance(target.spec, CpuSpec) else None
    return CompiledGemmGroup(analysis, cfg, isa, gemm_group_source(analysis, cfg, isa, target.precision, l1),
                             target.precision)


def _gemm_heuristic(analysis, target: Target, limit: int) -> list:
    from tscomp.codegen.cpu_gemm_group import candidate_configs_for
    return candidate_configs_for(analysis, gemm_target(analysis, target).gemm_isa, limit=limit)


def _gemm_space(analysis, target: Target):
    from tscomp.schedule.gemm_space import GemmSpace
    target = gemm_target(analysis, target)
    return GemmSpace(analysis.K, analysis.N, target, m_max=_upper(analysis.symtab, analysis.M))


# ---------------------------------------------------------------------------- batched gemm (attention)
def _batched_analyze(plan, group):
    from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis
    return BatchedGemmAnalysis(plan, group)


def _batched_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_batched_gemm import CompiledBatchedGemmGroup
    return CompiledBatchedGemmGroup(analysis, cfg, target.isa)


def _batched_heuristic(analysis, target: Target, limit: int) -> list:
    return analysis.heuristic_configs(target.isa)[:limit]


def _batched_space(analysis, target: Target):
    from tscomp.schedule.gemm_space import BatchedGemmSpace
    return BatchedGemmSpace(*analysis.static_extents(), target)


# ---------------------------------------------------------------------------- attention (QKᵀ, softmax, P·V fused)
def _attention_analyze(plan, group):
    from tscomp.codegen.cpu_attention import AttentionAnalysis
    return AttentionAnalysis(plan, group)


def _attention_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_attention import CompiledAttention
    return CompiledAttention(analysis, cfg, attention_isa(target))


def attention_isa(target: Target) -> str:
    """The fused attention's instruction set on ``target``: ``amx`` where it computes in bf16 on the
    tiles (:func:`bf16_families`), else the SIMD ISA."""
    return "amx" if "attention" in bf16_families(target) else target.isa


def _attention_heuristic(analysis, target: Target, limit: int) -> list:
    return analysis.heuristic_configs(attention_isa(target), limit, l2=target.spec.l2)


def _attention_space(analysis, target: Target):
    from tscomp.schedule.attention_space import AttentionSpace
    return AttentionSpace(analysis, target)


# ---------------------------------------------------------------------------- row / elementwise
def _rows_analyze(plan, group):
    from tscomp.codegen.cpu_groups import generate_group
    return generate_group(plan, group)      # one loop nest per group: analysis and source at once


def _rows_executor(analysis, cfg, target: Target):
    return analysis          # the generated KernelSource: .func, .source


def _rows_link(source):
    from tscomp.codegen.cpu_groups import CompiledGroup
    return CompiledGroup(source)


def _no_configs(analysis, target: Target, limit: int) -> list:
    return [None]


# ---------------------------------------------------------------------------- index (one opaque op, issue 11)
def _index_analyze(plan, group):
    from tscomp.codegen.cpu_index import analyze_index_group
    return analyze_index_group(plan, group)


def _index_link(source):
    from tscomp.codegen.cpu_index import link_index_kernel
    return link_index_kernel(source)


# ---------------------------------------------------------------------------- conv and pooling (issue 11)
def _conv_analyze(plan, group):
    from tscomp.codegen.cpu_conv import ConvAnalysis
    return ConvAnalysis(plan, group)


def _depthwise_analyze(plan, group):
    from tscomp.codegen.cpu_conv import DepthwiseAnalysis
    return DepthwiseAnalysis(plan, group)


def conv_target(analysis, target: Target) -> Target:
    """The target an implicit-GEMM Conv group is generated for: ``target``, except that a Conv of
    two small-integer operands (a quantized model's QDQ / QOperator Conv, computed in float) runs on
    int8 instructions (VPDPBUSD, or TDPBUSD where the CPU's AMX tiles do int8; exact int32 sums)
    where the CPU has them and the operands fit (:func:`tscomp.codegen.cpu_conv_int8.conv_int8_x_offset`)."""
    return _integer_operand_target(target, (("int8", getattr(analysis, "int8_x_offset", None) is not None),))


def conv_tile_isa(target: Target) -> str:
    """The instruction set of a Conv group's implicit-GEMM tiles with the lanes along the positions:
    the AMX tiles for int8 where they do int8 (:attr:`Target.gemm_isa`), else the SIMD ISA. Its
    other variants (Winograd, row vectors) compute in fp32 on the SIMD ISA."""
    return target.gemm_isa if target.precision == "int8" else target.isa


def _conv_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_conv import CompiledConv
    from tscomp.codegen.tile_config import TileConfig
    target = conv_target(analysis, target)
    column_tiles = isinstance(cfg, TileConfig) and cfg.vector_axis == 1 and not cfg.planes   # (planes: fp32 SIMD)
    return CompiledConv(analysis, cfg, conv_tile_isa(target) if column_tiles else target.isa, target.spec.l1,
                        target.precision)


def _depthwise_heuristic(analysis, target: Target, limit: int) -> list:
    """The two depthwise strategies: lanes along the positions (None, the direct kernel) and, where
    the ISA has vectors, along the channels; the runtime picks per shape between them."""
    from tscomp.codegen.cpu_depthwise_channels import channel_blocks_config
    blocked = channel_blocks_config(target.isa, target.spec.l2) if isinstance(target.spec, CpuSpec) else None
    return ([None] + ([blocked] if blocked is not None else []))[:max(1, limit)]


def _cpu_caches(target: Target):
    from tscomp.codegen.tile_config import CacheSizes
    s = target.spec
    return CacheSizes(l1=s.l1, l2=s.l2, l3=s.l3)


def _conv_heuristic(analysis, target: Target, limit: int) -> list:
    caches = _cpu_caches(target)
    int8 = conv_target(analysis, target)
    if int8.precision == "int8":     # int8 tiles run their lanes along the positions
        return [c for c in analysis.heuristic_configs(conv_tile_isa(int8), None, caches=caches)
                if c.vector_axis == 1][:limit]
    return analysis.heuristic_configs(target.isa, limit, caches=caches)


def _conv_strategies(analysis, target: Target) -> list:
    from tscomp.codegen.cpu_conv import plane_configs
    from tscomp.codegen.cpu_conv_winograd import winograd_configs
    if not isinstance(target.spec, CpuSpec):
        return []
    # the padded planes are fp32 tiles: an int8 Conv keeps its integer tiles (Winograd, whose 2.25x
    # fewer multiply-adds compete with them, stays offered)
    planes = [] if conv_target(analysis, target).precision == "int8" else \
        plane_configs(target.isa, analysis, _cpu_caches(target))
    return winograd_configs(target.isa, analysis) + planes


def _conv_space(analysis, target: Target):
    from tscomp.schedule.conv_space import ConvSpace
    return ConvSpace(analysis.OCg, analysis.K, conv_target(analysis, target))


def _conv_transpose_analyze(plan, group):
    from tscomp.codegen.cpu_conv_transpose import ConvTransposeAnalysis
    return ConvTransposeAnalysis(plan, group)


def _conv_transpose_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_conv_transpose import CompiledConvTranspose
    return CompiledConvTranspose(analysis, target.isa)


def _pool_analyze(plan, group):
    from tscomp.codegen.cpu_pool import PoolAnalysis
    return PoolAnalysis(plan, group)


def _pool_executor(analysis, cfg, target: Target):
    from tscomp.codegen.cpu_pool import CompiledPool
    return CompiledPool(analysis, target.isa)


def _upper(symtab, expr) -> int | None:
    """An expression's upper bound under the symbol ranges, or None if unbounded."""
    import math
    hi = symtab.bounds(expr)[1]
    return int(hi) if math.isfinite(hi) else None


FAMILIES: tuple[KernelFamily, ...] = (
    KernelFamily("gemm", ("gemm",), _gemm_analyze, _gemm_executor, link_native, _gemm_heuristic, _gemm_space),
    KernelFamily("batched-gemm", ("gemm",), _batched_analyze, _batched_executor, link_native, _batched_heuristic,
                 _batched_space),
    KernelFamily("attention", ("attention",), _attention_analyze, _attention_executor, link_native,
                 _attention_heuristic, _attention_space),
    KernelFamily("row-or-elementwise", ("elementwise", "reduce"), _rows_analyze, _rows_executor, _rows_link,
                 _no_configs),
    KernelFamily("index", ("opaque", "reduce"), _index_analyze, _rows_executor, _index_link, _no_configs),
    KernelFamily("conv", ("gemm",), _conv_analyze, _conv_executor, link_native, _conv_heuristic, _conv_space,
                 _conv_strategies),
    KernelFamily("conv-depthwise", ("gemm",), _depthwise_analyze, _conv_executor, link_native,
                 _depthwise_heuristic),
    KernelFamily("conv-transpose", ("gemm",), _conv_transpose_analyze, _conv_transpose_executor, link_native,
                 _no_configs),
    KernelFamily("pool", ("opaque", "reduce"), _pool_analyze, _pool_executor, link_native, _no_configs),
)


@dataclass
class FamilyChoice:
    """Which family took a group and its analysis, or why none did."""
    group: Group
    family: KernelFamily | None
    analysis: Any = None
    reasons: tuple[str, ...] = ()


def choose_family(plan: Plan, group: Group) -> FamilyChoice:
    """The first family whose analysis accepts ``group``; else every family's reason."""
    reasons = []
    for fam in FAMILIES:
        if group.kind not in fam.kinds:
            continue
        try:
            return FamilyChoice(group, fam, fam.analyze(plan, group))
        except UnsupportedOperatorError as exc:
            reasons.append(f"{fam.name}: {exc}")
    if not reasons:
        reasons.append(f"no CPU macro-kernel family for {group.kind} groups")
    return FamilyChoice(group, None, None, tuple(reasons))


def fallback_kernel(plan: Plan, choice: FamilyChoice) -> InterpretedGroup:
    return InterpretedGroup(plan, choice.group, list(choice.reasons))


def kernels_for_group(plan: Plan, group: Group, *, target: Target | None = None, isa: str | None = None,
                      max_variants: int = DEFAULT_VARIANTS) -> list:
    """Built kernel variants for ``group`` from its family's heuristic configurations (no tuning),
    else the numpy fallback with the reasons."""
    from tscomp.schedule.target import host_cpu

    target = target or host_cpu(isa=isa)
    choice = choose_family(plan, group)
    if choice.family is None:
        return [fallback_kernel(plan, choice)]
    fam = choice.family
    unique: dict = {}
    for cfg in fam.heuristic(choice.analysis, target, max_variants):
        try:
            k = fam.build(choice.analysis, cfg, target)
        except UnsupportedOperatorError:
            if not unique:
                raise
            continue
        unique.setdefault(k.func, k)   # two configs may come out as one kernel
    return list(unique.values())


__all__ = ["BF16_FAMILIES", "attention_isa", "bf16_families", "DEFAULT_VARIANTS", "FAMILIES", "FamilyChoice", "KernelFamily", "choose_family", "fallback_kernel",
           "kernels_for_group", "link_native"]
