"""On a GPU: the same model compiled for ``--target cuda`` twice, with the calibrated analytic
ranking alone and with ``--measure-gpu`` (the ranking's best configurations timed on this GPU),
each run at several shapes beside onnxruntime (CPU) for correctness; kernel time per run is the
sum of the CUDA-event times of its launches (host copies between groups excluded: the SIMT
runner stages each group's inputs through the host).

    python -m benchmarks.cuda_measured_vs_analytic --synthetic --shapes 16,128,512,2048
    python -m benchmarks.cuda_measured_vs_analytic --model bert.onnx --dim batch=1:8 --dim sequence=1:512 \\
        --shapes batch=1,sequence=128 ...

``--synthetic`` builds BERT-base's GEMM groups without attention (2 layers: QKV 768->2304 + bias,
a 2304->768 projection + bias + residual, FFN 768->3072 + bias + erf GELU, 3072->768 + bias +
residual; random weights, M rows dynamic).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic_model(path: Path, layers: int = 2) -> Path:
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def weight(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name))
        return name

    def dense(x, k, n, tag):
        t = f"{tag}_mm"
        nodes.append(helper.make_node("MatMul", [x, weight(f"{tag}_w", k, n)], [t]))
        nodes.append(helper.make_node("Add", [t, weight(f"{tag}_b", n)], [f"{tag}_y"]))
        return f"{tag}_y"
    inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
    x = "x"
    for i in range(layers):
        qkv = dense(x, 768, 2304, f"l{i}_qkv")
        proj = dense(qkv, 2304, 768, f"l{i}_proj")
        nodes.append(helper.make_node("Add", [proj, x], [f"l{i}_res1"]))
        up = dense(f"l{i}_res1", 768, 3072, f"l{i}_up")
        nodes += [helper.make_node("Div", [up, "sqrt2"], [f"l{i}_d"]), helper.make_node("Erf", [f"l{i}_d"], [f"l{i}_e"]),
                  helper.make_node("Add", [f"l{i}_e", "one"], [f"l{i}_e1"]),
                  helper.make_node("Mul", [up, f"l{i}_e1"], [f"l{i}_g0"]),
                  helper.make_node("Mul", [f"l{i}_g0", "half"], [f"l{i}_g"])]
        down = dense(f"l{i}_g", 3072, 768, f"l{i}_down")
        nodes.append(helper.make_node("Add", [down, f"l{i}_res1"], [f"l{i}_out"]))
        x = f"l{i}_out"
    graph = helper.make_graph(nodes, "bert_base_gemms", [helper.make_tensor_value_info("x", TP.FLOAT, ["M", 768])],
                              [helper.make_tensor_value_info(x, TP.FLOAT, ["M", 768])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)
    return path


def _inputs(model_path, shape: dict, rng):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in sess.get_inputs():
        dims = [shape[d] if isinstance(d, str) else d for d in i.shape]
        if "int" in i.type:     # token ids / types in [0, 2); masks all ones (no fully masked row)
            feeds[i.name] = (np.ones(dims, np.int64) if "mask" in i.name else
                             rng.integers(0, 2, size=dims).astype(np.int64))
        else:
            feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
    return sess, feeds


def _kernel_ms(runner, dev, feeds, repeats=5):
    """(median summed CUDA-event time of a run's launches, median wall time of a run, outputs):
    the wall time is taken in runs without events (they synchronize after every launch)."""
    totals, walls = [], []
    for _ in range(repeats + 1):
        dev.profile = []
        out = runner.run(feeds)
        totals.append(sum(ms for _, ms in dev.profile))
    dev.profile = None
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        runner.run(feeds)
        walls.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(totals[1:]), statistics.median(walls[1:]), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--dim", action="append", default=[])
    ap.add_argument("--shapes", required=True, help="comma-separated M values (--synthetic) or ;-separated "
                                                       "sym=v,sym=v bindings")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    from tscomp.codegen.simt.compile import compile_cuda
    from tscomp.runtime.device_opencl import device
    from tscomp.runtime.simt_artifact import load_cuda_artifact, write_cuda_artifact
    dev = device("cuda")
    tmp = Path(tempfile.mkdtemp(prefix="tsc-measured-"))
    if args.synthetic:
        model, dims = synthetic_model(tmp / "bert_base_gemms.onnx"), ["M=1:4096"]
        shapes = [{"M": int(m)} for m in args.shapes.split(",")]
    else:
        model, dims = Path(args.model), args.dim
        shapes = [{k: int(v) for k, v in (kv.split("=") for kv in s.split(","))} for s in args.shapes.split(";")]
    arch = dev.arch
    runners = {}
    for how, measure in (("analytic", False), ("measured", True)):
        compiled = compile_cuda(str(model), dims, (arch,), measure=measure, measure_top=args.top,
                                log=lambda m: print(m, flush=True))
        print(f"{how}: compiled in {compiled.compile_seconds:.1f}s; schedules {compiled.schedules.summary()}", flush=True)
        runners[how] = load_cuda_artifact(write_cuda_artifact(compiled, tmp / f"{how}.tsc"), device="cuda")
    rng = np.random.default_rng(1)
    print(f"\n{dev.device_name}: kernel time per run (ms, median of 5; wall: the whole run, host included), "
          f"max relative error vs onnxruntime CPU")
    print(f"{'shape':24s} {'analytic':>9s} {'measured':>9s} {'ratio':>6s} {'wall(a)':>8s} {'wall(m)':>8s} "
          f"{'err(a)':>8s} {'err(m)':>8s}")
    for shape in shapes:
        sess, feeds = _inputs(model, shape, rng)
        want = sess.run(None, feeds)
        row = {}
        for how, runner in runners.items():
            ms, wall, out = _kernel_ms(runner, dev, feeds)
            got = [out[o.name] for o in sess.get_outputs()]
            err = max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, want))
            row[how] = (ms, wall, err)
        (a, wa, ea), (m, wm, em) = row["analytic"], row["measured"]
        label = ",".join(f"{k}={v}" for k, v in shape.items())
        print(f"{label:24s} {a:9.3f} {m:9.3f} {m / a:6.2f} {wa:8.2f} {wm:8.2f} {ea:8.1e} {em:8.1e}", flush=True)


if __name__ == "__main__":
    main()
