"""Cost-model validation as TSCompiler §7.3 does it (issue 8, acceptance 2).

For every distinct GEMM, batched-GEMM and fused-attention group of a compiled BERT-base artifact (one group per
schedule signature: identical layers share their variants), at 62 random sequence lengths in
[1, 512] (batch 1, seed 0): every kernel variant in the artifact is timed at that shape (the best
of 3 or more interleaved rounds — more while a round still finds a variant faster — each the
median of repeats, in this process; a length where the pick looks poor is timed again, twice,
after every group's first pass), and the variant the runtime's wave model picks
(:func:`tscomp.runtime.wave.pick_variant`) is compared with the fastest one. Printed per group:
mean and minimum of (fastest time / picked time), i.e. the fraction of the best throughput the
cost model achieves (the paper reports 97.9% mean, 92.6% worst on BERT-large Dense layers).

    .venv/bin/python -m benchmarks.cost_model_validation .cache/bench/bert-base-tuned.tsc \\
        .cache/bench/bert-base-heuristic.tsc

Nothing else may run on the machine meanwhile.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def distinct_groups(rt) -> list:
    seen, out = set(), []
    for g in rt.plan.groups:
        ks = rt.model.kernels[g.name]
        if ks[0].family not in ("gemm", "batched-gemm", "attention") or len(ks) < 2:
            continue
        sig = (ks[0].tuning or {}).get("signature") or tuple(k.func.split("_", 2)[-1] for k in ks)
        if sig in seen:
            continue
        seen.add(sig)
        out.append(g)
    return out


ROUNDS = 3
MAX_ROUNDS = 8


WARMUP = 3


def time_variant(k, env, binding, repeats: int) -> float:
    # the compiler's own timing rule (tscomp.schedule.measure.time_case): warm-up runs (a variant's
    # first runs after another variant's are 1.3-3x slow: its packed weights are out of cache),
    # then the median of at least `repeats` runs lasting at least 2 ms
    from tscomp.schedule.measure import time_case
    return time_case(k, env, binding, warmup=WARMUP, repeats=repeats, max_spread=0.15)


def time_variants(ks, env, binding, repeats: int) -> list[float]:
    """Every variant's time at one shape: the best of interleaved rounds (see the module docstring)."""
    # rounds interleave the variants, each variant's time the best of its round medians: a burst
    # of noise during one variant's repeats must not make it look slow (or fast)
    rounds = [[time_variant(k, env, binding, repeats) for k in ks] for _ in range(ROUNDS)]
    # more rounds while the last one still lowered some variant's best by > 2% (a burst of load
    # that lasted over the first rounds), up to MAX_ROUNDS
    while len(rounds) < MAX_ROUNDS and np.any(np.array(rounds[-1]) < 0.98 * np.min(rounds[:-1], axis=0)):
        rounds.append([time_variant(k, env, binding, repeats) for k in ks])
    return [float(t) for t in np.min(rounds, axis=0)]


#: a length where the pick reached less than this is timed again after the other lengths (every
#: variant, merged by the minimum): on this shared machine a load episode lasting seconds slows
#: some variants 1.5x at one length and is gone at the next
RECHECK_BELOW = 0.95


#: passes over the flagged lengths after every group's first pass (each pass re-times what is still
#: below RECHECK_BELOW): a slow episode of this shared machine can last a minute, so a re-time
#: right after the group's own lengths may land in the same episode
RECHECK_PASSES = 2


def validate(path: Path, lengths: list[int], repeats: int, threads: int) -> dict:
    from tscomp.codegen.build import set_num_threads
    from tscomp.runtime import Runtime
    from tscomp.runtime.wave import pick_variant
    from tscomp.schedule.samples import group_inputs_at

    rt = Runtime(path, num_threads=threads)
    set_num_threads(threads)
    rng = np.random.default_rng(0)
    base = {i.name: max(1, i.min) for i in rt.graph.symbols.live_symbols()}
    state = {}
    for g in distinct_groups(rt):
        ks = rt.model.kernels[g.name]
        bindings = [{**base, "sequence": L} for L in lengths]
        envs = [group_inputs_at(rt.plan, g, b, rng) for b in bindings]
        picks = [ks.index(pick_variant(ks, b, rt.target)) for b in bindings]
        times = [time_variants(ks, env, b, repeats) for env, b in zip(envs, bindings)]
        state[g.name] = (ks, bindings, envs, picks, times, set())
        print(f"  {g.name:<14} first pass: worst {min(min(t) / t[p] for t, p in zip(times, picks)):.3f}", flush=True)
    for _ in range(RECHECK_PASSES):     # the flagged lengths again, after every group's first pass
        for name, (ks, bindings, envs, picks, times, rechecked) in state.items():
            for i, (t, p) in enumerate(zip(times, picks)):
                if min(t) / t[p] < RECHECK_BELOW:
                    again = time_variants(ks, envs[i], bindings[i], repeats)
                    times[i] = [min(a, b) for a, b in zip(t, again)]
                    rechecked.add(i)
    out = {}
    for name, (ks, bindings, envs, picks, times, rechecked) in state.items():
        fractions = [min(t) / t[p] for t, p in zip(times, picks)]
        fam = ks[0].family
        out[name] = {"family": fam, "variants": [k.cfg.slug() for k in ks], "mean": float(np.mean(fractions)),
                     "min": float(np.min(fractions)), "worst_at": int(lengths[int(np.argmin(fractions))]),
                     "method": (ks[0].tuning or {}).get("method", "?"), "rechecked": len(rechecked),
                     # per length: each variant's measured time and the index the runtime picked
                     # (to evaluate a changed cost model offline against the same measurements)
                     "times": times, "picks": picks}
        print(f"  {name:<14} {fam:<13} {len(ks)} variants  mean {np.mean(fractions):.3f}  "
              f"min {np.min(fractions):.3f} (L={out[name]['worst_at']}; {len(rechecked)} lengths re-timed)",
              flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("artifacts", nargs="+")
    ap.add_argument("--lengths", type=int, default=62)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    lengths = sorted(int(x) for x in rng.integers(1, 513, size=args.lengths))
    summary = {"lengths": lengths}
    for a in args.artifacts:
        print(f"{a}:")
        res = validate(Path(a), lengths, args.repeats, args.threads)
        means = [r["mean"] for r in res.values()]
        mins = [r["min"] for r in res.values()]
        print(f"  over {len(res)} groups: mean of means {np.mean(means):.3f}, worst {np.min(mins):.3f}")
        summary[a] = res
    out = ROOT / "benchmarks" / "results" / "cost_model_validation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    print(f"summary: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
