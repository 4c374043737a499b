"""Tuning records: what the schedule tuner kept for a group, persisted as JSON so that a later
compile (``tscomp compile --records FILE``) reuses it instead of tuning again.

A record is keyed by (kernel family, the family's analysis signature, target key): identical
groups (BERT's twelve layers) share one, and a record tuned for one machine is never applied to
another. It holds the kept configurations best first with their measured objective values (the
shape-generic objective of DietCode §4.2, summed over sample shapes), the trial count and the
method that produced them (TSCompiler §5.1's trust-region search, exhaustive search, or the
heuristic). The file is plain data: ``{"version": 1, "records": [...]}``, written atomically.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from tscomp.errors import TscompError

RECORDS_VERSION = 1


class RecordError(TscompError):
    """A tuning-records file is malformed or from another version."""


@dataclass
class TuningRecord:
    family: str
    signature: str
    target: str
    configs: list[dict[str, int]]
    values: list[float]
    trials: int
    method: str
    objective: str = ""
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.family, self.signature, self.target)

    def to_json(self) -> dict:
        out = asdict(self)
        # JSON has no infinity: a failed configuration's value is written as null
        out["values"] = [v if math.isfinite(v) else None for v in self.values]
        return out

    @classmethod
    def from_json(cls, data: dict, where: str) -> "TuningRecord":
        if not isinstance(data, dict):
            raise RecordError(f"{where}: a record must be an object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        required = {"family", "signature", "target", "configs", "values", "trials", "method"}
        missing = sorted(required - data.keys())
        if missing:
            raise RecordError(f"{where}: record lacks {', '.join(missing)}")
        unknown = sorted(data.keys() - names)
        if unknown:
            raise RecordError(f"{where}: record has unknown fields {', '.join(unknown)}")
        try:
            configs = [{str(k): int(v) for k, v in c.items()} for c in data["configs"]]
            values = [math.inf if v is None else float(v) for v in data["values"]]
            trials = int(data["trials"])
        except (AttributeError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: bad configs/values/trials ({exc})") from None
        if len(configs) != len(values):
            raise RecordError(f"{where}: {len(configs)} configs but {len(values)} values")
        return cls(family=str(data["family"]), signature=str(data["signature"]),
                   target=str(data["target"]), configs=configs, values=values, trials=trials,
                   method=str(data["method"]), objective=str(data.get("objective", "")),
                   created=str(data.get("created", "")))


class RecordStore:
    """Tuning records by (family, signature, target), backed by a JSON file (or memory only)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self._records: dict[tuple[str, str, str], TuningRecord] = {}

    def get(self, family: str, signature: str, target: str) -> TuningRecord | None:
        return self._records.get((family, signature, target))

    def put(self, record: TuningRecord) -> None:
        """Add ``record``, replacing any with the same key."""
        self._records[record.key] = record

    def save(self) -> None:
        """Write the file atomically (a temporary file renamed over it), keys sorted."""
        if self.path is None:
            raise RecordError("this record store is in memory only: it has no file to save to")
        doc = {"version": RECORDS_VERSION,
               "records": [self._records[k].to_json() for k in sorted(self._records)]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True, allow_nan=False)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> "RecordStore":
        """The store in ``path``; empty (and saving there) when the file does not exist yet."""
        store = cls(path)
        try:
            text = store.path.read_text()
        except FileNotFoundError:
            return store
        except OSError as exc:
            raise RecordError(f"tuning records {path}: cannot read ({exc.strerror})") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"tuning records {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(doc, dict) or "version" not in doc:
            raise RecordError(f"tuning records {path}: not a tscomp records file (no version)")
        if doc["version"] != RECORDS_VERSION:
            raise RecordError(f"tuning records {path}: version {doc['version']!r}, this tscomp reads "
                              f"version {RECORDS_VERSION}")
        records = doc.get("records")
        if not isinstance(records, list):
            raise RecordError(f"tuning records {path}: 'records' must be a list")
        for i, data in enumerate(records):
            store.put(TuningRecord.from_json(data, f"tuning records {path}, record {i}"))
        return store

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter([self._records[k] for k in sorted(self._records)])


__all__ = ["RECORDS_VERSION", "RecordError", "RecordStore", "TuningRecord"]
