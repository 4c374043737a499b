"""Two artifacts of the same model side by side in one process: the same random inputs, per shape
the median latency of each and their ratio (B / A), and the largest difference between their
outputs. For a before/after of a compiler change: compile the model with the old checkout into A
and the current one into B (both ``--no-tune``, so tuning noise does not enter).

    (cd /tmp/old && PYTHONPATH=. python -m tscomp.cli compile m.onnx --dim ... --no-tune -o /tmp/a.tsc)
    tscomp compile m.onnx --dim ... --no-tune -o /tmp/b.tsc
    .venv/bin/python -m benchmarks.artifacts_ab /tmp/a.tsc /tmp/b.tsc --shape sequence=1,16,64,128

Timing as the other side-by-side benchmarks (:func:`benchmarks.side_by_side.run_and_time`: warm
calls, two rounds in alternating order, the lower median); nothing else may run meanwhile.
"""
from __future__ import annotations

import argparse

import numpy as np

from benchmarks.side_by_side import geomean, run_and_time
from tscomp import Runtime
from tscomp.sample_inputs import random_inputs, shape_binding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--shape", action="append", default=[],
                    help="SYMBOL=V1,V2,...: the values to time (other symbols at their minimum); several "
                         "--shape give their product")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    systems = {"A": Runtime(args.a, num_threads=args.threads), "B": Runtime(args.b, num_threads=args.threads)}
    graph = systems["A"].plan.graph
    grid = [{}]
    for spec in args.shape:
        name, values = spec.split("=", 1)
        grid = [dict(g, **{name: int(v)}) for g in grid for v in values.split(",")]
    rng = np.random.default_rng(0)
    ratios = []
    print(f"A = {args.a}\nB = {args.b}")
    for given in grid:
        binding = shape_binding(graph, given)
        inputs = random_inputs(graph, binding, rng)
        outs, times = run_and_time({k: rt.run for k, rt in systems.items()}, inputs, args.repeats)
        diff = max(float(np.max(np.abs(np.asarray(outs["A"][k], np.float64) - np.asarray(outs["B"][k], np.float64))))
                   for k in outs["A"])
        ratios.append(times["B"] / times["A"])
        print(f"{binding}: A {times['A'] * 1e3:.3f} ms  B {times['B'] * 1e3:.3f} ms  B/A {ratios[-1]:.2f}  "
              f"max |A - B| {diff:.2e}")
    print(f"B/A geomean {geomean(ratios):.3f} over {len(ratios)} shapes")


if __name__ == "__main__":
    main()
