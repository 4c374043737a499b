"""Tuning records: JSON round trip, replacement by key, and errors that name the file."""
import json
import math

import pytest

from tscomp.errors import TscompError
from tscomp.schedule.records import RECORDS_VERSION, RecordError, RecordStore, TuningRecord


def record(sig="M:K=768,N=3072", values=(1e-3, 2e-3), method="turbo"):
    return TuningRecord(family="gemm", signature=sig, target="cpu-avx2-2c-l1_32k-l2_512k",
                        configs=[{"mr": 6, "nr": 16, "mc": 96, "nc": 256, "kc": 256},
                                 {"mr": 4, "nr": 16, "mc": 64, "nc": 128, "kc": 512}][:len(values)],
                        values=list(values), trials=40, method=method, objective="M in 1,64,512",
                        created="2026-11-22T22:00:00+00:00")


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "records.json"
    store = RecordStore(path)
    store.put(record())
    store.put(record(sig="other", values=(3e-3, math.inf)))
    store.save()
    loaded = RecordStore.load(path)
    assert len(loaded) == 2
    assert loaded.get("gemm", "M:K=768,N=3072", "cpu-avx2-2c-l1_32k-l2_512k") == record()
    assert loaded.get("gemm", "other", "cpu-avx2-2c-l1_32k-l2_512k").values == [3e-3, math.inf]
    assert loaded.get("gemm", "other", "cuda-sm_80") is None
    assert [r.signature for r in loaded] == ["M:K=768,N=3072", "other"]
    doc = json.loads(path.read_text())
    assert doc["version"] == RECORDS_VERSION
    assert not list(tmp_path.glob("sub/*.tmp"))  # the atomic write left no temporary file


def test_put_replaces_same_key():
    store = RecordStore(None)
    store.put(record(method="heuristic"))
    store.put(record(method="turbo"))
    assert len(store) == 1
    assert store.get("gemm", "M:K=768,N=3072", "cpu-avx2-2c-l1_32k-l2_512k").method == "turbo"
    with pytest.raises(RecordError):
        store.save()  # in-memory store


def test_missing_file_is_empty(tmp_path):
    store = RecordStore.load(tmp_path / "none.json")
    assert len(store) == 0 and list(store) == []


@pytest.mark.parametrize("text, what", [
    ("{not json", "not valid JSON"),
    ('{"version": 99, "records": []}', "version 99"),
    ('[1, 2]', "no version"),
    ('{"version": 1, "records": {}}', "must be a list"),
    ('{"version": 1, "records": [{"family": "gemm"}]}', "lacks"),
    ('{"version": 1, "records": [{"family": "g", "signature": "s", "target": "t", "configs": [{"mr": 1}],'
     ' "values": [], "trials": 1, "method": "turbo"}]}', "1 configs but 0 values"),
])
def test_bad_files_raise_record_error_naming_the_file(tmp_path, text, what):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RecordError) as info:
        RecordStore.load(path)
    assert str(path) in str(info.value) and what in str(info.value)
    assert isinstance(info.value, TscompError)
