"""The split of a compile's tuning budget among its groups: by each group's probed share of a
request's time, heaviest first, a floor for the light ones; and the schedule stage's two passes
that use it."""
from __future__ import annotations

import math

import pytest

from tscomp.compiler import compile_model
from tscomp.schedule import schedules
from tscomp.schedule.schedules import TuningOptions
from tscomp.schedule.time_split import FLOOR, group_weights, lifted, share, tuning_order
from tests.schedule.test_schedules import DIMS, two_layer_mlp


def test_a_group_weighs_its_share_of_the_request_time_averaged_over_the_sample_shapes():
    # a: 5 occurrences of 1 ms at both shapes; b: once, 1 ms at the short shape and 15 ms at the long
    w = group_weights({"a": 5, "b": 1}, {"a": [1e-3, 1e-3], "b": [1e-3, 15e-3]})
    assert w == pytest.approx({"a": (5 / 6 + 5 / 20) / 2, "b": (1 / 6 + 15 / 20) / 2})


def test_the_weights_of_all_groups_sum_to_one_request():
    w = group_weights({"a": 2, "b": 1, "c": 3}, {"a": [1e-3, 4e-3, 9e-3], "b": [5e-3, 1e-3, 2e-3],
                                                 "c": [1e-4, 1e-2, 3e-3]})
    assert sum(w.values()) == pytest.approx(1.0)


def test_a_group_whose_probe_failed_or_did_not_run_weighs_the_mean_of_the_others():
    w = group_weights({"a": 1, "b": 1, "c": 2, "d": 1}, {"a": [1e-3], "b": [3e-3], "c": [math.inf], "d": None})
    assert w["a"] == pytest.approx(0.25) and w["b"] == pytest.approx(0.75)
    assert w["c"] == pytest.approx(0.5) and w["d"] == pytest.approx(0.5)


def test_with_no_finite_probe_every_group_weighs_its_occurrences():
    assert group_weights({"a": 3, "b": 1}, {"a": [math.inf], "b": None}) == {"a": 3.0, "b": 1.0}


def test_groups_are_tuned_heaviest_first_ties_in_plan_order():
    assert tuning_order({"a": 1.0, "b": 5.0, "c": 1.0, "d": 2.0}) == ["b", "d", "a", "c"]


def test_shares_are_proportional_to_the_weights_and_use_all_the_time():
    weights = [6.0, 3.0, 1.0]
    left, got = 100.0, []
    for i, w in enumerate(weights):
        s = share(left, w, weights[i:])
        got.append(s)
        left -= s
    assert got == pytest.approx([60.0, 30.0, 10.0]) and left == pytest.approx(0.0)


def test_a_light_group_is_lifted_to_the_floor_of_the_mean_weight_and_a_heavy_one_is_not():
    w = lifted({"heavy": 100.0, "light": 0.001, "middle": 20.0})
    mean = (100.0 + 0.001 + 20.0) / 3
    assert w == pytest.approx({"heavy": 100.0, "light": FLOOR * mean, "middle": 20.0})


def test_no_time_left_gives_no_share():
    assert share(0.0, 1.0, [1.0, 2.0]) == 0.0


class _FakeSearch:
    """A search whose probe 'measures' a given time at its one sample shape; records every run's
    budget and spends all of its time on ``clock`` (a probe: 2 s)."""

    def __init__(self, group, seconds, clock=None):
        self.group, self.probe_seconds, self.runs, self.trials = group, seconds, [], []
        self.clock = clock if clock is not None else [0.0]

    @property
    def best_sample_seconds(self):
        return [self.probe_seconds] if self.runs else None

    def run(self, trials, seconds):
        self.runs.append((trials, seconds))
        self.trials = [None] * trials
        self.clock[0] += 2.0 if len(self.runs) == 1 else (seconds or 0.0)

    def schedule(self, log):
        return self.group


def test_every_group_is_probed_once_then_the_trials_and_time_are_split_heaviest_first(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(schedules.time, "perf_counter", lambda: clock[0])
    searches = {"light": _FakeSearch("g_light", 1e-3, clock), "heavy": _FakeSearch("g_heavy", 4e-3, clock)}
    options = TuningOptions(tune=True, trials=20, seconds=500.0)
    lines = []
    done = schedules._run_searches(searches, {"light": 1, "heavy": 3}, options, 0.0, lines.append)
    assert list(done.items()) == [("heavy", "g_heavy"), ("light", "g_light")]     # each scheduled as it ends
    light, heavy = searches["light"].runs, searches["heavy"].runs
    assert light[0][0] == heavy[0][0] == schedules.PROBE_TRIALS          # the probes
    # weights 12 : 1, the light one lifted to the floor, 1.625: 38 of the 40 trials and 496 s left
    assert heavy[1] == (1 + round(38 * 12 / 13.625), pytest.approx(496 * 12 / 13.625))
    assert light[1] == (40 - heavy[1][0], pytest.approx(496 * 1.625 / 13.625))
    assert "g_heavy 88%" in lines[0] and lines[0].index("g_heavy") < lines[0].index("g_light")


def test_without_a_time_cap_the_trials_alone_are_split():
    searches = {"a": _FakeSearch("g_a", 1e-3), "b": _FakeSearch("g_b", 1e-3)}
    schedules._run_searches(searches, {"a": 1, "b": 4}, TuningOptions(tune=True, trials=6, seconds=None), 0.0, None)
    # weights 1 : 4: b takes 4/5 of the 10 trials left after the probes, a the rest
    assert searches["b"].runs == [(1, None), (1 + 8, None)] and searches["a"].runs == [(1, None), (1 + 2, None)]


def test_one_group_runs_its_trials_in_one_pass():
    search = _FakeSearch("g_a", 1e-3)
    schedules._run_searches({"a": search}, {"a": 4}, TuningOptions(tune=True, trials=5, seconds=None), 0.0, None)
    assert search.runs == [(5, None)]


def test_a_compile_spends_its_trials_exactly_each_probe_counted_once(tmp_path):
    """Two distinct GEMM groups, 3 trials each on average, a time cap that does not bind: together
    they run the 6 trials (each probe measured once, then known to the second pass), each at least
    its probe."""
    path = two_layer_mlp(tmp_path / "mlp.onnx", layers=1)
    model = compile_model(path, DIMS, tuning=TuningOptions(tune=True, trials=3, seconds=900.0, timeout_s=30,
                                                           isolate=False))
    tuned = [s for s in model.schedules.groups.values() if s.method == "turbo"]
    assert len(tuned) == 2 and sum(s.trials for s in tuned) == 6 and min(s.trials for s in tuned) >= 1, \
        [(s.group, s.method, s.trials) for s in tuned]
