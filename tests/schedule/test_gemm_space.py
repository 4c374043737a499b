"""The CPU GEMM search spaces: every point they hand out is a valid tile configuration for the
target, projection lands on valid points, the heuristic lives inside the space."""
from __future__ import annotations

import numpy as np
import pytest

from tscomp.codegen.tile_config import MAX_ACCUMULATORS
from tscomp.schedule.gemm_space import BatchedGemmSpace, GemmSpace
from tscomp.schedule.target import CpuSpec, Target

TARGETS = {
    "avx512": Target("cpu", "c", CpuSpec(2, "avx512", 16, 32, 48 * 1024, 2 << 20, 32 << 20)),
    "avx2": Target("cpu", "c", CpuSpec(2, "avx2", 8, 16, 32 * 1024, 512 * 1024, 8 << 20)),
    "scalar": Target("cpu", "c", CpuSpec(1, "scalar", 1, 16, 32 * 1024, 256 * 1024, 4 << 20)),
}
SPACES = [
    ("ffn-up", lambda t: GemmSpace(768, 3072, t, m_max=4096)),
    ("odd", lambda t: GemmSpace(13, 97, t, m_max=7)),
    ("qkt", lambda t: BatchedGemmSpace(None, None, 64, t)),
    ("pv", lambda t: BatchedGemmSpace(None, 64, None, t)),
]


@pytest.mark.parametrize("isa", sorted(TARGETS))
@pytest.mark.parametrize("label,make", SPACES, ids=[s[0] for s in SPACES])
def test_every_sampled_and_projected_point_is_a_valid_config(isa, label, make):
    target = TARGETS[isa]
    space = make(target)
    assert len(space) > 0
    rng = np.random.default_rng(0)
    points = space.sample(rng, 60) + [space.project(x) for x in rng.random((60, space.dim))]
    for p in points:
        assert space.is_valid(p), space.violations(p)
        cfg = space.config(p)                      # validate() raises on a hard-constraint breach
        assert cfg.nr % target.spec.vector_width == 0
        assert cfg.accumulators(isa) <= MAX_ACCUMULATORS[isa]
        assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0


@pytest.mark.parametrize("label,make", SPACES, ids=[s[0] for s in SPACES])
def test_the_heuristic_population_lies_in_the_space(label, make):
    space = make(TARGETS["avx2"])
    init = space.initial()
    assert init, "the hardware-aligned heuristic must seed the search"
    assert all(space.is_valid(p) for p in init)


def test_hard_constraints_prune_and_say_why():
    space = GemmSpace(768, 3072, TARGETS["avx2"], m_max=4096)
    too_many = {"mr": 12, "nr_vec": 4, "mc_tiles": 1, "n_parts": 1, "k_steps": 1}   # 48 accumulators
    assert not space.is_valid(too_many)
    assert any("register" in why for why in space.violations(too_many))
    thin = {"mr": 1, "nr_vec": 1, "mc_tiles": 1, "n_parts": 1, "k_steps": 1}        # 1 FMA chain
    assert any("FMA" in why for why in space.violations(thin))


def test_block_sizes_follow_the_point():
    space = GemmSpace(768, 3072, TARGETS["avx2"], m_max=4096)
    cfg = space.config({"mr": 6, "nr_vec": 2, "mc_tiles": 8, "n_parts": 4, "k_steps": 4})
    assert (cfg.mr, cfg.nr, cfg.mc, cfg.nc, cfg.kc) == (6, 16, 48, 768, 192)


def test_a_bf16_target_with_amx_searches_whole_tiles_and_32_deep_k_blocks():
    import dataclasses
    amx = Target("cpu", "c", dataclasses.replace(TARGETS["avx512"].spec, bf16=True, amx=True), precision="bf16")
    for space in (GemmSpace(768, 3072, amx, m_max=512), GemmSpace(97, 13, amx, m_max=7)):
        assert space.isa == "amx" and space.initial()
        rng = np.random.default_rng(1)
        for p in space.sample(rng, 60) + [space.project(x) for x in rng.random((60, space.dim))]:
            cfg = space.config(p)                       # validate("amx"): whole 16-row tiles, <= 4 accumulator tiles
            assert cfg.mr in (16, 32) and cfg.nr % 16 == 0 and cfg.mr * cfg.nr <= 4 * 256
            assert cfg.kc == space.K or cfg.kc % 32 == 0
