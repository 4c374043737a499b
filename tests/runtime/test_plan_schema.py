"""The classes ``plan.json`` rebuilds, and the attributes each records, change only with a new
artifact format version.

The loader rebuilds a compiled kernel as its class plus the attributes the artifact recorded
(:mod:`tscomp.runtime.plain_data`): an artifact written before a kernel class gained an attribute
loads without it and fails later, deep in a request (an int8-era tscomp read a format-7 artifact's
GEMM kernels and raised ``AttributeError: ... 'x_offset'`` while packing their weights), instead of
being refused at load with "recompile". ``FORMAT_VERSION`` is what refuses it; this test keeps the
classes and attributes the current version's artifacts record (``plan_schema.json``) and fails
when a compiled plan records a class or an attribute that the snapshot lacks.

When it fails: bump ``tscomp.runtime.artifact.FORMAT_VERSION`` (an artifact of the old layout
cannot run) and regenerate the snapshot::

    TSCOMP_WRITE_PLAN_SCHEMA=1 .venv/bin/python -m pytest tests/runtime/test_plan_schema.py
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

from tscomp.runtime.artifact import FORMAT_VERSION

SNAPSHOT = Path(__file__).with_name("plan_schema.json")
REGENERATE = "TSCOMP_WRITE_PLAN_SCHEMA"
#: the compiled models whose plans the snapshot covers (GEMM, attention, row and elementwise
#: groups; Conv patch embeddings), as other runtime tests compile them
ARTIFACTS = (("bert", {}), ("vit", {"keep_copies": True}))
#: memo attributes named by the host's thread count (the wave model's fit per blocks-per-wave,
#: :func:`tscomp.runtime.wave.wave_points`): one name whatever the host
PER_HOST_NAME = re.compile(r"^(_wave_points_)\d+$")


def recorded_attributes(artifact: Path) -> dict[str, set[str]]:
    """Class name -> every attribute an object of that class records in the artifact's plan."""
    attributes: dict[str, set[str]] = defaultdict(set)
    for entry in json.loads((artifact / "plan.json").read_text())["objects"]:
        if "cls" in entry:
            attributes[entry["cls"]] |= {PER_HOST_NAME.sub(r"\1<workers>", name) for name in entry["state"]}
    return attributes


def _write_snapshot(seen: dict[str, set[str]]) -> None:
    old = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else {}
    classes = old.get("classes", {}) if old.get("format_version") == FORMAT_VERSION else {}
    merged = {c: sorted(set(classes.get(c, ())) | seen.get(c, set())) for c in sorted(set(classes) | set(seen))}
    SNAPSHOT.write_text(json.dumps({"format_version": FORMAT_VERSION, "classes": merged}, indent=1) + "\n")


def test_recorded_classes_and_attributes_change_only_with_the_format_version(compiled_artifact):
    seen: dict[str, set[str]] = defaultdict(set)
    for family, options in ARTIFACTS:
        for cls, attrs in recorded_attributes(compiled_artifact(family, **options)[0]).items():
            seen[cls] |= attrs
    if os.environ.get(REGENERATE):
        _write_snapshot(seen)
    snapshot = json.loads(SNAPSHOT.read_text())
    assert snapshot["format_version"] == FORMAT_VERSION, (
        f"FORMAT_VERSION is {FORMAT_VERSION}, the snapshot's {snapshot['format_version']}: regenerate it "
        f"({REGENERATE}=1, see this module's docstring)")
    known = snapshot["classes"]
    new = {cls: sorted(attrs - set(known.get(cls, ()))) for cls, attrs in seen.items() if attrs - set(known.get(cls, ()))}
    assert not new, (
        f"plan.json records attributes that format version {FORMAT_VERSION}'s artifacts lack: {new}. Such an "
        "artifact would load without them and fail in a request: bump FORMAT_VERSION, then regenerate the "
        f"snapshot ({REGENERATE}=1, see this module's docstring)")
