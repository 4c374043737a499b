"""The attention family's search space: every sampled or projected point is a tiling the kernel
accepts on its target (the S and P·V tiles fit the registers, a task's blocks fit half of L2), and
the heuristic tilings live inside the space."""
from __future__ import annotations

import numpy as np
import pytest

import tscomp.graph as G
from tscomp.codegen.cpu_attention import AttentionAnalysis, candidate_configs, tile_fits
from tscomp.graph.fusion import fuse
from tscomp.schedule.attention_space import AttentionSpace
from tests.codegen.test_cpu_attention import DIMS, attention_model, the_attention_group
from tests.schedule.test_gemm_space import TARGETS


@pytest.fixture(scope="module", params=[(64, 64), (24, 40), (128, 128)], ids=lambda d: f"dk{d[0]}-dv{d[1]}")
def analysis(request, tmp_path_factory):
    dk, dv = request.param
    plan = fuse(G.load_model(attention_model(tmp_path_factory.mktemp("space"), dk, dv), DIMS))
    return AttentionAnalysis(plan, the_attention_group(plan))


@pytest.mark.parametrize("isa", sorted(TARGETS))
def test_every_sampled_and_projected_point_is_a_tiling_the_kernel_accepts(analysis, isa):
    target = TARGETS[isa]
    space = AttentionSpace(analysis, target)
    assert len(space) > 0
    W = target.spec.vector_width
    rng = np.random.default_rng(0)
    points = space.sample(rng, 40) + [space.project(x) for x in rng.random((40, space.dim))]
    for p in points:
        assert space.is_valid(p), space.violations(p)
        cfg = space.config(p)
        assert tile_fits(isa, cfg.mr, cfg.nr, analysis.DV)
        assert cfg.mc % cfg.mr == 0 and cfg.nc % cfg.nr == 0 and cfg.nr % W == 0
        blocks = 4 * (cfg.mc * analysis.DK + cfg.nr * (analysis.DK + -(-analysis.DV // W) * W)
                      + cfg.mc * cfg.nc + cfg.mc * -(-analysis.DV // W) * W)
        assert blocks <= target.spec.l2 // 2


def test_the_register_constraint_prunes_tiles_that_do_not_fit(analysis):
    space = AttentionSpace(analysis, TARGETS["avx512"])
    too_wide = {"mr": 8, "nj_vec": 8, "mb_tiles": 1, "chunk_blocks": 1}        # 64 accumulators for S
    assert not space.is_valid(too_wide)
    assert "registers" in " ".join(space.violations(too_wide))


@pytest.mark.parametrize("isa", sorted(TARGETS))
def test_the_heuristic_tilings_are_points_of_the_space(analysis, isa):
    space = AttentionSpace(analysis, TARGETS[isa])
    cfgs = candidate_configs(isa, *analysis.hints(), analysis.DK, analysis.DV, TARGETS[isa].spec.l2)
    assert cfgs and any(c.nc > c.nr for c in cfgs)          # chunks wider than a key block
    for cfg in cfgs:
        p = space.point_of(cfg)
        assert p is not None and space.is_valid(p) and space.config(p) == cfg, (cfg, p)


def test_a_softmax_chunk_wider_than_the_keys_need_is_pruned(analysis):
    space = AttentionSpace(analysis, TARGETS["avx512"])     # keys up to 512 (DIMS: N's bound, capped)
    whole = {"mr": 4, "nj_vec": 4, "mb_tiles": 1, "chunk_blocks": 8}      # 8 x 64 = 512 keys: all of them
    twice = {**whole, "chunk_blocks": 16}                                  # 1024: half would hold them
    assert space.is_valid(whole), space.violations(whole)
    assert "chunk" in " ".join(space.violations(twice))


def test_a_bf16_target_with_amx_searches_16_row_tiles_and_32_key_steps(analysis):
    """bf16 on AMX: the attention runs on the tiles, so every point is one 16-row tile and a key
    block of 32 or 64 keys; fp32 on the same CPU keeps the SIMD tilings."""
    import dataclasses

    from tscomp.schedule.target import Target
    spec = dataclasses.replace(TARGETS["avx512"].spec, bf16=True, amx=True)
    amx = AttentionSpace(analysis, Target("cpu", "c", spec, precision="bf16"))
    assert amx.isa == "amx" and amx.initial()
    rng = np.random.default_rng(1)
    for p in amx.sample(rng, 30) + amx.initial():
        cfg = amx.config(p)
        assert cfg.mr == 16 and cfg.nr in (32, 64) and tile_fits("amx", cfg.mr, cfg.nr, analysis.DV)
    assert AttentionSpace(analysis, Target("cpu", "c", spec)).isa == "avx512"
