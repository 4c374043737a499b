"""Who is off when tscomp and onnxruntime disagree: both against a float64 evaluation of the same
model (onnx's reference evaluator on a copy whose float tensors are widened to float64).

A deep model with random weights can amplify fp32 rounding past the rtol = atol = 1e-4 check: the
unseen-families sweep flags it MISMATCH although neither system is wrong. This prints, per shape,
each fp32 result's largest absolute and relative-L2 distance from the float64 one; a tscomp error
of the size of onnxruntime's own is fp32 noise, one far larger is a bug.

    .venv/bin/python -m benchmarks.float64_reference --model M.onnx --artifact M.tsc --shape height=224 --shape width=224

The float64 evaluation is numpy (minutes for a full-size CNN at 224 x 224).
"""
from __future__ import annotations

import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs, shape_binding


def widened(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: float initializers, tensor attributes, declared
    value types and Cast targets widened."""
    m = onnx.ModelProto()
    m.CopyFrom(model)

    def widen_tensor(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for init in m.graph.initializer:
        widen_tensor(init)
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in m.graph.node:
        for a in node.attribute:
            if a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.type == onnx.AttributeProto.TENSOR:
                widen_tensor(a.t)
    return m


def float64_outputs(model_path, inputs: dict) -> list[np.ndarray]:
    """The model's outputs evaluated in float64 (:func:`widened` on onnx's reference evaluator),
    its float32 inputs widened too."""
    exact = ReferenceEvaluator(widened(onnx.load(str(model_path))))
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in inputs.items()}
    return [np.asarray(o) for o in exact.run(None, wide)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="the ONNX model (external data beside it is read)")
    ap.add_argument("--artifact", required=True, help="its tscomp artifact")
    ap.add_argument("--shape", action="append", default=[], help="NAME=VALUE (repeatable; others at their minimum)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rt = Runtime(args.artifact, num_threads=args.threads)
    binding = shape_binding(rt.graph, {k: int(v) for k, v in (s.split("=") for s in args.shape)})
    inputs = random_inputs(rt.graph, binding, np.random.default_rng(args.seed))
    names = [o.name for o in onnx.load(args.model, load_external_data=False).graph.output]
    want = dict(zip(names, float64_outputs(args.model, inputs)))
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    results = {"onnxruntime": dict(zip(names, sess.run(None, inputs))), "tscomp": rt.run(inputs)}
    print(f"{args.model} at {binding}: distance from the float64 evaluation")
    for system, outs in results.items():
        for name in names:
            got, ref = np.asarray(outs[name], np.float64), want[name]
            rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
            print(f"  {system:12s} {name}: max abs {np.abs(got - ref).max():.2e}, rel L2 {rel:.2e} "
                  f"(|ref| <= {np.abs(ref).max():.1e})")


if __name__ == "__main__":
    main()
