"""Solo calls: a short request that arrives while the OpenMP workers sleep runs on the calling
thread alone, a burst of them wakes the team once it lost what a wake-up costs, long requests and
requests that find the team spinning use it -- and every one gives the team's results exactly."""
from __future__ import annotations

import math
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tscomp.codegen.build import get_num_threads
from tscomp.runtime import Runtime
from tscomp.runtime.solo_calls import (LIBGOMP_DEFAULT_SPINS, LIBGOMP_THROTTLED_SPINS, SOLO_MARGIN, calibrate,
                                       ladder, seconds_per_spin, spin_iterations)

#: a window the test's back-to-back calls never exceed, and a pause well past it
WINDOW_NS, PAUSE = 50_000_000, 0.2


@pytest.fixture(scope="module")
def bert(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2)
    if rt._request is None:
        pytest.skip(f"no C request path: {rt.request_path_note}")
    return rt


def _inputs(seq: int, seed: int = 0) -> dict:
    from models.families import make_inputs

    return make_inputs("bert", {"batch": 1, "sequence": seq}, np.random.default_rng(seed))


def test_spin_iterations_follow_libgomps_environment_rules(monkeypatch):
    monkeypatch.setattr("tscomp.runtime.solo_calls._available_cpus", lambda: 4)
    assert spin_iterations(2, {}) == LIBGOMP_DEFAULT_SPINS
    assert spin_iterations(2, {"GOMP_SPINCOUNT": "10000"}) == 10000
    assert spin_iterations(2, {"GOMP_SPINCOUNT": "10k"}) == 10000
    assert spin_iterations(2, {"GOMP_SPINCOUNT": "2M"}) == 2_000_000
    assert math.isinf(spin_iterations(2, {"GOMP_SPINCOUNT": "infinite"}))
    assert math.isinf(spin_iterations(2, {"OMP_WAIT_POLICY": "active"}))
    assert spin_iterations(2, {"OMP_WAIT_POLICY": "passive"}) == 0
    assert spin_iterations(2, {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "500"}) == 500   # the count wins
    assert spin_iterations(2, {"GOMP_SPINCOUNT": "junk"}) == LIBGOMP_DEFAULT_SPINS            # ignored, as libgomp does
    assert spin_iterations(8, {"GOMP_SPINCOUNT": "10000"}) == LIBGOMP_THROTTLED_SPINS         # more threads than CPUs


def test_one_spin_iteration_takes_a_measurable_sub_microsecond_time():
    assert 0 < seconds_per_spin() < 1e-6


def test_the_ladder_doubles_every_symbol_within_its_range():
    syms = [SimpleNamespace(name="batch", min=1, max=3), SimpleNamespace(name="sequence", min=1, max=512)]
    rungs = ladder(syms)
    assert rungs[:3] == [{"batch": 1, "sequence": 1}, {"batch": 2, "sequence": 2}, {"batch": 3, "sequence": 4}]
    assert rungs[-1] == {"batch": 3, "sequence": 512} and len(rungs) == 10


def test_requests_run_solo_only_while_the_team_sleeps_and_the_request_is_short(bert):
    reference = Runtime(bert.path, num_threads=2, warmup=False)
    reference._request = None                      # the Python path: always the team
    short, long_ = _inputs(3, seed=1), _inputs(64, seed=2)
    want = {n: reference.run(x) for n, x in (("short", short), ("long", long_))}
    bert._request.set_solo(WINDOW_NS, 3 * 8, 1, 1.0)   # requests of <= 8 tokens; the first solo one ends a run
    try:
        seen = []

        def call(name, x):
            got = bert.run(x)
            seen.append(bert.last_call_threads)
            for k in want[name]:
                np.testing.assert_array_equal(got[k], want[name][k])    # whatever the thread count
            assert get_num_threads() == 2                                # the thread's setting is kept

        call("long", long_)        # the team
        call("short", short)       # finds it spinning
        time.sleep(PAUSE)
        call("short", short)       # asleep: solo
        call("short", short)       # right after: the run lost more than the (1 ns) wake-up: the team
        call("short", short)       # spinning again
        time.sleep(PAUSE)
        call("long", long_)        # asleep, but long: the team
        time.sleep(PAUSE)
        bert._request.set_solo(WINDOW_NS, 3 * 8, 1 << 40, 0.0)   # solo calls that lose nothing never wake it
        call("short", short)
        call("short", short)
        call("short", short)
        assert seen == [2, 2, 1, 2, 2, 2, 1, 1, 1]
    finally:
        bert.calibrate_solo_calls()


def test_calibration_bounds_solo_calls_at_the_last_rung_one_thread_won(bert):
    policy = bert.solo_policy
    assert policy.rungs, policy.describe()
    if not policy.active:          # the team won at the smallest shape: nothing runs solo, and it says why
        assert policy.reason and policy.rungs[0].solo >= policy.rungs[0].team * (1 - SOLO_MARGIN)
        return
    won = [r for r in policy.rungs if r.solo < r.team * (1 - SOLO_MARGIN)]
    assert policy.max_elements == won[-1].elements
    assert policy.rungs.index(won[-1]) == len(won) - 1          # the bound is the last of the first winners
    assert policy.window > 0 and policy.wake >= 0 and 0 <= policy.loss < 1
    assert f"<= {policy.max_elements} input elements" in policy.describe()


def test_solo_calls_are_off_where_the_workers_never_sleep_or_there_is_one_thread(bert, monkeypatch):
    assert not Runtime(bert.path, num_threads=1).solo_policy.active
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    try:
        policy = calibrate(bert._request, bert.graph, 2)
        assert not policy.active and "never sleep" in policy.reason
        bert.run(_inputs(2))
        time.sleep(PAUSE)
        bert.run(_inputs(2))
        assert bert.last_call_threads == 2
    finally:
        monkeypatch.undo()
        bert.calibrate_solo_calls()


class _FakeRequest:
    """A request path whose one-thread outputs differ from its team's in the last bit."""

    def __init__(self):
        self.settings = []

    def set_solo(self, window_ns, max_elements, wake_ns=0, loss=0.0):
        self.settings.append((window_ns, max_elements))

    def __call__(self, inputs):
        solo = self.settings[-1][1] > 0
        one = np.float32(1.0)
        return {"y": np.array([one, np.nextafter(one, np.float32(2.0)) if solo else one], np.float32)}


def test_a_model_whose_results_depend_on_the_thread_count_never_runs_solo(monkeypatch):
    monkeypatch.setattr("tscomp.sample_inputs.random_inputs", lambda graph, binding, rng: {"x": np.zeros(3)})
    monkeypatch.setattr("tscomp.runtime.solo_calls.spin_window", lambda threads: 1e-5)
    graph = SimpleNamespace(symbols=SimpleNamespace(live_symbols=lambda: [SimpleNamespace(name="n", min=1, max=1)]))
    request = _FakeRequest()
    policy = calibrate(request, graph, 2)
    assert not policy.active and "output y on one thread differs from the team's" in policy.reason
    assert request.settings[-1][1] == -1              # the request path was left with solo calls off
