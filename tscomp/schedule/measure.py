"""The measurement harness: times tuning candidates so that a candidate that crashes or hangs
costs one trial, not the compile.

A candidate is any picklable object with ``run(env, binding)`` (tscomp's kernel objects pickle
without their ctypes entry point and rebind it on first run). :class:`Measurer` runs candidates
in ONE persistent worker process, started lazily with the ``spawn`` start method — never fork:
forking a process whose OpenMP runtime has started can hang libgomp in the child — and with
``OMP_NUM_THREADS`` set before the worker imports anything. A workload's sample shapes (the
DietCode §4.2 shape-generic objective: one ``(binding, env)`` case per sample value of the dynamic
axis) are sent to the worker once per key and cached there.

Timing per candidate and case: ``warmup`` runs (3: a kernel run right after another one runs
2-3x slow until its weights are back in cache), ``repeats`` timed runs, the median; when the
repeats spread more than ``max_spread`` of the median (a noisy neighbour, a page-fault storm) the
case is measured once more and the lower median kept. The worker answers per case; the parent
waits at most ``timeout_s`` for the whole candidate. A dead worker (segfault, abort) gives
``ok=False, error="crashed (signal 11, SIGSEGV)"``, a late one is SIGKILLed (``"timed out after
3s"``); both are restarted for the next candidate. A Python exception in ``run`` is an ordinary
failed measurement and the worker stays. TSCompiler §5.1 measures its candidates "on device";
this is that device loop for the CPU target.

:func:`measure_inline` applies the same timing in-process (no isolation), for the fast path and
for tests.
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import signal
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tscomp.errors import TscompError
from tscomp.schedule.cold_start import Rotation, rotation

#: how long a fresh worker may take to import and set its thread count (not a candidate's time)
START_TIMEOUT_S = 120.0


class MeasureError(TscompError):
    """The measurement worker could not be started at all."""


@dataclass
class Workload:
    """The sample shapes a candidate is timed on: ``(binding, env)`` per case, where ``binding``
    gives the shape symbols and ``env`` the named input arrays. ``key`` names it in the worker's
    cache (same key, same cases). ``evict_bytes`` > 0: each timed run reads another copy of the
    candidate's packed data, the copies spanning that many bytes (weights cold in the private
    caches, as in a served model: :func:`tscomp.schedule.cold_start.evict_bytes`)."""
    key: str
    cases: list[tuple[dict[str, int], dict[str, np.ndarray]]]
    evict_bytes: int = 0


@dataclass
class Measurement:
    """``seconds``: the median time per case, in ``Workload.cases`` order (empty when not ok)."""
    ok: bool
    seconds: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def total(self) -> float:
        """The objective value: summed seconds over the cases, ``inf`` for a failure."""
        return math.fsum(self.seconds) if self.ok else math.inf


# -- timing (shared by the worker and the inline path) -----------------------------------------

#: a case is timed for at least this long (more runs than ``repeats`` for short kernels: a 10 us
#: kernel timed 5 times is at the mercy of one preemption or thread wake-up)
MIN_CASE_SECONDS = 2e-3
MAX_RUNS = 400


def _timed_entry(candidate):
    """What a timing calls: the kernel on tensors in its own storage layouts where it has such an
    entry (``run_stored``: a Conv reading or writing channel-blocked tensors, whose ``run``
    converts NCHW around the call -- random inputs need no conversion, and the host program makes
    none), else ``run``."""
    return getattr(candidate, "run_stored", candidate.run)


def _repeat(candidate, env, binding, repeats: int, copies: Rotation | None = None) -> tuple[float, float]:
    """(median, relative spread) of at least ``repeats`` timed runs lasting ``MIN_CASE_SECONDS``;
    with ``copies``, each run reads the rotation's next copy as the candidate's packed data."""
    times: list[float] = []
    run = _timed_entry(candidate)
    while len(times) < max(1, repeats) or (sum(times) < MIN_CASE_SECONDS and len(times) < MAX_RUNS):
        if copies:
            candidate.packed = copies.next()
        t0 = time.perf_counter()
        run(env, binding)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    # spread over the middle runs: with hundreds of runs the extremes are always far apart
    lo, hi = (statistics.quantiles(times, n=10)[i] for i in (0, 8)) if len(times) >= 20 else (min(times), max(times))
    return med, (hi - lo) / med if med > 0 else 0.0


def _place_team() -> None:
    """Keep the OpenMP workers off this thread's CPU, as :meth:`tscomp.runtime.Runtime.run` does: a
    worker that slept while the measurer waited for its next candidate is otherwise woken onto the
    measuring thread's CPU on a KVM guest, and every case of the candidate then times the two
    sharing one CPU (~0.3 ms a run for a 10 us kernel, at random: tuning kept the losers)."""
    from tscomp.codegen.build import get_num_threads
    from tscomp.runtime.threads import team_placement
    team_placement.enter(get_num_threads())


def time_case(candidate, env, binding, *, warmup: int, repeats: int, max_spread: float,
              copies: Rotation | None = None) -> float:
    """Median seconds of one case: warm-up runs, timed repeats, one retry when too noisy. With
    ``copies`` (:func:`tscomp.schedule.cold_start.rotation`) the timed runs rotate over them, so the
    packed data is cold in the private caches; the candidate keeps its own copy afterwards."""
    own = getattr(candidate, "packed", None)
    _place_team()
    try:
        for _ in range(warmup):
            _timed_entry(candidate)(env, binding)
        med, spread = _repeat(candidate, env, binding, repeats, copies)
        if spread > max_spread:  # outlier retry: keep the calmer of two medians
            med = min(med, _repeat(candidate, env, binding, repeats, copies)[0])
    finally:
        if copies:
            candidate.packed = own
    return med


def measure_inline(candidate, workload: Workload, *, warmup: int = 3, repeats: int = 5,
                   max_spread: float = 0.15) -> Measurement:
    """Time ``candidate`` in this process (a crash here is a crash of the caller)."""
    seconds = []
    copies = rotation(candidate, workload.evict_bytes)
    for binding, env in workload.cases:
        try:
            seconds.append(time_case(candidate, env, binding, warmup=warmup, repeats=repeats,
                                     max_spread=max_spread, copies=copies))
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not an error
            return Measurement(False, [], _describe(exc))
    return Measurement(True, seconds)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


# -- the worker process -----------------------------------------------------------------------

def _worker_main(conn, threads: int) -> None:
    """Serve ("workload", key, cases) and ("measure", key, pickled candidate, warmup, repeats,
    max_spread) until ("stop",) or the pipe closes. Answers ("case", i, seconds) per case, then
    ("done",), or ("error", text) when the candidate raised."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        from tscomp.codegen.build import set_num_threads
        set_num_threads(threads)
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"setting {threads} threads failed: {_describe(exc)}"))
        return
    conn.send(("ready",))
    workloads: dict[str, list] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        if msg[0] == "workload":
            workloads[msg[1]] = msg[2], msg[3]
        elif msg[0] == "measure":
            _serve_measure(conn, workloads, *msg[1:])


def _serve_measure(conn, workloads, key, blob, warmup, repeats, max_spread) -> None:
    try:
        candidate = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001
        conn.send(("error", f"unpickling the candidate failed: {_describe(exc)}"))
        return
    cases, evict = workloads[key]
    copies = rotation(candidate, evict)
    for i, (binding, env) in enumerate(cases):
        try:
            seconds = time_case(candidate, env, binding, warmup=warmup, repeats=repeats,
                                max_spread=max_spread, copies=copies)
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", _describe(exc)))
            return
        conn.send(("case", i, seconds))
    conn.send(("done",))


@contextlib.contextmanager
def _thread_env(threads: int):
    """OMP/BLAS thread counts in the environment the spawned worker inherits."""
    names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    old = {n: os.environ.get(n) for n in names}
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        for n, v in old.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


class Measurer:
    """Times candidates in an isolated worker process (see the module docstring)."""

    def __init__(self, *, threads: int, timeout_s: float = 60.0, repeats: int = 5, warmup: int = 3,
                 max_spread: float = 0.15):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads, self.timeout_s = threads, timeout_s
        self.repeats, self.warmup, self.max_spread = repeats, warmup, max_spread
        self._proc = None
        self._conn = None
        self._sent: set[str] = set()
        #: how many workers were started (a restart after a crash or timeout adds one)
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> "Measurer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker (politely, then by force)."""
        if self._proc is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop",))
        self._proc.join(2.0)
        self._discard()

    def measure(self, candidate: Any, workload: Workload) -> Measurement:
        try:
            blob = pickle.dumps(candidate)
        except Exception as exc:  # noqa: BLE001
            return Measurement(False, [], f"candidate cannot be pickled: {_describe(exc)}")
        self._ensure_worker()
        try:
            if workload.key not in self._sent:
                self._conn.send(("workload", workload.key, workload.cases, workload.evict_bytes))
                self._sent.add(workload.key)
            self._conn.send(("measure", workload.key, blob, self.warmup, self.repeats, self.max_spread))
        except (OSError, ValueError):  # the worker died between candidates
            return self._crashed()
        return self._collect(len(workload.cases))

    def _collect(self, n_cases: int) -> Measurement:
        deadline = time.monotonic() + self.timeout_s
        seconds: list[float] = []
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not self._conn.poll(left):
                    return self._timed_out()
                msg = self._conn.recv()
            except (EOFError, OSError):
                return self._crashed()
            if msg[0] == "case":
                seconds.append(float(msg[2]))
            elif msg[0] == "done":
                assert len(seconds) == n_cases
                return Measurement(True, seconds)
            elif msg[0] == "error":
                return Measurement(False, [], msg[1])

    # worker lifecycle ---------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._discard()
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, self.threads), daemon=True,
                           name="tscomp-measure")
        with _thread_env(self.threads):
            proc.start()
        child.close()
        self._proc, self._conn, self._sent = proc, parent, set()
        self.starts += 1
        try:
            ready = parent.poll(max(START_TIMEOUT_S, self.timeout_s))
            msg = parent.recv() if ready else ("fatal", "no answer")
        except (EOFError, OSError):
            msg = ("fatal", f"exited with code {proc.exitcode}")
        if msg[0] != "ready":
            self._discard()
            raise MeasureError(f"the measurement worker did not start: {msg[1]}")

    def _crashed(self) -> Measurement:
        self._proc.join(5.0)
        code = self._proc.exitcode
        self._discard()
        if code is not None and code < 0:
            try:
                name = f", {signal.Signals(-code).name}"
            except ValueError:
                name = ""
            return Measurement(False, [], f"crashed (signal {-code}{name})")
        return Measurement(False, [], f"crashed (exit code {code})")

    def _timed_out(self) -> Measurement:
        self._discard()
        return Measurement(False, [], f"timed out after {self.timeout_s:g}s")

    def _discard(self) -> None:
        """Forget the worker, SIGKILLing it if it still runs."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._sent = None, None, set()
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)
            with contextlib.suppress(ValueError):
                proc.close()


__all__ = ["Measurement", "MeasureError", "Measurer", "Workload", "measure_inline", "time_case"]
