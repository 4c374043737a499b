"""Running a compiled model through its host program (issue 10): one native call per request.

:class:`NativeExecutor` loads the host program (:mod:`tscomp.runtime.host_program`) and prepares,
once, everything that does not depend on the call: the pointer table's constant part (constants,
prepacked weights), the kernel entry points, the dispatch tables and the compiled output-shape
expressions. A call then validates nothing itself (the runtime has bound and checked the
inputs), fills the table's inputs and outputs, takes this thread's arena (grown, never shrunk)
and makes one ``tscomp_host_run`` call per native segment; a step that must run from Python (the
numpy fallback) runs between two segments on arena views. Python does nothing per group.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
from time import perf_counter
from typing import Mapping

import numpy as np

from tscomp.errors import ExecutionError
from tscomp.graph.reference import materialize
from tscomp.graph.symbols import compile_int_tuple
from tscomp.runtime.host_program import HostProgram
from tscomp.runtime.threads import blas_single_threaded

#: an arena is allocated in whole multiples of this (fewer regrowths as request sizes wander)
ARENA_GRANULE = 1 << 20
#: arena bytes the warm-up preallocates at most (the top of the ranges, if it fits)
WARM_ARENA_CAP = 1 << 30


def _data_address(arr: np.ndarray) -> int:
    """Where a C-contiguous array's data starts; through ctypes' buffer view (a third of
    ``arr.ctypes.data``'s cost: this runs per input and output of every request), read-only
    and empty arrays the slow way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError):
        return arr.ctypes.data


class NativeExecutor:
    """One compiled model's host program, ready to call: ``run(inputs, binding, pick)``."""

    def __init__(self, model, program: HostProgram, lib, tables: Mapping[str, object], constants: Mapping[str, np.ndarray]):
        self.model, self.program = model, program
        self.graph = model.plan.graph
        self.symbols = program.symbols
        self.library = str(lib._name)          # where the host program's code was loaded from
        self._lib = lib
        self._run = lib.tscomp_host_run
        self._run.restype = ctypes.c_int
        self._run.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self._arena_bytes = lib.tscomp_host_arena_bytes
        self._arena_bytes.restype = ctypes.c_int64
        self._arena_bytes.argtypes = [ctypes.c_void_p]
        self._keep = []
        self._base = np.zeros(len(program.slots), np.uintp)
        self._inputs, self._outputs = [], []
        for k, slot in enumerate(program.slots):
            if slot.kind == "const":
                arr = np.ascontiguousarray(constants[slot.name] if slot.name in constants
                                           else self.graph.values[slot.name].const)
                self._keep.append(arr)
                self._base[k] = _data_address(arr)
            elif slot.kind == "packed":
                packed = model.kernels[slot.group][slot.variant].packed
                self._base[k] = _data_address(packed)
            elif slot.kind == "input":
                self._inputs.append((slot.name, k))
            elif slot.kind == "output":
                self._outputs.append((slot.name, k))
        self._fn = (ctypes.c_void_p * max(1, len(program.functions)))(
            *[ctypes.cast(model.kernels[g][v].fn, ctypes.c_void_p).value for g, v in program.functions])
        self._tables, self._picks, self._dynamic = self._dispatch(tables)
        self._shapes: dict[str, tuple] = {}
        self._out_shapes = {name: self._shape_fn(name) for name in self.graph.outputs}
        self._numpy = any(self.model.kernels[s.group][0].target == "numpy" for s in program.steps if not s.native)
        self._one_segment = [tuple(o) for o in program.order] == [("native", 0)]
        self._local = threading.local()
        self.last_kernel_seconds = 0.0
        self._computed_outputs = [n for n in self.graph.outputs if n in self.graph.inputs
                                  or self.graph.values[n].known_at_compile_time]

    def _dispatch(self, tables):
        """Per group: its table (uint8 over its key extents, the host program indexes it) or a
        fixed pick; groups with several variants and no usable table are picked per call by the
        runtime (``_dynamic``: its memoized wave model)."""
        ptrs = (ctypes.c_void_p * max(1, len(self.program.groups)))()    # NULL: no table
        picks = np.zeros(max(1, len(self.program.groups)), np.int32)
        dynamic = []
        for g, name in enumerate(self.program.groups):
            variants = len(self.model.kernels[name])
            table = tables.get(name)
            usable = (table is not None and self.program.keys.get(name) == table.key
                      and table.choice.flags.c_contiguous and table.choice.dtype == np.uint8)
            if variants == 1:
                picks[g] = 0
            elif usable:
                self._keep.append(table.choice)
                ptrs[g] = _data_address(table.choice)
                picks[g] = -1
            else:
                dynamic.append((g, name))
        return ptrs, picks, dynamic

    @property
    def native_steps(self) -> int:
        return sum(s.native for s in self.program.steps)

    # ------------------------------------------------------------ for the C request path
    @property
    def single_native_call(self) -> bool:
        """The whole Plan is one host-program call (no Python step between segments)."""
        return self._one_segment

    @property
    def picked_per_call(self) -> list[str]:
        """Groups whose variant the runtime picks per call (several variants, no usable table)."""
        return [name for _, name in self._dynamic]

    @property
    def computed_outputs(self) -> list[str]:
        """Graph outputs no step writes (inputs, constants, shapes), made per call in Python."""
        return list(self._computed_outputs)

    def run_address(self) -> int:
        return ctypes.cast(self._run, ctypes.c_void_p).value

    def relations_address(self, expected: int) -> int:
        """Where ``tscomp_host_relations`` is; raises unless it checks the ``expected`` relations."""
        count = ctypes.c_int.in_dll(self._lib, "tscomp_host_relations_count").value
        if count != expected:
            raise ExecutionError(f"the host program checks {count} of the model's {expected} relations between "
                                 f"symbols (-1: one it cannot print)")
        return ctypes.cast(self._lib.tscomp_host_relations, ctypes.c_void_p).value

    @property
    def output_slots(self) -> list[tuple[str, int, int]]:
        """(name, pointer-table slot, index among the graph's outputs) of each output a step writes."""
        order = {name: k for k, name in enumerate(self.graph.outputs)}
        return [(name, slot, order[name]) for name, slot in self._outputs]

    def output_dims_address(self) -> int:
        """Where ``tscomp_host_output_dims`` is; raises if an output's shape is not printed there."""
        fn = self._lib.tscomp_host_output_dims
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        lowest = {i.name: i.min for i in self.graph.symbols.live_symbols()}
        sym = np.array([lowest[s] for s in self.symbols] or [0], np.int64)
        for name, _, k in self.output_slots:
            dims = np.zeros(max(1, len(self.graph.values[name].shape)), np.int64)
            if fn(k, _data_address(sym), _data_address(dims)) < 0:
                raise ExecutionError(f"the host program does not give output {name}'s shape")
        return ctypes.cast(fn, ctypes.c_void_p).value

    # ------------------------------------------------------------ per-thread call state
    def call_state(self) -> "_CallState":
        """This thread's call buffers (made on its first call)."""
        state = getattr(self._local, "state", None)
        if state is None:
            state = self._local.state = _CallState(self)
        return state

    def arena_bytes(self, binding: Mapping[str, int]) -> int:
        sym = np.array([binding[s] for s in self.symbols] or [0], np.int64)
        return int(self._arena_bytes(_data_address(sym)))

    def reserve(self, binding: Mapping[str, int]) -> None:
        """Give this thread an arena for ``binding`` (the top of the ranges at warm-up), touched
        now so that no request pays its page faults."""
        need = self.arena_bytes(binding)
        if need <= WARM_ARENA_CAP:
            self.call_state().grow(need).fill(0)

    # ------------------------------------------------------------ call
    def run(self, inputs: Mapping[str, np.ndarray], binding: Mapping[str, int], pick,
            times: list | None = None) -> dict[str, np.ndarray]:
        """The model's outputs; ``pick(group, binding)`` is the variant of a group the host
        program cannot choose itself (no dispatch table, or a step run from Python). With a list
        ``times``, each step's seconds are appended as ``(plan index, seconds)``: the host program
        stamps every native step's end (``profile()``), Python times the steps it runs."""
        st = self.call_state()
        if times is None:
            return self._call(st, inputs, binding, pick, None, None)
        trace = np.zeros(len(self.program.steps) + 1, np.float64)
        st.struct.trace = trace.ctypes.data
        try:
            return self._call(st, inputs, binding, pick, trace, times)
        finally:
            st.struct.trace = None

    def _call(self, st, inputs, binding, pick, trace, times) -> dict[str, np.ndarray]:
        sym, t = st.sym, st.t
        for k, name in enumerate(self.symbols):
            sym[k] = binding[name]
        keep = []
        for name, k in self._inputs:
            arr = np.ascontiguousarray(inputs[name])
            keep.append(arr)
            t[k] = _data_address(arr)
        outputs = {}
        for name, k in self._outputs:
            shape_of, dtype = self._out_shapes[name]
            arr = outputs[name] = np.empty(shape_of(binding), dtype)
            t[k] = _data_address(arr)
        for g, name in self._dynamic:
            st.picks[g] = self.model.kernels[name].index(pick(name, binding))
        if self._one_segment:     # the whole Plan in one host-program call: nothing to interleave
            t0 = perf_counter()
            self._native_segment(0, st, binding, trace, times)
            native = perf_counter() - t0
        else:
            native = self._segments(st, inputs, outputs, binding, pick, keep, trace, times)
        self.last_kernel_seconds = native   # the kernels' share of the call (for the overhead report)
        for name in self._computed_outputs:      # outputs no step writes: inputs, constants, shapes
            if name in self.graph.inputs:
                outputs[name] = np.array(inputs[name], copy=True)
            else:
                outputs[name] = np.array(materialize(self.graph, self.graph.values[name], binding), copy=True)
        return outputs

    def _segments(self, st, inputs, outputs, binding, pick, keep, trace, times) -> float:
        """Native segments and the Python steps between them, in Plan order: their seconds."""
        produced: dict[str, np.ndarray] = {}      # outputs of Python steps that live outside the arena
        native = 0.0
        with blas_single_threaded if self._numpy else contextlib.nullcontext():
            for kind, i in self.program.order:
                t0 = perf_counter()
                if kind == "native":
                    self._native_segment(i, st, binding, trace, times)
                else:
                    self._python_step(i, st.t, st.arena, inputs, outputs, binding, keep, produced, pick)
                    if times is not None:
                        times.append((i, perf_counter() - t0))
                native += perf_counter() - t0
        return native

    def _native_segment(self, i: int, st, binding, trace, times) -> None:
        rc = self._run(i, st.address)
        if rc == -1:                    # the arena is too small for this call: grow, again
            st.grow(int(st.err[5]))
            rc = self._run(i, st.address)
        if rc:
            raise self._index_error(rc - 1, st, binding)
        if trace is not None:
            times += self._segment_times(i, trace)

    def _segment_times(self, segment: int, trace: np.ndarray) -> list[tuple[int, float]]:
        """(plan index, seconds) of a native segment's steps, from the host program's stamps."""
        out, before = [], trace[-1]
        for s in self.program.steps:
            if s.native and s.segment == segment:
                out.append((s.index, float(trace[s.index] - before)))
                before = trace[s.index]
        return out

    def _index_error(self, step: int, st: "_CallState", binding):
        err = st.err.copy()
        st.err[:] = 0                      # the kernels record only into a clear record
        group = self.program.steps[step].group
        kernel = self.model.kernels[group][int(err[4])]
        try:
            sizes = kernel._sizes_at({}, binding)
        except Exception:      # noqa: BLE001 - the record is still worth reporting without a shape
            sizes = ()
        return kernel.index_error(err[:4], sizes)

    def _shape_fn(self, name: str) -> tuple:
        """(one compiled function of a binding giving a graph tensor's shape, dtype), made once: an
        output's is evaluated on every request."""
        got = self._shapes.get(name)
        if got is None:
            v = self.graph.values[name]
            got = self._shapes[name] = (compile_int_tuple([self.graph.symbols.canon(d) for d in v.shape]),
                                        np.dtype(v.dtype))
        return got

    # ------------------------------------------------------------ Python steps
    def _view(self, name: str, t, arena: np.ndarray, binding) -> np.ndarray:
        shape_of, dtype = self._shape_fn(name)
        shape = shape_of(binding)
        off = int(t[self.program.slot_of[name]]) - _data_address(arena)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not 0 <= off <= arena.nbytes - n:     # a pointer a Python step replaced (not in the arena)
            raise ExecutionError(f"tensor {name} is not in the arena")
        return arena[off:off + n].view(dtype).reshape(shape)

    def _tensor(self, name, t, arena, inputs, outputs, binding, produced):
        if name in produced:
            return produced[name]
        if name in outputs:
            return outputs[name]
        if name in inputs:
            return np.asarray(inputs[name])
        v = self.graph.values[name]
        if v.const is not None:
            return v.const
        return self._view(name, t, arena, binding)

    def _python_step(self, index: int, t, arena, inputs, outputs, binding, keep, produced, pick) -> None:
        group = self.model.plan.groups[index]
        variants = self.model.kernels[group.name]
        kernel = variants[0] if len(variants) == 1 else pick(group.name, binding)
        env = {n: self._tensor(n, t, arena, inputs, outputs, binding, produced) for n in group.inputs}
        slot_of = self.program.slot_of
        if kernel.takes_out:
            out = {n: outputs[n] if n in outputs else self._view(n, t, arena, binding) for n in group.outputs}
            kernel.run(env, binding, out)
            return
        got = kernel.run(env, binding)
        for n, arr in got.items():
            if n in outputs:
                np.copyto(outputs[n], arr)
            elif n in slot_of:
                arr = np.ascontiguousarray(arr, dtype=self.graph.values[n].dtype)
                keep.append(arr)
                t[slot_of[n]] = _data_address(arr)
                produced[n] = arr


class CallStruct(ctypes.Structure):
    """The host program's ``ts_call`` (:data:`tscomp.runtime.host_program.CALL_STRUCT`)."""
    _fields_ = [("sym", ctypes.c_void_p), ("t", ctypes.c_void_p), ("arena", ctypes.c_void_p),
                ("arena_bytes", ctypes.c_int64), ("fn", ctypes.c_void_p), ("tables", ctypes.c_void_p),
                ("picks", ctypes.c_void_p), ("err", ctypes.c_void_p), ("trace", ctypes.c_void_p)]


class _CallState:
    """One thread's call buffers, reused by every call on that thread (their addresses are in the
    call struct once): the symbol values, the pointer table (its constant entries filled once; the
    host program re-places the arena entries every call), the variant picks, the error record and
    the arena, grown when a call needs more and never shrunk."""

    def __init__(self, ex: NativeExecutor):
        self.sym = np.zeros(max(1, len(ex.symbols)), np.int64)
        self.t = ex._base.copy()
        self.picks = ex._picks.copy()
        self.err = np.zeros(8, np.int64)
        self.arena = np.zeros(0, np.uint8)
        self.struct = CallStruct(self.sym.ctypes.data, self.t.ctypes.data, 0, 0,
                                 ctypes.cast(ex._fn, ctypes.c_void_p).value,
                                 ctypes.cast(ex._tables, ctypes.c_void_p).value,
                                 self.picks.ctypes.data, self.err.ctypes.data, None)
        self.address = ctypes.addressof(self.struct)

    def grow(self, nbytes: int) -> np.ndarray:
        if self.arena.nbytes < nbytes:
            size = -(-max(nbytes, 1) // ARENA_GRANULE) * ARENA_GRANULE
            raw = np.empty(size + 64, np.uint8)
            self.arena = raw[(-raw.ctypes.data) % 64:][:size]
            self.struct.arena, self.struct.arena_bytes = self.arena.ctypes.data, size
        return self.arena


__all__ = ["CallStruct", "NativeExecutor"]
