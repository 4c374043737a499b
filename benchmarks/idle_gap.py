"""A request after an idle gap, against requests back to back: tscomp and onnxruntime at one shape
(issue 10's serving path: a server is rarely saturated, so requests often arrive after a pause).

    .venv/bin/python -m benchmarks.idle_gap [--artifact .cache/bert-tiny.tsc]
        [--onnx .cache/models/bert-tiny-dynamo.onnx] [--sequence 1] [--gaps-ms 0.1,0.3,1,3,10,60]
        [--wait spin|sleep] [--repeats 20] [--systems tscomp,tscomp-team,onnxruntime]

Per system, in one process each: a warm-up, then -- gaps in a shuffled order, ``--repeats`` times
each -- one call, a pause of the gap (``spin``: the calling thread busy-waits in Python, its core
stays this process's; ``sleep``: it sleeps, so the core may idle or serve another tenant), then one
timed call. Printed per gap: the median timed call and its ratio to the back-to-back one (gap 0).

Two effects read off it, on a 2-core VM with 2 threads. Past the OpenMP workers' spin
(``GOMP_SPINCOUNT``, :mod:`tscomp.runtime.threads`: ~0.1-0.3 ms at tscomp's 10,000 iterations) the
call's first parallel region waits for a sleeping worker's futex wake-up (tens of microseconds in a
VM, where the idle vCPU halted); a longer spin hides it for the gaps it covers but lets the spinning
workers take a competing process's CPU (``benchmarks.contention --policies tscomp,spin100000``).
And with every gap the caches lose more of the call's code and data to whatever else the host runs:
after 10-60 ms a 30 us call runs 2-5x slower with one thread too, and onnxruntime's likewise.

``tscomp`` runs a short request that finds the workers asleep on the calling thread alone (solo
calls, :mod:`tscomp.runtime.solo_calls`; the policy the load measured is printed under the table);
``tscomp-team`` is the same runtime with ``solo_calls=False``, every call on the team.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

import numpy as np


def _pause(seconds: float, wait: str) -> None:
    if wait == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _curve(call, requests: list, gaps: list[float], repeats: int, wait: str) -> dict[float, float]:
    """Per gap (seconds, 0 included): the median time of a call made that long after the previous one."""
    for k in range(50):
        call(requests[k % len(requests)])
    times: dict[float, list[float]] = {g: [] for g in gaps}
    order = gaps * repeats
    random.Random(0).shuffle(order)
    for n, gap in enumerate(order):
        call(requests[(2 * n) % len(requests)])
        if gap:
            _pause(gap, wait)
        t = time.perf_counter()
        call(requests[(2 * n + 1) % len(requests)])
        times[gap].append(time.perf_counter() - t)
    return {g: statistics.median(v) for g, v in times.items()}


def _requests(rt, sequence: int) -> tuple[list[dict], dict]:
    """64 requests of one shape (``sequence``, every other symbol at its least), each its own contents."""
    from tscomp.sample_inputs import random_inputs
    binding = {i.name: i.min for i in rt.graph.symbols.live_symbols()} | {"sequence": sequence}
    rng = np.random.default_rng(sequence)
    return [random_inputs(rt.graph, binding, rng) for _ in range(64)], binding


def measure(args) -> dict:
    """One system's curve, in this process (JSON-ready). The artifact is loaded once: it makes the
    requests, and serves them when the system is tscomp (warmed up only then, so onnxruntime's
    process runs no kernel of tscomp's)."""
    from tscomp.runtime import Runtime
    ours = args.system in ("tscomp", "tscomp-team")
    rt = Runtime(args.artifact, num_threads=args.threads, warmup=ours, solo_calls=args.system == "tscomp")
    requests, binding = _requests(rt, args.sequence)
    if ours:
        call = rt.run
    else:
        from benchmarks.first_call import _ort_call
        call = _ort_call(args.onnx, args.threads)
    gaps = [0.0] + [float(g) / 1e3 for g in args.gaps_ms.split(",")]
    curve = _curve(call, requests, gaps, args.repeats, args.wait)
    return {"system": args.system, "binding": binding, "curve": {str(g): t for g, t in curve.items()},
            "policy": rt.solo_policy.describe() if ours else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", default=".cache/bert-tiny.tsc")
    ap.add_argument("--onnx", default=".cache/models/bert-tiny-dynamo.onnx")
    ap.add_argument("--sequence", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gaps-ms", default="0.1,0.3,1,3,10,60")
    ap.add_argument("--wait", default="spin", choices=("spin", "sleep"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--systems", default="tscomp,onnxruntime")
    ap.add_argument("--system", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.system:
        print(json.dumps(measure(args)))
        return
    rows = []
    for system in args.systems.split(","):    # one process each: neither runs beside the other's pool
        cmd = [sys.executable, "-m", "benchmarks.idle_gap", "--system", system, "--artifact", args.artifact,
               "--onnx", args.onnx, "--sequence", str(args.sequence), "--threads", str(args.threads),
               "--gaps-ms", args.gaps_ms, "--wait", args.wait, "--repeats", str(args.repeats)]
        rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))
    gaps = list(rows[0]["curve"])
    print(f"{args.artifact} at {rows[0]['binding']}, {args.threads} threads, pause by {args.wait}; "
          f"median of {args.repeats} calls per gap")
    print(f"{'system':>12}  " + "  ".join(f"{float(g) * 1e3:>9g}ms" for g in gaps))
    for row in rows:
        base = row["curve"][gaps[0]]
        print(f"{row['system']:>12}  " + "  ".join(f"{row['curve'][g] * 1e6:6.0f}us" + (f" {row['curve'][g] / base:4.2f}"
              if g != gaps[0] else "     ") for g in gaps))
    print("(each cell: the call's median time, and its ratio to the back-to-back call, gap 0)")
    for row in rows:
        if row["policy"]:
            print(f"{row['system']}: {row['policy']}")


if __name__ == "__main__":
    main()
