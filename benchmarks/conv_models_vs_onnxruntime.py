"""Issue 11, acceptance 3: the convolutional models side by side with onnxruntime — ViT-base (its patch
embedding is a Conv) and the CNN family's base model (ResNet-50) — at random image sizes, same
process, same inputs, same thread count.

    .venv/bin/python -m benchmarks.conv_models_vs_onnxruntime                    # base models, 25 sizes
    .venv/bin/python -m benchmarks.conv_models_vs_onnxruntime --size tiny --samples 2   # smoke run
    .venv/bin/python -m benchmarks.conv_models_vs_onnxruntime --families resnet --tune  # as `tscomp compile`

Models are compiled with the families' heuristic tile configurations unless ``--tune`` is given:
then with the tile search and budget ``tscomp compile`` uses by default (ResNet-50 on a 2-core
Zen 3: 11 min to compile instead of 5; its geomean ratio 1.07 tuned against 1.13 untuned, one
session, one noisy host).

Per model: the latency table of ``tscomp bench`` (``--samples`` random (height, width) pairs drawn
uniformly from the family's declared ranges, batch 1, seed 0), its geometric-mean and worst
tscomp/onnxruntime ratio; then, at the smallest, a middle and the largest sampled size, the profile
(``Runtime.profile``): time in native Conv / pool kernels, the rest, and the time on the numpy
fallback (with the fallback groups named — the patch-embedding Conv must not be among them). A
summary line per model closes the run.
"""
from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import numpy as np

from models.export import export_model
from models.families import symbol_ranges
from tscomp.bench import bench, sample_bindings, table
from tscomp.cli_commands import Progress
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.runtime.artifact import write_artifact
from tscomp.sample_inputs import random_inputs
from tscomp.schedule.schedules import TuningOptions

CACHE = Path(".cache")
CONV_FAMILIES = ("conv", "conv-depthwise", "pool")


def profile_split(rt: Runtime, inputs, repeats: int = 3) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds per call by kind — conv/pool kernels, other native kernels, numpy fallback —,
    seconds per fallback group)."""
    time.sleep(0.1)   # let onnxruntime's worker threads stop spinning (see tscomp.bench)
    rt.run(inputs)
    kinds, fallback = collections.Counter(), collections.Counter()
    backbone = {g.name: g.backbone or g.kind for g in rt.plan.groups}
    for _ in range(repeats):
        for name, family, dt in rt.profile(inputs):
            if family == "numpy":
                kinds["numpy fallback"] += dt / repeats
                fallback[f"{name} ({backbone[name]})"] += dt / repeats
            elif family in CONV_FAMILIES:
                kinds[f"native {family}"] += dt / repeats
            else:
                kinds["other native"] += dt / repeats
    return dict(kinds), dict(fallback)


def run_model(family: str, size: str, exporter: str, samples: int, seed: int, threads: int,
              tune: bool = False) -> dict:
    onnx_path = str(export_model(family, size, exporter, CACHE / "models"))
    ranges = symbol_ranges(family, size)
    dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]
    artifact = CACHE / "bench" / f"{family}-{size}-{exporter}{'-tuned' if tune else ''}.tsc"
    how = "tuned" if tune else "heuristic tiles"
    print(f"\n=== {family}-{size} ({exporter}, {how}): compiling {onnx_path} {' '.join(dims)}", flush=True)
    model = compile_model(onnx_path, dims, threads=threads, progress=Progress("compiling groups"),
                          tuning=TuningOptions(progress=True) if tune else None)
    write_artifact(model, artifact)
    fb = model.fallback_groups()
    named = [f"{g} ({'; '.join(model.kernels[g][0].reasons) or '?'})" for g in fb]
    print(f"compiled in {model.compile_seconds:.1f}s; numpy-fallback groups: {', '.join(named) or 'none'}")
    rt = Runtime(artifact, num_threads=threads)
    fixed = {"batch": 1} if "batch" in ranges else {}
    bindings = sample_bindings(rt, samples, seed, fixed)
    result = bench(rt, onnx_path, bindings, threads=threads, seed=seed,
                   progress=lambda d, t, r: print(f"  [{d}/{t}] {r.binding} ratio {r.ratio:.3f}", flush=True))
    print("\n".join(table(result)))
    rng = np.random.default_rng(seed)
    by_size = sorted(bindings, key=lambda b: b.get("height", 1) * b.get("width", 1))
    picks = [by_size[0], by_size[len(by_size) // 2], by_size[-1]]
    seen, fallback_ms = set(), []
    for binding in picks:
        key = tuple(sorted(binding.items()))
        if key in seen:
            continue
        seen.add(key)
        full = {**{i.name: i.min for i in rt.graph.symbols.live_symbols()}, **binding}
        inputs = random_inputs(rt.graph, full, rng)
        kinds, fallback = profile_split(rt, inputs)
        total = sum(kinds.values())
        fallback_ms.append(kinds.get("numpy fallback", 0.0) * 1e3)
        print(f"\nprofile at {binding}: tscomp {total * 1e3:.2f} ms per call")
        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<24} {v * 1e3:9.3f} ms  ({100 * v / max(total, 1e-12):5.1f}%)")
        for g, v in sorted(fallback.items(), key=lambda kv: -kv[1]):
            print(f"    fallback {g:<30} {v * 1e3:9.3f} ms")
    w = result.worst()
    return {"model": f"{family}-{size}", "geomean": result.geomean(), "worst": w.ratio, "worst_at": w.binding,
            "fallback_groups": len(fb), "fallback_ms": max(fallback_ms, default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="vit,resnet", help="comma-separated model families")
    ap.add_argument("--size", default="base")
    ap.add_argument("--exporter", default="dynamo")
    ap.add_argument("--samples", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tune", action="store_true",
                    help="compile with the tile search (tscomp compile's default) instead of the heuristic tiles")
    args = ap.parse_args()
    (CACHE / "bench").mkdir(parents=True, exist_ok=True)
    rows = [run_model(f, args.size, args.exporter, args.samples, args.seed, args.threads, args.tune)
            for f in args.families.split(",") if f]
    print(f"\nsummary ({args.samples} random image sizes, batch 1, {args.threads} threads; ratio = tscomp / "
          f"onnxruntime latency, < 1 is faster):")
    for r in rows:
        print(f"  {r['model']:<14} geomean {r['geomean']:.3f}  worst {r['worst']:.3f} at {r['worst_at']}  "
              f"fallback groups {r['fallback_groups']}, fallback time up to {r['fallback_ms']:.3f} ms per call")


if __name__ == "__main__":
    main()
