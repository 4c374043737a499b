"""First-call vs steady-state latency at never-seen shapes (issue 4, acceptance 4; issue 10,
acceptance 1: within 1.1x at every length, L = 1..9 included), tscomp alone; and the runtime's
per-call overhead (call time minus the kernels' time: issue 10 wants <= 20 us on tiny BERT).

    .venv/bin/python -m benchmarks.first_call [--artifact .cache/bench/bert-base-dynamo.tsc]
    .venv/bin/python -m benchmarks.first_call --artifact .cache/bench/bert-tiny-dynamo.tsc

Loads the artifact (hash check + warm-up of every kernel variant at the smallest shape), then for
each sequence length, never seen before by this process: the first call (which makes the shape's
decisions: symbol binding, variant choice by the wave model, buffer plan) and the median of the
next 5 calls. ``tscomp bench`` reports the same ratio while onnxruntime runs in the same process,
where the first call also pays for caches onnxruntime just evicted.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", default=".cache/bench/bert-base-dynamo.tsc")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="1,2,3,4,5,6,7,8,9,21,39,90,139,202,287,374,498")
    args = ap.parse_args()
    t = time.perf_counter()
    rt = Runtime(args.artifact, num_threads=args.threads)
    print(f"load + verify + warm-up: {time.perf_counter() - t:.2f} s")
    print(f"{'sequence':>8}  {'first ms':>9}  {'steady ms':>9}  {'first/steady':>12}  {'overhead us':>11}")
    ratios, overheads = [], []
    for L in (int(x) for x in args.lengths.split(",")):
        binding = {i.name: i.min for i in rt.graph.symbols.live_symbols()} | {"sequence": L}
        inputs = random_inputs(rt.graph, binding, np.random.default_rng(L))
        t = time.perf_counter()
        rt.run(inputs)
        first = time.perf_counter() - t
        steady, over = [], []
        for _ in range(5):
            t = time.perf_counter()
            rt.run(inputs)
            steady.append(time.perf_counter() - t)
            over.append(rt.last_call_overhead)
        s = statistics.median(steady)
        ratios.append(first / s)
        overheads.append(statistics.median(over))
        print(f"{L:>8}  {first * 1e3:9.2f}  {s * 1e3:9.2f}  {first / s:12.2f}  {overheads[-1] * 1e6:11.1f}")
    print(f"first/steady: max {max(ratios):.2f}, median {statistics.median(ratios):.2f} (target <= 1.10); "
          f"overhead per call: median {statistics.median(overheads) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
