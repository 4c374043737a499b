"""Every family of ``models/`` exported in float16 (``model.half()``, the dynamo exporter), compiled
by tscomp and compared with onnxruntime at random shapes; and both systems against the same model
evaluated in float32 (its float16 weights and inputs widened exactly, every float16 type made
float32, run by onnxruntime): what each system's float16 arithmetic costs in accuracy.

    .venv/bin/python -m benchmarks.half_families [--families bert,vit,...] [--shapes 4]

Per export: the numpy groups left (0 wanted), the worst relative L2 error against onnxruntime, and
the relative L2 error of each system against the float32 evaluation (float16's unit roundoff is
4.9e-4). The TorchScript exporter's float16 graphs are not used: its LayerNormalization mixes
float16 and float32 operands, which onnxruntime refuses to load.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from benchmarks.family_sweep import arguments, checked_bindings, relative_l2, tiny_ranges
from models import families as F
from models.export import export_model
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime

def float32_twin(path: str, out: str) -> None:
    """The model with every float16 initializer, attribute tensor and type made float32 (exact)."""
    m = onnx.load(path)

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type == onnx.TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))

    for t in m.graph.initializer:
        widen(t)
    for n in m.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                widen(a.t)
            if a.name in ("to", "dtype") and a.i == onnx.TensorProto.FLOAT16:
                a.i = onnx.TensorProto.FLOAT
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    onnx.save(m, out)


def check(path: str, family: str, shapes: int, seed: int, tmp: str) -> dict:
    import onnxruntime as ort
    ranges = tiny_ranges(family)
    model = compile_model(path, [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=1)
    rt = Runtime.from_compiled(model)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    twin_path = str(Path(tmp) / f"{family}-fp32-twin.onnx")
    float32_twin(path, twin_path)
    twin = ort.InferenceSession(twin_path, providers=["CPUExecutionProvider"])
    out = sess.get_outputs()[0].name
    rng = np.random.default_rng(seed)
    worst = {"vs onnxruntime": 0.0, "tscomp vs float32": 0.0, "onnxruntime vs float32": 0.0}
    for binding in checked_bindings(ranges, shapes, rng):
        feed = {n: (v.astype(np.float16) if v.dtype == np.float32 else v)
                for n, v in F.make_inputs(family, binding, rng, "tiny").items()}
        got = rt.run(feed)[out].astype(np.float32)
        want = sess.run([out], feed)[0].astype(np.float32)
        exact = twin.run([out], {n: v.astype(np.float32) if v.dtype == np.float16 else v for n, v in feed.items()})[0]
        for key, err in (("vs onnxruntime", relative_l2(got, want)), ("tscomp vs float32", relative_l2(got, exact)),
                         ("onnxruntime vs float32", relative_l2(want, exact))):
            worst[key] = max(worst[key], err)
    return {"numpy groups": len(model.fallback_groups()), **worst}


def main() -> None:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            try:
                path = str(export_model(family, "tiny", "dynamo", args.cache, half=True))
                r = check(path, family, args.shapes, args.seed, tmp)
                row = (f"{family:10s} numpy groups {r['numpy groups']}  worst relative L2: vs onnxruntime "
                       f"{r['vs onnxruntime']:.1e}; against the float32 evaluation tscomp {r['tscomp vs float32']:.1e}, "
                       f"onnxruntime {r['onnxruntime vs float32']:.1e}")
            except Exception as exc:       # a failure is a row of the table, not the end of the sweep
                row = f"{family:10s} FAILED {type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            print(row, flush=True)
    print(f"\n{sum('FAILED' not in r for r in rows)} of {len(rows)} float16 exports compile; "
          f"{sum('numpy groups 0 ' in r for r in rows)} with no numpy group")


if __name__ == "__main__":
    main()
