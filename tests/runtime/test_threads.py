"""Worker threads under contention (issue 10): the wait policy libgomp actually uses, and numpy's
BLAS kept to the calling thread during a tscomp call."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from tscomp.runtime import threads


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra)
    return env


def test_loaded_libgomp_uses_the_short_spin():
    """Set before libgomp loads (its constructor reads the environment once), so it takes effect."""
    got = threads.openmp_wait_settings(_env())
    assert got.get("GOMP_SPINCOUNT") == str(threads.DEFAULT_SPINCOUNT)


def test_a_users_wait_policy_wins():
    got = threads.openmp_wait_settings(_env(OMP_WAIT_POLICY="active"))
    assert got.get("OMP_WAIT_POLICY") == "ACTIVE"
    assert int(got["GOMP_SPINCOUNT"]) > threads.DEFAULT_SPINCOUNT


def test_blas_is_single_threaded_inside_and_restored_after():
    before = threads.blas_threads()
    if before is None:
        pytest.skip("numpy is not linked against OpenBLAS here")
    with threads.blas_single_threaded:
        assert threads.blas_threads() == 1
        with threads.blas_single_threaded:
            assert threads.blas_threads() == 1
        assert threads.blas_threads() == 1
        np.dot(np.ones((64, 64)), np.ones((64, 64)))
    assert threads.blas_threads() == before


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to place a worker on another")
def test_workers_stay_off_the_callers_cpu_and_follow_it_when_it_moves():
    from tscomp.codegen.build import set_num_threads

    placement = threads.TeamPlacement()
    set_num_threads(2)
    allowed = os.sched_getaffinity(0)
    placement.release()            # this thread's team (C thread-local state) as if never placed
    try:
        assert placement.enter(2) is True
        st = placement.state()
        worker, cpu = int(st.tids[1]), int(st.cpu)
        assert worker != threading.get_native_id() and cpu in allowed
        assert cpu not in os.sched_getaffinity(worker) and os.sched_getaffinity(0) == allowed
        # the next call places nothing unless the caller has moved to another CPU meanwhile
        again = placement.enter(2)
        assert again is False or int(st.cpu) != cpu
        # the caller seen on another CPU than the one the worker was placed against: placed again
        st.cpu = max(allowed) + 1
        assert placement.enter(2) is True
        assert int(st.cpu) in allowed and int(st.cpu) not in os.sched_getaffinity(worker)
    finally:
        placement.release()
    assert os.sched_getaffinity(worker) == allowed
    assert placement.enter(1) is False          # a one-thread team has no workers to place
