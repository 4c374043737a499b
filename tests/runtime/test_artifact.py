"""The artifact directory: what compile writes, and clear errors for anything a loader must refuse."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tscomp.runtime import Runtime
from tscomp.runtime.artifact import FORMAT_VERSION, ArtifactError


@pytest.fixture
def artifact_copy(compiled_artifact, tmp_path):
    path, _, _ = compiled_artifact("bert")
    dst = tmp_path / "copy.tsc"
    shutil.copytree(path, dst)
    return dst


def test_manifest_describes_symbols_io_groups_and_kernel_variants(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    mf = json.loads((path / "manifest.json").read_text())
    assert mf["format_version"] == FORMAT_VERSION
    assert {s["name"]: (s["min"], s["max"]) for s in mf["symbols"]} == {"batch": (1, 8), "sequence": (1, 512)}
    assert [i["name"] for i in mf["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert mf["outputs"][0]["shape"] == ["batch", "sequence", "128"]
    gemm = [g for g in mf["groups"] if g["kind"] == "gemm"]
    assert gemm and all(g["variants"] for g in mf["groups"])
    multi = [v for g in gemm for v in g["variants"] if len(g["variants"]) > 1]
    assert multi and all(v["single_wave_us"] > 0 and "tile_config" in v for v in multi)
    for g in mf["groups"]:
        for v in g["variants"]:
            if v["func"]:
                assert (path / "kernels" / f"{v['func']}.c").is_file()
    assert set(mf["files"]) >= {"kernels.so", "weights.npz", "plan.pkl"}


def test_generated_kernel_source_names_its_group_ops_and_tile_config(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    mf = json.loads((path / "manifest.json").read_text())
    g = next(g for g in mf["groups"] if g["kind"] == "gemm" and len(g["variants"]) > 1)
    text = (path / "kernels" / f"{g['variants'][0]['func']}.c").read_text()
    head = text[:3000]
    assert g["name"] in head and "MatMul" in head
    assert "T_Mb" in head or "block tile" in head


def test_other_format_version_is_refused(artifact_copy):
    mf = json.loads((artifact_copy / "manifest.json").read_text())
    mf["format_version"] = FORMAT_VERSION + 1
    (artifact_copy / "manifest.json").write_text(json.dumps(mf))
    with pytest.raises(ArtifactError, match=f"format version {FORMAT_VERSION + 1}.*recompile"):
        Runtime(artifact_copy)


def test_missing_file_is_named(artifact_copy):
    (artifact_copy / "weights.npz").unlink()
    with pytest.raises(ArtifactError, match="missing file weights.npz"):
        Runtime(artifact_copy)


def test_corrupt_file_is_caught_by_its_hash(artifact_copy):
    blob = bytearray((artifact_copy / "plan.pkl").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (artifact_copy / "plan.pkl").write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match="plan.pkl is corrupt"):
        Runtime(artifact_copy)


def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="no such artifact"):
        Runtime(tmp_path / "nothing.tsc")
    (tmp_path / "empty.tsc").mkdir()
    with pytest.raises(ArtifactError, match="no manifest.json"):
        Runtime(tmp_path / "empty.tsc")
    (tmp_path / "bad.tsc").mkdir()
    (tmp_path / "bad.tsc" / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="corrupt manifest"):
        Runtime(tmp_path / "bad.tsc")


def test_loaded_artifact_gives_the_same_outputs_as_the_in_memory_compile(compiled_artifact):
    from models.families import make_inputs
    from tscomp.compiler import compile_model

    path, onnx_path, ranges = compiled_artifact("bert")
    model = compile_model(str(onnx_path), [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()], max_variants=1)
    mem = Runtime.from_compiled(model, num_threads=2)
    disk = Runtime(path, num_threads=2)
    x = make_inputs("bert", {"batch": 2, "sequence": 13}, np.random.default_rng(3), size="tiny")
    np.testing.assert_allclose(mem.run(x)["last_hidden_state"], disk.run(x)["last_hidden_state"],
                               rtol=1e-5, atol=1e-5)


def test_gemm_weights_are_stored_once_prepacked_not_again_in_the_plan(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path)
    gemm_weights = {k.weight_name for ks in rt.model.kernels.values() for k in ks if k.weight_name is not None}
    assert len(gemm_weights) >= 8                                  # 4 per layer, 2 layers
    for name in gemm_weights:
        assert rt.graph.values[name].const is None, name           # only weights.npz holds them


def test_shared_weights_are_stored_once(compiled_artifact):
    """ALBERT shares one set of layer weights: identical prepacked panels are one npz member."""
    path, _, _ = compiled_artifact("albert")
    rt = Runtime(path)
    packed = [k for ks in rt.model.kernels.values() for k in ks if getattr(k, "packed", None) is not None]
    with np.load(path / "weights.npz") as npz:
        members = len(npz.files)
    assert members < len(packed)
    assert len({k.packed_key for k in packed}) == members
