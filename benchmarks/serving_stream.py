"""A serving stream (issue 10, acceptance 2): 200 requests of random length (uniform in [1, 512],
with replacement, batch 1, 2 threads) to BERT-base, each system serving the same stream once, in
order, as a server would: tscomp, onnxruntime, and onnxruntime on the model its transformer
optimizer rewrote; and tscomp's *steady-state prediction* for the stream: each request run again
right after its call in the stream and that second call timed (its shape just seen), summed.

    .venv/bin/python -m benchmarks.serving_stream [--artifact A.tsc] [--onnx M.onnx]
        [--requests 200] [--seed 0] [--threads 2] [--ort-optimized M.opt.onnx | --no-ort-optimized]

Prints the three totals, tscomp/onnxruntime, and tscomp's total against its prediction. Targets:
tscomp <= 0.95x onnxruntime, and <= prediction + 2% (a never-seen shape costs what a seen one does).
The optimized model is made once with ``onnxruntime.transformers.optimizer`` (model_type bert,
12 heads, hidden 768) next to the ONNX file; its attention fusion fires only on TorchScript exports
of eager attention, so on a dynamo export it is mostly onnxruntime's own graph optimizations.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def _stream(requests: int, seed: int, lo: int, hi: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, size=requests)]


def _inputs(rt, L: int):
    from tscomp.sample_inputs import random_inputs
    binding = {i.name: i.min for i in rt.graph.symbols.live_symbols()} | {"sequence": L}
    return random_inputs(rt.graph, binding, np.random.default_rng(L))


def _serve(call, requests) -> float:
    t = time.perf_counter()
    for x in requests:
        call(x)
    return time.perf_counter() - t


def _ort_session(path: str, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _optimized_model(onnx_path: str, heads: int, hidden: int) -> str:
    out = Path(onnx_path).with_suffix(".ortopt.onnx")
    if not out.exists():
        from onnxruntime.transformers import optimizer
        model = optimizer.optimize_model(onnx_path, model_type="bert", num_heads=heads, hidden_size=hidden)
        model.save_model_to_file(str(out), use_external_data_format=True)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", default=".cache/bench/bert-base-dynamo.tsc")
    ap.add_argument("--onnx", default=".cache/models/bert-base-dynamo.onnx")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--ort-optimized", default=None, help="optimized ONNX model (default: made next to --onnx)")
    ap.add_argument("--no-ort-optimized", action="store_true")
    ap.add_argument("--heads", type=int, default=12, help="attention heads (for the optimizer)")
    ap.add_argument("--hidden", type=int, default=768, help="hidden size (for the optimizer)")
    args = ap.parse_args()

    from tscomp.runtime import Runtime

    t = time.perf_counter()
    rt = Runtime(args.artifact, num_threads=args.threads)
    print(f"tscomp load + verify + warm-up: {time.perf_counter() - t:.2f} s")
    lengths = _stream(args.requests, args.seed, 1, args.max_length)
    print(f"{len(lengths)} requests, lengths uniform in [1, {args.max_length}] (seed {args.seed}), "
          f"{len(set(lengths))} distinct, batch 1, {args.threads} threads")
    requests = [_inputs(rt, L) for L in lengths]
    systems = {"onnxruntime": _ort_session(args.onnx, args.threads)}
    if not args.no_ort_optimized:
        systems["onnxruntime-optimized"] = _ort_session(args.ort_optimized or _optimized_model(args.onnx, args.heads, args.hidden),
                                                        args.threads)
    for sess in systems.values():       # one warm call each at the shortest request
        sess.run(None, requests[int(np.argmin(lengths))])
    calls = {name: (lambda x, s=sess: s.run(None, x)) for name, sess in systems.items()}
    times = _tscomp_stream(rt.run, requests)
    for name, call in calls.items():
        times[name] = [_serve(call, [x]) for x in requests]
    _report(times, lengths)


def _tscomp_stream(run, requests) -> dict[str, list[float]]:
    """tscomp serves the stream; right after each request's call it serves the same request again,
    and that second call is the prediction's term (its shape just seen). The next request's call
    still follows a call at the previous request's shape, as in a plain stream, and the pairs are
    adjacent in time: on a noisy host (BERT-base at L = 256 read 274 and 356 ms minutes apart on the
    Zen 3) a prediction measured minutes after the stream compared two different machines.
    (Interleaving the peers request by request is no fairer: a call right after onnxruntime's
    pays for its spinning pool, +60% at L <= 64 when measured.)"""
    times = {"tscomp": [], "tscomp steady (pred.)": []}
    for x in requests:
        times["tscomp"].append(_serve(run, [x]))
        times["tscomp steady (pred.)"].append(_serve(run, [x]))
    return times


def _report(times: dict[str, list[float]], lengths: list[int]) -> None:
    totals = {name: sum(t) for name, t in times.items()}
    ort = totals["onnxruntime"]
    print(f"{'system':>22}  {'total s':>8}  {'vs onnxruntime':>14}")
    for name, total in totals.items():
        print(f"{name:>22}  {total:8.2f}  {total / ort:14.3f}")
    stream, pred = np.array(times["tscomp"]), np.array(times["tscomp steady (pred.)"])
    L = np.array(lengths)
    print("tscomp stream / prediction by request length: " + ", ".join(
        f"{lo}-{hi}: {stream[(L >= lo) & (L <= hi)].sum() / pred[(L >= lo) & (L <= hi)].sum():.3f}"
        for lo, hi in ((1, 64), (65, 192), (193, 320), (321, 448), (449, 512)) if ((L >= lo) & (L <= hi)).any()))
    print(f"tscomp stream / its steady-state prediction: {totals['tscomp'] / totals['tscomp steady (pred.)']:.3f} "
          f"(target <= 1.02); tscomp / onnxruntime: {totals['tscomp'] / ort:.3f} (target <= 0.95)")

if __name__ == "__main__":
    main()
