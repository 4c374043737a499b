"""The DFT's native kernel (:mod:`tscomp.graph.ops.signal_c`) against onnxruntime and numpy's FFT,
side by side in one process, at FNet-base's sizes: a complex signal [1, L, 768] transformed along
the hidden axis (n = 768 = 4^4 * 3, L signals) and along the sequence (n = L, 768 signals; L = 509
a prime: Bluestein).

    .venv/bin/python -m benchmarks.dft_vs_onnxruntime [--lengths 37,128,509,512] [--threads 2]

Each model is one DFT (``tests.graph.ops.test_signal_ops._dft_model``: the signal's imaginary part
twice its real one), compiled over ``seq = 1:512``; per shape the median of 15 calls after 2
untimed ones, each system in turn. Nothing else may run meanwhile.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tests.graph.ops.test_signal_ops import _dft_model
from tscomp.bench import _timed as median_time
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact

HIDDEN = 768
AXES = {"hidden": 2, "sequence": 1}


def _median_time(call, repeats: int = 15) -> float:
    """The median of ``repeats`` timed calls after two untimed ones."""
    for _ in range(2):
        call()
    return median_time(call, repeats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="37,128,509,512")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    print(f"DFT of a complex [1, L, {HIDDEN}] signal, {args.threads} threads (tscomp, onnxruntime intra-op); "
          f"numpy's FFT on one thread")
    print(f"{'axis':>8}  {'L':>4}  {'tscomp ms':>9}  {'ort ms':>8}  {'numpy ms':>8}  {'tscomp/ort':>10}  {'tscomp/numpy':>12}")
    for name, axis in AXES.items():
        path = work / f"{name}.onnx"
        path.write_bytes(_dft_model(axis=axis, parts=2).SerializeToString())
        model = compile_model(str(path), ["batch=1:2", "seq=1:512", f"hidden=1:{HIDDEN}"])
        rt = Runtime(write_artifact(model, work / f"{name}.tsc"), num_threads=args.threads)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for L in (int(v) for v in args.lengths.split(",")):
            x = np.random.default_rng(L).standard_normal((1, L, HIDDEN)).astype(np.float32)
            signal = x + 2j * x
            t = _median_time(lambda: rt.run({"x": x}))
            o = _median_time(lambda: sess.run(None, {"x": x}))
            n = _median_time(lambda: np.fft.fft(signal, axis=axis))
            print(f"{name:>8}  {L:4d}  {t * 1e3:9.2f}  {o * 1e3:8.2f}  {n * 1e3:8.2f}  {t / o:10.3f}  {t / n:12.2f}")


if __name__ == "__main__":
    main()
