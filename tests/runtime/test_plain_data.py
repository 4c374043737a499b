"""The plan as plain data (tscomp.runtime.plain_data): what round-trips exactly, and what the
decoder refuses (it never constructs a class from outside tscomp, so a crafted plan.json cannot
run code the way a crafted pickle can)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import sympy

from tscomp.graph.ops.registry import FusionClass
from tscomp.graph.symbols import SymbolTable, make_symbol
from tscomp.runtime import plain_data
from tscomp.runtime.plain_data import BlobReader, BlobWriter, PlainDataError


def _roundtrip(obj, tmp_path):
    blobs = BlobWriter()
    doc = plain_data.dump(obj, blobs)
    doc.pop("_ids")
    text = json.dumps(doc, allow_nan=False)                 # strict JSON
    blobs.write(tmp_path / "w.bin")
    buf, _ = plain_data.read_aligned(tmp_path / "w.bin")
    return plain_data.load(json.loads(text), BlobReader(buf, blobs.index))


def test_symbolic_shapes_round_trip_exactly(tmp_path):
    L, B = make_symbol("L"), make_symbol("B")
    exprs = [L * B + 3, sympy.floor(L / 16), sympy.ceiling((L + 1) / 2), sympy.Mod(L, 7), sympy.Min(L, 512),
             sympy.Max(1, L - 3), sympy.Rational(1, 3) * L, sympy.Piecewise((L, L <= 5), (5, True)), L ** 2]
    back = _roundtrip(exprs, tmp_path)
    assert back == exprs
    assert all(s.is_integer and s.is_positive for e in back for s in e.free_symbols)


def test_sharing_and_containers_survive(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    table = SymbolTable()
    table.new_symbol("L", origin="user", min=1, max=512)
    obj = {"a": arr, "b": arr, "t": (1, 2.5, None), "s": {3}, "nan": math.nan, "dt": np.dtype("int64"),
           "scalar": np.float32(0.5), "enum": FusionClass.BACKBONE, "sym": table, "sym2": table,
           "obj": np.array([make_symbol("L") + 1, 3], dtype=object), 7: "int key"}
    back = _roundtrip(obj, tmp_path)
    np.testing.assert_array_equal(back["a"], arr)
    assert back["a"].ctypes.data % 64 == 0
    assert back["t"] == (1, 2.5, None) and back["s"] == {3} and math.isnan(back["nan"])
    assert back["dt"] == np.dtype("int64") and back["scalar"].dtype == np.float32
    assert back["enum"] is FusionClass.BACKBONE
    assert back["sym"] is back["sym2"] and back["sym"].get("L").max == 512
    assert back["obj"].dtype == object and back["obj"][0] == make_symbol("L") + 1
    assert back[7] == "int key"


def test_identical_arrays_are_one_blob():
    blobs = BlobWriter()
    plain_data.dump([np.ones(100, np.float32), np.ones(100, np.float32), np.zeros(100, np.float32)], blobs)
    assert len(blobs.index) == 2


@pytest.mark.parametrize("cls", ["os:system", "builtins:eval", "subprocess:Popen", "tscomp.graph.symbols:make_symbol"])
def test_decoder_refuses_classes_outside_tscomp_and_non_classes(cls):
    doc = {"root": {"r": 0}, "objects": [{"cls": cls, "state": {}}]}
    with pytest.raises(PlainDataError, match="outside tscomp|not a class"):
        plain_data.load(doc, BlobReader(np.zeros(0, np.uint8), {}))


def test_encoder_refuses_foreign_objects():
    with pytest.raises(PlainDataError, match="only tscomp's own classes"):
        plain_data.dump({"f": object()}, BlobWriter())


def test_unknown_sympy_node_and_bad_assumptions_are_refused():
    bad = [{"root": {"r": 0}, "objects": [{"expr": {"fn": "__import__", "args": []}}]},
           {"root": {"r": 0}, "objects": [{"expr": {"sym": "x", "as": {"evil": "1"}}}]}]
    for doc in bad:
        with pytest.raises(PlainDataError):
            plain_data.load(doc, BlobReader(np.zeros(0, np.uint8), {}))


def _blob_roundtrip(arr, tmp_path):
    blobs = BlobWriter()
    key = blobs.add(arr)
    blobs.write(tmp_path / "w.bin")
    buf, _ = plain_data.read_aligned(tmp_path / "w.bin")
    return blobs.index[key], BlobReader(buf, blobs.index).get(key)


@pytest.mark.parametrize("lo, hi, stored", [(-128, 127, "int8"), (0, 255, "uint8"), (-300, 300, "int16")])
def test_a_float_blob_of_small_integers_is_stored_narrow_and_read_back_bit_identical(tmp_path, lo, hi, stored):
    arr = np.random.default_rng(0).integers(lo, hi + 1, (96, 80)).astype(np.float32)   # a quantized weight in float
    entry, back = _blob_roundtrip(arr, tmp_path)
    assert np.dtype(entry["stored"]) == np.dtype(stored) and entry["nbytes"] == arr.size * np.dtype(stored).itemsize
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), arr.view(np.uint32))


@pytest.mark.parametrize("spoil, stored", [(0.5, "float16"), (-0.0, "float16"), (np.nan, "float16"),
                                           (70000.0, None), (0.1, None)],
                         ids=["fraction", "negative zero", "nan", "beyond float16", "not a float16"])
def test_a_float_blob_that_is_not_exactly_small_integers_is_stored_as_float16_or_as_is(tmp_path, spoil, stored):
    """Not integers: stored as float16 where every element is exactly one, else as float32."""
    arr = np.random.default_rng(1).integers(-100, 100, (64, 64)).astype(np.float32)
    arr[40, 7] = spoil
    entry, back = _blob_roundtrip(arr, tmp_path)
    assert entry.get("stored") == (np.dtype(stored).str if stored else None)
    assert entry["nbytes"] == arr.size * (2 if stored else 4)
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), arr.view(np.uint32))


def test_a_float16_models_weight_is_stored_as_float16_and_read_back_bit_identical(tmp_path):
    arr = np.random.default_rng(3).standard_normal((96, 80)).astype(np.float16).astype(np.float32)
    entry, back = _blob_roundtrip(arr, tmp_path)
    assert np.dtype(entry["stored"]) == np.float16 and entry["nbytes"] == arr.size * 2
    assert back.dtype == np.float32 and np.array_equal(back.view(np.uint32), arr.view(np.uint32))


def test_a_stored_form_the_reader_does_not_widen_is_refused(tmp_path):
    blobs = BlobWriter()
    key = blobs.add(np.arange(64, dtype=np.float32))
    blobs.index[key]["stored"] = "<f8"                       # an edited index
    blobs.write(tmp_path / "w.bin")
    buf, _ = plain_data.read_aligned(tmp_path / "w.bin")
    with pytest.raises(PlainDataError, match="not a form this reader widens"):
        BlobReader(buf, blobs.index).get(key)


def test_256_consecutive_integers_anywhere_are_stored_as_uint8_with_a_bias(tmp_path):
    arr = np.random.default_rng(2).integers(-200, 56, (64, 64)).astype(np.float32)   # an int8 table minus its zero point
    arr[0, 0], arr[0, 1] = -200, 55
    entry, back = _blob_roundtrip(arr, tmp_path)
    assert np.dtype(entry["stored"]) == np.uint8 and entry["bias"] == -200
    assert np.array_equal(back.view(np.uint32), arr.view(np.uint32))
