"""What a short call loses while a server serves other lengths, and what gives it back (issue 10,
acceptance 1: the first call at a never-seen length against steady state).

    .venv/bin/python -m benchmarks.cache_decay [--artifact .cache/bert-tiny.tsc] [--lengths 1,8] [--threads 1,2]

Per length L and thread count: *hot* is a call at L right after three others at L (steady state);
every other column is a call at L after ``--gap`` calls at ``benchmarks.first_call``'s reference
length (64), over the hot time, with one thing done just before it:

- ``nothing``: the plain return after the gap (what a first call meets: ``benchmarks.first_call``);
- ``twin``: a call at L on a second Runtime of the same artifact -- the same kernel library, so the
  same code and branch history, but its own weights and arena;
- ``code``: the kernel library's executable pages read as data (its code into the caches, nothing
  else);
- ``self``: a call at L on this Runtime (everything: the control that should read ~1.0).

``twin`` near ``self`` says the loss is the shape's code paths (the row tails, short-length
branches of kernels the reference calls also run) and their branch history, not data; ``nothing``
growing with ``--gap`` says it is lost to time and other traffic, not paid for novelty. Medians of
``--trials`` alternations per column.
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import time

import numpy as np

from benchmarks.first_call import REFERENCE_LENGTH
from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs


def _library_code(name: str = "kernels.so") -> list[tuple[int, int]]:
    """The executable mappings of this process's kernel libraries: [(start, end), ...]."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(name) and "x" in parts[1]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                spans.append((lo, hi))
    return spans


def measure(artifact: str, L: int, threads: int, gap: int, trials: int,
            reference: int = REFERENCE_LENGTH) -> dict[str, float]:
    rt, twin = Runtime(artifact, num_threads=threads), Runtime(artifact, num_threads=threads)
    base = {s.name: s.min for s in rt.graph.symbols.live_symbols()}
    made = itertools.count()

    def request(length: int) -> dict:
        return random_inputs(rt.graph, base | {"sequence": length}, np.random.default_rng([length, next(made)]))

    ref = request(reference)
    code = _library_code()
    before = {"nothing": lambda other: None,
              "twin": twin.run,
              "code": lambda other: [ctypes.string_at(lo, hi - lo) for lo, hi in code],
              "self": rt.run}
    for _ in range(50):
        rt.run(ref)
        twin.run(ref)
    times: dict[str, list[float]] = {k: [] for k in ["hot", *before]}
    for _ in range(trials):
        for what, prepare in before.items():
            other, cold, warming, hot = request(L), request(L), [request(L) for _ in range(3)], request(L)
            for _ in range(gap):
                rt.run(ref)
            prepare(other)
            t = time.perf_counter()
            rt.run(cold)
            times[what].append(time.perf_counter() - t)
            for x in warming:
                rt.run(x)
            t = time.perf_counter()
            rt.run(hot)
            times["hot"].append(time.perf_counter() - t)
    hot = statistics.median(times["hot"])
    return {"hot_us": hot * 1e6} | {k: statistics.median(v) / hot for k, v in times.items() if k != "hot"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", default=".cache/bert-tiny.tsc")
    ap.add_argument("--lengths", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--gap", type=int, default=100, help="reference calls before each measured call")
    ap.add_argument("--trials", type=int, default=15)
    args = ap.parse_args()
    print(f"{args.artifact}: a call at L after {args.gap} calls at L = {REFERENCE_LENGTH}, over its hot time (medians of {args.trials})")
    print(f"{'threads':>7}  {'L':>4}  {'hot us':>7}  {'nothing':>7}  {'twin':>7}  {'code':>7}  {'self':>7}")
    for threads in (int(x) for x in args.threads.split(",")):
        for L in (int(x) for x in args.lengths.split(",")):
            r = measure(args.artifact, L, threads, args.gap, args.trials)
            print(f"{threads:>7}  {L:>4}  {r['hot_us']:7.1f}  {r['nothing']:7.2f}  {r['twin']:7.2f}  {r['code']:7.2f}  {r['self']:7.2f}")


if __name__ == "__main__":
    main()
