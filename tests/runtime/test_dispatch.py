"""The dispatch table made at load picks, at every binding, what the per-shape wave model picks."""
from __future__ import annotations

import numpy as np
import pytest

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
            table = rt._dispatch[g]
            want = pick_variant(variants, binding, rt.target, table.surcharge, table.margin)
            if got is not want:     # only a float tie may differ
                a, b = (_charged_cost(variants, k, binding, rt.target, table) for k in (got, want))
                assert abs(a - b) <= 1e-9 * b, (g, binding, a, b)


def test_runtime_runs_the_tabled_variant(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2, warmup=False)
    binding = {"batch": 2, "sequence": 37}
    chosen = rt.selected_variants(binding)
    for g, table in rt._dispatch.items():
        if g in chosen:
            assert chosen[g] is rt.model.kernels[g][table.pick(binding)]


def test_tables_are_indexed_by_each_groups_extents_and_agree_with_the_wave_model(compiled_artifact):
    """ViT: three symbols (batch, height, width), but a GEMM's choice depends on its M alone: the
    table's key is that extent, and the pick agrees with the per-shape wave model."""
    import math

    from tscomp.runtime.dispatch import build_tables

    path, _, ranges = compiled_artifact("vit", keep_copies=True)
    rt = Runtime(path, num_threads=2, warmup=False)
    symtab = rt.graph.symbols
    tables = build_tables(rt.model.kernels, symtab, rt.target.with_threads(2))
    multi = [g for g, ks in rt.model.kernels.items() if len(ks) > 1 and ks[0].family in ("gemm", "batched-gemm")]
    assert multi and set(multi) <= set(tables)
    symbol_names = {s.name for s in symtab.live_symbols()}
    for g in multi:
        key = tables[g].key
        assert key.exprs and all(e.free_symbols for e in key.exprs)
        assert {e.name for e in key.exprs if e.is_Symbol} != symbol_names   # never simply the symbol grid
        assert tables[g].choice.size == math.prod(key.extents)
    _assert_tables_pick_what_the_wave_model_picks(rt, tables, multi, ranges, seed=1, draws=60)


def test_convolutions_get_tables_over_their_own_extents_too(exported_model, tmp_path, monkeypatch):
    """ResNet: a Conv group's choice depends on its batch and output positions; with task classes
    for the Conv families it is tabled like a GEMM's, and the table agrees with the wave model.
    (Every packed copy kept: tiny ResNet fits the cache, where the copy rule would keep one layout.)"""
    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime import dispatch
    from tscomp.runtime.artifact import write_artifact
    from tscomp.runtime.dispatch import build_tables

    monkeypatch.setattr(dispatch, "COPY_WORTH_RESIDENT", 0.0)
    monkeypatch.setattr(dispatch, "COPY_WORTH", 0.0)
    ranges = symbol_ranges("resnet")
    model = compile_model(str(exported_model("resnet", "tiny", "dynamo")),
                          [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=2)
    rt = Runtime(write_artifact(model, tmp_path / "resnet.tsc"), num_threads=2, warmup=False)
    tables = build_tables(rt.model.kernels, rt.graph.symbols, rt.target)
    convs = [g for g, ks in rt.model.kernels.items() if len(ks) > 1 and ks[0].family.startswith("conv")]
    assert convs and set(convs) <= set(tables)
    _assert_tables_pick_what_the_wave_model_picks(rt, tables, convs, ranges, seed=2, draws=40)


def _assert_tables_pick_what_the_wave_model_picks(rt, tables, groups, ranges, *, seed: int, draws: int):
    """At random bindings, each group's table gives the per-shape wave model's variant (or one of
    equal cost: only a float tie may differ)."""
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        binding = {n: int(rng.integers(lo, hi + 1)) for n, (lo, hi) in ranges.items()}
        for g in groups:
            variants = rt.model.kernels[g]
            table = tables[g]
            got, want = variants[table.pick(binding)], pick_variant(variants, binding, rt.target, table.surcharge, table.margin)
            if got is not want:
                a, b = (_charged_cost(variants, k, binding, rt.target, table) for k in (got, want))
                assert abs(a - b) <= 1e-9 * b, (g, binding, a, b)


def _charged_cost(variants, kernel, binding, target, table) -> float:
    """What a table compares: the wave model's cost with the variant's margin and surcharge."""
    v = variants.index(kernel)
    return wave_cost(kernel, binding, target) * (1.0 + table.margin[v]) + table.surcharge[v]


def _copy_charge(table, v: int) -> float:
    """The part of a variant's surcharge that is for reading another packed copy (the rest, for
    leaving the home variant, comes with a margin)."""
    from tscomp.runtime.dispatch import SWITCH_SECONDS
    return table.surcharge[v] - (SWITCH_SECONDS if table.margin[v] else 0.0)


def _copy(kernel):
    from tscomp.runtime.packing import copy_key
    return copy_key(kernel)


@pytest.fixture(scope="module")
def every_copy_artifact(exported_model, tmp_path_factory):
    """Tiny BERT compiled keeping every packed copy (COPY_WORTH[_RESIDENT] below any gain): groups whose
    variants read two copies of one weight."""
    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime import dispatch
    from tscomp.runtime.artifact import write_artifact

    ranges = symbol_ranges("bert", "tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "COPY_WORTH", -1.0)
        mp.setattr(dispatch, "COPY_WORTH_RESIDENT", -1.0)
        model = compile_model(str(exported_model("bert", "tiny", "dynamo")),
                              [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=2)
    return write_artifact(model, tmp_path_factory.mktemp("every-copy") / "bert.tsc")


def test_variants_reading_another_packed_copy_pay_a_surcharge_while_the_model_fits_the_cache(every_copy_artifact):
    """Tiny BERT fits the last level cache: per group, the variants reading the home packed copy
    (and copy-less ones) cost what the wave model says; a variant reading another copy of the
    weight is surcharged, and the table only picks it where it wins by more than that."""
    rt = Runtime(every_copy_artifact, num_threads=2, warmup=False)
    surcharged = 0
    for g, table in rt._dispatch.items():
        variants = rt.model.kernels[g]
        charges = [_copy_charge(table, v) for v in range(len(variants))]
        home = {_copy(k) for k, s in zip(variants, charges) if s == 0.0 and _copy(k) is not None}
        assert len(home) <= 1, g                     # one home copy per group
        for k, s in zip(variants, charges):
            assert s >= 0.0
            if s > 0.0:
                surcharged += 1
                assert _copy(k) is not None and _copy(k) not in home, g
    assert surcharged, "the fixture has GEMM variants with other register-tile widths (other packed copies)"


class _Copying:
    """A variant reading one packed array (what copy_key identifies it by)."""
    family = "test"

    def __init__(self, packed):
        self.packed = packed


def test_a_second_packed_copy_is_kept_only_where_its_variants_gain_enough():
    from tscomp.runtime.dispatch import COPY_WORTH, worthwhile_copies

    one, two = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
    variants = [_Copying(one), _Copying(one), _Copying(two)]
    base = np.array([[10.0, 20.0, 30.0, 40.0], [12.0, 18.0, 33.0, 44.0]])
    home_best = base.min(0)

    def kept(third_row):
        return {key[1] for key in worthwhile_copies(variants, np.vstack([base, third_row]))}

    A, B = one.ctypes.data, two.ctypes.data
    slower_large = np.array([1.0, 1.0, 1.5, 1.5])              # the second copy loses at large shapes
    assert kept(home_best * slower_large * [0.8, 0.8, 1, 1]) == {A, B}    # 25% faster at small ones: both
    assert kept(home_best * slower_large * [0.99, 0.99, 1, 1]) == {A}     # 1% there (0.5% over the grid)
    assert kept(home_best * [0.97, 1.5, 1.5, 1.5]) == {A}                 # 3% at one shape of four
    assert kept(home_best * 2) == {A}                                     # never faster
    assert kept(home_best * (1 - 3 * COPY_WORTH)) == {B}   # faster everywhere: it is the home copy, alone
    assert COPY_WORTH > 0


def test_a_copy_much_faster_at_a_few_shapes_is_kept_unless_the_model_stays_cached():
    """A copy 2x faster at one cell of 64 gains ~1% on average: below COPY_WORTH, but without it
    that shape runs twice as slow, past COPY_WORST_LOSS, so a model that streams its weights keeps
    it; a resident one (every switch between copies re-reads one) does not."""
    from tscomp.runtime.dispatch import COPY_WORST_LOSS, COPY_WORTH, copy_rule, worthwhile_copies

    one, two = np.zeros(1024, np.float32), np.zeros(1024, np.float32)
    variants = [_Copying(one), _Copying(two)]
    home = np.linspace(1.0, 64.0, 64)
    other = home * 1.5
    other[0] = home[0] / 2.0
    costs = np.vstack([home, other])
    A, B = one.ctypes.data, two.ctypes.data
    assert np.exp(np.mean(np.log(home / np.minimum(home, other)))) - 1 < COPY_WORTH < 1 < COPY_WORST_LOSS < 2
    assert {key[1] for key in worthwhile_copies(variants, costs, copy_rule(resident=False))} == {A, B}
    assert {key[1] for key in worthwhile_copies(variants, costs, copy_rule(resident=True))} == {A}
    other[0] = home[0] / (COPY_WORST_LOSS * 0.9)           # faster there, but by less than the worst loss
    assert {key[1] for key in worthwhile_copies(variants, np.vstack([home, other]))} == {A}


def test_a_model_that_fits_the_last_level_cache_keeps_a_second_copy_only_for_a_larger_gain(monkeypatch):
    """A second copy predicted 7% faster over the grid is kept for a model larger than the cache
    (COPY_WORTH) and dropped for one whose copies fit it (COPY_WORTH_RESIDENT: there every switch
    between copies re-reads one)."""
    from types import SimpleNamespace
    from tscomp.runtime import dispatch

    costs = np.array([[10.0, 20.0, 40.0], [9.0, 18.0, 44.0]])    # home: the first (70 vs 71 summed)
    assert dispatch.COPY_WORTH < 0.07 < dispatch.COPY_WORTH_RESIDENT
    monkeypatch.setattr(dispatch, "_cost_grid", lambda variants, symtab, target: (None, costs))
    monkeypatch.setattr(dispatch, "copy_key", lambda k: ("layout", k.packed.ctypes.data))

    def compile_with_llc(l3: int):
        variants = [_Copying(np.zeros(1024, np.float32)), _Copying(np.zeros(1024, np.float32))]
        dropped, worth = dispatch.drop_unworthy_copies({"g": variants}, None,
                                                       SimpleNamespace(spec=SimpleNamespace(llc_share=l3)))
        return len(variants), dropped, worth

    assert compile_with_llc(1024) == (2, {}, dispatch.copy_rule(resident=False))          # 8 KiB of copies > the cache
    assert compile_with_llc(1 << 25) == (1, {"g": 4096}, dispatch.copy_rule(resident=True))


def test_compiled_groups_keep_no_copy_their_costs_call_unworthy(compiled_artifact):
    """The compiler dropped what :func:`worthwhile_copies` would: run again on the artifact's own
    variants and costs, it keeps every copy they read."""
    from tscomp.runtime.dispatch import _cost_grid, drop_unworthy_copies, worthwhile_copies

    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2, warmup=False)
    checked = 0
    for g, variants in rt.model.kernels.items():
        copies = {_copy(k) for k in variants} - {None}
        grid = _cost_grid(variants, rt.graph.symbols, rt.target)
        if not copies or grid is None:
            continue
        assert worthwhile_copies(variants, grid[1]) == copies, g
        checked += 1
    # where this host's tiles left no group two copies (AVX2: a tiny model's second copy gains too
    # little), the rule is checked on the variants the heuristic proposed, every copy kept
    full, _, _ = compiled_artifact("bert", keep_copies=True)
    proposed = Runtime(full, num_threads=2, warmup=False).model.kernels
    kept = {g: list(ks) for g, ks in proposed.items()}
    _, rule = drop_unworthy_copies(kept, rt.graph.symbols, rt.target)
    for g, variants in proposed.items():
        grid = _cost_grid(variants, rt.graph.symbols, rt.target)
        if len({_copy(k) for k in variants} - {None}) < 2 or grid is None:
            continue
        assert {_copy(k) for k in kept[g]} - {None} == worthwhile_copies(variants, grid[1], rule), g
        checked += 1
    assert checked, "the fixtures have GEMM groups with several variants"


def test_a_model_larger_than_the_cache_pays_no_copy_surcharge(compiled_artifact):
    """With a last level cache too small for the weights, every copy streams from memory anyway:
    no copy surcharges (only the charges for leaving the home variant), and each table picks what
    the wave model picks under those charges."""
    import dataclasses

    from tscomp.runtime.dispatch import build_tables

    path, _, ranges = compiled_artifact("bert")
    rt = Runtime(path, num_threads=2, warmup=False)
    small = dataclasses.replace(rt.target, spec=dataclasses.replace(rt.target.spec, l3=4096))
    tables = build_tables(rt.model.kernels, rt.graph.symbols, small)
    assert tables and all(_copy_charge(t, v) == 0.0 for t in tables.values() for v in range(len(t.surcharge)))
    rng = np.random.default_rng(3)
    for _ in range(40):
        binding = {n: int(rng.integers(lo, hi + 1)) for n, (lo, hi) in ranges.items()}
        for g, table in tables.items():
            variants = rt.model.kernels[g]
            got, want = variants[table.pick(binding)], pick_variant(variants, binding, small, table.surcharge, table.margin)
            if got is not want:
                a, b = (_charged_cost(variants, k, binding, small, table) for k in (got, want))
                assert abs(a - b) <= 1e-9 * b, (g, binding, a, b)


def test_the_home_variant_serves_every_shape_where_another_wins_by_less_than_a_switch_costs():
    """Per shape, another variant replaces the home one only where it is predicted faster by more
    than SWITCH_MARGIN of its cost plus SWITCH_SECONDS: not on a few percent (the model's noise),
    but on a clear gain."""
    from tscomp.runtime.dispatch import SWITCH_MARGIN, SWITCH_SECONDS, charged_choice, switch_charges

    us = 1e-6
    home = np.array([10, 20, 100, 1000, 1000]) * us
    other = home * np.array([0.98, 0.6, 0.9, 0.97, 0.85])   # faster at every shape
    costs = np.vstack([home, other])
    surcharge, margin = switch_charges(costs, 0, np.zeros(2))
    assert list(surcharge) == [0.0, SWITCH_SECONDS] and list(margin) == [0.0, SWITCH_MARGIN]
    # 2% of 10 us and 3% of 1 ms: noise; 40%, 10% and 15% faster: clear
    assert list(charged_choice(costs, surcharge, margin)) == [0, 1, 1, 0, 1]
    # with the other variant home, the first one never wins back a switch
    surcharge, margin = switch_charges(costs, 1, np.zeros(2))
    assert list(charged_choice(costs, surcharge, margin)) == [1, 1, 1, 1, 1]
    # a copy surcharge adds to the switch charge
    surcharge, margin = switch_charges(costs, 0, np.array([0.0, 50 * us]))
    assert list(charged_choice(costs, surcharge, margin)) == [0, 0, 0, 0, 1]


class _RowTiles:
    """A stand-in kernel whose task classes read an output's rows, its columns and their product
    (as the Winograd and depthwise Conv classes do): tiles of ``tile`` x ``width`` positions, one
    task each; one measured time per wave."""
    family = "row-tiles"
    samples = ()
    t_wave = 1e-6

    def __init__(self, symtab, tile: int, width: int):
        self.symtab, self.tile, self.width = symtab, tile, width

    def resources(self):
        return {}

    @staticmethod
    def classes(k, ev, threads):
        rows, cols, positions = ev(k.rows), ev(k.cols), ev(k.rows * k.cols)
        return [(-(-rows // k.tile) * -(-cols // k.width), positions * 0 + k.tile * k.width)]


@pytest.fixture
def row_tile_variants(monkeypatch):
    """(symbol table, rows, cols, two _RowTiles variants) over 32..448 images: rows and cols
    floor((H + 3) / 4) and floor((W + 3) / 4), 105 values each; the task classes registered."""
    import sympy

    from tscomp.graph.symbols import SymbolTable
    from tscomp.runtime import wave

    symtab = SymbolTable()
    h = symtab.new_symbol("height", origin="test", min=32, max=448)
    w = symtab.new_symbol("width", origin="test", min=32, max=448)
    rows, cols = sympy.floor((h + 3) / 4), sympy.floor((w + 3) / 4)
    monkeypatch.setitem(wave.CLASSES, _RowTiles.family, _RowTiles.classes)
    variants = [_RowTiles(symtab, tile, width) for tile, width in ((4, 16), (7, 8))]
    for k in variants:
        k.rows, k.cols = rows, cols
    return symtab, rows, cols, variants


def test_a_key_extent_that_is_a_product_of_others_is_computed_per_cell_not_made_a_table_axis(row_tile_variants):
    """A Conv's task classes may read its output rows, its columns and their product: the table is
    indexed by the rows and columns alone (the product computed per cell), so a 32..448 image gets
    a table of 105 x 105 cells instead of a grid with the product as a third axis (105 x 105 x
    12,481, too large to make, which left ResNet-50's 3x3 Convs picked in Python at every new image
    size), and the table's pick is the wave model's at every cell."""
    from tscomp.runtime import dispatch
    from tscomp.schedule.target import host_cpu

    symtab, rows, cols, variants = row_tile_variants
    key = dispatch.dispatch_key(variants, symtab)
    assert key is not None and set(key.exprs) == {symtab.canon(rows), symtab.canon(cols)}
    assert key.cells == 105 * 105
    target = host_cpu(threads=2)
    tables = dispatch.build_tables({"g": variants}, symtab, target)
    table = tables["g"]
    assert len(set(table.choice.reshape(-1).tolist())) == 2       # the picks differ across the image sizes
    for hv in (32, 33, 97, 211, 448):
        for wv in (32, 61, 448):
            binding = {"height": hv, "width": wv}
            want = pick_variant(variants, binding, target, table.surcharge, table.margin)
            assert variants[table.pick(binding)] is want, binding


def test_table_axes_keep_rounded_and_foreign_extents_and_drop_integer_polynomials_of_the_others():
    import sympy

    from tscomp.runtime.dispatch import _table_axes

    a, b, c = sympy.symbols("a b c", positive=True, integer=True)
    assert set(_table_axes([a, b, a * b, 2 * a + b * b - 1])) == {a, b}
    assert set(_table_axes([a, sympy.floor(a / 2), a * c])) == {a, sympy.floor(a / 2), a * c}


def test_a_key_beyond_max_grid_is_tabled_coarser_and_decided_at_each_cells_least_value(row_tile_variants, monkeypatch):
    """Where a key's values exceed MAX_GRID cells, the longest axes cover 2, 4, ... values per cell:
    the table fits, and each cell holds the wave model's pick at the least value it covers."""
    from tscomp.runtime import dispatch
    from tscomp.schedule.target import host_cpu

    symtab, rows, cols, variants = row_tile_variants
    monkeypatch.setattr(dispatch, "MAX_GRID", 2000)
    target = host_cpu(threads=2)
    table = dispatch.build_tables({"g": variants}, symtab, target)["g"]
    key = table.key
    assert key.cells <= 2000 < 105 * 105 and max(key.steps) > 1
    assert table.choice.size == key.cells
    checked = 0
    for r in key.cell_values()[key.exprs.index(symtab.canon(rows))][::3]:
        for c in key.cell_values()[key.exprs.index(symtab.canon(cols))][::5]:
            binding = {"height": 4 * int(r) - 3, "width": 4 * int(c) - 3}       # rows = r, cols = c exactly
            want = pick_variant(variants, binding, target, table.surcharge, table.margin)
            assert variants[table.pick(binding)] is want, binding
            neighbour = {"height": binding["height"] + 4, "width": binding["width"]}   # rows r + 1: same cell or next
            r_axis = key.exprs.index(symtab.canon(rows))
            lo, step = key.mins[r_axis], key.steps[r_axis]
            least = int(r) + 1 - (int(r) + 1 - lo) % step
            assert table.pick(neighbour) == table.pick({"height": 4 * least - 3, "width": binding["width"]})
            checked += 1
    assert checked > 20


def test_a_model_compiled_with_coarse_tables_serves_every_request_in_c_and_matches_onnxruntime(
        exported_model, tmp_path, monkeypatch):
    """Tiny BERT compiled with MAX_GRID far below its key ranges (M = batch x sequence up to 4,096):
    the host program indexes the coarse tables (every group tabled, the C request path serves), the
    Python path picks what they pick, and the outputs match onnxruntime."""
    import onnxruntime as ort

    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime import dispatch
    from tscomp.runtime.artifact import write_artifact

    monkeypatch.setattr(dispatch, "MAX_GRID", 64)
    monkeypatch.setattr(dispatch, "COPY_WORTH", 0.0)
    monkeypatch.setattr(dispatch, "COPY_WORTH_RESIDENT", 0.0)
    onnx_path = exported_model("bert", "tiny", "dynamo")
    ranges = symbol_ranges("bert", "tiny")
    model = compile_model(str(onnx_path), [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=2)
    rt = Runtime(write_artifact(model, tmp_path / "bert.tsc"), num_threads=2)
    coarse = [t for t in rt._dispatch.values() if max(t.key.steps) > 1]
    assert coarse and all(t.key.cells <= 64 for t in rt._dispatch.values())
    assert rt._native.picked_per_call == [] and rt.request_path_note == "native (C)"
    steps = {step for t in coarse for step in t.key.steps if step > 1}
    assert all(f", 0) / {step}, " in rt._native.program.source for step in steps)   # C indexes by cell too
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    from tscomp.sample_inputs import random_inputs
    rng = np.random.default_rng(4)
    for b, L in ((1, 1), (2, 37), (3, 130), (8, 512)):
        binding = {"batch": b, "sequence": L}
        chosen = rt.selected_variants(binding)
        for g, table in rt._dispatch.items():
            if g in chosen:
                assert chosen[g] is rt.model.kernels[g][table.pick(binding)]
        inputs = random_inputs(rt.graph, binding, rng)
        got = rt.run(inputs)
        want = sess.run(None, {i.name: inputs[i.name] for i in sess.get_inputs()})
        for name, ref in zip([o.name for o in sess.get_outputs()], want):
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {binding}")
