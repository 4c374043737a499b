"""A quantized model (onnxruntime's ``quantize_dynamic``: int8 weights, activations quantized per
call; or ``quantize_static``'s QDQ or QOperator format) on tscomp and on onnxruntime, beside the
float model on onnxruntime, side by side in one process, same inputs, same thread count.

    .venv/bin/python -c "from onnxruntime.quantization import quantize_dynamic, QuantType; \
        quantize_dynamic('M.onnx', 'M-int8.onnx', weight_type=QuantType.QInt8)"
    .venv/bin/tscomp compile M-int8.onnx --dim batch=1:1 --dim sequence=1:512 -o M-int8.tsc
    .venv/bin/python -m benchmarks.quantized_vs_onnxruntime M.onnx M-int8.onnx M-int8.tsc [--samples 12]

Any model with dims: a CNN's random image sizes are drawn as BERT's lengths are (a quantized
ResNet-50: ``--dim batch=1:2 --dim height=64:256 --dim width=64:256``, batch fixed at ``--batch``).

(The static formats: ``quantize_static(M, M-int8, reader, quant_format=QuantFormat.QDQ or
QuantFormat.QOperator, per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)``
with a :class:`CalibrationDataReader` over a few ``models.families.make_inputs`` batches.)

Both run the quantized GEMMs and Convs on int8 instructions on a CPU with avx512_vnni (tscomp:
VPDPBUSD kernels for every constant-weight GEMM and implicit-GEMM Conv whose integer operands fit
u8 x s8, see :mod:`tscomp.graph.quantized_arithmetic`, :func:`tscomp.codegen.families.gemm_target`
and ``conv_target``; bf16 or fp32 operands elsewhere); tscomp's GEMMs of two activations
(attention) stay float. Lengths:
:func:`tscomp.bench.sample_bindings` (random sequence lengths, seed 0, batch fixed at 1). Timing: :func:`benchmarks.side_by_side.run_and_time`. Accuracy: each system's output against
onnxruntime's on the quantized model, and both against the float model (what quantization costs).
Writes a JSON record and a plot (latency vs length) next to ``--out``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks.side_by_side import accuracy, geomean, run_and_time, save_results, shape_label
from tscomp.bench import exact_reference_session, ort_session, sample_bindings
from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs

TSCOMP, ORT_INT8, ORT_FP32 = "tscomp int8 model", "onnxruntime int8 model", "onnxruntime fp32 model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("float_model", help="the ONNX model before quantization")
    ap.add_argument("quantized_model", help="its quantize_dynamic output")
    ap.add_argument("artifact", help="the quantized model compiled by tscomp")
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/quantized_vs_onnxruntime.json")
    args = ap.parse_args()

    rt = Runtime(args.artifact, num_threads=args.threads)
    sessions = {ORT_INT8: ort_session(args.quantized_model, args.threads),
                ORT_FP32: ort_session(args.float_model, args.threads)}
    exact = exact_reference_session(args.quantized_model, args.threads)
    if exact is not None:
        print("this CPU's onnxruntime saturates uint8 x int8 sums (no VNNI): the accuracy columns compare with "
              "onnxruntime on the model with those GEMMs made exact (tscomp.exact_integer_reference)")
    first = sessions[ORT_INT8].get_outputs()[0].name
    systems = {TSCOMP: lambda x: rt.run(x)}
    for label, sess in sessions.items():
        systems[label] = lambda x, sess=sess: {first: sess.run([first], x)[0]}
    fixed = {"batch": args.batch} if any(i.name == "batch" for i in rt.graph.symbols.live_symbols()) else {}
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    for n, binding in enumerate(sample_bindings(rt, args.samples, args.seed, fixed)):
        inputs = random_inputs(rt.graph, binding, rng)
        outs, times = run_and_time(systems, inputs, args.repeats)
        got, int8, fp32 = (outs[s][first] for s in (TSCOMP, ORT_INT8, ORT_FP32))
        if exact is not None:       # onnxruntime's int8 sums saturate here: compare with the exact ones
            int8 = exact.run([first], inputs)[0]
        rows.append({"binding": binding, "ms": {k: v * 1e3 for k, v in times.items()},
                     "rel_l2_vs_ort_int8": accuracy(got, int8)[1],
                     "rel_l2_vs_fp32": {TSCOMP: accuracy(got, fp32)[1], ORT_INT8: accuracy(int8, fp32)[1]}})
        print(f"[{n + 1}] {binding} " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items()), flush=True)

    cols = list(systems)
    print("\n" + f"{'shape':>9}  " + "  ".join(f"{c:>22}" for c in cols)
          + f"  {'/ ort int8':>10}  {'/ ort fp32':>10}  {'relL2 vs ort int8':>17}")
    for r in rows:
        ms = r["ms"]
        print(f"{shape_label(r['binding']):>9}  " + "  ".join(f"{ms[c]:22.2f}" for c in cols)
              + f"  {ms[TSCOMP] / ms[ORT_INT8]:10.3f}  {ms[TSCOMP] / ms[ORT_FP32]:10.3f}"
              f"  {r['rel_l2_vs_ort_int8']:17.1e}")
    geo = {c: geomean(r["ms"][c] for r in rows) for c in cols}
    print("\ngeomean ms: " + ", ".join(f"{c} {v:.2f}" for c, v in geo.items()))
    for peer in (ORT_INT8, ORT_FP32):
        ratios = [r["ms"][TSCOMP] / r["ms"][peer] for r in rows]
        print(f"tscomp / {peer}: geomean {geomean(ratios):.3f}, worst {max(ratios):.3f}")
    print(f"tscomp vs onnxruntime on the int8 model: max relative L2 {max(r['rel_l2_vs_ort_int8'] for r in rows):.1e}; "
          "against the fp32 model: tscomp max "
          f"{max(r['rel_l2_vs_fp32'][TSCOMP] for r in rows):.1e}, onnxruntime int8 max "
          f"{max(r['rel_l2_vs_fp32'][ORT_INT8] for r in rows):.1e}")
    save_results(Path(args.out), {"models": [args.float_model, args.quantized_model], "geomean_ms": geo}, rows, cols, args.threads)


if __name__ == "__main__":
    main()
