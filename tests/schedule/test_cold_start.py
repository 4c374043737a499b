"""What a switch to a variant costs when the model's data stays cached (schedule/cold_start.py)."""
from __future__ import annotations

import types

import numpy as np

from tscomp.schedule.cold_start import (EVICT_MAX_BYTES, MAX_COPIES, data_key, evict_bytes, refill_seconds, resident,
                                        rotation)
from tscomp.schedule import measure
from tscomp.schedule.measure import Workload, measure_inline
from tscomp.schedule.target import host_cpu


def plan_with_constants(*sizes):
    values = {f"w{i}": types.SimpleNamespace(const=np.zeros(n, np.float32)) for i, n in enumerate(sizes)}
    values["x"] = types.SimpleNamespace(const=None)
    return types.SimpleNamespace(graph=types.SimpleNamespace(values=values))


def test_a_model_is_resident_when_its_constants_fit_the_last_level_cache():
    target = host_cpu(2)
    l3_floats = target.spec.llc_share // 4
    assert resident(plan_with_constants(l3_floats // 4, l3_floats // 4), target)
    assert not resident(plan_with_constants(l3_floats, 16), target)


def test_a_model_counts_on_at_most_its_threads_share_of_a_large_shared_l3():
    """An L3 is shared with the socket's other cores: 100 MB of weights are not cached between
    requests on 2 threads of a CPU reporting 480 MiB of L3, and are on 16 threads of it."""
    import dataclasses

    from tscomp.schedule.target import LLC_SHARE_PER_CORE

    spec = dataclasses.replace(host_cpu(2).spec, l3=480 << 20, cores=2)
    target = dataclasses.replace(host_cpu(2), spec=spec)
    assert spec.llc_share == 2 * LLC_SHARE_PER_CORE < spec.l3
    assert not resident(plan_with_constants(25_000_000), target)
    wide = dataclasses.replace(target, spec=dataclasses.replace(spec, cores=16))
    assert resident(plan_with_constants(25_000_000), wide)
    small_l3 = dataclasses.replace(spec, l3=4 << 20)
    assert small_l3.llc_share == 4 << 20          # never more than the L3 itself


def test_kernels_with_equal_packed_panels_share_a_data_key_and_others_do_not():
    panels = np.arange(1024, dtype=np.float32)
    same = types.SimpleNamespace(packed=panels.copy())
    other = types.SimpleNamespace(packed=panels[::-1].copy())
    assert data_key(types.SimpleNamespace(packed=panels)) == data_key(same)
    assert data_key(other) != data_key(same) and data_key(other)[1] == 4096
    assert data_key(types.SimpleNamespace()) is None        # code only (e.g. fused attention)


def test_refilling_more_bytes_takes_longer_and_a_megabyte_takes_microseconds():
    target = host_cpu(2)
    small, large = refill_seconds(1 << 20, target), refill_seconds(1 << 22, target)
    assert large == 4 * small
    assert 1e-6 < small < 1e-2


def test_weights_are_timed_cold_only_when_the_model_outgrows_the_private_caches():
    target = host_cpu(2)
    l2_total = target.spec.l2 * 2
    assert evict_bytes(plan_with_constants(l2_total // 4 // 2), target) == 0         # fits L2: warm
    assert evict_bytes(plan_with_constants(l2_total // 4 + 16), target) == 4 * l2_total


def test_cold_timing_rotates_over_as_many_bytes_as_the_model_streams_up_to_a_cap():
    target = host_cpu(2)
    l2_total = target.spec.l2 * 2
    model = 10 * l2_total                                   # larger than the fixed 4 x L2 minimum
    assert evict_bytes(plan_with_constants(model // 4), target) == min(model, EVICT_MAX_BYTES)
    huge = evict_bytes(plan_with_constants(EVICT_MAX_BYTES, EVICT_MAX_BYTES), target)   # 2 GiB of constants
    assert 4 * l2_total <= huge <= EVICT_MAX_BYTES


def test_a_rotation_is_distinct_equal_copies_spanning_the_bytes_asked():
    own = np.arange(4096, dtype=np.float32)                  # 16 KiB
    copies = rotation(types.SimpleNamespace(packed=own), 10 * own.nbytes + 1).copies
    assert copies[0] is own and len(copies) == 11
    assert len({c.ctypes.data for c in copies}) == 11 and all(np.array_equal(c, own) for c in copies)
    assert len(rotation(types.SimpleNamespace(packed=own[:16]), 1 << 30)) == MAX_COPIES
    assert rotation(types.SimpleNamespace(packed=own), 0) is None          # warm timing
    assert rotation(types.SimpleNamespace(packed=own), own.nbytes) is None  # larger than the span: cold anyway
    assert rotation(types.SimpleNamespace(), 1 << 20) is None               # nothing packed to rotate


class _Recorder:
    """A candidate that notes which packed buffer each run read."""

    def __init__(self):
        self.packed = np.zeros(1024, np.float32)
        self.seen = []

    def run(self, env, binding):
        self.seen.append(self.packed.ctypes.data)


def test_the_rotation_goes_on_across_timed_cases_so_every_copy_is_read_before_any_again(monkeypatch):
    # 3 cases over 7 copies: the runs read copies 0, 1, ..., 6, 0, 1, ... straight through the case
    # boundaries (a cycle restarted per case would read its first copies at every case). Exactly 5 runs
    # a case (no minimum case time, no noisy-case retry): how many runs a case takes must not depend
    # on this machine's timing, or a case could be a whole number of cycles and hide a restart
    monkeypatch.setattr(measure, "MIN_CASE_SECONDS", 0.0)
    cand = _Recorder()
    own = cand.packed
    cases = [({"L": n}, {}) for n in (1, 2, 3)]
    copies = {}
    for address in cand.seen:
        copies.setdefault(address, len(copies))
    measure_inline(cand, Workload("k", cases, evict_bytes=7 * own.nbytes), warmup=0, repeats=5,
                   max_spread=float("inf"))
    order = [copies.setdefault(address, len(copies)) for address in cand.seen]
    assert len(order) == 15     # 5 runs a case: no case is a whole number of 7-copy cycles
    assert len(copies) == 7 and order == [i % 7 for i in range(len(order))]


def test_a_cold_timing_reads_every_copy_and_the_candidate_keeps_its_own():
    cand = _Recorder()
    own = cand.packed
    m = measure_inline(cand, Workload("k", [({"L": 1}, {})], evict_bytes=8 * own.nbytes), warmup=1, repeats=8)
    assert m.ok and cand.packed is own
    assert len(set(cand.seen)) == 8                          # each of the 8 copies was read
    warm = _Recorder()
    measure_inline(warm, Workload("k", [({"L": 1}, {})]), warmup=1, repeats=8)
    assert set(warm.seen) == {warm.packed.ctypes.data}
