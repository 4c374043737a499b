"""Variant choice by the wave model: cost = T_single_wave x ceil(tasks / threads)."""
from __future__ import annotations

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
    assert wave_cost(k, {"M": 1}, CPU2) == 1.0
    assert wave_cost(k, {"M": 10}, CPU2) == 1.0 + (2.0 - 1.0) * 9 / 15      # 1 task: one wave
    assert wave_cost(k, {"M": 40}, CPU2) == 2.0 * 2                          # 4 tasks: two waves
    assert wave_cost(k, {"M": 640}, CPU2) == 2.0 * 32                        # past the last sample


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
    """A GEMM variant as the wave model sees it: M rows, register tile mr, block tile mc."""
    family = "gemm"
    symtab = _Symtab()

    def __init__(self, mr, mc):
        import sympy
        from tscomp.codegen.tile_config import TileConfig
        self.M = sympy.Symbol("M")
        self.cfg = TileConfig(mr=mr, nr=16, mc=mc, nc=64, kc=64)

    def tasks(self, binding):
        return -(-binding["M"] // self.cfg.mc)


def test_gemm_per_wave_time_follows_the_register_tile_steps_not_the_shape_size():
    """A task computes whole register tiles: with mr = 8, rows 1..8 cost the same and 9..16 the
    same; interpolating in the raw row count would predict M = 9 cheaper than M = 16."""
    from tscomp.runtime.wave import sample_point, task_work
    k = FakeGemm(mr=8, mc=64)
    per_rows = lambda m: 10.0 * -(-m // 8)          # noqa: E731  the kernel's true time (one task)
    k.samples = [sample_point(k, {"M": m}, per_rows(m)) for m in (1, 4, 16, 64)]
    assert [s[3] for s in k.samples] == [8, 8, 16, 64]
    assert task_work(k, {"M": 5}) == 8 and task_work(k, {"M": 9}) == 16 and task_work(k, {"M": 200}) == 64
    assert wave_cost(k, {"M": 5}, CPU2) == per_rows(5)
    assert wave_cost(k, {"M": 9}, CPU2) == per_rows(16) == per_rows(9)
    assert wave_cost(k, {"M": 40}, CPU2) == per_rows(40)


def test_samples_at_the_same_work_merge_by_their_median():
    """Every full-task shape has the same work: one noisy sample among them does not move the cost."""
    from tscomp.runtime.wave import wave_points
    k = FakeGemm(mr=8, mc=16)
    k.samples = [(16, 1, 1.0, 16), (64, 4, 2.0, 16), (128, 8, 40.0, 16), (256, 16, 8.0, 16)]
    xs, ys = wave_points(k, 2)
    assert list(xs) == [16] and list(ys) == [1.0]      # per-wave: 1.0, 1.0, 10.0, 1.0
    assert wave_cost(k, {"M": 96}, CPU2) == 1.0 * 3      # 6 tasks: 3 waves


def test_samples_without_work_use_the_shape_size_axis():
    """Artifacts measured before the work coordinate was recorded keep the size interpolation."""
    k = FakeGemm(mr=8, mc=64)
    k.samples = [(1, 1, 1.0), (16, 1, 2.0)]
    assert wave_cost(k, {"M": 10}, CPU2) == 1.0 + (2.0 - 1.0) * 9 / 15
