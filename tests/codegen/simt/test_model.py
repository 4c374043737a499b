"""Whole tiny models through the SIMT families on OpenCL against onnxruntime at random shapes
including 1, primes and the range ends; which families and staging paths ran is asserted."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.codegen.plan_runs import model_plan
from tscomp.codegen.simt.families import SimtPlanRunner


def _shapes(ranges, n, rng):
    lo_b, hi_b = ranges["batch"]
    lo_s, hi_s = ranges["sequence"]
    fixed = [(1, 1), (2, 13), (lo_b, hi_s), (3, 97), (hi_b, 7)]
    extra = [(int(rng.integers(lo_b, min(hi_b, 4) + 1)), int(rng.integers(lo_s, hi_s + 1))) for _ in range(n - len(fixed))]
    return fixed + extra


@pytest.mark.models
@pytest.mark.parametrize("family,exporter", [("gpt2", "dynamo"), ("bert", "torchscript")])
def test_tiny_model_on_the_simt_device_matches_onnxruntime(simt_device, exported_model, family, exporter):
    from models.families import make_inputs
    plan, ranges = model_plan(exported_model, family, exporter, attention=False)
    runner = SimtPlanRunner(plan)
    fams = {k.family for k in runner.kernels.values()}
    assert {"simt-gemm", "simt-batched-gemm", "simt-row-or-elementwise"} <= fams
    fallback = {n: k.reasons for n, k in runner.kernels.items() if k.family == "numpy"}
    # the only groups left to numpy compute shape values / masks from shape values
    sess = ort.InferenceSession(str(exported_model(family, "tiny", exporter)), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for b, s in _shapes(ranges, 10, rng):
        inputs = make_inputs(family, {"batch": b, "sequence": s}, rng, size="tiny")
        got = runner.run(inputs)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} at batch={b} seq={s}")
    ran = set(runner.families_run.values())
    assert {"simt-gemm", "simt-batched-gemm", "simt-row-or-elementwise"} <= ran
    gemms = [k for k in runner.kernels.values() if k.family == "simt-gemm"]
    if simt_device == "opencl":
        assert all(k.paths_run == {"plain"} for k in gemms)   # OpenCL runs the plain staging path
    else:                                                     # sm_80+: cp.async where the tile has it
        assert all(k.paths_run == {"async" if k.cfg.async_copy else "plain"} for k in gemms)
    assert any(k.cfg.async_copy and "#if TS_ASYNC_COPY" in k.program.body for k in gemms)
    assert any(k.has_row_pass for k in gemms)                  # residual + LayerNorm fused
    print(f"{family}-{exporter}: numpy fallback groups {sorted(fallback)}")


@pytest.mark.models
def test_a_plan_run_keeps_intermediates_and_constants_on_the_device(simt_device, exported_model):
    """One device session per inference: a group's outputs stay on the device for the next, graph
    constants and packed weights are uploaded once per device. From the second call on, tiny
    BERT's run uploads its inputs (and the index checks' 4-int64 error records) and reads back its
    outputs (and those records) only -- no group in between goes through the host; the memory of
    values no later group reads is reused."""
    from models.families import make_inputs
    plan, _ = model_plan(exported_model, "bert", "dynamo", attention=False)
    runner = SimtPlanRunner(plan)
    rng = np.random.default_rng(5)
    first = second = None
    for b, s in ((2, 37), (2, 37), (3, 11)):
        inputs = make_inputs("bert", {"batch": b, "sequence": s}, rng, size="tiny")
        out = runner.run(inputs)
        if first is None:
            first = runner.last_transfers
            continue
        second = runner.last_transfers
        checks = sum(1 for k in runner.kernels.values() if getattr(getattr(k, "source_info", None), "checks_indices", False))
        in_bytes = sum(v.nbytes for v in inputs.values())
        out_bytes = sum(v.nbytes for v in out.values())
        assert second["host_steps"] == 0
        assert in_bytes <= second["upload_bytes"] <= in_bytes + 32 * (checks + 1), second
        assert out_bytes <= second["download_bytes"] <= out_bytes + 32 * (checks + 1), second
    assert first["upload_bytes"] > 100 * second["upload_bytes"]      # the weights and constants, once
    # dead values' memory is reused: the run holds less than all its groups' outputs together
    from tscomp.graph.reference import bind_symbols
    graph = plan.graph
    binding = bind_symbols(graph, inputs)
    produced = sum(int(np.prod([graph.symbols.evaluate(d, binding) for d in graph.values[n].shape]))
                   * np.dtype(graph.values[n].dtype).itemsize for g in plan.groups for n in g.outputs)
    assert second["reused"] > 0 and second["peak_bytes"] < produced, (second, produced)
