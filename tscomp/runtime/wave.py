"""Kernel-variant selection by the wave model (TSCompiler §6; DietCode §4.2 calls it occupancy).

cost(variant, shape) = T_single_wave(variant) × ⌈tasks(variant, shape) / tasks_per_wave⌉

Blocks per wave come from the :class:`~tscomp.schedule.target.Target` and the kernel's resource use
(``target.blocks_per_wave(kernel.resources())``): on the CPU a "block" is one parallel tile task of
the macro-kernel and a wave is one task per worker thread; on a GPU it is §6's occupancy formula.
T_single_wave is measured at compile time (by the tuner, or
:func:`tscomp.compiler.measure_variants`) at a few sample shapes, because a CPU task's time depends
on how full its tiles are (a 64-row task holding one row costs far less than a full one); the
runtime interpolates the per-wave time between the samples around the shape. A group with one variant has nothing to choose.

The interpolation axis is the *padded work of the heaviest task* where the family defines it
(:data:`WORK`): a task computes whole register tiles, so a GEMM task holding 5 rows under an 8-row
register tile costs what 8 rows cost, and one holding 9 rows what 16 cost (TSCompiler §5.1's
hardware-aligned view; DietCode §4.1 pads to the micro-kernel the same way). Interpolating in the
raw shape size instead smooths those steps away and mispicks small shapes. Samples at the same
work (every full-task shape) give one point, their median; for :data:`MONOTONE` families the
per-wave time is made non-decreasing in the work (more padded work is never cheaper; a sample that
says otherwise met noise, which only slows a measurement down). Families without an entry, and samples
measured before the work was recorded, use the shape size.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from tscomp.schedule.samples import shape_size
from tscomp.schedule.target import Target


def _padded(extent, block: int, reg: int):
    """Rows (or columns) one task computes: ``extent`` rounded up to the register tile, at most a
    block (scalars or numpy arrays)."""
    return np.minimum(-(-extent // reg) * reg, block)


def _gemm_work(k, ev):
    return _padded(ev(k.M), k.cfg.mc, k.cfg.mr)


def _batched_work(k, ev):
    return _padded(ev(k.M), k.cfg.mc, k.cfg.mr) * _padded(ev(k.N), k.cfg.nc, k.cfg.nr) * ev(k.K)


#: family -> work(kernel, ev): padded work of the heaviest task, ``ev`` evaluating a symbolic size
#: (to an int for one binding, to an array over a grid of bindings in :mod:`tscomp.runtime.dispatch`)
WORK = {"gemm": _gemm_work, "batched-gemm": _batched_work}


#: families whose per-wave time never falls as the task's work grows (one big task per thread;
#: the batched GEMM's many small tasks amortize their start-up, so its per-wave time can fall)
MONOTONE = {"gemm"}


def uses_work_axis(kernel) -> bool:
    return kernel.family in WORK and bool(kernel.samples) and all(len(s) > 3 for s in kernel.samples)


def task_work(kernel, binding: Mapping[str, int]) -> int:
    """The wave model's interpolation coordinate at ``binding`` (see the module docstring)."""
    work = WORK.get(kernel.family)
    if work is None:
        return shape_size(binding)
    b = dict(binding)
    return int(work(kernel, lambda x: int(kernel.symtab.evaluate(x, b))))


def sample_point(kernel, binding: Mapping[str, int], seconds: float) -> tuple:
    """One compile-time sample: (shape size, tasks, seconds, task work)."""
    return (shape_size(binding), int(kernel.tasks(binding)), float(seconds), task_work(kernel, binding))


def wave_points(kernel, per_wave: int) -> tuple[np.ndarray, np.ndarray]:
    """(coordinate, per-wave seconds) of the samples, sorted, equal coordinates merged by their
    median; kept on the kernel per blocks-per-wave."""
    key = f"_wave_points_{per_wave}"
    cached = kernel.__dict__.get(key)
    if cached is None:
        axis = 3 if uses_work_axis(kernel) else 0
        by_x: dict[int, list[float]] = {}
        for s in kernel.samples:
            by_x.setdefault(int(s[axis]), []).append(s[2] / math.ceil(max(1, s[1]) / per_wave))
        xs = sorted(by_x)
        ys = np.array([np.median(by_x[x]) for x in xs])
        if axis == 3 and kernel.family in MONOTONE:
            # a task with more padded work is never faster: a sample dearer than one with more work
            # was disturbed (timing noise is upward), so it takes that cheaper time
            ys = np.minimum.accumulate(ys[::-1])[::-1]
        cached = (np.array(xs, dtype=np.float64), ys)
        kernel.__dict__[key] = cached
    return cached


def wave_cost(kernel, binding: Mapping[str, int], target: Target) -> float:
    """T_single_wave × waves. T_single_wave is interpolated (linearly) between the two measured
    samples around this shape's coordinate — per-wave time grows as tiles fill up, which a single
    measured constant misses at small shapes — and the waves are this shape's. Without samples,
    the one measured ``t_wave``; unmeasured variants cost infinity."""
    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    waves = math.ceil(kernel.tasks(binding) / per_wave)
    if kernel.samples:
        xs, ys = wave_points(kernel, per_wave)
        x = task_work(kernel, binding) if uses_work_axis(kernel) else shape_size(binding)
        return float(np.interp(x, xs, ys)) * waves
    return math.inf if kernel.t_wave is None else kernel.t_wave * waves


def pick_variant(variants: list, binding: Mapping[str, int], target: Target):
    if len(variants) == 1:
        return variants[0]
    # ties (equal cost) go to the earlier variant: the schedule lists its best-objective one first
    return min(variants, key=lambda k: wave_cost(k, binding, target))


__all__ = ["WORK", "pick_variant", "sample_point", "task_work", "wave_cost", "wave_points"]
