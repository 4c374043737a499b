"""What the per-family sweeps of ``models/`` (:mod:`benchmarks.quantized_families`,
:mod:`benchmarks.half_families`) share: their common arguments, the ranges they compile and the
shapes they check."""
from __future__ import annotations

import argparse
from collections.abc import Iterator

import numpy as np

from models import families as F

#: the longest sequence / image side compiled and checked (tiny models, short compiles)
MAX_EXTENT = 64


def arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the sweep's common options (--families, --shapes, --seed, --cache)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--families", default=",".join(F.FAMILIES))
    ap.add_argument("--shapes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cache", default=".cache/models")
    return ap


def tiny_ranges(family: str) -> dict[str, tuple[int, int]]:
    """The family's tiny-size symbol ranges, capped at :data:`MAX_EXTENT`."""
    return {k: (lo, min(hi, MAX_EXTENT)) for k, (lo, hi) in F.symbol_ranges(family, "tiny").items()}


def checked_bindings(ranges: dict[str, tuple[int, int]], shapes: int, rng: np.random.Generator) -> Iterator[dict]:
    """``shapes`` bindings: every symbol at its minimum, then at its maximum, then random ones."""
    for k in range(shapes):
        yield {s: (lo if k == 0 else hi if k == 1 else int(rng.integers(lo, hi + 1))) for s, (lo, hi) in ranges.items()}


def relative_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))
