"""Variant choice by the wave model: cost = T_single_wave x ceil(tasks / threads)."""
from __future__ import annotations

from tscomp.runtime.wave import pick_variant, wave_cost


class FakeKernel:
    def __init__(self, name, t_wave, tasks_per_row):
        self.name, self.t_wave, self.tasks_per_row = name, t_wave, tasks_per_row

    def tasks(self, binding):
        return -(-binding["M"] // self.tasks_per_row)


def test_wave_cost_counts_whole_waves():
    k = FakeKernel("k", 2.0, 10)
    assert wave_cost(k, {"M": 10}, 2) == 2.0        # 1 task: one (partial) wave
    assert wave_cost(k, {"M": 20}, 2) == 2.0        # 2 tasks, 2 threads: one wave
    assert wave_cost(k, {"M": 21}, 2) == 4.0        # 3 tasks: two waves


def test_small_shapes_pick_the_variant_with_fewer_waves_and_large_shapes_the_faster_wave():
    big_tiles = FakeKernel("big", 1.0, 100)          # slow wave, few tasks
    small_tiles = FakeKernel("small", 0.3, 10)       # fast wave, many tasks
    assert pick_variant([big_tiles, small_tiles], {"M": 20}, 2) is small_tiles    # 1 wave each
    assert pick_variant([big_tiles, small_tiles], {"M": 200}, 2) is big_tiles     # 1 wave vs 10


def test_single_variant_and_unmeasured_variants():
    only = FakeKernel("only", None, 1)
    assert pick_variant([only], {"M": 5}, 2) is only
    measured = FakeKernel("m", 1.0, 1)
    assert pick_variant([FakeKernel("u", None, 1), measured], {"M": 5}, 2) is measured


def test_per_wave_time_is_interpolated_between_samples_and_scaled_by_waves():
    k = FakeKernel("k", None, 10)
    # (size, tasks, seconds): per-wave times 1.0 at size 1, 2.0 at size 16, 2.0 at size 64
    k.samples = [(1, 1, 1.0), (16, 2, 2.0), (64, 8, 8.0)]
    assert wave_cost(k, {"M": 1}, 2) == 1.0
    assert wave_cost(k, {"M": 10}, 2) == 1.0 + (2.0 - 1.0) * 9 / 15      # 1 task: one wave
    assert wave_cost(k, {"M": 40}, 2) == 2.0 * 2                          # 4 tasks: two waves
    assert wave_cost(k, {"M": 640}, 2) == 2.0 * 32                        # past the last sample


def test_measured_samples_choose_per_shape():
    few_big = FakeKernel("few", None, 64)            # few large tasks: slow when nearly empty
    few_big.samples = [(1, 1, 1.0), (512, 8, 4.0)]
    many_small = FakeKernel("many", None, 8)         # many small tasks: cheap when nearly empty
    many_small.samples = [(1, 1, 0.4), (512, 64, 8.0)]
    assert pick_variant([few_big, many_small], {"M": 8}, 2) is many_small
    assert pick_variant([few_big, many_small], {"M": 512}, 2) is few_big
