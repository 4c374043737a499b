"""What a switch to a variant costs when the model's data stays cached (schedule/cold_start.py)."""
from __future__ import annotations

import types

import numpy as np

from tscomp.schedule.cold_start import data_key, refill_seconds, resident
from tscomp.schedule.target import host_cpu


def plan_with_constants(*sizes):
    values = {f"w{i}": types.SimpleNamespace(const=np.zeros(n, np.float32)) for i, n in enumerate(sizes)}
    values["x"] = types.SimpleNamespace(const=None)
    return types.SimpleNamespace(graph=types.SimpleNamespace(values=values))


def test_a_model_is_resident_when_its_constants_fit_the_last_level_cache():
    target = host_cpu(2)
    l3_floats = target.spec.l3 // 4
    assert resident(plan_with_constants(l3_floats // 4, l3_floats // 4), target)
    assert not resident(plan_with_constants(l3_floats, 16), target)


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
