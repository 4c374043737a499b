"""How a compile's tuning budget -- its trials (``TuningOptions.trials`` per group on average) and
its time (``TuningOptions.seconds``) -- is split among its distinct tunable groups.

Split evenly, a 1x1 Conv that runs once per request gets the trials of a 3x3 Conv that five
blocks repeat at twice its multiply-adds. ResNet-50 under tscomp compile's default budget: on a
Zen 3 the time cap tuned each of its ~25 distinct groups with 7-11 trials, and its 3x3 stride-2
convolutions, tuned so, ran 1.13-1.32x onnxruntime's time where 60 trials on one alone reached
1.04-1.12x (forty-fifth session); on a Zen 5 every group took its 24 trials in 10-18 s, whatever
it weighed. What a request costs is the sum over groups of occurrences x time, so the search
goes where that sum is: Ansor's task scheduler (Zheng et al., OSDI 2020, §6) allocates its
trials by each task's weight (how often the subgraph appears) times its latency, after a first
round that measures every task once. Here the same, in two passes over the groups
(:func:`tscomp.schedule.schedules.schedule_plan`):

1. *probe*: each distinct group's first trial (its family's top hardware-aligned candidate) --
   a trial the search would have measured anyway -- measures what the group costs at each
   sample shape;
2. *split*: heaviest first, each group's share of the time left is its weight (its share of a
   request's time, ``occurrences x seconds`` over all groups', averaged over the sample shapes:
   :func:`group_weights`) over the remaining groups' total, every weight lifted to
   at least :data:`FLOOR` times the mean of all so a light group still gets its initial
   population measured; the same for the trials not yet spent. Shares are recomputed after every group, so
   what one group leaves unused (its space exhausted, its trials done before its time) flows to the
   groups after it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

#: the least weight of a group, as a fraction of the groups' mean weight: a light group still
#: measures a few hardware-aligned candidates (~6 of the default 24 per group on average) and keeps
#: variants for the whole range
FLOOR = 0.25


def group_weights(occurrences: Mapping[str, int],
                  probed: Mapping[str, Sequence[float] | None]) -> dict[str, float]:
    """Signature -> the group's share of a request's time, averaged over the sample shapes:
    ``occurrences x t_g(s) / T(s)`` with ``t_g(s)`` its probe's seconds at sample shape ``s`` and
    ``T(s)`` the sum of that over every probed group. The tuning objective is a geometric mean over
    the shapes, and this is how much the model's geometric-mean time moves when the group's does
    (a share, so a long shape's seconds do not drown a short one's -- nor the attention's quadratic
    growth its weight). A group whose probe failed or did not run weighs the mean of the others
    (an even share); with no finite probe at all, every group weighs its occurrences."""
    arrays = {s: np.asarray(t, float) for s, t in probed.items() if s in occurrences and t is not None}
    times = {s: t for s, t in arrays.items() if t.size and np.all(np.isfinite(t)) and np.all(t > 0)}
    if not times or len({len(t) for t in times.values()}) != 1:
        return {s: float(n) for s, n in occurrences.items()}
    total = sum(occurrences[s] * t for s, t in times.items())
    known = {s: float(np.mean(occurrences[s] * t / total)) for s, t in times.items()}
    mean = sum(known.values()) / len(known)
    return {s: known.get(s, mean) for s in occurrences}


def tuning_order(weights: Mapping[str, float]) -> list[str]:
    """Heaviest first (ties in the given order: the sort is stable), so the time a finished group
    leaves flows on."""
    return sorted(weights, key=lambda s: -weights[s])


def lifted(weights: Mapping[str, float], floor: float = FLOOR) -> dict[str, float]:
    """Every weight lifted to at least ``floor`` x the mean of all of them (a floor fixed once,
    so the light groups tuned last keep the share it promised them)."""
    if not weights:
        return {}
    least = floor * sum(weights.values()) / len(weights)
    return {s: max(w, least) for s, w in weights.items()}


def share(left: float, weight: float, remaining: Sequence[float]) -> float:
    """What a group of ``weight`` gets of ``left`` (seconds or trials) split over ``remaining`` (the
    weights of every group still to tune, this one included) in proportion to the weights."""
    total = sum(remaining)
    if left <= 0 or not remaining:
        return 0.0
    return left if total <= 0 else left * weight / total


__all__ = ["FLOOR", "group_weights", "lifted", "share", "tuning_order"]
