"""Shared pytest fixtures and the conformance summary.

``exported_model(family, size="tiny", exporter="dynamo") -> Path`` exports a model of ``models.families``
into a cache folder (``$TSCOMP_MODEL_CACHE``, default ``<repo>/.cache/models``) once and returns the
.onnx path; exports are file-locked and atomic, so pytest-xdist workers share the cache safely.

Tests marked ``base`` (or asking ``exported_model`` for a base-size model) are skipped unless
``TSCOMP_BASE_MODELS=1``.
"""

from __future__ import annotations

import os
import pathlib

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BASE_MODELS_ENV = "TSCOMP_BASE_MODELS"
SKIP_BASE_REASON = f"base-size models are slow to export and run: set {BASE_MODELS_ENV}=1 to run"


def model_cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TSCOMP_MODEL_CACHE", REPO_ROOT / ".cache" / "models"))


def base_models_enabled() -> bool:
    return os.environ.get(BASE_MODELS_ENV) == "1"


def pytest_collection_modifyitems(config, items):
    if base_models_enabled():
        return
    skip_base = pytest.mark.skip(reason=SKIP_BASE_REASON)
    for item in items:
        if "base" in item.keywords:
            item.add_marker(skip_base)


def _require_export_extra() -> None:
    """Skip (not fail) where the optional export dependencies are missing."""
    for module in ("torch", "transformers", "onnxscript"):
        pytest.importorskip(module, reason=f"{module} missing: install the 'export' extra")


def _export_in_a_clean_process(family, size, exporter, opset, half=False) -> pathlib.Path:
    """Under ``make test-asan`` libasan is preloaded into Python, and torch's exporter aborts in
    it: the export runs in a child without the sanitizer (the ONNX file is all the tests need)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TSCOMP_SANITIZE")}
    code = ("import sys; from models.export import export_model; "
            "print(export_model(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], "
            "opset=None if sys.argv[5] == 'None' else int(sys.argv[5]), half=sys.argv[6] == 'True'))")
    out = subprocess.run([sys.executable, "-c", code, family, size, exporter, str(model_cache_dir()), str(opset),
                          str(half)],
                         env=env, capture_output=True, text=True, check=True, cwd=pathlib.Path(__file__).parents[1])
    return pathlib.Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def exported_model():
    """Callable (family, size="tiny", exporter="dynamo", opset=None, half=False) -> Path of the cached
    ONNX export (``half``: the model in float16)."""

    def export(family: str, size: str = "tiny", exporter: str = "dynamo", opset: int | None = None,
               half: bool = False) -> pathlib.Path:
        if size == "base" and not base_models_enabled():
            pytest.skip(SKIP_BASE_REASON)
        _require_export_extra()
        if os.environ.get("TSCOMP_SANITIZE"):
            return _export_in_a_clean_process(family, size, exporter, opset, half)
        from models.export import export_model

        return export_model(family, size, exporter, model_cache_dir(), opset=opset, half=half)

    return export


# ----------------------------------------------------------------------------------------------
# Per-operator ONNX conformance counts (tests/graph/test_onnx_conformance.py), printed at the end of
# the run. Kept here, not in tests/graph/, because under pytest-xdist only the top conftest is loaded
# in the controlling process; the counts travel there as ``user_properties`` of the test reports.
_COUNTS: dict[str, tuple[int, int]] = {}


def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "conformance_counts":
            op, ran, skipped = value
            _COUNTS[op] = (ran, skipped)


def pytest_terminal_summary(terminalreporter):
    if not _COUNTS:
        return
    tr = terminalreporter
    tr.section("ONNX conformance cases per registered operator (ran / skipped with a reason)")
    items = [f"{op} {ran}/{skipped}" for op, (ran, skipped) in sorted(_COUNTS.items())]
    for k in range(0, len(items), 8):
        tr.write_line("  ".join(items[k:k + 8]))
    total_ran = sum(r for r, _ in _COUNTS.values())
    total_skipped = sum(s for _, s in _COUNTS.values())
    tr.write_line(f"{len(_COUNTS)} operators, {total_ran} cases ran, {total_skipped} skipped")
