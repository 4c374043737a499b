"""Kernel-variant selection by the wave model (TSCompiler §6; DietCode §4.2 calls it occupancy).

cost(variant, shape) = T_single_wave(variant) × ⌈tasks(variant, shape) / tasks_per_wave⌉

On the CPU a "block" is one parallel tile task of the macro-kernel and a wave is one task per
thread, so tasks_per_wave = the runtime's thread count. T_single_wave was measured at compile time
(:func:`tscomp.compiler.measure_single_wave`). A group with one variant has nothing to choose.
"""
from __future__ import annotations

import math
from typing import Mapping


def wave_cost(kernel, binding: Mapping[str, int], threads: int) -> float:
    t_wave = getattr(kernel, "t_wave", None)
    if t_wave is None:
        return math.inf
    return t_wave * math.ceil(kernel.tasks(binding) / max(1, threads))


def pick_variant(variants: list, binding: Mapping[str, int], threads: int):
    if len(variants) == 1:
        return variants[0]
    # ties (equal cost) go to the earlier variant: the family lists its default first
    return min(variants, key=lambda k: wave_cost(k, binding, threads))


__all__ = ["pick_variant", "wave_cost"]
