"""Every family of ``models/`` quantized the three ways onnxruntime's quantizers offer -- ``quantize_dynamic``
(int8 weights, DynamicQuantizeLinear -> MatMulInteger / ConvInteger) and ``quantize_static`` in the QDQ
and in the QOperator format (per-channel int8 weights, uint8 activations calibrated on three random
batches; QOperator: QLinearMatMul, QLinearConv and onnxruntime's QLinearAdd, QLinearSoftmax, ...) --
compiled by tscomp and compared with onnxruntime's plain session (each operator as specified) at
random shapes.

    .venv/bin/python -m benchmarks.quantized_families [--families bert,gpt2,...] [--exporters dynamo,torchscript]

Prints per export and format: the numpy groups left (0 wanted) and the worst relative L2 error over
the checked shapes. A quantized model amplifies fp32 rounding: where an activation lands within an
ulp of a rounding tie, one quantized element differs by one step between two correct implementations
(onnxruntime's optimized session differs from its plain one so), so errors of 1e-4..1e-2 are such
flips, not a wrong scale (which gives 1e-1 and more).

onnxruntime's QLinearSoftmax overflows on a row of one element (its exp table is sized for the
row length; times 1/y_scale the one entry exceeds FLT_MAX and the output is 0, not the probability
1.0 saturated to 255), so a QOperator model with a QLinearSoftmax is checked from sequence 2.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from benchmarks.family_sweep import QUANTIZED_FORMATS, arguments, checked_bindings, quantize_model, relative_l2, tiny_ranges
from models import families as F
from models.export import export_model
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime


def quantize(src: str, dst: str, fmt: str, family: str) -> None:
    """A family's export quantized (:func:`benchmarks.family_sweep.quantize_model`), calibrated on three
    random batches of its tiny inputs."""
    ranges = F.symbol_ranges(family, "tiny")
    rng = np.random.default_rng(0)
    batches = [F.make_inputs(family, {k: min(hi, max(lo, 7 + 5 * i)) for k, (lo, hi) in ranges.items()}, rng, "tiny")
               for i in range(3)]
    quantize_model(src, dst, fmt, batches)


def check(path: str, family: str, shapes: int, seed: int) -> tuple[int, float]:
    """(numpy groups, worst relative L2 error against onnxruntime's plain session)."""
    import onnxruntime as ort

    from tscomp.exact_integer_reference import onnxruntime_source
    ranges = tiny_ranges(family)
    model = compile_model(path, [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=1)
    if "sequence" in ranges and any(n.op_type == "QLinearSoftmax" for n in onnx.load(path).graph.node):
        ranges["sequence"] = (max(2, ranges["sequence"][0]), ranges["sequence"][1])   # see the docstring
    rt = Runtime.from_compiled(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # on a CPU whose onnxruntime saturates uint8 x int8 sums (no VNNI): the same model made exact
    sess = ort.InferenceSession(onnxruntime_source(path), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    worst = 0.0
    for binding in checked_bindings(ranges, shapes, rng):
        feed = F.make_inputs(family, binding, rng, "tiny")
        got = rt.run(feed)
        for out, want in zip(sess.get_outputs(), sess.run(None, feed)):
            worst = max(worst, relative_l2(got[out.name], want))
    return len(model.fallback_groups()), worst


def main() -> None:
    ap = arguments(__doc__.splitlines()[0])
    ap.add_argument("--exporters", default="dynamo,torchscript")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families.split(","):
            for exporter in args.exporters.split(","):
                src = str(export_model(family, "tiny", exporter, args.cache))
                for fmt in QUANTIZED_FORMATS:
                    dst = str(Path(tmp) / f"{family}-{exporter}-{fmt}.onnx")
                    try:
                        quantize(src, dst, fmt, family)
                    except Exception as exc:       # onnxruntime's quantizer refused the export: nothing to compile
                        row = f"{family:10s} {exporter:11s} {fmt:9s} not quantized (onnxruntime.quantization " \
                              f"{type(exc).__name__}: {str(exc)[:120]})"
                        rows.append(row)
                        print(row, flush=True)
                        continue
                    try:
                        numpy_groups, worst = check(dst, family, args.shapes, args.seed)
                        row = f"{family:10s} {exporter:11s} {fmt:9s} numpy groups {numpy_groups}  worst relative L2 {worst:.1e}"
                    except Exception as exc:       # a failure is a row of the table, not the end of the sweep
                        row = f"{family:10s} {exporter:11s} {fmt:9s} FAILED {type(exc).__name__}: {str(exc)[:200]}"
                    rows.append(row)
                    print(row, flush=True)
    quantized = [r for r in rows if "not quantized" not in r]
    print(f"\n{len(quantized)} of {len(rows)} exports quantized by onnxruntime; "
          f"{sum('FAILED' not in r for r in quantized)} of them compile; "
          f"{sum('numpy groups 0 ' in r for r in rows)} with no numpy group")


if __name__ == "__main__":
    main()
