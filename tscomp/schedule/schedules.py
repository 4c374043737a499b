"""The schedule stage: per fused group and target, which tile configurations the artifact keeps
(TSCompiler §5.1 "replay the exploration ... to gather a collection of high-performance tile size
configurations", §6 the single-wave times the runtime's cost model scales).

Input: the Plan and, per group, the kernel family that accepted it with its analysis
(:func:`tscomp.codegen.families.choose_family`). Output: :class:`Schedules` — per group the chosen
configurations, each with its times at the sample shapes, and where they came from:

* ``turbo``     — tuned here: trust-region Bayesian search (:func:`tscomp.schedule.tuner.tune`) over
  the family's search space, each candidate built and measured in a child process at the sample
  shapes (:mod:`tscomp.schedule.samples`); the objective is the geometric mean of those times
  (DietCode §4.2's shape-generic objective; the geometric mean weighs a 2x loss at L=4 like one at
  L=512);
* ``record``    — reused from a tuning record (same family, group signature and target);
* ``heuristic`` — the family's hardware-aligned candidates, untuned (``--no-tune``);
* ``single``    — the family has nothing to configure (row and elementwise loop nests);
* ``analytic``  — a target that is not present (a CUDA architecture, :func:`schedule_analytic`):
  the family's configurations ranked by the analytic model (:mod:`tscomp.schedule.gpu_space`),
  never measured; each kept variant carries the model's prediction.

Groups with the same signature (BERT's 12 identical layers) are tuned once and share the result.
The trials and the time go where a request spends its time: a probe trial per group, then
shares of both by each group's probed share of a request's time (:mod:`tscomp.schedule.time_split`).
The kept set is *diverse*: greedily, the configuration that most reduces the summed log-loss against
the best time seen at each sample shape, so each kept variant is the best somewhere in the range.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from tscomp.codegen.tile_config import TileConfig, TileConfigError
from tscomp.errors import TscompError, UnsupportedOperatorError
from tscomp.graph.fusion.plan import Plan
from tscomp.runtime.wave import sample_point
from tscomp.schedule.cold_start import data_key, evict_bytes, refill_seconds, resident
from tscomp.schedule.samples import group_inputs_at, sample_bindings
from tscomp.schedule.target import Target
from tscomp.schedule.time_split import group_weights, lifted, share, tuning_order

#: trials per distinct tunable group on average when no budget is given (the heuristic's ~8
#: candidates, then TuRBO); with ~7 distinct GEMM groups in BERT-base that is ~170 builds and
#: measurements
DEFAULT_TRIALS = 24
#: wall-clock seconds a compile may spend tuning when no budget is given
DEFAULT_SECONDS = 420.0

Sample = tuple  # (shape size, tasks, seconds, heaviest task's work, task classes): runtime.wave.sample_point


@dataclass
class ScheduledVariant:
    config: TileConfig | Any | None        # a family's configuration (None: its one strategy)
    samples: list[Sample] | None = None    # measured while tuning; None: measure before dispatch
    value: float | None = None             # the objective (geometric mean seconds) if tuned
    #: a target that is not present (GPU): the analytic model's prediction instead of measurements
    #: (occupancy, blocks per wave, estimated resources, predicted cycles per sample extent)
    model: dict | None = None
    #: measured on a GPU present at compile time: milliseconds per sample shape (schedule.gpu_measure)
    timings: dict | None = None

    def to_json(self) -> dict:
        if self.model is not None:
            return {"config": None if self.config is None else self.config.to_json(), "measured": False,
                    **self.model}
        out: dict[str, Any] = {"config": None if self.config is None else vars(self.config).copy()}
        if self.value is not None:
            out["objective_us"] = round(self.value * 1e6, 3)
        if self.timings is not None:
            out["measured_ms"] = dict(self.timings)
        return out


@dataclass
class GroupSchedule:
    group: str
    family: str
    signature: str
    method: str                            # turbo | record | heuristic | single | fallback | analytic | measured-gpu
    variants: list[ScheduledVariant]
    trials: int = 0
    space_size: int = 0
    seconds: float = 0.0
    shared_with: str | None = None         # the group whose tuning this one reuses
    measured: bool = True                  # False: ranked by a model (method "analytic"), never timed
    #: analytic schedules: the next-ranked configurations, best first (a variant the build rejects,
    #: e.g. for spilling registers, is replaced by the first that fits), and the top of the ranking
    reserve: list[ScheduledVariant] = field(default_factory=list)
    ranking: list[dict] = field(default_factory=list)

    def provenance(self) -> dict:
        out = {"method": self.method, "signature": self.signature, "trials": self.trials}
        if self.space_size:
            out["space_size"] = self.space_size
        if self.shared_with:
            out["tuned_on"] = self.shared_with
        if not self.measured:
            out["measured"] = False
        return out


@dataclass
class Schedules:
    target: Target
    groups: dict[str, GroupSchedule]
    objective: str = ""
    seconds: float = 0.0

    def summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.groups.values():
            out[s.method] = out.get(s.method, 0) + 1
        return out

    def to_json(self) -> dict:
        return {"target": self.target.to_json(), "objective": self.objective, "seconds": round(self.seconds, 2),
                "methods": self.summary()}


@dataclass
class TuningOptions:
    """How the schedule stage chooses configurations."""
    tune: bool = True
    #: per distinct tunable group on average: the compile's trials are this x its distinct groups,
    #: split among them as the time is (by each group's probed share of a request's time: schedule.time_split)
    trials: int | None = DEFAULT_TRIALS
    seconds: float | None = DEFAULT_SECONDS      # for the whole compile
    max_variants: int = 4
    records: Any = None                          # a RecordStore to reuse and extend
    isolate: bool = True                         # measure candidates in a child process
    timeout_s: float = 60.0
    seed: int = 0
    progress: bool | Callable = False


class ScheduleError(TscompError):
    """The schedule stage could not produce a configuration for a group."""


# ---------------------------------------------------------------------------- the stage
def schedule_plan(plan: Plan, choices: dict, target: Target, options: TuningOptions | None = None,
                  log: Callable[[str], None] | None = None) -> Schedules:
    """Schedules for every group of ``plan`` (``choices``: group name -> FamilyChoice)."""
    options = options or TuningOptions(tune=False)
    t0 = time.perf_counter()
    bindings = sample_bindings(plan)
    objective = "geometric mean over " + ", ".join(
        "{" + ", ".join(f"{k}={v}" for k, v in b.items()) + "}" for b in bindings)
    placed: dict[str, GroupSchedule] = {}       # groups with nothing to tune
    first_of: dict[str, str] = {}               # signature -> the group it is scheduled on
    by_signature: dict[str, GroupSchedule] = {}
    searches: dict[str, _GroupSearch] = {}      # signature -> its search, where one runs
    occurrences: dict[str, int] = {}
    evict = evict_bytes(plan, target)         # weights arrive cold in the private caches: time them so
    cached_data = resident(plan, target) and not evict   # weights stay cached between requests: switches cost
    measurer = None
    try:
        for name, choice in choices.items():
            fam = choice.family
            if fam is None:
                placed[name] = GroupSchedule(name, "numpy", "-", "fallback", [ScheduledVariant(None)])
                continue
            if not fam.tunable:     # nothing to search; a family may still offer several strategies
                variants = [ScheduledVariant(c) for c in fam.heuristic(choice.analysis, target, options.max_variants)]
                placed[name] = GroupSchedule(name, fam.name, "-", "single", variants) if len(variants) < 2 else \
                    GroupSchedule(name, fam.name, _signature(choice), "heuristic", variants)
                continue
            sig = _signature(choice)
            occurrences[sig] = occurrences.get(sig, 0) + 1
            if sig in first_of:       # scheduled once, on its first group, below
                continue
            first_of[sig] = name
            if not options.tune:
                by_signature[sig] = _heuristic_schedule(choice, sig, target, options.max_variants)
                continue
            recorded = _from_record(options.records, choice, sig, target, options.max_variants)
            if recorded is not None:
                by_signature[sig] = recorded
                continue
            if measurer is None:
                measurer = _measurer(options, target)
            searches[sig] = _GroupSearch(plan, choice, sig, target, bindings, options, measurer, cached_data, evict)
        for sig, sched in _run_searches(searches, occurrences, options, t0, log).items():
            if sched.method == "turbo":       # not a group the spent budget left untuned
                _remember(options.records, sched, target, objective)
            by_signature[sig] = sched
    finally:
        if measurer is not None:
            measurer.close()
    out: dict[str, GroupSchedule] = {}
    for name, choice in choices.items():      # in Plan order
        if name in placed:
            out[name] = placed[name]
            continue
        sig = _signature(choice)
        first = by_signature[sig]
        sched = first if first_of[sig] == name else \
            GroupSchedule(name, first.family, sig, first.method, first.variants, first.trials, first.space_size, 0.0,
                          shared_with=first.group)
        out[name] = with_strategies(sched, choice, target)
    return Schedules(target, out, objective, time.perf_counter() - t0)


#: trials per group in the probe pass (:mod:`tscomp.schedule.time_split`)
PROBE_TRIALS = 1


def _run_searches(searches: dict[str, "_GroupSearch"], occurrences: dict[str, int], options: TuningOptions,
                  t0: float, log) -> dict[str, GroupSchedule]:
    """Run every group's search within the options' budget: ``options.trials`` per group on
    average and ``options.seconds`` for all, split by what each group costs a request
    (:mod:`tscomp.schedule.time_split`): a probe trial each, then heaviest first, each its share
    of the trials and of the time left. Returns signature -> schedule, each made (and logged) as
    its search ends."""
    def left() -> float | None:
        return None if options.seconds is None else max(0.0, options.seconds - (time.perf_counter() - t0))

    done: dict[str, GroupSchedule] = {}
    if len(searches) < 2:
        for sig, search in searches.items():
            search.run(options.trials, left())
            done[sig] = search.schedule(log)
        return done
    probe = PROBE_TRIALS if options.trials is None else min(PROBE_TRIALS, options.trials)
    for search in searches.values():
        if left() is not None and left() <= 0:
            break
        search.run(probe, left())
    weights = lifted(group_weights({s: occurrences[s] for s in searches},
                                   {s: search.best_sample_seconds for s, search in searches.items()}))
    order = tuning_order(weights)
    if log:
        total = sum(weights.values())
        log(f"probed {len(searches)} groups in {time.perf_counter() - t0:.0f}s; their trials and time split by "
            f"each one's share of a request's time, heaviest first: "
            + ", ".join(f"{searches[s].group} {weights[s] / total:.0%}" for s in order[:6])
            + (", ..." if len(order) > 6 else ""))
    all_trials = None if options.trials is None else options.trials * len(searches)
    for i, sig in enumerate(order):
        search, remaining = searches[sig], [weights[s] for s in order[i:]]
        trials = None
        if all_trials is not None:
            unspent = all_trials - sum(len(s.trials) for s in searches.values())
            trials = len(search.trials) + max(0, round(share(unspent, weights[sig], remaining)))
        seconds = None if options.seconds is None else share(left(), weights[sig], remaining)
        search.run(trials, seconds)
        done[sig] = search.schedule(log)
    return done


def _heuristic_schedule(choice, sig: str, target: Target, max_variants: int) -> GroupSchedule:
    """The family's hardware-aligned configurations, untuned."""
    cfgs = choice.family.heuristic(choice.analysis, target, max_variants)
    return GroupSchedule(choice.group.name, choice.family.name, sig, "heuristic", [ScheduledVariant(c) for c in cfgs])


def with_strategies(sched: GroupSchedule, choice, target: Target) -> GroupSchedule:
    """``sched`` with the family's other algorithms for this group appended (untuned: the dispatch
    measures them beside the tiles and picks per shape)."""
    extra = choice.family.strategies(choice.analysis, target) if choice.family.strategies else []
    if not extra:
        return sched
    return replace(sched, variants=[*sched.variants, *(ScheduledVariant(c) for c in extra)])


def schedule_analytic(plan: Plan, choices: dict, target: Target, max_variants: int = 2,
                      reserve: int = 40) -> Schedules:
    """The schedule stage for a target that is not present to measure on (``target.measurable`` is
    False: a CUDA architecture here), TSCompiler §5.1/§6 without a GPU, FTuner §III-IV: per group the
    family's analytic space (``choice.family.space(analysis, target)``, e.g.
    :class:`~tscomp.schedule.gpu_space.GpuGemmSpace`; None for a family with nothing to configure)
    ranks its configurations with the cost model; the schedule keeps ``space.variants(max_variants)``
    (the best-ranked plus per-sample winners), each with the model's prediction, and the next
    ``reserve`` ranked ones for the build to fall back on. Method ``analytic``, ``measured`` False.
    Groups with the same signature share one ranking. ``choices``: group name -> an object with
    ``group``, ``family`` (``name``, ``space``; None: no family) and ``analysis``."""
    if target.measurable:
        raise ScheduleError(f"schedule_analytic ranks for a target that cannot be measured; {target.key()} can be "
                            f"(use schedule_plan)")
    t0 = time.perf_counter()
    out: dict[str, GroupSchedule] = {}
    ranked: dict[str, GroupSchedule] = {}
    for name, choice in choices.items():
        fam = choice.family
        if fam is None:
            out[name] = GroupSchedule(name, "numpy", "-", "fallback", [ScheduledVariant(None)], measured=False)
            continue
        space = fam.space(choice.analysis, target) if fam.space is not None else None
        if space is None:
            out[name] = GroupSchedule(name, fam.name, "-", "single", [ScheduledVariant(None)], measured=False)
            continue
        sig = _signature(choice)
        first = ranked.get(sig)
        if first is not None:
            out[name] = GroupSchedule(name, fam.name, sig, "analytic", list(first.variants), 0, first.space_size,
                                      shared_with=first.group, measured=False, reserve=list(first.reserve),
                                      ranking=first.ranking)
            continue
        t1 = time.perf_counter()
        order = space.rank()
        if not order:
            raise ScheduleError(f"group {name}: the {fam.name} space on {target.key()} has no feasible configuration")
        by_tile = {r.tile: r for r in order}
        picks = space.variants(max_variants, order)
        samples = space.samples()

        def variant(tile, by_tile=by_tile, space=space, samples=samples):
            r = by_tile[tile]
            model = {k: v for k, v in r.to_json().items() if k not in ("tile", "measured")}
            model["predicted_cycles"] = {str(m): round(space.cost(tile, m), 1) for m in samples}
            return ScheduledVariant(tile, model=model)
        sched = GroupSchedule(name, fam.name, sig, "analytic", [variant(t) for t in picks], 0, len(order),
                              time.perf_counter() - t1, measured=False,
                              reserve=[variant(r.tile) for r in order[:reserve] if r.tile not in picks],
                              ranking=[r.to_json() for r in order[:5]])
        ranked[sig] = sched
        out[name] = sched
    return Schedules(target, out, "analytic cost model (cycles) over the samples of each group's dynamic extent",
                     time.perf_counter() - t0)


def _signature(choice) -> str:
    return f"{choice.family.name}:{choice.analysis.signature()}"


def _measurer(options: TuningOptions, target: Target):
    from tscomp.schedule.measure import Measurer, measure_inline

    if options.isolate:
        return Measurer(threads=target.threads, timeout_s=options.timeout_s)
    return _InlineMeasurer(measure_inline)


class _InlineMeasurer:
    """The in-process path (no isolation): for tests and for hosts where spawning is not wanted."""

    def __init__(self, fn):
        self.fn = fn

    def measure(self, candidate, workload):
        return self.fn(candidate, workload)

    def close(self):
        pass


class _GroupSearch:
    """One group's tile search, resumable: :meth:`run` extends it (a later run starts from every
    trial so far, measured again never), :meth:`schedule` keeps the diverse set of what it found."""

    def __init__(self, plan: Plan, choice, sig: str, target: Target, bindings, options: TuningOptions, measurer,
                 cached_data: bool = False, evict: int = 0):
        from tscomp.schedule.measure import Workload

        self.choice, self.sig, self.target, self.options = choice, sig, target, options
        self.group = choice.group.name
        self.space = choice.family.space(choice.analysis, target)
        if len(self.space) == 0:
            raise ScheduleError(f"group {self.group}: the {choice.family.name} search space is empty on {target.key()}")
        rng = np.random.default_rng(options.seed)
        self.bindings = bindings
        self.workload = Workload(sig, [(b, group_inputs_at(plan, choice.group, b, rng)) for b in bindings], evict)
        self.measurer, self.cached_data = measurer, cached_data
        self.per_sample: dict[tuple, list[Sample]] = {}
        self.data: dict[tuple, tuple | None] = {}      # the constant data each candidate streams (cached_data only)
        self.errors: list[str] = []
        self.refusals = 0              # builds the family refused (the group, not the configuration)
        self.trials: list = []         # every trial so far (tuner.Trial)
        self.seconds = 0.0

    def measured(self) -> list:
        """The trials so far that were measured at every sample shape (not failed)."""
        return [t for t in self.trials if math.isfinite(t.value) and self.space.key(t.point) in self.per_sample]

    @property
    def best_sample_seconds(self) -> list[float] | None:
        """The best trial's seconds at each sample shape (None: none measured)."""
        ok = self.measured()
        if not ok:
            return None
        best = min(ok, key=lambda t: t.value)
        return [s[2] for s in self.per_sample[self.space.key(best.point)]]

    def objective(self, point: dict) -> float:
        fam = self.choice.family
        try:
            cfg = self.space.config(point)
            kernel = fam.build(self.choice.analysis, cfg, self.target)
        except TscompError as exc:          # a build that fails costs one trial
            self.errors.append(f"{point}: {exc}")
            self.refusals += isinstance(exc, UnsupportedOperatorError)
            return math.inf
        m = self.measurer.measure(kernel, self.workload)
        if not m.ok:
            self.errors.append(f"{point}: {m.error}")
            return math.inf
        self.per_sample[self.space.key(point)] = [sample_point(kernel, b, t) for b, t in zip(self.bindings, m.seconds)]
        if self.cached_data:
            self.data[self.space.key(point)] = data_key(kernel)
        return float(np.exp(np.mean(np.log(np.maximum(m.seconds, 1e-9)))))

    def run(self, trials: int | None, seconds: float | None) -> None:
        """Search on until ``trials`` in all (these included) or ``seconds`` more of wall time."""
        from tscomp.schedule.tuner import Budget, tune

        t0 = time.perf_counter()
        known = {self.space.key(t.point): t.value for t in self.trials}
        result = tune(self.space, self.objective, budget=Budget(trials=trials, seconds=seconds), seed=self.options.seed,
                      progress=self.options.progress, initial_values=known)
        self.trials = result.trials
        self.seconds += time.perf_counter() - t0

    def schedule(self, log) -> GroupSchedule:
        choice, space, target, options = self.choice, self.space, self.target, self.options
        fam, group = choice.family, choice.group
        if not self.trials:       # the compile's tuning time was spent before this group's turn
            if log:
                log(f"{group.name} ({fam.name}): no tuning time left; the family's heuristic tiles")
            return _heuristic_schedule(choice, self.sig, target, options.max_variants)
        ok = self.measured()
        if not ok and self.refusals == len(self.trials):
            # a refusal that surfaces only while the source is generated (DiffLlama's QDQ export reads
            # the batched GEMM's result through a view no store can follow): the same schedule as an
            # untuned compile, whose source generation then sends the group to the numpy fallback
            # with the family's reason (compiler.generate_sources) -- a tuned compile once aborted here
            if log:
                log(f"{group.name} ({fam.name}): every candidate refused ({self.errors[0]}); the family's heuristic tiles")
            return _heuristic_schedule(choice, self.sig, target, options.max_variants)
        if not ok:
            raise ScheduleError(f"group {group.name}: every one of {len(self.trials)} candidates failed "
                                f"({'; '.join(self.errors[:3])})")
        # a further variant reading other bytes pays for bringing them in (cold_start)
        switch = [_switch_cost(self.data.get(space.key(t.point)), target) for t in ok] if self.cached_data else None
        keep = diverse_set([(t.point, self.per_sample[space.key(t.point)], t.value) for t in ok], options.max_variants,
                           switch=switch)
        variants = [ScheduledVariant(space.config(p), samples, value) for p, samples, value in keep]
        if log:
            best = keep[0]
            log(f"{group.name} ({fam.name}, {len(space)} configurations): {len(self.trials)} trials in "
                f"{self.seconds:.0f}s, best {space.config(best[0]).describe()} "
                f"{best[2] * 1e6:.0f} us; kept {len(keep)}" + (f"; {len(self.errors)} failed" if self.errors else ""))
        return GroupSchedule(group.name, fam.name, self.sig, "turbo", variants, len(self.trials), len(space),
                             self.seconds)


def _switch_cost(key: tuple[str, int] | None, target: Target) -> tuple[str | None, float]:
    """(data digest, seconds to bring that data in) of a candidate; (None, 0) if it streams none."""
    return (None, 0.0) if key is None else (key[0], refill_seconds(key[1], target))


#: the least a further variant must cut Σ_shapes log(time) by to be kept: log(1.03), a 3% gain at one
#: sample shape. A smaller gain is within this machine's timing noise, and every variant has costs
#: a gain that small does not repay: the runtime switching to a variant whose code and packed
#: weights went cold (a never-seen shape's first call), a wrong pick when its predicted margin is
#: noise, a larger artifact
MIN_VARIANT_GAIN = math.log(1.03)


def diverse_set(trials: list[tuple[dict, list[Sample], float]], k: int,
                min_gain: float = MIN_VARIANT_GAIN,
                switch: list[tuple[Any, float]] | None = None) -> list[tuple[dict, list[Sample], float]]:
    """Up to ``k`` trials, best objective first, then greedily the one that most reduces
    Σ_shapes log(min time in the set / best time seen at that shape); stops when the best addition
    would cut that sum by less than ``min_gain``. ``switch`` (per trial: the key of the data it
    streams, None for none, and the seconds a switch to it costs while that data is cold;
    :mod:`tscomp.schedule.cold_start`): a trial whose data no chosen one shares counts those seconds
    on top of its time at every shape, so it is kept only where it gains more than its cold start."""
    if not trials:
        return []
    times = np.array([[s[2] for s in samples] for _, samples, _ in trials])
    best = times.min(axis=0)
    chosen = [int(np.argmin([v for _, _, v in trials]))]
    held = {switch[chosen[0]][0]} if switch else set()
    while len(chosen) < k:
        current = times[chosen].min(axis=0)
        cold = np.array([0.0 if switch is None or switch[j][0] is None or switch[j][0] in held else switch[j][1]
                         for j in range(len(trials))])
        loss = np.log(np.minimum(times + cold[:, None], current) / best).sum(axis=1)
        j = int(np.argmin(loss))
        if loss[j] > np.log(current / best).sum() - max(min_gain, 1e-3) or j in chosen:
            break
        chosen.append(j)
        if switch:
            held.add(switch[j][0])
    return [trials[j] for j in chosen]


# ---------------------------------------------------------------------------- records
def _from_record(records, choice, sig: str, target: Target, max_variants: int) -> GroupSchedule | None:
    """The recorded configurations of this group, at most ``max_variants`` of them (a record keeps
    its diverse set in the order it was chosen: best objective first, so a prefix is still diverse)."""
    if records is None:
        return None
    rec = records.get(choice.family.name, sig, target.key())
    if rec is None:
        return None
    variants = [ScheduledVariant(TileConfig(**c), None, v)
                for c, v in list(zip(rec.configs, rec.values))[:max(1, max_variants)]]
    if not all(_fits(choice, v.config, target) for v in variants):
        return None         # written for an earlier form of the family's kernels: tune again
    return GroupSchedule(choice.group.name, choice.family.name, sig, "record", variants, rec.trials)


def _fits(choice, cfg: TileConfig, target: Target) -> bool:
    """Whether the family still generates a kernel for ``cfg`` on ``target`` (source generation is
    pure and cheap; a configuration it refuses raises :class:`TileConfigError`)."""
    try:
        choice.family.source(choice.analysis, cfg, target)
    except TileConfigError:
        return False
    return True


def _remember(records, sched: GroupSchedule, target: Target, objective: str) -> None:
    if records is None:
        return
    from tscomp.schedule.records import TuningRecord

    records.put(TuningRecord(family=sched.family, signature=sched.signature, target=target.key(),
                             configs=[vars(v.config).copy() for v in sched.variants],
                             values=[float(v.value) for v in sched.variants], trials=sched.trials,
                             method=sched.method, objective=objective,
                             created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))


__all__ = ["DEFAULT_SECONDS", "DEFAULT_TRIALS", "GroupSchedule", "ScheduleError", "ScheduledVariant", "Schedules",
           "TuningOptions", "diverse_set", "schedule_analytic", "schedule_plan"]
