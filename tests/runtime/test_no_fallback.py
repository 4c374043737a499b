"""Issue 11, acceptance 1: every family in ``models/`` (tiny, both exporters) compiles with no group
on the numpy fallback, except groups that read only shape values (they run once per shape, at
planning time).

Which groups fall back is decided by :func:`~tscomp.codegen.families.choose_family` alone (the
compiler builds whatever family accepts a group and falls back only where none does), so this test
asks it on each model's Plan instead of compiling: under ``pytest -n 2`` the session's compiled
artifacts (tests/runtime/conftest.py) live in whichever worker compiled them, and reusing them here
would mean compiling every model a second time in the other worker. That the compiled models match
onnxruntime is test_runtime's job."""
from __future__ import annotations

import pytest

from models.families import FAMILIES, symbol_ranges
from tscomp.codegen.families import choose_family

#: ops whose groups may still run on numpy: none (Conv, depthwise Conv and the pools have native
#: families, tscomp/codegen/cpu_conv.py and cpu_pool.py); ConvTranspose occurs in no family here
CONV_POOL_OPS = frozenset()

MODELS = [pytest.param(f, e, id=f"{f}-{e}") for f in FAMILIES for e in ("dynamo", "torchscript")]


def shape_only_groups(plan) -> set[str]:
    """Groups reading no run-time tensor: only constants, shape values and such groups' outputs
    (the runtime runs them once per shape, when it plans the shape)."""
    graph, static, out = plan.graph, set(), set()
    for g in plan.groups:
        if all(n in static or (n not in graph.inputs and (graph.values[n].const is not None
                                                           or graph.values[n].symdata is not None))
               for n in g.inputs):
            out.add(g.name)
            static.update(g.outputs)
    return out


@pytest.mark.models
@pytest.mark.parametrize("family,exporter", MODELS)
def test_no_group_of_a_supported_model_runs_on_numpy(exported_model, family, exporter):
    import tscomp.graph as G
    from tscomp.graph.fusion import fuse

    ranges = symbol_ranges(family, "tiny")
    plan = fuse(G.load_model(str(exported_model(family, "tiny", exporter)),
                             [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]))
    shape_only = shape_only_groups(plan)
    bad, native = {}, 0
    for g in plan.groups:
        choice = choose_family(plan, g)
        if choice.family is not None:
            native += 1
            continue
        assert choice.reasons, f"{g.name} fell back without a reason"
        ops = {o.op_type for o in g.ops()}
        if g.name in shape_only or ops & CONV_POOL_OPS:
            continue
        bad[g.name] = (sorted(ops), list(choice.reasons))
    assert not bad, f"{family}-{exporter}: groups on the numpy fallback: {bad}"
    assert native, f"{family}-{exporter}: no group compiled natively"
