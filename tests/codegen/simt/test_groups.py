"""SIMT row-reduction and elementwise groups (grid-stride elements, one thread per row) of the tiny
exported models, run as OpenCL against the Plan interpreter at sequence 1 and a prime."""
from __future__ import annotations

import pytest

from tests.codegen.plan_runs import check_against_interpreter, model_plan
from tscomp.codegen.simt.dialect import body_of
from tscomp.codegen.simt.groups import SimtGroup, simt_group_source


@pytest.mark.models
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_row_and_elementwise_groups_match_the_interpreter(simt_device, exported_model, family):
    plan, ranges = model_plan(exported_model, family, "dynamo", attention=False)
    kernels = {g.name: SimtGroup(simt_group_source(plan, g)) for g in plan.groups
               if g.kind in ("elementwise", "reduce")}
    kinds = {g.kind for g in plan.groups if g.name in kernels}
    assert all(k.src.coop == (k.source_info.kind == "reduce") for k in kernels.values())
    assert kinds == {"elementwise", "reduce"}
    assert check_against_interpreter(plan, family, ranges, kernels) == 2 * len(kernels)
    for k in kernels.values():
        body = body_of(k.program.opencl)
        assert "#pragma omp" not in body and "malloc" not in body
        if k.src.coop:      # reduce groups: one work-group per row, tree reductions over its threads
            assert "for (int64_t f0 = TS_BLOCK(0);" in body and "-reduction over the work-group" in body
        else:               # elementwise: grid-stride loop, one element per thread per step
            assert "TS_BLOCK(0) * TS_NTHREADS(0) + TS_THREAD(0)" in body
        assert k.source.startswith("/*\n * tscomp SIMT kernel for fused group")


@pytest.mark.models
def test_batched_gemm_groups_match_the_interpreter(simt_device, exported_model):
    from tscomp.codegen.cpu_batched_gemm import BatchedGemmAnalysis
    from tscomp.codegen.simt.batched import SimtBatchedGemm
    from tscomp.errors import UnsupportedOperatorError
    plan, ranges = model_plan(exported_model, "bert", "torchscript", attention=False)
    kernels = {}
    for g in plan.groups:
        if g.kind == "gemm":
            try:
                kernels[g.name] = SimtBatchedGemm(BatchedGemmAnalysis(plan, g))
            except UnsupportedOperatorError as exc:
                assert "constant weight" in str(exc) or "stitched heavy ops" in str(exc)
    assert len(kernels) == 4          # QK^T and PV of both layers
    assert check_against_interpreter(plan, "bert", ranges, kernels) == 2 * len(kernels)
    for k in kernels.values():
        assert "prologue (while staging)" in k.source and "float v = 0.0f;" in k.program.body


@pytest.mark.models
@pytest.mark.parametrize("family,exporter,opset,staged", [("bert", "dynamo", None, 2), ("albert", "torchscript", 14, 3)])
def test_gemm_groups_with_a_computed_while_staging_match_the_interpreter(simt_device, exported_model, family, exporter,
                                                                         opset, staged):
    """The attention output read through a permute/reshape (BERT) and a decomposed LayerNorm tail as
    the GEMM's prologue (old-opset ALBERT) are computed per element while staging A: no host copy."""
    from tests.codegen.plan_runs import compile_gemm_groups
    from tscomp.codegen.cpu_gemm_group import GemmGroupAnalysis
    from tscomp.codegen.simt.config import SimtTile
    from tscomp.codegen.simt.gemm_group import SimtGemmGroup
    plan, ranges = model_plan(exported_model, family, exporter, opset, attention=False)
    tile = SimtTile(32, 64, 8, 16, 32, 2, 8, async_copy=True)
    kernels, _ = compile_gemm_groups(plan, lambda p, g: SimtGemmGroup(GemmGroupAnalysis(p, g), tile))
    a_staged = [k for k in kernels.values() if k.a_staged]
    assert len(a_staged) == staged
    for k in a_staged:
        assert "A computed while staging" in k.program.body and k.program.body.count("TS_COPY_ASYNC(&As") == 0
    assert check_against_interpreter(plan, family, ranges, kernels) == 2 * len(kernels)
