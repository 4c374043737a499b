"""Issue 11, acceptance 1: every family in ``models/`` (tiny, both exporters) compiles with no group
on the numpy fallback, except groups that read only shape values (they run once per shape, at
planning time). Reuses the session's compiled artifacts (tests/runtime/conftest.py), so it costs
nothing beyond the runtime tests that compile the same models."""
from __future__ import annotations

import pytest

from models.families import FAMILIES
from tscomp.runtime import Runtime

#: ops whose groups may still run on numpy: none (Conv, depthwise Conv and the pools have native
#: families, tscomp/codegen/cpu_conv.py and cpu_pool.py); ConvTranspose occurs in no family here
CONV_POOL_OPS = frozenset()

MODELS = [pytest.param(f, e, id=f"{f}-{e}") for f in FAMILIES for e in ("dynamo", "torchscript")]


def shape_only_groups(plan) -> set[str]:
    """Groups reading no run-time tensor: only constants, shape values and such groups' outputs."""
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
def test_no_group_of_a_supported_model_runs_on_numpy(compiled_artifact, family, exporter):
    path, _, _ = compiled_artifact(family, exporter)
    rt = Runtime(path, num_threads=2, warmup=False)
    plan = rt.plan
    shape_only = shape_only_groups(plan)
    fallback = set(rt.model.fallback_groups())
    by_name = {g.name: g for g in plan.groups}
    bad = {}
    for name in sorted(fallback - shape_only):
        ops = {o.op_type for o in by_name[name].ops()}
        if ops & CONV_POOL_OPS:
            continue
        bad[name] = (sorted(ops), list(rt.model.kernels[name][0].reasons))
    assert not bad, f"{family}-{exporter}: groups on the numpy fallback: {bad}"
    # the fallback reasons name something (never an empty refusal)
    for name in fallback:
        assert rt.model.kernels[name][0].reasons, name
