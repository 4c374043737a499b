"""``tscomp compile``: ONNX model → compiled model (TSCompiler Fig. 2, offline half).

The stages run in order and talk through their output objects only:

1. graph    — import, symbolic shapes, fusion → :class:`~tscomp.graph.fusion.plan.Plan`;
2. families — per group, the kernel family that accepts it and its analysis
   (:func:`tscomp.codegen.families.choose_family`; a group nobody accepts falls back to numpy);
3. schedule — per group and :class:`~tscomp.schedule.target.Target`, the tile configurations to keep
   (:func:`tscomp.schedule.schedules.schedule_plan`: tuned, from a record, or the heuristic);
   then the layouts: which tensors between convolutions are stored channel-blocked
   (:func:`tscomp.codegen.channel_blocking.block_conv_chains`: the analyses learn their layouts,
   a depthwise schedule keeps its channel-blocked configuration);
4. codegen  — every kept configuration's source generated, compiled in parallel, bound;
5. timing   — variants the schedule stage did not measure (heuristic, record) are timed at the
   sample shapes (TSCompiler §6: T_single_wave, the quantity the runtime's wave model scales,
   measured at several occupancies, since a CPU task's time depends on how full its tiles are);
6. copies   — a weight keeps a second packed copy (another register-tile width) only where its
   variants gain at least :data:`~tscomp.runtime.dispatch.COPY_WORTH` by that model
   (:data:`~tscomp.runtime.dispatch.COPY_WORTH_RESIDENT` where the model fits in the last level
   cache: there a switch between copies re-reads one;
   :func:`~tscomp.runtime.dispatch.drop_unworthy_copies`): memory is the price of a copy.

The result is a :class:`CompiledModel`, which :mod:`tscomp.runtime.artifact` writes to disk and the
:class:`~tscomp.runtime.Runtime` executes.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from tscomp.codegen.build import build_object, set_num_threads
from tscomp.codegen.channel_blocking import block_conv_chains
from tscomp.codegen.families import DEFAULT_VARIANTS, FamilyChoice, choose_family, fallback_kernel
from tscomp.codegen.sharing import share_identical_kernels
from tscomp.errors import TscompError, UnsupportedOperatorError
from tscomp.graph import DimSpec, load_model, require_resolved_shapes
from tscomp.graph.onnx_import import refuse_data_dependent_shapes
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.plan import Group, Plan
from tscomp.runtime.dispatch import drop_unworthy_copies
from tscomp.runtime.wave import sample_point
from tscomp.schedule.cold_start import evict_bytes, rotation
from tscomp.schedule.measure import time_case
from tscomp.schedule.samples import DISPATCH_POINTS, group_inputs_at, sample_bindings, shape_size
from tscomp.schedule.schedules import Schedules, TuningOptions, schedule_plan
from tscomp.schedule.target import Target, host_cpu, host_threads

Progress = Callable[[int, int, str], None]


@dataclass
class CompiledModel:
    """Everything the runtime needs: the Plan and, per group (same order), its kernel variants."""
    plan: Plan
    kernels: dict[str, list]                  # group name -> kernel variants (>= 1)
    target: Target
    schedules: Schedules | None = None
    source_model: str = ""
    dims: list[str] = field(default_factory=list)   # the --dim specs it was compiled with
    compile_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def isa(self) -> str:
        return self.target.isa

    @property
    def threads(self) -> int:
        """Thread count the single-wave times were measured with."""
        return self.target.threads

    @property
    def config_source(self) -> str:
        if self.schedules is None:
            return "unknown"
        methods = self.schedules.summary()
        return ", ".join(f"{n} groups {m}" for m, n in sorted(methods.items()))

    def fallback_groups(self) -> list[str]:
        return [g for g, ks in self.kernels.items() if ks[0].target == "numpy"]


def default_threads() -> int:
    return host_threads()


def compile_model(model_path: str, dims: Sequence[DimSpec | str] = (), *, tuning: TuningOptions | None = None,
                  max_variants: int = DEFAULT_VARIANTS, threads: int | None = None, target: Target | None = None,
                  progress: Progress | None = None, log: Callable[[str], None] | None = None,
                  precision: str | None = None) -> CompiledModel:
    """Compile an ONNX model. ``tuning`` None: the families' heuristic configurations (no tuning);
    pass :class:`~tscomp.schedule.schedules.TuningOptions` to tune. ``precision`` (``fp32`` |
    ``bf16``; None: the target's, fp32 by default) sets ``Target.precision``."""
    t0 = time.perf_counter()
    graph = load_model(model_path, dims)
    require_resolved_shapes(graph)
    refuse_data_dependent_shapes(graph)
    plan = fuse(graph)
    model = compile_plan(plan, tuning=tuning, max_variants=max_variants, threads=threads, target=target,
                         progress=progress, log=log, source_model=str(model_path), t0=t0, precision=precision)
    model.dims = [d.text if isinstance(d, DimSpec) else str(d) for d in dims]
    return model


def compile_plan(plan: Plan, *, tuning: TuningOptions | None = None, max_variants: int = DEFAULT_VARIANTS,
                 threads: int | None = None, target: Target | None = None, progress: Progress | None = None,
                 log: Callable[[str], None] | None = None, source_model: str = "",
                 t0: float | None = None, precision: str | None = None) -> CompiledModel:
    t0 = time.perf_counter() if t0 is None else t0
    target = target or host_cpu(threads)
    if precision is not None:
        target = target.with_precision(precision)     # TargetError when this CPU cannot run it
    if target.name != "cpu":
        raise TscompError(f"target {target.key()}: only the cpu target compiles kernels in this tscomp "
                          "(the CUDA target is not built yet)")
    set_num_threads(target.threads)
    plan, choices = choose_families(plan, target)
    options = tuning or TuningOptions(tune=False)
    options.max_variants = max_variants
    schedules = schedule_plan(plan, choices, target, options, log=log)
    blocked = block_conv_chains(plan, choices, schedules, target)
    kernels = build_kernels(plan, choices, schedules, target, progress)
    measure_for_dispatch(plan, kernels, target.threads, evict_bytes(plan, target))
    dropped, copy_rule = drop_unworthy_copies(kernels, plan.graph.symbols, target)
    if progress:
        progress(len(plan.groups), len(plan.groups), "done")
    model = CompiledModel(plan, kernels, target, schedules, source_model=source_model,
                          compile_seconds=time.perf_counter() - t0)
    if blocked:
        model.notes.append(f"channel-blocked activations: {len(blocked)} tensor(s) between convolutions stored "
                           f"in blocks of {blocked[0].lanes} channels (no transposes around them)")
    if dropped:
        model.notes.append(f"packed weights: one copy of the weight in {len(dropped)} group(s) whose other "
                           f"register-tile widths gained {copy_rule.describe()} ({sum(dropped.values()) / 2**20:.1f} MiB "
                           f"of panels not made at load)")
    return model


def choose_families(plan: Plan, target: Target | None = None) -> tuple[Plan, dict[str, FamilyChoice]]:
    """Each group's family; a merged group that no family accepts (an attention chain the attention
    family refuses) is replaced by its parts, a fused GEMM or reduce group by its unfused split
    (the GEMM or first reduction, then its epilogue), each choosing its own family -- again,
    until nothing refused can split. With a ``target``, a group that could split is accepted only
    if its family also generates a source for it (:func:`_source_refusal`)."""
    def choose(g: Group) -> FamilyChoice:
        choice = choose_family(plan, g)
        refusal = _source_refusal(choice, target) if target is not None and g.splittable else None
        return choice if refusal is None else FamilyChoice(g, None, None, choice.reasons + (refusal,))

    choices = {g.name: choose(g) for g in plan.groups}
    while refused := [name for name, c in choices.items() if c.family is None and c.group.splittable]:
        plan = plan.split(refused)
        choices = {g.name: choices[g.name] if g.name in choices and g.name not in refused
                   else choose(g) for g in plan.groups}
    return plan, choices


def _source_refusal(choice: FamilyChoice, target: Target) -> str | None:
    """Why the family cannot generate ``choice``'s group, found only while generating its source (an
    output reading the batched GEMM's result through a view no store follows: DiffLlama's QDQ export
    merges the sequence into the heads between P·V and its DequantizeLinear), else None. Found at
    build time, such a group went whole to the numpy fallback (4 groups, 2.7x onnxruntime); found
    here, it splits like any refused group and its GEMM compiles. One source per group (~10 ms)."""
    if choice.family is None:
        return None
    try:
        for config in choice.family.heuristic(choice.analysis, target, 1)[:1]:
            choice.family.executor(choice.analysis, config, target)
    except UnsupportedOperatorError as exc:
        return f"{choice.family.name}: {exc}"
    except TscompError:     # a configuration's problem, not the group's: the schedule stage meets it
        pass
    return None


def build_kernels(plan: Plan, choices: dict, schedules: Schedules, target: Target,
                  progress: Progress | None = None) -> dict[str, list]:
    """The codegen stage: every scheduled configuration's source, compiled in parallel (the C
    compiler runs as a subprocess, so threads suffice), then built and bound per group."""
    unbuilt = {}
    for name, choice in list(choices.items()):
        if choice.family is not None:
            pairs, refused = generate_sources(choice, schedules.groups[name].variants, target)
            if pairs:
                unbuilt[name] = pairs
            else:   # the family's analysis took the group but no configuration could be generated
                choices[name] = FamilyChoice(choice.group, None, None, choice.reasons + tuple(refused))
    share_identical_kernels([k for pairs in unbuilt.values() for _, k in pairs])   # repeated layers: one function
    todo = {k.func: k.source for pairs in unbuilt.values() for _, k in pairs}
    with ThreadPoolExecutor(max_workers=max(1, target.threads)) as pool:
        list(pool.map(lambda item: build_object(item[1], item[0]), todo.items()))
    kernels: dict[str, list] = {}
    total = len(plan.groups)
    for k, group in enumerate(plan.groups):
        if progress:
            progress(k, total, group.name)
        choice, sched = choices[group.name], schedules.groups[group.name]
        if choice.family is None:
            kernels[group.name] = [fallback_kernel(plan, choice)]
            continue
        unique: dict = {}
        for v, kernel in unbuilt[group.name]:
            kernel = choice.family.link(kernel)
            kernel.tuning = sched.provenance()
            if v.samples:
                kernel.samples = list(v.samples)
                _set_wave_time(kernel, target.threads)
            unique.setdefault(kernel.func, kernel)     # two configurations may come out as one kernel
        kernels[group.name] = list(unique.values())
    return kernels


def generate_sources(choice: FamilyChoice, variants: list, target: Target) -> tuple[list, list[str]]:
    """(variant, unbuilt kernel) for every scheduled variant whose source the family can generate,
    and the refusals of the others. Some refusals surface only while generating the source (an
    epilogue reading the GEMM at a fixed element, found by the differential fuzzer): a group none
    of whose variants generates goes to the numpy fallback with the family's reason."""
    pairs, refused = [], []
    for v in variants:
        try:
            pairs.append((v, choice.family.executor(choice.analysis, v.config, target)))
        except UnsupportedOperatorError as exc:
            refused.append(f"{choice.family.name}: {exc}")
    return pairs, refused


def measure_for_dispatch(plan: Plan, kernels: dict[str, list], threads: int, evict: int = 0) -> None:
    """The wave model's samples for every group with a choice to make, measured here, side by
    side, after the search: the tuner's own timings are its objective, taken one candidate at a
    time amid its model fitting, and disagreed with calm re-measurement by up to 2x (up to 25x
    at the smallest shapes) on these machines. Identical groups (same family, signature and
    configurations: a model's repeated layers) are measured once and share the samples."""
    measured: dict = {}
    for g in plan.groups:
        variants = kernels[g.name]
        if len(variants) < 2:
            continue
        sig = (variants[0].tuning or {}).get("signature")
        key = (variants[0].family, sig, tuple(str(k.cfg) for k in variants)) if sig else None
        twins = measured.get(key) if key else None
        if twins is None:
            measure_variants(plan, g, variants, threads, evict=evict)
            if key:
                measured[key] = variants
            continue
        for k, twin in zip(variants, twins):
            k.samples = list(twin.samples)
            _set_wave_time(k, threads)


#: passes over the dispatch samples; each (shape, variant) keeps its fastest pass. On a shared
#: 2-core machine a burst of load slows a two-thread variant far more than a one-thread one (its
#: wave waits for the slower thread), and a pass lasts seconds: two passes, seconds apart, rarely
#: both meet a burst at the same shape
DISPATCH_PASSES = 2


def measure_variants(plan: Plan, group: Group, kernels: list, threads: int, *, warmup: int = 3,
                     repeats: int = 5, passes: int = DISPATCH_PASSES, evict: int = 0) -> None:
    """Time every variant at the :func:`~tscomp.schedule.samples.sample_bindings` shapes of
    :data:`~tscomp.schedule.samples.DISPATCH_POINTS`:
    ``kernel.samples`` holds :func:`~tscomp.runtime.wave.sample_point` per shape (size, tasks, seconds,
    the heaviest task's padded work, the task classes), ``kernel.t_wave`` the
    single-wave time at the largest sample (for the manifest). ``evict`` > 0: timed on rotating
    copies of each variant's packed data (:func:`~tscomp.schedule.cold_start.evict_bytes`)."""
    rng = np.random.default_rng(0)
    copies = [rotation(k, evict) for k in kernels]
    bindings = sample_bindings(plan, points=DISPATCH_POINTS)
    best = {(i, j): math.inf for i in range(len(bindings)) for j in range(len(kernels))}
    for _ in range(max(1, passes)):
        for i, binding in enumerate(bindings):
            env = group_inputs_at(plan, group, binding, rng)
            for j, k in enumerate(kernels):
                # warm-up runs page in the weights and refill the caches another variant evicted (a
                # variant's first runs after another's measure 2-10x slow); then the tuner's timing rule
                seconds = time_case(k, env, binding, warmup=warmup, repeats=repeats, max_spread=0.15,
                                    copies=copies[j])
                best[i, j] = min(best[i, j], seconds)
    for j, k in enumerate(kernels):
        k.samples = [sample_point(k, b, best[i, j]) for i, b in enumerate(bindings)]
    for k in kernels:
        _set_wave_time(k, threads)


def _set_wave_time(kernel, threads: int) -> None:
    size, tasks, seconds = max(kernel.samples)[:3]
    kernel.t_wave = seconds / max(1, math.ceil(tasks / threads))
    kernel.probe = {"size": size}


__all__ = ["CompiledModel", "build_kernels", "compile_model", "compile_plan", "default_threads", "group_inputs_at",
           "measure_for_dispatch", "measure_variants", "sample_bindings", "shape_size"]
