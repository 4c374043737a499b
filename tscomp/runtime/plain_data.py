"""The compiled plan as plain data: an object graph written as JSON, arrays as aligned binary
blobs — what ``plan.json`` and ``weights.bin`` of an artifact hold (TSCompiler §6: the runtime
loader's input; issue 10: no pickle anywhere).

Unlike pickle, decoding never runs code named by the data. The JSON names *classes*, and only
these are rebuilt:

* classes defined in ``tscomp`` modules, rebuilt as ``cls.__new__(cls)`` plus their recorded
  attributes (the state ``__getstate__`` gives, when a class defines it: the per-binding caches
  and ctypes entry points it leaves out are rebuilt on use) — no ``__init__``, ``__setstate__``
  or ``__reduce__`` is called;
* enums of those modules, by member name;
* SymPy expressions, as trees of SymPy classes from SymPy's public namespace (``Add``, ``Mul``,
  ``floor``, ``Mod``, ``Piecewise``, relations, ...), symbols with their assumptions;
* numpy dtypes, scalars and arrays (numeric arrays become blobs, object arrays of SymPy
  expressions nested lists).

Objects reached twice (an expression DAG's shared nodes, the symbol table every kernel points
at) are written once and referenced, so sharing survives the round trip. Blobs are content
addressed: a weight read by several groups, or identical in several layers (ALBERT), is stored
once. A float32 array whose every element is, bit for bit, an integer (a quantized model's weight
that the compiler computes in float: :mod:`tscomp.graph.quantized_arithmetic`) is stored as int8,
uint8 (with a ``bias`` added back where its 256 values lie elsewhere: a weight shifted by its zero
point) or int16, and one whose every element is exactly a float16 (a float16 model's weight, which
the compiler computes in float32: :mod:`tscomp.graph.half_precision`) as float16; each is widened
when read (``stored`` in its index entry): the artifact of an int8 or float16 model stays the size of
its weights.
"""
from __future__ import annotations

import base64
import enum
import fractions
import hashlib
import importlib
import sys
from dataclasses import dataclass, field

import numpy as np
import sympy

from tscomp.errors import TscompError

ALIGN = 64      # every blob starts on a cache line (the kernels stream weights in whole lines)
#: the types a float32 blob may be stored as: integers (narrowest first), float16
NARROW_STORAGE = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.float16))
#: the largest float32 integer magnitude stored narrow (every integer below it is exact in float32)
NARROW_LIMIT = 1 << 24


def narrow_storage(arr: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(stored, bias)`` with ``stored + bias`` giving back ``arr``'s float32 bits, ``stored`` of
    the narrowest integer type that holds ``arr - bias`` (no -0.0, no fraction) -- uint8 with a bias
    for 256 consecutive integers anywhere (a weight shifted by its zero point) -- else float16 where
    every element is one; or None. A sample decides first, so a plain float weight costs one small
    check."""
    if arr.dtype != np.float32 or arr.size < 64:
        return None
    return _narrow_integers(arr) or _narrow_half(arr)


def _narrow_half(arr: np.ndarray) -> tuple[np.ndarray, int] | None:
    flat = arr.reshape(-1)
    for sample in (flat[:64], flat):
        with np.errstate(over="ignore"):       # beyond float16's range: inf, which the test refuses
            half = sample.astype(np.float16)
        if not np.array_equal(half.astype(np.float32).view(np.uint32), sample.view(np.uint32)):
            return None       # (bit for bit: NaN payloads and -0.0 included)
    return half.reshape(arr.shape), 0


def _narrow_integers(arr: np.ndarray) -> tuple[np.ndarray, int] | None:
    flat = arr.reshape(-1)
    for sample in (flat[:64], flat):
        if not np.array_equal(np.trunc(sample), sample) or np.signbit(sample[sample == 0]).any():
            return None
    lo, hi = float(flat.min()), float(flat.max())
    if max(-lo, hi) >= NARROW_LIMIT:
        return None
    int8, uint8, int16, _ = NARROW_STORAGE
    for dtype, bias in ((int8, 0), (uint8, 0), (uint8, int(lo)), (int16, 0)):       # fewest bytes first
        info = np.iinfo(dtype)
        if info.min <= lo - bias and hi - bias <= info.max:
            return (flat - np.float32(bias)).astype(dtype).reshape(arr.shape), bias
    return None


class PlainDataError(TscompError):
    """Data that this decoder refuses (a class outside tscomp, an unknown tag)."""


# ---------------------------------------------------------------------------- blobs
@dataclass
class BlobWriter:
    """Content-addressed arrays, laid out 64-byte aligned in one binary file."""
    index: dict[str, dict] = field(default_factory=dict)       # key -> {offset, nbytes, dtype, shape}
    chunks: list[tuple[int, np.ndarray]] = field(default_factory=list)
    size: int = 0

    def add(self, arr: np.ndarray) -> str:
        arr = np.ascontiguousarray(arr)
        data = arr.view(np.uint8).reshape(-1) if arr.size else np.zeros(0, np.uint8)
        key = hashlib.sha256(data).hexdigest()[:32] + f"-{arr.dtype.str}-{'x'.join(map(str, arr.shape))}"
        if key not in self.index:
            offset = -(-self.size // ALIGN) * ALIGN
            entry = {"offset": offset, "dtype": arr.dtype.str, "shape": list(arr.shape)}
            narrow = narrow_storage(arr)
            if narrow is not None:
                stored, bias = narrow
                data, entry["stored"] = stored.view(np.uint8).reshape(-1), stored.dtype.str
                if bias:
                    entry["bias"] = bias
            self.index[key] = {**entry, "nbytes": int(data.nbytes)}
            self.chunks.append((offset, data))
            self.size = offset + data.nbytes
        return key

    def write(self, path) -> None:
        with open(path, "wb") as f:
            pos = 0
            for offset, data in self.chunks:
                f.write(b"\0" * (offset - pos))
                f.write(memoryview(data))
                pos = offset + data.nbytes


def read_aligned(path, expected_sha256: str | None = None, chunk: int = 1 << 24):
    """The file's bytes in one 64-byte-aligned buffer, hashed while read (one pass over the data).
    With ``expected_sha256``, a mismatch raises before anything reads the contents."""
    import os
    size = os.path.getsize(path)
    buf = _aligned_bytes(size)
    h = hashlib.sha256()
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        pos = 0
        while pos < size:
            n = f.readinto(mv[pos:pos + chunk])
            if not n:
                break
            h.update(mv[pos:pos + n])
            pos += n
    if pos != size:
        raise PlainDataError(f"{path}: short read ({pos} of {size} bytes)")
    return buf, h.hexdigest()


class BlobReader:
    """The arrays of a weights file read into ``buf``. :meth:`get` hands out 64-byte-aligned copies
    (one per blob, shared by every reader of that content) that do not keep ``buf`` alive, so the
    file's buffer is freed once the load is done; :meth:`view` reads a blob in place, for data used
    only while loading (a raw GEMM weight packed into its panels)."""

    def __init__(self, buf: np.ndarray, index: dict[str, dict]):
        self.buf, self.index = buf, index
        self._copies: dict[str, np.ndarray] = {}

    def view(self, key: str) -> np.ndarray:
        """The blob in place (read-only): valid while ``buf`` lives (a widened blob: a new array)."""
        try:
            e = self.index[key]
        except KeyError:
            raise PlainDataError(f"blob {key!r} is not in the blob index") from None
        off, n = int(e["offset"]), int(e["nbytes"])
        dtype = np.dtype(e["dtype"])
        stored = np.dtype(e.get("stored", dtype))
        if stored != dtype and (dtype != np.float32 or stored not in NARROW_STORAGE):
            raise PlainDataError(f"blob {key!r}: {dtype} stored as {stored} is not a form this reader widens")
        if off < 0 or off + n > self.buf.size or n != int(np.prod(e["shape"], dtype=np.int64)) * stored.itemsize:
            raise PlainDataError(f"blob {key!r}: offset/size outside the weights file")
        arr = self.buf[off:off + n].view(stored).reshape(e["shape"])
        if stored != dtype:                  # widened once per read: a packed weight is read once
            bias = e.get("bias", 0)
            if not isinstance(bias, int) or abs(bias) >= NARROW_LIMIT:
                raise PlainDataError(f"blob {key!r}: bias {bias!r} is not a float32 integer")
            arr = arr.astype(dtype)
            if bias:
                arr += np.float32(bias)
        arr.flags.writeable = False
        return arr

    def get(self, key: str) -> np.ndarray:
        """The blob as its own read-only, 64-byte-aligned array (one copy per blob)."""
        arr = self._copies.get(key)
        if arr is None:
            arr = self._copies[key] = _aligned_copy(self.view(key))
            arr.flags.writeable = False       # shared by every reader of this content
        return arr


def _aligned_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized bytes starting on an ``ALIGN``-byte boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    out = _aligned_bytes(a.nbytes).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


# ---------------------------------------------------------------------------- encoding
_SCALARS = (type(None), bool, int, float, str)


def _default_getstate(cls) -> bool:
    return getattr(cls, "__getstate__", object.__getstate__) is object.__getstate__


def _class_name(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class Encoder:
    """``Encoder(blobs).encode(obj)`` → a JSON-able value; ``table`` the shared objects."""

    def __init__(self, blobs: BlobWriter, replace=None):
        self.blobs = blobs
        self.table: list = []
        self._ids: dict[int, int] = {}
        self._alive: list = []          # keep encoded objects alive: ids stay unique
        self._exprs: dict = {}
        self.replace = replace or {}   # id(obj) -> the plain value to write instead

    def encode(self, x):
        if isinstance(x, _SCALARS):
            if isinstance(x, float) and not np.isfinite(x):
                return {"f": repr(x)}
            return x
        rid = id(x)
        if rid in self.replace:
            return self.replace[rid]
        if isinstance(x, list):
            return [self.encode(v) for v in x]
        if isinstance(x, tuple):
            return {"t": [self.encode(v) for v in x]}
        if isinstance(x, dict):
            if all(type(k) is str for k in x):
                return {"d": {k: self.encode(v) for k, v in x.items()}}
            return {"dk": [[self.encode(k), self.encode(v)] for k, v in x.items()]}
        if isinstance(x, (set, frozenset)):
            return {"fs" if isinstance(x, frozenset) else "s": [self.encode(v) for v in x]}
        if isinstance(x, sympy.Basic):
            return {"r": self._expr(x)}
        if isinstance(x, np.ndarray):
            if x.dtype == object:
                return {"oa": list(x.shape), "v": [self.encode(v) for v in x.reshape(-1).tolist()]}
            return {"a": self.blobs.add(x)}
        if isinstance(x, np.dtype):
            return {"dt": x.str}
        if isinstance(x, np.generic):
            return {"ns": x.dtype.str, "v": self.encode(x.item())}
        if isinstance(x, type) and issubclass(x, np.generic):
            return {"nt": np.dtype(x).str}
        if isinstance(x, slice):
            return {"sl": [self.encode(x.start), self.encode(x.stop), self.encode(x.step)]}
        if isinstance(x, fractions.Fraction):
            return {"fr": [x.numerator, x.denominator]}
        if isinstance(x, bytes):
            return {"b": base64.b64encode(x).decode()}
        if isinstance(x, enum.Enum):
            _check_tscomp_class(type(x))
            return {"e": _class_name(type(x)), "n": x.name}
        return {"r": self._object(x)}

    # -- shared objects
    def _object(self, x) -> int:
        idx = self._ids.get(id(x))
        if idx is not None:
            return idx
        cls = type(x)
        _check_tscomp_class(cls)
        idx = len(self.table)
        self._ids[id(x)] = idx
        self._alive.append(x)
        self.table.append(None)
        state = x.__dict__ if _default_getstate(cls) else x.__getstate__()
        if not isinstance(state, dict):
            raise PlainDataError(f"{_class_name(cls)}: state is not a dict of attributes")
        self.table[idx] = {"cls": _class_name(cls), "state": {k: self.encode(v) for k, v in state.items()}}
        return idx

    def _expr(self, e: sympy.Basic) -> int:
        try:
            idx = self._exprs.get(e)
        except TypeError:
            idx = None
        if idx is not None:
            return idx
        if isinstance(e, sympy.Dummy):
            entry = {"dummy": e.name, "i": e.dummy_index, "as": _assumptions(e)}
        elif isinstance(e, sympy.Symbol):
            entry = {"sym": e.name, "as": _assumptions(e)}
        elif isinstance(e, sympy.Integer):
            entry = {"int": int(e)}
        elif isinstance(e, sympy.Rational):
            entry = {"q": [int(e.p), int(e.q)]}
        elif isinstance(e, sympy.Float):
            entry = {"float": str(e), "prec": e._prec}
        elif e in (sympy.true, sympy.false):
            entry = {"bool": bool(e)}
        elif e.is_Atom and type(e).__name__ in _ATOMS:
            entry = {"atom": type(e).__name__}
        else:
            name = type(e).__name__
            if _sympy_class(name) is not type(e):
                raise PlainDataError(f"cannot write the SymPy node {name} ({e}) as plain data")
            entry = {"fn": name, "args": [self._expr(a) for a in e.args]}
        idx = len(self.table)
        self.table.append({"expr": entry})
        try:
            self._exprs[e] = idx
        except TypeError:
            pass
        return idx


def _assumptions(sym) -> dict:
    return {k: v for k, v in sym._assumptions_orig.items() if v is not None}


_ATOMS = {"Infinity": sympy.oo, "NegativeInfinity": -sympy.oo, "NaN": sympy.nan, "Zero": sympy.S.Zero,
          "One": sympy.S.One, "NegativeOne": sympy.S.NegativeOne, "Half": sympy.S.Half,
          "ComplexInfinity": sympy.zoo, "Pi": sympy.pi, "Exp1": sympy.E}


def _sympy_class(name: str):
    """A SymPy expression class from SymPy's public namespace, else None."""
    from tscomp.graph.symbols import FloorSqrt       # tscomp's own SymPy node
    cls = getattr(sympy, name, None) or {"FloorSqrt": FloorSqrt}.get(name)
    if cls is None:
        from sympy.core import relational
        from sympy.functions.elementary import piecewise
        cls = getattr(relational, name, None) or getattr(piecewise, name, None)
    if isinstance(cls, type) and issubclass(cls, sympy.Basic):
        return cls
    return None


def _check_tscomp_class(cls) -> None:
    if not (cls.__module__ == "tscomp" or cls.__module__.startswith("tscomp.")):
        raise PlainDataError(f"cannot write an object of class {_class_name(cls)} as plain data "
                             "(only tscomp's own classes, SymPy expressions and numpy values)")


# ---------------------------------------------------------------------------- decoding
class Decoder:
    def __init__(self, table: list, blobs: BlobReader):
        self.table, self.blobs = table, blobs
        self.done: dict[int, object] = {}

    def decode(self, v):
        if isinstance(v, _SCALARS):
            return v
        if isinstance(v, list):
            return [self.decode(x) for x in v]
        if not isinstance(v, dict) or len(v) < 1:
            raise PlainDataError(f"unexpected value {v!r:.80}")
        tag = next(iter(v))
        fn = _DECODE.get(tag)
        if fn is None:
            raise PlainDataError(f"unknown tag {tag!r}")
        return fn(self, v)

    def ref(self, i: int):
        got = self.done.get(i, _MISSING)
        if got is not _MISSING:
            return got
        if not isinstance(i, int) or not 0 <= i < len(self.table):
            raise PlainDataError(f"reference {i!r} outside the object table")
        entry = self.table[i]
        if "expr" in entry:
            obj = self._expr(entry["expr"])
            self.done[i] = obj
            return obj
        cls = _tscomp_class(entry["cls"])
        if issubclass(cls, enum.Enum):
            raise PlainDataError(f"{entry['cls']} is an enum, written by name only")
        obj = cls.__new__(cls)
        self.done[i] = obj
        state = entry["state"]
        obj.__dict__.update({k: self.decode(x) for k, x in state.items()})
        return obj

    def _expr(self, e: dict):
        if "sym" in e:
            return sympy.Symbol(e["sym"], **_safe_assumptions(e["as"]))
        if "dummy" in e:
            return sympy.Dummy(e["dummy"], dummy_index=int(e["i"]), **_safe_assumptions(e["as"]))
        if "int" in e:
            return sympy.Integer(int(e["int"]))
        if "q" in e:
            return sympy.Rational(int(e["q"][0]), int(e["q"][1]))
        if "float" in e:
            return sympy.Float(str(e["float"]), precision=int(e["prec"]))
        if "bool" in e:
            return sympy.true if e["bool"] else sympy.false
        if "atom" in e:
            try:
                return _ATOMS[e["atom"]]
            except KeyError:
                raise PlainDataError(f"unknown SymPy atom {e['atom']!r}") from None
        cls = _sympy_class(str(e.get("fn")))
        if cls is None:
            raise PlainDataError(f"unknown SymPy node {e.get('fn')!r}")
        args = [self.ref(a) for a in e["args"]]
        return cls(*args)


_MISSING = object()


def _safe_assumptions(a: dict) -> dict:
    from sympy.core.assumptions import _assume_defined
    if not isinstance(a, dict) or any(k not in _assume_defined or not isinstance(v, bool) for k, v in a.items()):
        raise PlainDataError(f"bad symbol assumptions {a!r:.80}")
    return a


def _tscomp_class(name: str):
    if not isinstance(name, str) or ":" not in name:
        raise PlainDataError(f"bad class name {name!r:.80}")
    module, qual = name.split(":", 1)
    if not (module == "tscomp" or module.startswith("tscomp.")):
        raise PlainDataError(f"class {name} is outside tscomp: refused")
    try:
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise PlainDataError(f"class {name} does not exist in this tscomp (recompile the model)") from None
    if not isinstance(obj, type):
        raise PlainDataError(f"{name} is not a class")
    return obj


def _enum(d: Decoder, v):
    cls = _tscomp_class(v["e"])
    if not issubclass(cls, enum.Enum):
        raise PlainDataError(f"{v['e']} is not an enum")
    return cls[v["n"]]


def _float(d, v):
    if v["f"] not in ("nan", "inf", "-inf"):
        raise PlainDataError(f"bad float {v['f']!r}")
    return float(v["f"])


def _object_array(d: Decoder, v):
    items = [d.decode(x) for x in v["v"]]
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr.reshape(v["oa"])


_DECODE = {
    "f": _float,
    "t": lambda d, v: tuple(d.decode(x) for x in v["t"]),
    "d": lambda d, v: {k: d.decode(x) for k, x in v["d"].items()},
    "dk": lambda d, v: {d.decode(k): d.decode(x) for k, x in v["dk"]},
    "s": lambda d, v: {d.decode(x) for x in v["s"]},
    "fs": lambda d, v: frozenset(d.decode(x) for x in v["fs"]),
    "r": lambda d, v: d.ref(v["r"]),
    "oa": _object_array,
    "a": lambda d, v: d.blobs.get(v["a"]),
    "dt": lambda d, v: np.dtype(v["dt"]),
    "ns": lambda d, v: np.dtype(v["ns"]).type(d.decode(v["v"])),
    "nt": lambda d, v: np.dtype(v["nt"]).type,
    "sl": lambda d, v: slice(*(d.decode(x) for x in v["sl"])),
    "fr": lambda d, v: fractions.Fraction(int(v["fr"][0]), int(v["fr"][1])),
    "b": lambda d, v: base64.b64decode(v["b"]),
    "e": _enum,
}


def dump(root, blobs: BlobWriter, replace=None) -> dict:
    """``root`` as one JSON-able document ``{"root": ..., "objects": [...]}`` (and ``"_ids"``:
    id(object) -> its index in the table, for the caller to refer to objects; not JSON)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 200_000))
    try:
        enc = Encoder(blobs, replace)
        value = enc.encode(root)
        return {"root": value, "objects": enc.table, "_ids": enc._ids}
    finally:
        sys.setrecursionlimit(limit)


def load(doc: dict, blobs: BlobReader, decoder: Decoder | None = None):
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 200_000))
    try:
        if not isinstance(doc, dict) or not isinstance(doc.get("objects"), list):
            raise PlainDataError("not a plan document (no object table)")
        return (decoder or Decoder(doc["objects"], blobs)).decode(doc["root"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise PlainDataError(f"malformed plan document ({type(exc).__name__}: {exc})") from None
    finally:
        sys.setrecursionlimit(limit)


__all__ = ["ALIGN", "BlobReader", "BlobWriter", "PlainDataError", "dump", "load", "read_aligned"]
