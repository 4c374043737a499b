"""The runtime: execute a compiled model at any shape in its declared ranges, with no compilation
on the request path (TSCompiler §6, the runtime half of Fig. 2).

Per call: validate the inputs and bind the shape symbols, then make one native call: the model's
host program (:mod:`tscomp.runtime.host_program`, run by :mod:`tscomp.runtime.native_executor`)
places the intermediates by the symbolic buffer plan, picks each group's variant from the dispatch
tables made at load (:mod:`tscomp.runtime.dispatch`) and calls the kernels in Plan order. Nothing
is planned per shape, so a never-seen shape costs what a seen one does.

``executor="python"`` (and ``profile()``) keeps the per-group path: once per concrete shape
(cached), pick one kernel variant per group (the same tables; else :mod:`tscomp.runtime.wave`),
evaluate the symbolic buffer plan (:mod:`tscomp.runtime.symbolic_buffers`) and every symbolic size;
then call the groups one by one from Python.

Out-of-range shapes are refused unless the caller opts in (``allow_out_of_range=True``). The
compiled kernels and every shape simplification were derived under the declared ranges, so an
out-of-range call is answered by re-importing the source ONNX model (the artifact's copy when
compiled with ``embed_source``, else the file the manifest names) with ranges
widened to that shape and running tscomp's reference executor: correct, slow, and said so with
a warning.
"""
from __future__ import annotations

import collections
import contextlib
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from tscomp.codegen.build import host_isa, set_num_threads
from tscomp.compiler import CompiledModel, default_threads
from tscomp.errors import ExecutionError, ShapeError, TscompError
from tscomp.graph.reference import materialize
from tscomp.runtime.artifact import ArtifactError, load_artifact
from tscomp.graph.symbols import numel
from tscomp.runtime.binding import InputBinder, checkable_relations
from tscomp.runtime.buffers import BufferPlan, MemoryPool
from tscomp.runtime.dispatch import build_tables
from tscomp.runtime.symbolic_buffers import SymbolicBufferPlan, SymbolicLifetime, plan_buffers_symbolic
from tscomp.runtime.request_path import request_path_for
from tscomp.runtime.solo_calls import SoloPolicy, calibrate
from tscomp.runtime.threads import blas_single_threaded, team_placement
from tscomp.runtime.wave import pick_variant

ISA_RANK = {"scalar": 0, "avx2": 1, "avx512": 2}

#: how many concrete shapes keep their decisions and arena
SHAPE_CACHE_SIZE = 16
#: how many (group, binding) wave-model picks are memoized for groups without a dispatch table
PICK_MEMO_SIZE = 1 << 16


@dataclass
class Step:
    group: str
    kernel: object
    takes_out: bool
    free_after: tuple[str, ...]      # tensors no later step reads
    outputs: tuple[str, ...] = ()    # its outputs that live in the arena (when it takes ``out``)


@dataclass
class ShapePlan:
    """Every decision that depends on the concrete shape, made once per shape. The arena is not
    part of it: each call takes one from the shape's pool (a fresh one when all are in use), so
    concurrent calls at one shape never share intermediates."""
    binding: dict[str, int]
    steps: list[Step]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    buffers: BufferPlan
    shape_consts: dict[str, np.ndarray]   # shape-valued constants at this binding
    free_arenas: list = None              # arenas not in use: (raw buffer, per-step out dicts)

    @property
    def has_numpy(self) -> bool:
        return any(s.kernel.target == "numpy" for s in self.steps)

    def new_arena(self, pool: MemoryPool) -> tuple:
        """An arena (a raw buffer from ``pool``) and, per step, the views its outputs are written into."""
        raw = pool.take(self.buffers.arena_bytes)
        views = []
        for step in self.steps:
            views.append({name: self._view(raw, name) for name in step.outputs} if step.takes_out else None)
        return raw, views

    def _view(self, arena, name: str) -> np.ndarray:
        shape, dtype = self.shapes[name], self.dtypes[name]
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        off = self.buffers.offsets[name]
        return arena[off:off + n].view(dtype).reshape(shape)


class Runtime:
    """``Runtime(path, device="cpu", num_threads=None, allow_out_of_range=False)``; ``run(inputs)``
    maps input names to numpy arrays and returns the model's outputs by name. Loading verifies the
    artifact's hashes and (``warmup=True``) runs every kernel variant once at the smallest shape.
    ``expected_digest`` (the manifest's ``digest``, printed by ``tscomp compile``) pins the exact
    artifact: any other is refused before anything but its manifest is read. After the warm-up,
    ``solo_calls=True`` measures which short requests run on the calling thread alone when they
    arrive after the OpenMP workers fell asleep (``solo_policy``; :mod:`tscomp.runtime.solo_calls`)."""

    def __init__(self, path, device: str = "cpu", num_threads: int | None = None, *,
                 allow_out_of_range: bool = False, verify: bool = True, warmup: bool = True,
                 expected_digest: str | None = None, executor: str = "native", solo_calls: bool = True):
        if device in ("opencl", "cuda"):    # a CUDA-target artifact on a SIMT device (issue 9)
            from tscomp.runtime.simt_artifact import is_cuda_artifact, load_cuda_artifact
            if not is_cuda_artifact(path):
                raise TscompError(f"device {device!r} is not available for {path}: a cpu-target artifact "
                                  f"(compile with --target cuda to run on {device})")
            self._simt = load_cuda_artifact(path, device)
            self.path, self.manifest, self.plan = self._simt.path, self._simt.manifest, self._simt.plan
            self.graph, self.run = self.plan.graph, self._simt.run
            return
        if device != "cpu":
            raise TscompError(f"unknown device {device!r}: 'cpu', or 'opencl' / 'cuda' for a --target cuda artifact")
        self.path = Path(path)
        model, self.manifest = load_artifact(self.path, verify=verify, expected_digest=expected_digest)
        self._init(model, num_threads, allow_out_of_range, executor)
        if warmup:
            self.warm_up()
            if solo_calls:
                self.calibrate_solo_calls()

    @classmethod
    def from_compiled(cls, model: CompiledModel, num_threads: int | None = None, *,
                      allow_out_of_range: bool = False, executor: str = "native") -> "Runtime":
        """A runtime over an in-memory compiled model (no artifact on disk)."""
        self = cls.__new__(cls)
        self.path, self.manifest = None, {}
        self._init(model, num_threads, allow_out_of_range, executor)
        return self

    def _init(self, model: CompiledModel, num_threads, allow_out_of_range, executor: str = "native") -> None:
        if ISA_RANK.get(model.isa, 99) > ISA_RANK[host_isa()]:
            raise ArtifactError(f"artifact was compiled for {model.isa} but this CPU supports only {host_isa()}")
        self.model = model
        self.plan = model.plan
        self.graph = model.plan.graph
        self.num_threads = num_threads or default_threads()
        self.target = model.target.with_threads(self.num_threads)
        self.allow_out_of_range = allow_out_of_range
        self._lock = threading.Lock()
        self._binder = InputBinder(self.graph)
        self._ranges = {i.name: (i.min, i.max) for i in self.graph.symbols.infos.values()}
        self._relations = checkable_relations(self.graph)
        self._related: set[tuple] = set()         # bindings whose relations held (checked once each)
        self._shapes: collections.OrderedDict[tuple, ShapePlan] = collections.OrderedDict()
        self._consts = self._static_constants()
        self._shape_only = self._shape_only_groups()
        self._order = self._lifetimes_by_index()
        self._buffer_plan = self._symbolic_buffer_plan()
        self._dispatch = build_tables(model.kernels, self.graph.symbols, self.target)
        self._picked: dict[tuple, object] = {}
        self._pool = MemoryPool()
        self.last_call_overhead = None
        if executor not in ("native", "python"):
            raise TscompError(f"unknown executor {executor!r}: 'native' (the host program) or 'python' (per group)")
        self.executor_note = ""
        self._native = self._native_executor() if executor == "native" else None
        # the request path in C where the model allows it (else None: run() binds in Python)
        self._request, self.request_path_note = request_path_for(self._native, self.graph, self._ranges,
                                                                 self._relations, self.num_threads)
        self.solo_policy = SoloPolicy(reason="not calibrated (warmup=False, solo_calls=False or from_compiled: "
                                             "calibrate_solo_calls() measures it)")

    def _native_executor(self):
        """The host program's executor (:mod:`tscomp.runtime.native_executor`), or None with
        ``executor_note`` saying why the per-group Python path serves instead."""
        from tscomp.runtime.host_library import host_library
        from tscomp.runtime.host_program import program_for
        from tscomp.runtime.native_executor import NativeExecutor

        try:
            program = program_for(self.model)
            lib = host_library(program, self.path, self.manifest)
            native = NativeExecutor(self.model, program, lib, self._dispatch, self._consts)
        except Exception as exc:    # noqa: BLE001 - any failure here leaves the (correct) per-group path
            self.executor_note = f"native executor unavailable ({type(exc).__name__}: {exc}); groups run from Python"
            warnings.warn(self.executor_note, RuntimeWarning, stacklevel=3)
            return None
        self.executor_note = program.describe()
        return native

    @property
    def executor(self) -> str:
        """'native' (one host-program call per request) or 'python' (one call per group)."""
        return "native" if self._native is not None else "python"

    def warm_up(self) -> None:
        """Run every kernel variant once at the smallest shape and plan that shape, so no request
        pays for first touches (library code pages, weight pages, OpenMP thread start-up) or for
        compiling shape expressions."""
        from tscomp.sample_inputs import random_inputs
        from tscomp.schedule.samples import group_inputs_at

        set_num_threads(self.num_threads)
        binding = {i.name: max(1, i.min) for i in self.graph.symbols.live_symbols()}
        rng = np.random.default_rng(0)
        if self._native is not None:   # this thread's arena at the top of the ranges, touched first:
            # touching it streams tens of MB through the caches, which must not evict the variants
            self._native.reserve({i.name: i.max for i in self.graph.symbols.live_symbols()})
        for g in self.plan.groups:     # then every variant, so their code and packed weights are the
            variants = self.model.kernels[g.name]   # most recently used data (a model that fits in L3
            if all(k.target == "numpy" for k in variants):   # keeps them there: the first call at a
                continue                                      # length served by a variant not used yet
            env = group_inputs_at(self.plan, g, binding, rng)  # finds it as warm as a seen one)
            for k in variants:
                k.run(env, binding)
        if self._native is None:
            self._shape_plan(binding)   # compiles every shape expression the planning evaluates
        else:
            with contextlib.suppress(TscompError):   # and the host program's own pages, once
                self._native.run(random_inputs(self.graph, binding, rng), binding, self._pick)

    def calibrate_solo_calls(self) -> SoloPolicy:
        """Measure which requests run on this thread alone after the OpenMP workers fell asleep
        (:mod:`tscomp.runtime.solo_calls`; ``Runtime`` does it after its warm-up) and use it."""
        if self._request is None:
            self.solo_policy = SoloPolicy(reason=f"no C request path ({self.request_path_note})")
        else:
            self.solo_policy = calibrate(self._request, self.graph, self.num_threads, self._admits)
        return self.solo_policy

    def _admits(self, binding: dict[str, int]) -> bool:
        """Whether the model's relations between its symbols hold at ``binding``."""
        try:
            self._check_relations(binding)
        except (TscompError, ArithmeticError, ValueError):   # a relation that fails, or cannot be evaluated there
            return False
        return True

    @property
    def last_call_threads(self) -> int | None:
        """The OpenMP thread count of the last request the C request path served (None: none yet)."""
        return (self._request.last_threads or None) if self._request is not None else None

    # ------------------------------------------------------------------ public
    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model. Safe to call from several threads at once: calls share the per-shape
        decisions, each runs in its own arena (the OpenMP team count applies per calling thread)."""
        t_start = time.perf_counter()
        if self._request is not None:      # every check and the call in C; None: a case for Python
            out = self._request(inputs)
            if out is not None:
                self.last_call_overhead = time.perf_counter() - t_start - self._native.last_kernel_seconds
                return out
        binding, in_range = self._bind(inputs)
        if not in_range:
            return self._run_out_of_range(inputs, binding)
        set_num_threads(self.num_threads)
        team_placement.enter(self.num_threads)      # the OpenMP workers kept off this thread's CPU
        if self._native is not None:
            out = self._native.run(inputs, binding, self._pick)
            self.last_call_overhead = time.perf_counter() - t_start - self._native.last_kernel_seconds
            return out
        return self._execute(self._shape_plan(binding), inputs, None)

    def profile(self, inputs: Mapping[str, np.ndarray], per_group: bool = False) -> list[tuple[str, str, float]]:
        """Run once, timing each group: ``[(group, family/target, seconds), ...]`` in Plan order.

        Through the host program, as ``run()`` runs (it stamps the clock after every native step),
        unless ``per_group`` or the Python executor: then one Python call per group, on the
        per-shape plan (a group whose input is a view copies it in numpy there, where the host
        program copies it in parallel C). A profile always runs with the runtime's thread count:
        it does not take the request path's solo-call decision (:mod:`tscomp.runtime.solo_calls`),
        so a short shape profiled after a pause charges the OpenMP team's wake-up to its first
        parallel group, where ``run()`` would have run the call on one thread."""
        binding, in_range = self._bind(inputs)
        if not in_range:
            raise ExecutionError("profile() runs compiled kernels only: the input shape is outside the "
                                 "declared ranges")
        set_num_threads(self.num_threads)
        if self._native is not None and not per_group:
            team_placement.enter(self.num_threads)
            stamps: list = []
            self._native.run(inputs, binding, self._pick, stamps)
            names = [g.name for g in self.plan.groups]       # a group's variants are of one family
            return [(names[i], _family(self.model.kernels[names[i]][0]), dt) for i, dt in stamps]
        times: list = []
        self._execute(self._shape_plan(binding), inputs, times)
        return times

    def selected_variants(self, inputs_or_binding) -> dict[str, object]:
        """The kernel variant each group runs at this shape (inputs dict or symbol binding)."""
        if all(isinstance(v, (int, np.integer)) for v in inputs_or_binding.values()):
            binding = {k: int(v) for k, v in inputs_or_binding.items()}
        else:
            binding, _ = self._bind(inputs_or_binding)
        return {s.group: s.kernel for s in self._shape_plan(binding).steps}

    # ------------------------------------------------------------------ validation
    def _bind(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, int], bool]:
        if type(inputs) is not dict and not isinstance(inputs, Mapping):   # (the ABC check costs ~1 us)
            raise ExecutionError(f"run() takes a dict of input name -> numpy array, got {type(inputs).__name__}")
        binding = self._binder.bind(inputs)
        outside = []
        ranges = self._ranges
        for sym, val in binding.items():
            lo, hi = ranges[sym]
            if not lo <= val <= hi:
                outside.append(f"{sym} = {val} (declared {lo}:{hi})")
        if outside and not self.allow_out_of_range:
            raise ExecutionError(f"input shape outside the compiled ranges: {', '.join(outside)}; recompile "
                                 f"with a wider --dim, or pass allow_out_of_range=True to run it on the "
                                 f"(slow) reference executor")
        if self._relations and not outside:
            self._check_relations(binding)
        return binding, not outside

    def _check_relations(self, binding: dict[str, int]) -> None:
        """The relations between symbols the model needs but the compiler could not prove (a Reshape
        of N tokens into an int(sqrt(N)) square grid needs N to be a square): checked per new
        binding, so an input that breaks one is refused by name instead of computing garbage."""
        key = tuple(binding.values())
        if key in self._related:
            return
        symtab = self.graph.symbols
        for c in self._relations:
            held, lhs, rhs = symtab.relation_at(c, binding)
            if not held:
                shape = ", ".join(f"{k} = {v}" for k, v in binding.items())
                raise ShapeError(f"these inputs ({shape}) break a relation the model requires: {c.reason}: "
                                 f"{c.lhs} {c.relation} {c.rhs} is {lhs} {c.relation} {rhs}")
        if len(self._related) > 4096:
            self._related.clear()
        self._related.add(key)

    # ------------------------------------------------------------------ per-shape decisions
    def _static_constants(self) -> dict[str, np.ndarray]:
        graph = self.graph
        needed = {n for g in self.plan.groups for n in g.inputs}
        # constants only GEMM kernels read come prepacked inside them (stripped from the plan on disk)
        return {n: graph.values[n].const for n in needed
                if graph.values[n].const is not None and n not in graph.inputs}

    def _shape_only_groups(self) -> set[str]:
        """Groups that read no run-time tensor, only constants and shape values (position ids,
        Range, a position table resized to the image): their outputs are a function of the shape
        alone, so they run once per shape, when the shape is planned, not on every call."""
        graph, static, out = self.graph, set(), set()
        for g in self.plan.groups:
            if all(n in static or (n not in graph.inputs and (graph.values[n].const is not None
                                                               or graph.values[n].symdata is not None))
                   for n in g.inputs):
                out.add(g.name)
                static.update(g.outputs)
        return out

    def _pick(self, group: str, binding: dict[str, int]):
        """The group's variant at ``binding``: from the dispatch table made at load, else the wave
        model (memoized per binding: a group without a table costs one evaluation per shape)."""
        variants = self.model.kernels[group]
        table = self._dispatch.get(group)
        if table is not None:
            try:
                return variants[table.pick(binding)]
            except (KeyError, IndexError):
                pass
        key = (group, *sorted(binding.items()))
        got = self._picked.get(key)
        if got is None:
            if len(self._picked) >= PICK_MEMO_SIZE:
                self._picked.clear()
            charges = (table.surcharge, table.margin) if table is not None else ()
            got = self._picked[key] = pick_variant(variants, binding, self.target, *charges)
        return got

    def _symbolic_buffer_plan(self) -> SymbolicBufferPlan:
        """Where every intermediate lives in the arena, as expressions of the symbols (decided once:
        per shape the offsets are only evaluated)."""
        graph, symtab = self.graph, self.graph.symbols
        produced_at, last_read = self._order
        keep = set(graph.outputs) | set(graph.inputs)
        lifetimes = [SymbolicLifetime(name, symtab.canon(numel(graph.values[name].shape)
                                                         * np.dtype(graph.values[name].dtype).itemsize),
                                      k, last_read.get(name, k))
                     for name, k in produced_at.items() if name not in keep]
        return plan_buffers_symbolic(lifetimes, symtab)

    def _lifetimes_by_index(self):
        produced_at, last_read = {}, {}
        for k, g in enumerate(self.plan.groups):
            if g.name in self._shape_only:
                continue
            for name in g.inputs:
                last_read[name] = k
            for name in g.outputs:
                produced_at[name] = k
        return produced_at, last_read

    def _shape_plan(self, binding: dict[str, int]) -> ShapePlan:
        key = tuple(sorted(binding.items()))
        with self._lock:
            cached = self._shapes.get(key)
            if cached is not None:
                self._shapes.move_to_end(key)
                return cached
        made = self._make_shape_plan(binding)   # outside the lock: two threads may both plan a new shape
        evicted = []
        with self._lock:
            plan = self._shapes.setdefault(key, made)
            self._shapes.move_to_end(key)
            while len(self._shapes) > SHAPE_CACHE_SIZE:
                evicted.append(self._shapes.popitem(last=False)[1])
            if plan is not made:
                evicted.append(made)
            for old in evicted:           # their arenas serve later shapes (in-flight ones are dropped)
                for raw, _ in old.free_arenas:
                    self._pool.give(raw)
                old.free_arenas.clear()
        return plan

    def _make_shape_plan(self, binding: dict[str, int]) -> ShapePlan:
        graph, symtab = self.graph, self.graph.symbols
        produced_at, last_read = self._order
        shapes = {name: tuple(int(symtab.evaluate(d, binding)) for d in graph.values[name].shape)
                  for name in produced_at}
        keep = set(graph.outputs) | set(graph.inputs)
        buffers = self._buffer_plan.evaluate(binding)      # placement decided once, at load
        shape_consts = {n: materialize(graph, graph.values[n], binding) for g in self.plan.groups
                        for n in g.inputs if graph.values[n].symdata is not None}
        steps = []
        for k, g in enumerate(self.plan.groups):
            kernel = self._pick(g.name, binding)
            if g.name in self._shape_only:
                shape_consts.update(kernel.run({**self._consts, **shape_consts}, binding))
                continue
            free = tuple(n for n in g.inputs if last_read.get(n) == k and n not in keep)
            outs = tuple(n for n in g.outputs if n in buffers.offsets) if kernel.takes_out else ()
            steps.append(Step(g.name, kernel, kernel.takes_out, free, outs))
        dtypes = {name: np.dtype(graph.values[name].dtype) for name in shapes}
        plan = ShapePlan(dict(binding), steps, shapes, dtypes, buffers, shape_consts, [])
        plan.free_arenas.append(plan.new_arena(self._pool))
        return plan

    # ------------------------------------------------------------------ execution
    def _execute(self, shape: ShapePlan, inputs, times: list | None) -> dict[str, np.ndarray]:
        with self._lock:
            arena = shape.free_arenas.pop() if shape.free_arenas else None
        if arena is None:
            arena = shape.new_arena(self._pool)   # another call at this shape holds the pooled one(s)
        try:
            return self._execute_in(shape, arena, inputs, times)
        finally:
            with self._lock:
                shape.free_arenas.append(arena)

    def _execute_in(self, shape: ShapePlan, arena: tuple, inputs, times: list | None) -> dict[str, np.ndarray]:
        t_start = time.perf_counter()
        env: dict[str, np.ndarray] = dict(self._consts)
        env.update(shape.shape_consts)
        env.update({k: np.asarray(v) for k, v in inputs.items()})
        if shape.has_numpy:   # a numpy fallback group: its BLAS stays on this thread, no second pool
            with blas_single_threaded:
                return self._run_steps(shape, arena, env, times, t_start, inputs)
        return self._run_steps(shape, arena, env, times, t_start, inputs)

    def _run_steps(self, shape: ShapePlan, arena: tuple, env: dict, times, t_start: float, inputs):
        kernel_time = 0.0
        binding = shape.binding
        for step, out in zip(shape.steps, arena[1]):
            t = time.perf_counter()
            try:
                produced = step.kernel.run(env, binding, out) if step.takes_out else step.kernel.run(env, binding)
            except TscompError:
                raise
            except Exception as exc:
                raise ExecutionError(f"group {step.group} ({_family(step.kernel)}) failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
            dt = time.perf_counter() - t
            kernel_time += dt
            if times is not None:
                times.append((step.group, _family(step.kernel), dt))
            env.update(produced)
            for name in step.free_after:
                env.pop(name, None)
        result = {}
        for name in self.graph.outputs:
            arr = env[name]
            shared = name in inputs or name in self._consts or name in shape.shape_consts
            result[name] = arr.copy() if shared else arr
        self.last_call_overhead = time.perf_counter() - t_start - kernel_time
        return result

    # ------------------------------------------------------------------ outside the ranges
    def _run_out_of_range(self, inputs, binding) -> dict[str, np.ndarray]:
        from tscomp.graph import DimSpec, load_model
        from tscomp.graph.reference import run_reference

        model_file = self.source_model_file()
        widened = [_widen(DimSpec.parse(text), binding) for text in self.model.dims]
        warnings.warn(f"shape {binding} is outside the compiled ranges: running the reference executor on "
                      f"{model_file.name} (correct but slow; recompile with wider --dim to get kernels)",
                      RuntimeWarning, stacklevel=3)
        graph = load_model(model_file, widened)
        return run_reference(graph, inputs)

    def source_model_file(self) -> Path:
        """The ONNX model this artifact was compiled from: its copy inside the artifact (compiled
        with ``embed_source``), else the source model the manifest names."""
        if self.path is not None:
            copies = sorted((self.path / "model").glob("*.onnx"))
            if copies:
                return copies[0]
        src = Path(self.model.source_model) if self.model.source_model else None
        if src is None or not src.is_file():
            raise ExecutionError(f"this needs the ONNX model the artifact was compiled from, "
                                 f"{self.model.source_model or '(not recorded)'}, which is not there, and the "
                                 f"artifact has no copy (compile with embed_source / --embed-source to carry one)")
        return src


def _widen(spec, binding: Mapping[str, int]):
    """``spec`` with its range stretched to include the bound value of its symbol."""
    from dataclasses import replace

    v = binding.get(spec.name)
    if v is None:
        return spec
    return replace(spec, min=min(spec.min, v), max=max(spec.max, v))


def _family(kernel) -> str:
    return kernel.family


__all__ = ["Runtime"]
