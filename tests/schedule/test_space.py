"""DiscreteSpace: constraints prune, projection lands on valid points, populations are valid."""
import numpy as np
import pytest

from tscomp.schedule.space import Axis, Constraint, DiscreteSpace


def small_space(initial=()):
    axes = [Axis("a", (1, 2, 4, 8)), Axis("b", (8, 16, 32)), Axis("c", (3,))]
    cons = [Constraint("area", lambda p: p["a"] * p["b"] <= 64, "a*b <= 64 accumulators")]
    return DiscreteSpace(axes, cons, initial, name="small")


def test_enumerate_excludes_violators_and_violations_name_the_constraint():
    space = small_space()
    points = space.enumerate()
    assert len(space) == len(points) == 9  # 12 raw, (4,32) (8,16) (8,32) pruned
    assert all(p["a"] * p["b"] <= 64 for p in points)
    assert space.violations({"a": 8, "b": 32, "c": 3}) == ["a*b <= 64 accumulators"]
    assert not space.is_valid({"a": 8, "b": 32, "c": 3})
    assert space.violations({"a": 3, "b": 8, "c": 3}) == ["a=3 is not one of [1, 2, 4, 8]"]
    assert space.violations({"a": 1, "b": 8}) == ["axis c has no value"]
    assert space.enumerate() is points  # cached


def test_encode_decode():
    space = small_space()
    p = {"a": 4, "b": 16, "c": 3}
    np.testing.assert_allclose(space.encode(p), [2 / 3, 0.5, 0.5])
    assert space.decode(space.encode(p)) == p
    assert space.decode([1.0, 1.0, 0.0]) == {"a": 8, "b": 32, "c": 3}  # decode may be invalid
    assert space.key(p) == (4, 16, 3)


def test_projection_is_valid_and_fixes_valid_points():
    space = small_space()
    for p in space.enumerate():
        assert space.project(space.encode(p)) == p
    rng = np.random.default_rng(0)
    for x in rng.random((200, 3)):
        q = space.project(x)
        assert space.is_valid(q)
        # exact nearest valid point
        best = min(np.linalg.norm(space.encode(v) - x) for v in space.enumerate())
        assert np.linalg.norm(space.encode(q) - x) == pytest.approx(best)
    # the invalid corner projects to a valid neighbour
    assert space.is_valid(space.project([1.0, 1.0, 0.5]))


def test_initial_and_sample_are_valid():
    space = small_space(initial=[{"a": 2, "b": 16, "c": 3}, {"a": 8, "b": 32, "c": 3},
                                 {"a": 2, "b": 16, "c": 3}, {"a": 5, "b": 8, "c": 3}])
    assert space.initial() == [{"a": 2, "b": 16, "c": 3}]  # invalid and repeated ones dropped
    sample = space.sample(np.random.default_rng(1), 5)
    assert len(sample) == 5 and len({space.key(p) for p in sample}) == 5
    assert all(space.is_valid(p) for p in sample)
    assert len(space.sample(0, 100)) == len(space)


def test_empty_space():
    space = DiscreteSpace([Axis("a", (1, 2))], [Constraint("never", lambda p: False, "nothing fits")])
    assert len(space) == 0
    assert space.project([0.5]) is None
    assert space.sample(0, 3) == []
