"""The implicit-GEMM Conv search space: valid points only, the Conv heuristic inside it, and a tuned
compile of a Conv model (the tuner measuring conv candidates) that still matches onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tscomp.codegen.tile_config import MAX_ACCUMULATORS
from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.schedule.conv_space import ConvSpace
from tscomp.schedule.schedules import TuningOptions
from tests.codegen.test_cpu_conv import _model
from tests.schedule.test_gemm_space import TARGETS


@pytest.mark.parametrize("isa", sorted(TARGETS))
@pytest.mark.parametrize("ocg,k", [(64, 576), (8, 27), (512, 4608), (70, 9)])
def test_conv_space_hands_out_valid_configs_and_holds_the_heuristic(isa, ocg, k):
    target = TARGETS[isa]
    space = ConvSpace(ocg, k, target)
    assert len(space) > 0 and space.initial()
    rng = np.random.default_rng(0)
    for p in space.sample(rng, 30) + [space.project(x) for x in rng.random((30, space.dim))] + space.initial():
        assert space.is_valid(p), space.violations(p)
        cfg = space.config(p)
        assert cfg.accumulators(isa) <= MAX_ACCUMULATORS[isa] and cfg.kc <= k


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_conv_space_spans_both_vector_axes_and_maps_a_row_vector_tile_back_to_its_point(isa):
    # vector_axis 0 (lanes along the channels) is an axis of the space: its points give row-vector
    # tiles (mr whole vectors of channels, nr broadcast positions) and such a tile maps back exactly
    space = ConvSpace(512, 4608, TARGETS[isa])
    width = TARGETS[isa].spec.vector_width
    points = space.sample(np.random.default_rng(1), 200)
    rows = [space.config(p) for p in points if p["vector_axis"] == 0]
    assert rows and [space.config(p) for p in points if p["vector_axis"] == 1]
    for cfg in rows:
        assert cfg.vector_axis == 0 and cfg.mr % width == 0 and cfg.mc % cfg.mr == 0
        assert space.config(space.point_of(cfg)) == cfg
    assert any(space.config(p).vector_axis == 0 for p in space.initial())


def test_tuned_conv_compile_measures_candidates_and_matches_onnxruntime(tmp_path):
    path = tmp_path / "c.onnx"
    _model(path, [("a", 16, (3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 1]), ("relu",))])
    tuning = TuningOptions(tune=True, trials=3, seconds=None, timeout_s=30, max_variants=2)
    model = compile_model(str(path), ["batch=1:2", "H=1:40", "W=1:40"], tuning=tuning)
    (group,) = model.plan.groups
    assert model.schedules.groups[group.name].method == "turbo"
    assert model.kernels[group.name][0].family == "conv"
    rt = Runtime.from_compiled(model, num_threads=2)
    x = np.random.default_rng(0).standard_normal((2, 4, 13, 37)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(rt.run({"x": x})["a_0"], want, rtol=1e-4, atol=1e-4)
