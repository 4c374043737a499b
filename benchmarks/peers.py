"""tscomp against its fp32 peers on one model, side by side in one process (issue 13, acceptance 1).

Systems, same inputs, same thread count:

* ``tscomp`` -- the compiled artifact (compile it as a user would, default budget);
* ``onnxruntime`` -- the same ONNX file, ``ORT_ENABLE_ALL``;
* ``ort-optimized`` -- the file rewritten by onnxruntime's transformer optimizer
  (``onnxruntime.transformers.optimizer``: fused Attention, SkipLayerNorm, BiasGelu where its
  patterns match the export; ``--model-type`` names the pattern set);
* ``openvino f32`` -- OpenVINO's CPU plugin with ``INFERENCE_PRECISION_HINT=f32`` (the optional
  ``bench`` extra: ``pip install -e '.[bench]'``; skipped with a note when it is not installed).

Shapes: ``--samples`` random bindings (seed 0), each symbol uniform over its declared range or over
``--dim name=lo:hi[:step]`` (e.g. ViT's ``--dim height=32:384:16``); ``batch`` is held at 1 unless
given. Per shape every system is warmed up, then timed ``--repeats`` times in two rounds (the order
reversed in the second, each after a short pause so that the peers' spinning workers stop) and the
best round median kept. Outputs are compared with onnxruntime (fp32 tolerance) so that a fast wrong
answer cannot pass.

Printed: per shape the latency of each system and tscomp / best peer, where the best peer is the
faster of ``ort-optimized`` and ``openvino f32`` over the whole run (the issue's criterion); then
geomeans and the worst ratio. Writes ``--out`` (JSON) and a plot next to it (latency vs the shape's
size, one line per system). ``--table A.json B.json ...`` prints the per-model summary of earlier runs.

    .venv/bin/tscomp compile .cache/models/bert-base-dynamo.onnx --dim batch=1:1 --dim sequence=1:512 \\
        -o .cache/bench/bert-base.tsc
    .venv/bin/python -m benchmarks.peers .cache/models/bert-base-dynamo.onnx .cache/bench/bert-base.tsc \\
        --model-type bert --out benchmarks/results/peers_bert_base.json
    .venv/bin/python -m benchmarks.peers --table benchmarks/results/peers_*.json

Nothing else may run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tscomp.bench import _timed as median_time, ort_session, sample_bindings
from tscomp.errors import TscompError
from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs

PEERS = ("ort-optimized", "openvino f32")


def parse_dim(text: str) -> tuple[str, tuple[int, int, int]]:
    name, _, spec = text.partition("=")
    parts = [int(p) for p in spec.split(":")]
    if len(parts) not in (2, 3) or parts[0] > parts[1]:
        raise SystemExit(f"--dim {text}: expected name=lo:hi or name=lo:hi:step")
    return name, (parts[0], parts[1], parts[2] if len(parts) == 3 else 1)


def draw_bindings(rt: Runtime, samples: int, seed: int, dims: dict[str, tuple[int, int, int]]) -> list[dict]:
    """``samples`` shapes (:func:`tscomp.bench.sample_bindings`): each symbol uniform over ``dims``
    (lo:hi:step) or its declared range; ``batch`` 1 unless ``dims`` names it. Sorted by size."""
    names = {i.name for i in rt.graph.symbols.live_symbols()}
    fixed = {"batch": 1} if "batch" in names and "batch" not in dims else {}
    try:
        out = sample_bindings(rt, samples, seed, fixed, within=dims)
    except TscompError as exc:
        raise SystemExit(str(exc).replace("--within", "--dim")) from None
    return sorted(out, key=lambda b: (math.prod(b.values()), tuple(b.values())))


def ort_optimized_model(onnx_path: str, model_type: str, workdir: Path) -> tuple[str, str] | None:
    """onnxruntime's transformer optimizer applied to ``onnx_path``: (the rewritten file's path, the
    pattern set used). When the optimizer fails on this export with ``model_type``'s patterns (its
    GPT-2 pass raises on the dynamo export), the generic ``bert`` patterns are tried; None when
    both fail."""
    from onnxruntime.transformers.optimizer import optimize_model

    for kind in dict.fromkeys((model_type, "bert")):
        try:
            opt = optimize_model(onnx_path, model_type=kind, num_heads=0, hidden_size=0, opt_level=1)
            out = workdir / (Path(onnx_path).stem + f"-ort-{kind}.onnx")
            opt.save_model_to_file(str(out), use_external_data_format=True)
        except Exception as exc:  # noqa: BLE001 - the optimizer's own failures, reported
            print(f"onnxruntime's transformer optimizer failed with the {kind} patterns: "
                  f"{type(exc).__name__}: {exc}", flush=True)
            continue
        fused = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        print(f"ort-optimized ({kind} patterns): fused {fused or 'nothing'}", flush=True)
        return str(out), kind
    print("ort-optimized: left out (the optimizer failed on this model)", flush=True)
    return None


def openvino_runner(onnx_path: str, threads: int, names: list[str]):
    """OpenVINO's CPU plugin forced to f32, as ``inputs -> {output name: array}``; None when the
    optional ``openvino`` package is missing."""
    try:
        from benchmarks.bf16_vs_fp32 import openvino_model
        compiled, got = openvino_model(onnx_path, threads, "f32")
    except ImportError:
        print("openvino is not installed (pip install -e '.[bench]'): its column is left out", flush=True)
        return None
    request = compiled.create_infer_request()

    def run(x):
        request.infer(x)
        return {n: request.get_output_tensor(i).data.copy() for i, n in enumerate(names)}
    return run


def session_runner(path: str, threads: int):
    sess = ort_session(path, threads)
    names = [o.name for o in sess.get_outputs()]
    return names, (lambda x: dict(zip(names, sess.run(None, x))))


def check_close(name: str, got: dict, want: dict, binding: dict, rtol: float = 1e-3, atol: float = 1e-3) -> None:
    for k, w in want.items():
        g = np.asarray(got[k])
        if g.shape != w.shape or not np.allclose(g, w, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(g - w))) if g.shape == w.shape else float("nan")
            raise SystemExit(f"{name} output {k!r} at {binding} differs from onnxruntime (max abs error {err:.3g})")


def run(args) -> dict:
    rt = Runtime(args.artifact, num_threads=args.threads)
    names, ort_run = session_runner(args.model, args.threads)
    systems = {"tscomp": rt.run, "onnxruntime": ort_run}
    with tempfile.TemporaryDirectory() as tmp:
        optimized = ort_optimized_model(args.model, args.model_type, Path(tmp)) if args.model_type else None
        if optimized is not None:
            systems["ort-optimized"] = session_runner(optimized[0], args.threads)[1]
        ov = openvino_runner(args.model, args.threads, names)
        if ov is not None:
            systems["openvino f32"] = ov
        bindings = draw_bindings(rt, args.samples, args.seed, dict(parse_dim(d) for d in args.dim))
        rng = np.random.default_rng(args.seed + 1)
        rows = []
        for n, binding in enumerate(bindings):
            inputs = random_inputs(rt.graph, binding, rng)
            want = ort_run(inputs)
            for name, fn in systems.items():             # warm-up, and every system checked
                check_close(name, fn(inputs), want, binding)
                fn(inputs)
            times = {}
            for rnd in range(2):                         # two rounds, the order reversed: fair under drift
                for name in (list(systems) if rnd == 0 else list(reversed(systems))):
                    time.sleep(0.1)
                    t = median_time(lambda: systems[name](inputs), args.repeats)
                    times[name] = min(times.get(name, math.inf), t)
            rows.append({"binding": binding, "ms": {k: v * 1e3 for k, v in times.items()}})
            print(f"[{n + 1}/{len(bindings)}] {binding} " + "  ".join(f"{k} {v * 1e3:.2f}" for k, v in times.items()),
                  flush=True)
    return {"model": args.model, "artifact": args.artifact, "threads": args.threads, "systems": list(systems),
            "ort_optimizer_patterns": optimized[1] if optimized else None, "rows": rows}


def summarize(result: dict) -> dict:
    """Geomean per system, the best peer (the faster of PEERS by geomean) and tscomp's ratios to it."""
    rows, systems = result["rows"], result["systems"]
    geo = {s: math.exp(np.mean([math.log(r["ms"][s]) for r in rows])) for s in systems}
    peers = [s for s in PEERS if s in systems] or ["onnxruntime"]
    best = min(peers, key=lambda s: geo[s])
    ratios = [r["ms"]["tscomp"] / r["ms"][best] for r in rows]
    worst = int(np.argmax(ratios))
    return {"geomean_ms": geo, "best_peer": best, "ratio_geomean": math.exp(np.mean(np.log(ratios))),
            "ratio_worst": ratios[worst], "worst_at": rows[worst]["binding"],
            "ratio_vs": {s: math.exp(np.mean([math.log(r["ms"]["tscomp"] / r["ms"][s]) for r in rows]))
                         for s in systems if s != "tscomp"}}


def print_rows(result: dict, summary: dict) -> None:
    systems, best = result["systems"], summary["best_peer"]
    print("\n" + f"{'shape':>24}  " + "  ".join(f"{s:>14}" for s in systems) + f"  {'tscomp/' + best:>22}")
    for r in result["rows"]:
        shape = ",".join(f"{k}={v}" for k, v in r["binding"].items() if k != "batch" or v != 1)
        print(f"{shape:>24}  " + "  ".join(f"{r['ms'][s]:14.2f}" for s in systems)
              + f"  {r['ms']['tscomp'] / r['ms'][best]:22.3f}")


def print_table(results: list[tuple[str, dict]]) -> None:
    systems = list(dict.fromkeys(s for _, r in results for s in r["systems"]))
    print("| model | " + " | ".join(f"{s} ms" for s in systems) + " | best peer | tscomp / best peer (worst) |")
    print("|---" * (len(systems) + 3) + "|")
    for name, r in results:
        s = summarize(r)
        cells = [f"{s['geomean_ms'][c]:.1f}" if c in s["geomean_ms"] else "-" for c in systems]
        print(f"| {name} | " + " | ".join(cells) + f" | {s['best_peer']} | {s['ratio_geomean']:.3f} "
              f"({s['ratio_worst']:.3f}) |")


def plot(result: dict, out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = result["rows"]
    xs = [math.prod(v for k, v in r["binding"].items()) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for s in result["systems"]:
        ax.plot(xs, [r["ms"][s] for r in rows], marker="o", ms=3, label=s)
    dims = [k for k in rows[0]["binding"] if len({r["binding"][k] for r in rows}) > 1]
    ax.set_xlabel(" x ".join(dims) or "shape")
    ax.set_ylabel(f"latency ms ({result['threads']} threads)")
    ax.set_title(Path(result["model"]).name)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"plot: {out.with_suffix('.png')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="the ONNX model the artifact was compiled from")
    ap.add_argument("artifact", nargs="?")
    ap.add_argument("--model-type", help="onnxruntime transformer optimizer's model type (bert, gpt2, vit, ...); "
                    "without it the ort-optimized column is left out")
    ap.add_argument("--dim", action="append", default=[], help="name=lo:hi[:step], the range shapes are drawn from")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/peers.json")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the per-model table of earlier runs and exit")
    args = ap.parse_args(argv)
    if args.table:
        print_table([(Path(p).stem.removeprefix("peers_"), json.loads(Path(p).read_text())) for p in args.table])
        return 0
    if not (args.model and args.artifact):
        ap.error("a model and an artifact are required (or --table)")
    result = run(args)
    summary = summarize(result)
    result["summary"] = summary
    print_rows(result, summary)
    print("\ngeomean ms: " + ", ".join(f"{s} {v:.2f}" for s, v in summary["geomean_ms"].items()))
    print("tscomp / " + ", ".join(f"{s} {v:.3f}" for s, v in summary["ratio_vs"].items()))
    print(f"tscomp / best peer ({summary['best_peer']}): geomean {summary['ratio_geomean']:.3f}, "
          f"worst {summary['ratio_worst']:.3f} at {summary['worst_at']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    plot(result, out)
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
