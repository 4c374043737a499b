"""Kernel-variant selection by the wave model (TSCompiler §6; DietCode §4.2 calls it occupancy).

cost(variant, shape) = T_single_wave(variant) × ⌈tasks(variant, shape) / tasks_per_wave⌉

On the CPU a "block" is one parallel tile task of the macro-kernel and a wave is one task per
thread, so tasks_per_wave = the runtime's thread count. T_single_wave is measured at compile time
(:func:`tscomp.compiler.measure_variants`) at a few sample shapes, because a CPU task's time depends
on how full its tiles are (a 64-row task holding one row costs far less than a full one); the
runtime scales from the sample nearest in task count. A group with one variant has nothing to choose.
"""
from __future__ import annotations

import math
from typing import Mapping


def wave_cost(kernel, binding: Mapping[str, int], threads: int) -> float:
    """The wave model anchored at the nearest measured sample: T_single_wave is taken from the
    sample whose task count is closest (in ratio) to this shape's, then scaled by the number of
    waves. Without samples, the one measured ``t_wave``; unmeasured variants cost infinity."""
    threads = max(1, threads)
    tasks = kernel.tasks(binding)
    waves = math.ceil(tasks / threads)
    samples = getattr(kernel, "samples", None)
    if samples:
        s_tasks, s_time = min(samples, key=lambda s: (abs(math.log(max(1, s[0]) / max(1, tasks))), -s[0]))
        return s_time / math.ceil(max(1, s_tasks) / threads) * waves
    t_wave = getattr(kernel, "t_wave", None)
    return math.inf if t_wave is None else t_wave * waves


def pick_variant(variants: list, binding: Mapping[str, int], threads: int):
    if len(variants) == 1:
        return variants[0]
    # ties (equal cost) go to the earlier variant: the family lists its default first
    return min(variants, key=lambda k: wave_cost(k, binding, threads))


__all__ = ["pick_variant", "wave_cost"]
