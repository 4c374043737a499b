"""Issue 13's bf16 mode measured: tscomp bf16 vs tscomp fp32 vs onnxruntime fp32 (and OpenVINO at its
default precision -- bf16 on a CPU with avx512_bf16 -- when the optional ``openvino`` package, the
``bench`` extra, is installed), side by side in one process, same inputs, same thread count.

    .venv/bin/tscomp compile M.onnx --dim batch=1:8 --dim sequence=1:512 -o fp32.tsc
    .venv/bin/tscomp compile M.onnx --dim batch=1:8 --dim sequence=1:512 -o bf16.tsc --precision bf16
    .venv/bin/python -m benchmarks.bf16_vs_fp32 M.onnx fp32.tsc bf16.tsc [--openvino] [--samples 25]

Lengths: :func:`tscomp.bench.sample_bindings` (25 random sequence lengths, seed 0, batch fixed at 1),
as ``benchmarks.bert_vs_onnxruntime``. Per length every system is warmed up, then timed ``--repeats``
times in turn (after a short pause, so onnxruntime's and OpenVINO's spinning workers stop) and the
median kept. Also reports each reduced-precision system's accuracy against onnxruntime fp32 (cosine
similarity and relative L2 error of the output). Writes a JSON record and a plot (latency vs length,
one line per system) next to ``--out``.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from benchmarks.side_by_side import accuracy, geomean, run_and_time, save_results
from tscomp.bench import ort_session, sample_bindings
from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs


def openvino_model(onnx_path: str, threads: int, precision: str | None = None):
    """OpenVINO's CPU plugin at ``precision`` (``f32``; None: its default, bf16 on a CPU with
    avx512_bf16), with the precision it runs at as a string."""
    import openvino as ov

    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = core.compile_model(core.read_model(onnx_path), "CPU", config)
    hint = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = getattr(hint, "get_type_name", None)
    return compiled, name() if name else str(hint)      # "bf16" on a CPU with avx512_bf16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the ONNX model both artifacts were compiled from")
    ap.add_argument("fp32", help="artifact compiled with --precision fp32")
    ap.add_argument("bf16", help="artifact compiled with --precision bf16")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--openvino", action="store_true", help="also OpenVINO at its default precision "
                    "(pip install openvino: the bench extra)")
    ap.add_argument("--openvino-f32", action="store_true", help="also OpenVINO with INFERENCE_PRECISION_HINT=f32 "
                    "(the fp32 peer)")
    ap.add_argument("--out", default="benchmarks/results/bf16_vs_fp32.json")
    args = ap.parse_args()

    rt32, rt16 = Runtime(args.fp32, num_threads=args.threads), Runtime(args.bf16, num_threads=args.threads)
    for rt, want in ((rt32, "fp32"), (rt16, "bf16")):
        got = rt.manifest.get("precision", "fp32")
        if got != want:
            raise SystemExit(f"{rt.path}: compiled with precision {got}, expected {want}")
    sess = ort_session(args.model, args.threads)
    names = [o.name for o in sess.get_outputs()]
    systems = {"tscomp fp32": lambda x: rt32.run(x), "tscomp bf16": lambda x: rt16.run(x),
               "onnxruntime fp32": lambda x: dict(zip(names, sess.run(None, x)))}
    ov_precisions = []
    for wanted, hint in ((args.openvino, None), (args.openvino_f32, "f32")):
        if not wanted:
            continue
        compiled, got = openvino_model(args.model, args.threads, hint)
        ov_precisions.append(got)
        request = compiled.create_infer_request()

        def run_ov(x, request=request):
            request.infer(x)
            return {n: request.get_output_tensor(i).data.copy() for i, n in enumerate(names)}
        systems[f"openvino {got}"] = run_ov
    fixed = {"batch": args.batch} if any(i.name == "batch" for i in rt32.graph.symbols.live_symbols()) else {}
    bindings = sample_bindings(rt32, args.samples, args.seed, fixed)
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    for n, binding in enumerate(bindings):
        outs, times = run_and_time(systems, random_inputs(rt32.graph, binding, rng), args.repeats)
        ref = outs["onnxruntime fp32"]
        acc = {name: accuracy(outs[name][names[0]], ref[names[0]]) for name in systems if name != "onnxruntime fp32"}
        rows.append({"binding": binding, "ms": {k: v * 1e3 for k, v in times.items()},
                     "cosine": {k: a[0] for k, a in acc.items()}, "rel_l2": {k: a[1] for k, a in acc.items()}})
        print(f"[{n + 1}/{len(bindings)}] {binding} " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in times.items()),
              flush=True)

    cols = list(systems)
    print("\n" + f"{'length':>6}  " + "  ".join(f"{c:>18}" for c in cols) + f"  {'bf16/fp32':>9}  {'bf16 cos':>9}"
          f"  {'bf16 relL2':>10}")
    for r in rows:
        ms = r["ms"]
        print(f"{r['binding'].get('sequence', 0):>6}  " + "  ".join(f"{ms[c]:18.2f}" for c in cols)
              + f"  {ms['tscomp bf16'] / ms['tscomp fp32']:9.3f}  {r['cosine']['tscomp bf16']:9.6f}"
              f"  {r['rel_l2']['tscomp bf16']:10.2e}")
    geo = {c: geomean(r["ms"][c] for r in rows) for c in cols}
    print("\ngeomean ms: " + ", ".join(f"{c} {v:.2f}" for c, v in geo.items()))
    for c in cols:
        if c != "tscomp bf16":
            ratios = [r["ms"]["tscomp bf16"] / r["ms"][c] for r in rows]
            print(f"tscomp bf16 / {c}: geomean {math.exp(np.mean(np.log(ratios))):.3f}, worst {max(ratios):.3f}")
    for c in cols:
        if c != "onnxruntime fp32":
            print(f"{c} vs onnxruntime fp32: min cosine {min(r['cosine'][c] for r in rows):.6f}, "
                  f"max relative L2 error {max(r['rel_l2'][c] for r in rows):.2e}")
    save_results(Path(args.out), {"model": args.model, "openvino_precisions": ov_precisions, "geomean_ms": geo}, rows, cols, args.threads)


if __name__ == "__main__":
    main()
