"""Exported models match the torch models they come from, at shapes other than the tracing example."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.models

FAMILIES = ("bert", "albert", "roberta", "distilbert", "gpt2", "vit", "llama", "resnet")
EXPORTERS = ("dynamo", "torchscript")


def _check_against_torch(path, family: str, size: str, bindings_list=None) -> None:
    from models.export import check_bindings, run_both

    for bindings, got, want in run_both(path, family, size, bindings_list or check_bindings(family, size)):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=f"{path.name} at {bindings}")


def _check_signature(path, family: str, size: str, exporter: str) -> None:
    """Input / output names and dim names are those of the spec; opset is the exporter's."""
    import onnx

    from models.export import OPSETS, OUTPUT_NAME, output_dims
    from models.families import get_family

    model = onnx.load(str(path), load_external_data=False)

    def dims(vi):
        return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in vi.type.tensor_type.shape.dim]

    spec = get_family(family)
    assert [(i.name, dims(i)) for i in model.graph.input] == [(i.name, list(i.dims)) for i in spec.inputs]
    assert [(o.name, dims(o)) for o in model.graph.output] == [(OUTPUT_NAME, output_dims(spec, size))]
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    assert opsets.get("ai.onnx") == OPSETS[exporter]


@pytest.mark.parametrize("size", ["tiny", pytest.param("base", marks=pytest.mark.base)])
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_export_matches_torch(exported_model, family, exporter, size):
    path = exported_model(family, size, exporter)
    _check_signature(path, family, size, exporter)
    _check_against_torch(path, family, size)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_export_at_range_edges(exported_model, family, exporter):
    """Smallest shape (sequence 1, one ViT patch, a 1x1 ResNet image) and largest (max positions, 4x the
    ViT image side, the ResNet side range's end)."""
    from models.families import symbol_ranges

    ranges = symbol_ranges(family, "tiny")
    smallest = {name: low for name, (low, _) in ranges.items()}
    largest = {name: high for name, (_, high) in ranges.items()} | {"batch": 2}
    _check_against_torch(exported_model(family, "tiny", exporter), family, "tiny", [smallest, largest])


@pytest.mark.parametrize("family", FAMILIES)
def test_make_inputs_are_valid(family):
    pytest.importorskip("transformers")
    from models.families import get_family, make_config, make_inputs, symbol_ranges

    spec = get_family(family)
    rng = np.random.default_rng(0)
    for size in ("tiny", "base"):
        ranges = symbol_ranges(family, size)
        assert set(ranges) == set(spec.symbol_names)
        config = make_config(family, size)
        for _ in range(20):
            bindings = {name: int(rng.integers(low, high + 1)) for name, (low, high) in ranges.items()}
            inputs = make_inputs(family, bindings, rng, size=size)
            assert list(inputs) == list(spec.input_names)
            if spec.is_vision:
                assert inputs["pixel_values"].shape == (bindings["batch"], 3, bindings["height"], bindings["width"])
                assert inputs["pixel_values"].dtype == np.float32
                continue
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            assert ids.shape == mask.shape == (bindings["batch"], bindings["sequence"])
            assert ids.dtype == mask.dtype == np.int64
            assert ids.min() >= 0 and ids.max() < config.vocab_size
            assert mask.min() >= 0 and mask.max() <= 1 and mask[:, 0].all(), "all-zero or left-padded row"
            assert (np.diff(mask, axis=1) <= 0).all(), "padding only at the end of rows"
            if config.pad_token_id is not None:
                assert ((ids == config.pad_token_id) == (mask == 0)).all(), "pad id exactly where padded"
            if "token_type_ids" in inputs:
                assert set(np.unique(inputs["token_type_ids"])) <= {0, 1}


def test_make_inputs_rejects_out_of_range_bindings():
    pytest.importorskip("transformers")
    from models.families import make_inputs

    with pytest.raises(ValueError):
        make_inputs("bert", {"batch": 1, "sequence": 513}, np.random.default_rng(0))
    with pytest.raises(ValueError):
        make_inputs("vit", {"batch": 1, "height": 32}, np.random.default_rng(0), size="tiny")
