"""Issue 13's opt-in bf16 mode end to end: ``compile_model(..., precision="bf16")`` on every model family
with constant-weight GEMMs, checked against onnxruntime fp32; the precision in the target, the manifest
(so the digest), the kernels' headers and entry points; clear errors where the CPU lacks avx512_bf16.

Accuracy, measured against onnxruntime fp32 (random weights, 20 shapes per family incl. 1, primes
and the range ends, ``binding_samples(n=20, seed=3)``): worst relative L2 error of an output per
tiny family -- bert 3.5e-4, roberta 3.5e-4, distilbert 3.7e-4, albert 2.4e-3, vit 3.2e-3, llama
3.5e-3, gpt2 3.8e-3 -- and minimum cosine similarity 0.999993 (on an AMX CPU with the fused attention
in bf16 too: 3.5e-4 .. 3.9e-3, cosine >= 0.999993); BERT-base at 25 lengths: relative L2
4.3e-3 .. 4.9e-3, cosine >= 0.999988 (OpenVINO's own bf16 on the same inputs: 5.9e-3, 0.999983;
``benchmarks/bf16_vs_fp32.py``). The test asserts cosine >= 0.999 (the issue's criterion) and
relative L2 error <= :data:`REL_L2_BOUND` (about 2x the worst measured) at 6 of those shapes.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnxruntime as ort
import pytest

from tests.model_checks import binding_samples
from tscomp.codegen.build import host_isa
from tscomp.schedule.target import TargetError, host_cpu

HAS_BF16 = host_isa() == "avx512" and host_cpu().spec.bf16
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="this CPU has no avx512_bf16")

#: the families of models/ whose graphs have constant-weight GEMMs (ResNet has only Conv)
GEMM_FAMILIES = ("bert", "albert", "roberta", "distilbert", "gpt2", "vit", "llama")
MIN_COSINE = 0.999
#: relative L2 error of each output against onnxruntime fp32 (measured worst 4.9e-3, see the docstring)
REL_L2_BOUND = 1e-2


@pytest.fixture(scope="session")
def bf16_artifact(exported_model, tmp_path_factory):
    from models.families import symbol_ranges
    from tscomp.compiler import compile_model
    from tscomp.runtime.artifact import write_artifact

    cache = {}

    def get(family: str):
        if family not in cache:
            onnx_path = exported_model(family, "tiny", "dynamo")
            ranges = symbol_ranges(family, "tiny")
            dims = [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]
            model = compile_model(str(onnx_path), dims, max_variants=2, precision="bf16")
            out = tmp_path_factory.mktemp("bf16") / f"{family}-bf16.tsc"
            cache[family] = (write_artifact(model, out), onnx_path, ranges, model)
        return cache[family]

    return get


def _accuracy(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    g, w = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    if not w.size:
        return 1.0, 0.0
    norm = np.linalg.norm(g) * np.linalg.norm(w)
    cos = float(g @ w / norm) if norm else float(np.array_equal(g, w))
    rel = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
    return cos, rel


@needs_bf16
@pytest.mark.models
@pytest.mark.parametrize("family", GEMM_FAMILIES)
def test_bf16_model_is_within_the_accuracy_bound_of_onnxruntime_fp32(bf16_artifact, family):
    from models.families import make_inputs
    from tscomp.runtime import Runtime

    path, onnx_path, ranges, model = bf16_artifact(family)
    gemm = [k for ks in model.kernels.values() for k in ks if k.family == "gemm"]
    assert gemm and all(k.precision == "bf16" and k.packed.dtype == np.uint16 for k in gemm)
    rt = Runtime(path, num_threads=2)
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(0)
    bindings = binding_samples(ranges, n=6, seed=3)      # the range ends, 1, primes
    worst_rel, bf16_visible = 0.0, False
    for binding in bindings:
        inputs = make_inputs(family, binding, rng, size="tiny")
        got = rt.run(inputs)
        want = dict(zip(names, sess.run(None, inputs)))
        for name in names:
            assert got[name].shape == want[name].shape
            cos, rel = _accuracy(got[name], want[name])
            assert cos >= MIN_COSINE, f"{family} {name} at {binding}: cosine {cos:.6f}"
            assert rel <= REL_L2_BOUND, f"{family} {name} at {binding}: relative L2 error {rel:.2e}"
            worst_rel = max(worst_rel, rel)
            bf16_visible |= rel > 1e-5
    # the GEMMs really ran in bf16: fp32 kernels match onnxruntime to ~1e-6
    assert bf16_visible, f"{family}: outputs match fp32 to {worst_rel:.1e}; were the bf16 kernels used?"


@needs_bf16
def test_precision_is_in_the_manifest_digest_sources_and_entry_points(bf16_artifact):
    from tscomp.runtime.artifact import manifest_digest, read_manifest

    path, _, _, model = bf16_artifact("bert")
    mf = read_manifest(path)
    assert mf["precision"] == "bf16" and mf["target"]["precision"] == "bf16"
    amx = host_cpu(precision="bf16").gemm_isa == "amx"     # bf16 GEMMs run on AMX tiles where the CPU has them
    assert mf["target"]["key"].endswith("-bf16-amx" if amx else "-bf16")
    # the fused attention computes in bf16 where the GEMMs run on AMX tiles, else in fp32
    assert ("fused attention's QKᵀ and P·V (AMX tiles" if amx else "attention (fused or as batched GEMMs)") \
        in mf["precision_scope"]
    fused = [v for g in mf["groups"] for v in g["variants"] if v["family"] == "attention"]
    assert fused and all(v["isa"] == ("amx" if amx else "avx512") for v in fused)
    if amx:
        assert "_tile_dpbf16ps" in (path / "kernels" / f"{fused[0]['func']}.c").read_text()
    variants = [v for g in mf["groups"] for v in g["variants"]]
    gemm = [v for v in variants if v["family"] == "gemm"]
    assert gemm and all(v["precision"] == "bf16" and v["func"].endswith("_bf16") for v in gemm)
    assert all(v["isa"] == ("amx" if amx else "avx512") for v in gemm)
    assert all("precision" not in v for v in variants if v["family"] != "gemm")
    src = (path / "kernels" / f"{gemm[0]['func']}.c").read_text()
    assert "precision: bf16" in src and ("_tile_dpbf16ps" if amx else "_mm512_dpbf16_ps") in src and "tile config:" in src
    edited = dict(mf, precision="fp32")
    assert manifest_digest(edited) != mf["digest"]


@pytest.mark.parametrize("lacking,error", [
    pytest.param("bf16", "precision bf16.*avx512_bf16", marks=needs_bf16),
    pytest.param("amx", "run on AMX bf16 tiles, which this CPU does not have",
                 marks=pytest.mark.skipif(not (HAS_BF16 and host_cpu().spec.amx), reason="this CPU has no AMX tiles"))])
def test_a_bf16_artifact_is_refused_at_load_on_a_cpu_without_its_instructions(bf16_artifact, monkeypatch, lacking,
                                                                              error):
    import tscomp.schedule.target as target_mod
    from tscomp.runtime import Runtime
    from tscomp.runtime.artifact import ArtifactError

    path = bf16_artifact("bert")[0]
    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, **{lacking: False}))
    with pytest.raises(ArtifactError, match=error):
        Runtime(path)


def test_bf16_gemms_use_amx_tiles_only_where_the_cpu_has_them():
    from tscomp.schedule.target import CpuSpec, Target

    spec = CpuSpec(cores=2, isa="avx512", vector_width=16, vector_registers=32, l1=48 << 10, l2=2 << 20,
                   l3=32 << 20, bf16=True, amx=True)
    with_amx = Target("cpu", "c", spec)
    assert with_amx.gemm_isa == "avx512"                                  # fp32 GEMMs: AVX-512 FMA
    assert with_amx.with_precision("bf16").gemm_isa == "amx"
    without = Target("cpu", "c", dataclasses.replace(spec, amx=False)).with_precision("bf16")
    assert without.gemm_isa == "avx512"                                   # VDPBF16PS
    assert with_amx.with_precision("bf16").key() != without.key()         # tuning records kept apart


def test_bf16_compile_is_refused_on_a_cpu_without_avx512_bf16(monkeypatch, tmp_path, capsys):
    import tscomp.schedule.target as target_mod
    from tscomp.cli import main

    spec = target_mod._host_spec()
    monkeypatch.setattr(target_mod, "_host_spec", lambda: dataclasses.replace(spec, bf16=False))
    with pytest.raises(TargetError, match="avx512_bf16"):
        host_cpu(precision="bf16")
    with pytest.raises(TargetError, match="avx512_bf16"):
        host_cpu().with_precision("bf16")
    # the CLI: one clear line, before anything is compiled (the model file is not even read)
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    assert main(["compile", str(model), "-o", str(tmp_path / "m.tsc"), "--precision", "bf16", "--no-tune"]) == 1
    err = capsys.readouterr().err
    assert "tscomp: error:" in err and "avx512_bf16" in err and "--precision fp32" in err
    assert not (tmp_path / "m.tsc").exists()


def test_precision_is_data_of_the_target():
    from tscomp.schedule.target import Target

    t = host_cpu()
    assert t.precision == "fp32" and not t.key().endswith("fp32")   # fp32 tuning records keep their keys
    with pytest.raises(TargetError, match="unknown precision"):
        t.with_precision("fp16")
    if HAS_BF16:
        b = t.with_precision("bf16")
        assert b.key() != t.key() and b.with_threads(1).precision == "bf16"
        assert Target.from_json(b.to_json()) == b
    assert Target.from_json(t.to_json()) == t
