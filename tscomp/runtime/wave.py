"""Kernel-variant selection by the wave model (TSCompiler §6; DietCode §4.2 calls it occupancy).

cost(variant, shape) = T_single_wave(variant) × ⌈tasks(variant, shape) / tasks_per_wave⌉

Blocks per wave come from the :class:`~tscomp.schedule.target.Target` and the kernel's resource use
(``target.blocks_per_wave(kernel.resources())``): on the CPU a "block" is one parallel tile task of
the macro-kernel and a wave is one task per worker thread; on a GPU it is §6's occupancy formula.
T_single_wave is measured at compile time (by the tuner, or
:func:`tscomp.compiler.measure_variants`) at a few sample shapes, because a CPU task's time depends
on how full its tiles are (a 64-row task holding one row costs far less than a full one); the
runtime interpolates the per-wave time between the samples around the shape. A group with one variant has nothing to choose.
"""
from __future__ import annotations

import math
from typing import Mapping

from tscomp.schedule.samples import shape_size
from tscomp.schedule.target import Target


def wave_cost(kernel, binding: Mapping[str, int], target: Target) -> float:
    """T_single_wave × waves. T_single_wave is interpolated (linearly in the shape size) between
    the two measured samples around this shape — per-wave time grows as tiles fill up, which a
    single measured constant misses at small shapes — and the waves are this shape's. Without
    samples, the one measured ``t_wave``; unmeasured variants cost infinity."""
    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    waves = math.ceil(kernel.tasks(binding) / per_wave)
    if kernel.samples:
        return _per_wave_time(_wave_points(kernel, kernel.samples, per_wave), shape_size(binding)) * waves
    return math.inf if kernel.t_wave is None else kernel.t_wave * waves


def _wave_points(kernel, samples, threads: int) -> list[tuple[int, float]]:
    """(size, per-wave seconds) of the samples, sorted; kept on the kernel per thread count."""
    key = f"_wave_points_{threads}"
    cached = kernel.__dict__.get(key)
    if cached is None:
        cached = sorted((s, t / math.ceil(max(1, n) / threads)) for s, n, t in samples)
        kernel.__dict__[key] = cached
    return cached


def _per_wave_time(points: list[tuple[int, float]], size: int) -> float:
    if size <= points[0][0]:
        return points[0][1]
    for (s0, w0), (s1, w1) in zip(points, points[1:]):
        if size <= s1:
            return w0 + (w1 - w0) * (size - s0) / max(1, s1 - s0)
    return points[-1][1]


def pick_variant(variants: list, binding: Mapping[str, int], target: Target):
    if len(variants) == 1:
        return variants[0]
    # ties (equal cost) go to the earlier variant: the schedule lists its best-objective one first
    return min(variants, key=lambda k: wave_cost(k, binding, target))


__all__ = ["pick_variant", "wave_cost"]
