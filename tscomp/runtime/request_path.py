"""The request path in C (issue 10, acceptance 3: per-call overhead <= 20 us on tiny BERT).

With the host program (:mod:`tscomp.runtime.host_program`) a request is one native call, and what
is left in front of it is Python: binding the symbols from the inputs' shapes, checking the ranges,
allocating the outputs, filling the pointer table, setting the thread count and placing the
OpenMP workers. That is a few microseconds in a tight loop, but a served request runs it right
after the previous request's kernels have swept the caches, and then it costs 20-30 us (tiny BERT
on an AVX2 Zen 3: bind 5-12, placement 3-11, inputs 6-15, outputs 3-7 us).

:class:`RequestPath` does all of it in one C function (``request_path.c``, a CPython extension
built on the serving machine against this interpreter's and numpy's headers, cached like the
kernels). It decides nothing the Python path does not: every check is the Python path's, and any
request it does not handle -- a wrong dtype, an out-of-range length, an arena to grow, an index
error -- is handed back (``None``) for the Python path to serve or to refuse with its specific
error (a relation between the symbols that fails, checked by the host program's
``tscomp_host_relations``, included). A model the C path cannot describe (a step run from Python,
an axis that must equal a non-affine expression of the symbols, a relation the host program cannot
print, an output shape it cannot print, a dtype numpy has no built-in type for) keeps the Python
path; :func:`request_path_for` says why. An axis that equals an affine expression of symbols other
axes bind (a derived dim, ``total = past + sequence``) is checked in C once they are bound.
"""
from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import numpy as np
import sympy

from tscomp.codegen.build import build_library, use_threads_address
from tscomp.runtime.host_program import CALL_STRUCT
from tscomp.runtime.threads import team_enter_address

MODULE = "tscomp_request_path"


class RequestPathUnavailable(Exception):
    """Why a model's requests take the Python path."""


@functools.lru_cache(maxsize=1)
def _extension():
    """The compiled extension module (built once per interpreter, numpy and source version)."""
    import sysconfig

    source = (f"/* built for Python {sys.version.split()[0]}, numpy {np.__version__} */\n"
              "#include <stdint.h>\n" + CALL_STRUCT + (Path(__file__).with_suffix(".c")).read_text())
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RequestPathUnavailable(f"no Python.h in {include} (install the Python development headers)")
    path = build_library(source, MODULE, extra_flags=(f"-I{include}", f"-I{np.get_include()}"))
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
    spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _affine_code(d, index: dict, where: str) -> tuple:
    """An axis that must equal an expression of symbols (a derived dim: ``past + sequence``) as
    ``(c0, (symbol index, coefficient), ...)``, which the C path checks once every symbol is
    bound; only integer affine expressions (anything else keeps the Python path)."""
    syms = sorted(d.free_symbols, key=lambda x: x.name)
    if not syms or any(x.name not in index for x in syms):
        raise RequestPathUnavailable(f"{where} must equal {d}, over symbols the host program does not read")
    try:
        poly = sympy.Poly(d, *syms)
    except sympy.PolynomialError:
        raise RequestPathUnavailable(f"{where} must equal {d}, which is not a polynomial") from None
    coeffs = [poly.coeff_monomial(x) for x in syms]
    c0 = poly.coeff_monomial(1)
    if poly.total_degree() > 1 or not all(c.is_Integer for c in [c0, *coeffs]):
        raise RequestPathUnavailable(f"{where} must equal {d}, not an integer affine expression")
    return (int(c0), *((index[x.name], int(c)) for x, c in zip(syms, coeffs)))


def _builtin_type(dtype, what: str) -> int:
    num = np.dtype(dtype).num
    if num >= 256:        # NPY_USERDEF and above: bfloat16 and other extension types
        raise RequestPathUnavailable(f"{what} is {np.dtype(dtype)}, not a numpy built-in type")
    return num


class RequestPath:
    """One model's requests in C: ``path(inputs)`` is the outputs dict, or None when the Python
    path must serve this request."""

    def __init__(self, executor, graph, ranges: dict, relations, threads: int):
        ext = _extension()
        symbols = list(executor.symbols)
        index = {name: k for k, name in enumerate(symbols)}
        slot_of = executor.program.slot_of
        inputs = []
        for name in graph.inputs:
            v = graph.values[name]
            codes = []
            for axis, d in enumerate(v.shape):
                if isinstance(d, sympy.Symbol):
                    if d.name not in index:
                        raise RequestPathUnavailable(f"input {name} axis {axis} binds {d.name}, which the host "
                                                     f"program does not read")
                    codes.append(index[d.name])
                elif isinstance(d, (int, sympy.Integer)):
                    codes.append(-1 - int(d))
                else:
                    codes.append(_affine_code(d, index, f"input {name} axis {axis}"))
            if name not in slot_of:
                raise RequestPathUnavailable(f"input {name} has no pointer-table slot")
            inputs.append((name, _builtin_type(v.dtype, f"input {name}"), slot_of[name], tuple(codes)))
        bound = {c for *_, codes in inputs for c in codes if isinstance(c, int) and c >= 0}
        if bound != set(range(len(symbols))):
            missing = [symbols[k] for k in range(len(symbols)) if k not in bound]
            raise RequestPathUnavailable(f"no input axis binds {', '.join(missing)}")
        outputs = [(name, _builtin_type(graph.values[name].dtype, f"output {name}"), slot, k)
                   for name, slot, k in executor.output_slots]
        lo = [int(ranges[s][0]) for s in symbols]
        hi = [int(ranges[s][1]) for s in symbols]
        dims = executor.output_dims_address()
        checks = executor.relations_address(len(relations)) if relations else 0
        self._model = ext.model(inputs, outputs, lo, hi, int(threads), executor.run_address(), dims,
                                use_threads_address(), team_enter_address(), checks)
        self._run, self._set_solo = ext.run, ext.set_solo
        self._executor = executor
        self.last_threads = 0           # the OpenMP thread count of the last request served (err[7])

    def __call__(self, inputs):
        st = self._executor.call_state()
        out = self._run(self._model, inputs, st.address)
        if out is not None:
            self._executor.last_kernel_seconds = int(st.err[6]) * 1e-9
            self.last_threads = int(st.err[7])
        return out

    def set_solo(self, window_ns: int, max_elements: int, wake_ns: int = 0, loss: float = 0.0) -> None:
        """Requests of at most ``max_elements`` input elements (-1: none) run on one thread while
        the calling thread's team last ran more than ``window_ns`` ago, back to back until ``loss``
        times their time adds up to ``wake_ns`` (:mod:`tscomp.runtime.solo_calls`)."""
        self._set_solo(self._model, int(window_ns), int(max_elements), int(wake_ns), float(loss))


def request_path_for(executor, graph, ranges: dict, relations, threads: int) -> tuple[RequestPath | None, str]:
    """The C request path of a native executor, or None and why the Python path serves instead."""
    reasons = []
    if executor is None:
        reasons.append("no host program")
    else:
        if not executor.single_native_call:
            reasons.append("a step runs from Python between native segments")
        if executor.picked_per_call:
            reasons.append("a group's variant is picked per call (no dispatch table)")
        if executor.computed_outputs:
            reasons.append("an output no step writes")
    if reasons:
        return None, "; ".join(reasons)
    try:
        return RequestPath(executor, graph, ranges, relations, threads), "native (C)"
    except RequestPathUnavailable as exc:
        return None, str(exc)
    except Exception as exc:     # noqa: BLE001 - no compiler headers, a build failure: the Python path serves
        return None, f"{type(exc).__name__}: {exc}"


__all__ = ["RequestPath", "RequestPathUnavailable", "request_path_for"]
