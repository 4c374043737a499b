"""The schedule stage for a CUDA target (:func:`tscomp.schedule.schedules.schedule_analytic`): the
SIMT GEMM groups of tiny BERT get their variants from the analytic ranking (method "analytic",
unmeasured, each with the model's prediction), identical layers share one ranking, the other
families are "single"; a measurable target is refused; a variant the build rejects for spilling is
replaced by the schedule's next-ranked one, and the artifact manifest records the provenance."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from tscomp.schedule.schedules import ScheduleError, schedule_analytic
from tscomp.schedule.target import cuda, host_cpu


@pytest.fixture(scope="module")
def bert_plan(exported_model):
    from models.families import symbol_ranges
    from tscomp.graph import load_model
    from tscomp.graph.fusion import fuse
    ranges = symbol_ranges("bert")
    # the CUDA compile runs attention as its QKᵀ, softmax and P·V parts (no SIMT attention family)
    return fuse(load_model(exported_model("bert", "tiny", "dynamo"), [f"{k}={lo}:{hi}" for k, (lo, hi) in ranges.items()]),
                attention=False)


@pytest.mark.models
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_gemm_groups_are_ranked_analytically_through_the_schedule_stage(bert_plan, arch):
    from tscomp.codegen.simt.compile import _m_range, choose_families
    from tscomp.schedule.gpu_space import GpuGemmSpace
    choices = choose_families(bert_plan)
    scheds = schedule_analytic(bert_plan, choices, cuda(arch), max_variants=2)
    assert scheds.target.key() == cuda(arch).key() and "analytic" in scheds.objective
    gemm = {g for g, c in choices.items() if c.compile_family and c.compile_family.name == "simt-gemm"}
    assert gemm and {g for g, s in scheds.groups.items() if s.method == "analytic"} == gemm
    firsts = {}
    for g in gemm:
        s = scheds.groups[g]
        assert s.measured is False and s.provenance()["measured"] is False and s.trials == 0
        an = choices[g].analysis
        space = GpuGemmSpace(an.K, an.N, cuda(arch), _m_range(an))      # ranked independently here
        order = space.rank()
        assert s.variants[0].config == order[0].tile and s.space_size == len(order)
        kept = space.variants(2, order)
        assert 1 <= len(s.variants) <= 2 and [v.config for v in s.variants] == kept
        for v in s.variants:
            js = v.to_json()
            assert js["measured"] is False and 0 < js["occupancy"] <= 1 and js["blocks_per_wave"] >= cuda(arch).spec.sms
            assert set(js["predicted_cycles"]) == {str(m) for m in space.samples()}
            assert js["predicted_cycles"][str(space.samples()[0])] == pytest.approx(space.cost(v.config, space.samples()[0]), rel=1e-3)
        assert s.reserve and not {v.config for v in s.reserve} & {v.config for v in s.variants}
        assert [v.config for v in s.reserve][:3] == [r.tile for r in order if r.tile not in kept][:3]
        assert s.ranking[0]["tile"] == order[0].tile.to_json() and s.ranking[0]["measured"] is False
        firsts.setdefault(s.signature, []).append(s)
    # BERT's two layers: each signature ranked once, the second layer's groups reuse it
    assert all(len(v) == 2 and sum(x.shared_with is None for x in v) == 1 for v in firsts.values()), firsts
    others = {s.method for g, s in scheds.groups.items() if g not in gemm}
    assert others == {"single"}


def test_a_measurable_target_is_refused():
    with pytest.raises(ScheduleError, match="schedule_plan"):
        schedule_analytic(None, {}, host_cpu())


def _one_gemm_model(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, ["M", 24])],
                              [helper.make_tensor_value_info("y", TP.FLOAT, ["M", 40])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    import onnx
    path = tmp_path / "gemm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not installed (CUDA toolkit)")
def test_a_spilling_variant_is_replaced_by_the_next_ranked_and_the_manifest_says_so(tmp_path, monkeypatch):
    """ptxas reports (here: is made to report) spills for the top variant: the build rejects it, the
    schedule's first reserve configuration replaces it, and the manifest's schedule is the new one."""
    from tscomp.codegen.simt import compile as C
    from tscomp.runtime.simt_artifact import write_cuda_artifact
    path = _one_gemm_model(tmp_path)
    real, rejected = C._rejections, []

    def spilling(model):
        out = real(model)
        if not rejected:
            first = next(k for vs in model_kernels.values() for k in vs if k.family == "simt-gemm")
            rejected.append((first.func, first.cfg, first.reserve[0].config))
            out = {**out, first.func: "spills registers on sm_80"}
        return out
    model_kernels = {}
    orig_kernels_for = C.kernels_for

    def kernels_for(plan, choices, schedules):
        model_kernels.update(orig_kernels_for(plan, choices, schedules))
        return model_kernels
    monkeypatch.setattr(C, "_rejections", spilling)
    monkeypatch.setattr(C, "kernels_for", kernels_for)
    model = C.compile_cuda(str(path), ["M=1:300"], ("sm_80",), max_variants=1)
    (func, cfg, repl), = rejected
    (g,) = [g for g, vs in model.kernels.items() if vs[0].family == "simt-gemm"]
    assert model.kernels[g][0].cfg == repl != cfg
    assert any(f"rejected {cfg.slug()} (spills registers on sm_80)" in n for n in model.notes)
    assert model.schedules.groups[g].variants[0].config == repl
    man = json.loads((write_cuda_artifact(model, tmp_path / "m.tsc") / "manifest.json").read_text())
    (entry,) = [e for e in man["groups"] if e["name"] == g]
    assert entry["schedule"]["method"] == "analytic" and entry["schedule"]["measured"] is False
    v = entry["variants"][0]
    assert v["tile_config"] == repl.to_json() and v["schedule"]["method"] == "analytic"
    assert v["schedule"]["measured"] is False and 0 < v["schedule"]["model"]["occupancy"] <= 1
    assert man["schedules"]["target"]["key"] == cuda("sm_80").key() and man["schedules"]["methods"]["analytic"] == 1


def test_a_kernel_whose_ptxas_registers_do_not_fit_an_sm_is_rejected():
    """The ranking estimates registers; ptxas may report more. A 1024-thread kernel at 72 registers
    cannot launch on any architecture (72 x 1024 > 64K registers per block): the build rejects it."""
    from types import SimpleNamespace

    from tscomp.codegen.nvcc import CudaBuild, KernelResources
    from tscomp.codegen.simt import compile as C

    def kernel(func, threads):
        return SimpleNamespace(target="cuda", func=func, resources=lambda: {"threads": threads, "shared_bytes": 0})

    def res(regs, spills=0):
        return KernelResources(regs, 8192, spills, spills, 0)
    model = SimpleNamespace(kernels={"g1": [kernel("big", 1024), kernel("fine", 256)], "g2": [kernel("spilly", 128)]},
                            builds={"sm_80": CudaBuild("sm_80", b"", {"big": res(72), "fine": res(72), "spilly": res(40, 8)}),
                                    "sm_90": CudaBuild("sm_90", b"", {"big": res(64), "fine": res(72), "spilly": res(40)})})
    rejected = C._rejections(model)
    assert set(rejected) == {"big", "spilly"}
    assert rejected["big"] == "1024 threads x 72 registers (ptxas) do not fit an SM of sm_80"
    assert rejected["spilly"] == "spills registers on sm_80"


class _FakeGpu:
    """A stand-in CudaDevice for the measured path: each launch "takes" the milliseconds ``speed``
    assigns to its kernel's configuration slug (default 1.0), scaled by the GEMM's M (its 4th
    argument); launches are recorded, nothing runs."""
    arch, device_name = "sm_90", "Fake GPU"

    def __init__(self, speed):
        self.speed, self.profile, self.launched = speed, None, []

    def run_launches(self, cubin, launches):
        assert cubin    # the configuration was built for sm_90
        for launch in launches:
            self.launched.append(launch.kernel)
            slug = launch.kernel.rsplit("_", 1)[0] if launch.kernel.endswith("_rows") else launch.kernel
            ms = next((v for k, v in self.speed.items() if slug.endswith(k)), 1.0) * int(launch.args[3])
            if self.profile is not None:
                self.profile.append((launch.kernel, ms))


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc not installed (CUDA toolkit)")
def test_measured_gpu_selection_keeps_the_fastest_timed_configuration(tmp_path, monkeypatch):
    """With a GPU present (here a stand-in that makes the third candidate the fastest), --measure-gpu
    times the model's 4 candidates (its cover of the range, then its best by score) at every sample
    shape, keeps the fastest as the first variant, the rest as the build's reserve, dispatches
    measured variants by their times, and the manifest says measured-gpu with the times per M."""
    from tscomp.codegen.simt import compile as C
    from tscomp.runtime import device_opencl
    from tscomp.runtime.simt_artifact import write_cuda_artifact
    from tscomp.schedule.gpu_measure import _candidates
    from tscomp.schedule.gpu_space import GpuGemmSpace
    path = _one_gemm_model(tmp_path)
    space = GpuGemmSpace(24, 40, cuda("sm_90"), (1, 300))
    ranked = _candidates(space, 4)
    cover = space.variants(2)
    assert len(ranked) == 4 and ranked[:len(cover)] == cover and ranked[0] == space.rank(1)[0].tile
    gpu = _FakeGpu({ranked[2].slug(): 0.25})
    monkeypatch.setattr(device_opencl, "device", lambda name=None: gpu)
    model = C.compile_cuda(str(path), ["M=1:300"], ("sm_80", "sm_90"), max_variants=1, measure=True, measure_top=4)
    (g,) = [g for g, vs in model.kernels.items() if vs[0].family == "simt-gemm"]
    sched = model.schedules.groups[g]
    assert sched.method == "measured-gpu" and sched.measured and sched.trials == 4
    assert model.kernels[g][0].cfg == ranked[2] and sched.variants[0].config == ranked[2]
    assert {v.config for v in sched.reserve} == {ranked[0], ranked[1], ranked[3]}
    shapes = sched.variants[0].timings
    assert len(shapes) >= 2 and all(ms > 0 for ms in shapes.values()) and "300" in shapes and "1" in shapes
    assert model.kernels[g][0].measured_ms == [[int(m), ms] for m, ms in shapes.items()]
    from tscomp.codegen.simt.gemm import kernel_name
    assert set(gpu.launched) == {kernel_name(g, t) for t in ranked}          # every candidate timed, no other
    art = write_cuda_artifact(model, tmp_path / "m.tsc")
    man = json.loads((art / "manifest.json").read_text())
    (entry,) = [e for e in man["groups"] if e["name"] == g]
    v = entry["variants"][0]
    assert v["schedule"]["method"] == "measured-gpu" and v["schedule"]["measured"] is True
    from tscomp.runtime import plain_data    # the kernels as the artifact loader reads them back
    from tscomp.runtime.plain_data import BlobReader, read_aligned
    buf, _ = read_aligned(art / "weights.bin")
    doc = json.loads((art / "plan.json").read_text())
    kernels = plain_data.load(doc, BlobReader(buf, doc.get("_blobs", {})))["kernels"]
    assert kernels[g][0].measured_ms == model.kernels[g][0].measured_ms
    assert v["schedule"]["measured_ms"] == shapes and entry["schedule"]["method"] == "measured-gpu"
    assert man["schedules"]["methods"]["measured-gpu"] == 1


def test_measure_gpu_without_a_gpu_is_a_clear_error(tmp_path):
    from tscomp.codegen.simt import compile as C
    from tscomp.runtime.device_opencl import DeviceError, device
    try:
        device("cuda")
        pytest.skip("a GPU is usable here")
    except DeviceError:
        pass
    with pytest.raises(DeviceError, match="device='cuda'"):
        C.compile_cuda(str(_one_gemm_model(tmp_path)), ["M=1:300"], measure=True)


def test_measured_variants_are_dispatched_by_their_interpolated_times():
    from types import SimpleNamespace

    from tscomp.codegen.simt.families import choose_variant
    from tscomp.schedule.gpu_measure import estimate_ms
    small = [[1, 0.010], [64, 0.020], [4096, 1.0]]
    large = [[1, 0.030], [64, 0.040], [4096, 0.5]]
    assert estimate_ms(small, 1) == 0.010 and estimate_ms(small, 8) == pytest.approx(0.010 * 2 ** 0.5)
    assert estimate_ms(large, 8192) == pytest.approx(1.0)          # beyond the last sample: per row
    symtab = SimpleNamespace(evaluate=lambda expr, b: b["M"])
    ks = [SimpleNamespace(measured_ms=t, symtab=symtab, M="M", name=n) for n, t in (("small", small), ("large", large))]
    assert choose_variant(ks, {"M": 16}).name == "small" and choose_variant(ks, {"M": 3000}).name == "large"
