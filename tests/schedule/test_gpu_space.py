"""The CUDA target's SIMT GEMM space: hard constraints from the GpuSpec prune, the analytic model
ranks (unmeasured), the wave model picks variants per M; the top configuration builds without spills."""
from __future__ import annotations

import shutil

import pytest

from tscomp.codegen.simt.config import SimtTile
from tscomp.schedule.gpu_space import GpuGemmSpace, estimated_registers
from tscomp.schedule.target import cuda, host_cpu


@pytest.fixture(scope="module")
def space():
    return GpuGemmSpace(768, 3072, cuda("sm_80"), (1, 4096))


def test_every_configuration_respects_the_hard_limits(space):
    s = space.spec
    assert space.configs
    for t in space.configs:
        t.validate()
        assert t.threads <= s.max_threads_per_block and t.shared_bytes() <= min(s.smem_per_block, 48 * 1024)
        assert estimated_registers(t) * t.threads <= s.regs_per_block
        assert s.blocks_per_sm(space.resources(t)) >= 1


def test_a_configuration_over_a_limit_is_rejected(space):
    too_many_threads = SimtTile(128, 128, 8, 16, 8, 2, 2).validate()      # 4096 threads
    assert too_many_threads.threads > space.spec.max_threads_per_block and not space.feasible(too_many_threads)
    greedy = SimtTile(256, 128, 8, 64, 128, 16, 16).validate()            # 256 accumulators per thread
    assert estimated_registers(greedy) > space.spec.max_regs_per_thread and not space.feasible(greedy)


def test_ranking_is_analytic_and_unmeasured_and_covers_the_range(space):
    ranked = space.rank(limit=5)
    assert ranked[0].score >= 1.0 and ranked == sorted(ranked, key=lambda r: r.score)
    doc = ranked[0].to_json()
    assert doc["measured"] is False and doc["method"] == "analytic" and 0 < doc["occupancy"] <= 1
    variants = space.variants(3)
    assert len(variants) >= 2
    # the wave model: a small M prefers a variant with more, smaller blocks than the large-M choice
    small, large = space.choose(variants, 1), space.choose(variants, 4096)
    assert space.cost(small, 1) <= space.cost(large, 1)
    assert space.cost(large, 4096) <= space.cost(small, 4096)


def test_padding_waste_counts(space):
    t = space.rank(1)[0].tile
    assert space.cost(t, t.bm) == space.cost(t, 1)          # one padded M block costs as much as a full one


def test_a_cpu_target_is_refused():
    with pytest.raises(ValueError, match="CUDA target"):
        GpuGemmSpace(64, 64, host_cpu())


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not installed")
def test_top_configuration_builds_without_spills(space):
    from tscomp.codegen.nvcc import compile_cubin
    from tscomp.codegen.simt.gemm import gemm_body
    from tscomp.codegen.simt.program import SimtProgram
    t = space.rank(1)[0].tile
    p = SimtProgram("/* top */\n", gemm_body("k", t, 768, 3072), {"TS_WANT_ASYNC": 1} if t.async_copy else {})
    b = compile_cubin(p.cuda, "sm_80")
    assert not b.spills and b.resources["k"].registers <= 255


def test_tensor_core_tiles_only_on_request_and_ranked_faster():
    plain = GpuGemmSpace(768, 768, cuda("sm_80"), (1, 4096))
    assert not any(t.mma for t in plain.configs)
    tf32 = GpuGemmSpace(768, 768, cuda("sm_80"), (1, 4096), tf32=True)
    mma = [t for t in tf32.configs if t.mma]
    assert mma and all(t.validate() for t in mma)
    assert tf32.rank(1)[0].tile.mma        # the tensor cores' rate wins where allowed


def _h200_regrets(name):
    import json
    import pathlib

    import numpy as np
    from tscomp.schedule.gpu_space import gemm_cost
    rows = json.loads((pathlib.Path(__file__).parents[2] / "benchmarks/results" / name).read_text())
    spec = cuda("sm_90").spec
    out = []
    for r in rows:
        tiles = [SimtTile(**c) for c in r["configs"]]
        pred = [gemm_cost(spec, t, r["M"], r["K"], r["N"], reg) for t, reg in zip(tiles, r["registers"])]
        ms = r["measured_ms"]
        rho = np.corrcoef(np.argsort(np.argsort(pred)), np.argsort(np.argsort(ms)))[0, 1]
        out.append((ms[int(np.argmin(pred))], min(ms), ms[0], rho))
    return out


def test_the_calibrated_model_ranks_the_timings_measured_on_an_h200():
    """benchmarks/results/cuda_gemm_h200.json (what the constants were fitted to): BERT-base's GEMM
    shapes at M = 16..16384, 112 configurations each, timed on an H200. Among them the model's
    first choice is within 1.15x of the fastest (geomean), never slower than the previous
    ranking's first choice (each row's first configuration), and predicted and measured order
    agree (Spearman > 0.7 on average). On a later kernel's timings (_v2, not fitted) the first
    choice is still within 1.15x of the fastest (geomean)."""
    import numpy as np
    rows = _h200_regrets("cuda_gemm_h200.json")
    assert all(pick <= previous for pick, _, previous, _ in rows)
    assert np.exp(np.mean([np.log(p / b) for p, b, _, _ in rows])) < 1.15 and np.mean([r[3] for r in rows]) > 0.7
    later = _h200_regrets("cuda_gemm_h200_v2.json")
    assert np.exp(np.mean([np.log(p / b) for p, b, _, _ in later])) < 1.15


def test_variants_cover_the_range_rather_than_count_sample_wins():
    """Three samples: 'b' wins two small ones by a hair, 'c' is 3x better than 'a' at the large one.
    The second variant is 'c' (it lowers the set's mean relative cost most), not 'b' (most wins);
    nothing is added that does not help."""
    from tscomp.schedule.gpu_space import cover
    costs = {"a": [1.0, 1.0, 3.0], "b": [0.99, 0.99, 3.0], "c": [2.0, 2.0, 1.0]}
    assert cover(["a", "b", "c"], costs, 2) == ["a", "c"]
    assert cover(["a", "b", "c"], costs, 3) == ["a", "c", "b"]
    assert cover(["a", "b"], {"a": [1.0, 1.0], "b": [2.0, 2.0]}, 3) == ["a"]
    assert cover(["a", "b"], {"a": [1.0, float("inf")], "b": [2.0, 1.0]}, 2) == ["a", "b"]
