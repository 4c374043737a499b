"""Variant choice by the wave model: cost = T_single_wave x ceil(tasks / threads), refined to the
makespan of task classes where the last block holds a remainder."""
from __future__ import annotations

import numpy as np
import pytest

from tscomp.codegen.kernel import KernelBase
from tscomp.runtime.wave import pick_variant, wave_cost
from tscomp.schedule.target import CUDA_SPECS, cuda, host_cpu

CPU2 = host_cpu(2)


class FakeKernel(KernelBase):
    def __init__(self, name, t_wave, tasks_per_row):
        self.name, self.t_wave, self.tasks_per_row = name, t_wave, tasks_per_row

    def tasks(self, binding):
        return -(-binding["M"] // self.tasks_per_row)


def test_wave_cost_counts_whole_waves():
    k = FakeKernel("k", 2.0, 10)
    assert wave_cost(k, {"M": 10}, CPU2) == 2.0        # 1 task: one (partial) wave
    assert wave_cost(k, {"M": 20}, CPU2) == 2.0        # 2 tasks, 2 threads: one wave
    assert wave_cost(k, {"M": 21}, CPU2) == 4.0        # 3 tasks: two waves


def test_small_shapes_pick_the_variant_with_fewer_waves_and_large_shapes_the_faster_wave():
    big_tiles = FakeKernel("big", 1.0, 100)          # slow wave, few tasks
    small_tiles = FakeKernel("small", 0.3, 10)       # fast wave, many tasks
    assert pick_variant([big_tiles, small_tiles], {"M": 20}, CPU2) is small_tiles    # 1 wave each
    assert pick_variant([big_tiles, small_tiles], {"M": 200}, CPU2) is big_tiles     # 1 wave vs 10


def test_single_variant_and_unmeasured_variants():
    only = FakeKernel("only", None, 1)
    assert pick_variant([only], {"M": 5}, CPU2) is only
    measured = FakeKernel("m", 1.0, 1)
    assert pick_variant([FakeKernel("u", None, 1), measured], {"M": 5}, CPU2) is measured


def test_per_wave_time_is_interpolated_between_samples_and_scaled_by_waves():
    k = FakeKernel("k", None, 10)
    # (size, tasks, seconds): per-wave times 1.0 at size 1, 2.0 at size 16, 2.0 at size 64
    k.samples = [(1, 1, 1.0), (16, 2, 2.0), (64, 8, 8.0)]
    assert wave_cost(k, {"M": 1}, CPU2) == pytest.approx(1.0)
    assert wave_cost(k, {"M": 10}, CPU2) == pytest.approx(1.0 + (2.0 - 1.0) * 9 / 15)   # 1 task: one wave
    assert wave_cost(k, {"M": 40}, CPU2) == pytest.approx(2.0 * 2)                       # 4 tasks: two waves
    assert wave_cost(k, {"M": 640}, CPU2) == pytest.approx(2.0 * 32)                     # past the last sample


def test_measured_samples_choose_per_shape():
    few_big = FakeKernel("few", None, 64)            # few large tasks: slow when nearly empty
    few_big.samples = [(1, 1, 1.0), (512, 8, 4.0)]
    many_small = FakeKernel("many", None, 8)         # many small tasks: cheap when nearly empty
    many_small.samples = [(1, 1, 0.4), (512, 64, 8.0)]
    assert pick_variant([few_big, many_small], {"M": 8}, CPU2) is many_small
    assert pick_variant([few_big, many_small], {"M": 512}, CPU2) is few_big


def test_blocks_per_wave_come_from_the_target_thread_count():
    k = FakeKernel("k", 1.0, 1)
    assert wave_cost(k, {"M": 8}, host_cpu(2)) == 4.0     # 8 tasks / 2 threads
    assert wave_cost(k, {"M": 8}, host_cpu(8)) == 1.0     # one wave on 8 threads


class GpuKernel(FakeKernel):
    def __init__(self, t_wave, tasks_per_row, resources):
        super().__init__("g", t_wave, tasks_per_row)
        self._resources = resources

    def resources(self):
        return self._resources


def test_gpu_blocks_per_wave_follow_the_occupancy_formula():
    a100 = cuda("sm_80")
    light = GpuKernel(1.0, 1, {"threads": 128, "registers": 32, "shared_bytes": 16 * 1024})
    heavy = GpuKernel(1.0, 1, {"threads": 256, "registers": 128, "shared_bytes": 96 * 1024})
    spec = CUDA_SPECS["sm_80"]
    # light: shared memory allows 10 blocks/SM (164 KiB / 16 KiB), threads 16, registers 16
    assert a100.blocks_per_wave(light.resources()) == 10 * spec.sms
    # heavy: one 96 KiB block per SM; 128 regs x 256 threads = half the register file
    assert a100.blocks_per_wave(heavy.resources()) == 1 * spec.sms
    assert wave_cost(light, {"M": 10 * spec.sms}, a100) == 1.0
    assert wave_cost(heavy, {"M": 10 * spec.sms}, a100) == 10.0


class _Symtab:
    @staticmethod
    def evaluate(expr, binding):
        return int(expr.subs(binding)) if hasattr(expr, "subs") else int(expr)


class FakeGemm(KernelBase):
    """A GEMM variant as the wave model sees it: M rows, register tile mr, block tile mc, and
    ``n_nblocks`` column blocks; ``row_granule`` mr (the last row panel computed padded, as the
    scalar kernels do) unless given (1: a row-tail micro-kernel of the panel's own height)."""
    family = "gemm"
    symtab = _Symtab()

    def __init__(self, mr, mc, n_nblocks=1, row_granule=None):
        import sympy
        from types import SimpleNamespace
        from tscomp.codegen.tile_config import TileConfig
        self.M = sympy.Symbol("M")
        self.cfg = TileConfig(mr=mr, nr=16, mc=mc, nc=64, kc=64)
        self.geometry = SimpleNamespace(n_nblocks=n_nblocks, tall_rows=0)
        self.row_granule = mr if row_granule is None else row_granule

    def tasks(self, binding):
        return -(-binding["M"] // self.cfg.mc) * self.geometry.n_nblocks


def test_gemm_per_task_time_follows_the_register_tile_steps_not_the_shape_size():
    """A task computes whole register tiles: with mr = 8, rows 1..8 cost the same and 9..16 the
    same; interpolating in the raw row count would predict M = 9 cheaper than M = 16."""
    from tscomp.runtime.wave import sample_point, task_work
    k = FakeGemm(mr=8, mc=64)
    per_rows = lambda m: 10.0 * -(-m // 8)          # noqa: E731  the kernel's true time (one task)
    k.samples = [sample_point(k, {"M": m}, per_rows(m)) for m in (1, 4, 16, 64)]
    assert [s[3] for s in k.samples] == [8, 8, 16, 64]
    # M = 200 under 64-row blocks: four balanced blocks of 56, 56, 56 and 32 rows
    assert task_work(k, {"M": 5}) == 8 and task_work(k, {"M": 9}) == 16 and task_work(k, {"M": 200}) == 56
    assert wave_cost(k, {"M": 5}, CPU2) == pytest.approx(per_rows(5))
    assert wave_cost(k, {"M": 9}, CPU2) == pytest.approx(per_rows(16)) and per_rows(16) == per_rows(9)
    assert wave_cost(k, {"M": 40}, CPU2) == pytest.approx(per_rows(40))


def test_gemm_row_blocks_are_balanced_as_the_kernel_splits_m():
    """The CPU GEMM splits M into ceil(M / mc) row blocks of equal whole register tiles (M = 139
    under mc = 64: 48, 48, 43 -- not 64, 64 and an 11-row block that streams every weight panel
    again); the wave model's classes are those blocks, at every M."""
    from tscomp.runtime.wave import task_classes
    k = FakeGemm(mr=8, mc=64, n_nblocks=2, row_granule=1)
    assert sorted(task_classes(k, {"M": 139})) == [(2, 43), (4, 48)]
    for M in range(1, 700):
        classes = [(int(c), int(w)) for c, w in task_classes(k, {"M": M}) if c]
        blocks = [w for c, w in classes for _ in range(c // 2)]
        assert sum(blocks) == M and len(blocks) == -(-M // 64), M
        assert max(blocks) <= 64 and max(blocks) % 8 == 0 or len(blocks) == 1, M
        assert max(blocks) - min(blocks) < 8 * len(blocks), M


def test_a_gemm_with_row_tail_kernels_is_costed_at_its_exact_rows():
    """With a micro-kernel of the last panel's own height (row_granule 1) a task's work is its rows:
    M = 9 under an 8-row tile is 9 rows of work, not 16, and a sample at M = 9 is read at 9."""
    from tscomp.runtime.wave import sample_point, task_classes, task_work
    k = FakeGemm(mr=8, mc=64, row_granule=1)
    assert task_work(k, {"M": 9}) == 9 and task_classes(k, {"M": 70}) == ((1, 40), (1, 30))
    t = lambda rows: 2.0 + rows                      # noqa: E731
    k.samples = [sample_point(k, {"M": m}, t(m)) for m in (1, 8, 9, 16, 64)]
    assert wave_cost(k, {"M": 9}, CPU2) == pytest.approx(t(9))
    assert wave_cost(k, {"M": 12}, CPU2) == pytest.approx(t(12))


def test_the_last_partial_block_costs_its_own_rows_not_a_full_wave():
    """M = 129 under 64-row blocks, two column blocks: 4 tasks of 48 rows and 2 of 33 (padded to
    40). Two workers run the heavy ones in two waves and the light ones in a third, shorter one:
    2 x t(48) + t(40), not the 3 x t(48) whole waves would say."""
    from tscomp.runtime.wave import sample_point, task_classes
    k = FakeGemm(mr=8, mc=64, n_nblocks=2)
    t = lambda rows: 1.0 + rows / 8                  # noqa: E731  per-task time of a task's padded rows
    assert task_classes(k, {"M": 129}) == ((4, 48), (2, 40))
    assert task_classes(k, {"M": 128}) == ((2, 64), (2, 64))
    k.samples = [sample_point(k, {"M": 8}, t(8)), sample_point(k, {"M": 96}, 2 * t(48))]
    assert wave_cost(k, {"M": 129}, CPU2) == pytest.approx(2 * t(48) + t(40))
    # on 4 workers (samples measured there): 2 heavier and 2 lighter tasks (40 and 32 rows) in one wave
    k4 = FakeGemm(mr=8, mc=64, n_nblocks=2)
    k4.samples = [sample_point(k4, {"M": 8}, t(8)), sample_point(k4, {"M": 128}, t(64))]
    assert wave_cost(k4, {"M": 72}, FakeWorkers(4)) == pytest.approx(t(40))


class FakeWorkers:
    def __init__(self, n):
        self.n = self.threads = n

    def blocks_per_wave(self, resources):
        return self.n


def test_samples_mixing_full_and_partial_blocks_give_the_full_task_time():
    """A sample at M = 100 (balanced row blocks of 56 and 44 rows under mc = 64, the 44 computed
    as 48 padded rows) measured t(56) + t(48) on one worker; the fitted per-task time at 56 rows is t(56), not the
    sample's seconds over its waves."""
    from tscomp.runtime.wave import sample_point, wave_points
    k = FakeGemm(mr=8, mc=64, n_nblocks=1)
    t = lambda rows: 2.0 + rows                      # noqa: E731
    k.samples = [sample_point(k, {"M": m}, t(m)) for m in (8, 16, 40, 48)] + [sample_point(k, {"M": 100}, t(56) + t(48))]
    xs, ys, t0 = wave_points(k, 1)
    assert t0 == pytest.approx(0.0, abs=1e-6)
    assert list(xs) == [8, 16, 40, 48, 56]
    assert ys == pytest.approx([t(8), t(16), t(40), t(48), t(56)])


def test_one_disturbed_sample_barely_moves_the_fit():
    """Every full-task shape has the same work: one sample 5x slow among them (timing noise is
    upward) moves the per-task time by well under its share (robust soft-L1 fit)."""
    from tscomp.runtime.wave import wave_points
    k = FakeGemm(mr=8, mc=16)
    k.samples = [(16, 1, 1.0, 16), (64, 4, 2.0, 16), (128, 8, 20.0, 16), (256, 16, 8.0, 16)]
    xs, ys, t0 = wave_points(k, 2)
    assert list(xs) == [16] and ys[0] + t0 == pytest.approx(1.0, rel=0.02)   # per-wave: 1, 1, 5, 1
    assert wave_cost(k, {"M": 96}, CPU2) == pytest.approx(3.0, rel=0.05)      # 6 tasks: 3 waves


def test_samples_without_work_use_the_shape_size_axis():
    """Artifacts measured before the work coordinate was recorded keep the size interpolation."""
    k = FakeKernel("k", None, 10)
    k.samples = [(1, 1, 1.0), (16, 1, 2.0)]
    assert wave_cost(k, {"M": 10}, CPU2) == pytest.approx(1.0 + (2.0 - 1.0) * 9 / 15)


def test_a_fixed_launch_time_is_separated_from_the_per_task_time():
    """Full tasks at one work timed in 1, 4 and 8 waves: seconds = T0 + waves x t. The one-wave
    sample alone would make a wave cost T0 + t, and 8 waves 8 (T0 + t)."""
    from tscomp.runtime.wave import sample_point, wave_points
    k = FakeGemm(mr=8, mc=16)
    t0, t = 3.0, 2.0
    k.samples = [sample_point(k, {"M": m}, t0 + -(-m // 32) * t) for m in (32, 128, 256)]
    xs, ys, got_t0 = wave_points(k, 2)
    assert got_t0 == pytest.approx(t0, rel=0.02) and list(xs) == [16] and ys[0] == pytest.approx(t, rel=0.02)
    assert wave_cost(k, {"M": 160}, CPU2) == pytest.approx(t0 + 5 * t, rel=0.01)


def test_a_light_task_after_whole_waves_runs_alone_and_one_beside_a_heavy_task_is_free():
    """Two workers, tasks pulled in order: 2 heavy + 1 light is t_h + t_l (the light task runs
    after the wave, whole: it cannot be split over both workers); 3 heavy + 1 light is 2 t_h (it
    runs beside the third heavy one)."""
    from tscomp.runtime.wave import makespan
    t = {64: 10.0, 32: 6.0}.__getitem__
    tv = np.vectorize(lambda w: t(int(w)))
    assert float(makespan([(2, 64), (1, 32)], tv, 2)) == 16.0
    assert float(makespan([(3, 64), (1, 32)], tv, 2)) == 20.0
    # many light tasks beside the odd heavy one: one worker runs the heavy task (10), the other
    # light ones (6 + 6 = 12 > 10): the light ones set the end
    assert float(makespan([(1, 64), (2, 32)], tv, 2)) == 12.0
    # vectorized over bindings, the same answers
    got = makespan([(np.array([2, 3, 1]), np.array([64, 64, 64])), (np.array([1, 1, 2]), np.array([32, 32, 32]))], tv, 2)
    assert list(got) == [16.0, 20.0, 12.0]


def test_a_row_tail_dearer_than_the_next_tile_height_keeps_its_measured_time():
    """Row tails run their own micro-kernels, so a 3-row task may cost more than a 4-row one (a
    12-row tile's 3-row tail measured 94 us, its 4-row tail 80 us): the fit must not lower the
    3-row time to the 4-row one, or the pick at M = 3 goes to the variant that is slower there.
    Whole-tile knots stay monotone: a disturbed full-tile sample is still capped by larger ones."""
    from tscomp.runtime.wave import sample_point
    tails = FakeGemm(mr=12, mc=96, row_granule=1)
    times = {1: 55.0, 2: 70.0, 3: 94.0, 4: 80.0, 12: 150.0, 24: 140.0, 48: 300.0, 96: 600.0}
    tails.samples = [sample_point(tails, {"M": m}, t) for m, t in times.items()]
    other = FakeGemm(mr=12, mc=48, row_granule=1)
    other.samples = [sample_point(other, {"M": m}, t * (83.0 / 94.0 if m == 3 else 1.1))
                     for m, t in times.items()]
    assert wave_cost(tails, {"M": 3}, CPU2) == pytest.approx(94.0, rel=0.05)
    assert pick_variant([tails, other], {"M": 3}, CPU2) is other
    assert pick_variant([tails, other], {"M": 4}, CPU2) is tails
    assert wave_cost(tails, {"M": 12}, CPU2) <= 140.0 * 1.01      # the disturbed whole-tile knot is capped
