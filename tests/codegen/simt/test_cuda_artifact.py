"""``tscomp compile --target cuda`` of tiny BERT: cubins per architecture + PTX, ptxas resources per
kernel and architecture in the manifest, no spills, every non-shape group a SIMT kernel; the same
artifact runs on the SIMT device (OpenCL here; ``TSCOMP_SIMT_DEVICE=cuda`` on a GPU) and matches
onnxruntime at 10 shapes (1, primes, range ends)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from tscomp.runtime.simt_artifact import CudaArtifactError, load_cuda_artifact

DIMS = ["batch=1:8", "sequence=1:512"]


@pytest.fixture(scope="module")
def artifact(exported_model, nvcc, simt_device, tmp_path_factory):
    model = exported_model("bert", "tiny", "dynamo")
    out = tmp_path_factory.mktemp("cuda") / "bert.tsc"
    proc = subprocess.run([sys.executable, "-m", "tscomp.cli", "compile", str(model), *sum((["--dim", d] for d in DIMS), []),
                           "-o", str(out), "--target", "cuda"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return model, out, proc.stdout


@pytest.mark.models
def test_artifact_holds_cubins_ptx_and_resources_per_arch(artifact):
    _, path, stdout = artifact
    assert "no spills" in stdout
    for name in ("kernels/model.sm_80.cubin", "kernels/model.sm_90.cubin", "kernels/model.compute_80.ptx",
                 "kernels/model.cu", "plan.json", "weights.bin"):
        assert (path / name).is_file(), name
    man = json.loads((path / "manifest.json").read_text())
    assert man["archs"] == ["sm_80", "sm_90"]
    assert "cp.async" in (path / "kernels/model.compute_80.ptx").read_text()
    families = set()
    for g in man["groups"]:
        for v in g["variants"]:
            families.add(v["family"])
            assert v["family"] != "numpy", g   # every group a SIMT kernel (the position Range: simt-index)
            assert v["schedule"]["measured"] is False
            for arch in ("sm_80", "sm_90"):
                res = v["resources"][arch][v["func"]]
                assert 0 < res["registers"] <= 255 and res["spill_stores"] == 0 and res["spill_loads"] == 0
            if v["family"] == "simt-gemm":   # variants from the schedule stage's analytic ranking
                assert v["resources"]["sm_80"][v["func"]]["shared_bytes"] == v["launch"]["shared_bytes"]
                assert g["analytic_ranking"][0]["method"] == "analytic"
                assert g["schedule"]["method"] == v["schedule"]["method"] == "analytic"
                assert g["schedule"]["measured"] is False and 0 < v["schedule"]["model"]["occupancy"] <= 1
                assert v["schedule"]["model"]["predicted_cycles"]
            else:
                assert g["schedule"]["method"] == "single"
    assert {"simt-gemm", "simt-batched-gemm", "simt-row-or-elementwise"} <= families
    assert man["schedules"]["target"]["key"] == "cuda-sm_80" and man["schedules"]["target"]["measurable"] is False
    assert man["schedules"]["methods"]["analytic"] >= 1


@pytest.mark.models
def test_artifact_runs_on_the_simt_device_and_matches_onnxruntime(artifact, simt_device):
    from models.families import make_inputs, symbol_ranges
    model, path, _ = artifact
    from tscomp.runtime import Runtime
    runtime = Runtime(path, device=simt_device)    # the runtime's device hook: the CUDA artifact on OpenCL / a GPU
    assert list(runtime.graph.inputs) == ["input_ids", "attention_mask", "token_type_ids"] or runtime.graph.inputs
    rt = runtime._simt
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (lb, hb), (ls, hs) = symbol_ranges("bert")["batch"], symbol_ranges("bert")["sequence"]
    rng = np.random.default_rng(3)
    shapes = [(1, 1), (lb, hs), (2, 13), (3, 97), (1, 511), (2, 7), (1, 2), (3, 37)]
    shapes += [(int(rng.integers(1, 4)), int(rng.integers(ls, hs + 1))) for _ in range(2)]
    for b, s in shapes:
        inputs = make_inputs("bert", {"batch": b, "sequence": s}, rng, size="tiny")
        got = runtime.run(inputs)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {b}x{s}")
    ran = set(rt.runner.families_run.values())
    assert {"simt-gemm", "simt-batched-gemm", "simt-row-or-elementwise"} <= ran
    gemm_paths = set().union(*(k.paths_run for vs in rt.runner.variants.values() for k in vs
                               if k.family == "simt-gemm" and "paths_run" in k.__dict__))
    if simt_device == "opencl":
        assert gemm_paths == {"plain"}      # OpenCL runs the plain staging path of the one source
    else:
        assert "async" in gemm_paths        # sm_80+ runs the cp.async double-buffered path


@pytest.mark.models
def test_a_corrupt_artifact_is_refused_and_cuda_without_gpu_is_a_clear_error(artifact, tmp_path):
    import shutil
    _, path, _ = artifact
    bad = tmp_path / "bad.tsc"
    shutil.copytree(path, bad)
    (bad / "kernels/model.sm_90.cubin").write_bytes(b"junk")
    with pytest.raises(CudaArtifactError, match="model.sm_90.cubin"):
        load_cuda_artifact(bad)
    from tscomp.runtime.device_opencl import DeviceError, device
    try:
        device("cuda")
    except DeviceError as exc:     # no GPU here: the artifact says so in one line, as the device does
        with pytest.raises(DeviceError, match="device='cuda'") as err:
            load_cuda_artifact(path, device="cuda")
        assert str(err.value) == str(exc) and "\n" not in str(err.value)


ALL = [(f, e) for f in ("bert", "gpt2", "vit") for e in ("dynamo", "torchscript")]


@pytest.mark.models
@pytest.mark.skipif(__import__("os").environ.get("TSCOMP_SIMT_ALL_MODELS") != "1",
                    reason="about a minute per model: set TSCOMP_SIMT_ALL_MODELS=1 (tiny BERT runs by default above)")
@pytest.mark.parametrize("family,exporter", ALL, ids=[f"{f}-{e}" for f, e in ALL])
def test_every_tiny_model_compiles_for_cuda_and_matches_onnxruntime_on_the_simt_device(exported_model, nvcc, simt_device, tmp_path,
                                                                               family, exporter):
    from models.families import make_inputs, symbol_ranges
    from tscomp.codegen.simt.compile import compile_cuda
    from tscomp.runtime.simt_artifact import write_cuda_artifact
    model = exported_model(family, "tiny", exporter)
    ranges = symbol_ranges(family)
    compiled = compile_cuda(str(model), [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()])
    assert not any(b.spills for b in compiled.builds.values())
    # every group a SIMT kernel: ViT's bicubic position Resize and the Range over a shape value too
    assert not [(g, vs[0].reasons) for g, vs in compiled.kernels.items() if vs[0].family == "numpy"]
    if family == "vit":
        assert any(vs[0].family == "simt-index" and "ONNX op: Resize" in vs[0].source
                   for vs in compiled.kernels.values())
    rt = load_cuda_artifact(write_cuda_artifact(compiled, tmp_path / "m.tsc"))
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    names = list(ranges)
    picks = [{k: lo for k, (lo, hi) in ranges.items()}, {k: hi if k != "batch" else 1 for k, (lo, hi) in ranges.items()}]
    primes = (2, 7, 13, 37, 61, 97)
    for i in range(8):
        picks.append({k: int(min(hi, max(lo, primes[(i + j) % len(primes)]))) for j, (k, (lo, hi)) in
                      enumerate(ranges.items())})
    for b in picks:
        inputs = make_inputs(family, b, rng, size="tiny")
        got = rt.run(inputs)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, inputs)))
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {b} ({names})")


def test_a_float16_model_builds_for_cuda_with_its_casts_in_simt_kernels(nvcc, tmp_path):
    """x (float16) -> Relu -> Softmax -> MatMul -> Tanh -> float16: the graph stage computes it in
    float32; the kernel that reads the float16 input is a SIMT kernel whose _Float16 is CUDA's __half
    (nvcc rejected _Float16 with an internal compiler error). Built, not run: no GPU here, and this
    machine's OpenCL device has no cl_khr_fp16."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Softmax", ["r"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16)
    g = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TP.FLOAT16, ["L", 16])],
                          [helper.make_tensor_value_info("y", TP.FLOAT16, None)], [numpy_helper.from_array(w, "w")])
    path, out = tmp_path / "half.onnx", tmp_path / "half.tsc"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    proc = subprocess.run([sys.executable, "-m", "tscomp.cli", "compile", str(path), "--dim", "L=1:20", "-o", str(out),
                           "--target", "cuda"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    source = (out / "kernels/model.cu").read_text()
    assert "const _Float16*" in source and "#define _Float16 __half" in source
    assert (out / "kernels/model.sm_80.cubin").is_file()
