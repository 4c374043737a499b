"""The symbolic buffer plan (placement decided once, offsets as expressions): at every binding no
two tensors that are live together share a byte, everything fits the arena, and the C rendering
computes the same offsets."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import sympy

from tscomp.graph.symbols import SymbolTable
from tscomp.runtime.buffers import Lifetime, plan_buffers
from tscomp.runtime.symbolic_buffers import SymbolicLifetime, plan_buffers_symbolic


def _table():
    t = SymbolTable()
    B = t.new_symbol("B", origin="user", min=1, max=8)
    L = t.new_symbol("L", origin="user", min=1, max=512)
    return t, B, L


def _chain(B, L):
    """A transformer layer's crossing tensors: sizes in bytes, lifetimes over 9 steps."""
    H = 4 * B * L * 64
    return [SymbolicLifetime("qkv", 3 * H, 0, 2), SymbolicLifetime("scores", 4 * 2 * B * L * L, 1, 2),
            SymbolicLifetime("ctx", H, 2, 3), SymbolicLifetime("attn", H, 3, 5), SymbolicLifetime("ln1", H, 4, 7),
            SymbolicLifetime("ffn", 4 * H, 5, 6), SymbolicLifetime("ffn2", H, 6, 7), SymbolicLifetime("out", H, 7, 8),
            SymbolicLifetime("mask", 4 * B * L, 0, 8), SymbolicLifetime("odd", B * L + 3, 2, 6)]


def _check(plan, lifetimes, binding, sizes):
    conc = plan.evaluate(binding)
    for a in lifetimes:
        oa, ea = conc.offsets[a.name], conc.offsets[a.name] + sizes[a.name]
        assert 0 <= oa and ea <= conc.arena_bytes and oa % 64 == 0
        for b in lifetimes:
            if a.name < b.name and not (a.last < b.first or b.last < a.first):
                ob, eb = conc.offsets[b.name], conc.offsets[b.name] + sizes[b.name]
                assert ea <= ob or eb <= oa, f"{a.name} and {b.name} overlap at {binding}"
    return conc


@pytest.mark.parametrize("binding", [{"B": 1, "L": 1}, {"B": 1, "L": 7}, {"B": 3, "L": 97}, {"B": 8, "L": 512},
                                     {"B": 8, "L": 1}, {"B": 1, "L": 512}])
def test_live_tensors_never_overlap_at_any_binding(binding):
    t, B, L = _table()
    lts = _chain(B, L)
    plan = plan_buffers_symbolic(lts, t)
    subs = {B: binding["B"], L: binding["L"]}
    sizes = {lt.name: int(lt.nbytes.xreplace(subs)) for lt in lts}
    conc = _check(plan, lts, binding, sizes)
    first_fit = plan_buffers([Lifetime(lt.name, sizes[lt.name], lt.first, lt.last) for lt in lts])
    assert conc.arena_bytes <= 1.5 * first_fit.arena_bytes + 64 * len(lts)   # placement fixed once, still compact


def test_c_rendering_computes_the_same_offsets(tmp_path):
    from tscomp.codegen.build import build_library, load_library
    from tscomp.codegen.c_expr import PRELUDE

    t, B, L = _table()
    lts = _chain(B, L)
    plan = plan_buffers_symbolic(lts, t)
    src = PRELUDE + plan.c_source("plan_fn", ["B", "L"])
    lib = load_library(build_library(src, "tscomp_test_symbolic_buffers"))
    fn = lib.plan_fn
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    for b, l in [(1, 1), (2, 13), (8, 512), (5, 333)]:
        sym = np.array([b, l], np.int64)
        out = np.zeros(len(plan.order), np.int64)
        arena = fn(sym.ctypes.data, out.ctypes.data)
        want = plan.evaluate({"B": b, "L": l})
        assert arena == want.arena_bytes
        assert dict(zip(plan.order, out.tolist())) == want.offsets


def test_runtime_arena_plan_is_valid_and_compact_on_tiny_bert(compiled_artifact):
    """The runtime's plan (made once at load) on a real model: live intermediates never share bytes
    at awkward shapes, and at the largest shape it is as compact as per-shape first-fit."""
    from tscomp.runtime import Runtime

    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, warmup=False)
    graph = rt.graph
    produced_at, last_read = rt._order
    keep = set(graph.outputs) | set(graph.inputs)
    for binding in ({"batch": 1, "sequence": 1}, {"batch": 3, "sequence": 97}, {"batch": 8, "sequence": 512}):
        lts, sizes = [], {}
        for name, k in produced_at.items():
            if name in keep:
                continue
            shape = [int(graph.symbols.evaluate(d, binding)) for d in graph.values[name].shape]
            sizes[name] = int(np.prod(shape, dtype=np.int64)) * np.dtype(graph.values[name].dtype).itemsize
            lts.append(SymbolicLifetime(name, sympy.Integer(sizes[name]), k, last_read.get(name, k)))
        conc = _check(rt._buffer_plan, lts, binding, sizes)
        first_fit = plan_buffers([Lifetime(lt.name, sizes[lt.name], lt.first, lt.last) for lt in lts])
        assert conc.arena_bytes <= 1.5 * first_fit.arena_bytes + 64 * len(lts)
    assert conc.arena_bytes == first_fit.arena_bytes
