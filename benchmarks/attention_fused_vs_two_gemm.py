"""Fused attention against the two-GEMM path (issue 13, acceptance 4), kernel time only.

For the first attention group of a model (BERT-base: 12 heads of 64), at each sequence length:
the fused kernel (:mod:`tscomp.codegen.cpu_attention`) against its parts run one after another --
the QKᵀ batched GEMM with the scale and mask epilogue, the row softmax, the P·V batched GEMM --
each side the fastest of its heuristic tile configurations (every part on its own), timed with
the compiler's rule (:func:`tscomp.schedule.measure.time_case`: warm-up, median of repeats), the
variants interleaved over 3 rounds and the best round kept. Checks the fused output against the
parts' before timing.

    .venv/bin/python -m benchmarks.attention_fused_vs_two_gemm .cache/models/bert-base-dynamo.onnx \\
        --dim batch=1:1 --dim sequence=1:512 --lengths 64,128,256,512

Nothing else may run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROUNDS = 3


def best_time(kernels, env, binding) -> float:
    from tscomp.schedule.measure import time_case
    rounds = [[time_case(k, env, binding, warmup=3, repeats=5, max_spread=0.15) for k in kernels]
              for _ in range(ROUNDS)]
    return float(np.min(rounds))


def main(argv=None) -> int:
    from tscomp.codegen.build import set_num_threads
    from tscomp.codegen.families import kernels_for_group
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse
    from tscomp.graph.fusion.interpret import evaluate_group
    from tscomp.schedule.samples import group_inputs_at

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--dim", action="append", default=[])
    ap.add_argument("--lengths", default="64,128,256,512")
    ap.add_argument("--symbol", default="sequence", help="the dynamic dimension the lengths bind")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/attention_fused_vs_two_gemm.json")
    args = ap.parse_args(argv)
    set_num_threads(args.threads)
    plan = fuse(load_model(args.model, args.dim))
    group = next((g for g in plan.groups if g.kind == "attention"), None)
    if group is None:
        raise SystemExit(f"{args.model}: no attention group")
    fused = kernels_for_group(plan, group)
    if fused[0].family != "attention":
        raise SystemExit(f"{group.name}: the attention family refused it: {fused[0].reasons}")
    parts = [(p, kernels_for_group(plan, p)) for p in group.parts]
    base = {i.name: max(1, i.min) for i in plan.graph.symbols.live_symbols()}
    rng = np.random.default_rng(0)
    rows = []
    print(f"{group.name}: fused {len(fused)} variants; parts " +
          ", ".join(f"{p.name} ({ks[0].family}, {len(ks)})" for p, ks in parts), flush=True)
    print(f"{'L':>5}  {'fused ms':>9}  {'two-GEMM ms':>11}  {'fused/two-GEMM':>14}  parts ms")
    for L in (int(x) for x in args.lengths.split(",")):
        b = {**base, args.symbol: L}
        env = group_inputs_at(plan, group, b, rng)
        want = evaluate_group(plan, group, env, b)
        got = fused[0].run(env, b)
        for n in want:
            if not np.allclose(got[n], want[n], rtol=1e-4, atol=1e-4):
                raise SystemExit(f"L={L}: fused output {n} differs from the reference")
        t_fused = best_time(fused, env, b)
        t_parts, penv = [], dict(env)
        for p, ks in parts:
            t_parts.append(best_time(ks, penv, b))
            penv.update(ks[0].run(penv, b))
        two = sum(t_parts)
        rows.append({"L": L, "fused_ms": t_fused * 1e3, "two_gemm_ms": two * 1e3,
                     "parts_ms": [t * 1e3 for t in t_parts]})
        print(f"{L:>5}  {t_fused * 1e3:9.3f}  {two * 1e3:11.3f}  {t_fused / two:14.3f}  "
              + " + ".join(f"{t * 1e3:.3f}" for t in t_parts), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "group": group.name, "threads": args.threads, "rows": rows},
                              indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
