"""Search quality of the schedule stage's tuner against exhaustive search (issue 8, acceptance 1).

For two groups of BERT-base — the FFN-up GEMM (K=768, N=3072, GELU epilogue, M = batch x sequence)
and the attention batched GEMM QKᵀ (K = head dim, M = N = sequence) — every valid configuration of
the family's search space is built and measured with the tuner's own objective (geometric mean of
the times at the sample shapes, each candidate in the measurement child process). That table is
the ground truth. Then TuRBO (:func:`tscomp.schedule.tuner.tune`), uniform random search and one
global GP (``skopt.gp_minimize``) each run 3 seeds with a budget of 10% of the space, replaying the
table as their objective (the same measurements, so the methods are compared on equal terms and
nothing is measured twice). Printed: per method and seed, the best configuration's throughput as a
fraction of the exhaustive best; written: a convergence plot and a JSON summary.

    .venv/bin/python -m benchmarks.tuner_search_quality            # ~15-25 min on 2 cores, cached
    .venv/bin/python -m benchmarks.tuner_search_quality --budget-fraction 0.1 --seeds 3

Nothing else may run on the machine meanwhile (the table is a timing measurement).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def bert_base_plan(path: Path, dims: list[str]):
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse

    return fuse(load_model(str(path), dims), attention=False)   # the QKᵀ batched GEMM, not the fused group


def pick_groups(plan) -> dict:
    """The FFN-up gemm group and the QKᵀ batched group (first layer)."""
    from tscomp.codegen.families import choose_family

    out = {}
    for g in plan.groups:
        c = choose_family(plan, g)
        if c.family is None:
            continue
        if c.family.name == "gemm" and (c.analysis.K, c.analysis.N) == (768, 3072) and "ffn-up" not in out:
            out["ffn-up"] = c
        if c.family.name == "batched-gemm" and "qkt" not in out:
            M, N, K = c.analysis.static_extents()
            if K is not None and N is None:
                out["qkt"] = c
    return out


def exhaustive(plan, choice, target, cache: Path, log, compile_only: bool = False) -> dict:
    """{space key (str): {"point", "value", "seconds"}} for every valid configuration (cached)."""
    from tscomp.codegen.build import build_object
    from tscomp.schedule.samples import group_inputs_at, sample_bindings

    fam, analysis = choice.family, choice.analysis
    space = fam.space(analysis, target)
    table = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [p for p in space.enumerate() if str(space.key(p)) not in table]
    log(f"{choice.group.name}: {len(space)} valid configurations, {len(todo)} to measure")
    if todo:
        t0 = time.perf_counter()
        kernels = [fam.executor(analysis, space.config(p), target) for p in todo]
        log(f"  generated {len(kernels)} sources in {time.perf_counter() - t0:.0f}s; compiling")
        with ThreadPoolExecutor(max_workers=target.threads) as pool:
            list(pool.map(lambda k: build_object(k.source, k.func), kernels))
        log(f"  compiled in {time.perf_counter() - t0:.0f}s")
        if compile_only:
            return {"space": space, "table": table}
        from tscomp.schedule.measure import Measurer, Workload

        bindings = sample_bindings(plan)
        rng = np.random.default_rng(0)
        workload = Workload(choice.analysis.signature(), [(b, group_inputs_at(plan, choice.group, b, rng))
                                                          for b in bindings])
        with Measurer(threads=target.threads) as m:
            for n, (p, k) in enumerate(zip(todo, kernels)):
                fam.link(k)
                r = m.measure(k, workload)
                secs = list(map(float, r.seconds)) if r.ok else []
                value = float(np.exp(np.mean(np.log(np.maximum(secs, 1e-9))))) if r.ok else math.inf
                table[str(space.key(p))] = {"point": p, "value": value, "seconds": secs, "error": r.error}
                if n % 50 == 49 or n == len(todo) - 1:
                    cache.write_text(json.dumps(table))
                    log(f"  {n + 1}/{len(todo)} measured, {time.perf_counter() - t0:.0f}s")
    return {"space": space, "table": table}


def replay(space, table: dict, method: str, budget: int, seed: int) -> list[float]:
    """Best-so-far objective per trial of ``method`` run against the measured table."""
    from tscomp.schedule.tuner import Budget, global_gp_search, random_search, tune

    def objective(point):
        return table[str(space.key(point))]["value"]

    run = {"turbo": tune, "random": random_search, "gp": global_gp_search}[method]
    result = run(space, objective, budget=Budget(trials=budget), seed=seed)
    return result.best_so_far()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="BERT-base ONNX (default: exported into .cache/models)")
    ap.add_argument("--dim", action="append", default=None,
                    help="dynamic ranges (default batch=1:1 sequence=1:512: one request at any length)")
    ap.add_argument("--budget-fraction", type=float, default=0.10)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--plot", default=str(RESULTS / "tuner_convergence.png"))
    ap.add_argument("--compile-only", action="store_true",
                    help="only build every configuration into the kernel cache (no timing: may run while busy)")
    args = ap.parse_args(argv)

    from tscomp.codegen.native import sha256_text
    from tscomp.schedule.target import host_cpu

    log = lambda s: print(s, file=sys.stderr, flush=True)   # noqa: E731
    if args.model is None:
        from models.export import export_model
        path = export_model("bert", "base", "dynamo", ROOT / ".cache" / "models")
    else:
        path = Path(args.model)
    target = host_cpu()
    dims = args.dim or ["batch=1:1", "sequence=1:512"]
    plan = bert_base_plan(path, dims)
    groups = pick_groups(plan)
    summary = {"target": target.key(), "dims": dims, "budget_fraction": args.budget_fraction, "groups": {}}
    curves = {}
    for label, choice in groups.items():
        cache = ROOT / ".cache" / "bench" / (f"exhaustive-{label}-{choice.analysis.signature()}-{target.key()}-"
                                             f"{sha256_text(' '.join(dims))[:8]}.json")
        cache.parent.mkdir(parents=True, exist_ok=True)
        ex = exhaustive(plan, choice, target, cache, log, args.compile_only)
        if args.compile_only:
            continue
        space, table = ex["space"], ex["table"]
        best = min(v["value"] for v in table.values())
        best_point = min(table.values(), key=lambda v: v["value"])["point"]
        budget = max(1, math.floor(args.budget_fraction * len(space)))
        rows = {}
        for method in ("turbo", "random", "gp"):
            rows[method] = [replay(space, table, method, budget, seed) for seed in range(args.seeds)]
        curves[label] = (rows, best, budget, len(space))
        summary["groups"][label] = {
            "group": choice.group.name, "space": len(space), "budget": budget, "exhaustive_best_us": best * 1e6,
            "exhaustive_best": space.config(best_point).describe(),
            "fraction_of_best": {m: [best / c[-1] for c in rows[m]] for m in rows},
        }
        print(f"\n{label} ({choice.group.name}): {len(space)} configurations, exhaustive best {best * 1e6:.1f} us "
              f"({space.config(best_point).describe()}); budget {budget} trials = "
              f"{100 * budget / len(space):.1f}% of exhaustive")
        print(f"  {'method':<8} " + " ".join(f"seed {s:<5}" for s in range(args.seeds)) + "  mean")
        for m, cs in rows.items():
            fr = [best / c[-1] for c in cs]
            print(f"  {m:<8} " + " ".join(f"{f:>10.3f}" for f in fr) + f"  {np.mean(fr):.3f}")
    if args.compile_only:
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tuner_search_quality.json").write_text(json.dumps(summary, indent=1))
    plot(curves, Path(args.plot))
    print(f"\nplot: {args.plot}\nsummary: {RESULTS / 'tuner_search_quality.json'}")
    return 0


def plot(curves: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.2), squeeze=False)
    colors = {"turbo": "tab:blue", "random": "tab:gray", "gp": "tab:orange"}
    names = {"turbo": "trust-region BO (tscomp)", "random": "random search", "gp": "global GP (gp_minimize)"}
    for ax, (label, (rows, best, budget, size)) in zip(axes[0], curves.items()):
        for m, cs in rows.items():
            fr = np.array([[best / v for v in c] for c in cs])
            x = np.arange(1, fr.shape[1] + 1)
            ax.plot(x, fr.mean(axis=0), color=colors[m], label=names[m])
            ax.fill_between(x, fr.min(axis=0), fr.max(axis=0), color=colors[m], alpha=0.15)
        ax.axhline(0.95, color="k", lw=0.8, ls="--")
        ax.set_title(f"BERT-base {label}: {size} configurations, budget {budget}")
        ax.set_xlabel("trials")
        ax.set_ylabel("best throughput / exhaustive best")
        ax.set_ylim(0.3, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
