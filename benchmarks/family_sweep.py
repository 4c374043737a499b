"""What the per-family sweeps of ``models/`` (:mod:`benchmarks.quantized_families`,
:mod:`benchmarks.half_families`) share: their common arguments, the ranges they compile and the
shapes they check; and the one call of onnxruntime's quantizers every quantized sweep makes
(:func:`quantize_model`, :mod:`benchmarks.unseen_families` too)."""
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


#: onnxruntime's three quantized formats, as the sweeps name them
QUANTIZED_FORMATS = ("dynamic", "qdq", "qoperator")


def quantize_model(src: str, dst: str, fmt: str, calibration: list[dict]) -> None:
    """``src`` quantized by onnxruntime into ``dst``: ``quantize_dynamic`` (int8 weights, activations
    quantized per call) or ``quantize_static`` in the QDQ or QOperator format (per-channel int8
    weights, uint8 activations calibrated on the ``calibration`` input batches)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    if fmt not in QUANTIZED_FORMATS:
        raise ValueError(f"unknown quantized format {fmt!r}; expected one of {', '.join(QUANTIZED_FORMATS)}")
    if fmt == "dynamic":
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        return

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calibration)

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, dst, Batches(), quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
