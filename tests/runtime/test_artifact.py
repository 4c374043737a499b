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
    path, _, _ = compiled_artifact("bert", keep_copies=True)
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
    assert set(mf["files"]) >= {"kernels.so", "weights.bin", "plan.json"}


def test_generated_kernel_source_names_its_group_ops_and_tile_config(compiled_artifact):
    path, _, _ = compiled_artifact("bert", keep_copies=True)
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
    (artifact_copy / "weights.bin").unlink()
    with pytest.raises(ArtifactError, match="missing file weights.bin"):
        Runtime(artifact_copy)


@pytest.mark.parametrize("name", ["plan.json", "weights.bin", "kernels.so"])
def test_corrupt_file_is_caught_by_its_hash(artifact_copy, name):
    blob = bytearray((artifact_copy / name).read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (artifact_copy / name).write_bytes(bytes(blob))
    with pytest.raises(ArtifactError, match=f"{name} is corrupt"):
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


@pytest.mark.parametrize("family,packed_stored", [("bert", False), ("vit", False), ("vit", True)])
def test_the_weights_file_buffer_is_freed_once_the_artifact_is_loaded(compiled_artifact, exported_model, tmp_path,
                                                                      monkeypatch, family, packed_stored):
    # every array the loaded model keeps is its own copy (or panels packed at load): the buffer the
    # weights file was read into does not stay in memory beside them -- also where the artifact stores
    # a kernel's packed data itself (a family without a packer: here ViT's patch convolution with the
    # Conv packers taken away) rather than a raw weight to pack
    import gc
    import weakref

    from models.families import make_inputs, symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime import artifact

    if packed_stored:
        monkeypatch.setattr(artifact, "PACKERS", {"gemm": artifact.PACKERS["gemm"]})
        dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in symbol_ranges(family).items()]
        path = artifact.write_artifact(compile_model(str(exported_model(family, "tiny", "dynamo")), dims,
                                                     max_variants=1), tmp_path / "packed.tsc")
        monkeypatch.undo()
    else:
        path, _, _ = compiled_artifact(family)
    entries = json.loads((path / "plan.json").read_text())["packed_weights"]
    assert any("packed" in e for e in entries) == packed_stored
    buffers = []

    def read_and_watch(*args, **kwargs):
        buf, digest = read_aligned(*args, **kwargs)
        buffers.append(weakref.ref(buf.base if buf.base is not None else buf))
        return buf, digest

    read_aligned = artifact.read_aligned
    monkeypatch.setattr(artifact, "read_aligned", read_and_watch)
    rt = Runtime(path, num_threads=2)
    gc.collect()
    assert len(buffers) == 1 and buffers[0]() is None
    x = make_inputs(family, {k: lo for k, (lo, _) in symbol_ranges(family).items()}, np.random.default_rng(0),
                    size="tiny")
    assert all(np.isfinite(v).all() for v in rt.run(x).values())


def test_gemm_weights_are_stored_once_raw_not_again_in_the_plan(compiled_artifact):
    path, _, _ = compiled_artifact("bert", keep_copies=True)
    rt = Runtime(path)
    gemm = [k for ks in rt.model.kernels.values() for k in ks if k.weight_name is not None]
    assert len({k.weight_name for k in gemm}) >= 8                 # 4 per layer, 2 layers
    for k in gemm:
        assert rt.graph.values[k.weight_name].const is None, k.weight_name   # only the raw weight blob
        assert k.packed is not None and k.packed.ctypes.data % 64 == 0
    doc = json.loads((path / "plan.json").read_text())
    entries = doc["packed_weights"]
    assert len(entries) == len(gemm) and all("raw" in e for e in entries)   # packed at load, not stored
    # two variants per group, one raw weight per group: every raw weight is one blob
    assert len({e["raw"] for e in entries}) < len(entries)


def _onnx_bytes(onnx_path) -> int:
    return sum(f.stat().st_size for f in onnx_path.parent.glob(onnx_path.name + "*"))


@pytest.mark.parametrize("family", ["bert", "albert", "resnet", "vit"])
def test_weights_file_is_no_larger_than_the_model(compiled_artifact, family):
    path, onnx_path, _ = compiled_artifact(family)
    assert (path / "weights.bin").stat().st_size <= _onnx_bytes(onnx_path)
    assert not (path / "model").exists()                            # no copy of the ONNX model by default


def test_conv_weights_are_stored_raw_and_variants_of_one_layout_share_one_packed_copy(compiled_artifact):
    """ResNet: every Conv kernel's weight is written as the raw [OC, C, kh, kw] constant (its packer
    reproduces the compiled panels exactly, or the artifact would store the panels), packed at load
    once per layout; the model it loads matches onnxruntime."""
    import onnxruntime as ort

    from models.families import make_inputs, symbol_ranges

    path, onnx_path, _ = compiled_artifact("resnet")
    rt = Runtime(path)
    doc = json.loads((path / "plan.json").read_text())
    convs = [k for ks in rt.model.kernels.values() for k in ks if k.family.startswith("conv")]
    assert convs and len(doc["packed_weights"]) >= len(convs)
    assert all("raw" in e for e in doc["packed_weights"])
    by_layout: dict = {}
    for k in convs:
        by_layout.setdefault((k.weight_name, k.weight_layout()), set()).add(k.packed.ctypes.data)
    assert all(len(ptrs) == 1 for ptrs in by_layout.values())
    x = make_inputs("resnet", {k: hi for k, (_, hi) in symbol_ranges("resnet").items()}, np.random.default_rng(5),
                    size="tiny")
    want = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(rt.run(x)["last_hidden_state"], want, rtol=1e-4, atol=1e-4)


def test_shared_weights_are_stored_once(compiled_artifact):
    """ALBERT shares one set of layer weights across its layers: its GEMMs' raw weights are one blob
    per distinct weight, however many layers and variants read it, and kernels whose tile
    configurations pack it alike (the same register-tile width) share one packed copy in memory."""
    path, _, _ = compiled_artifact("albert", keep_copies=True)
    rt = Runtime(path)
    doc = json.loads((path / "plan.json").read_text())
    gemm = [k for ks in rt.model.kernels.values() for k in ks if k.weight_name is not None]
    raw_keys = {e["raw"] for e in doc["packed_weights"]}
    assert len(raw_keys) <= 5 < len({k.func for k in gemm})   # embedding projection, QKV, out, FFN up/down
    by_layout: dict = {}
    for k in gemm:
        by_layout.setdefault((k.weight_name, k.cfg.nr, k.precision), set()).add(k.packed.ctypes.data)
    assert all(len(ptrs) == 1 for ptrs in by_layout.values())
    assert len({k.packed.ctypes.data for k in gemm}) <= len(by_layout) < len(gemm)       # the layers' kernels share


# ---------------------------------------------------------------------------- tampering (issue 10)
@pytest.fixture
def nothing_else_parsed(monkeypatch):
    """Fail the test if the loader decodes the plan or loads the kernel library: a tampered
    artifact must be refused on the manifest and the file digests alone."""
    from tscomp.runtime import artifact, plain_data

    def boom(*a, **k):
        raise AssertionError("artifact content parsed before the tampering was detected")
    monkeypatch.setattr(plain_data, "load", boom)
    monkeypatch.setattr(artifact, "load_library", boom)


def _rewrite_manifest(path, edit, *, reseal: bool):
    from tscomp.runtime.artifact import manifest_digest

    mf = json.loads((path / "manifest.json").read_text())
    edit(mf)
    if reseal:
        mf["digest"] = manifest_digest(mf)
    (path / "manifest.json").write_text(json.dumps(mf))


def test_no_pickle_anywhere_in_the_artifact(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    files = [p for p in path.rglob("*") if p.is_file()]
    assert not [p for p in files if p.suffix in (".pkl", ".pickle", ".npz", ".npy")]
    for p in files:
        assert not p.read_bytes()[:2].startswith(b"\x80"), p       # no pickle protocol header
    doc = json.loads((path / "plan.json").read_text())
    classes = {o["cls"].split(":")[0] for o in doc["objects"] if "cls" in o}
    assert classes and all(c.startswith("tscomp.") for c in classes)


def test_substituted_file_is_detected_before_anything_is_parsed(artifact_copy, nothing_else_parsed):
    shutil.copy(artifact_copy / "manifest.json", artifact_copy / "plan.json")    # valid JSON, other content
    with pytest.raises(ArtifactError, match="plan.json is corrupt or was modified"):
        Runtime(artifact_copy)


def test_tampered_weights_are_detected_before_the_plan_is_decoded(artifact_copy, nothing_else_parsed):
    with open(artifact_copy / "weights.bin", "r+b") as f:
        f.seek(100)
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(ArtifactError, match="weights.bin is corrupt"):
        Runtime(artifact_copy)


def test_edited_manifest_is_detected(artifact_copy, nothing_else_parsed):
    def widen(mf):
        mf["symbols"][1]["max"] = 4096
    _rewrite_manifest(artifact_copy, widen, reseal=False)
    with pytest.raises(ArtifactError, match="manifest was modified"):
        Runtime(artifact_copy)


def test_edited_and_resealed_manifest_disagrees_with_the_plan(artifact_copy):
    """Even with its digest recomputed, an edited symbol range is not silently ignored: the plan
    and the manifest must agree."""
    def widen(mf):
        mf["symbols"][1]["max"] = 4096
    _rewrite_manifest(artifact_copy, widen, reseal=True)
    with pytest.raises(ArtifactError, match="symbols .* differ from manifest.json"):
        Runtime(artifact_copy)


def test_removed_manifest_entry_is_detected(artifact_copy, nothing_else_parsed):
    _rewrite_manifest(artifact_copy, lambda mf: mf["files"].pop("plan.json"), reseal=False)
    with pytest.raises(ArtifactError, match="manifest was modified"):
        Runtime(artifact_copy)


def test_removed_entry_with_a_dropped_in_file_is_refused_even_resealed(artifact_copy, nothing_else_parsed):
    """The attack on the pickle format: drop the entry of a file, put another file in its place,
    recompute every digest the artifact holds. Every file the loader reads must be listed."""
    import pickle

    (artifact_copy / "plan.json").write_text('{"root": null, "objects": []}')
    _rewrite_manifest(artifact_copy, lambda mf: mf["files"].pop("plan.json"), reseal=True)
    with pytest.raises(ArtifactError, match="plan.json is not listed in manifest.json"):
        Runtime(artifact_copy)
    (artifact_copy / "plan.pkl").write_bytes(pickle.dumps("x"))
    _rewrite_manifest(artifact_copy, lambda mf: mf["files"].__setitem__("plan.json", "0" * 64), reseal=True)
    with pytest.raises(ArtifactError, match="plan.pkl is not listed"):
        Runtime(artifact_copy)


def test_expected_digest_pins_the_artifact(compiled_artifact, artifact_copy):
    path, _, _ = compiled_artifact("bert")
    digest = json.loads((path / "manifest.json").read_text())["digest"]
    Runtime(path, expected_digest=digest, warmup=False)
    _rewrite_manifest(artifact_copy, lambda mf: mf["notes"].append("x"), reseal=True)
    with pytest.raises(ArtifactError, match="is not the expected"):
        Runtime(artifact_copy, expected_digest=digest)


def test_old_pickle_format_asks_for_a_recompile(artifact_copy):
    def old(mf):
        mf["format_version"] = 2
        mf.pop("digest")
    _rewrite_manifest(artifact_copy, old, reseal=False)
    with pytest.raises(ArtifactError, match="format version 2.*recompile"):
        Runtime(artifact_copy)


def test_out_of_range_reads_the_named_source_model_or_the_embedded_copy(tmp_path):
    """No copy of the ONNX model by default: the out-of-range path reads the file the manifest
    names (and says which when it is gone); ``embed_source`` carries a copy that still works."""
    from tests.runtime.test_atomic_write import unary_model
    from tscomp.errors import ExecutionError
    from tscomp.runtime.artifact import write_artifact

    src_dir = tmp_path / "src"
    src_dir.mkdir()
    model = unary_model(src_dir, "Relu")
    x = np.linspace(-1, 1, 60, dtype=np.float32).reshape(20, 3)       # n = 20 > 17
    plain = write_artifact(model, tmp_path / "plain.tsc")
    embedded = write_artifact(model, tmp_path / "embedded.tsc", embed_source=True)
    assert not (plain / "model").exists() and (embedded / "model" / "Relu.onnx").is_file()
    assert json.loads((embedded / "manifest.json").read_text())["embedded_source"] is True
    (src_dir / "Relu.onnx").unlink()
    with pytest.raises(ExecutionError, match="Relu.onnx, which is not there.*--embed-source"):
        Runtime(plain, allow_out_of_range=True, warmup=False).run({"x": x})
    with pytest.warns(RuntimeWarning, match="outside the compiled ranges"):
        y = Runtime(embedded, allow_out_of_range=True, warmup=False).run({"x": x})["y"]
    np.testing.assert_array_equal(y, np.maximum(x, 0))
