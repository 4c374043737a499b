"""Calibrate the CUDA GEMM cost model (:mod:`tscomp.schedule.gpu_space`) against GPU timings and
report how well it ranks (no GPU needed: it reads the timings).

Input: the JSON ``benchmarks.cuda_gemm_measured --top 12 --sample N --json`` writes on a GPU.
``benchmarks/results/cuda_gemm_h200.json`` (the default; the model's constants are its fit): an
H200, BERT-base's four GEMM shapes at M = 16..16384, 112 configurations each (the previous
ranking's top 12 and 100 at random), the kernel of commit 67ead91. ``cuda_gemm_h200_v2.json``:
the kernel of commit 9565ac0 (W staged in float4 groups), 52 configurations at 4 M, timed after
the fit (the constants' check on a changed kernel: regret 1.12 geomean; refitting on it gains
nothing with shapes held out, 1.12). Fits the model's constants (least squares on log time), then prints per
shape and M: the measured time of the previous analytic ranking's first choice (the first
configuration of each row), of the calibrated model's first choice among the timed configurations,
and the fastest timed; the geomean/max ratio to the fastest ("regret"), the Spearman correlation of
predicted and measured, for the constants in the model and refitted, and the refit's regret with
each GEMM shape held out of the fit. Writes a plot of predicted (refit) against measured time.

    python -m benchmarks.cuda_model_calibration [--data benchmarks/results/cuda_gemm_h200.json] [--plot out.png]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
from scipy.optimize import least_squares

from tscomp.codegen.simt.config import SimtTile
from tscomp.schedule import gpu_space
from tscomp.schedule.gpu_space import MODEL, SimtGemmModel, gemm_cost
from tscomp.schedule.target import cuda

CLOCK_PER_MS = 1.98e6       # the H200's boost clock under load (nvidia-smi), cycles per millisecond
FIELDS = [f.name for f in dataclasses.fields(SimtGemmModel)] + ["bytes_per_cycle"]


def load(path):
    rows = json.load(open(path))
    points = [(ri, r["M"], r["K"], r["N"], SimtTile(**c), reg, ms) for ri, r in enumerate(rows)
              for c, reg, ms in zip(r["configs"], r["registers"], r["measured_ms"])]
    return rows, points


def predict_ms(params: dict, arch: str, point) -> float:
    _, M, K, N, t, reg, _ = point
    model = SimtGemmModel(**{k: v for k, v in params.items() if k != "bytes_per_cycle"})
    saved = gpu_space.BYTES_PER_CYCLE[arch]
    gpu_space.BYTES_PER_CYCLE[arch] = params["bytes_per_cycle"]
    try:
        return gemm_cost(cuda(arch).spec, t, M, K, N, reg, model) / CLOCK_PER_MS
    finally:
        gpu_space.BYTES_PER_CYCLE[arch] = saved


def fit(points, arch: str, start: dict) -> dict:
    def residuals(logp):
        p = dict(zip(FIELDS, np.exp(logp)))
        return [math.log(predict_ms(p, arch, pt)) - math.log(pt[6]) for pt in points]
    x = least_squares(residuals, np.log([start[f] for f in FIELDS]), method="trf").x
    return dict(zip(FIELDS, np.exp(x)))


def quality(params, arch, rows, points, row_ids):
    """Per row: (measured ms of the model's first choice, fastest measured, Spearman)."""
    out = []
    for ri in row_ids:
        pts = [p for p in points if p[0] == ri]
        pred = [predict_ms(params, arch, p) for p in pts]
        ms = [p[6] for p in pts]
        rx, ry = np.argsort(np.argsort(pred)), np.argsort(np.argsort(ms))
        out.append((ms[int(np.argmin(pred))], min(ms), float(np.corrcoef(rx, ry)[0, 1])))
    return out


def _geo(xs):
    return float(np.exp(np.mean(np.log(xs))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="benchmarks/results/cuda_gemm_h200.json")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--plot", default="benchmarks/results/cuda_gemm_h200.png")
    args = ap.parse_args()
    rows, points = load(args.data)
    current = {**dataclasses.asdict(MODEL), "bytes_per_cycle": gpu_space.BYTES_PER_CYCLE[args.arch]}
    fitted = fit(points, args.arch, current)
    print("constant              in the model    fitted now")
    for f in FIELDS:
        print(f"{f:20s} {current[f]:12.4g} {fitted[f]:13.4g}")
    q_now = quality(current, args.arch, rows, points, range(len(rows)))
    print(f"the model's constants: regret geomean {_geo([p / b for p, b, _ in q_now]):.3f}, "
          f"Spearman mean {np.mean([s for *_, s in q_now]):.2f}; refitted:")
    q = quality(fitted, args.arch, rows, points, range(len(rows)))
    print(f"\n{'shape':32s} {'M':>6s} {'ranked #1':>11s} {'refit #1':>9s} {'fastest':>8s} (ms, {len(rows[0]['configs'])} timed)")
    for r, (pick, best, _) in zip(rows, q):
        print(f"{r['group']:32s} {r['M']:6d} {r['measured_ms'][0]:11.3f} {pick:9.3f} {best:8.3f}")
    prev = [r["measured_ms"][0] / b for r, (_, b, _) in zip(rows, q)]
    new = [p / b for p, b, _ in q]
    print(f"\nregret (first choice / fastest timed): the ranking the data was timed under geomean {_geo(prev):.3f} "
          f"max {max(prev):.2f}; refitted model geomean {_geo(new):.3f} max {max(new):.2f}; "
          f"Spearman mean {np.mean([s for *_, s in q]):.2f}")
    held = []
    for g in sorted({r["group"] for r in rows}):
        ids = [i for i, r in enumerate(rows) if r["group"] == g]
        p = fit([pt for pt in points if pt[0] not in ids], args.arch, current)
        held += [a / b for a, b, _ in quality(p, args.arch, rows, points, ids)]
    print(f"each shape held out of the fit: regret geomean {_geo(held):.3f} max {max(held):.2f}")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib missing: no plot")
            return
        pred = [predict_ms(fitted, args.arch, p) for p in points]
        meas = [p[6] for p in points]
        fig, ax = plt.subplots(figsize=(6, 5))
        sc = ax.scatter(meas, pred, c=[math.log2(p[1]) for p in points], s=6, cmap="viridis")
        lim = [min(meas + pred) * 0.8, max(meas + pred) * 1.2]
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="measured ms (H200)", ylabel="model ms",
               title="SIMT GEMM cost model vs measurement")
        fig.colorbar(sc, label="log2 M")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
