"""Tuned vs heuristic configurations end to end, side by side with onnxruntime (issue 8, acc. 3).

Two artifacts of the same model — one compiled with the tuner (``tscomp compile``), one with
``--no-tune`` — and an onnxruntime session on the same ONNX file run in one process at the same
random shapes (default: BERT-base, batch 1, 25 sequence lengths in [1, 512], seed 0, 2 threads).
At each shape the three systems are timed in rotating order, each the median of repeated calls
after a warm-up and an idle pause (both runtimes' worker threads spin for milliseconds after a
call; see :mod:`tscomp.bench`). Printed: latencies, tuned/onnxruntime, heuristic/onnxruntime and
tuned/heuristic per shape, geomeans and worst ratios; written: a plot.

    .venv/bin/python -m benchmarks.tuned_vs_heuristic MODEL.onnx TUNED.tsc HEURISTIC.tsc

Nothing else may run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def median_time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("tuned")
    ap.add_argument("heuristic")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fix", default="batch=1")
    ap.add_argument("--plot", default="benchmarks/results/tuned_vs_heuristic.png")
    args = ap.parse_args(argv)

    from tscomp.bench import ort_session, sample_bindings
    from tscomp.runtime import Runtime
    from tscomp.sample_inputs import random_inputs

    tuned = Runtime(args.tuned, num_threads=args.threads)
    heur = Runtime(args.heuristic, num_threads=args.threads)
    sess = ort_session(args.model, args.threads)
    fixed = dict(kv.split("=") for kv in args.fix.split(",") if kv)
    fixed = {k: int(v) for k, v in fixed.items()}
    bindings = sample_bindings(tuned, args.samples, args.seed, fixed)
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    systems = {"onnxruntime": lambda x: sess.run(None, x), "heuristic": heur.run, "tuned": tuned.run}
    print(f"{'shape':<28} {'ort ms':>8} {'heur ms':>8} {'tuned ms':>9} {'tuned/ort':>9} {'heur/ort':>9} "
          f"{'tuned/heur':>10}", flush=True)
    for n, b in enumerate(bindings):
        x = random_inputs(tuned.graph, b, rng)
        order = list(systems)[n % 3:] + list(systems)[:n % 3]     # rotate who goes first
        t = {}
        for name in order:
            time.sleep(0.1)
            t[name] = median_time(lambda: systems[name](x), args.repeats)
        rows.append((b, t))
        print(f"{str(b):<28} {t['onnxruntime'] * 1e3:8.2f} {t['heuristic'] * 1e3:8.2f} {t['tuned'] * 1e3:9.2f} "
              f"{t['tuned'] / t['onnxruntime']:9.3f} {t['heuristic'] / t['onnxruntime']:9.3f} "
              f"{t['tuned'] / t['heuristic']:10.3f}", flush=True)

    def ratios(a, b):
        return np.array([t[a] / t[b] for _, t in rows])

    for a, b in (("tuned", "onnxruntime"), ("heuristic", "onnxruntime"), ("tuned", "heuristic")):
        r = ratios(a, b)
        w = int(np.argmax(r))
        print(f"{a}/{b}: geomean {np.exp(np.mean(np.log(r))):.3f}, worst {r[w]:.3f} at {rows[w][0]}, "
              f"best {r.min():.3f}")
    plot(rows, Path(args.plot))
    print(f"plot: {args.plot}")
    return 0


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = [k for k in rows[0][0] if len({b[k] for b, _ in rows}) > 1] or list(rows[0][0])
    xs = [rows[i][0][key[0]] for i in range(len(rows))]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, color in (("onnxruntime", "tab:gray"), ("heuristic", "tab:orange"), ("tuned", "tab:blue")):
        ax.plot(xs, [t[name] * 1e3 for _, t in rows], "o-", color=color, label=name, ms=3)
    ax.set_xlabel(key[0])
    ax.set_ylabel("latency (ms)")
    ax.set_title("tscomp tuned vs heuristic configurations vs onnxruntime")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
