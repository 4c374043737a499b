"""The dispatch table made at load picks, at every binding, what the per-shape wave model picks."""
from __future__ import annotations

import numpy as np

from tscomp.runtime import Runtime
from tscomp.runtime.wave import pick_variant, wave_cost


def test_table_agrees_with_the_wave_model_at_every_sampled_binding(compiled_artifact):
    path, _, ranges = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2, warmup=False)
    multi = [g for g, ks in rt.model.kernels.items() if len(ks) > 1]
    assert multi and set(multi) <= set(rt._dispatch)          # every multi-variant group has a table
    rng = np.random.default_rng(0)
    (blo, bhi), (llo, lhi) = ranges["batch"], ranges["sequence"]
    bindings = [{"batch": b, "sequence": L} for b in (blo, bhi) for L in (llo, 2, 7, 97, lhi)]
    bindings += [{"batch": int(rng.integers(blo, bhi + 1)), "sequence": int(rng.integers(llo, lhi + 1))}
                 for _ in range(150)]
    for binding in bindings:
        for g in multi:
            variants = rt.model.kernels[g]
            got = variants[rt._dispatch[g].pick(binding)]
            want = pick_variant(variants, binding, rt.target)
            if got is not want:     # only a float tie may differ
                a, b = wave_cost(got, binding, rt.target), wave_cost(want, binding, rt.target)
                assert abs(a - b) <= 1e-9 * b, (g, binding, a, b)


def test_runtime_runs_the_tabled_variant(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2, warmup=False)
    binding = {"batch": 2, "sequence": 37}
    chosen = rt.selected_variants(binding)
    for g, table in rt._dispatch.items():
        if g in chosen:
            assert chosen[g] is rt.model.kernels[g][table.pick(binding)]
