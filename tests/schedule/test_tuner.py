"""The TuRBO tuner on synthetic objectives: trust-region logic, budget and bookkeeping
invariants, and search quality against random search (fixed seeds, no timing)."""
import math

import numpy as np
import pytest

from tscomp.schedule.space import Axis, Constraint, DiscreteSpace
from tscomp.schedule.tuner import (Budget, TrustRegion, TuningResult, Trial, global_gp_search,
                                   random_search, tune)


def gemm_like_space():
    """~2,000 valid points over five GEMM-like tile axes, with hard constraints and a small
    hardware-aligned initial population."""
    axes = [Axis("mb", (4, 8, 16, 32, 48, 64, 96, 128)), Axis("nb", (8, 16, 32, 64, 96, 128, 192, 256)),
            Axis("kb", (16, 32, 64, 128, 256, 512)), Axis("mr", (1, 2, 3, 4, 6, 8)),
            Axis("nr", (8, 16, 24, 32))]
    cons = [Constraint("tile", lambda p: p["mb"] * p["nb"] <= 1024, "block tile <= 1024 floats"),
            Constraint("regs", lambda p: p["mr"] * p["nr"] // 8 + p["nr"] // 8 <= 14, "accumulators <= 14 ymm"),
            Constraint("fit", lambda p: p["mr"] <= p["mb"], "register tile inside the block")]
    init = [dict(mb=16, nb=64, kb=256, mr=4, nr=16), dict(mb=8, nb=128, kb=128, mr=6, nr=16),
            dict(mb=32, nb=32, kb=64, mr=2, nr=32), dict(mb=64, nb=16, kb=512, mr=8, nr=8)]
    return DiscreteSpace(axes, cons, init, name="synthetic-gemm")


C1 = np.array([0.75, 0.3, 0.6, 0.45, 0.65])
C2 = np.array([0.2, 0.7, 0.3, 0.8, 0.3])


def multimodal(space):
    """Two basins (the deeper one away from the initial population) with a cusp at each
    minimum and a ripple: random sampling rarely lands within 5% of the optimum."""
    def f(point):
        x = space.encode(point)
        basin = min(2.5 * np.linalg.norm(x - C1), 0.25 + 2.5 * np.linalg.norm(x - C2))
        return 1e-3 * (1.0 + basin + 0.05 * np.sum(np.cos(4 * np.pi * x)))
    return f


# -- TrustRegion -------------------------------------------------------------------------------

def test_trust_region_expands_after_successes_and_is_bounded():
    tr = TrustRegion(center=np.full(3, 0.5), length=0.4, succ_tol=3, fail_tol=4)
    for _ in range(2):
        tr.record(True)
    assert tr.length == 0.4
    tr.record(True)
    assert tr.length == 0.8 and tr.successes == 0
    for _ in range(6):
        tr.record(True)
    assert tr.length == 1.0  # L_max
    lo, hi = tr.box()
    np.testing.assert_allclose(lo, 0.0)
    np.testing.assert_allclose(hi, 1.0)


def test_trust_region_shrinks_after_failures_and_collapses():
    tr = TrustRegion(center=np.array([0.9, 0.1]), length=0.4, length_min=0.06, fail_tol=4)
    for _ in range(3):
        tr.record(False)
    assert tr.length == 0.4
    tr.record(True)  # a success breaks the run of failures
    for _ in range(3):
        tr.record(False)
    assert tr.length == 0.4
    tr.record(False)
    assert tr.length == 0.2 and not tr.collapsed
    lo, hi = tr.box()
    np.testing.assert_allclose(lo, [0.8, 0.0])  # clipped to the cube
    np.testing.assert_allclose(hi, [1.0, 0.2])
    for _ in range(8):
        tr.record(False)
    assert tr.length == 0.05 and tr.collapsed
    # the tuner widens tiny boxes to one grid step per axis
    lo, hi = tr.box(min_half=0.25)
    np.testing.assert_allclose(lo, [0.65, 0.0])


# -- invariants --------------------------------------------------------------------------------

def test_budget_needs_a_limit():
    with pytest.raises(ValueError):
        Budget()


def test_tune_respects_budget_never_repeats_and_stays_valid():
    space = gemm_like_space()
    calls = []

    def objective(p):
        calls.append(space.key(p))
        return multimodal(space)(p)

    result = tune(space, objective, budget=Budget(trials=40), seed=3, batch_size=3)
    assert len(result.trials) == 40 == len(calls)
    assert len(set(calls)) == 40
    assert all(space.is_valid(t.point) for t in result.trials)
    assert [t.source for t in result.trials[:4]] == ["initial"] * 4  # the population comes first
    assert {t.source for t in result.trials[4:]} <= {"turbo", "restart"}
    assert all(t.region is not None for t in result.trials[4:])
    assert result.best_so_far() == sorted(result.best_so_far(), reverse=True)
    assert result.best().value == min(t.value for t in result.trials)


def test_initial_values_count_without_calling_the_objective():
    space = gemm_like_space()
    known = {space.key(p): 5e-3 for p in space.initial()[:2]}
    seen = []

    def objective(p):
        assert space.key(p) not in known
        seen.append(space.key(p))
        return multimodal(space)(p)

    result = tune(space, objective, budget=Budget(trials=10), seed=0, initial_values=known)
    assert len(result.trials) == 10 and len(seen) == 8
    assert [t.source for t in result.trials[:2]] == ["known", "known"]


def test_failed_candidates_do_not_break_the_search():
    space = gemm_like_space()
    f = multimodal(space)

    def objective(p):  # a third of the space "crashes"; the first initial point too
        return math.inf if (p["kb"] == 256 or p["mr"] == 3) else f(p)

    result = tune(space, objective, budget=Budget(trials=30), seed=1)
    assert len(result.trials) == 30
    assert any(math.isinf(t.value) for t in result.trials)
    assert math.isfinite(result.best().value)
    assert all(math.isfinite(t.value) for t in result.top(3))


def test_small_space_is_exhausted_without_repeats():
    space = DiscreteSpace([Axis("a", (1, 2, 3, 4)), Axis("b", (1, 2, 3))],
                          [Constraint("c", lambda p: p["a"] + p["b"] <= 6, "a + b <= 6")])
    result = tune(space, lambda p: float((p["a"] - 2) ** 2 + p["b"]), budget=Budget(trials=100), seed=0)
    assert len(result.trials) == len(space) == 11
    assert result.best().point == {"a": 2, "b": 1}


def test_time_budget_and_progress_callback():
    space = gemm_like_space()
    ticks = []
    result = tune(space, multimodal(space), budget=Budget(seconds=0.0), progress=lambda *a: ticks.append(a))
    assert result.trials == [] and ticks == []
    result = tune(space, multimodal(space), budget=Budget(trials=6), progress=lambda *a: ticks.append(a))
    assert [t[0] for t in ticks] == [1, 2, 3, 4, 5, 6] and ticks[-1][1] == 6
    assert ticks[-1][2] == result.best().value


def test_top_distinct_by():
    trials = [Trial({"a": a, "b": b}, v, "turbo", 1, 0, 0.0)
              for a, b, v in [(1, 1, 3.0), (1, 2, 1.0), (2, 1, 2.0), (2, 2, math.inf), (3, 1, 4.0)]]
    result = TuningResult(trials)
    assert [t.value for t in result.top(2)] == [1.0, 2.0]
    assert [t.point["a"] for t in result.top(5, distinct_by=lambda p: p["a"])] == [1, 2, 3]
    assert result.best_so_far() == [3.0, 1.0, 1.0, 1.0, 1.0]


def test_baselines_respect_the_budget():
    space = gemm_like_space()
    for search in (random_search, global_gp_search):
        result = search(space, multimodal(space), budget=Budget(trials=14), seed=0)
        keys = [space.key(t.point) for t in result.trials]
        assert len(keys) == 14 == len(set(keys))
        assert all(space.is_valid(t.point) for t in result.trials)


# -- search quality ----------------------------------------------------------------------------

def test_turbo_finds_near_optimum_with_a_tenth_of_the_space_and_beats_random():
    space = gemm_like_space()
    f = multimodal(space)
    optimum = min(f(p) for p in space.enumerate())
    budget = Budget(trials=len(space) // 10)
    turbo = [tune(space, f, budget=budget, seed=s, batch_size=4).best().value / optimum for s in range(3)]
    rand = [random_search(space, f, budget=budget, seed=s).best().value / optimum for s in range(3)]
    assert sum(r <= 1.05 for r in turbo) >= 2, (turbo, rand)
    assert np.mean(turbo) < np.mean(rand), (turbo, rand)


def test_progress_bar_shows_best_so_far(capsys):
    space = gemm_like_space()
    tune(space, multimodal(space), budget=Budget(trials=5), progress=True)
    err = capsys.readouterr().err
    assert "5/5" in err and "best" in err and " ms" in err
