"""Sample shapes for measuring kernels are bounded by memory, never by the declared maximum alone."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tscomp.schedule.samples import footprint, memory_budget, sample_bindings


@pytest.fixture(scope="module")
def bert_plan(exported_model):
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse

    path = exported_model("bert", "tiny", "dynamo")
    return path, lambda dims: fuse(load_model(str(path), dims))


def test_samples_grow_the_widest_symbol_and_move_the_others_along_to_the_top_of_their_ranges(bert_plan):
    _, plan_of = bert_plan
    bindings = sample_bindings(plan_of(["batch=2:8", "sequence=1:512"]))
    assert [b["sequence"] for b in bindings] == [1, 4, 8, 12, 16, 64, 128, 256, 512]
    batches = [b["batch"] for b in bindings]
    assert batches[:5] == [2] * 5                    # short sequences keep the short-M samples exact
    assert batches == sorted(batches) and batches[-1] == 8 and 2 < batches[6] < 8


def test_a_range_few_sample_points_fall_into_is_sampled_at_geometric_steps(bert_plan):
    from tscomp.schedule.samples import MIN_SAMPLES

    _, plan_of = bert_plan
    values = [b["sequence"] for b in sample_bindings(plan_of(["batch=1:1", "sequence=64:256"]))]
    assert values == [64, 91, 128, 181, 256] and len(values) == MIN_SAMPLES
    ratios = [b / a for a, b in zip(values, values[1:])]
    assert max(ratios) / min(ratios) < 1.02           # equal ratios, not equal steps


def test_a_fixed_shape_is_sampled_once(bert_plan):
    _, plan_of = bert_plan
    assert [b["sequence"] for b in sample_bindings(plan_of(["batch=1:1", "sequence=77:77"]))] == [77]


def test_a_symbol_with_a_fixed_value_stays_fixed(bert_plan):
    _, plan_of = bert_plan
    assert all(b["batch"] == 3 for b in sample_bindings(plan_of(["batch=3:3", "sequence=1:512"])))


def test_a_huge_declared_range_is_sampled_within_the_memory_budget(bert_plan):
    _, plan_of = bert_plan
    plan = plan_of(["batch=1:1000000", "sequence=1:64"])
    budget = 64 << 20
    with pytest.warns(RuntimeWarning, match="sample budget"):
        bindings = sample_bindings(plan, budget=budget)
    assert max(b["batch"] for b in bindings) < 1000000
    assert all(footprint(plan, b) <= budget for b in bindings)


def test_compiling_a_huge_batch_range_takes_ordinary_memory(bert_plan):
    import resource

    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    path, _ = bert_plan
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        model = compile_model(str(path), ["batch=1:1000000", "sequence=1:64"])
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 2 * memory_budget() / 2**20 + 512, f"compile grew the process by {grown_mib:.0f} MiB"
    rt = Runtime.from_compiled(model)
    ids = np.ones((3, 5), np.int64)
    out = rt.run({"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)})
    assert all(np.isfinite(v).all() for v in out.values())


def test_samples_keep_the_relations_the_model_records(tmp_path):
    """A Reshape that halves H (pixel-unshuffle as TorchScript exports it) needs an even H: the
    geometric samples of 16:48 (21 and 37 odd) move to the nearest even sides, so no kernel is
    timed at a shape the model refuses."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper

    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse

    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]), helper.make_node("Reshape", ["u", "t"], ["y"])]
    inits = [helper.make_tensor("ax", TP.INT64, [1], [3]), helper.make_tensor("t", TP.INT64, [5], [0, 0, -1, 2, 0])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["B", 4, "H", "W"])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "unshuffle.onnx"
    onnx.save(model, str(path))
    plan = fuse(load_model(str(path), ["B=1:1", "W=1:1", "H=16:48"]))
    heights = [b["H"] for b in sample_bindings(plan)]
    assert heights == sorted(set(heights)) and heights[0] == 16 and heights[-1] == 48 and len(heights) >= 4
    assert all(h % 2 == 0 for h in heights), heights
