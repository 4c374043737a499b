"""Checks of tscomp's graph stage against onnxruntime on real exported models.

Shared by the integration tests and by ``benchmarks/shape_coverage.py``:

* :func:`binding_samples` — symbol bindings inside the declared ranges that
  always include the range ends, 1 where allowed, and primes;
* :func:`compare_with_onnxruntime` — runs onnxruntime with every intermediate
  exposed as an output and checks (a) every propagated shape evaluated at the
  binding equals the shape onnxruntime produced and (b) the reference
  executor's outputs match onnxruntime's;
* :func:`ort_symbolic_coverage` — how many values onnxruntime's own
  ``SymbolicShapeInference`` resolves on the same file.
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx
import sympy

from tscomp.graph import DimSpec, import_model, propagate_shapes, read_model, simplify
from tscomp.graph.fusion import Plan, fuse, run_plan
from tscomp.graph.ir import Graph
from tscomp.graph.reference import ReferenceExecutor

PRIMES = [2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 97, 127, 131, 251, 257, 509, 521, 1021, 1031]


def binding_samples(ranges: Mapping[str, tuple[int, int]], n: int = 20, seed: int = 0,
                    caps: Mapping[str, int] | None = None) -> list[dict[str, int]]:
    """``n`` bindings: all-min, all-max, a prime/random mix, one-symbol-at-max corners, then more
    primes and random values in range. ``caps`` lowers a symbol's maximum (base models keep the
    batch small so that every intermediate of the largest shape fits in memory at once)."""
    rng = random.Random(seed)
    ranges = {s: (lo, min(hi, (caps or {}).get(s, hi))) for s, (lo, hi) in ranges.items()}
    names = list(ranges)
    per_symbol = {}
    for name, (lo, hi) in ranges.items():
        primes = [p for p in PRIMES if lo <= p <= hi]
        pool = [lo, hi] + primes + [rng.randint(lo, hi) for _ in range(n)]
        rest = pool[2:]
        rng.shuffle(rest)
        per_symbol[name] = [lo, hi] + rest
    out = []
    for k in range(n):
        if k < 2:
            out.append({s: per_symbol[s][k] for s in names})
        elif 3 <= k < 3 + len(names):  # one symbol at its max, the others at their min
            out.append({s: (ranges[s][1] if i == k - 3 else ranges[s][0]) for i, s in enumerate(names)})
        else:
            out.append({s: per_symbol[s][(k + 7 * i) % len(per_symbol[s])] for i, s in enumerate(names)})
    return out


def dim_specs(ranges: Mapping[str, tuple[int, int]]) -> list[DimSpec]:
    return [DimSpec.parse(f"{name}={lo}:{hi}") for name, (lo, hi) in ranges.items()]


@dataclasses.dataclass
class LoadedModel:
    graph: Graph           # simplified
    imported_nodes: list   # the nodes before simplification (every value ORT will report)
    path: Path
    plan: Plan             # the fused plan of ``graph``


def load_for_checks(path: str | Path, ranges: Mapping[str, tuple[int, int]]) -> LoadedModel:
    graph = import_model(read_model(path), dim_specs(ranges), source=str(path))
    nodes = list(graph.nodes)
    propagate_shapes(graph)
    simplify(graph)
    return LoadedModel(graph, nodes, Path(path), fuse(graph))


def ort_session_with_intermediates(path: str | Path, graph: Graph, names: Sequence[str]):
    import onnxruntime as ort
    model = onnx.load(str(path))
    existing = {o.name for o in model.graph.output}
    for name in names:
        v = graph.values[name]
        if name in existing or v.dtype is None:
            continue
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype))
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@dataclasses.dataclass
class Comparison:
    binding: dict
    shapes_checked: int
    shape_mismatches: list[str]
    max_abs_err: float        # reference executor vs onnxruntime
    outputs_close: bool
    plan_max_abs_err: float   # fused Plan (interpreted) vs onnxruntime
    plan_close: bool


def compare_with_onnxruntime(loaded: LoadedModel, session, inputs: Mapping[str, np.ndarray],
                             binding: Mapping[str, int], rtol=1e-4, atol=1e-4) -> Comparison:
    graph = loaded.graph
    names = [o.name for o in session.get_outputs()]
    ort_values = dict(zip(names, session.run(names, dict(inputs))))
    mismatches = []
    checked = 0
    for name, arr in ort_values.items():
        v = graph.values.get(name)
        if v is None or v.shape is None:
            mismatches.append(f"{name}: no propagated shape")
            continue
        want = tuple(np.shape(arr))
        got = tuple(graph.symbols.evaluate(d, binding) for d in v.shape)
        checked += 1
        if got != want:
            mismatches.append(f"{name}: propagated {[str(d) for d in v.shape]} = {list(got)}, "
                              f"onnxruntime {list(want)}")
    err, close = _agreement(ReferenceExecutor(graph).run(inputs), ort_values, graph.outputs, rtol, atol)
    plan_err, plan_close = _agreement(run_plan(loaded.plan, inputs), ort_values, graph.outputs, rtol, atol)
    return Comparison(dict(binding), checked, mismatches, err, close, plan_err, plan_close)


def _agreement(ours, theirs, names, rtol, atol) -> tuple[float, bool]:
    """(max abs error, all close) of our outputs against onnxruntime's."""
    close, err = True, 0.0
    for out in names:
        a, b = ours[out], theirs[out]
        if a.shape != b.shape:
            close, err = False, float("inf")
            continue
        if a.dtype.kind == "f":
            err = max(err, float(np.max(np.abs(a - b))) if a.size else 0.0)
            close &= bool(np.allclose(a, b, rtol=rtol, atol=atol))
        else:
            close &= bool(np.array_equal(a, b))
    return err, close


def _dim_resolved(dim, input_params: set[str]) -> bool:
    if dim.HasField("dim_value"):
        return True
    if not dim.dim_param:
        return False
    try:
        expr = sympy.sympify(dim.dim_param.replace("//", "/"), locals={p: sympy.Symbol(p) for p in input_params})
    except Exception:
        return False
    return {s.name for s in expr.free_symbols} <= input_params


def ort_symbolic_coverage(path: str | Path, auto_merge: bool = True) -> tuple[int | None, int]:
    """(values with a fully known shape, node outputs) under onnxruntime's SymbolicShapeInference;
    ``None`` resolved when it gives up on the model. Known = every dim is a number or an expression
    over the graph inputs' dim_params (its fresh ``unk__`` names do not count)."""
    import os
    import tempfile
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    model = onnx.load(str(path))
    outputs = [o for n in model.graph.node for o in n.output if o]
    params = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:  # it drops sym_shape_infer_temp.onnx into cwd on failure
        os.chdir(tmp)
        try:
            inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=auto_merge)
        except Exception:
            inferred = None
        finally:
            os.chdir(cwd)
    if inferred is None:
        return None, len(outputs)
    infos = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    resolved = 0
    for name in outputs:
        vi = infos.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            continue
        if all(_dim_resolved(d, params) for d in vi.type.tensor_type.shape.dim):
            resolved += 1
    return resolved, len(outputs)


def tscomp_coverage(loaded: LoadedModel) -> tuple[int, int]:
    from tscomp.graph.shape_propagation import unresolved_values
    outputs = [o for n in loaded.imported_nodes for o in n.outputs if o]
    unresolved = set(unresolved_values(loaded.graph))
    return sum(1 for o in outputs if o not in unresolved), len(outputs)


def ort_optimized_node_count(path: str | Path) -> int:
    """Nodes in onnxruntime's own optimized graph (ORT_ENABLE_ALL, CPU)."""
    import os
    import tempfile
    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "optimized.onnx")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3  # the "hardware specific optimizations" notice is expected
        opts.optimized_model_filepath = out
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return len(onnx.load(out, load_external_data=False).graph.node)


def groups_per_layer(plan: Plan, layer: int) -> int | None:
    """Groups containing a node of encoder layer ``layer`` (TorchScript node names carry it:
    ``layer.3/``, ``layers.3/``, ``h.3/``); None when the names do not say."""
    import re
    pat = re.compile(rf"/(layer|layers|h)\.{layer}/")
    hits = [g for g in plan.groups if any(pat.search(n) for n in g.nodes)]
    return len(hits) or None
