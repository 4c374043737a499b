"""What the precision benchmarks share: timing several systems on the same inputs in one process,
fairly, and the latency plot (``benchmarks.bf16_vs_fp32``, ``benchmarks.quantized_vs_onnxruntime``).

A *system* is a callable from an input dict to an output dict. Per input every system runs twice
untimed, then two timed rounds, the second in reverse order (fair under drift), each call after a
0.1 s pause so a peer's spinning workers have stopped; a system's time is the lower of its two
medians of ``repeats`` calls.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from tscomp.bench import _timed as median_time

System = Callable[[dict], dict]


def accuracy(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(cosine similarity, relative L2 error) of ``got`` against ``want``."""
    g, w = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    cos = float(g @ w / max(np.linalg.norm(g) * np.linalg.norm(w), 1e-300))
    return cos, float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))


def run_and_time(systems: dict[str, System], inputs: dict, repeats: int) -> tuple[dict, dict]:
    """Every system's outputs and seconds per call at ``inputs``."""
    outs, times = {}, {}
    for name, fn in systems.items():
        outs[name] = fn(inputs)
        fn(inputs)
    for rnd in range(2):
        for name in (list(systems) if rnd == 0 else list(reversed(systems))):
            time.sleep(0.1)
            t = median_time(lambda: systems[name](inputs), repeats)
            times[name] = min(times.get(name, math.inf), t)
    return outs, times


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values))


def request_sizes(bindings: list[dict]) -> tuple[list[int], str]:
    """Each request's size along the plot's x axis and the axis's name: the sequence length, or the
    product of the other non-batch symbols (an image's height x width)."""
    if all("sequence" in b for b in bindings):
        return [b["sequence"] for b in bindings], "sequence length"
    names = sorted({k for b in bindings for k in b if k != "batch"})
    return [math.prod(b.get(k, 1) for k in names) for b in bindings], " x ".join(names) or "request"


def shape_label(binding: dict) -> str:
    """A request's non-batch sizes, e.g. ``97x131`` (height, width) or ``139`` (a sequence)."""
    return "x".join(str(v) for k, v in binding.items() if k != "batch") or "-"


def save_results(out: Path, record: dict, rows: list[dict], systems: list[str], threads: int) -> None:
    """``record`` (with ``rows``) as JSON at ``out``, the latency plot beside it; says where."""
    import json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**record, "threads": threads, "rows": rows}, indent=1))
    xs, xlabel = request_sizes([r["binding"] for r in rows])
    png = plot_latency(xs, {c: [r["ms"][c] for r in rows] for c in systems}, out, xlabel,
                       f"latency ms ({threads} threads)")
    if png:
        print(f"plot: {png}")
    print(f"results: {out}")


def plot_latency(xs: list, series: dict[str, list[float]], out: Path, xlabel: str, ylabel: str) -> Path | None:
    """One line per system; the PNG next to ``out`` (None where matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, ys in series.items():
        ax.plot(xs, ys, marker="o", ms=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    return png
