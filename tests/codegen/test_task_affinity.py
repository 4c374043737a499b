"""Affinity-first task claiming (tscomp.codegen.task_affinity): every task runs exactly once
whatever the team size -- thread 0 is slowed down, so the others steal from its share, and a team
smaller than the shares runs the missing threads' shares too."""
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

