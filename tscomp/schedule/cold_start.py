"""What switching to a variant costs when the model's data stays cached between requests (issue 10).

A variant is kept in the artifact because it is faster somewhere in the range (the tuner's diverse
set). It is faster *warm*: the compile-time samples time it after warm-up runs. A served request
that switches to it (a length no recent request had) finds its data cold. For a model whose
weights stream from DRAM on every request (BERT-base: 340 MB against a 32 MB L3) that costs
nothing extra, since the variant it replaces streams its weights too. For a model whose weights
fit in the last-level cache, the replaced variant's weights were cached and the new one's are not
(its packed panels have another layout): tiny BERT, with up to four variants per GEMM group, ran
its first call at a new short length 1.2-1.6x slower than the same call repeated, and 1.1-1.3x
with one variant per group, while the extra variants bought at most 6% in the steady state.

So a further variant whose packed data differs from every kept one's pays, at every sample shape,
the time of bringing its packed bytes into the core (:func:`refill_seconds`): it is kept only where
it gains more than that. :func:`resident` says when this applies (the model's constant data fits in
L3); :func:`data_key` says which data a kernel reads that another might share (identical packed
panels are one copy at load).

A model whose constants exceed the cores' L2 never finds a GEMM's weights in a private cache when
the request reaches it: :func:`evict_bytes` makes the tuner and the dispatch measurements time
candidates on rotating copies of their packed data (:func:`rotation`), so they are ranked and
modelled cold, as they run; the switch cost above then needs no extra term (every run is a refill).
"""
from __future__ import annotations

import functools
import hashlib
import time

import numpy as np

from tscomp.schedule.target import CpuSpec, Target, host_memory


#: a cold-weight timing rotates a candidate's packed data over copies spanning at least this many
#: times the cores' combined L2, so each timed run finds its weights in L3 or memory, not in a
#: private cache
EVICT_L2_MULTIPLE = 4
#: ... and at most this many bytes (or 1/32 of physical memory): the copies live while a group's
#: variants are measured side by side
EVICT_MAX_BYTES = 256 << 20
#: at most this many copies of one kernel's packed data (a tiny weight is not worth 1000 copies)
MAX_COPIES = 64


def _constant_bytes(plan) -> int:
    return sum(v.const.nbytes for v in plan.graph.values.values() if getattr(v, "const", None) is not None)


def evict_bytes(plan, target: Target) -> int:
    """Bytes a candidate's constant data must be rotated over when it is timed (0: time it warm).

    In a served request a GEMM's weights were last touched a whole inference ago; when the model's
    constants exceed the cores' combined L2, every other layer's weights went through the private
    caches since, and they arrive from L3 or memory. A kernel timed on one weight in a loop finds
    them in L2 instead, which flatters configurations that re-read the weight panels (small row
    blocks): measured on BERT-base's QKV GEMM (K=768, N=2304, bf16 on AMX), M=139 ran 266 us warm
    and 421 us cold in one configuration, 251 / 364 us in another -- the warm ranking is not the
    served one. Timing on rotating copies ranks configurations as they run in the model.

    The copies span as many bytes as the model's constants (between two uses of a weight, a request
    streams all the others), at least ``EVICT_L2_MULTIPLE`` x L2 and at most :data:`EVICT_MAX_BYTES`:
    a fixed 4 x L2 (16 MB here) stayed in this host's L3, where BERT-base's 340 MB never do, and
    ranked a 64-row block of the FFN-down GEMM (its weights streamed once per row block) level with
    a 144-row one that in the model, rotated over its 12 layers, runs 9% faster at M = 139."""
    if not isinstance(target.spec, CpuSpec):
        return 0
    l2_total = target.spec.l2 * max(1, target.spec.cores)
    constants = _constant_bytes(plan)
    if constants <= l2_total:
        return 0
    return max(EVICT_L2_MULTIPLE * l2_total, min(constants, EVICT_MAX_BYTES, host_memory() // 32))


class Rotation:
    """Copies of a candidate's packed data handed out in one cycle that goes on from one timed case
    to the next: every copy is read once before any is read again. A cycle restarted per case read
    only its first few copies (a case is ~5 runs) at every sample shape, ~35 MB of a BERT-base GEMM's
    36 copies, which a large L3 kept between uses: those samples timed the QKV GEMM's two best
    variants level at M = 40 (0.448 vs 0.459 ms) where the model runs one 1.25x the other (0.70 vs
    0.56 ms); with the cycle going on they read 0.637 vs 0.511 ms, as in the model."""

    def __init__(self, copies: list):
        self.copies = copies
        self._next = 0

    def __len__(self) -> int:
        return len(self.copies)

    def next(self) -> np.ndarray:
        """The copy the next timed run reads."""
        copy = self.copies[self._next]
        self._next = (self._next + 1) % len(self.copies)
        return copy


def rotation(candidate, nbytes: int) -> Rotation | None:
    """Copies of ``candidate.packed`` spanning ``nbytes`` (the first is the candidate's own), or None
    when there is nothing to rotate (no packed data, warm timing, or data already larger than the
    span: it cannot stay in the private caches from one run to the next anyway)."""
    packed = getattr(candidate, "packed", None)
    if not nbytes or not isinstance(packed, np.ndarray) or packed.nbytes == 0:
        return None
    n = min(MAX_COPIES, -(-nbytes // packed.nbytes))
    if n < 2:
        return None
    from tscomp.codegen.cpu_gemm import aligned_copy
    return Rotation([packed] + [aligned_copy(packed.copy()) for _ in range(n - 1)])


def resident(plan, target: Target) -> bool:
    """The plan's constant data fits in the target's share of the last-level cache (so it stays
    cached between requests, and a variant that reads other bytes pays for them)."""
    if not isinstance(target.spec, CpuSpec):
        return False
    return _constant_bytes(plan) <= target.spec.llc_share


def data_key(kernel) -> tuple[str, int] | None:
    """(digest, bytes) of the constant data the kernel streams (its packed weight), or None."""
    packed = getattr(kernel, "packed", None)
    if packed is None:
        return None
    raw = np.ascontiguousarray(packed).view(np.uint8)
    return hashlib.blake2b(raw, digest_size=16).hexdigest(), int(raw.nbytes)


def refill_seconds(nbytes: int, target: Target) -> float:
    """Seconds to bring ``nbytes`` from the last-level cache into a core: the bytes over a copy
    bandwidth measured once per process on a block a quarter of L3's size (in L3, not in L2)."""
    return nbytes / _l3_bandwidth(target.spec.l3)


@functools.lru_cache(maxsize=None)
def _l3_bandwidth(l3: int) -> float:
    n = max(1 << 16, l3 // 4 // 4)             # float32 elements: a quarter of L3 per array
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    np.copyto(dst, src)                         # both now in L3 (and out of L2: larger than it)
    best = np.inf
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * 4 * n / max(best, 1e-9)          # bytes read + written per second


__all__ = ["data_key", "evict_bytes", "refill_seconds", "resident", "rotation"]
