"""Acceptance on real exported models (tiny; base with TSCOMP_BASE_MODELS=1):
no unresolved shapes, at least onnxruntime's symbolic-inference coverage,
propagated shapes equal onnxruntime's actual shapes at 20 bindings, and both the
reference executor and the fused Plan (interpreted group by group) match onnxruntime. A sweep over opsets 14-20 covers the
older operator forms (e.g. LayerNormalization decomposed before opset 17)."""
import zlib

import numpy as np
import pytest

from models.families import make_inputs, symbol_ranges
from tests import model_checks

FAMILIES = ["bert", "albert", "roberta", "distilbert", "gpt2", "vit", "llama", "resnet"]
# The opset sweep stays on the six transformer encoders/GPT-2: the operator forms it covers are the same
# in Llama and ResNet, and their extra dynamo exports would add ~2 minutes to a fresh `make test`.
OPSET_SWEEP_FAMILIES = ["bert", "albert", "roberta", "distilbert", "gpt2", "vit"]
# Reference-vs-onnxruntime bindings per tiny model: the issue-11 families run at fewer here (the runtime
# tests compare their compiled outputs at 20 shapes), which keeps `make test` within its budget.
TINY_BINDINGS = {"llama": 8, "resnet": 20}
# Fused groups allowed to touch one layer (post-LN encoders: <= 8). Llama (issue 11): two RMSNorm row
# passes and the rotary embedding of q and k are separate groups until RMSNorm fuses into the GEMMs.
GROUPS_PER_LAYER = {"llama": 13}
# Output tolerances other than compare_with_onnxruntime's (rtol = atol = 1e-4). ResNet-50 with random weights
# (issue 11): features reach ~230 (mean ~28), and fp32 sums over 3x3x512 taps in numpy and onnxruntime differ
# by up to ~4e-4 absolute (~1e-5 relative to the mean) -- summation order, not a bug.
TOLERANCES = {("resnet", "base"): dict(rtol=1e-4, atol=1e-3)}
EXPORTERS = ["dynamo", "torchscript"]
CASES = [pytest.param(f, "tiny", e, id=f"{f}-tiny-{e}") for f in FAMILIES for e in EXPORTERS] + \
        [pytest.param(f, "base", e, id=f"{f}-base-{e}", marks=pytest.mark.base) for f in FAMILIES for e in EXPORTERS]
OTHER_OPSETS = [("torchscript", o) for o in (14, 15, 16, 18, 19, 20)] + [("dynamo", o) for o in (18, 19)]

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def loaded_models(exported_model):
    cache = {}  # only the latest model: base models hold hundreds of MB of weights each

    def get(family, size, exporter, opset=None):
        key = (family, size, exporter, opset)
        if key not in cache:
            cache.clear()
            path = exported_model(family, size, exporter, opset)
            cache[key] = model_checks.load_for_checks(path, symbol_ranges(family, size))
        return cache[key]
    return get


def mismatches_against_onnxruntime(loaded, family, size, n_bindings) -> list[str]:
    ranges = symbol_ranges(family, size)
    names = [o for node in loaded.imported_nodes for o in node.outputs if o]
    session = model_checks.ort_session_with_intermediates(loaded.path, loaded.graph, names)
    rng = np.random.default_rng(0)
    failures = []
    caps = {"batch": 2} if size == "base" else None
    for binding in model_checks.binding_samples(ranges, n=n_bindings, seed=zlib.crc32(family.encode()), caps=caps):
        inputs = make_inputs(family, binding, rng, size=size)
        result = model_checks.compare_with_onnxruntime(loaded, session, inputs, binding,
                                                       **TOLERANCES.get((family, size), {}))
        if result.shape_mismatches:
            failures.append(f"{binding}: {len(result.shape_mismatches)} shape mismatches, first: "
                            f"{result.shape_mismatches[0]}")
        if not result.outputs_close:
            failures.append(f"{binding}: outputs differ (max abs err {result.max_abs_err:.3g})")
        if not result.plan_close:
            failures.append(f"{binding}: fused plan outputs differ (max abs err {result.plan_max_abs_err:.3g})")
    return failures


@pytest.mark.parametrize("family,size,exporter", CASES)
def test_every_value_has_a_resolved_symbolic_shape(loaded_models, family, size, exporter):
    loaded = loaded_models(family, size, exporter)
    resolved, total = model_checks.tscomp_coverage(loaded)
    assert resolved == total, f"{total - resolved} unresolved values"
    ort_resolved, _ = model_checks.ort_symbolic_coverage(loaded.path)
    print(f"{family}-{size}-{exporter}: tscomp resolves {resolved}/{total}, "
          f"onnxruntime SymbolicShapeInference(auto_merge) {ort_resolved}/{total}")
    assert ort_resolved is None or resolved >= ort_resolved


@pytest.mark.parametrize("family,size,exporter", CASES)
def test_shapes_and_reference_outputs_match_onnxruntime(loaded_models, family, size, exporter):
    loaded = loaded_models(family, size, exporter)
    failures = mismatches_against_onnxruntime(loaded, family, size,
                                              TINY_BINDINGS.get(family, 20) if size == "tiny" else 3)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("exporter,opset", OTHER_OPSETS, ids=[f"{e}-opset{o}" for e, o in OTHER_OPSETS])
@pytest.mark.parametrize("family", OPSET_SWEEP_FAMILIES)
def test_other_opsets_resolve_and_match_onnxruntime(loaded_models, family, exporter, opset):
    loaded = loaded_models(family, "tiny", exporter, opset)
    resolved, total = model_checks.tscomp_coverage(loaded)
    assert resolved == total, f"{total - resolved} unresolved values"
    failures = mismatches_against_onnxruntime(loaded, family, "tiny", 5)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("family,size,exporter", CASES)
def test_fusion_needs_fewer_kernels_and_less_traffic_than_unfused(loaded_models, family, size, exporter):
    from models.families import make_config
    from tscomp.graph.fusion import plan_traffic, unfused_traffic

    loaded = loaded_models(family, size, exporter)
    plan = loaded.plan
    ort_nodes = model_checks.ort_optimized_node_count(loaded.path)
    layers = getattr(make_config(family, size), "num_hidden_layers", None)  # a CNN has stages, not layers
    per_layer = model_checks.groups_per_layer(plan, layers // 2) if layers else None
    print(f"{family}-{size}-{exporter}: {len(plan.groups)} groups, onnxruntime optimized graph "
          f"{ort_nodes} nodes, {per_layer} groups touch layer {(layers or 0) // 2}")
    assert len(plan.groups) < ort_nodes
    if per_layer is not None and family != "gpt2":  # GPT-2 is pre-LN: its layers share boundary groups
        assert per_layer <= GROUPS_PER_LAYER.get(family, 8)
    binding = {s: min(hi, 64) for s, (lo, hi) in symbol_ranges(family, size).items()}
    fused = plan.graph.symbols.evaluate(plan_traffic(plan, weights=False), binding)
    unfused = loaded.graph.symbols.evaluate(unfused_traffic(loaded.graph, weights=False), binding)
    assert fused < unfused
