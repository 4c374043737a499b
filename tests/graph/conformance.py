"""ONNX's own node conformance cases, run through tscomp's import, shape
propagation and reference executor.

Each case is run twice:
* **runtime mode** — the case's inputs are graph inputs: shape rules work from
  shapes alone (shape-tensor inputs are unknown at compile time), the reference
  executor computes the outputs, and every tensor is checked against its
  propagated shape;
* **constant mode** — the inputs become initializers: everything constant-folds,
  which exercises the shape rules with known values and cross-checks each rule
  against the reference (a disagreement is an error at fold time).
"""
from __future__ import annotations

import re
import warnings
from functools import lru_cache

import numpy as np
import onnx
from onnx import numpy_helper

from tscomp.graph import import_model, propagate_shapes
from tscomp.graph.ops.registry import REGISTRY
from tscomp.graph.reference import ReferenceExecutor

#: Cases of registered operators that tscomp deliberately does not run, with the reason.
#: Keys are regular expressions matched against the whole case name.
SKIP_REASONS: dict[str, str] = {
    r".*(float16|fp16|bfloat16|bf16|float8|FLOAT8|e4m3|e5m2|float4|FLOAT4|int4|INT4|uint4|UINT4|int2|uint2).*":
        "low-precision element types (fp16/bf16/fp8/fp4/int4/int2) are outside tscomp's fp32/int scope",
    r".*_string.*|.*STRING.*": "string tensors are not supported (no model in scope uses them)",
    r"test_training_dropout(_default)?(_mask)?":
        "training-mode Dropout with ratio > 0 draws a random mask (the expected data comes from numpy's "
        "seeded RNG); tscomp compiles for inference and rejects it with UnsupportedOperatorError",
    r"test_linear_attention.*":
        "LinearAttention's function body is a Scan loop, control flow tscomp does not compile",
    r"test_bernoulli.*":
        "Bernoulli draws random numbers (its ONNX function body is RandomUniformLike, which tscomp does not "
        "register): nondeterministic sampling is outside an inference compiler",
    r"test_resize_downsample_scales_(linear|cubic)_align_corners":
        "expected data uses onnx's Python reference (length_resized = fractional scale*in); the spec text and "
        "onnxruntime use the integer output length, which tscomp follows (matches onnxruntime exactly)",
}

#: Cases run in constant mode only (their inputs as initializers), with the reason the runtime mode
#: cannot hold: an output *shape* given by an input's *values*, which tscomp compiles only where the
#: compiler knows them (a data-dependent shape is refused by name in runtime mode).
CONSTANT_MODE_ONLY: dict[str, str] = {
    r"test_affine_grid_(2d|2d_align_corners|3d_align_corners)":
        "AffineGrid's output shape is the value of its size input (a graph input in runtime mode)",
    r"test_batchnorm_.*training_mode":
        "BatchNormalization's training mode (the batch's own statistics) is folded at compile time where "
        "its input is a constant (weight standardization) and refused on a run-time tensor",
}


def modes(case) -> tuple[str, ...]:
    for pattern in CONSTANT_MODE_ONLY:
        if re.fullmatch(pattern, case.name):
            return ("constant",)
    return ("runtime", "constant")


_UNSUPPORTED_DTYPES = {np.dtype(np.float16), np.dtype("O")}


@lru_cache(maxsize=1)
def all_cases():
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect_testcases()


def case_op(case) -> str:
    """The operator a case tests: its node's op type, or for an ``_expanded`` case
    (a function body spelled out in primitives) the op of the case it expands."""
    base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
    if base != case.name:
        for other in all_cases():
            if other.name == base:
                return other.model.graph.node[0].op_type
    ops = {n.op_type for n in case.model.graph.node}
    return case.model.graph.node[0].op_type if len(ops) > 1 else ops.pop()


@lru_cache(maxsize=1)
def cases_by_op() -> dict[str, list]:
    out: dict[str, list] = {}
    for case in all_cases():
        out.setdefault(case_op(case), []).append(case)
    return out


def registered_ops() -> list[str]:
    return sorted(op for (domain, op) in REGISTRY if domain == "")


def _expandable(op: str) -> bool:
    """An operator tscomp does not register whose schema defines it by a function body
    (tscomp.graph.functions expands it at import)."""
    try:
        schema = onnx.defs.get_schema(op)
    except onnx.defs.SchemaError:
        return False
    return ("", op) not in REGISTRY and (schema.has_function or schema.has_context_dependent_function)


def function_ops() -> list[str]:
    """Unregistered operators with conformance cases that function expansion makes runnable."""
    return sorted(op for op in cases_by_op() if _expandable(op))


def skip_reason(case) -> str | None:
    for pattern, reason in SKIP_REASONS.items():
        if re.fullmatch(pattern, case.name, flags=re.IGNORECASE):
            return reason
    missing = sorted({n.op_type for n in case.model.graph.node
                      if n.domain in ("", "ai.onnx") and ("", n.op_type) not in REGISTRY and not _expandable(n.op_type)}
                     | {f"{n.domain}.{n.op_type}" for n in case.model.graph.node
                        if n.domain not in ("", "ai.onnx")})
    if missing:
        return f"uses operators tscomp does not register: {', '.join(missing)}"
    for inputs, outputs in case.data_sets:
        for arr in list(inputs) + list(outputs):
            if isinstance(arr, onnx.TensorProto):
                arr = numpy_helper.to_array(arr)
            if isinstance(arr, np.generic):
                arr = np.asarray(arr)
            if not isinstance(arr, np.ndarray):
                return "sequence/optional-typed values are not supported"
            if arr.dtype in _UNSUPPORTED_DTYPES or arr.dtype.kind in "USO":
                return f"element type {arr.dtype} is outside tscomp's scope"
    return None


def run_case(case, mode: str) -> None:
    """Raise AssertionError (or a tscomp error) if tscomp disagrees with the case."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    for inputs, expected in case.data_sets:
        feeds = _feeds(model, inputs)
        if mode == "constant":
            m = _inputs_as_initializers(model, feeds)
            graph = import_model(m, source=case.name)
            propagate_shapes(graph)
            outs = ReferenceExecutor(graph).run({})
        else:
            graph = import_model(model, source=case.name)
            propagate_shapes(graph)
            outs = ReferenceExecutor(graph).run(feeds)
        for out_name, want in zip(graph.outputs, expected):
            want = _array(want)
            got = outs[out_name]
            _check_shape_statically(graph, out_name, want)
            assert got.shape == want.shape, f"{case.name}/{mode}: {out_name} shape {got.shape} != {want.shape}"
            if want.dtype.kind in "fc":
                np.testing.assert_allclose(got.astype(want.dtype), want, rtol=case.rtol, atol=case.atol,
                                           err_msg=f"{case.name}/{mode}: output {out_name}", equal_nan=True)
            else:
                np.testing.assert_array_equal(got.astype(want.dtype), want,
                                              err_msg=f"{case.name}/{mode}: output {out_name}")


def _check_shape_statically(graph, name, want) -> None:
    """When the propagated shape is fully concrete, it must equal the expected shape."""
    shape = graph.values[name].shape
    if shape is not None and all(d.is_Integer for d in shape):
        assert tuple(int(d) for d in shape) == tuple(want.shape), \
            f"propagated shape {[int(d) for d in shape]} != expected {list(want.shape)} for {name}"


def _feeds(model, inputs) -> dict[str, np.ndarray]:
    names = [vi.name for vi in model.graph.input]
    return {n: _array(a) for n, a in zip(names, inputs)}


def _array(a) -> np.ndarray:
    return numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)


def _inputs_as_initializers(model, feeds) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name not in feeds]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for name, arr in feeds.items():
        m.graph.initializer.append(numpy_helper.from_array(arr, name))
    return m
