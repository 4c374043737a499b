"""Compiled tiny models for the runtime tests, compiled once per test process."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def compiled_artifact(exported_model, tmp_path_factory):
    """Callable (family, exporter="dynamo", size="tiny") -> (artifact dir, onnx path, ranges)."""
    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime.artifact import write_artifact

    cache = {}

    def get(family: str, exporter: str = "dynamo", size: str = "tiny"):
        key = (family, exporter, size)
        if key not in cache:
            onnx_path = exported_model(family, size, exporter)
            ranges = symbol_ranges(family, size)
            dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]
            model = compile_model(str(onnx_path), dims, max_variants=2)
            out = tmp_path_factory.mktemp("artifacts") / f"{family}-{size}-{exporter}.tsc"
            cache[key] = (write_artifact(model, out), onnx_path, ranges)
        return cache[key]

    return get
