"""Worker threads that yield the CPU: the OpenMP wait policy of the kernels and numpy's BLAS pool
(issue 10, "robust under contention").

Two pools compete for the cores when tscomp runs: the kernels' OpenMP team (GCC's libgomp) and,
behind a numpy fallback group, numpy's OpenBLAS threads. Both spin after their work by default —
libgomp for ``GOMP_SPINCOUNT`` = 300,000 iterations (milliseconds) at every barrier and between
parallel regions, OpenBLAS for a comparable time after each call — so on a machine where another
process (or the other pool) wants the same cores, spinning threads are descheduled mid-region and
every barrier waits for a time slice.

* **OpenMP.** libgomp reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, in its load-time
  constructor (``initialize_env`` in libgomp's env.c): setting them after the library is loaded
  changes nothing. :func:`configure_openmp_wait` therefore runs when ``tscomp`` is imported, before
  any kernel library (which links libgomp) is loaded, and sets a *short* spin
  (:data:`DEFAULT_SPINCOUNT` iterations, tens of microseconds: a worker still catches the next
  parallel region of the same inference without a futex wake-up, but gives its core away soon
  after) — unless the user set either variable, which always wins. :func:`openmp_wait_settings`
  reports what the loaded libgomp actually uses (``omp_display_env``).
* **BLAS.** numpy's fallback groups are small (Range, shape arithmetic, an odd Conv); during a
  tscomp call that runs one, :data:`blas_single_threaded` keeps OpenBLAS to the calling thread (found
  among the loaded libraries, called through ctypes: ``openblas_set_num_threads``), so its pool is
  never woken to spin beside the kernels' team. The previous count is restored when the last
  concurrent tscomp call leaves.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

#: libgomp spin iterations before a waiting worker sleeps (default 300000)
DEFAULT_SPINCOUNT = 10000
_WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _loaded_libraries() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if ".so" in line and "/" in line})
    except OSError:
        return []


def libgomp_loaded() -> bool:
    return any("libgomp" in os.path.basename(p) for p in _loaded_libraries())


def configure_openmp_wait() -> str:
    """Set the short spin for libgomp if nobody chose a wait policy and libgomp is not loaded yet;
    returns what was decided (for reports)."""
    chosen = {v: os.environ[v] for v in _WAIT_VARS if v in os.environ}
    if chosen:
        return "user: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    if libgomp_loaded():
        return "libgomp was loaded before tscomp: its default wait policy applies"
    os.environ["GOMP_SPINCOUNT"] = str(DEFAULT_SPINCOUNT)    # putenv: libgomp's constructor reads it
    return f"tscomp: GOMP_SPINCOUNT={DEFAULT_SPINCOUNT}"


def openmp_wait_settings(env: dict | None = None) -> dict[str, str]:
    """``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` as libgomp reports them in a fresh process that
    imports tscomp under ``env`` (default: this one's) and loads a kernel library
    (``omp_display_env(verbose)`` prints libgomp's internal control variables to stderr)."""
    import subprocess
    import sys
    code = ("import ctypes, tscomp, tscomp.codegen.build as b; lib = b._openmp_runtime(); "
            "f = lib.omp_display_env; f.argtypes = [ctypes.c_int]; f(1)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ) if env is None else env)
    found = {}
    for line in out.stderr.splitlines():
        for var in _WAIT_VARS:
            if line.strip().startswith(var):
                found[var] = line.split("=", 1)[1].strip().strip("'")
    return found


# ---------------------------------------------------------------------------- BLAS
@functools.lru_cache(maxsize=1)
def _openblas():
    """(set, get) ctypes functions of the loaded OpenBLAS, or None."""
    for path in _loaded_libraries():
        if "openblas" not in os.path.basename(path).lower():
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for suffix in ("64_", "", "_64"):
            for prefix in ("scipy_openblas", "openblas"):
                try:
                    set_fn = getattr(lib, f"{prefix}_set_num_threads{suffix}")
                    get_fn = getattr(lib, f"{prefix}_get_num_threads{suffix}")
                except AttributeError:
                    continue
                set_fn.argtypes, set_fn.restype = [ctypes.c_int], None
                get_fn.argtypes, get_fn.restype = [], ctypes.c_int
                return set_fn, get_fn
    return None


class _BlasSingleThreaded:
    """numpy's OpenBLAS runs on the calling thread only inside ``with blas_single_threaded:``
    (nested and concurrent blocks share one setting; the count before the first is restored after
    the last). About 2 us per block."""

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0
        self.saved: int | None = None

    def __enter__(self):
        fns = _openblas()
        if fns is None:
            return self
        with self.lock:
            if self.users == 0:
                self.saved = fns[1]()
                if self.saved != 1:
                    fns[0](1)
            self.users += 1
        return self

    def __exit__(self, *exc):
        fns = _openblas()
        if fns is None:
            return False
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.saved not in (None, 1):
                fns[0](self.saved)
        return False


blas_single_threaded = _BlasSingleThreaded()


# ---------------------------------------------------------------------------- worker placement
#: team-state capacity: a calling thread's team of more threads than this is not placed
TEAM_MAX = 256
#: times a thread asks for its team again after a worker could not be placed (a pool rebuilt after
#: a worker exited) before it stops asking: a lasting failure must not cost a parallel region per call
MAX_REASKS = 3

#: C helpers on the kernels' OpenMP runtime: the calling thread's team (kernel thread ids), and
#: moving its workers off the caller's CPU (sched_setaffinity on a sleeping thread decides where
#: its wake-up lands) and back. The per-thread state lives here, in C, so that the native request
#: path (:mod:`tscomp.runtime.request_path`) and Python share one team record per thread.
_PLACEMENT_C = f"""\
#define _GNU_SOURCE
#include <sched.h>
#include <omp.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>

#define TS_TEAM_MAX {TEAM_MAX}
#define TS_MAX_REASKS {MAX_REASKS}

/* one calling thread's team: the thread count it was asked for (0: not yet), how many threads it
 * really has, the caller CPU its workers avoid (-1: not placed), re-asks so far, kernel thread ids
 * (the caller first) */
typedef struct {{ int32_t requested, size, cpu, reasks; int64_t tids[TS_TEAM_MAX]; }} ts_team;
static __thread ts_team team = {{ 0, 0, -1, 0, {{ 0 }} }};

ts_team *tscomp_team(void) {{ return &team; }}

int tscomp_team_tids(int64_t *out, int cap)
{{
    int n = 0;
    #pragma omp parallel
    {{
        int me = omp_get_thread_num();
        if (me < cap) out[me] = (int64_t)syscall(SYS_gettid);
        #pragma omp single
        n = omp_get_num_threads();
    }}
    return n;
}}

/* workers tids[1..n-1] may run anywhere the caller may, except on the CPU the caller is on; nothing to
 * do while the caller is still on *placed_cpu. Returns how many workers were placed now. */
int tscomp_place_workers(const int64_t *tids, int n, int32_t *placed_cpu)
{{
    int cpu = sched_getcpu();
    if (cpu == *placed_cpu) return 0;
    cpu_set_t allowed, others;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) return -1;
    others = allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) return 0;
    int ok = 0;
    for (int k = 1; k < n; ++k) ok += sched_setaffinity((pid_t)tids[k], sizeof others, &others) == 0;
    if (ok == n - 1) *placed_cpu = cpu;        /* else: try again at the next call */
    return ok;
}}

/* before a call with n OpenMP threads (the count already set): this thread's team, asked for once
 * per count, placed off the caller's CPU. Returns how many workers were placed now. */
int tscomp_team_enter(int n)
{{
    if (n < 2 || n > TS_TEAM_MAX) return 0;
    if (team.requested != n) {{
        if (team.requested) team.reasks = 0;     /* another thread count: a new team, a fresh allowance */
        team.size = tscomp_team_tids(team.tids, n);
        team.cpu = -1;
        team.requested = n;
    }}
    int placed = tscomp_place_workers(team.tids, team.size, &team.cpu);
    if (placed >= 0 && placed < team.size - 1 && team.cpu < 0 && team.reasks < TS_MAX_REASKS) {{
        team.requested = 0;                      /* a worker exited (the pool was rebuilt): ask again */
        team.reasks++;
    }}
    return placed;
}}

/* the workers get the caller's affinity back (they are placed again at the next call) */
int tscomp_team_release(void)
{{
    if (!team.requested) return 0;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) return -1;
    int ok = 0;
    for (int k = 1; k < team.size; ++k) ok += sched_setaffinity((pid_t)team.tids[k], sizeof allowed, &allowed) == 0;
    team.cpu = -1;
    return ok;
}}
"""


class TeamState(ctypes.Structure):
    """The calling thread's ``ts_team`` record (read it through :meth:`TeamPlacement.state`)."""
    _fields_ = [("requested", ctypes.c_int32), ("size", ctypes.c_int32), ("cpu", ctypes.c_int32),
                ("reasks", ctypes.c_int32), ("tids", ctypes.c_int64 * TEAM_MAX)]


@functools.lru_cache(maxsize=1)
def _placement_library():
    from tscomp.codegen.build import build_library, load_library

    lib = load_library(build_library(_PLACEMENT_C, "tscomp_team_placement"))
    lib.tscomp_team.restype = ctypes.POINTER(TeamState)
    lib.tscomp_team_enter.argtypes, lib.tscomp_team_enter.restype = [ctypes.c_int], ctypes.c_int
    lib.tscomp_team_release.restype = ctypes.c_int
    return lib


def team_enter_address() -> int:
    """Where ``tscomp_team_enter`` is, for native callers (the request path calls it per request)."""
    return ctypes.cast(_placement_library().tscomp_team_enter, ctypes.c_void_p).value


class TeamPlacement:
    """Keep a calling thread's OpenMP workers off the caller's CPU.

    Measured on these machines (KVM guests, 2 vCPUs): a worker that slept is woken onto the
    *caller's* CPU -- the guest sees the other, halted vCPU as preempted, not idle -- and the two then
    share one CPU until the load balancer moves one (a tick, ~4 ms): every barrier waits out a spin
    window of the thread that holds it (tiny BERT after 0.2 s idle: 8.7 ms instead of 0.55). Binding
    threads (``OMP_PROC_BIND``) avoids it but pins the caller's own thread, so concurrent callers
    serialize. Instead the workers' affinity excludes the caller's CPU, set while they sleep so that
    their wake-up lands elsewhere, and kept: a call re-places them only when its caller runs on
    another CPU than the one they were placed against (one ``sched_getcpu`` per call, the syscalls
    only after a migration). Placing them only for a call after an idle gap of the caller, and
    giving them their affinity back after it, missed the team sleeping through calls that open no
    parallel region (a tiny model at a short length): the next call that did woke it onto the
    caller's CPU -- tiny BERT at L = 139 4.3-5.3 ms instead of 0.6-0.8, twice in a row.

    The record of each thread's team is C thread-local state (``tscomp_team_enter``), shared by
    every instance and by the native request path."""

    def enter(self, n: int) -> bool:
        """Before a call with ``n`` OpenMP threads: True if the workers were (re)placed now."""
        if n < 2:
            return False
        try:
            return _placement_library().tscomp_team_enter(n) > 0
        except OSError:
            return False

    def release(self) -> None:
        """Give this thread's workers the caller's affinity back (they are placed again at the next call)."""
        _placement_library().tscomp_team_release()

    @staticmethod
    def state() -> TeamState:
        """This thread's team record (a live view: writing ``cpu`` changes what the next call does)."""
        return _placement_library().tscomp_team().contents


team_placement = TeamPlacement()


def blas_threads() -> int | None:
    fns = _openblas()
    return None if fns is None else fns[1]()


__all__ = ["DEFAULT_SPINCOUNT", "TeamPlacement", "TeamState", "team_enter_address", "blas_single_threaded", "team_placement", "blas_threads", "configure_openmp_wait",
           "libgomp_loaded", "openmp_wait_settings"]
