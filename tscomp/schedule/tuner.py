"""The schedule tuner: trust-region Bayesian optimisation over a discrete space, plus the two
baselines it is judged against (uniform random search and one global GP).

TSCompiler §5.1 ("Bayesian-based design space exploration") explores the hardware-aligned tile
space with TuRBO (Eriksson et al., NeurIPS 2019, the paper's ref. 16), which :func:`tune` follows:

1. The hardware-aligned initial population (Roller-style candidates from the family's space) is
   measured first; already known measurements (``initial_values``, e.g. from a tuning record)
   count as trials without being measured again.
2. Several trust regions — boxes of side L in the encoded unit cube — are opened around the best
   distinct starting points; each keeps its own local Gaussian process (scikit-optimize's
   regressor, Matern-5/2 + white noise, on log time) fitted to the trials in or nearest its box.
3. Each round every region draws candidates in its box, projects them to the nearest *valid*
   configuration (§5.1's post-iteration projection; the hard constraints prune) and takes a joint
   Thompson sample of its posterior over them. The batch is allocated across regions as a
   multi-armed bandit, ``x ∈ min_i argmin_{x ∈ TR_i} f_i, f_i ~ GP_i``: the region whose sampled
   minimum is lowest gets the slot.
4. After measuring, a region expands (L×2) after ``succ_tol`` consecutive improvements and shrinks
   (L/2) after ``fail_tol`` consecutive failures; its centre follows its best point. A region that
   collapses (L < L_min) or has nothing unmeasured left in its box restarts elsewhere.

The objective is whatever the caller measures — for the GEMM families the time summed over a few
sample shapes of the dynamic axis, DietCode §4.2's shape-generic objective — in seconds, lower is
better, ``math.inf`` for a candidate that failed (crashed, hung, wrong). No point is measured twice.
"""
from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from tscomp.schedule.space import DiscreteSpace

#: TuRBO's defaults, in the encoded unit cube
LENGTH_INIT = 0.4
LENGTH_MAX = 1.0
SUCC_TOL = 3
#: an improvement must beat the region's best by this fraction (measurement noise is not progress)
IMPROVEMENT = 1e-3
#: candidates scored by each region's Thompson sample per round
N_BOX_SAMPLES = 128
N_PERTURBED = 64
N_ENUMERATED = 128
MAX_CANDIDATES = 384
#: the most (nearest) trials a local GP is fitted on, and the fewest
MAX_TRAIN = 200
MIN_TRAIN = 6


# -- budget, trials, results -------------------------------------------------------------------

@dataclass
class Budget:
    """Stop after ``trials`` measurements or ``seconds`` of wall time, whichever comes first."""
    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self):
        if self.trials is None and self.seconds is None:
            raise ValueError("a tuning budget needs trials or seconds (or both)")
        if self.trials is not None and self.trials < 0:
            raise ValueError(f"trial budget must be >= 0, got {self.trials}")
        if self.seconds is not None and self.seconds < 0:
            raise ValueError(f"time budget must be >= 0, got {self.seconds}")


@dataclass
class Trial:
    """One measured (or known) configuration. ``source``: "known" (given value), "initial"
    (hardware-aligned population), "turbo", "restart" (a restarted region's new centre), "random",
    "gp" (global-GP baseline). ``region``: the trust region that proposed it."""
    point: dict[str, int]
    value: float
    source: str
    round: int
    region: int | None
    seconds_since_start: float


@dataclass
class TuningResult:
    trials: list[Trial]
    method: str = "turbo"

    def best(self) -> Trial:
        if not self.trials:
            raise ValueError("no trials were run")
        return min(self.trials, key=lambda t: t.value)

    def best_so_far(self) -> list[float]:
        """Running minimum of the value, one entry per trial (a convergence curve)."""
        out, best = [], math.inf
        for t in self.trials:
            best = min(best, t.value)
            out.append(best)
        return out

    def top(self, k: int, *, distinct_by: Callable[[dict[str, int]], object] | None = None) -> list[Trial]:
        """The ``k`` best successful trials, best first; with ``distinct_by``, at most one per
        key it returns (e.g. per block tile, to keep the kept variants diverse)."""
        out, seen = [], set()
        for t in sorted((t for t in self.trials if math.isfinite(t.value)), key=lambda t: t.value):
            if distinct_by is not None:
                key = distinct_by(t.point)
                if key in seen:
                    continue
                seen.add(key)
            out.append(t)
            if len(out) >= k:
                break
        return out

    def __len__(self) -> int:
        return len(self.trials)


# -- one trust region --------------------------------------------------------------------------

@dataclass
class TrustRegion:
    """A TuRBO trust region: a box of side ``length`` around ``center`` in the unit cube, with its
    run of consecutive successes and failures. ``best_index``/``best_value``: its best point (an
    index into the space's enumeration) and that point's value."""
    center: np.ndarray
    length: float = LENGTH_INIT
    length_min: float = 1 / 16
    length_max: float = LENGTH_MAX
    succ_tol: int = SUCC_TOL
    fail_tol: int = 4
    successes: int = 0
    failures: int = 0
    best_index: int | None = None
    best_value: float = math.inf
    #: True while the centre was chosen by a restart and has not been measured yet
    pending_center: bool = False
    #: the local GP's last fitted kernel (warm start for the next fit) and the fitted model with
    #: the trials it saw (reused while they do not change); not part of the trust-region logic
    kernel: object = field(default=None, repr=False, compare=False)
    model: tuple | None = field(default=None, repr=False, compare=False)

    def record(self, improved: bool) -> None:
        """Count one measurement of this region's proposal; grow or shrink the box."""
        if improved:
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1
        if self.successes >= self.succ_tol:
            self.length = min(2.0 * self.length, self.length_max)
            self.successes = 0
        elif self.failures >= self.fail_tol:
            self.length /= 2.0
            self.failures = 0

    @property
    def collapsed(self) -> bool:
        return self.length < self.length_min

    def box(self, min_half: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) corners, clipped to the cube. ``min_half`` widens the half-side per axis
        (the tuner passes one grid step so a small box still reaches its neighbours)."""
        half = np.maximum(self.length / 2.0, min_half)
        return np.clip(self.center - half, 0.0, 1.0), np.clip(self.center + half, 0.0, 1.0)

    def contains(self, xs: np.ndarray, min_half: np.ndarray | float = 0.0) -> np.ndarray:
        lo, hi = self.box(min_half)
        eps = 1e-9  # grid points exactly on the box's face are inside
        return np.all((xs >= lo - eps) & (xs <= hi + eps), axis=1)


# -- bookkeeping shared by the three searches ---------------------------------------------------

class _Progress:
    """tqdm bar (``True``), a callback ``(done, total, best)``, or nothing."""

    def __init__(self, progress, total: int | None, desc: str):
        self.callback = progress if callable(progress) else None
        self.bar = None
        if progress is True:
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=desc, unit="trial", file=sys.stderr, leave=False)
        self.total = total

    def update(self, done: int, best: float) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"best {best * 1e3:.3f} ms" if math.isfinite(best) else "best -")
        if self.callback is not None:
            self.callback(done, self.total, best)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Run:
    """The trials of one search: measures through ``objective``, never twice, within the budget."""

    def __init__(self, space: DiscreteSpace, objective, budget: Budget, progress, desc: str):
        self.space, self.objective, self.budget = space, objective, budget
        self.trials: list[Trial] = []
        self.values: dict[int, float] = {}  # enumeration index -> value
        self.mask = np.zeros(len(space), dtype=bool)  # the same, as a mask over the enumeration
        self.start = time.perf_counter()
        self.best = math.inf
        self.progress = _Progress(progress, budget.trials, desc)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> int:
        """Trials still allowed (the trial budget, the unmeasured points), ignoring time."""
        left = len(self.space) - len(self.values)
        if self.budget.trials is not None:
            left = min(left, self.budget.trials - len(self.trials))
        return max(0, left)

    def done(self) -> bool:
        if self.remaining() == 0:
            return True
        return self.budget.seconds is not None and self.elapsed() >= self.budget.seconds

    def measured(self, index: int) -> bool:
        return index in self.values

    def add(self, index: int, source: str, round_: int, region: int | None,
            value: float | None = None) -> float:
        """Measure the ``index``-th valid point (or take the known ``value``) and log the trial."""
        assert index not in self.values, "a point is never measured twice"
        point = self.space.point_at(index)
        assert self.space.is_valid(point), f"proposed an invalid point {point}"
        if value is None:
            value = self.objective(dict(point))
        value = float(value)
        if math.isnan(value):
            value = math.inf
        self.values[index] = value
        self.mask[index] = True
        self.trials.append(Trial(point, value, source, round_, region, self.elapsed()))
        self.best = min(self.best, value)
        self.progress.update(len(self.trials), self.best)
        return value

    def result(self, method: str) -> TuningResult:
        self.progress.close()
        return TuningResult(self.trials, method)


def _log_targets(values: np.ndarray) -> np.ndarray:
    """GP targets: log of the value (times span decades); failures become twice the worst
    finite value so the model learns to avoid them without an infinite target."""
    finite = values[np.isfinite(values)]
    worst = finite.max() if finite.size else 1.0
    fill = 2.0 * worst if worst > 0 else worst + abs(worst) + 1.0
    y = np.where(np.isfinite(values), values, fill)
    if np.all(y > 0):
        return np.log(y)
    return y  # a synthetic objective with non-positive values: model it as is


def _fit_gp(X: np.ndarray, y: np.ndarray, seed: int, kernel=None):
    """A local GP (scikit-optimize's regressor: Matern-5/2 with ARD length scales, white noise,
    normalised targets), its hyperparameters started from ``kernel`` (the region's last fit) when
    given. None when the data cannot support one."""
    if len(X) < 2 or np.ptp(y) == 0.0:
        return None
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
    d = X.shape[1]
    if kernel is None:
        kernel = (ConstantKernel(1.0, (1e-2, 1e2))
                  * Matern(length_scale=np.full(d, 0.5), length_scale_bounds=(0.01, 20.0), nu=2.5)
                  + WhiteKernel(1e-3, (1e-6, 1e-1)))
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=True, n_restarts_optimizer=0,
                                  optimizer=_short_lbfgs, random_state=seed)
    with warnings.catch_warnings():  # hyperparameters at their bounds are routine on tiny data
        warnings.simplefilter("ignore")
        try:
            gp.fit(X, y)
        except (ValueError, np.linalg.LinAlgError):
            return None
    return gp


def _few_blas_threads():
    """The GPs' matrices are small: one BLAS thread is faster, and it does not fight the
    measurements (or a loaded machine) for cores."""
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1, user_api="blas")


def _short_lbfgs(obj_func, initial_theta, bounds):
    """sklearn's default hyperparameter fit with fewer iterations: a warm-started local GP moves
    little between rounds, and the tuner refits every round."""
    from scipy.optimize import minimize
    res = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                   options={"maxiter": 50})
    return res.x, res.fun


def _thompson(gp, C: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` joint posterior samples over the candidates ``C`` (shape ``len(C) × n``); random
    scores when there is no model (every candidate equally promising). Cholesky with growing
    jitter rather than sklearn's ``sample_y`` (an SVD, several times slower)."""
    if gp is None:
        return rng.random((len(C), n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mean, cov = gp.predict(C, return_cov=True)
        except (ValueError, np.linalg.LinAlgError):
            return rng.random((len(C), n))
    mean = np.asarray(mean, dtype=float).reshape(len(C))
    scale = max(float(np.mean(np.diag(cov))), 1e-12)
    for jitter in (1e-10, 1e-8, 1e-6, 1e-4, 1e-2):
        try:
            L = np.linalg.cholesky(cov + jitter * scale * np.eye(len(C)))
            break
        except np.linalg.LinAlgError:
            continue
    else:  # posterior numerically degenerate: independent marginals still rank the candidates
        L = np.diag(np.sqrt(np.clip(np.diag(cov), 0.0, None)))
    return mean[:, None] + L @ rng.standard_normal((len(C), n))


# -- TuRBO -------------------------------------------------------------------------------------

class _Turbo:
    """State of one :func:`tune` call (kept small: the run, the regions, the encodings)."""

    def __init__(self, space: DiscreteSpace, run: _Run, seed: int):
        self.space, self.run = space, run
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.enc = space.encoded()
        lens = np.array([len(a.values) for a in space.axes])
        # one grid step per axis: a box never shrinks below its centre's direct neighbours
        self.step = np.where(lens > 1, 1.0 / np.maximum(lens - 1, 1), 0.0) + 1e-9
        self.length_min = 1.0 / (2 * lens.max())
        self.fail_tol = max(4, space.dim)
        self.regions: list[TrustRegion] = []
        self.used_centers: set[int] = set()

    # regions --------------------------------------------------------------------------------

    def new_region(self, index: int, pending: bool) -> TrustRegion:
        self.used_centers.add(index)
        value = self.run.values.get(index, math.inf)
        return TrustRegion(center=self.enc[index].copy(), length_min=self.length_min,
                           fail_tol=self.fail_tol, best_index=index, best_value=value,
                           pending_center=pending)

    def open_regions(self, n: int) -> None:
        """Centres: the best distinct measured starting points."""
        ranked = sorted(self.run.values, key=lambda i: (self.run.values[i], i))
        for index in ranked[:n]:
            self.regions.append(self.new_region(index, pending=False))
        while len(self.regions) < n:
            index = self.restart_center()
            if index is None:
                break
            self.regions.append(self.new_region(index, pending=not self.run.measured(index)))

    def unmeasured_in_box(self, region: TrustRegion) -> np.ndarray:
        return np.flatnonzero(region.contains(self.enc, self.step) & ~self.run.mask)

    def restart_center(self) -> int | None:
        """Where a restarted region goes: the best measured starting point not yet a centre, then
        an unmeasured point of the initial population, then a random unmeasured point far from
        the other centres."""
        starts = [i for t, i in self._start_indices() if i not in self.used_centers]
        measured = sorted((i for i in starts if math.isfinite(self.run.values.get(i, math.inf))),
                          key=lambda i: self.run.values[i])
        if measured:
            return measured[0]
        unmeasured = [i for i in starts if not self.run.measured(i)]
        if unmeasured:
            return unmeasured[0]
        free = np.flatnonzero(~self.run.mask)
        free = free[~np.isin(free, list(self.used_centers))] if free.size > len(self.used_centers) else free
        if free.size == 0:
            return None
        pool = self.rng.choice(free, size=min(256, free.size), replace=False)
        if not self.regions:
            return int(pool[0])
        centers = np.array([r.center for r in self.regions])
        dist = np.min(np.linalg.norm(self.enc[pool][:, None, :] - centers[None], axis=2), axis=1)
        return int(pool[int(np.argmax(dist))])

    def _start_indices(self):
        for t in self.run.trials:
            if t.source in ("initial", "known"):
                yield t, self.space.index(t.point)
        for p in self.space.initial():
            yield None, self.space.index(p)

    def restart(self, k: int) -> None:
        index = self.restart_center()
        if index is None:
            return
        self.regions[k] = self.new_region(index, pending=not self.run.measured(index))

    # proposals ------------------------------------------------------------------------------

    def candidates(self, region: TrustRegion) -> np.ndarray:
        """Unmeasured valid candidates for ``region``: random points of its box and perturbations
        of its centre, projected to the nearest valid point, plus valid points enumerated in it."""
        lo, hi = region.box(self.step)
        d = self.space.dim
        box = lo + (hi - lo) * self.rng.random((N_BOX_SAMPLES, d))
        # TuRBO's perturbation: change a few coordinates of the centre only
        pert = np.repeat(region.center[None], N_PERTURBED, axis=0)
        mask = self.rng.random((N_PERTURBED, d)) < min(1.0, 2.0 / d)
        mask[np.arange(N_PERTURBED), self.rng.integers(d, size=N_PERTURBED)] = True
        pert[mask] = (lo + (hi - lo) * self.rng.random((N_PERTURBED, d)))[mask]
        projected = self.space.project_indices(np.vstack([box, pert]))
        inside = self.unmeasured_in_box(region)
        if inside.size > N_ENUMERATED:
            inside = self.rng.choice(inside, size=N_ENUMERATED, replace=False)
        cands = np.unique(np.concatenate([projected, inside]))
        cands = cands[~self.run.mask[cands]]
        if cands.size > MAX_CANDIDATES:
            cands = self.rng.choice(cands, size=MAX_CANDIDATES, replace=False)
        return cands

    def local_gp(self, region: TrustRegion):
        """The region's GP on its current training set; refitted only when that set changed
        (with one measurement per round, the other regions' data usually did not)."""
        X, y, key = self.training_set(region)
        if region.model is not None and region.model[0] == key:
            return region.model[1]
        gp = _fit_gp(X, y, self.seed, region.kernel)
        if gp is not None:
            region.kernel = gp.kernel_
        region.model = (key, gp)
        return gp

    def training_set(self, region: TrustRegion) -> tuple[np.ndarray, np.ndarray, tuple]:
        """Trials in the region's box (or, too few there, the nearest ones to its centre), and a
        key that changes when they (or the failures' stand-in value) do."""
        idx = np.fromiter(self.run.values, dtype=np.int64)
        X = self.enc[idx]
        # targets over all trials, so a failure's stand-in value is the same in every region
        y = _log_targets(np.array([self.run.values[int(i)] for i in idx]))
        inside = region.contains(X, self.step)
        order = np.argsort(np.linalg.norm(X - region.center, axis=1), kind="stable")
        n = max(int(inside.sum()), MIN_TRAIN)
        keep = order[:min(n, MAX_TRAIN)]
        return X[keep], y[keep], (tuple(idx[keep].tolist()), float(y.max()) if y.size else 0.0)

    def propose(self, slots: int) -> list[tuple[int, int, str]]:
        """``slots`` (region, point index, source) proposals: a restarted region's unmeasured
        centre first, then Thompson samples allocated across regions as a bandit."""
        out, taken = [], set()
        for k, region in enumerate(self.regions):
            if region.pending_center and len(out) < slots and region.best_index not in taken:
                out.append((k, region.best_index, "restart"))
                taken.add(region.best_index)
        if len(out) >= slots:
            return out
        n = slots - len(out)
        scored = []
        for k, region in enumerate(self.regions):
            if region.pending_center:
                continue
            cands = self.candidates(region)
            if cands.size == 0:
                continue
            gp = self.local_gp(region)
            scored.append((k, cands, _thompson(gp, self.enc[cands], n, self.rng)))
        for j in range(n):
            best = None
            for k, cands, samples in scored:
                free = np.array([int(c) not in taken for c in cands])
                if not free.any():
                    continue
                col = np.where(free, samples[:, j], np.inf)
                a = int(np.argmin(col))
                if best is None or col[a] < best[0]:
                    best = (col[a], k, int(cands[a]))
            if best is None:
                break
            out.append((best[1], best[2], "turbo"))
            taken.add(best[2])
        return out

    def update(self, k: int, index: int, value: float) -> None:
        region = self.regions[k]
        if region.pending_center and index == region.best_index:
            region.pending_center = False
            region.best_value = value
            return
        improved = value < region.best_value - IMPROVEMENT * abs(region.best_value) \
            if math.isfinite(region.best_value) else math.isfinite(value)
        region.record(improved)
        if improved:
            region.best_index, region.best_value = index, value
            region.center = self.enc[index].copy()


def tune(space: DiscreteSpace, objective: Callable[[dict[str, int]], float], *, budget: Budget,
         seed: int = 0, n_regions: int | None = None, batch_size: int = 1,
         progress: bool | Callable | None = None,
         initial_values: Mapping[tuple, float] | None = None) -> TuningResult:
    """Minimise ``objective`` over ``space`` with TuRBO (see the module docstring)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    run = _Run(space, objective, budget, progress, desc=f"tuning {space.name}".strip())
    try:
        if len(space) == 0:
            return run.result("turbo")
        turbo = _Turbo(space, run, seed)
        _seed_trials(space, run, initial_values, budget, n_regions, turbo.rng)
        if not run.values:
            return run.result("turbo")
        n = n_regions or min(3, len(run.values))
        turbo.open_regions(max(1, n))
        rnd = 0
        while not run.done():
            rnd += 1
            for k, region in enumerate(turbo.regions):
                if region.pending_center and run.measured(region.best_index):
                    # another region's proposal measured this centre first
                    region.pending_center = False
                    region.best_value = run.values[region.best_index]
                if region.collapsed or (not region.pending_center and turbo.unmeasured_in_box(region).size == 0):
                    turbo.restart(k)
            with _few_blas_threads():
                proposals = turbo.propose(min(batch_size, run.remaining()))
            if not proposals:  # every region exhausted and nothing left to restart on
                break
            for k, index, source in proposals:
                if run.done():
                    break
                value = run.add(index, source, rnd, k)
                turbo.update(k, index, value)
        return run.result("turbo")
    finally:
        run.progress.close()


def _seed_trials(space: DiscreteSpace, run: _Run, initial_values, budget: Budget, n_regions,
                 rng: np.random.Generator) -> None:
    """Round 0: the known values, then the initial population (at most a third of the trial
    budget), then random points if that left fewer than two (or ``n_regions``) starting points."""
    for key, value in (initial_values or {}).items():
        index = space.index(dict(zip((a.name for a in space.axes), key)))
        if index is not None and not run.measured(index):
            run.add(index, "known", 0, None, value=value)
    population = [space.index(p) for p in space.initial()]
    cap = len(population) if budget.trials is None else max(1, budget.trials // 3)
    for index in population[:cap]:
        if run.done():
            return
        if not run.measured(index):
            run.add(index, "initial", 0, None)
    want = max(2, n_regions or 0)
    if len(run.values) < want:
        for point in space.sample(rng, len(space)):
            if len(run.values) >= want or run.done():
                break
            index = space.index(point)
            if not run.measured(index):
                run.add(index, "random", 0, None)


# -- baselines ---------------------------------------------------------------------------------

def random_search(space: DiscreteSpace, objective, *, budget: Budget, seed: int = 0,
                  progress: bool | Callable | None = None) -> TuningResult:
    """Uniform random sampling of distinct valid points (the baseline any search must beat)."""
    run = _Run(space, objective, budget, progress, desc=f"random {space.name}".strip())
    try:
        n = len(space) if budget.trials is None else min(budget.trials, len(space))
        for point in space.sample(np.random.default_rng(seed), n):
            if run.done():
                break
            run.add(space.index(point), "random", 0, None)
        return run.result("random")
    finally:
        run.progress.close()


def global_gp_search(space: DiscreteSpace, objective, *, budget: Budget, seed: int = 0,
                     progress: bool | Callable | None = None) -> TuningResult:
    """One global GP over the whole encoded cube (the baseline TuRBO is compared with).

    scikit-optimize's ``Optimizer`` with ``gp_minimize``'s settings (GP estimator, gp_hedge
    acquisition, 10 random initial points), driven by ask/tell so that a point that projects onto
    an already measured configuration is told its known value instead of costing a trial; the
    acquisition is optimised by sampling (its gradient means nothing after projection).
    """
    from skopt import Optimizer
    run = _Run(space, objective, budget, progress, desc=f"global GP {space.name}".strip())
    try:
        if len(space) == 0:
            return run.result("gp")
        n_init = 10 if budget.trials is None else max(1, min(10, budget.trials))
        opt = Optimizer([(0.0, 1.0)] * space.dim, base_estimator="GP", n_initial_points=n_init,
                        acq_func="gp_hedge", acq_optimizer="sampling",
                        acq_optimizer_kwargs={"n_points": 2000}, random_state=seed)
        rng = np.random.default_rng(seed)
        repeats, rnd = 0, 0
        while not run.done():
            rnd += 1
            with warnings.catch_warnings(), _few_blas_threads():
                warnings.simplefilter("ignore")
                x = opt.ask()
            index = int(space.project_indices(np.array([x]))[0])
            source = "gp"
            if run.measured(index):
                repeats += 1
                if repeats < 20:  # the GP asks again: tell it what it already knows
                    _tell(opt, space, run, index)
                    continue
                # stuck on measured points: spend a trial on a random unmeasured one
                index, source = int(rng.choice(np.flatnonzero(~run.mask))), "random"
            repeats = 0
            run.add(index, source, rnd, None)
            _tell(opt, space, run, index)
        return run.result("gp")
    finally:
        run.progress.close()


def _tell(opt, space: DiscreteSpace, run: _Run, index: int) -> None:
    values = np.array(list(run.values.values()))
    y = _log_targets(np.append(values, run.values[index]))[-1]
    with warnings.catch_warnings(), _few_blas_threads():
        warnings.simplefilter("ignore")
        opt.tell(list(space.encoded()[index]), float(y))


__all__ = ["Budget", "Trial", "TrustRegion", "TuningResult", "global_gp_search", "random_search", "tune"]
