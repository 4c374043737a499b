"""Recurrent models (torch ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` with a linear head, exported at a
dynamic batch and sequence length) compiled by tscomp and run beside onnxruntime in one process:
correctness at every shape, then the median latency of each and their ratio.

    .venv/bin/python -m benchmarks.recurrent_vs_onnxruntime [--models lstm_small,gru_bi,lstm_large] [--threads 2]

tscomp splits each recurrent op into one MatMul of every step's input projection and the
``tscomp.Recurrence`` kernel (``tscomp/graph/ops/recurrent.py``). The three default models cover
the kernel's two regimes: a recurrence small enough to run whole on one thread (``lstm_small``:
input 40, hidden 64; ``gru_bi``: bidirectional, input 64, hidden 128) and one the threads split by
hidden unit (``lstm_large``: 2 layers, input 128, hidden 256). Shapes: batch x length, including 1
and the range end (512). Nothing else may run on the machine meanwhile (2 cores: a ratio moves by
0.1 with a busy neighbour).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tscomp.bench import _timed

#: name -> (cell, input size, hidden size, layers, bidirectional)
MODELS = {"lstm_small": ("LSTM", 40, 64, 1, False), "gru_bi": ("GRU", 64, 128, 1, True),
          "lstm_large": ("LSTM", 128, 256, 2, False), "rnn_tanh": ("RNN", 32, 96, 1, False)}
SHAPES = [(1, 1), (1, 2), (2, 17), (3, 97), (1, 127), (1, 512), (4, 512)]
MAX_BATCH, MAX_SEQ = 4, 512


def export(name: str, out_dir: Path) -> Path:
    import torch
    cell, inp, hidden, layers, bi = MODELS[name]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = getattr(torch.nn, cell)(inp, hidden, num_layers=layers, batch_first=True, bidirectional=bi)
            self.head = torch.nn.Linear(hidden * (2 if bi else 1), 16)

        def forward(self, x):
            return self.head(self.rnn(x)[0])

    torch.manual_seed(0)
    path = out_dir / f"{name}.onnx"
    torch.onnx.export(Model().eval(), (torch.randn(2, 17, inp),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17)
    return path


#: seconds to wait before timing one system after the other: onnxruntime's pool spins on after a run,
#: and the recurrence's barrier per step stalls whenever one of its two threads shares a core with a
#: spinning worker (lstm_large 1x127 right after onnxruntime: 6.2 and 2.1 ms alternating for ~40 ms,
#: then 2.0 ms)
SETTLE_S = 0.2


def _median(call, runs: int = 15) -> float:
    time.sleep(SETTLE_S)
    call()
    return _timed(call, runs)


def run(name: str, out_dir: Path, threads: int) -> list[dict]:
    import onnxruntime as ort

    from tscomp.runtime import Runtime
    path = export(name, out_dir)
    art = out_dir / f"{name}.tsc"
    subprocess.run([sys.executable, "-m", "tscomp.cli", "compile", str(path), "-o", str(art), "--dim",
                    f"batch=1:{MAX_BATCH}", "--dim", f"seq=1:{MAX_SEQ}", "--budget", "1,10s"],
                   check=True, capture_output=True)
    rt = Runtime(str(art), num_threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    inp = MODELS[name][1]
    rng = np.random.default_rng(0)
    rows = []
    for b, s in SHAPES:
        x = {"x": rng.standard_normal((b, s, inp)).astype(np.float32)}
        got, want = rt.run(x)["y"], sess.run(None, x)[0]
        ok = bool(np.allclose(got, want, rtol=1e-4, atol=1e-4))
        t_ts, t_ort = _median(lambda: rt.run(x)), _median(lambda: sess.run(None, x))
        rows.append({"model": name, "batch": b, "seq": s, "ok": ok, "max_abs": float(np.abs(got - want).max()),
                     "tscomp_ms": t_ts * 1e3, "ort_ms": t_ort * 1e3, "ratio": t_ts / t_ort})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="lstm_small,gru_bi,lstm_large")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            cell, inp, hidden, layers, bi = MODELS[name]
            print(f"{name}: {layers}-layer {'bidirectional ' if bi else ''}{cell}, input {inp}, hidden {hidden}")
            rows = run(name, Path(tmp), args.threads)
            for r in rows:
                print(f"  {r['batch']}x{r['seq']:<4} {'ok' if r['ok'] else 'MISMATCH'} (max abs {r['max_abs']:.1e})  "
                      f"tscomp {r['tscomp_ms']:8.3f} ms  onnxruntime {r['ort_ms']:8.3f} ms  ratio {r['ratio']:.2f}")
            geo = float(np.exp(np.mean([np.log(r["ratio"]) for r in rows])))
            print(f"  geomean tscomp/onnxruntime {geo:.2f}; all match: {all(r['ok'] for r in rows)}")


if __name__ == "__main__":
    main()
