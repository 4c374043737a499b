"""A generic discrete search space: ordinal axes, hard constraints, a hardware-aligned initial
population, and projection of continuous points onto the nearest valid configuration.

This is the tuner's view of TSCompiler §5.1's loop-based model: a family's space (e.g. the GEMM
tiles of ``gemm_space.py``) is a handful of ordinal axes (tile sizes per level) whose product is
pruned by *hard* constraints (register file, cache or shared-memory capacity, threads per block);
*soft* constraints shape the axes themselves (only multiples of the vector width, of the mma
instruction shape) and the initial population (Roller-style hardware-aligned candidates).

The Bayesian search works in the unit cube: :meth:`DiscreteSpace.encode` maps each axis value to
its index scaled to [0, 1], and §5.1's "post-iteration projection" is :meth:`DiscreteSpace.project`,
the nearest *valid* point in that metric. Spaces are small (at most a few ten thousand valid
points), so the valid points are enumerated once and projection is an exact nearest-neighbour
search over them with numpy.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

#: refuse to enumerate a raw product larger than this (a family's axes are too fine)
MAX_PRODUCT = 5_000_000


@dataclass(frozen=True)
class Axis:
    """One ordinal tuning knob: its name and its candidate values, in order."""
    name: str
    values: tuple[int, ...]

    def __post_init__(self):
        values = tuple(int(v) for v in self.values)
        if not values:
            raise ValueError(f"axis {self.name!r} has no values")
        if len(set(values)) != len(values):
            raise ValueError(f"axis {self.name!r} repeats a value: {values}")
        object.__setattr__(self, "values", values)

    def coordinate(self, value: int) -> float:
        """The value's place on the unit interval (index / (len - 1); 0.5 for a 1-value axis)."""
        n = len(self.values)
        return 0.5 if n == 1 else self.values.index(value) / (n - 1)


@dataclass(frozen=True)
class Constraint:
    """A hard constraint: ``holds(point)`` False makes the point invalid; ``why`` says what it
    protects (it is what :meth:`DiscreteSpace.violations` reports)."""
    name: str
    holds: Callable[[Mapping[str, int]], bool]
    why: str


class DiscreteSpace:
    """Valid configurations of a family on a target: the product of ``axes`` minus the points
    some constraint rejects. Points are plain dicts ``{axis name: int}``."""

    def __init__(self, axes: Sequence[Axis], constraints: Sequence[Constraint] = (),
                 initial: Sequence[Mapping[str, int]] = (), name: str = ""):
        if not axes:
            raise ValueError("a search space needs at least one axis")
        names = [a.name for a in axes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate axis names: {names}")
        self.axes: tuple[Axis, ...] = tuple(axes)
        self.constraints: tuple[Constraint, ...] = tuple(constraints)
        self.name = name
        self._given_initial = [dict(p) for p in initial]
        self._points: list[dict[str, int]] | None = None
        self._encoded: np.ndarray | None = None
        self._index: dict[tuple, int] | None = None

    # -- points ------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return len(self.axes)

    def key(self, point: Mapping[str, int]) -> tuple:
        """Hashable form of a point, in axis order."""
        return tuple(int(point[a.name]) for a in self.axes)

    def violations(self, point: Mapping[str, int]) -> list[str]:
        """Why ``point`` is invalid: values off their axis, then each failed constraint's text."""
        off_axis = []
        for axis in self.axes:
            if axis.name not in point:
                off_axis.append(f"axis {axis.name} has no value")
            elif int(point[axis.name]) not in axis.values:
                off_axis.append(f"{axis.name}={point[axis.name]} is not one of {list(axis.values)}")
        if off_axis:  # constraints may index any axis: do not call them on a malformed point
            return off_axis
        return [c.why for c in self.constraints if not c.holds(point)]

    def is_valid(self, point: Mapping[str, int]) -> bool:
        return not self.violations(point)

    # -- the unit cube -----------------------------------------------------------------------

    def encode(self, point: Mapping[str, int]) -> np.ndarray:
        """Point -> [0, 1]^d (each axis: value index / (len - 1), 0.5 on a 1-value axis)."""
        return np.array([a.coordinate(int(point[a.name])) for a in self.axes], dtype=float)

    def decode(self, x: Sequence[float]) -> dict[str, int]:
        """Nearest axis value per coordinate; the result may violate a constraint."""
        x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
        out = {}
        for axis, xi in zip(self.axes, x):
            n = len(axis.values)
            out[axis.name] = axis.values[0 if n == 1 else int(round(xi * (n - 1)))]
        return out

    def project(self, x: Sequence[float]) -> dict[str, int] | None:
        """The valid point nearest to ``x`` (Euclidean in the encoded cube; ties: enumeration
        order), or None when the space has no valid point. TSCompiler §5.1's projection."""
        if len(self) == 0:
            return None
        return self.point_at(int(self.project_indices(np.atleast_2d(x))[0]))

    def project_indices(self, xs: np.ndarray) -> np.ndarray:
        """Indices (into :meth:`enumerate`) of the valid points nearest to each row of ``xs``."""
        enc = self.encoded()
        if len(enc) == 0:
            raise ValueError(f"search space {self.name!r} has no valid point")
        xs = np.asarray(xs, dtype=float).reshape(-1, self.dim)
        sq = (enc * enc).sum(1)
        out = np.empty(len(xs), dtype=np.int64)
        for start in range(0, len(xs), 256):  # chunks bound the distance matrix's memory
            chunk = xs[start:start + 256]
            d2 = sq[None, :] - 2.0 * chunk @ enc.T + (chunk * chunk).sum(1)[:, None]
            out[start:start + 256] = np.argmin(d2, axis=1)
        return out

    # -- the valid set -----------------------------------------------------------------------

    def enumerate(self) -> list[dict[str, int]]:
        """Every valid point, in axis-product order (cached; do not mutate the dicts)."""
        if self._points is None:
            self._build()
        return self._points

    def encoded(self) -> np.ndarray:
        """Encodings of :meth:`enumerate`'s points, one row each (cached)."""
        if self._encoded is None:
            self._build()
        return self._encoded

    def index(self, point: Mapping[str, int]) -> int | None:
        """Position of a valid point in :meth:`enumerate`, None when invalid."""
        if self._index is None:
            self._build()
        try:
            return self._index.get(self.key(point))
        except (KeyError, TypeError, ValueError):
            return None

    def point_at(self, i: int) -> dict[str, int]:
        """A fresh copy of the ``i``-th valid point."""
        return dict(self.enumerate()[i])

    def _build(self) -> None:
        size = int(np.prod([len(a.values) for a in self.axes], dtype=np.float64))
        if size > MAX_PRODUCT:
            raise ValueError(f"search space {self.name!r}: {size} raw points is too many to enumerate")
        names = [a.name for a in self.axes]
        points = []
        for combo in itertools.product(*(a.values for a in self.axes)):
            point = dict(zip(names, combo))
            if all(c.holds(point) for c in self.constraints):
                points.append(point)
        self._points = points
        self._index = {self.key(p): i for i, p in enumerate(points)}
        self._encoded = (np.array([self.encode(p) for p in points], dtype=float) if points
                         else np.zeros((0, self.dim)))

    def __len__(self) -> int:
        return len(self.enumerate())

    def __iter__(self) -> Iterable[dict[str, int]]:
        return iter(self.enumerate())

    # -- populations -------------------------------------------------------------------------

    def initial(self) -> list[dict[str, int]]:
        """The hardware-aligned initial population it was given, invalid points dropped,
        duplicates removed, order kept."""
        seen, out = set(), []
        for point in self._given_initial:
            if not self.is_valid(point):
                continue
            k = self.key(point)
            if k not in seen:
                seen.add(k)
                out.append({a.name: int(point[a.name]) for a in self.axes})
        return out

    def sample(self, rng: np.random.Generator | int | None, n: int) -> list[dict[str, int]]:
        """``n`` distinct valid points drawn uniformly (all of them, shuffled, if fewer)."""
        rng = np.random.default_rng(rng)
        n = min(int(n), len(self))
        return [self.point_at(int(i)) for i in rng.choice(len(self), size=n, replace=False)]

    def __repr__(self) -> str:
        axes = ", ".join(f"{a.name}:{len(a.values)}" for a in self.axes)
        return f"DiscreteSpace({self.name!r}, axes=[{axes}], constraints={len(self.constraints)})"


__all__ = ["Axis", "Constraint", "DiscreteSpace"]
