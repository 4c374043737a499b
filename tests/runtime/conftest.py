"""Compiled tiny models for the runtime tests, compiled once per test process."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def compiled_artifact(exported_model, tmp_path_factory):
    """Callable (family, exporter="dynamo", size="tiny", keep_copies=False) -> (artifact dir, onnx
    path, ranges). ``keep_copies``: every variant the heuristic proposes stays, whatever the measured
    gain of its packed copy (``COPY_WORTH*`` = 0) -- for tests about several variants per group: on
    an AVX2 host the large and small GEMM tiles pack their weights at different widths, and a tiny
    model's second copy usually gains too little to be kept."""
    import contextlib
    from unittest import mock

    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime import dispatch
    from tscomp.runtime.artifact import write_artifact

    cache = {}

    def get(family: str, exporter: str = "dynamo", size: str = "tiny", keep_copies: bool = False):
        key = (family, exporter, size, keep_copies)
        if key not in cache:
            onnx_path = exported_model(family, size, exporter)
            ranges = symbol_ranges(family, size)
            dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]
            keep = mock.patch.multiple(dispatch, COPY_WORTH=0.0, COPY_WORTH_RESIDENT=0.0) if keep_copies else contextlib.nullcontext()
            with keep:
                model = compile_model(str(onnx_path), dims, max_variants=2)
            name = f"{family}-{size}-{exporter}{'-all-copies' if keep_copies else ''}.tsc"
            cache[key] = (write_artifact(model, tmp_path_factory.mktemp("artifacts") / name), onnx_path, ranges)
        return cache[key]

    return get
