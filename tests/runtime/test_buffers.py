"""Arena buffer planning: tensors alive at the same time never share bytes; dead ones do."""
from __future__ import annotations

import random

from tscomp.runtime.buffers import ALIGN, Lifetime, plan_buffers


def _overlap(a: Lifetime, b: Lifetime) -> bool:
    return not (a.last < b.first or b.last < a.first)


def test_tensors_with_disjoint_lifetimes_share_memory():
    plan = plan_buffers([Lifetime("a", 1000, 0, 1), Lifetime("b", 1000, 2, 3)])
    assert plan.offsets["a"] == plan.offsets["b"] == 0
    assert plan.arena_bytes < plan.naive_bytes


def test_live_tensors_never_overlap_in_the_arena():
    rng = random.Random(0)
    for _ in range(200):
        lts = []
        for k in range(rng.randint(1, 25)):
            first = rng.randint(0, 20)
            lts.append(Lifetime(f"t{k}", rng.randint(1, 5000), first, first + rng.randint(0, 6)))
        plan = plan_buffers(lts)
        for a in lts:
            assert plan.offsets[a.name] % ALIGN == 0
            assert plan.offsets[a.name] + a.nbytes <= plan.arena_bytes
            for b in lts:
                if a is b or not _overlap(a, b):
                    continue
                a0, b0 = plan.offsets[a.name], plan.offsets[b.name]
                assert a0 + a.nbytes <= b0 or b0 + b.nbytes <= a0, (a, b, plan.offsets)
        assert plan.arena_bytes <= plan.naive_bytes
