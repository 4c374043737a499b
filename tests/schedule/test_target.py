"""Targets as values: host detection, the CUDA table, blocks per wave, round trip through JSON."""
from __future__ import annotations

import pytest

from tscomp.codegen.build import host_isa
from tscomp.schedule.target import CUDA_SPECS, CpuSpec, Target, TargetError, cuda, host_cpu


def test_host_cpu_is_detected_not_assumed():
    t = host_cpu()
    assert t.name == "cpu" and t.dialect == "c" and t.measurable
    assert t.isa == host_isa()
    s = t.spec
    assert s.vector_width == {"avx512": 16, "avx2": 8, "scalar": 1}[s.isa]
    assert s.cores >= 1 and 0 < s.l1 < s.l2 and s.l3 > 0


def test_cpu_blocks_per_wave_is_the_thread_count():
    assert host_cpu(3).blocks_per_wave() == 3
    assert host_cpu(1).with_threads(5).threads == 5
    with pytest.raises(TargetError):
        host_cpu().with_threads(0)


def test_a_lower_isa_can_be_requested_and_an_unknown_one_is_refused():
    t = host_cpu(isa="scalar")
    assert t.isa == "scalar" and t.spec.vector_width == 1
    with pytest.raises(TargetError, match="unknown CPU ISA"):
        host_cpu(isa="neon")


@pytest.mark.parametrize("arch", sorted(CUDA_SPECS))
def test_cuda_targets_are_ranked_not_measured(arch):
    t = cuda(arch)
    assert t.name == "cuda" and t.dialect == "cuda" and not t.measurable
    assert t.key() == f"cuda-{arch}"


def test_unknown_cuda_arch_is_refused_naming_the_known_ones():
    with pytest.raises(TargetError, match="sm_80"):
        cuda("sm_61")


def test_gpu_occupancy_takes_the_tightest_resource():
    a100 = cuda("sm_80").spec
    # 256 threads x 64 registers: registers allow 4 blocks (64K / 16K), threads 8, blocks 32
    assert a100.blocks_per_sm({"threads": 256, "registers": 64}) == 4
    # shared memory 48 KiB: 3 blocks of 164 KiB
    assert a100.blocks_per_sm({"threads": 128, "registers": 32, "shared_bytes": 48 * 1024}) == 3
    # too much shared memory for one block: nothing fits
    assert a100.blocks_per_sm({"threads": 128, "registers": 32, "shared_bytes": 200 * 1024}) == 0
    assert a100.occupancy({"threads": 256, "registers": 64}) == pytest.approx(4 * 8 / 64)


def test_a_block_must_fit_the_register_file_with_per_warp_rounding():
    """64K registers per block: 1024 threads fit at 64 registers; at 57..63 they fit too (rounded to
    64 per thread per warp), at 65 the launch fails ("too many resources requested"), as seen on an H200."""
    h100 = cuda("sm_90").spec
    assert h100.blocks_per_sm({"threads": 1024, "registers": 64}) == 1
    assert h100.blocks_per_sm({"threads": 1024, "registers": 58}) == 1
    assert h100.blocks_per_sm({"threads": 1024, "registers": 65}) == 0
    assert h100.blocks_per_sm({"threads": 992, "registers": 66}) == 0    # 66 x 992 < 64K, but 72 x 992 per warp > 64K


def test_targets_round_trip_through_json():
    for t in (host_cpu(2), cuda("sm_90")):
        back = Target.from_json(t.to_json())
        assert back == t and back.key() == t.key()
    with pytest.raises(TargetError, match="malformed"):
        Target.from_json({"name": "cpu"})


def test_target_key_changes_with_what_changes_the_best_configuration():
    a = Target("cpu", "c", CpuSpec(2, "avx2", 8, 16, 32768, 524288, 8 << 20))
    b = Target("cpu", "c", CpuSpec(2, "avx2", 8, 16, 32768, 1 << 20, 8 << 20))
    assert a.key() != b.key() and a.key() != a.with_threads(4).key()
