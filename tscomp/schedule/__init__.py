"""The schedule stage (DESIGN.md): per fused group and Target, a search space (TSCompiler §5.1's
loop-based model), the trust-region Bayesian tuner that explores it, the measurement harness that
times candidates in an isolated worker, and tuning records that persist what was found.

Names are imported lazily: importing this package (as the measurement worker does before it sets
its thread count) loads neither scikit-optimize nor any kernel code.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Axis": "space", "Constraint": "space", "DiscreteSpace": "space",
    "Budget": "tuner", "Trial": "tuner", "TrustRegion": "tuner", "TuningResult": "tuner",
    "tune": "tuner", "random_search": "tuner", "global_gp_search": "tuner",
    "Measurement": "measure", "MeasureError": "measure", "Measurer": "measure",
    "Workload": "measure", "measure_inline": "measure",
    "RECORDS_VERSION": "records", "RecordError": "records", "RecordStore": "records",
    "TuningRecord": "records",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
