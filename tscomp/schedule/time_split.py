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
   a trial the search would have measured anyway -- measures what the group costs;
2. *split*: heaviest first, each group's share of the time left is its weight
   (``occurrences x probed seconds``) over the remaining groups' total, every weight lifted to
   at least :data:`FLOOR` times the mean of all so a light group still gets its initial
   population measured; the same for the trials not yet spent. Shares are recomputed after every group, so
   what one group leaves unused (its space exhausted, its trials done before its time) flows to the
   groups after it.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

#: the least weight of a group, as a fraction of the groups' mean weight: a light group still
#: measures a few hardware-aligned candidates (~6 of the default 24 per group on average) and keeps
#: variants for the whole range
FLOOR = 0.25


def group_weights(occurrences: Mapping[str, int], probed_seconds: Mapping[str, float]) -> dict[str, float]:
    """Signature -> occurrences x probed seconds per call. A group whose probe failed or was not run
    (no finite time) weighs the mean of the others (an even share); with no finite probe at all,
    every group weighs its occurrences."""
    known = {s: occurrences[s] * t for s, t in probed_seconds.items()
             if s in occurrences and math.isfinite(t) and t > 0}
    if not known:
        return {s: float(n) for s, n in occurrences.items()}
    mean = sum(known.values()) / len(known)
    return {s: known.get(s, mean) for s in occurrences}


def tuning_order(weights: Mapping[str, float]) -> list[str]:
    """Heaviest first (ties in the given order), so the time a finished group leaves flows on."""
    rank = {s: i for i, s in enumerate(weights)}
    return sorted(weights, key=lambda s: (-weights[s], rank[s]))


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
