"""Affinity-first task claiming (tscomp.codegen.task_affinity): every task runs exactly once
whatever the team size -- thread 0 is slowed down, so the others steal from its share, and a team
smaller than the shares runs the missing threads' shares too; and the task -> (row block, N
block) map covers every block once and gives each thread the same contiguous columns at every
block width."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tscomp.codegen.build import build_library, get_num_threads, load_library, set_num_threads
from tscomp.codegen.task_affinity import AFFINITY_C, claim_loop, shares_declaration

_SOURCE = f"""#include <stdint.h>
#include <omp.h>
{AFFINITY_C}
/* runs[t] += 1 and owner[t] = the thread that ran task t; `team` threads, or one (if false) */
void claim_all(int64_t n_tasks, int64_t team, int64_t *runs, int64_t *owner)
{{
    const int64_t nth = omp_get_max_threads();
{shares_declaration('nth')}
    #pragma omp parallel num_threads(team)
    {{
{claim_loop('t', 'n_tasks', 'nth', '        ')}
            __atomic_fetch_add(&runs[t], 1, __ATOMIC_RELAXED);
            owner[t] = omp_get_thread_num();
            if (omp_get_thread_num() == 0) {{ volatile double x = 0; for (int i = 0; i < 20000; ++i) x += i; }}
        }}
    }}
}}
"""


@pytest.fixture(scope="module")
def claim_all():
    lib = load_library(build_library(_SOURCE, "test_task_affinity"))
    fn = lib.claim_all
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]

    def run(n_tasks: int, team: int):
        runs, owner = np.zeros(max(n_tasks, 1), np.int64), np.full(max(n_tasks, 1), -1, np.int64)
        fn(n_tasks, team, runs.ctypes.data, owner.ctypes.data)
        return runs[:n_tasks], owner[:n_tasks]
    return run


@pytest.mark.parametrize("max_threads", [1, 2, 3, 5])
def test_every_task_runs_exactly_once_for_any_team_and_task_count(claim_all, max_threads):
    """Shares for ``max_threads`` threads; teams of 1 .. max_threads; 0 .. 61 tasks."""
    before = get_num_threads()
    try:
        set_num_threads(max_threads)
        for team in range(1, max_threads + 1):       # a team smaller than the shares: the others are stolen
            for n_tasks in (0, 1, 2, 3, 7, 16, 61):
                runs, _ = claim_all(n_tasks, team)
                assert (runs == 1).all(), (max_threads, team, n_tasks, runs)
    finally:
        set_num_threads(before)


_BLOCKS_SOURCE = f"""#include <stdint.h>
#include <omp.h>
{AFFINITY_C}
/* mb[t], nb[t] of every task t */
void task_blocks(int64_t n_tasks, int64_t nth, int64_t n_nblocks, int64_t *mb, int64_t *nb)
{{
    for (int64_t t = 0; t < n_tasks; ++t) ts_task_blocks(t, nth, n_nblocks, &mb[t], &nb[t]);
}}
"""


@pytest.fixture(scope="module")
def task_blocks():
    fn = load_library(build_library(_BLOCKS_SOURCE, "test_task_blocks")).task_blocks
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]

    def run(n_mblocks: int, n_nblocks: int, nth: int):
        n = n_mblocks * n_nblocks
        mb, nb = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        fn(n, nth, n_nblocks, mb.ctypes.data, nb.ctypes.data)
        return mb, nb
    return run


@pytest.mark.parametrize("nth", [1, 2, 3, 4])
def test_task_blocks_cover_every_row_and_column_block_once(task_blocks, nth):
    for n_mblocks in (1, 2, 3, 7):
        for n_nblocks in (1, 2, 3, 4, 6, 8, 12):
            mb, nb = task_blocks(n_mblocks, n_nblocks, nth)
            pairs = set(zip(mb.tolist(), nb.tolist()))
            assert pairs == {(m, n) for m in range(n_mblocks) for n in range(n_nblocks)}, (nth, n_mblocks, n_nblocks)


@pytest.mark.parametrize("nth", [2, 3, 4])
def test_a_thread_owns_the_same_columns_whatever_the_block_width_and_row_blocks(task_blocks, nth):
    """Thread i (the owner of tasks t % nth == i) computes the i-th contiguous 1/nth of the columns
    whenever the N blocks divide among the threads: a variant with narrower blocks, or more row
    blocks, reads the same weight columns on the same core."""
    columns = 24 * nth       # in units of the narrowest block
    for n_nblocks in (nth, 2 * nth, 3 * nth, 6 * nth):
        width = columns // n_nblocks
        for n_mblocks in (1, 2, 5):
            _, nb = task_blocks(n_mblocks, n_nblocks, nth)
            for i in range(nth):
                owned = {c for t in range(i, len(nb), nth) for c in range(nb[t] * width, (nb[t] + 1) * width)}
                share = columns // nth
                assert owned == set(range(i * share, (i + 1) * share)), (nth, n_nblocks, n_mblocks, i)
