"""Kernel-variant selection by the wave model (TSCompiler §6; DietCode §4.2 calls it occupancy).

cost(variant, shape) = T_single_wave(variant) × ⌈tasks(variant, shape) / tasks_per_wave⌉

Blocks per wave come from the :class:`~tscomp.schedule.target.Target` and the kernel's resource use
(``target.blocks_per_wave(kernel.resources())``): on the CPU a "block" is one parallel tile task of
the macro-kernel and a wave is one task per worker thread; on a GPU it is §6's occupancy formula.
T_single_wave is measured at compile time (by the tuner, or
:func:`tscomp.compiler.measure_variants`) at a few sample shapes, because a task's time depends
on how full its tiles are (a 64-row task holding one row costs far less than a full one); the
runtime interpolates the per-task time between the samples. A group with one variant has nothing
to choose.

**Task classes.** A shape's tasks are not all alike: the last block along a tiled dynamic axis
holds the remainder (M = 327 under 64-row blocks is five full blocks and one of 7 rows; the CPU
GEMM balances its row blocks instead: five of 56 rows and one of 47, and M = 139 on 2 threads is
four blocks of 40, 40, 32 and 27 rows rather than three). Where the
family defines them (:data:`CLASSES`), the tasks of a shape come as classes ``(count, work)`` with
work the *padded* work of one task of the class: a task computes whole register tiles, so a task
holding 5 rows under an 8-row register tile costs what 8 rows cost (TSCompiler §5.1's
hardware-aligned view; DietCode §4.1 pads to the micro-kernel the same way) -- except where the
kernel runs its last row panel with a micro-kernel of that panel's own height (the CPU GEMM's row
tails, FTuner's two tile sizes: ``row_granule`` 1), where a task's work is its exact rows. The per-task time
``t(work)`` is interpolated in the work, and the cost is the makespan of the classes on
``P`` = blocks-per-wave workers pulling tasks dynamically::

    cost = T0 + a_h × t(w_heavy) + a_l × t̄_light

with ``a_h`` whole waves of the heaviest tasks and ``a_l`` rounds of the light ones, counted as
the workers pull them (:func:`_wave_coefficients`: the heavy tasks fill whole waves; in the last,
partly filled one the idle workers start on the light tasks), and T0 a fixed launch time per
call. With one class this is §6's T_single_wave × waves; with a light last block it charges that
block its own time instead of a full wave
(counting it as a full wave made 64-row variants look 15-25% dearer than they run just past a
multiple of 64 rows). T0 (starting the parallel region, the first touches of the weights: a
one-wave run costs more per wave than a many-wave one) is the intercept of the samples that ran
the same full tasks in different numbers of waves; without it one-wave samples made a variant
look dear at every shape.

The compile-time samples are read with the same model: each sample stores its classes, the
lighter classes' times come from the lighter samples, and the heaviest class's time is what
makes the model reproduce the measured seconds. Samples at the same heaviest work (every shape
made of full tasks) give one point, their minimum (timing noise only slows a run down); for
:data:`MONOTONE` families the per-task time is made non-decreasing in the work (a row-tail work,
which runs its own micro-kernel, only bounded by the whole-tile works above it). Families without
classes count every task alike in the shape size, and so do samples recorded before classes were.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from tscomp.codegen.build import get_num_threads
from tscomp.codegen.cpu_gemm import row_block_classes
from tscomp.codegen.tile_config import TileConfig
from tscomp.graph.symbols import numel
from tscomp.schedule.samples import shape_size
from tscomp.schedule.target import Target


def _padded(extent, block: int, reg: int):
    """Rows (or columns) one task computes: ``extent`` rounded up to the register tile, at most a
    block (scalars or numpy arrays)."""
    return np.minimum(-(-extent // reg) * reg, block)


def _axis_classes(extent, block: int, reg: int) -> list[tuple]:
    """``[(count, padded extent)]`` of the blocks along one tiled axis: the full blocks, then the
    last one holding the remainder (itself full when ``block`` divides ``extent``)."""
    extent = np.maximum(extent, 1)
    n = -(-extent // block)
    last = extent - (n - 1) * block
    return [(n - 1, _padded(np.minimum(extent, block), block, reg)), (n * 0 + 1, _padded(last, block, reg))]


def _gemm_classes(k, ev, threads: int):
    # the CPU GEMM's row blocks (evened over the threads) x its N blocks; rows count exactly where
    # the last row panel has a micro-kernel of its own height
    nnb = k.geometry.n_nblocks
    return [(c * nnb, w) for c, w in row_block_classes(ev(k.M), k.cfg.mc, k.cfg.mr, nnb, threads, k.row_granule,
                                                       k.geometry.tall_rows)]


def _conv_classes(k, ev, threads: int):
    """Implicit-GEMM Conv (``cpu_conv.conv_source``'s own split): per image and channel group, blocks
    of T_Nb output positions (the last one partial); when those are fewer than the threads, the
    output-channel blocks are split into ``runs`` tasks too. A task's work: its padded positions x
    its output channels x the reduction depth (the last position tile is computed in whole
    :func:`~tscomp.codegen.cpu_conv.column_tail_granule` s: row-vector tiles pad no positions,
    fp32 column vectors pad to a whole vector)."""
    a, cfg = k.analysis, k.cfg
    if not isinstance(cfg, TileConfig):       # the Winograd strategy: its own split
        from tscomp.codegen.cpu_conv_winograd import winograd_classes
        return winograd_classes(k, ev, threads)
    from tscomp.codegen.cpu_conv import column_tail_granule, conv_task_grid, plane_positions, position_block_tiles
    n = ev(a.x_shape[0])
    if cfg.planes:               # positions along the padded width (the rows' dropped columns computed)
        OH, OW = (1, ev(a.out_shape[2])) if len(a.out_shape) == 3 else (ev(a.out_shape[2]), ev(a.out_shape[3]))
        P = np.maximum(plane_positions(OH, OW, a.geo), 1)
    else:
        P = np.maximum(ev(numel(a.out_shape[2:])), 1)
    n_ob = -(-a.OCg // cfg.mc)
    n_pb, per_block = conv_task_grid(P, n * a.G, n_ob, cfg, threads)
    obt = -(-n_ob // per_block)
    per_task = obt * cfg.mc * a.Cg * a.geo.kh * a.geo.kw
    (n_small, small), (n_larger, larger) = position_block_tiles(P, n_pb, cfg.nr)
    # the last block is a larger one where there are any; its last tile is computed in whole granules
    # (row-vector tiles: its exact positions; fp32 column vectors: whole vectors; int8: the full tile)
    last_tiles = np.where(n_larger > 0, larger, small)
    granule = column_tail_granule(cfg, k.isa, getattr(k, "precision", "fp32"))
    rest = P - (-(-P // cfg.nr) - 1) * cfg.nr
    last = (last_tiles - 1) * cfg.nr + -(-rest // granule) * granule
    blocks = [(n_small - (n_larger == 0), small * cfg.nr), (n_larger - (n_larger > 0), larger * cfg.nr), (1, last)]
    return [(n * a.G * c * per_block, w * per_task) for c, w in blocks]


def _depthwise_classes(k, ev, threads: int):
    """Direct depthwise Conv: per image and channel, blocks of ``rows`` output rows (4,096 outputs
    at most, the kernel's own rule), the last one partial; work = outputs x taps. The
    channel-blocked variant (a configuration) has its own split."""
    a = k.analysis
    n = ev(a.x_shape[0])
    OH, OW = (1, ev(a.out_shape[2])) if len(a.out_shape) == 3 else (ev(a.out_shape[2]), ev(a.out_shape[3]))
    if k.cfg is not None:       # the channel-blocked strategy: its own split
        from tscomp.codegen.cpu_depthwise_channels import channel_block_classes
        return channel_block_classes(k.cfg, a.geo, n, a.OC, OH, OW, threads)
    rows = np.maximum(1, np.minimum(OH, 4096 // np.maximum(OW, 1)))
    blocks = -(-OH // rows)
    taps = a.geo.kh * a.geo.kw * OW
    return [(n * a.OC * (blocks - 1), rows * taps), (n * a.OC, (OH - (blocks - 1) * rows) * taps)]


def _batched_classes(k, ev, threads: int):
    nb, K = ev(k.NB), ev(k.K)
    return [(nb * cm * cn, wm * wn * K) for cm, wm in _axis_classes(ev(k.M), k.cfg.mc, k.cfg.mr)
            for cn, wn in _axis_classes(ev(k.N), k.cfg.nc, k.cfg.nr)]


def _attention_classes(k, ev, threads: int):
    """Fused attention (``cpu_attention``'s own split): per batch entry, ``splits`` runs of T_Mb-row
    query blocks, each run packing the entry's keys; work = the run's padded rows x padded keys x
    (both head widths)."""
    from tscomp.codegen.cpu_attention import attention_splits
    nb, M = ev(k.NB), np.maximum(ev(k.M), 1)
    keys = -(-np.maximum(ev(k.N), 1) // k.cfg.nr) * k.cfg.nr      # padded to the key block (T_Nb)
    n_qb = -(-M // k.cfg.mc)
    splits = attention_splits(nb, n_qb, threads)
    rows = np.minimum(-(-n_qb // splits) * k.cfg.mc, -(-M // k.cfg.mr) * k.cfg.mr)
    return [(nb * splits, rows * keys * (k.DK + k.DV))]


#: family -> classes(kernel, ev, threads): the tasks of a shape as ``[(count, padded work per task)]``,
#: ``ev`` evaluating a symbolic size (to an int for one binding, to an array over a grid of bindings
#: in :mod:`tscomp.runtime.dispatch`), ``threads`` the OpenMP team size (a Conv splits by it)
CLASSES: dict[str, Callable] = {"gemm": _gemm_classes, "batched-gemm": _batched_classes,
                                 "attention": _attention_classes,
                                 "conv": _conv_classes, "conv-depthwise": _depthwise_classes}

#: families that got task classes later: a kernel compiled before (``task_model`` below this)
#: recorded its samples as one class at the shape size, and keeps being costed that way
CLASSES_SINCE = {"conv": 2, "conv-depthwise": 2}


def classes_fn(kernel) -> Callable | None:
    """The task-classes function that matches how ``kernel``'s samples were recorded, or None."""
    fn = CLASSES.get(kernel.family)
    if fn is not None and getattr(kernel, "task_model", 1) < CLASSES_SINCE.get(kernel.family, 1):
        return None
    return fn


#: families whose per-task time never falls as the task's work grows (one big task per thread;
#: the batched GEMM's many small tasks amortize their start-up, so its per-task time can fall)
MONOTONE = {"gemm"}


def task_classes(kernel, binding: Mapping[str, int], threads: int | None = None) -> tuple[tuple[int, int], ...]:
    """The tasks of ``kernel`` at ``binding`` on ``threads`` threads (default: the OpenMP team size
    now, what a measurement runs on) as ``((count, work), ...)``, empty classes dropped; one class
    (every task, the shape size) for families without :data:`CLASSES`."""
    fn = classes_fn(kernel)
    if fn is None:
        return ((int(kernel.tasks(binding)), shape_size(binding)),)
    b = dict(binding)
    classes = fn(kernel, lambda x: int(kernel.symtab.evaluate(x, b)), threads or get_num_threads())
    return tuple((int(c), int(w)) for c, w in classes if int(c) > 0)


def task_work(kernel, binding: Mapping[str, int]) -> int:
    """The padded work of the heaviest task at ``binding`` (the shape size without classes)."""
    return max(w for _, w in task_classes(kernel, binding))


def sample_point(kernel, binding: Mapping[str, int], seconds: float) -> tuple:
    """One compile-time sample: (shape size, tasks, seconds, heaviest task's work, task classes)."""
    classes = task_classes(kernel, binding)
    return (shape_size(binding), int(kernel.tasks(binding)), float(seconds), max(w for _, w in classes), classes)


def _sample_classes(s) -> tuple:
    """A sample's task classes; samples recorded without them: every task alike (at the work,
    or at the shape size before the work was recorded too)."""
    if len(s) > 4:
        return tuple((int(c), int(w)) for c, w in s[4])
    return ((max(1, int(s[1])), int(s[3] if len(s) > 3 else s[0])),)


def _interp_row(w: float, knots: list[int]) -> np.ndarray:
    """Weights of the knot values in ``numpy.interp(w, knots, values)`` (clamped at the ends)."""
    row = np.zeros(len(knots))
    j = int(np.searchsorted(knots, w))
    if j == 0:
        row[0] = 1.0
    elif j >= len(knots):
        row[-1] = 1.0
    elif knots[j] == w:
        row[j] = 1.0
    else:
        f = (w - knots[j - 1]) / (knots[j] - knots[j - 1])
        row[j - 1], row[j] = 1.0 - f, f
    return row


def _wave_coefficients(ch, nl, th, tl, per_wave: int):
    """(a_h, a_l) with makespan = a_h x t_heavy + a_l x t_light: ``ch`` heavy tasks of ``th`` and ``nl``
    light ones of mean time ``tl``, pulled in order by ``per_wave`` = P workers (scalars or arrays).

    The heavy tasks fill ``q`` whole waves and leave ``r``. In the last stretch ``r`` workers run a
    heavy task while the ``P - r`` others start on the light ones: when those finish all the light
    tasks within ``floor(th / tl)`` rounds each, the stretch lasts ``max(th, their rounds)``;
    otherwise every worker ends up on light tasks and it lasts ``ceil((nl + r th / tl) / P)``
    light rounds (the heavy tasks counted in light-task units; off by at most one light task)."""
    P = per_wave
    ch, nl = np.asarray(ch), np.asarray(nl)
    th, tl = np.asarray(th, dtype=np.float64), np.asarray(tl, dtype=np.float64)
    q, r = ch // P, ch % P
    free = P - r
    # without light tasks (tl = 0) the ratio is infinite and the branch np.where drops computes
    # inf x 0: the selected values are right, the floating-point warnings noise
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ratio = th / np.maximum(tl, 1e-300)
        fits = nl <= free * np.floor(ratio)
        rounds = np.where(fits, -(-nl // free), np.ceil((nl + r * ratio) / P - 1e-9))
    heavy_longer = (r > 0) & (rounds * tl < th)
    a_h = q + np.where((r > 0) & ((nl == 0) | heavy_longer), 1, 0)
    a_l = np.where((nl == 0) | heavy_longer, 0, rounds)
    return a_h.astype(np.float64), a_l.astype(np.float64)


def _split(classes):
    """(heavy work, heavy count, light count, [(count, work) of the light classes]) of one
    sample's classes."""
    wh = max(w for _, w in classes)
    ch = sum(c for c, w in classes if w == wh)
    light = [(c, w) for c, w in classes if w != wh]
    return wh, ch, sum(c for c, _ in light), light


def makespan(classes, t: Callable, per_wave: int):
    """The module docstring's cost of task ``classes`` (``[(count, work)]``, scalars or arrays over a
    grid of bindings), each task of work ``w`` taking ``t(w)``, on ``per_wave`` workers."""
    counts = [np.asarray(c) for c, _ in classes]
    works = [np.asarray(w, dtype=np.float64) for _, w in classes]
    heavy = np.max([np.where(c > 0, w, -np.inf) for c, w in zip(counts, works)], axis=0)
    ch = np.sum([np.where((c > 0) & (w == heavy), c, 0) for c, w in zip(counts, works)], axis=0)
    light = [np.where((c > 0) & (w < heavy), c, 0) for c, w in zip(counts, works)]
    nl = np.sum(light, axis=0)
    tl = np.sum([c * t(w) for c, w in zip(light, works)], axis=0) / np.maximum(nl, 1)
    th = t(heavy)
    a_h, a_l = _wave_coefficients(ch, nl, th, tl, per_wave)
    return a_h * th + a_l * tl


#: scale of the relative residual past which a sample counts as disturbed (soft-L1 loss): timing
#: noise is upward and sometimes 2x, and one such sample must not bend the fit
NOISE_SCALE = 0.05

#: weight pulling the launch time T0 toward 0 where the samples leave it undetermined
T0_PRIOR = 0.05


def _fit(samples, per_wave: int) -> tuple[list[int], np.ndarray, float]:
    """Knots (every sample's heaviest work), the per-task time at each, and the launch time T0,
    fitted to all samples at once: nonnegative robust least squares (soft-L1) on the relative
    error of ``T0 + makespan``. The makespan is linear in the task times once its whole-wave
    structure (:func:`_wave_coefficients`) is fixed; that structure is taken from the previous
    estimate (first: times in proportion to the work) until it settles."""
    from scipy.optimize import least_squares, nnls

    parts = [_split(_sample_classes(s)) for s in samples]
    seconds = np.array([max(float(s[2]), 1e-12) for s in samples])
    knots = sorted({wh for wh, *_ in parts})
    rows_h = [_interp_row(wh, knots) for wh, *_ in parts]
    rows_l = [sum((c * _interp_row(w, knots) for c, w in light), np.zeros(len(knots))) / max(nl, 1)
              for _, _, nl, light in parts]
    prior = np.append(np.zeros(len(knots)), T0_PRIOR / seconds.min())
    t = np.array(knots, dtype=np.float64)          # first structure: time in proportion to the work
    x, structure = np.append(t, 0.0), None
    for _ in range(6):
        coef = [_wave_coefficients(ch, nl, rh @ t, rl @ t, per_wave)
                for (wh, ch, nl, _), rh, rl in zip(parts, rows_h, rows_l)]
        now = [(float(a), float(b)) for a, b in coef]
        if now == structure:
            break
        structure = now
        A = np.array([np.append(a * rh + b * rl, 1.0) for (a, b), rh, rl in zip(structure, rows_h, rows_l)])
        A = np.vstack([A / seconds[:, None], prior])
        b = np.append(np.ones(len(parts)), 0.0)
        x0, _ = nnls(A, b)
        x = least_squares(lambda v: A @ v - b, x0, bounds=(0.0, np.inf), loss="soft_l1", f_scale=NOISE_SCALE).x
        t = x[:-1]
    return knots, x[:-1], float(x[-1])


def wave_points(kernel, per_wave: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(work, per-task seconds, launch seconds) fitted to the samples (:func:`_fit`), sorted by
    work; kept on the kernel per blocks-per-wave."""
    key = f"_wave_points_{per_wave}"
    cached = kernel.__dict__.get(key)
    if cached is None:
        # a model's repeated layers share their samples (measured once): fitted once
        step = _padded_step(kernel)
        shared = (kernel.family, per_wave, step, tuple(_plain(s) for s in kernel.samples))
        cached = _FITS.get(shared)
        if cached is None:
            knots, ys, t0 = _fit(kernel.samples, per_wave)
            knots = np.array(knots, dtype=np.float64)
            if kernel.family in MONOTONE:
                ys = _monotone(knots, ys, step)
            cached = _FITS[shared] = (knots, ys, t0)
        kernel.__dict__[key] = cached
    return cached


#: fits by (family, workers, samples); bounded by the kernels a process has loaded
_FITS: dict = {}


def _padded_step(kernel) -> int:
    """The work step at which a task runs whole register tiles only: ``mr`` where the last row panel
    has a micro-kernel of its own height (``row_granule`` 1, the CPU GEMM's row tails), else 1
    (every work value is already padded to whole tiles)."""
    cfg = getattr(kernel, "cfg", None)
    mr = getattr(cfg, "mr", 1) or 1
    return int(mr) if getattr(kernel, "row_granule", mr) == 1 and mr > 1 else 1


def _monotone(knots: np.ndarray, ys: np.ndarray, step: int) -> np.ndarray:
    """Per-task times made non-decreasing in the work where that holds: a task of more whole
    register tiles is never faster, so a knot dearer than one with more work is noise (timing noise
    is upward) and takes that cheaper time. A row-tail knot (work not a multiple of ``step``) runs a
    different micro-kernel, which can cost more than the next tile height's (BERT-base's QKV GEMM,
    r12x16: 94 us at 3 rows, 80 us at 4): it is capped only by the whole-tile knots above it."""
    ys = np.array(ys, dtype=np.float64)
    whole = np.asarray(knots) % step == 0
    cap = np.inf
    for i in range(len(ys) - 1, -1, -1):
        ys[i] = min(ys[i], cap)
        if whole[i]:
            cap = ys[i]
    return ys


def _plain(s) -> tuple:
    """A sample as a hashable tuple (classes read back from an artifact may be lists)."""
    return tuple(tuple(tuple(c) for c in v) if isinstance(v, (list, tuple)) else v for v in s)


def cost_of(kernel, classes, per_wave: int):
    """Makespan of ``classes`` under ``kernel``'s measured samples (infinity when unmeasured; the
    one measured ``t_wave`` per wave when it has no samples)."""
    if kernel.samples:
        xs, ys, t0 = wave_points(kernel, per_wave)
        return t0 + makespan(classes, lambda w: np.interp(w, xs, ys), per_wave)
    if kernel.t_wave is None:
        return math.inf
    return makespan(classes, lambda w: kernel.t_wave, per_wave)


def wave_cost(kernel, binding: Mapping[str, int], target: Target) -> float:
    """The variant's predicted time at ``binding`` on the target's threads (see the module
    docstring; the dispatch tables made at load cost the same way)."""
    per_wave = max(1, target.blocks_per_wave(kernel.resources()))
    return float(cost_of(kernel, task_classes(kernel, binding, target.threads), per_wave))


def pick_variant(variants: list, binding: Mapping[str, int], target: Target, surcharge=(), margin=()):
    """The cheapest variant at ``binding``; ``surcharge`` adds seconds and ``margin`` a fraction of
    its cost per variant (a dispatch table's charges for leaving the group's home variant and copy,
    :mod:`tscomp.runtime.dispatch`)."""
    if len(variants) == 1:
        return variants[0]
    extra = list(surcharge) or [0.0] * len(variants)
    scale = [1.0 + m for m in margin] or [1.0] * len(variants)
    # ties (equal cost) go to the earlier variant: the schedule lists its best-objective one first
    best = min(range(len(variants)), key=lambda v: wave_cost(variants[v], binding, target) * scale[v] + extra[v])
    return variants[best]


__all__ = ["CLASSES", "CLASSES_SINCE", "classes_fn", "cost_of", "makespan", "pick_variant", "sample_point", "task_classes", "task_work",
           "wave_cost", "wave_points"]
