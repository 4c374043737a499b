"""The measurement harness contains a crashing and a hanging candidate (issue 8, acceptance 4):
each costs one failed measurement, and the worker is restarted for the next candidate."""
import ctypes
import time

import numpy as np
import pytest

from tscomp.codegen.build import build_library
from tscomp.schedule.measure import Measurement, Measurer, Workload, measure_inline

CRASH_C = """
int tscomp_test_crash(int n) { volatile int *p = 0; return *p + n; }
int tscomp_test_spin(int n) { volatile long i = 0; for (;;) i += n; return (int)i; }
"""


class NativeCandidate:
    """Calls one function of a C library; pickles as its path and symbol, loads on first run
    (as tscomp's kernels rebind their entry point)."""

    def __init__(self, lib: str, symbol: str):
        self.lib, self.symbol, self.fn = lib, symbol, None

    def __getstate__(self):
        return {"lib": self.lib, "symbol": self.symbol, "fn": None}

    def run(self, env, binding):
        if self.fn is None:
            self.fn = getattr(ctypes.CDLL(self.lib), self.symbol)
        return {"y": self.fn(binding["M"])}


class MatmulCandidate:
    def run(self, env, binding):
        return {"y": env["x"][: binding["M"]] @ env["w"]}


class RaisingCandidate:
    def run(self, env, binding):
        raise RuntimeError("tile config rejected")


class SleepingCandidate:
    def run(self, env, binding):
        while True:
            time.sleep(0.01)


@pytest.fixture(scope="module")
def lib():
    return str(build_library(CRASH_C, "tscomp_test_crash"))


def workload():
    rng = np.random.default_rng(0)
    env = {"x": rng.standard_normal((64, 32)).astype(np.float32),
           "w": rng.standard_normal((32, 16)).astype(np.float32)}
    return Workload("matmul-64x32x16", [({"M": 8}, env), ({"M": 64}, env)])


def test_crash_and_hang_are_contained_and_the_worker_restarts(lib):
    wl = workload()
    with Measurer(threads=1, timeout_s=3.0, repeats=3) as m:
        first = m.measure(MatmulCandidate(), wl)
        assert first.ok and len(first.seconds) == 2 and all(s > 0 for s in first.seconds)
        pid = m.pid

        crashed = m.measure(NativeCandidate(lib, "tscomp_test_crash"), wl)
        assert not crashed.ok and "crash" in crashed.error and crashed.total == float("inf")
        assert "signal 11" in crashed.error or "SIGSEGV" in crashed.error or "SIGBUS" in crashed.error

        t0 = time.monotonic()
        hung = m.measure(NativeCandidate(lib, "tscomp_test_spin"), wl)
        assert not hung.ok and "timed out after 3s" in hung.error
        assert time.monotonic() - t0 < 3.0 + 60  # the candidate's deadline plus a worker start

        t0 = time.monotonic()
        hung = m.measure(SleepingCandidate(), wl)
        assert not hung.ok and "timed out" in hung.error

        after = m.measure(MatmulCandidate(), wl)
        assert after.ok and len(after.seconds) == 2
        assert m.pid != pid and m.starts >= 3  # restarted after the crash and the hangs


def test_python_exception_keeps_the_worker():
    wl = workload()
    with Measurer(threads=1, timeout_s=10.0, repeats=2) as m:
        assert m.measure(MatmulCandidate(), wl).ok
        pid = m.pid
        failed = m.measure(RaisingCandidate(), wl)
        assert not failed.ok and "RuntimeError: tile config rejected" in failed.error
        assert m.measure(MatmulCandidate(), wl).ok and m.pid == pid and m.starts == 1
        unpicklable = m.measure(lambda: None, wl)  # refused in the parent, nothing sent
        assert not unpicklable.ok and "pickled" in unpicklable.error
    assert m.pid is None


class CountingCandidate:
    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def run(self, env, binding):
        # fake the clock: each run "takes" the next listed duration
        time.sleep(self.times[min(self.calls, len(self.times) - 1)])
        self.calls += 1


def test_inline_timing_median_and_outlier_retry():
    wl = Workload("one", [({"M": 1}, {})])
    steady = CountingCandidate([0.002] * 10)
    m = measure_inline(steady, wl, warmup=1, repeats=3, max_spread=1e9)
    assert m.ok and steady.calls == 4 and m.seconds[0] == pytest.approx(0.002, abs=0.02)
    # warm-up, then a wildly spread first set of repeats: the case is re-measured once
    noisy = CountingCandidate([0.0, 0.0, 0.05, 0.0, 0.0] + [0.001] * 10)
    m = measure_inline(noisy, wl, warmup=1, repeats=3, max_spread=0.15)
    assert m.ok and noisy.calls >= 4 + 3
    assert measure_inline(RaisingCandidate(), wl) == Measurement(False, [], "RuntimeError: tile config rejected")


def test_every_case_is_timed_with_the_openmp_workers_kept_off_the_measuring_cpu(monkeypatch):
    # a worker that slept between candidates wakes onto the measuring thread's CPU on a KVM guest;
    # each case places the team first, as Runtime.run does before a call
    from tscomp.codegen.build import get_num_threads, set_num_threads
    from tscomp.runtime import threads
    set_num_threads(2)
    placed = []
    monkeypatch.setattr(threads.team_placement, "enter", lambda n: placed.append(n) or False)
    wl = Workload("two", [({"M": 1}, {}), ({"M": 2}, {})])
    assert measure_inline(CountingCandidate([0.0]), wl, warmup=1, repeats=3).ok
    assert placed == [get_num_threads()] * 2
