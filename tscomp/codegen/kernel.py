"""The one contract every kernel object satisfies for the runtime, the artifact and the wave model.

A kernel family's *executor* step produces objects of this shape (DESIGN.md, "Kernel family");
the runtime calls ``run``/``tasks``, the wave model reads ``samples``/``t_wave`` and ``tasks``,
the artifact writer reads ``func``/``source``/``cfg``/``resources()`` and the weight fields, the
loader calls ``bind``. :class:`KernelBase` gives every field its default so no consumer probes
attributes with ``getattr`` or inspects signatures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

from tscomp.errors import TscompError


class NotNativeError(TscompError):
    """A kernel whose call cannot be written as C by the host program (the numpy fallback, a
    geometry resolved in Python, ...): the runtime runs that step from Python instead."""


@dataclass(frozen=True)
class NativeArg:
    """One argument of a kernel's C entry point, described symbolically so that the host program
    (:mod:`tscomp.runtime.host_program`) can compute it for any binding:

    - ``tensor``: pointer to the graph tensor ``name`` (C-contiguous, its graph shape and dtype);
    - ``packed``: pointer to this kernel's prepacked weight;
    - ``scratch``: pointer to ``expr`` private bytes (the arena, live during this step only);
    - ``view``: pointer to a contiguous copy of tensor ``name`` read through ``views`` (View
      expressions, outermost first: as read back from the consumer) -- a materialized transpose;
    - ``int``: the int64 value of the symbolic ``expr``;
    - ``error``: the int64[4] error record of a kernel that range-checks indices.
    """
    kind: str
    name: str | None = None
    expr: Any = None
    views: tuple = ()
    dtype: str = "float32"


def args_by_role(roles) -> tuple[NativeArg, ...]:
    """The trailing arguments of the families whose analysis lists ``(role, name, info)``: a
    ``symbol`` role passes ``info`` (its expression) as an int, any other role the tensor ``name``
    (of dtype ``info``)."""
    return tuple(NativeArg("int", expr=info) if role == "symbol" else NativeArg("tensor", name, dtype=np.dtype(info).name)
                 for role, name, info in roles)


@dataclass(frozen=True)
class NativeCall:
    """A kernel's C call: entry point ``func`` with ``args``; made only when ``guard`` (an
    expression of the symbols) is positive; ``checked``: returns nonzero after an index error."""
    func: str
    args: tuple[NativeArg, ...]
    checked: bool = False
    guard: Any = None


@runtime_checkable
class Kernel(Protocol):
    family: str                      # the family that built it ("gemm", "batched-gemm", ..., "numpy")
    target: str                      # "cpu" for native kernels, "numpy" for the fallback
    func: str | None                 # exported entry point in the artifact's library
    source: str | None               # generated C text
    cfg: Any                         # tile configuration (None: nothing to configure)
    takes_out: bool                  # run() accepts ``out=`` (arena views for its outputs)
    samples: list                    # [wave.sample_point(...)] measured at compile time
    t_wave: float | None             # single-wave time at the largest sample
    tuning: dict | None              # where its configuration came from (method, trials, record)

    def run(self, env: Mapping[str, np.ndarray], binding: Mapping[str, int]) -> dict[str, np.ndarray]: ...
    def tasks(self, binding: Mapping[str, int]) -> int: ...
    def resources(self) -> dict[str, int]: ...
    def bind(self, lib) -> None: ...
    def native_call(self) -> NativeCall: ...


class KernelBase:
    """Defaults of the :class:`Kernel` contract (class attributes; instances override)."""
    family = "?"
    target = "cpu"
    func: str | None = None
    source: str | None = None
    cfg = None
    takes_out = False
    samples: list = []
    t_wave: float | None = None
    probe: dict | None = None
    tuning: dict | None = None
    reasons: tuple = ()
    packed: np.ndarray | None = None       # prepacked constant weight (GEMM families)
    weight_name: str | None = None         # the graph constant ``packed`` replaces
    packed_key: str | None = None          # its key in weights.npz (set by the artifact writer)

    def resources(self) -> dict[str, int]:
        return {}

    def native_call(self) -> NativeCall:
        """This kernel's C call as data, for the host program; raises :class:`NotNativeError`
        when the step must run from Python."""
        raise NotNativeError(f"{self.family} kernels ({type(self).__name__}) run from Python")

    def bind(self, lib) -> None:
        """Attach the entry point from ``lib`` (a library exporting ``func``)."""
        bind = getattr(self, "_bind_function", None)
        if bind is not None and self.func is not None:
            bind(lib)


__all__ = ["Kernel", "KernelBase", "NativeArg", "NativeCall", "NotNativeError", "args_by_role"]
