"""Search quality of the schedule stage's tuner against exhaustive search (issue 8, acceptance 1).

For two groups of BERT-base — the FFN-up GEMM (K=768, N=3072, GELU epilogue, M = batch x sequence)
and the attention batched GEMM QKᵀ (K = head dim, M = N = sequence) — every valid configuration of
the family's search space is built and measured with the tuner's own objective (geometric mean of
the times at the sample shapes, each candidate in the measurement child process). That table is
the ground truth. Then TuRBO (:func:`tscomp.schedule.tuner.tune`), uniform random search and one
global GP (``skopt.gp_minimize``) each run 3 seeds with a budget of 10% of the space, replaying the
table as their objective (the same measurements, so the methods are compared on equal terms and
nothing is measured twice). Printed: per method and seed, the best configuration's throughput as a
fraction of the exhaustive best, and the acceptance check (TuRBO >= 95% of the exhaustive best on
every seed with <= 10% of the exhaustive trial count); written: a convergence plot and a JSON summary
(with the replay's wall time per method).

    .venv/bin/python -m benchmarks.tuner_search_quality --model .cache/models/bert-base-dynamo.onnx
    .venv/bin/python -m benchmarks.tuner_search_quality --replay-only --budget-fraction 0.1 --seeds 3

Run time: measuring a table happens once per group, target and ``--dim`` set (cached in
``.cache/bench/exhaustive-*.json``; ~950 configurations per group, each built and timed), and
nothing else may run on the machine meanwhile (it is a timing measurement). Replaying the cached
tables takes about 3 minutes on 2 cores (181 s on an AMD EPYC Zen 4, 2 groups x 3 methods x 3 seeds):
per seed ~1.5-2 s for TuRBO, milliseconds for random search and ~30 s for ``gp_minimize`` (a GP refit
with restarts on every call); loading the model adds a few seconds. ``--replay-only``
refuses to measure (an incomplete table is an error, e.g. after a change of the space or the key).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
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


def exhaustive(plan, choice, target, cache: Path, log, compile_only: bool = False,
               replay_only: bool = False) -> dict:
    """{space key (str): {"point", "value", "seconds"}} for every valid configuration (cached)."""
    from tscomp.codegen.build import build_object
    from tscomp.schedule.samples import group_inputs_at, sample_bindings

    fam, analysis = choice.family, choice.analysis
    space = fam.space(analysis, target)
    table = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [p for p in space.enumerate() if str(space.key(p)) not in table]
    log(f"{choice.group.name}: {len(space)} valid configurations, {len(todo)} to measure")
    if todo and replay_only:
        raise SystemExit(f"{cache} lacks {len(todo)} of the {len(space)} configurations "
                         f"(e.g. {space.key(todo[0])}) and --replay-only forbids measuring them")
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


def gp_minimize_search(space, objective, *, budget, seed: int = 0):
    """The global-GP baseline: ``skopt.gp_minimize`` itself, with its defaults (GP with Matern-5/2
    and Gaussian noise, ``gp_hedge`` acquisition, 10 random initial points, acquisition minimised
    over ``n_points=10000`` samples), over the axes' value indices (skopt's ``normalize`` transform
    of an index is the tuner's encoding, index / (len - 1)). Its ``space_constraint`` admits the
    space's valid points that are not measured yet, so every call is a distinct configuration and
    the trial budget is ``n_calls``. The objective it sees is the log of the time (as the tuner's
    GPs); a failed candidate would count as twice the worst time so far (the tables have none).

    Not :func:`tscomp.schedule.tuner.global_gp_search`: that one projects skopt's continuous asks
    onto the valid set and, when the projection hits a measured configuration, tells the GP that
    configuration again (up to 19 times per trial, each a full refit, three L-BFGS starts, on all
    the duplicates). On the FFN-up table the GP kept asking measured points: after 4 minutes one
    seed had told 323 observations for 56 of its 95 trials, each refit taking 2 s and growing (the
    replay that did not finish in 20+ minutes)."""
    from skopt import gp_minimize
    from skopt.space import Integer
    from tscomp.schedule.tuner import Trial, TuningResult

    free = [a for a in space.axes if len(a.values) > 1]
    fixed = {a.name: a.values[0] for a in space.axes if len(a.values) == 1}
    trials, measured, told = [], set(), [None]
    t0 = time.perf_counter()

    def point_of(x) -> dict:
        point = dict(fixed)
        point.update({a.name: a.values[int(i)] for a, i in zip(free, x)})
        return point

    # value indices of the free axes -> enumeration index (-1: invalid); the constraint is called
    # for each of the 10000 acquisition samples per trial, so it is a table look-up
    lut = np.full([len(a.values) for a in free], -1, dtype=np.int64)
    for index, point in enumerate(space.enumerate()):
        lut[tuple(a.values.index(point[a.name]) for a in free)] = index
    free_now = lut >= 0   # valid and not measured yet

    def admissible(x) -> bool:
        cell = tuple(x)
        if told[0] is not None and lut[cell] == told[0]:   # tell() checks the point it is told first
            told[0] = None
            return True
        return bool(free_now[cell])

    def func(x) -> float:
        point = point_of(x)
        index = space.index(point)
        assert index is not None and index not in measured, f"gp_minimize asked {point} again or invalid"
        measured.add(index)
        free_now[lut == index] = False
        told[0] = index
        value = float(objective(dict(point)))
        value = math.inf if math.isnan(value) else value
        trials.append(Trial(point, value, "gp", len(trials), None, time.perf_counter() - t0))
        if math.isfinite(value) and value > 0:
            return math.log(value)
        finite = [t.value for t in trials if math.isfinite(t.value) and t.value > 0]
        return math.log(2.0 * max(finite)) if finite else 0.0

    n_calls = min(budget.trials, len(space))
    if n_calls > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp_minimize(func, [Integer(0, len(a.values) - 1, name=a.name) for a in free], n_calls=n_calls,
                        n_initial_points=min(10, n_calls), space_constraint=admissible, random_state=seed)
    return TuningResult(trials, "gp")


def replay(space, table: dict, method: str, budget: int, seed: int) -> list[float]:
    """Best-so-far objective per trial of ``method`` run against the measured table."""
    from tscomp.schedule.tuner import Budget, random_search, tune

    def objective(point):
        return table[str(space.key(point))]["value"]   # a KeyError, never a measurement, on a miss

    run = {"turbo": tune, "random": random_search, "gp": gp_minimize_search}[method]
    result = run(space, objective, budget=Budget(trials=budget), seed=seed)
    assert len(result.trials) == budget, (method, len(result.trials), budget)
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
    ap.add_argument("--replay-only", action="store_true",
                    help="never measure: fail unless the cached exhaustive tables cover the spaces")
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
    summary = {"target": target.key(), "cpu": cpu_model(), "dims": dims, "budget_fraction": args.budget_fraction,
               "seeds": args.seeds, "groups": {}}
    accepted, t_replay = True, 0.0
    curves = {}
    for label, choice in groups.items():
        cache = ROOT / ".cache" / "bench" / (f"exhaustive-{label}-{choice.analysis.signature()}-{target.key()}-"
                                             f"{sha256_text(' '.join(dims))[:8]}.json")
        cache.parent.mkdir(parents=True, exist_ok=True)
        ex = exhaustive(plan, choice, target, cache, log, args.compile_only, args.replay_only)
        if args.compile_only:
            continue
        space, table = ex["space"], ex["table"]
        best = min(v["value"] for v in table.values())
        best_point = min(table.values(), key=lambda v: v["value"])["point"]
        budget = max(1, math.floor(args.budget_fraction * len(space)))
        rows, seconds = {}, {}
        for method in ("turbo", "random", "gp"):
            t0 = time.perf_counter()
            rows[method] = [replay(space, table, method, budget, seed) for seed in range(args.seeds)]
            seconds[method] = time.perf_counter() - t0
            log(f"  {label} {method}: {args.seeds} seeds replayed in {seconds[method]:.1f}s")
        t_replay += sum(seconds.values())
        curves[label] = (rows, best, budget, len(space))
        turbo = [best / c[-1] for c in rows["turbo"]]
        ok = min(turbo) >= 0.95 and budget <= 0.10 * len(space)
        accepted &= ok
        summary["groups"][label] = {
            "group": choice.group.name, "space": len(space), "budget": budget, "exhaustive_best_us": best * 1e6,
            "exhaustive_best": space.config(best_point).describe(),
            "fraction_of_best": {m: [best / c[-1] for c in rows[m]] for m in rows},
            "trials_to_95": {m: [next((n + 1 for n, v in enumerate(c) if best / v >= 0.95), None) for c in rows[m]]
                             for m in rows},
            "replay_seconds": seconds,
            "turbo_meets_95_on_every_seed": ok,
        }
        print(f"\n{label} ({choice.group.name}): {len(space)} configurations, exhaustive best {best * 1e6:.1f} us "
              f"({space.config(best_point).describe()}); budget {budget} trials = "
              f"{100 * budget / len(space):.1f}% of exhaustive")
        print(f"  {'method':<8} " + " ".join(f"seed {s:<5}" for s in range(args.seeds)) + "  mean")
        for m, cs in rows.items():
            fr = [best / c[-1] for c in cs]
            print(f"  {m:<8} " + " ".join(f"{f:>10.3f}" for f in fr) + f"  {np.mean(fr):.3f}")
        print(f"  TuRBO >= 95% of the exhaustive best on every seed with {budget} <= 10% of {len(space)} trials: "
              f"{'yes' if ok else 'NO'} (worst seed {min(turbo):.3f})")
    if args.compile_only:
        return 0
    summary["replay_seconds"] = t_replay
    summary["accepted"] = accepted
    print(f"\nreplay: {t_replay:.0f}s; acceptance (both groups, every seed): {'yes' if accepted else 'NO'}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tuner_search_quality.json").write_text(json.dumps(summary, indent=1))
    plot(curves, Path(args.plot))
    print(f"\nplot: {args.plot}\nsummary: {RESULTS / 'tuner_search_quality.json'}")
    return 0


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (Linux), e.g. "AMD EPYC (family 25,
    model 17)": a virtual machine's model name can be as vague as that."""
    try:
        info = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
        return f"{info['model name']} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"
    except (OSError, KeyError):
        import platform
        return platform.processor() or platform.machine()


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
