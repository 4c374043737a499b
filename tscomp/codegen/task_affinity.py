"""Affinity-first task claiming for the macro-kernels' OpenMP task loops.

A weight-bound kernel (a GEMM at a short sequence: every call streams its packed weight panels)
runs at L2 speed only when each core finds *its* panels still in its own L2 from the previous
call. ``schedule(dynamic, 1)`` hands task t to whichever thread asks first, so which core reads
which panels changes from call to call and from shape to shape: after a call at another length,
half of a core's panels are in the other core's L2 (tiny BERT at L = 1: ~15% of the call, the
shape switch the first-call benchmark measures). ``schedule(static)`` keeps the assignment, but a
descheduled thread then holds up the whole call (issue 10: a server is rarely idle).

So each thread owns the same tasks at every call -- thread i those with ``t % nth == i``; a task
of a 2-D (row block, N block) loop stands for a block by :c:func:`ts_task_blocks`: where the N
blocks are a multiple of the threads, thread i's are the i-th contiguous 1/nth of them (the same
weight columns whatever M is, and whatever the block width: a GEMM's variants differ in ``nc``,
and a run-time cut at small M halves N; interleaved blocks, ``nb = t % n_nblocks``, left a core
half of the columns the other core had read at the previous shape -- ``benchmarks.gemm_variant_switch``:
a 256 x 1024 GEMM at M = 1 right after another variant at M = 64 paid 2.57 us over its steady
8.4 us, 1.45 us with contiguous shares), elsewhere N block innermost, so that with one N block
the row blocks alternate between the threads (the larger ones first: balanced) -- and claims them
in order; a thread whose own tasks are done claims what is left of the others' (the tasks of a
thread the OS descheduled are done by the one still running, as with ``dynamic``). One atomic
counter per thread, on its own cache line; every task is claimed exactly once because a claim is a
``fetch_add`` on its owner's counter.

The helpers are C text emitted into a kernel's source; :func:`claim_loop` writes the loop head.
"""
from __future__ import annotations

#: C: the shares and the claim (relaxed atomics: a counter only hands out indices; the task
#: loop's results are published by the barrier that ends the parallel region)
AFFINITY_C = r"""
/* Affinity-first task claiming: thread i owns tasks i, i + nth, i + 2 nth, ... at every call and
 * claims them in order; then what is left of the others'. */
typedef struct { int64_t next; char pad[56]; } ts_share;   /* one counter per cache line */

static inline void ts_shares_init(ts_share *s, int64_t nth)
{
    for (int64_t i = 0; i < nth; ++i) s[i].next = i;
}

/* the next of the n_tasks tasks for thread `tid`, or -1 when every share is exhausted; *from counts
 * the shares this thread has finished (its own first) */
static inline int64_t ts_claim(ts_share *s, int64_t n_tasks, int64_t nth, int64_t tid, int64_t *from)
{
    for (; *from < nth; ++*from) {
        ts_share *sh = &s[(tid + *from) % nth];
        if (__atomic_load_n(&sh->next, __ATOMIC_RELAXED) >= n_tasks) continue;
        const int64_t t = __atomic_fetch_add(&sh->next, nth, __ATOMIC_RELAXED);
        if (t < n_tasks) return t;
    }
    return -1;
}

/* task t of n_mblocks x n_nblocks -> its row block *mb and N block *nb: thread t % nth's tasks are
 * the (t % nth)-th contiguous 1/nth of the N blocks where they divide among the threads (the same
 * columns at every M and block width), otherwise N block innermost */
static inline void ts_task_blocks(int64_t t, int64_t nth, int64_t n_nblocks, int64_t *mb, int64_t *nb)
{
    if (n_nblocks % nth == 0) {
        const int64_t per = n_nblocks / nth, u = t / nth;   /* u: the task's place in its owner's share */
        *mb = u / per;
        *nb = t % nth * per + u % per;
    } else {
        *mb = t / n_nblocks;
        *nb = t % n_nblocks;
    }
}
"""


def shares_declaration(nth: str, indent: str = "    ") -> str:
    """C declaring and filling the shares (before the parallel region; ``nth`` the most threads)."""
    return (f"{indent}ts_share ts_shares[{nth}] __attribute__((aligned(64)));\n"
            f"{indent}ts_shares_init(ts_shares, {nth});")


def claim_loop(task: str, n_tasks: str, nth: str, indent: str) -> str:
    """C: the head of a loop over the tasks this thread claims (inside the parallel region), the
    task index in ``task``; the body follows and closes with ``}``. Every thread of any team size
    visits every share, so all tasks run even when the region runs on fewer threads than ``nth``."""
    return (f"{indent}int64_t ts_from = 0;\n"
            f"{indent}const int64_t ts_tid = omp_get_thread_num();\n"
            f"{indent}for (int64_t {task}; ({task} = ts_claim(ts_shares, {n_tasks}, {nth}, ts_tid, &ts_from)) >= 0; ) {{")


__all__ = ["AFFINITY_C", "claim_loop", "shares_declaration"]
