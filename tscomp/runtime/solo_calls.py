"""Solo calls: a short request that arrives after the OpenMP workers fell asleep runs on the
calling thread alone (issue 10's serving path: a server is rarely saturated, so requests often
arrive after a pause).

Between parallel regions libgomp's workers spin for ``GOMP_SPINCOUNT`` iterations
(:mod:`tscomp.runtime.threads` keeps that short, so that they give a competing process its CPU),
then sleep on a futex. A request's first parallel region after that waits for the wake-up: tens of
microseconds on a VM, where the idle vCPU halted -- tiny BERT at L = 1 took 60 us after a 0.3-3 ms
pause against 30 us back to back with 2 threads, and 35 us on one thread at every pause
(``benchmarks.idle_gap --wait sleep``). Waking a worker pays only for a call long enough to use it.

So the C request path (``request_path.c``) runs a request on one thread when both hold:

- **the team is asleep**: this thread's last request that used its team ended more than the
  *spin window* ago -- libgomp's spin count (:func:`spin_iterations`, read from the environment as
  libgomp reads it) times the measured time of one spin iteration (:func:`seconds_per_spin`: the
  loop libgomp runs, a relaxed load and a ``pause``), times :data:`WINDOW_SAFETY`: a call taken for
  asleep that was not costs the small difference between one thread and two on a short call; one
  taken for awake that was not costs the whole wake-up;
- **the request is short**: at most ``max_elements`` input elements. That bound is measured when
  the runtime loads (:func:`calibrate`, after its warm-up): along a ladder of shapes from the
  smallest (every symbol doubled per rung), each after a pause past the spin window, the call on one
  thread against the call with the team (:data:`SAMPLES` each, medians), up to the first rung where
  one thread is not clearly faster (:data:`SOLO_MARGIN`). Input elements stand for the call's work
  because the request path has them for free; along the ladder both grow together.

A request that does use the team wakes it, and short requests that follow within the window find
it spinning and use it too. Short requests back to back while it sleeps (a burst after a pause)
stay solo until what they lost against an awake team -- ``loss`` times their own time -- adds up
to what waking it costs (``wake``; both measured at the smallest shape), and the next one wakes
it: the ski-rental rule, within 2x of knowing the burst's length in advance.
Where the workers never sleep (``OMP_WAIT_POLICY=active``), the runtime has one thread, or the
window is too long to measure at load (:data:`MAX_WINDOW`), solo calls are off, and
:class:`SoloPolicy` says why. They are off too where any calibration call's outputs on one thread
differ in a single bit from the team's (:class:`ThreadCountChangesResults`): a request's result
must not depend on when it arrived. (Tiny BERT, ALBERT, DistilBERT, GPT-2, RoBERTa and ViT all
give identical bits: every kernel's task computes the same thing whichever thread runs it.)

Not modelled: libgomp throttles the spin to ~100 iterations when its threads outnumber the CPUs
(several calling threads with a team each); the window then reads long, the team is taken for
awake, and those calls wake it as before.
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

#: libgomp's spin count when neither ``GOMP_SPINCOUNT`` nor ``OMP_WAIT_POLICY`` is set (env.c)
LIBGOMP_DEFAULT_SPINS = 300_000
#: ... and when its threads outnumber the CPUs (``gomp_throttled_spin_count_var``)
LIBGOMP_THROTTLED_SPINS = 100
#: spins libgomp uses for ``OMP_WAIT_POLICY=active`` (practically forever)
LIBGOMP_ACTIVE_SPINS = 30_000_000_000

#: the fraction of the spin window after which the team counts as asleep
WINDOW_SAFETY = 0.5
#: a window longer than this is not calibrated (each sample waits for it): solo calls off
MAX_WINDOW = 0.002
#: timed calls per ladder rung and thread count (medians) ...
SAMPLES = 5
#: ... and this many times more back to back (short calls, a small difference to resolve)
BACK_TO_BACK_SAMPLES = 4
#: one thread must be this much faster (fraction of the team's time) for a rung to run solo
SOLO_MARGIN = 0.05
#: most ladder rungs measured
MAX_RUNGS = 12

_SPIN_C = r"""
#include <stdint.h>
#include <time.h>

/* seconds per iteration of libgomp's spin (do_spin: a relaxed load of the futex word, then
 * cpu_relax, which is `pause` on x86), over n iterations */
double tscomp_spin_seconds(int64_t n)
{
    static int word;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int64_t i = 0; i < n; ++i) {
        if (__atomic_load_n(&word, __ATOMIC_RELAXED) != 0) break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#else
        __asm__ __volatile__("" ::: "memory");
#endif
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec)) / (double)(n > 0 ? n : 1);
}
"""


def _parse_spins(text: str) -> float | None:
    """libgomp's ``GOMP_SPINCOUNT`` syntax: an integer with an optional k/M/G/T suffix, or
    ``infinite``/``infinity``; None where libgomp would ignore the value."""
    s = text.strip().lower()
    if s in ("infinite", "infinity"):
        return math.inf
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(s[-1:], 1.0)
    digits = s[:-1] if scale != 1.0 else s
    return float(int(digits)) * scale if digits.isdigit() else None


def spin_iterations(threads: int, env=None) -> float:
    """How many iterations a libgomp worker of a ``threads``-thread team spins before it sleeps,
    from the environment libgomp read (``GOMP_SPINCOUNT``, else ``OMP_WAIT_POLICY``; throttled to
    :data:`LIBGOMP_THROTTLED_SPINS` where the team outnumbers the CPUs). inf: it never sleeps."""
    env = os.environ if env is None else env
    policy = env.get("OMP_WAIT_POLICY", "").strip().lower()
    spins = _parse_spins(env["GOMP_SPINCOUNT"]) if "GOMP_SPINCOUNT" in env else None
    if spins is None:
        spins = {"active": LIBGOMP_ACTIVE_SPINS, "passive": 0}.get(policy, LIBGOMP_DEFAULT_SPINS)
    if threads > _available_cpus():
        throttled = {"active": 1000, "passive": 0}.get(policy, LIBGOMP_THROTTLED_SPINS)
        spins = min(spins, throttled)
    return math.inf if spins >= LIBGOMP_ACTIVE_SPINS else float(spins)


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def _spin_library():
    from tscomp.codegen.build import build_library, load_library

    lib = load_library(build_library(_SPIN_C, "tscomp_spin_probe"))
    lib.tscomp_spin_seconds.argtypes, lib.tscomp_spin_seconds.restype = [ctypes.c_int64], ctypes.c_double
    return lib


@functools.lru_cache(maxsize=1)
def seconds_per_spin() -> float:
    """Seconds one iteration of libgomp's spin takes here (the least of three runs: a run the OS
    interrupted reads long, and a long estimate would take a sleeping team for a spinning one)."""
    return min(_spin_library().tscomp_spin_seconds(5000) for _ in range(3))


def spin_window(threads: int, env=None) -> float:
    """Seconds after a parallel region ends until its workers sleep (inf: never)."""
    spins = spin_iterations(threads, env)
    return math.inf if math.isinf(spins) else spins * seconds_per_spin()


@dataclass
class Rung:
    """One calibration shape: its input elements and the medians after a pause."""
    binding: dict
    elements: int
    solo: float
    team: float


@dataclass
class SoloPolicy:
    """When a request runs on the calling thread alone (``max_elements`` 0: never)."""
    window: float = 0.0               # seconds after the team's last call from which it counts as asleep
    max_elements: int = 0
    wake: float = 0.0                 # measured: what waking the team adds to a call at the smallest shape
    loss: float = 0.0                 # measured: the fraction of a solo call's time an awake team saves there
    reason: str = ""                  # why solo calls are off
    rungs: list[Rung] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.max_elements > 0

    def describe(self) -> str:
        if not self.active:
            return f"solo calls off: {self.reason}"
        wakes = (f"back to back, they wake it once {self.loss:.0%} of their time adds up to the "
                 f"{self.wake * 1e6:.0f} us a wake-up costs" if self.loss > 0 else
                 "back to back too (the awake team saved nothing there)")
        return (f"solo calls: requests of <= {self.max_elements} input elements run on one thread while the "
                f"team is asleep (it last ran > {self.window * 1e6:.0f} us ago); {wakes}")

    def table(self) -> str:
        """The calibration ladder, one line per rung."""
        lines = [f"{'input elements':>15} {'one thread':>12} {'team':>10}  (after a pause past the spin window)"]
        for r in self.rungs:
            lines.append(f"{r.elements:>15} {r.solo * 1e6:>9.1f} us {r.team * 1e6:>7.1f} us")
        return "\n".join(lines)


def ladder(symbols) -> list[dict]:
    """Bindings from every symbol at its least value, each rung doubling every symbol (clamped to
    its range), until all are at their largest or :data:`MAX_RUNGS`."""
    infos = list(symbols)
    rungs, k = [], 0
    while len(rungs) < MAX_RUNGS:
        binding = {i.name: min(i.max, max(1, i.min) << k) for i in infos}
        if rungs and binding == rungs[-1]:
            break
        rungs.append(binding)
        k += 1
    return rungs


def calibrate(request, graph, threads: int, admits=lambda binding: True) -> SoloPolicy:
    """Measure the solo-call policy of a model's C request path ``request``
    (:class:`~tscomp.runtime.request_path.RequestPath` over ``graph``, ``threads`` OpenMP threads),
    set it there and return it. ``admits(binding)``: whether the model's relations between its
    symbols hold at a ladder rung (others are skipped)."""
    if threads < 2:
        return _off(request, "the runtime has one thread")
    window = spin_window(threads)
    if math.isinf(window):
        return _off(request, "the OpenMP workers never sleep (OMP_WAIT_POLICY=active or an infinite GOMP_SPINCOUNT)")
    if window > MAX_WINDOW:
        return _off(request, f"the workers spin {window * 1e3:.1f} ms before sleeping: longer than the "
                             f"{MAX_WINDOW * 1e3:.0f} ms this runtime calibrates at load")
    policy = SoloPolicy(window=window * WINDOW_SAFETY)
    try:
        _measure(request, graph, admits, policy, pause=2 * window + 2e-4)
    except ThreadCountChangesResults as exc:    # a request's result must not depend on when it came
        policy.max_elements, policy.reason = 0, f"{exc} (a kernel's arithmetic depends on the thread count)"
    except _NotInC:
        policy.reason = "a calibration request did not run in C"
    finally:
        request.set_solo(int(policy.window * 1e9), policy.max_elements if policy.active else -1,
                         int(policy.wake * 1e9), policy.loss)
    return policy


def _measure(request, graph, admits, policy: SoloPolicy, pause: float) -> None:
    """Fill ``policy`` from the ladder (the first rung also back to back: the wake-up's cost and the
    awake team's saving, which end a burst of solo requests)."""
    from tscomp.sample_inputs import random_inputs

    rng = np.random.default_rng(0)
    for binding in ladder(graph.symbols.live_symbols()):
        if not admits(binding):
            continue
        inputs = random_inputs(graph, binding, rng)
        solo, team = _timed(request, inputs, pause)
        policy.rungs.append(Rung(binding, sum(int(a.size) for a in inputs.values()), solo, team))
        if solo >= team * (1.0 - SOLO_MARGIN):
            break
        if not policy.active:      # the smallest shape runs solo: what waking costs and saves there
            solo_now, team_now = _timed(request, inputs, 0.0)
            policy.wake, policy.loss = max(0.0, team - team_now), max(0.0, 1.0 - team_now / solo_now)
        policy.max_elements = policy.rungs[-1].elements
    if not policy.active:
        first = policy.rungs[0] if policy.rungs else None
        policy.reason = (f"waking the team pays at every shape (smallest: one thread {first.solo * 1e6:.0f} us, "
                         f"the team {first.team * 1e6:.0f} us after a pause)" if first
                         else "no calibration shape satisfies the model's relations")


def _off(request, reason: str) -> SoloPolicy:
    request.set_solo(0, -1)
    return SoloPolicy(reason=reason)


def _timed(request, inputs, pause: float) -> tuple[float, float]:
    """Median seconds (one thread, the team) of calls made ``pause`` seconds after the previous
    one (0: back to back, each after an untimed call of its own kind), the two kinds alternating so
    that both meet the same machine. Raises :class:`ThreadCountChangesResults` where the two kinds'
    outputs differ in any bit, ``_NotInC`` where a call was handed to the Python path."""
    times: tuple[list, list] = ([], [])
    outputs: list = [None, None]
    for k in range(2 * SAMPLES * (1 if pause else BACK_TO_BACK_SAMPLES)):
        solo = k % 2 == 0
        request.set_solo(-1, 1 << 62, 1 << 62) if solo else request.set_solo(0, -1)
        if pause:
            time.sleep(pause)
        elif request(inputs) is None:
            raise _NotInC
        t = time.perf_counter()
        out = request(inputs)
        if out is None:
            raise _NotInC
        times[0 if solo else 1].append(time.perf_counter() - t)
        outputs[0 if solo else 1] = out
    _check_same(*outputs)
    return statistics.median(times[0]), statistics.median(times[1])


class ThreadCountChangesResults(Exception):
    """A model whose outputs on one thread differ from its team's: it never runs solo."""


class _NotInC(Exception):
    """A calibration request the C request path handed back to the Python path."""


def _check_same(solo: dict, team: dict) -> None:
    for name, want in team.items():
        got = solo[name]
        if got.shape != want.shape or got.tobytes() != want.tobytes():
            raise ThreadCountChangesResults(f"output {name} on one thread differs from the team's")


__all__ = ["Rung", "SoloPolicy", "ThreadCountChangesResults", "calibrate", "ladder", "seconds_per_spin", "spin_iterations",
           "spin_window"]
