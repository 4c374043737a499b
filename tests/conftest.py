"""Shared pytest fixtures.

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


@pytest.fixture(scope="session")
def exported_model():
    """Callable (family, size="tiny", exporter="dynamo") -> Path of the cached ONNX export."""

    def export(family: str, size: str = "tiny", exporter: str = "dynamo", opset: int | None = None) -> pathlib.Path:
        if size == "base" and not base_models_enabled():
            pytest.skip(SKIP_BASE_REASON)
        _require_export_extra()
        from models.export import export_model

        return export_model(family, size, exporter, model_cache_dir(), opset=opset)

    return export
