"""Measured selection of SIMT configurations on a GPU that is present at compile time (TSCompiler
§5: configurations are chosen by timing them on the device; Triton's autotuner: prune with a
model, then benchmark; a configuration that cannot launch costs infinity).

``schedule_analytic`` ranks every configuration of a group's space with the calibrated cost model
(:mod:`tscomp.schedule.gpu_space`). Where a GPU is present, :func:`measure_on_gpu` takes the
model's first ``top`` configurations of each distinct tunable group, builds each (nvcc for the
device's architecture), times it with CUDA events on the group's real kernel (its fused epilogue,
its row pass) at the plan's sample shapes (:func:`~tscomp.schedule.samples.sample_bindings`, random
inputs), and replaces the schedule's variants by the measured choice: the configuration with the
lowest geometric-mean time relative to the per-shape fastest first (the DietCode objective the
analytic ranking uses), then greedily those that most lower the set's mean relative time
(:func:`~tscomp.schedule.gpu_space.cover`, as the analytic variants are chosen). What is timed is
the model's own cover of the range plus its best by score (:func:`_candidates`), so a tile that
wins only at large M is among them. At run time a group's measured variants are dispatched by
their measured times (:func:`estimate_ms`, interpolated in M), not by the model. The schedule's
method becomes ``measured-gpu`` and each variant records its times; the rest of the measured order
stays the build's reserve (a variant that spills is replaced by the next measured one). Groups
with the same signature share one measurement.
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from tscomp.schedule.gpu_space import cover
from tscomp.schedule.samples import group_inputs_at, sample_bindings
from tscomp.schedule.schedules import ScheduledVariant, Schedules

#: configurations timed per distinct group (on the H200 calibration data the model's first choice
#: is within 1.10x of the fastest timed, geomean; the best of its first 8, within 1.02x)
DEFAULT_TOP = 8
#: timed launches per configuration and shape (after 2 warm-ups); the median counts
REPEATS = 5


def _candidates(space, top: int) -> list:
    """What is timed: the model's cover of the range (its variant set of up to ``top // 2``: the
    large-M tile too, which the mean relative score alone ranks low when most samples are small),
    then its best by score, ``top`` in all."""
    order = space.rank()
    picks = space.variants(max(1, top // 2), order)
    for r in order:
        if len(picks) >= top:
            break
        if r.tile not in picks:
            picks.append(r.tile)
    return picks


def estimate_ms(timings: list, M: int) -> float:
    """A measured variant's time at ``M`` from its ``[[M_sample, ms], ...]`` (log-log interpolation
    between the samples around M; beyond the ends, the nearest end's time per row)."""
    pts = sorted((int(m), float(ms)) for m, ms in timings)
    if M <= pts[0][0]:
        return pts[0][1]
    if M >= pts[-1][0]:
        return pts[-1][1] * M / pts[-1][0]
    for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
        if m0 <= M <= m1:
            if m1 == m0:
                return t0
            f = (math.log(M) - math.log(m0)) / (math.log(m1) - math.log(m0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return pts[-1][1]


def time_launches(dev, cubin: bytes, launches: list, repeats: int = REPEATS) -> float:
    """Median milliseconds (CUDA events, the launches alone) of one run of ``launches`` (a GEMM and
    its row pass) over ``repeats`` runs after 2 warm-ups, all on the same device buffers."""
    dev.profile = []
    try:
        dev.run_launches(cubin, launches * (repeats + 2))
        per_launch = [ms for _, ms in dev.profile]
    finally:
        dev.profile = None
    n = len(launches)
    runs = [sum(per_launch[i:i + n]) for i in range(2 * n, len(per_launch), n)]
    return statistics.median(runs)


def _fits(spec, kernel, build) -> bool:
    r = build.resources.get(kernel.func)
    return r is not None and not r.spills and spec.fits(kernel.cfg.threads, r.registers, r.shared_bytes)


def _measured_order(times: dict, shapes: int) -> tuple[list, Callable]:
    """Configurations by geometric-mean time relative to the per-shape fastest (inf: never ran)."""
    best = [min(t[i] for t in times.values()) for i in range(shapes)]

    def score(tile):
        t = times[tile]
        if not all(math.isfinite(x) for x in t):
            return math.inf
        return math.exp(sum(math.log(x / b) for x, b in zip(t, best)) / shapes)
    return sorted(times, key=lambda tile: (score(tile), tile.slug())), score


def measure_on_gpu(plan, choices: dict, schedules: Schedules, build: Callable, device, *,
                   top: int = DEFAULT_TOP, max_variants: int = 2, log: Callable[[str], None] | None = None) -> int:
    """Re-choose each analytic schedule of ``schedules`` that has a configuration space by timing
    its model's first ``top`` configurations on ``device`` (a :class:`~tscomp.runtime.device_opencl.CudaDevice`).
    ``build(analysis, tile)`` -> the group's executor. Returns the number of groups measured."""
    from tscomp.codegen.nvcc import compile_cubin
    from tscomp.schedule.target import cuda
    log = log or (lambda _msg: None)
    target = cuda(device.arch)
    spec = target.spec
    bindings = sample_bindings(plan)
    measured: dict[str, tuple] = {}     # signature -> (variants, reserve, ranking, trials)
    n = 0
    for name, sched in schedules.groups.items():
        choice = choices[name]
        if sched.method != "analytic" or choice.family is None or choice.family.space is None:
            continue
        if sched.signature in measured:
            variants, reserve, ranking, trials = measured[sched.signature]
        else:
            t0 = time.perf_counter()
            space = choice.family.space(choice.analysis, target)
            tiles = _candidates(space, top)
            kernels = [build(choice.analysis, t) for t in tiles]
            with ThreadPoolExecutor(8) as pool:      # nvcc runs as a subprocess: builds overlap
                builds = list(pool.map(lambda k: compile_cubin(k.program.cuda, device.arch), kernels))
            rng = np.random.default_rng(0)
            cases = [(b, group_inputs_at(plan, choice.group, b, rng)) for b in bindings]
            times = {}
            for t, k, b in zip(tiles, kernels, builds):
                if not _fits(spec, k, b):
                    times[t] = [math.inf] * len(cases)
                    continue
                times[t] = [time_launches(device, b.cubin, k.launches(env, binding)[0]) for binding, env in cases]
            order, score = _measured_order(times, len(cases))
            if not math.isfinite(score(order[0])):
                log(f"  {name}: no configuration ran on {device.device_name}; the analytic choice stays")
                continue
            an = choice.analysis
            rows = [str(int(an.symtab.evaluate(an.M, dict(b)))) for b, _ in cases]   # the GEMM's M per shape

            def variant(tile):
                return ScheduledVariant(tile, value=statistics.geometric_mean(times[tile]) / 1e3,
                                        timings={m: round(x, 5) for m, x in zip(rows, times[tile])})
            picks = cover(order, times, max_variants)
            variants = [variant(t) for t in picks]
            reserve = [variant(t) for t in order if t not in picks and math.isfinite(score(t))]
            ranking = [{"tile": t.to_json(), "score": round(score(t), 4), "measured": True, "method": "measured-gpu"}
                       for t in order[:5]]
            trials = len(tiles)
            measured[sched.signature] = (variants, reserve, ranking, trials)
            log(f"  {name}: timed {trials} configurations x {len(cases)} shapes on {device.device_name} in "
                f"{time.perf_counter() - t0:.1f}s: {picks[0].slug()} at {score(picks[0]):.2f}x the per-shape "
                f"fastest (geomean); the model's first, {tiles[0].slug()}, at {score(tiles[0]):.2f}x")
            n += 1
        sched.variants, sched.reserve, sched.ranking, sched.trials = list(variants), list(reserve), ranking, trials
        sched.method, sched.measured = "measured-gpu", True
    return n


__all__ = ["DEFAULT_TOP", "estimate_ms", "measure_on_gpu", "time_launches"]
