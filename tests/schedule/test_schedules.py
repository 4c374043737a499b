"""The schedule stage end to end on small models: identical groups are tuned once, tuning records
are reused, tuned artifacts stay correct, the manifest says where each configuration came from."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from tscomp.compiler import compile_model
from tscomp.runtime import Runtime
from tscomp.schedule.records import RecordStore
from tscomp.schedule.schedules import TuningOptions, diverse_set


def two_layer_mlp(path, hidden=32, inner=64, layers=2):
    """x[B, L, hidden] -> layers x (MatMul+bias -> Relu -> MatMul+bias + residual); weights differ
    per layer, structure does not."""
    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "x"
    for k in range(layers):
        for name, shape in ((f"w1_{k}", (hidden, inner)), (f"b1_{k}", (inner,)), (f"w2_{k}", (inner, hidden)),
                            (f"b2_{k}", (hidden,))):
            inits.append(helper.make_tensor(name, TP.FLOAT, shape, rng.standard_normal(shape).astype(np.float32)
                                            .ravel() * 0.2))
        nodes += [helper.make_node("MatMul", [cur, f"w1_{k}"], [f"h{k}"]),
                  helper.make_node("Add", [f"h{k}", f"b1_{k}"], [f"hb{k}"]),
                  helper.make_node("Relu", [f"hb{k}"], [f"r{k}"]),
                  helper.make_node("MatMul", [f"r{k}", f"w2_{k}"], [f"o{k}"]),
                  helper.make_node("Add", [f"o{k}", f"b2_{k}"], [f"ob{k}"]),
                  helper.make_node("Add", [f"ob{k}", cur], [f"y{k}"])]
        cur = f"y{k}"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TP.FLOAT, ["B", "L", hidden])],
                          [helper.make_tensor_value_info(cur, TP.FLOAT, ["B", "L", hidden])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return str(path)


DIMS = ["B=1:2", "L=1:33"]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return two_layer_mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx")


def tiny_tuning(**kw) -> TuningOptions:
    return TuningOptions(tune=True, trials=kw.pop("trials", 4), seconds=None, timeout_s=30, **kw)


def check_matches_onnxruntime(model, path):
    rt = Runtime.from_compiled(model)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for B, L in ((1, 1), (2, 7), (1, 33), (2, 13)):
        x = rng.standard_normal((B, L, 32)).astype(np.float32)
        got = rt.run({"x": x})
        want = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4)


def test_identical_layers_are_tuned_once_and_share_the_result(mlp):
    model = compile_model(mlp, DIMS, tuning=tiny_tuning())
    gemm = {n: s for n, s in model.schedules.groups.items() if s.family == "gemm"}
    assert len(gemm) == 4
    tuned = [s for s in gemm.values() if s.shared_with is None]
    shared = [s for s in gemm.values() if s.shared_with is not None]
    assert len(tuned) == 2 and len(shared) == 2, {n: (s.method, s.shared_with) for n, s in gemm.items()}
    assert all(s.method == "turbo" and 1 <= s.trials <= 4 for s in tuned)
    by_group = {s.group: s for s in tuned}
    for s in shared:
        first = by_group[s.shared_with]
        assert s.signature == first.signature and s.variants is first.variants
    # the kept variants carry their measured samples, so nothing is timed again
    for name, ks in model.kernels.items():
        if ks[0].family == "gemm":
            assert all(k.samples and k.tuning["method"] == "turbo" for k in ks)
    check_matches_onnxruntime(model, mlp)


def test_records_are_reused_by_a_later_compile(mlp, tmp_path):
    store = RecordStore(tmp_path / "records.json")
    first = compile_model(mlp, DIMS, tuning=tiny_tuning(records=store, trials=3))
    store.save()
    assert len(RecordStore.load(tmp_path / "records.json")) == 2
    again = compile_model(mlp, DIMS, tuning=tiny_tuning(records=RecordStore.load(tmp_path / "records.json")))
    methods = {s.method for s in again.schedules.groups.values() if s.family == "gemm"}
    assert methods == {"record"}
    for name, s in again.schedules.groups.items():
        if s.family == "gemm":
            assert [v.config for v in s.variants] == [v.config for v in first.schedules.groups[name].variants]
    check_matches_onnxruntime(again, mlp)


def test_a_record_reused_under_a_smaller_variant_cap_keeps_its_best_configurations_first(mlp, tmp_path):
    from dataclasses import replace

    from tscomp.codegen.tile_config import TileConfig
    store = RecordStore(tmp_path / "records.json")
    compile_model(mlp, DIMS, tuning=tiny_tuning(records=store, trials=3))
    # records of several configurations each, deterministically: the heuristic's candidates (how
    # many a short tuning run keeps depends on its measurements)
    heuristic = compile_model(mlp, DIMS, max_variants=3).schedules.groups.values()
    by_signature = {s.signature: [vars(v.config).copy() for v in s.variants] for s in heuristic if s.family == "gemm"}
    for rec in list(store):
        configs = by_signature[rec.signature]
        assert len(configs) > 1, configs          # else the cap below tests nothing
        store.put(replace(rec, configs=configs, values=[1.0 + k for k in range(len(configs))]))
    again = compile_model(mlp, DIMS, tuning=tiny_tuning(records=store), max_variants=1)
    for name, s in again.schedules.groups.items():
        if s.family == "gemm":
            assert s.method == "record"
            assert [v.config for v in s.variants] == [TileConfig(**by_signature[s.signature][0])]
            assert len(again.kernels[name]) == 1
    check_matches_onnxruntime(again, mlp)


def test_a_record_the_family_no_longer_generates_is_tuned_again_not_an_error(mlp, tmp_path):
    """A record written for an earlier form of a family's kernels (a configuration its source step now
    refuses, e.g. an fp32 attention tiling read under a bf16 AMX target) is stale: the group is tuned
    again and the compile succeeds."""
    from dataclasses import replace
    store = RecordStore(tmp_path / "records.json")
    compile_model(mlp, DIMS, tuning=tiny_tuning(records=store, trials=3))
    bad = {"mr": 7, "nr": 17, "mc": 7, "nc": 17, "kc": 8}       # nr not a whole number of vectors
    for rec in list(store):
        store.put(replace(rec, configs=[bad], values=[1.0]))
    again = compile_model(mlp, DIMS, tuning=tiny_tuning(records=store, trials=3))
    methods = {s.method for s in again.schedules.groups.values() if s.family == "gemm"}
    assert methods and "record" not in methods
    check_matches_onnxruntime(again, mlp)


def test_untuned_compile_keeps_the_heuristic_and_says_so(mlp, tmp_path):
    from tscomp.runtime.artifact import read_manifest, write_artifact

    model = compile_model(mlp, DIMS)
    assert {s.method for s in model.schedules.groups.values() if s.family == "gemm"} == {"heuristic"}
    path = write_artifact(model, tmp_path / "m.tsc")
    manifest = read_manifest(path)
    assert manifest["target"]["key"] == model.target.key()
    variants = [v for g in manifest["groups"] for v in g["variants"] if v["family"] == "gemm"]
    assert variants and all(v["schedule"]["method"] == "heuristic" for v in variants)


def test_diverse_set_keeps_a_variant_only_where_it_is_best_somewhere():
    a = ({"c": 1}, [(1, 1, 1.0), (2, 1, 4.0)], 2.0)     # best at the small shape
    b = ({"c": 2}, [(1, 1, 2.0), (2, 1, 2.0)], 2.0)     # best at the large shape
    c = ({"c": 3}, [(1, 1, 3.0), (2, 1, 3.0)], 3.0)     # never best
    kept = diverse_set([a, b, c], 3)
    assert [t[0]["c"] for t in kept] == [1, 2]
    assert [t[0]["c"] for t in diverse_set([a, b, c], 1)] == [1]


def test_diverse_set_drops_a_variant_whose_gain_is_within_timing_noise():
    a = ({"c": 1}, [(1, 1, 1.00), (2, 1, 2.00)], 1.4)
    b = ({"c": 2}, [(1, 1, 1.01), (2, 1, 1.98)], 1.4)   # 1% faster at one shape only: noise
    c = ({"c": 3}, [(1, 1, 1.20), (2, 1, 1.80)], 1.5)   # 10% faster at the large shape
    assert [t[0]["c"] for t in diverse_set([a, b], 4)] == [1]
    assert [t[0]["c"] for t in diverse_set([a, b, c], 4)] == [1, 3]
    assert [t[0]["c"] for t in diverse_set([a, b], 4, min_gain=0.0)] == [1, 2]


def test_diverse_set_keeps_a_variant_reading_other_data_only_where_it_gains_more_than_its_cold_start():
    a = ({"c": 1}, [(1, 1, 8e-6), (2, 1, 200e-6)], 50e-6)    # 20% faster at the small shape
    b = ({"c": 2}, [(1, 1, 10e-6), (2, 1, 150e-6)], 40e-6)   # the best objective
    pairs = [a, b]
    assert [t[0]["c"] for t in diverse_set(pairs, 4)] == [2, 1]                    # warm times alone
    # a's data differs from b's: its 2 us win at the small shape cannot pay a 20 us cold start
    assert [t[0]["c"] for t in diverse_set(pairs, 4, switch=[("A", 20e-6), ("B", 20e-6)])] == [2]
    c = ({"c": 3}, [(1, 1, 5e-6), (2, 1, 300e-6)], 60e-6)    # 2x faster at the small shape
    # reading other data: 5 us + 20 us cold is slower than b's 10 us, so it is dropped ...
    assert [t[0]["c"] for t in diverse_set([b, c], 4, switch=[("B", 20e-6), ("C", 20e-6)])] == [2]
    # ... reading b's data (same packed panels), nothing is cold: kept
    assert [t[0]["c"] for t in diverse_set([b, c], 4, switch=[("B", 20e-6), ("B", 20e-6)])] == [2, 3]
    # a cold start small next to its gain: kept
    assert [t[0]["c"] for t in diverse_set([b, c], 4, switch=[("B", 1e-6), ("C", 1e-6)])] == [2, 3]


def test_groups_left_without_tuning_time_take_the_heuristic_tiles_and_are_not_recorded(mlp, tmp_path):
    records = RecordStore(tmp_path / "records.json")
    model = compile_model(mlp, DIMS, tuning=TuningOptions(tune=True, trials=4, seconds=0.0, timeout_s=30,
                                                          records=records))
    gemm = [s for s in model.schedules.groups.values() if s.family == "gemm"]
    assert gemm and all(s.method == "heuristic" and s.variants for s in gemm), [(s.group, s.method) for s in gemm]
    assert all(records.get("gemm", s.signature, model.schedules.target.key()) is None for s in gemm)
    check_matches_onnxruntime(model, mlp)


def test_a_group_every_candidate_of_which_the_family_refuses_falls_back_in_a_tuned_compile(tmp_path):
    """x·xᵀ of a [1, 3] reduction: the batched GEMM family's analysis takes the group and only
    source generation refuses it (its output reads the MatMul at a fixed element). An untuned compile
    sent it to the numpy fallback; a tuned one, every candidate refused, aborted the compile with
    ScheduleError (DiffLlama's QDQ export). Now both fall back, and the group says why."""
    nodes = [helper.make_node("Relu", ["x"], ["t1"]),
             helper.make_node("ReduceSum", ["t1", "axes"], ["t4"], keepdims=1),
             helper.make_node("Relu", ["t4"], ["t6"]),
             helper.make_node("Transpose", ["t6"], ["t8"], perm=[1, 0]),
             helper.make_node("MatMul", ["t6", "t8"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 3])],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)],
                          [helper.make_tensor("axes", TP.INT64, (1,), [0])])
    path = str(tmp_path / "refused.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    model = compile_model(path, ["n=1:13"], tuning=tiny_tuning(trials=2))
    fallback = [k for ks in model.kernels.values() for k in ks if k.family == "numpy"]
    assert len(fallback) == 1 and "batched-gemm" in " ".join(fallback[0].reasons), [k.family for ks in model.kernels.values() for k in ks]
    rt, sess = Runtime.from_compiled(model), ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for n in (1, 5, 13):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(rt.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
